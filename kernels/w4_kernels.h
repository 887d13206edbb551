// w4_kernels.h: host launchers of the w4 CUDA kernels. Torch-free: plain pointers, a stream, and a
// cudaError_t back. kernels/ops.cpp is the only caller; it validates every argument first.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace w4 {

// Element types the launchers understand (values are part of no ABI; ops.cpp maps torch dtypes).
enum class DType : int { kF16 = 0, kBF16 = 1, kF32 = 2 };

// ---- dequantize (AWQ gemm layout), kernels/dequant_w4_awq.cu ----
//
// qweight [K, N/8] int32, qzeros [K/G, N/8] int32 (both AWQ nibble order along N),
// scales [K/G, N] fp16 or bf16 (16-byte aligned), out: [N, K] if transpose else [K, N], out_dtype.
// out[n, k] = (q[k, n] - z[k / G, n]) * s[k / G, n], rounded once to out_dtype.
// Requires K >= 1, N % 8 == 0, N >= 8, G >= 1, K % G == 0, K and N below 2^31.
// Returns cudaErrorInvalidValue for arguments it cannot handle, else the launch's error.
cudaError_t launch_dequant_awq(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                               DType scale_dtype, void* out, DType out_dtype, int64_t K, int64_t N,
                               int64_t G, bool transpose, cudaStream_t stream);

// ---- gemv (w4 GEMV layout) ----
//
// kernels/gemv_w4a16.cu: y[M, N] = x[M, K] W^T (+ bias), fp16 in/out, fp32 accumulation.
// x [M, K] fp16 (16-byte aligned); qweight [N/8, ceil(K/128), 8, 16] int32 (w4-gemv layout,
// 16-byte aligned); qzeros [K/G, N/8] int32 and scales [K/G, N] fp16 (AWQ gemm layout);
// bias [N] fp16 or nullptr; y [M, N] fp16. Requires 1 <= M <= 32, K % 8 == 0, N % 8 == 0,
// K % G == 0, G % 32 == 0 or G == K, K < 2^21. `splits` = warps per 16-row tile (split-K),
// 0 = automatic (1..16, from the occupancy API); the tests and dev/ fix it to cover every split.
// `pdl`: launch with programmatic dependent launch (tensor_core.cuh, pdl_wait), so that the kernel
// starts loading weights while the previous kernel in the stream finishes.
// Returns cudaErrorInvalidValue for arguments it cannot handle.
cudaError_t launch_gemv_w4a16(const void* x, const int32_t* qweight, const int32_t* qzeros,
                              const void* scales, const void* bias, void* y, int64_t M, int64_t K,
                              int64_t N, int64_t G, int splits, bool pdl, cudaStream_t stream);

