"""w4's own GEMV layout ("w4-gemv", version 1) and its pure-torch reference.

The layout is built for kernels/gemv_w4a16.cu, which feeds the dequantized weight straight into
tensor-core mma.sync m16n8k16 A fragments (16 output channels x 16 k) while the activations are
the B operand (8 columns = up to 8 tokens). docs/formats.md (section w4-gemv) has the full description;
in short (K = in_features, N = out_features, G = group size, Kp = K rounded up to 128):

    qweight [N/8, Kp/128, 8, 16] int32  tiles of 8 output rows x 128 k, each tile row-major:
                                         qweight[a, b, r, w] holds row n = 8a + r,
                                         k = 128b + 8w + e (e = 0..7), nib[i] = e AWQ_ORDER[i];
                                         k >= K is padding with code 0
    qzeros  [K/G, N/8]  int32            exactly the AWQ gemm qzeros (AWQ nibble order along N)
    scales  [K/G, N]    float16          exactly the AWQ gemm scales
    meta    [4]         int32            (LAYOUT_VERSION, K, N, G)
    W[n, k] = (q[n, k] - z[k // G, n]) * s[k // G, n]       (the AWQ formula, unchanged)

Why: within one 32-bit word the 8 codes are 8 consecutive k in the [0,2,4,6,1,3,5,7] nibble
order, so each lop3 step of the int4 -> fp16 conversion yields the fp16 pair (k, k+1) that an
mma A-fragment register holds. A warp's lane L = 4g + t reads the 16 bytes at offset 16L of a
512-byte tile (rows g, words 4t..4t+3): one fully coalesced 512-byte load per instruction. The
scales and zeros keep AWQ's [groups, N] orientation: the 16 rows of one mma tile read one
32-byte sector of scales per group, and repacking them is the identity.

Everything here is vectorised (no Python loop over elements) and exact: repack/to_awq are
permutations of nibbles, and dequantize() is bit-identical to awq_gemm.dequantize().
"""

from __future__ import annotations

import torch

from w4cli.gpu.contract import GEMV_DTYPE, PACK, gemv_refusal
from w4cli.errors import InputRefused
from w4cli.formats import awq_gemm

LAYOUT_VERSION = 1

# nibble i of a word holds k-offset AWQ_ORDER[i] of its 8 consecutive k (same order as AWQ's N)
AWQ_ORDER = awq_gemm.AWQ_ORDER
TILE_ROWS = 8  # output rows per qweight tile
TILE_K = 128  # k per qweight tile (16 words)
TILE_WORDS = TILE_K // PACK

# tensor suffix names of one linear in this layout (bias, if any, stays "<prefix>.bias", fp16 [N])
TENSOR_NAMES = ("qweight", "qzeros", "scales", "meta")


