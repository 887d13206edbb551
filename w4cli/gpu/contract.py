"""What w4's CUDA kernels take, stated once. Every caller asks here before it hands a layer to a
kernel (repack, `w4 gemv`, `w4 bench`, `w4 verify`, the loader's wrappers); kernels/ops.cpp checks
the same again before each launch, as the last line of defence.

K = in_features, N = out_features, G = group size, M = rows of activations.

    both kernels  N % 8 == 0 (8 int4 codes per packed word); K % G == 0
    dequantize    scales float16 or bfloat16; writes float16, bfloat16 or float32
    GEMV          K % 8 == 0 (activation rows stay 16-byte aligned); G % 32 == 0 (a 32-k run of the
                  kernel never straddles two groups) or G == K; x, scales, bias and y float16;
                  M <= 32 per GEMV launch (four mma n8 tiles), M <= 64 per mma.sync batch-kernel
                  launch, M <= 128 per wgmma batch-kernel launch, M <= 65536 per warp-specialised
                  wgmma launch (both compute capability 9.0 only); w4cli.gpu.kernels.gemv picks the
                  kernel by M (gemv_path)

Pure (no torch): the command line asks it before anything heavy is imported, so dtypes are named as
torch names them (`getattr(torch, name)` is the dtype).
"""

from __future__ import annotations

PACK = 8  # int4 codes per int32 word
GEMV_TILE_M = 8  # rows of x per token tile of the GEMV (mma n8): at most one tile, the GEMV everywhere
GEMV_MAX_M = 32  # rows of x per GEMV launch (four token tiles share each weight's conversion)
BATCH_MAX_M = 64  # rows of x per mma.sync batch-kernel launch
# Past one token tile the GEMV (one read of the weight, no staging) beats the batch kernels on
# latency-bound layers (H100, docs/performance.md): up to two tiles on layers of at most
# GEMV_MEDIUM_LAYER weights, up to GEMV_MAX_M rows on layers of at most TINY_LAYER (below). On
# Hopper the barrier wgmma kernel, scaling after the wgmma, overtakes it on those medium layers from
# WGMMA_OVER_GEMV_M rows (4096x4096 and 4096x6144 at M = 12-16: 1-7% on the H100, 2-9% on the
# H200, where it is level at 9-10 on 4096x4096; dev/LOG.md)
GEMV_MEDIUM_LAYER = 4096 * 6144
WGMMA_OVER_GEMV_M = 12
# beyond this, dequantize + cuBLAS beats launches of 64 rows (each re-reads the weight)
BATCH_CHUNKED_MAX_M = 128
# Hopper (compute capability 9.0): the wgmma batch kernel from this M, up to WGMMA_MAX_M rows per
# launch; below it the mma.sync one is faster on layers of WGMMA_SMALL_M_LAYER weights or more
# (8192x8192 3-7%, 4096x28672 9-10%) and slower on those under it (14336x4096 2-7%, 4096x14336
# 4-10%, 11008x4096 2-7%; H100 and H200, dev/LOG.md)
WGMMA_MIN_M = 17
WGMMA_MAX_M = 128
WGMMA_SMALL_M_LAYER = 8192 * 8192
# from WS_MIN_M rows, the warp-specialised wgmma kernel (a producer warp feeding the MMA warps
# through the bulk and tensor copy engines): any M up to WS_MAX_M in one launch, one read of the
# weight per tile of up to WS_TILE_M tokens; from 33 rows it beats the barrier wgmma kernel on
# six of the seven Llama shapes (H100, dev/LOG.md; 4096x6144 loses 1 us of 16)
WS_MIN_M = 33
WS_MAX_M = 65536
WS_TILE_M = 256  # the most tokens in one of its tiles
# The warp-specialised kernel is the path from WS_MIN_M rows on every layer larger than TINY_LAYER:
# timed sustained, it beats dequantize + cuBLAS at M = 2048-4096 on the 4096-wide Llama layers too
# (H100, 3-14%; dev/LOG.md)
# layers of at most this many weights (k_proj, v_proj: N = 1024) fill too few SMs for the batch
# kernels: from TINY_LAYER_DEQUANT_M rows, dequantize + cuBLAS is faster there
TINY_LAYER = 8192 * 1024
TINY_LAYER_DEQUANT_M = 64
# the batch sizes `w4 verify` runs: every M of one GEMV token tile, then one per path beyond it (batch,
# wgmma, batch x2 or wgmma ws, dequantize + cuBLAS or a second tile of tokens; 16 and 32 the GEMV's token
# tiles on small layers)
CHECKED_BATCHES = (*range(1, GEMV_TILE_M + 1), 2 * GEMV_TILE_M, GEMV_MAX_M, BATCH_MAX_M, BATCH_MAX_M + 1, WGMMA_MAX_M,
                   WGMMA_MAX_M + 1, WS_TILE_M + 1)


def checked_batches_text() -> str:
    """CHECKED_BATCHES as a report names them: "1..8, 16, 32, 64, 65, 128, 129, 257"."""
    return ", ".join([f"1..{GEMV_TILE_M}", *(str(m) for m in CHECKED_BATCHES[GEMV_TILE_M:])])
GEMV_GROUP = 32  # the GEMV's group size is a multiple of this, or the whole row

# the dequantize kernel's output dtypes, with the short names --dtype also takes and reports print
OUT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
GEMV_DTYPE = "float16"  # x, scales, bias and y of the GEMV


def dequantize_refusal(k: int, n: int, g: int) -> str | None:
    """Why the dequantize kernel cannot take K x N at group size G (None if it can)."""
    if k % g:
        return f"K={k} is not a multiple of the group size {g}"
    if n % PACK:
        return f"N={n} is not a multiple of {PACK} ({PACK} int4 codes per packed word)"
    return None


def gemv_refusal(k: int, n: int, g: int, scales: str = GEMV_DTYPE) -> str | None:
    """Why the GEMV kernel cannot take K x N at group size G with scales of this dtype (None if it can)."""
    why = dequantize_refusal(k, n, g)
    if why is None and k % 8:
        why = f"K={k} is not a multiple of 8 (16-byte activation rows)"
    if why is None and g % GEMV_GROUP and g != k:
        why = f"group size {g} is neither a multiple of {GEMV_GROUP} nor the whole row K={k}"
    if why is None and scales != GEMV_DTYPE:
        why = f"the GEMV kernel takes {GEMV_DTYPE} scales, not {scales}"
    return why
