// gemm_w4a16_wgmma.cu: y[M, N] = x[M, K] W^T (+ bias) for int4 W (w4-gemv layout), M = 1..128,
// on Hopper's warpgroup MMA (wgmma, sm_90a). gemm_w4a16_batch.cu is the same computation on
// mma.sync for sm_80+; on Hopper mma.sync issues too slowly to keep up with HBM from M = 32 up.
//
// Numerics: the batch kernel's per-weight path, W16[n, k] = fp16((q - z) * s) (one mul.rn.f16x2
// from the exact q - z), fp32 accumulation in the tensor cores, split partials added in split
// order, bias in fp32, one rounding; gemm_w4a16_batch.cu's header derives why w4cli/checks.py's
// bound holds it, and exact data (x in {-1, 0, 1}, power-of-two scales) gives the reference bit
// for bit.
//
// Roles. The weight is wgmma's A operand, 64 rows of N per warpgroup, converted to fp16 in
// registers (the GEMV's lop3 path gives the mma A fragment, which is also wgmma's register
// fragment). The activations are the B operand (N = MT tokens), read by the tensor cores from
// shared memory through a descriptor.
//
// The k order. A lane's A fragment of 16 k comes from one packed word of its own (the w4-gemv
// layout: lane t of a quad holds k 32 t + 8 j .. 32 t + 8 j + 7 of word j), so the 16 k of one
// wgmma step are 4-element pieces of four different 8-k runs. B must present the same k order:
// permute_x_kernel writes x_perm [M, Kp] (Kp = K rounded up to 128, zero past K) where, within
// each 128-k block, position p = 16 s + 8 c + 2 t + i (k16 step s = 2 j + h, 8-k column c,
// lane t of the quad, element i) holds x[m, 32 t + 8 j + 4 h + 2 c + i]. That is 8 consecutive
// positions per 16-byte chunk, so x_perm is staged with plain 16-byte copies.
//
// How a block works. 8 warps = 2 warpgroups; each warpgroup owns NT m64 tiles (a block owns
// R = 128 NT rows of N) and the block a range of k-blocks (split-K over S blocks per row range).
// Each 128-k block is one stage of a cp.async ring in shared memory, up to 4 deep:
//   x        MT rows of x_perm, two 64-k swizzle atoms of [MT rows][128 B] (16-byte unit u of row
//            r at u ^ (r % 8), the 128-byte swizzle the descriptor names), rows >= M zero-filled
//   weights  the block's 16-row qweight tiles of 1 KB (L2 evict-first: read once)
//   scales, zeros  per 32-k run slot, as in the batch kernel
// One block barrier per k-block (after cp.async lands and the proxy fence, so the tensor cores
// see it). Per k-block each warp converts, per word j, its NT 16-row tiles to A fragments (scale
// applied per weight) and issues 2 wgmma m64nMTk16 per tile (steps 2 j, 2 j + 1) with B at the
// step's 32-byte column of the atom; conversion of word j + 1 overlaps the wgmma of word j. The
// warp waits for its wgmmas before the next barrier, which frees the stage for refilling.
// Split-K and the output: batch_common.cuh (deterministic, in split order).
//
// Launch shape: permute_x_kernel, then grid (ceil(N / R), S), block 256 threads, dynamic shared
// memory kStages x (MT x 256 + R x 64 + R x 10, rounded up to 1 KB) + 1 KB; MT = M rounded up to
// 16, 32, 64 or 128; NT and S by plan_gemm_w4a16_wgmma (the batch kernel's byte model).
// Constraints (checked by kernels/ops.cpp and the launcher): as gemm_w4a16_batch.cu, with
// 1 <= M <= 128, and x_perm [M, Kp] fp16 scratch from the caller.
// Archs: sm_90a only (the kernels compile elsewhere to an empty body the launcher never runs).
// Test: pytest -m gpu tests/test_batch_gpu.py.  Bench: w4 bench --batch 16,32,64,128.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "batch_common.cuh"
#include "int4_convert.cuh"
#include "tensor_core.cuh"
#include "w4_kernels.h"

