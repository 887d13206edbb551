"""int4 linears as GGUF 4-bit blocks, with no second quantization: the codes are kept, the scale
becomes the block's d, and the zero point becomes its m (Q4_1) or is GGUF's own 8 (Q4_0).

A GGUF block covers 32 consecutive weights of one row (32 values of k for one n):

    Q4_0  18 bytes: d fp16 | qs[16]            w = d * (q - 8)
    Q4_1  20 bytes: d fp16 | m fp16 | qs[16]   w = d * q + m
    qs[j] = q[j] | q[j + 16] << 4   (j = 0..15; the low nibbles hold the block's first half)

A quantized linear's group (w = s * (q - z), G consecutive values of k in one row, G a multiple of
32, or G = K) is G / 32 whole blocks that all take its s and z:

    Q4_0 (every z = 8: GPTQ sym, compressed-tensors symmetric): d = s. Exact.
    Q4_1 (asymmetric): d = s, m = fp16(-z * s). z * s needs at most 4 + 11 bits, so float32 holds
      it exactly and the only rounding is the one to fp16: |m - (-z * s)| <= 2^-11 * |z * s|
      (half an fp16 ulp; 2^-25 absolute below fp16's normal range). GGUF then computes d * q + m:
      d * q and m are both multiples of s's fp16 ulp and their sum is below 2^6 * |s|, so the sum
      is exact in float32 and the weight differs from s * (q - z) by exactly m's rounding. That
      error scales with |z * s|, not with the weight: a weight near zero (q near z) can be off by
      many of its own ulps, while every weight of the group is off by the same absolute amount.

d = s needs s to be an fp16 value: bf16 (or fp32) scales that fp16 cannot hold exactly are refused.
"""

from __future__ import annotations

import numpy as np
import torch

from w4cli.errors import InputRefused
from w4cli.formats.unpacked import UnpackedLinear

BLOCK = 32  # weights per GGUF block (QK4_0 = QK4_1 = 32)
Q4_0 = "Q4_0"
Q4_1 = "Q4_1"
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20}
SYMMETRIC_ZERO = 8  # Q4_0's implicit zero point
FP16_MAX = 65504.0
ROWS_PER_CHUNK = 256  # rows packed per step: the temporaries stay a few MB for any K
WORKAROUND = "convert with `w4 dequantize`, then quantize with llama.cpp's llama-quantize"


def refusal(prefix: str, why: str) -> InputRefused:
    """One line naming the layer, why GGUF's blocks cannot hold it as it is, and the way round."""
    return InputRefused(f"{prefix}: {why}, which no GGUF 4-bit block holds without a second quantization; {WORKAROUND}")


def check_shape(prefix: str, in_features: int, group_size: int) -> None:
    """K and G must be whole blocks: a group shares one d and m, a block must not straddle two."""
    if in_features % BLOCK:
        raise refusal(prefix, f"in_features {in_features} is not a multiple of {BLOCK}")
    if group_size % BLOCK:
        raise refusal(prefix, f"group size {group_size} is not a multiple of {BLOCK}")


def check_scales(prefix: str, scales: torch.Tensor, symmetric: bool) -> None:
    """Every scale an fp16 value (d = s exactly) and, for Q4_1, every m = -z * s within fp16's range
    for any z in 0..15 (|m| <= 15 |s|)."""
    wide = scales.to(torch.float32)
    half = wide.to(torch.float16)
    inexact = half.to(torch.float32) != wide
    if bool(inexact.any()):
        first = tuple(int(i) for i in inexact.nonzero()[0])
        raise refusal(prefix, f"its {str(scales.dtype).removeprefix('torch.')} scale {wide[first].item()!r} at {list(first)} is not an fp16 value")
    if not symmetric and bool((wide.abs() * 15 > FP16_MAX).any()):
        raise refusal(prefix, f"a scale above {FP16_MAX / 15:.0f} makes m = -z * s overflow fp16")


# one block as numpy lays it out: GGUF's C structs (block_q4_0, block_q4_1), little-endian fp16
BLOCK_DTYPES = {
    Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", (BLOCK // 2,))]),
    Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (BLOCK // 2,))]),
}


def pack(layer: UnpackedLinear, qtype: str, prefix: str) -> np.ndarray:
    """[N, K / 32 * block bytes] uint8: the layer's GGUF blocks, row by row (GGUF's [K, N] tensor)."""
    if layer.g_idx is not None:
        raise refusal(prefix, "its g_idx permutes the groups (act-order)")
    n, k = layer.shape
    groups = layer.zeros.shape[1]
    check_shape(prefix, k, k // groups)
    per_group = k // groups // BLOCK  # blocks of one group
    out = np.empty((n, groups, per_group), dtype=BLOCK_DTYPES[qtype])
    for start in range(0, n, ROWS_PER_CHUNK):
        rows = slice(start, min(n, start + ROWS_PER_CHUNK))
        scales = layer.scales[rows].to(torch.float32)
        zeros = layer.zeros[rows]
        # every block of a group takes its d (and m): a broadcast over the group's blocks
        out["d"][rows] = scales.to(torch.float16).numpy()[:, :, None]
        if qtype == Q4_0:
            if bool((zeros != SYMMETRIC_ZERO).any()):
                raise refusal(prefix, "a zero point is not 8, which Q4_0 assumes")
        else:
            m = -zeros.to(torch.float32) * scales  # exact in float32; rounded once here
            out["m"][rows] = m.to(torch.float16).numpy()[:, :, None]
        codes = layer.codes[rows].numpy().reshape(-1, groups, per_group, BLOCK)
        out["qs"][rows] = codes[..., : BLOCK // 2] | (codes[..., BLOCK // 2 :] << 4)
    return out.view(np.uint8).reshape(n, -1)
