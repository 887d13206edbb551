// gemm_w4a16_batch.cu: y[M, N] = x[M, K] W^T (+ bias) for int4 W (w4-gemv layout), M = 9..64.
//
// The GEMV (gemv_w4a16.cu) holds up to 4 mma n8 tiles of tokens in registers, without staging;
// this kernel stages weights and activations in shared memory and reads each weight once for all
// M rows, which wins on layers large enough to hide its pipeline fill (kernels.gemv_path).
//
// Numerics (the GEMV's per-weight path): W16[n, k] = fp16((q - z) * s), one mul.rn.f16x2 from the
// exact q - z, bit-identical to w4cli.formats.w4_gemv.dequantize; the tensor cores add the exact
// products W16 * x in fp32; a k-split's partial sums are added in split order in fp32; bias in fp32;
// one rounding to fp16. The pure-torch oracle is w4_gemv.gemv_reference (fp32 sums of W16 * x), and
// the difference is the fp32 summation order only: w4cli/gpu/checks.py's bound (its 4 K 2^-24 |x|@|W|
// term is the order-independent bound of an fp32 sum of K products) holds it. Exact data (x in
// {-1, 0, 1}, power-of-two scales) gives the reference bit for bit.
//
// Inputs (K = in_features, N = out_features, G = group size, Kp = K rounded up to 128):
//   x       [M, K]                fp16, 16-byte aligned (K % 8 == 0)
//   qweight [N/8, Kp/128, 8, 16]  int32, the w4-gemv layout (gemv_w4a16.cu's header, docs/formats.md)
//   qzeros  [K/G, N/8] int32, scales [K/G, N] fp16 (AWQ gemm), bias [N] fp16 or null, y [M, N] fp16
//
// How a block works. A block owns R = 8 warps x NT 16-row tiles (R = 128 NT rows of N) and a
// range of k-blocks (128 k each; split-K over S blocks per row range). Each k-block is one stage
// of a cp.async ring in shared memory, kStages deep:
//   weights  the block's 2 x 8 NT qweight tiles of 512 B, copied whole (lane L of a warp later
//            reads the 16 bytes at 16 L of each: words 4t..4t+3 of row g, L = 4g + t, the GEMV's
//            fragment mapping), with an L2 evict-first hint: read once
//   x        the k-block of all M rows, [8 NB rows][16 chunks of 16 B], rows >= M and k >= K
//            zero-filled; chunk c of row r sits at c ^ ((c >> 2) & 2 | r & 1), so that the 8 lanes of
//            each 128-bit shared load phase (g in {2p, 2p+1}, t = 0..3: chunks 4t + j) hit 8
//            different 16-byte bank groups
//   scales, zeros  the R rows' scale (fp16) and zero (4-bit) of the group of each of the k-block's
//            four 32-k runs (one run when G % 128 == 0 or one group), rows >= N zero-filled
// One block barrier per k-block: the stage computed last is the one refilled next. Each warp, per
// k-block and per word j of its lanes: converts its NT tiles' words to fp16 A fragments (the
// GEMV's lop3 path, scale applied per weight), then for each of the NB n8 token tiles loads one
// 16-byte B fragment from shared memory and runs 2 mma per tile. Shared-memory reads of x per
// byte of weight: 2 NB / NT, which is what NT buys at larger M.
//
// Split-K (S > 1) reduction, deterministic (batch_common.cuh; the wgmma kernels add theirs within a
// cluster instead, which sm_80 lacks): each block writes its fp32 partial tile to
// partial[split, m, n]; the last block of a row range to arrive adds the S partials in split order,
// adds the bias and rounds once. The arrival order decides only who adds, never the order of the
// sum.
//
// Launch shape: grid (ceil(N / R), S), block 256 threads, dynamic shared memory 4 stages of 21-35
// KB. NB = ceil(M / 8) rounded up to 2, 4 or 8; NT (1 or 2) and S are chosen by
// plan_gemm_w4a16_batch: NT = 2 unless that leaves SMs idle (M > 16 and N < 0.8 x 256 x SMs),
// S by a model of the bytes through the busiest SM.
// Constraints (checked by kernels/ops.cpp; the launcher returns cudaErrorInvalidValue otherwise):
//   1 <= M <= 64 (w4cli.gpu.kernels.gemv sends it 9..64; on Hopper 9..16 on layers of 8192x8192
//   weights or more: gemv_path),
//   N % 8 == 0, K % 8 == 0, K % G == 0,
//   G % 32 == 0 or G == K, K < 2^21, N < 2^31, scales 16-byte aligned; partial [S, M, N] fp32
//   and counters [ceil(N / R)] int32 scratch when S > 1 (the launch zeroes them first).
// Archs: sm_80+ (cp.async, mma.sync m16n8k16); tuned on sm_90.
// Test: pytest -m gpu tests/test_batch_gpu.py.  Bench: w4 bench --batch 16,32,64.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "batch_common.cuh"
#include "launch.cuh"
#include "int4_convert.cuh"
#include "tensor_core.cuh"
#include "w4_kernels.h"