namespace w4 {
namespace {

// One thread per 16-byte chunk of x_perm: chunk oc (0..15) of row m's 128-k block b holds the
// fp16 pairs 16 t + oc (t = 0..3) of that block of x (the header's order, in pairs).
__global__ void __launch_bounds__(256) permute_x_kernel(const uint32_t* __restrict__ x, uint4* __restrict__ xp,
                                                        int M, int K, int kblocks) {
  const int64_t idx = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (idx >= (int64_t)M * kblocks * 16) return;
  const int oc = (int)(idx & 15);
  const int64_t mb = idx >> 4;
  const int m = (int)(mb / kblocks);
  const int pair0 = (int)(mb - (int64_t)m * kblocks) * 64 + oc;
  const uint32_t* row = x + (size_t)m * (K / 2);
  uint32_t v[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int pair = pair0 + 16 * t;
    v[t] = 2 * pair < K ? __ldg(row + pair) : 0u;
  }
  xp[idx] = make_uint4(v[0], v[1], v[2], v[3]);
}

template <int MT, int NT>
struct WgStage {
  static constexpr int kRows = 2 * NT * 64;  // rows of N per block
  static constexpr int kTokens = MT;
  static constexpr int kXOff = 0;            // 1 KB aligned: the swizzle atoms need it
  static constexpr int kWOff = MT * 256;
  static constexpr int kSOff = kWOff + kRows * 64;
  static constexpr int kZOff = kSOff + kRunSlots * kRows * 2;
  static constexpr int kStageBytes = (kZOff + kRunSlots * (kRows / 8) * 4 + 1023) / 1024 * 1024;
  static constexpr int kStages = (220 * 1024) / kStageBytes >= 4 ? 4 : (220 * 1024) / kStageBytes;
  static constexpr int kSmem = kStages * kStageBytes + 1024;  // + room to align the base to 1 KB
  static_assert(kStages >= 2, "a stage must fit twice in shared memory");
  __device__ static __forceinline__ uint32_t x_dst(int r, int c) {
    return kXOff + (c >> 3) * (MT * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
  }
};

#if defined(W4_HAS_WGMMA)
// One k-block of one warp: its NT 16-row tiles (one per m64 tile of its warpgroup) x MT tokens.
template <int MT, int NT>
__device__ __forceinline__ void wgmma_stage(const uint8_t* st, uint32_t st_addr, int wg, int wi, int lane,
                                            int slot, float (&acc)[NT][MT / 8][4]) {
  using S = WgStage<MT, NT>;
  const uint4* ws = reinterpret_cast<const uint4*>(st + S::kWOff);
  const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + S::kSOff);
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(st + S::kZOff);
  const int g = lane >> 2;
  const int zshift = 4 * ((g >> 1) + 4 * (g & 1));  // AWQ_REVERSE_ORDER[g]: nibble of row g's zero

  uint4 lo[NT], hi[NT];
  uint32_t slo[NT], shi[NT];
  ZeroF16x8 zlo[NT], zhi[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int q = (wg * NT + i) * 4 + wi;  // the warp's 16-row tile of its warpgroup's m64 tile i
    lo[i] = ws[(2 * q) * 32 + lane];
    hi[i] = ws[(2 * q + 1) * 32 + lane];
    const int row = 16 * q + g;
    slo[i] = ss[slot * S::kRows + row];
    shi[i] = ss[slot * S::kRows + row + 8];
    const uint32_t* zw = zs + slot * (S::kRows / 8) + 2 * q;
    zlo[i] = row_zero((zw[0] >> zshift) & 0xF);
    zhi[i] = row_zero((zw[1] >> zshift) & 0xF);
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
      for (int p = 0; p < 4; ++p) {  // per weight: (q - z) * s rounded once, the reference's W16
        af[i][2 * p] = mul_f16x2(dl[p], slo[i] * 0x10001u);
        af[i][2 * p + 1] = mul_f16x2(dh[p], shi[i] * 0x10001u);
      }
    }
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint64_t desc = smem_desc_sw128(st_addr + S::kXOff + (j >> 1) * (MT * 128) + (2 * (j & 1) + h) * 32);
#pragma unroll
      for (int i = 0; i < NT; ++i)
        wgmma_m64k16_rs<MT>(reinterpret_cast<float(&)[MT / 2]>(acc[i]), af[i][4 * h], af[i][4 * h + 1],
                            af[i][4 * h + 2], af[i][4 * h + 3], desc);
    }
    wgmma_commit();
    wgmma_wait<1>();  // word j - 1's wgmmas are done: their A fragments' registers are free again
  }
  wgmma_wait<0>();  // the stage's slot may be refilled after the next barrier
}
#endif

template <int MT, int NT>
__global__ void __launch_bounds__(kBatchThreads, MT <= 32 ? 2 : 1) gemm_w4a16_wgmma_kernel(const BatchArgs a) {
#if defined(W4_HAS_WGMMA)
  using S = WgStage<MT, NT>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem0 = (raw + 1023) & ~1023u;
  const uint8_t* smem = smem_raw + (smem0 - raw);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cb = blockIdx.x;
  const int split = blockIdx.y;
  const int kb0 = split * a.kb_per_split;
  const int nkb = min(a.kblocks, kb0 + a.kb_per_split) - kb0;
  const uint64_t policy = evict_first_policy();
  const Loader<S> loader(a, cb);
  const int slot = a.run_slots == 1 ? 0 : (lane & 3);

  float acc[NT][MT / 8][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int nb = 0; nb < MT / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][nb][e] = 0.f;

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < nkb) loader.load(smem0 + s * S::kStageBytes, kb0 + s, a, policy);
    cp_async_commit();
  }
  for (int i = 0; i < nkb; ++i) {
    cp_async_wait<S::kStages - 2>();  // stage i has landed (this thread's copies)
    fence_proxy_async_shared();       // ... and is visible to the tensor cores
    __syncthreads();                  // ... everyone's; and stage i - 1 is no longer read
    const int next = i + S::kStages - 1;
    if (next < nkb) loader.load(smem0 + (next % S::kStages) * S::kStageBytes, kb0 + next, a, policy);
    cp_async_commit();
    const int at = (i % S::kStages) * S::kStageBytes;
    wgmma_stage<MT, NT>(smem + at, smem0 + at, warp >> 2, warp & 3, lane, slot, acc);
  }
  cp_async_wait<0>();
  write_result(acc, a, cb, split, cb * S::kRows + (warp >> 2) * NT * 64 + (warp & 3) * 16, 64, lane);
