"""Bytes credited to one call of each method: the numerator of every GB/s `w4 bench` prints.

The definition (docs/bench.md and docs/performance.md repeat it):

    K = in_features, N = out_features, M = batch rows, G = group size; 1 GB = 1e9 bytes
    activations + output   M*K*2 + M*N*2                 (fp16 or bf16 x read, y written)
    fp16 cuBLAS            K*N*2             + act/out   (the fp16 weight)
    w4 (GEMV, and dequantize + matmul)
                           K*N/2 + (K/G)*N*2 + (K/G)*N/2 + act/out
                           (int4 codes, fp16 scales, int4 zeros packed 8 per int32)
    torch int4             K*N/2 + (K/G)*N*2*2 + act/out (tinygemm: bf16 scale and zero per group)
    dequantize alone       K*N/2 + (K/G)*N*2 + (K/G)*N/2 + K*N*2   (reads int4, writes fp16 [N, K])

These are the bytes a layer's *format* needs, not what an implementation happens to move: the
dequantize + matmul path also writes and re-reads a 2*K*N fp16 weight, which is exactly why its
effective GB/s is low. So GB/s compares formats and kernels on one scale, and % of copy says how close
a kernel comes to the fastest it could be on this GPU (the copy ceiling counts read + write bytes).
"""

from __future__ import annotations

FP16 = "fp16"
W4_GEMV = "w4_gemv"
W4_DQ_MM = "w4_dequant_mm"
TORCH_INT4 = "torch_int4"
W4_DEQUANT = "w4_dequant"

# per (shape, M), in table order; then the dequantize kernel alone, per shape
LAYER_METHODS = (FP16, W4_GEMV, W4_DQ_MM, TORCH_INT4)
ALL_METHODS = LAYER_METHODS + (W4_DEQUANT,)

LABELS = {
    FP16: "fp16 cuBLAS",
    W4_GEMV: "w4 GEMV",
    W4_DQ_MM: "w4 dequant+mm",
    TORCH_INT4: "torch int4",
    W4_DEQUANT: "w4 dequantize",
}

DEFINITION = {
    "unit": "1 GB = 1e9 bytes; GB/s = bytes_moved / median time",
    "activations_output": "M*K*2 + M*N*2",
    FP16: "K*N*2 + M*K*2 + M*N*2",
    W4_GEMV: "K*N/2 + (K/G)*N*2 + (K/G)*N/2 + M*K*2 + M*N*2",
    W4_DQ_MM: "K*N/2 + (K/G)*N*2 + (K/G)*N/2 + M*K*2 + M*N*2 (the format's bytes, not the fp16 round trip)",
    TORCH_INT4: "K*N/2 + (K/G)*N*2*2 + M*K*2 + M*N*2 (bf16 scale and zero per group)",
    W4_DEQUANT: "K*N/2 + (K/G)*N*2 + (K/G)*N/2 + K*N*2 (read int4, scales, zeros; write fp16)",
    "copy": "2 * buffer bytes (read + write) of a device-to-device copy, the faster of memcpy and an SM kernel",
}


def activations(k: int, n: int, m: int) -> int:
    return m * k * 2 + m * n * 2


def fp16_weight(k: int, n: int) -> int:
    return k * n * 2


def w4_weight(k: int, n: int, group: int) -> int:
    groups = k // group
    return k * n // 2 + groups * n * 2 + groups * n // 2


def torch_int4_weight(k: int, n: int, group: int) -> int:
    return k * n // 2 + (k // group) * n * 4


def bytes_moved(method: str, k: int, n: int, m: int, group: int) -> int:
    """Bytes credited to one call of `method` on K x N at batch M (M is ignored for w4_dequant)."""
    if method == FP16:
        return fp16_weight(k, n) + activations(k, n, m)
    if method in (W4_GEMV, W4_DQ_MM):
        return w4_weight(k, n, group) + activations(k, n, m)
    if method == TORCH_INT4:
        return torch_int4_weight(k, n, group) + activations(k, n, m)
    if method == W4_DEQUANT:
        return w4_weight(k, n, group) + k * n * 2
    raise ValueError(f"unknown method {method!r}")