namespace w4 {
namespace {

constexpr int kWarps = kBatchWarps;
constexpr int kThreads = kBatchThreads;

template <int NB, int NT>
struct Tile {
  static constexpr int kRows = kWarps * NT * 16;  // rows of N per block
  static constexpr int kTokens = NB * 8;
  static constexpr int kStages = 4;
  static constexpr int kWBytes = kWarps * NT * 2 * 512;
  static constexpr int kXBytes = NB * 8 * 256;
  static constexpr int kSBytes = kRunSlots * kRows * 2;
  static constexpr int kZBytes = kRunSlots * (kRows / 8) * 4;
  static constexpr int kWOff = 0, kXOff = kWBytes, kSOff = kXOff + kXBytes, kZOff = kSOff + kSBytes;
  static constexpr int kStageBytes = kZOff + kZBytes;
  static constexpr int kSmem = kStages * kStageBytes;
  // chunk c of x row r sits at c ^ ((c >> 2) & 2 | r & 1) (see the header)
  __device__ static __forceinline__ uint32_t x_dst(int r, int c) {
    return kXOff + 16 * (r * 16 + (c ^ (((c >> 2) & 2) | (r & 1))));
  }
  // the weights as they lie in memory: each lane reads its own 16 bytes, one wavefront a quarter warp
  __device__ static __forceinline__ uint32_t w_dst(uint32_t o) { return o; }
};

// One k-block of one warp: NT tiles x NB token tiles. kPost: the tensor cores sum (q - z) x over
// the k-block and the sum is scaled once in fp32 (every 128-k block in one group: G % 128 == 0);
// else each weight is scaled in fp16 before the mma (the reference's W16).
template <int NB, int NT, bool kPost>
__device__ __forceinline__ void compute_stage(const uint8_t* st, int warp, int lane, int slot,
                                              const int (&xoff)[4], float (&acc)[NT][NB][4]) {
  using T = Tile<NB, NT>;
  const uint4* ws = reinterpret_cast<const uint4*>(st) + warp * NT * 64;
  const uint4* xs = reinterpret_cast<const uint4*>(st + T::kWBytes);
  const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + T::kWBytes + T::kXBytes);
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(st + T::kWBytes + T::kXBytes + T::kSBytes);
  const int g = lane >> 2;
  const int zshift = 4 * ((g >> 1) + 4 * (g & 1));  // AWQ_REVERSE_ORDER[g]: nibble of row g's zero

  uint4 lo[NT], hi[NT];
  uint32_t slo[NT], shi[NT];
  ZeroF16x8 zlo[NT], zhi[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    lo[i] = ws[(2 * i) * 32 + lane];
    hi[i] = ws[(2 * i + 1) * 32 + lane];
    const int row = (warp * NT + i) * 16 + g;
    slo[i] = ss[slot * T::kRows + row];
    shi[i] = ss[slot * T::kRows + row + 8];
    const uint32_t* zw = zs + slot * (T::kRows / 8) + (warp * NT + i) * 2;
    zlo[i] = row_zero((zw[0] >> zshift) & 0xF);
    zhi[i] = row_zero((zw[1] >> zshift) & 0xF);
  }
  float part[kPost ? NT : 1][kPost ? NB : 1][4];
  if (kPost) {
#pragma unroll
    for (int i = 0; i < (kPost ? NT : 1); ++i)
#pragma unroll
      for (int nb = 0; nb < (kPost ? NB : 1); ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[i][nb][e] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t af[NT][8];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const uint32_t wl = j == 0 ? lo[i].x : j == 1 ? lo[i].y : j == 2 ? lo[i].z : lo[i].w;
      const uint32_t wh = j == 0 ? hi[i].x : j == 1 ? hi[i].y : j == 2 ? hi[i].z : hi[i].w;
      uint32_t dl[4], dh[4];
      u4x8_minus_zero_f16x8(wl, zlo[i], dl);  // exact q - z, fp16 pairs (k, k+1)
      u4x8_minus_zero_f16x8(wh, zhi[i], dh);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        // per weight: (q - z) * s rounded once, the reference's W16
        af[i][2 * p] = kPost ? dl[p] : mul_f16x2(dl[p], slo[i] * 0x10001u);
        af[i][2 * p + 1] = kPost ? dh[p] : mul_f16x2(dh[p], shi[i] * 0x10001u);
      }
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const uint4 xv = xs[xoff[j] + nb * 128];
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        float (&c)[4] = kPost ? part[kPost ? i : 0][kPost ? nb : 0] : acc[i][nb];
        mma_16816(c, af[i][0], af[i][1], af[i][2], af[i][3], xv.x, xv.y);
        mma_16816(c, af[i][4], af[i][5], af[i][6], af[i][7], xv.z, xv.w);
      }
    }
  }
  if (kPost) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const float sl = __half2float(__ushort_as_half((unsigned short)slo[i]));
      const float sh = __half2float(__ushort_as_half((unsigned short)shi[i]));
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const float (&c)[4] = part[kPost ? i : 0][kPost ? nb : 0];
        acc[i][nb][0] = fmaf(sl, c[0], acc[i][nb][0]);
        acc[i][nb][1] = fmaf(sl, c[1], acc[i][nb][1]);
        acc[i][nb][2] = fmaf(sh, c[2], acc[i][nb][2]);
        acc[i][nb][3] = fmaf(sh, c[3], acc[i][nb][3]);
      }
    }
  }
}