#endif
}

struct WgVariant {
  void (*fn)(const BatchArgs);
  int rows, smem, tokens;
};

template <int MT, int NT>
WgVariant wg_variant() {
  return {gemm_w4a16_wgmma_kernel<MT, NT>, WgStage<MT, NT>::kRows, WgStage<MT, NT>::kSmem, MT};
}

bool pick_wg_variant(int64_t M, int tiles, WgVariant* v) {
  const int mt = M <= 16 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : 128;
  switch (mt * 10 + tiles) {
    case 161: *v = wg_variant<16, 1>(); return true;
    case 162: *v = wg_variant<16, 2>(); return true;
    case 321: *v = wg_variant<32, 1>(); return true;
    case 322: *v = wg_variant<32, 2>(); return true;
    case 641: *v = wg_variant<64, 1>(); return true;
    case 642: *v = wg_variant<64, 2>(); return true;
    case 1281: *v = wg_variant<128, 1>(); return true;
    default: return false;
  }
}

bool wg_shapes_ok(int64_t M, int64_t K, int64_t N, int64_t G) {
  return M >= 1 && M <= kWgmmaMaxM && K >= 8 && K % 8 == 0 && N >= 8 && N % 8 == 0 && G >= 1 && K % G == 0 &&
         (G % 32 == 0 || G == K) && K < (int64_t{1} << 21) && N < (int64_t{1} << 31);
}

}  // namespace

cudaError_t plan_gemm_w4a16_wgmma(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int tiles,
                                  BatchPlan* plan) {
  int device = 0, sms = 132, per_sm = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // two m64 tiles per warpgroup halve the activation reads per weight byte, unless that leaves
  // SMs idle (the mma.sync kernel's rule); at M > 64 only one fits in registers
  if (tiles == 0) tiles = M <= 64 && N * 5 >= (int64_t)sms * 256 * 4 ? 2 : 1;
  WgVariant v;
  if (!wg_shapes_ok(M, K, N, G) || splits < 0 || splits > 64 || !pick_wg_variant(M, tiles, &v))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem);
  if (err != cudaSuccess) return err;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fn, kBatchThreads, v.smem);
  if (err != cudaSuccess) return err;
  per_sm = per_sm < 1 ? 1 : per_sm;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int row_blocks = static_cast<int>((N + v.rows - 1) / v.rows);
  plan_splits(splits, kblocks, row_blocks, sms, per_sm, (int64_t)v.rows * 64 + (int64_t)v.tokens * 256, M,
              v.rows, plan);
  plan->row_blocks = row_blocks;
  plan->rows = v.rows;
  plan->tiles = tiles;
  plan->wgmma = true;
  plan->x_cols = kblocks * 128;
  return cudaSuccess;
}

cudaError_t launch_gemm_w4a16_wgmma(const void* x, void* x_perm, const int32_t* qweight, const int32_t* qzeros,
                                    const void* scales, const void* bias, void* y, float* partial, int* counters,
                                    int64_t M, int64_t K, int64_t N, int64_t G, const BatchPlan& plan,
                                    cudaStream_t stream) {
  WgVariant v;
  if (!wg_shapes_ok(M, K, N, G) || !pick_wg_variant(M, plan.tiles, &v) || v.rows != plan.rows ||
      plan.splits < 1 || x_perm == nullptr || plan.x_cols != (K + 127) / 128 * 128 ||
      (plan.splits > 1 && (partial == nullptr || counters == nullptr)))
    return cudaErrorInvalidValue;
  BatchArgs a = batch_args(x_perm, qweight, qzeros, scales, bias, y, partial, counters, M, K, N, G);
  a.x_stride = a.x_cols = plan.x_cols;
  a.kb_per_split = plan.kb_per_split;
  a.splits = plan.splits;
  const int64_t chunks = M * a.kblocks * 16;
  permute_x_kernel<<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(
      static_cast<const uint32_t*>(x), static_cast<uint4*>(x_perm), a.M, a.K, a.kblocks);
  const dim3 grid(plan.row_blocks, plan.splits);
  v.fn<<<grid, kBatchThreads, v.smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace w4