def padded_k(k: int) -> int:
    """K rounded up to a whole tile of 128."""
    return -(-k // TILE_K) * TILE_K


def _shifts(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    # k-offset e of a word sits in nibble AWQ_REVERSE_ORDER[e]
    return torch.tensor([4 * i for i in awq_gemm.AWQ_REVERSE_ORDER], dtype=dtype, device=device)


def _refuse(message: str) -> None:
    raise InputRefused(f"w4-gemv: {message}")


# codes [N, K] integers 0..15 -> qweight [N/8, Kp/128, 8, 16] int32
def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    n, k = codes.shape
    if n % TILE_ROWS:
        _refuse(f"out_features must be a multiple of {TILE_ROWS}, got {n}")
    kp = padded_k(k)
    padded = torch.zeros((n, kp), dtype=torch.int64, device=codes.device)
    padded[:, :k] = codes.to(torch.int64)
    # [N, Kp/8, 8] natural k order -> word value sum_e code[e] << 4*REV[e]
    words = (padded.view(n, kp // PACK, PACK) << _shifts(codes.device, torch.int64)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    # [N/8, 8, Kp/128, 16] -> [N/8, Kp/128, 8, 16]
    tiles = words.view(n // TILE_ROWS, TILE_ROWS, kp // TILE_K, TILE_WORDS).permute(0, 2, 1, 3)
    return tiles.contiguous()


# qweight [N/8, Kp/128, 8, 16] int32 -> codes [N, K] uint8 (natural order)
def unpack(qweight: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    _, k, n, _ = _meta(meta)
    tiles, kblocks = qweight.shape[0], qweight.shape[1]
    words = qweight.permute(0, 2, 1, 3).reshape(tiles * TILE_ROWS, kblocks * TILE_WORDS)
    codes = (words.unsqueeze(-1) >> _shifts(qweight.device, torch.int32)) & 0xF
    return codes.to(torch.uint8).reshape(n, kblocks * TILE_K)[:, :k].contiguous()


def _meta(meta: torch.Tensor) -> tuple[int, int, int, int]:
    version, k, n, g = (int(v) for v in meta.tolist())
    return version, k, n, g


# qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16 (AWQ gemm)
# -> {"qweight": [N/8, Kp/128, 8, 16] int32, "qzeros": [K/G, N/8] int32,
#     "scales": [K/G, N] fp16, "meta": [4] int32 (1, K, N, G)}
def repack_from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """AWQ gemm tensors of one linear -> the w4-gemv tensors (see the module docstring).

    Lossless: to_awq() returns the same int32 words and scales. Refuses (InputRefused) shapes the
    GEMV kernel cannot run: group size not a multiple of 32 (unless there is one group), K not a
    multiple of 8 (activation rows must stay 16-byte aligned).
    """
    check_awq(qweight, qzeros, scales)
    k, n, groups = qweight.shape[0], qweight.shape[1] * PACK, scales.shape[0]
    g = k // groups
    codes = awq_gemm.unpack(qweight).t()  # [N, K]
    meta = torch.tensor([LAYOUT_VERSION, k, n, g], dtype=torch.int32)
    return {
        "qweight": pack_codes(codes),
        "qzeros": qzeros.contiguous().clone(),
        "scales": scales.contiguous().clone(),
        "meta": meta,
    }


def tensor_specs(k: int, n: int, g: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of one linear's w4-gemv tensors, known before any data is read."""
    return {
        "qweight": ((n // TILE_ROWS, padded_k(k) // TILE_K, TILE_ROWS, TILE_WORDS), torch.int32),
        "qzeros": ((k // g, n // PACK), torch.int32),
        "scales": ((k // g, n), torch.float16),
        "meta": ((4,), torch.int32),
    }


def to_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, meta: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inverse of repack_from_awq: {"qweight" [K, N/8], "qzeros", "scales"} in AWQ gemm layout."""
    validate(qweight, qzeros, scales, meta)
    codes = unpack(qweight, meta)  # [N, K]
    return {"qweight": awq_gemm.pack(codes.t()), "qzeros": qzeros.clone(), "scales": scales.clone()}


def validate(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, meta: torch.Tensor) -> tuple[int, int, int]:
    """Check one linear's w4-gemv tensors; returns (K, N, G). Raises InputRefused (one line)."""
    for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales), ("meta", meta)):
        if not isinstance(t, torch.Tensor):
            _refuse(f"{name} must be a tensor, got {type(t).__name__}")
    if meta.dtype != torch.int32 or meta.shape != (4,):
        _refuse(f"meta must be int32 [4], got {meta.dtype} {list(meta.shape)}")
    version, k, n, g = _meta(meta)
    if version != LAYOUT_VERSION:
        _refuse(f"layout version {version} is not supported (this w4 reads version {LAYOUT_VERSION})")
    if k < 1 or n < 1 or g < 1 or k % g:
        _refuse(f"meta holds an impossible shape K={k} N={n} G={g}")
    _check_kernel_shape(k, n, g)
    expect = {name: (dtype, shape) for name, (shape, dtype) in tensor_specs(k, n, g).items()}
    for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        dtype, shape = expect[name]
        if t.dtype != dtype or tuple(t.shape) != shape:
            _refuse(f"{name} must be {str(dtype).removeprefix('torch.')} {list(shape)} for K={k} N={n} G={g}, "
                    f"got {str(t.dtype).removeprefix('torch.')} {list(t.shape)}")
    return k, n, g


def _check_kernel_shape(k: int, n: int, g: int, scales: str = GEMV_DTYPE) -> None:
    why = gemv_refusal(k, n, g, scales)
    if why:
        _refuse(why)


def check_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> None:
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        _refuse(f"AWQ qweight and qzeros must be int32, got {qweight.dtype} and {qzeros.dtype}")
    if qweight.dim() != 2 or qzeros.dim() != 2 or scales.dim() != 2:
        _refuse("AWQ qweight, qzeros and scales must be 2-D")
    k, words = qweight.shape
    n = words * PACK
    groups = scales.shape[0]
    if k < 1 or n < 1 or groups < 1 or k % groups:
        _refuse(f"in_features {k} is not a multiple of the {groups} scale rows")
    if tuple(scales.shape) != (groups, n) or tuple(qzeros.shape) != (groups, words):
        _refuse(f"AWQ shapes disagree: qweight {list(qweight.shape)}, qzeros {list(qzeros.shape)}, "
                f"scales {list(scales.shape)}")
    _check_kernel_shape(k, n, k // groups, str(scales.dtype).removeprefix("torch."))


# -> float32 [N, K], exactly (q - z) * s
def dequantize_exact(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    k, n, g = validate(qweight, qzeros, scales, meta)
    groups = k // g
    q = unpack(qweight, meta).view(n, groups, g)
    z = awq_gemm.unpack(qzeros).t().reshape(n, groups, 1)  # [N, groups, 1]
    diff = q.to(torch.int16) - z.to(torch.int16)
    s = scales.to(torch.float32).t().reshape(n, groups, 1)
    # (q - z) needs 5 bits and s 11: the product is exact in float32, the cast below rounds once
    return (diff.to(torch.float32) * s).view(n, k)


# -> [N, K] (nn.Linear layout) when transpose, else [K, N]; bit-identical to awq_gemm.dequantize
def dequantize(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    meta: torch.Tensor,
    dtype: torch.dtype = torch.float16,
    transpose: bool = True,
) -> torch.Tensor:
    weight = dequantize_exact(qweight, qzeros, scales, meta)
    if not transpose:
        weight = weight.t()
    return weight.to(dtype).contiguous()


# x [M, K] fp16 -> float32 [M, N] = x @ W_fp16^T (+ bias), fp32 math
def gemv_reference(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    meta: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The GEMV oracle: the fp16-rounded dequantized weight, products and sums in float32, bias
    added in float32. The kernel rounds once to fp16; with G % 128 == 0 (or one group) it applies
    the scale in fp32 after summing (q - z) * x over each 128-k block, so it skips the fp16
    rounding of the weight: it matches this within w4cli/gpu/checks.py's bound, and bit for bit on
    exact data (kernels/gemv_w4a16.cu's header says why)."""
    k, n, _ = validate(qweight, qzeros, scales, meta)
    if x.dim() != 2 or x.shape[1] != k:
        _refuse(f"activations must be [M, {k}], got {list(x.shape)}")
    weight = dequantize(qweight, qzeros, scales, meta, torch.float16).to(torch.float32)
    out = x.to(torch.float32) @ weight.to(x.device).t()
    if bias is not None:
        out = out + bias.to(torch.float32).to(x.device)
    return out