template <int NB, int NT, bool kPost>
__global__ void __launch_bounds__(kThreads, NB * NT <= 4 ? 2 : 1) gemm_w4a16_batch_kernel(const BatchArgs a) {
  using T = Tile<NB, NT>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cb = blockIdx.x;
  const int split = blockIdx.y;
  const int kb0 = split * a.kb_per_split;
  const int nkb = min(a.kblocks, kb0 + a.kb_per_split) - kb0;
  const uint64_t policy = evict_first_policy();
  const Loader<T> loader(a, cb);
  const uint32_t smem0 = smem_u32(smem);
  const int g = lane >> 2;
  const int t = lane & 3;
  const int slot = a.run_slots == 1 ? 0 : t;
  int xoff[4];  // the lane's B fragment chunk of word j, token tile 0
#pragma unroll
  for (int j = 0; j < 4; ++j) xoff[j] = (Tile<NB, NT>::x_dst(g, 4 * t + j) - Tile<NB, NT>::kXOff) / 16;

  float acc[NT][NB][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][nb][e] = 0.f;

  loader.load_first(smem0, T::kStageBytes, T::kStages - 1, kb0, nkb, a, policy);
  for (int i = 0; i < nkb; ++i) {
    cp_async_wait<T::kStages - 2>();  // stage i has landed (this thread's copies)
    __syncthreads();                  // ... everyone's; and stage i - 1 is no longer read
    const int next = i + T::kStages - 1;
    if (next < nkb) loader.load(smem0 + (next % T::kStages) * T::kStageBytes, kb0 + next, a, policy);
    cp_async_commit();
    compute_stage<NB, NT, kPost>(smem + (i % T::kStages) * T::kStageBytes, warp, lane, slot, xoff, acc);
  }
  cp_async_wait<0>();

  static_assert(T::kRows == 128 * NT, "write_result's tile");
  write_result(acc, a, cb, split, cb * T::kRows + warp * NT * 16, 16, lane, cb * T::kRows);
}

using BatchKernel = void (*)(const BatchArgs);

struct Variant {
  BatchKernel fn;
  int rows, smem;
};

template <int NB, int NT>
Variant variant(bool post) {
  using T = Tile<NB, NT>;
  if constexpr (NB * NT <= 8) {
    if (post) return {gemm_w4a16_batch_kernel<NB, NT, true>, T::kRows, T::kSmem};
  }
  return {gemm_w4a16_batch_kernel<NB, NT, false>, T::kRows, T::kSmem};
}

// NB token tiles (M rounded up to 16, 32 or 64) and the row tiles per warp (0 = the default).
// Scale after the mma when every 128-k block lies in one group and K >= 4096 (the GEMV's rule and
// reason: the skipped weight rounding stays within half of the bound's K term), and the tile's
// per-k-block sums fit in registers beside its accumulators (NB x NT <= 8).
bool post_scale(int64_t K, int64_t G, int nb, int tiles) {
  return (G == K || G % 128 == 0) && K >= 4096 && nb * tiles <= 8;
}

// NB token tiles (M rounded up to 16, 32 or 64) and NT 16-row tiles per warp: NT = 2 halves the
// activation traffic per weight byte, NT = 1 doubles the blocks (and, at M > 16 where NT = 2 holds
// one block per SM, the warps) that hide latency; `tiles` = 0 takes the default.
// NT = 2 unless it leaves SMs idle.
int default_tiles(int64_t M, int64_t N, int sms) { return M <= 16 || rows256_fill_alone(N, sms) ? 2 : 1; }