// ---- batch (w4 GEMV layout): kernels/gemm_w4a16_batch.cu (mma.sync, M <= 64, sm_80+) and
// kernels/gemm_w4a16_wgmma.cu (wgmma, sm_90a: kernel 2, M <= 128; kernel 3, the warp-specialised
// one, any M up to kWsMaxM in tiles of 64, 128 or 256 tokens) ----
//
// Same operands and result as launch_gemv_w4a16, one read of the weight per tile of tokens.
// plan_gemm_w4a16_batch plans the kernel the caller names (`kernel`: 1 = mma.sync, 2 = wgmma,
// 3 = warp-specialised wgmma; 2 and 3 on compute capability 9.0 only; w4cli.gpu.kernels.gemv_path
// chooses by M), its tiling (`tiles`, 0 = by shape: row tiles per warp or warpgroup for kernels
// 1 and 2, the variant 1..5 of kernel 3, gemm_w4a16_wgmma.cu's pick_ws_variant) and the split-K
// count (`splits`, 0 = from a model of the busiest SM; the tests and dev/ fix both to cover each)
// and, for kernels 2 and 3, the k order x is staged in (`order`: 0 = by shape, 1 = permuted first by
// an x kernel, 2 = as x lies; gemm_w4a16_wgmma.cu's pick_k_order).
// The caller then provides, for kernel 1 when plan.splits > 1, partial [splits, M, N] fp32 and
// counters [plan.row_blocks] int32 scratch (the launch zeroes the counters; kernels 2 and 3 add
// their split-K partials within a thread block cluster and need neither), and for kernels 2 and 3
// plan.scratch_bytes of device memory, 256-byte aligned (the permuted activations; kernel 3's
// stream-K partials and flags). `pdl`: as launch_gemv_w4a16's, for kernels 2 and 3 (which
// also start their GEMM under their own permute or flags kernel that way, always); kernel 1 ignores
// it (gemm_w4a16_batch.cu says why). Both return cudaErrorInvalidValue for arguments they cannot
// handle.
constexpr int64_t kBatchMaxM = 64;
constexpr int64_t kWgmmaMaxM = 128;
constexpr int64_t kWsMaxM = 65536;
struct BatchPlan {
  int splits, kb_per_split, row_blocks, rows, tiles;
  int kernel;           // 1, 2 or 3, as asked
  int m_tiles;          // tiles of tokens (kernel 3; 1 otherwise)
  int ctas;             // kernel 3's persistent grid (0: split-K in clusters, or kernels 1-2)
  int sk_tiles, sk_blocks;  // kernel 3's tiles shared out by stream-K, and among how many of the ctas
  int natural;          // kernels 2 and 3: 1 = x staged as it lies, 0 = permuted first (`order`)
  int permute_pdl;      // kernel 2: 1 = launched with PDL after its permute kernel (0 where that runs slow)
  int64_t scratch_bytes;  // the scratch kernels 2 and 3 need (0 for kernel 1)
};
cudaError_t plan_gemm_w4a16_batch(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int tiles, int kernel,
                                  int order, BatchPlan* plan);
cudaError_t launch_gemm_w4a16_batch(const void* x, void* scratch, const int32_t* qweight, const int32_t* qzeros,
                                    const void* scales, const void* bias, void* y, float* partial,
                                    int* counters, int64_t M, int64_t K, int64_t N, int64_t G,
                                    const BatchPlan& plan, bool pdl, cudaStream_t stream);
// The wgmma kernels' own plans and launches, called by the two above.
cudaError_t plan_gemm_w4a16_wgmma(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int tiles, int order,
                                  BatchPlan* plan);
cudaError_t launch_gemm_w4a16_wgmma(const void* x, void* scratch, const int32_t* qweight, const int32_t* qzeros,
                                    const void* scales, const void* bias, void* y, int64_t M, int64_t K, int64_t N,
                                    int64_t G, const BatchPlan& plan, bool pdl, cudaStream_t stream);
cudaError_t plan_gemm_w4a16_ws(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int variant, int order,
                               BatchPlan* plan);
cudaError_t launch_gemm_w4a16_ws(const void* x, void* scratch, const int32_t* qweight, const int32_t* qzeros,
                                 const void* scales, const void* bias, void* y, int64_t M, int64_t K, int64_t N,
                                 int64_t G, const BatchPlan& plan, bool pdl, cudaStream_t stream);

// ---- dequantize (w4 GEMV layout), kernels/dequant_w4_gemv.cu ----
//
// qweight [N/8, ceil(K/128), 8, 16] int32, qzeros [K/G, N/8] int32, scales [K/G, N] fp16 ->
// out [N, K] fp16, out[n, k] = fp16((q - z) * s), bit-identical to w4_gemv.dequantize.
// Requires K % 8 == 0, N % 8 == 0, K % G == 0, G % 8 == 0 or G == K, K < 2^21, N < 2^31.
cudaError_t launch_dequant_w4_gemv(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                                   void* out, int64_t K, int64_t N, int64_t G, cudaStream_t stream);

}  // namespace w4
