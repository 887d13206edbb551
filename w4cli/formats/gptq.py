"""GPTQ (AutoGPTQ, GPTQModel), 4 bits: validation and unpacking of one linear.

Layout (K = in_features, N = out_features, G = group size, nib[i] = bits 4i..4i+3):
    qweight [K/8, N]   int32   packed along K: nib[i] of word [r, n] is row k = 8r + i (no interleave)
    qzeros  [K/G, N/8] int32   packed along N: nib[i] of word [g, c] is channel n = 8c + i
    scales  [K/G, N]   float16 (bfloat16 accepted)
    g_idx   [K]        int32   the group of each k: k // G, or a permutation of groups (act-order)
    W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]

checkpoint_format "gptq" (v1) stores every qzeros word minus 0x11111111, as whole 32-bit words:
a zero point of 0 borrows from the nibble above it. The true word is the stored one plus
0x11111111 modulo 2^32; adding 1 to each nibble instead misreads the nibbles above a borrow.
"gptq_v2" stores the zero points as they are.
"""

from __future__ import annotations

import torch

from w4cli.gpu.contract import PACK
from w4cli.errors import InputRefused
from w4cli.formats.unpacked import UnpackedLinear, identity_groups, nibbles

CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
V1_ZERO_OFFSET = 0x11111111  # what v1 subtracts from each qzeros word
REQUIRED = ("qweight", "qzeros", "scales")
OPTIONAL = ("g_idx",)
SCALE_DTYPES = (torch.float16, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# qweight [K/8, N] int32; qzeros [K/G, N/8] int32; scales [K/G, N]; g_idx [K] int32 or None
# -> (K, N, G); meta-device tensors are enough (shapes and dtypes only)
def validate(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None, group_size: int
) -> tuple[int, int, int]:
    """Check one linear's shapes and dtypes against each other and the config's group size.
    Raises InputRefused (one line, without the layer's name: the caller adds it)."""
    for name, t, want in (("qweight", qweight, "int32"), ("qzeros", qzeros, "int32")):
        if t.dtype != torch.int32:
            raise InputRefused(f"GPTQ {name} is {want}, got {_name(t.dtype)}")
    if scales.dtype not in SCALE_DTYPES:
        raise InputRefused(f"GPTQ scales are float16 (or bfloat16), got {_name(scales.dtype)}")
    for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if t.dim() != 2:
            raise InputRefused(f"{name} has shape {list(t.shape)}; expected 2 dimensions")
    k, n = qweight.shape[0] * PACK, qweight.shape[1]
    groups = scales.shape[0]
    if k == 0 or n == 0:
        raise InputRefused("qweight is empty")
    if scales.shape[1] != n:
        raise InputRefused(f"qweight {list(qweight.shape)} holds {n} output channels but scales {list(scales.shape)} has {scales.shape[1]}")
    if tuple(qzeros.shape) != (groups, n // PACK) or n % PACK:
        raise InputRefused(f"qzeros {list(qzeros.shape)} does not match scales {list(scales.shape)} (expected [{groups}, {n / PACK:g}])")
    if group_size == -1:
        if groups != 1:
            raise InputRefused(f"group_size -1 means one group, but scales has {groups} rows")
        g = k
    else:
        g = group_size
        if k % g:
            raise InputRefused(f"in_features {k} is not a multiple of group_size {g}")
        if groups * g != k:
            raise InputRefused(f"scales has {groups} rows but in_features {k} / group_size {g} = {k // g}")
    if g_idx is not None:
        if g_idx.dtype != torch.int32:
            raise InputRefused(f"GPTQ g_idx is int32, got {_name(g_idx.dtype)}")
        if tuple(g_idx.shape) != (k,):
            raise InputRefused(f"g_idx has shape {list(g_idx.shape)}; expected [{k}] (in_features)")
    return k, n, g


# qweight [K/8, N] int32 -> codes [N, K] uint8
def unpack_qweight(qweight: torch.Tensor) -> torch.Tensor:
    # transposing the int32 words first (one word = 8 codes) leaves the nibbles of each output row
    # consecutive along K: nib[i] of word r is k = 8r + i
    words = qweight.t().contiguous()  # [N, K/8]
    return nibbles(words).view(words.shape[0], -1)


def v2_words(qzeros: torch.Tensor) -> torch.Tensor:
    """v1 qzeros -> the true (v2) words: + 0x11111111 on each whole word, modulo 2^32."""
    words = (qzeros.to(torch.int64) + V1_ZERO_OFFSET) & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# qzeros [K/G, N/8] int32 -> zeros [N, K/G] uint8 (a transposed view)
def unpack_qzeros(qzeros: torch.Tensor, v1: bool) -> torch.Tensor:
    words = v2_words(qzeros) if v1 else qzeros
    return nibbles(words).view(words.shape[0], -1).t()


def unpack_linear(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    v1: bool,
) -> UnpackedLinear:
    """One GPTQ linear as codes, zeros and scales (w4cli/formats/unpacked.py). A g_idx that is the
    plain grouping k // G is dropped, so the layer has contiguous groups."""
    k, _, g = validate(qweight, qzeros, scales, g_idx, group_size)
    groups = None if g_idx is None or identity_groups(g_idx, g) else g_idx.to(torch.int64)
    return UnpackedLinear(unpack_qweight(qweight), unpack_qzeros(qzeros, v1), scales.t(), groups)