bool pick_variant(int64_t M, int64_t K, int64_t G, int tiles, Variant* v) {
  const int nb = M <= 16 ? 2 : M <= 32 ? 4 : 8;
  const bool post = post_scale(K, G, nb, tiles);
  switch (nb * 10 + tiles) {
    case 22: *v = variant<2, 2>(post); return true;
    case 41: *v = variant<4, 1>(post); return true;
    case 42: *v = variant<4, 2>(post); return true;
    case 81: *v = variant<8, 1>(post); return true;
    case 82: *v = variant<8, 2>(post); return true;
    default: return false;
  }
}

bool shapes_ok(int64_t M, int64_t K, int64_t N, int64_t G) {
  return M >= 1 && M <= kBatchMaxM && K >= 8 && K % 8 == 0 && N >= 8 && N % 8 == 0 && G >= 1 && K % G == 0 &&
         (G % 32 == 0 || G == K) && K < (int64_t{1} << 21) && N < (int64_t{1} << 31);
}

}  // namespace

cudaError_t plan_gemm_w4a16_batch(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int tiles, int kernel,
                                  int order, BatchPlan* plan) {
  int device = 0, sms = 132, per_sm = 1, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  // wgmma exists on sm_90a only, which w4cli/gpu/kernels.py builds for every compute capability 9.0
  const bool hopper = major == 9 && minor == 0;
  if (kernel == 2 || kernel == 3) {
    if (!hopper) return cudaErrorInvalidValue;
    return kernel == 2 ? plan_gemm_w4a16_wgmma(M, K, N, G, splits, tiles, order, plan)
                       : plan_gemm_w4a16_ws(M, K, N, G, splits, tiles, order, plan);
  }
  if (kernel != 1 || order != 0) return cudaErrorInvalidValue;
  if (tiles == 0 && shapes_ok(M, K, N, G)) tiles = default_tiles(M, N, sms);
  Variant v;
  if (!shapes_ok(M, K, N, G) || splits < 0 || splits > 64 || tiles < 0 || !pick_variant(M, K, G, tiles, &v))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem);
  if (err != cudaSuccess) return err;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fn, kThreads, v.smem);
  if (err != cudaSuccess) return err;
  per_sm = per_sm < 1 ? 1 : per_sm;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int row_blocks = static_cast<int>((N + v.rows - 1) / v.rows);
  plan_splits(splits, kblocks, row_blocks, sms, per_sm, (int64_t)v.rows * 64 + 2048 * (M <= 16 ? 2 : M <= 32 ? 4 : 8),
              M, v.rows, SplitSum::kGlobal, plan);
  plan->row_blocks = row_blocks;
  plan->rows = v.rows;
  plan->tiles = tiles;
  plan->m_tiles = 1;
  plan->kernel = 1;
  plan->ctas = plan->sk_tiles = plan->sk_blocks = plan->natural = 0;
  plan->scratch_bytes = 0;
  return cudaSuccess;
}

cudaError_t launch_gemm_w4a16_batch(const void* x, void* scratch, const int32_t* qweight, const int32_t* qzeros,
                                    const void* scales, const void* bias, void* y, float* partial,
                                    int* counters, int64_t M, int64_t K, int64_t N, int64_t G,
                                    const BatchPlan& plan, bool pdl, cudaStream_t stream) {
  if (plan.kernel == 3)
    return launch_gemm_w4a16_ws(x, scratch, qweight, qzeros, scales, bias, y, M, K, N, G, plan, pdl, stream);
  if (plan.kernel == 2)
    return launch_gemm_w4a16_wgmma(x, scratch, qweight, qzeros, scales, bias, y, M, K, N, G, plan, pdl, stream);
  Variant v;
  if (!shapes_ok(M, K, N, G) || !pick_variant(M, K, G, plan.tiles, &v) || v.rows != plan.rows ||
      plan.kernel != 1 || plan.splits < 1 || (plan.splits > 1 && (partial == nullptr || counters == nullptr)))
    return cudaErrorInvalidValue;
  BatchArgs a = batch_args(x, qweight, qzeros, scales, bias, y, partial, counters, M, K, N, G);
  a.kb_per_split = plan.kb_per_split;
  a.splits = plan.splits;
  if (plan.splits > 1) {
    const cudaError_t err = cudaMemsetAsync(counters, 0, sizeof(int) * plan.row_blocks, stream);
    if (err != cudaSuccess) return err;
  }
  // Without PDL whatever the caller asks: launched under the GEMV of the layer before, its blocks
  // would sit waiting on SMs (Llama-3-8B's decode step at M = 16 is 15% slower on the H100 so).
  (void)pdl;
  return launch_kernel(v.fn, dim3(plan.row_blocks, plan.splits), dim3(kThreads), v.smem, stream, false, 1, a);
}

}  // namespace w4
