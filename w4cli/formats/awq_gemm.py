"""AutoAWQ "gemm" layout: the pure-torch reference w4 checks everything against.

Layout (K = in_features, N = out_features, G = group size):
    qweight [K, N/8]  int32   8 output channels per word, nibble i holds channel 8c + AWQ_ORDER[i]
    qzeros  [K/G, N/8] int32  packed like qweight
    scales  [K/G, N]  float16 (bfloat16 accepted)
    W[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]

These functions are the CPU path of `w4 dequantize` and the oracle for every CUDA kernel, so they
are vectorised (no Python loop over elements) and exact: (q - z) is a small integer and its product
with a 16-bit scale needs at most 15 significant bits, so float32 holds it exactly and the only
rounding is the final cast to the output dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from w4cli.gpu.contract import PACK
from w4cli.formats.packed import AWQ, PackedLinear
from w4cli.formats.unpacked import UnpackedLinear

# nibble i (bits 4i..4i+3) of a packed word holds element AWQ_ORDER[i] of its 8 channels
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# element j of the 8 channels sits in nibble AWQ_REVERSE_ORDER[j]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
UNPACK_WORDS = 128  # words of N (8 output rows each) unpacked at a time (unpack_linear)


def _shifts(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([4 * n for n in AWQ_REVERSE_ORDER], dtype=dtype, device=device)


# packed [R, C/8] int32 (AWQ order along C) -> codes [R, C] uint8 in natural order, values 0..15
def unpack(packed: torch.Tensor) -> torch.Tensor:
    if packed.dtype != torch.int32:
        raise TypeError(f"packed int4 words must be int32, got {packed.dtype}")
    rows, words = packed.shape
    # Work on the little-endian bytes: byte b holds nibbles 2b (low) and 2b+1 (high), and uint8
    # shifts are logical, so the sign bit of the int32 word needs no special care.
    octets = packed.contiguous().view(torch.uint8).view(rows, words, 4)
    nibbles = torch.stack((octets & 0xF, octets >> 4), dim=-1)  # [R, W, 8] in nibble order
    # nibble order is channels (0, 2, 4, 6, 1, 3, 5, 7): as a [2, 4] block, evens then odds;
    # transposing it to [4, 2] gives (0, 1), (2, 3), (4, 5), (6, 7), the natural order
    return nibbles.view(rows, words, 2, 4).transpose(-1, -2).reshape(rows, words * PACK)


# codes [R, C] integers 0..15 in natural order -> packed [R, C/8] int32 (AWQ order along C)
def pack(codes: torch.Tensor) -> torch.Tensor:
    rows, cols = codes.shape
    if cols % PACK:
        raise ValueError(f"the packed dimension must be a multiple of {PACK}, got {cols}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("int4 codes must lie in 0..15")
    grouped = codes.to(torch.int64).reshape(rows, cols // PACK, PACK)
    words = (grouped << _shifts(codes.device, torch.int64)).sum(-1)
    # words are in [0, 2^32): reinterpret the upper half as negative int32, as AutoAWQ's files hold
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def _random_words(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    words = torch.randint(-(2**31), 2**31, shape, generator=generator, dtype=torch.int64, device=generator.device)
    return words.to(torch.int32)


# -> qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N], on the generator's device
def random_layer(
    k: int,
    n: int,
    group: int,
    generator: torch.Generator,
    scales: Callable[[int, int, torch.Generator], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random AWQ layer, what every check and benchmark feeds the kernels (never zeros): packed
    words over the full int32 range, sign bit included, so every nibble takes every value 0..15;
    scales from scales(groups, N, generator), by default uniform in [0.002, 0.012) float16 (positive
    and small, so outputs stay well inside fp16). Drawn in that order from the one generator."""
    groups = k // group
    qweight = _random_words((k, n // PACK), generator)
    qzeros = _random_words((groups, n // PACK), generator)
    if scales is None:
        return qweight, qzeros, (torch.rand(groups, n, generator=generator, device=generator.device) * 0.01 + 0.002).half()
    return qweight, qzeros, scales(groups, n, generator)


# qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16|bf16
# -> float32 [K, N], exactly (q - z) * s
def dequantize_exact(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    k, n = qweight.shape[0], qweight.shape[1] * PACK
    groups = scales.shape[0]
    g = k // groups
    q = unpack(qweight).view(groups, g, n)
    z = unpack(qzeros).view(groups, 1, n)
    diff = q.to(torch.int16) - z.to(torch.int16)
    return (diff.to(torch.float32) * scales.to(torch.float32).view(groups, 1, n)).view(k, n)


# qweight [K, N/8] int32 -> codes [N, K] uint8
def unpack_codes(qweight: torch.Tensor) -> torch.Tensor:
    # Straight into [N, K] = [N/8, 8, K], a few words of N at a time: those words transposed to
    # [words, K] (4 bytes each), then each of the 8 channels is one nibble of one byte of every word,
    # a strided byte read and a contiguous row write. The temporaries stay a few MB, so memory holds
    # the packed words and the codes, nothing more.
    k, words = qweight.shape
    codes = torch.empty((words, PACK, k), dtype=torch.uint8, device=qweight.device)
    for start in range(0, words, UNPACK_WORDS):
        cols = slice(start, min(words, start + UNPACK_WORDS))
        octets = qweight[:, cols].t().contiguous().view(torch.uint8).view(-1, k, 4)  # little-endian bytes
        for channel, nibble in enumerate(AWQ_REVERSE_ORDER):
            byte = octets[:, :, nibble // 2]
            if nibble % 2:
                torch.bitwise_right_shift(byte, 4, out=codes[cols, channel])
            else:
                torch.bitwise_and(byte, 0xF, out=codes[cols, channel])
    return codes.view(words * PACK, k)


# qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] -> the codes, zeros and scales
def unpack_linear(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> UnpackedLinear:
    return UnpackedLinear(unpack_codes(qweight), unpack(qzeros).t(), scales.t())


# qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] -> qweight as it is, zeros and scales [N, K/G]
def packed_linear(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> PackedLinear:
    n = qweight.shape[1] * PACK
    return PackedLinear(qweight, AWQ, (n, qweight.shape[0]), unpack(qzeros).t().contiguous(), scales.t().contiguous())


def pack_linear(layer: UnpackedLinear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]) in this layout, the one the kernels
    and w4-gemv take: the same weights, losslessly. Only for contiguous groups (g_idx None) and N a
    multiple of 8; callers check both (repack refuses, dequantize falls back)."""
    if layer.g_idx is not None:
        raise ValueError("a permuting g_idx has no AWQ gemm form")
    return pack(layer.codes.t()), pack(layer.zeros.t()), layer.scales.t().contiguous()


# -> [N, K] (nn.Linear layout) when transpose, else [K, N]; (q - z) * s rounded once to dtype
def dequantize(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    dtype: torch.dtype = torch.float16,
    transpose: bool = True,
) -> torch.Tensor:
    if not transpose:
        return dequantize_exact(qweight, qzeros, scales).to(dtype)
    return unpack_linear(qweight, qzeros, scales).dequantize(dtype)
