// batch_common.cuh: what the batch kernels share (gemm_w4a16_batch.cu, mma.sync on sm_80+;
// gemm_w4a16_wgmma.cu, wgmma on sm_90a): their arguments, the cp.async copies of one k-block into
// a shared-memory stage, the output of the accumulators, and the mma.sync kernel's split-K
// reduction through global memory.
//
// Both kernels read the w4-gemv layout (gemv_w4a16.cu's header) and hold their accumulators as
// acc[tile][n8 token tile][4], the mma C fragment: acc[i][nb][e] is output row
// row0 + step i + g + 8 (e >> 1) and token 8 nb + 2 t + (e & 1) (g = lane / 4, t = lane % 4); the
// wgmma m64nN accumulator of one warp is the same fragment, so one epilogue serves both.
// Device code only; sm_80+.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor_core.cuh"
#include "w4_kernels.h"

namespace w4 {

constexpr int kBatchWarps = 8;
constexpr int kBatchThreads = kBatchWarps * 32;
constexpr int kRunSlots = 4;  // 32-k runs per 128-k block (a run never straddles a group)

struct BatchArgs {
  const __half* __restrict__ x;
  const uint4* __restrict__ qweight;
  const uint32_t* __restrict__ qzeros;
  const __half* __restrict__ scales;
  const __half* __restrict__ bias;
  __half* __restrict__ y;
  float* __restrict__ partial;  // split-K partials (the mma.sync kernel), stream-K ones (the warp-specialised)
  int* __restrict__ counters;   // their arrival counters, or flags
  int M, K, N, groups, runs_per_group;
  int x_stride, x_cols;  // x's row length, and the k below which x holds data (K, or Kp when padded)
  uint32_t group_magic;
  int kblocks, kb_per_split, splits, run_slots;
  int m_tiles, row_blocks;  // tiles of tokens and of rows of N (the warp-specialised kernel)
  int sk_tiles, sk_blocks;  // its last tiles shared out by stream-K, and among how many blocks
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (src-size 0 reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16_policy(uint32_t dst, const void* src, bool valid,
                                                  uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 16 : 0), "l"(policy));
}
// qzeros rows are N/2 bytes long, so only 4-byte alignment holds for a block's zero words
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Group of 32-k run r (G % 32 == 0, or a single group); runs past K take the last group.
__device__ __forceinline__ int group_of_run(uint32_t run, const BatchArgs& a) {
  int grp = a.runs_per_group == 1 ? (int)run : (int)__umulhi(run, a.group_magic);
  return a.groups == 1 ? 0 : min(grp, a.groups - 1);
}

// The copies one thread issues for every stage, addressed once: per stage only the k-block moves.
// S describes the stage: kRows (rows of N per block), kTokens (x rows staged), the byte offsets
// kWOff, kXOff, kSOff, kZOff of weights, activations, scales and zeros, x_dst(r, c), the
// offset of 16-byte chunk c (0..15) of x row r, and w_dst(o), where byte o of the block's weights
// goes within their part. The weights land as the block's 16-row tiles of 1 KB in order (two
// 512-byte qweight tiles each), each 1 KB arranged by w_dst; scales and zeros as [run slot][rows].
template <typename S>
struct Loader {
  static constexpr int kW = (S::kRows * 4) / kBatchThreads;                        // weight chunks per thread
  static constexpr int kX = (S::kTokens * 16 + kBatchThreads - 1) / kBatchThreads;  // x chunks per thread
  // Chunk i of a thread is chunk 0's row plus 16 rows (x) or 8 qweight tiles (weights) per i, and
  // lands a fixed step further in the stage: one address per kind, a validity bit per chunk.
  const uint4* w;       // weight chunk 0's source at k-block 0
  const __half* x;      // x chunk 0's source at k-block 0
  uint32_t wdst, xdst;  // chunk 0's offsets in the stage
  uint32_t xstep;       // stage offset between chunk i and i + 1 of x
  int w_tile_stride;    // uint4s between chunk i and i + 1 of the weights (8 qweight tiles)
  int x_row_stride;     // halves between chunk i and i + 1 of x (16 rows)
  int xk;               // x chunk 0's k at k-block 0
  uint32_t wok, xok;    // bit i: chunk i is inside N / inside M
  const __half* s;      // this thread's scale chunk at group 0
  const uint32_t* z;
  uint32_t sdst, zdst;
  int slot;             // the 32-k run slot this thread copies (-1: none)
  bool sz_ok;

  __device__ __forceinline__ Loader(const BatchArgs& a, int cb) {
    const int tid = threadIdx.x;
    const int words_n = a.N >> 3;
    const int t8 = 2 * (cb * (S::kRows / 16) + (tid >> 6)) + ((tid >> 5) & 1);  // chunk 0's 8-row qweight tile
    w = a.qweight + (size_t)t8 * a.kblocks * 32 + (tid & 31);
    w_tile_stride = 8 * a.kblocks * 32;
    wdst = S::kWOff + S::w_dst(tid * 16);  // chunk i is 4 KB on: w_dst keeps the same arrangement
    wok = 0;
#pragma unroll
    for (int i = 0; i < kW; ++i) wok |= (t8 + 8 * i < words_n ? 1u : 0u) << i;
    const int r = tid >> 4;
    x = a.x + (size_t)r * a.x_stride + 8 * (tid & 15);
    x_row_stride = 16 * a.x_stride;
    xdst = S::x_dst(r, tid & 15);
    xstep = S::x_dst(r + 16, tid & 15) - xdst;
    xk = 8 * (tid & 15);
    xok = 0;
#pragma unroll
    for (int i = 0; i < kX; ++i)
      xok |= (r + 16 * i < a.M && tid + i * kBatchThreads < S::kTokens * 16 ? 1u : 0u) << i;
    constexpr int kChunks = S::kRows / 8;  // 8 rows: one 16-byte scale chunk, one zero word
    slot = tid / kChunks;
    const int i = tid - slot * kChunks;
    const int n0 = cb * S::kRows + 8 * i;
    sz_ok = n0 < a.N;
    s = a.scales + (sz_ok ? n0 : 0);
    z = a.qzeros + (sz_ok ? (n0 >> 3) : 0);
    sdst = S::kSOff + 2 * (slot * S::kRows + 8 * i);
    zdst = S::kZOff + 4 * (slot * kChunks + i);
    if (slot >= a.run_slots) slot = -1;
  }

  // Issue the copies of k-block kb into the stage at shared address st. Per chunk: one 32-bit
  // offset from the k-block's base (the strides fit: K < 2^21, 16 rows or 8 tiles per chunk).
  // load_constants: the weights, scales and zeros (no kernel writes them: they may be copied
  // before pdl_wait); load_x: the activations; load: both.
  __device__ __forceinline__ void load_constants(uint32_t st, int kb, const BatchArgs& a, uint64_t policy) const {
    const char* wk = reinterpret_cast<const char*>(w + (size_t)kb * 32);
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const bool ok = (wok >> i) & 1;
      const char* src = wk + (uint32_t)(i * w_tile_stride) * 16u;
      cp_async16_policy(st + wdst + i * kBatchThreads * 16, ok ? src : reinterpret_cast<const char*>(a.qweight), ok,
                        policy);
    }
    load_scales(st, kb, a);
  }
  // The scales and zeros alone (the barrier wgmma kernel's tensor copies bring its weights and x).
  __device__ __forceinline__ void load_scales(uint32_t st, int kb, const BatchArgs& a) const {
    if (slot >= 0) {
      const int grp = group_of_run(4u * kb + slot, a);
      cp_async16(st + sdst, s + (size_t)grp * a.N, sz_ok);
      cp_async4(st + zdst, z + (size_t)grp * (a.N >> 3), sz_ok);
    }
  }
  __device__ __forceinline__ void load_x(uint32_t st, int kb, const BatchArgs& a) const {
    const bool k_ok = xk + kb * 128 < a.x_cols;
    const char* xkb = reinterpret_cast<const char*>(x + kb * 128);
#pragma unroll
    for (int i = 0; i < kX; ++i) {
      if (S::kTokens * 16 % kBatchThreads == 0 || (int)threadIdx.x + i * kBatchThreads < S::kTokens * 16) {
        const bool ok = k_ok && ((xok >> i) & 1);
        const char* src = xkb + (uint32_t)(i * x_row_stride) * 2u;
        cp_async16(st + xdst + i * xstep, ok ? src : reinterpret_cast<const char*>(a.x), ok);
      }
    }
  }
  __device__ __forceinline__ void load(uint32_t st, int kb, const BatchArgs& a, uint64_t policy) const {
    load_constants(st, kb, a, policy);
    load_x(st, kb, a);
  }

  // The first stages (0 .. stages - 1 below nkb), one cp.async group each, as `load` issues them,
  // but stage 0's weights, scales and zeros before pdl_wait (with PDL, while the kernel before
  // still runs). Only stage 0's: the later stages' weights queued ahead of the first activations
  // could hold those back (ws_produce says why).
  __device__ __forceinline__ void load_first(uint32_t smem0, int stage_bytes, int stages, int kb0, int nkb,
                                             const BatchArgs& a, uint64_t policy) const {
    if (nkb > 0) load_constants(smem0, kb0, a, policy);
    pdl_wait();
    for (int s = 0; s < stages; ++s) {
      if (s < nkb) {
        if (s > 0) load_constants(smem0 + s * stage_bytes, kb0 + s, a, policy);
        load_x(smem0 + s * stage_bytes, kb0 + s, a);
      }
      cp_async_commit();
    }
  }
};

// threadIdx.x, read where it is used: code after a long loop whose addresses derive from it would
// otherwise have them computed before the loop and held through it, in registers the loop needs.
__device__ __forceinline__ int thread_index_here() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// f(value, m, n) for each of a warp's accumulators (the fragment in the header; tile i starts at
// output row row0 + step i).
template <int NT, int NB, typename F>
__device__ __forceinline__ void for_each_output(float (&acc)[NT][NB][4], int row0, int step, int lane,
                                                F&& f) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        f(acc[i][nb][e], 8 * nb + 2 * t + (e & 1), row0 + step * i + g + 8 * (e >> 1));
}

// The MMA threads' barrier: named barrier 1 over the kThreads threads that hold accumulators (a
// warp-specialised block's producer warp takes no part in the output).
template <int kThreads = kBatchThreads>
__device__ __forceinline__ void mma_threads_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }

// y[m, n] from its fp32 sum: the bias added in fp32, one rounding.
__device__ __forceinline__ void store_output(const BatchArgs& a, float v, int m, int n) {
  const float out = a.bias != nullptr ? v + __half2float(a.bias[n]) : v;
  a.y[(size_t)m * a.N + n] = __float2half_rn(out);
}
// y[m, n .. n + 3] likewise, one 8-byte store (n % 4 == 0; y is the launcher's own allocation and
// N % 8 == 0, so it is aligned).
__device__ __forceinline__ void store_output4(const BatchArgs& a, float4 v, int m, int n) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  __align__(8) __half h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = __float2half_rn(a.bias != nullptr ? f[e] + __half2float(a.bias[n + e]) : f[e]);
  *reinterpret_cast<uint2*>(a.y + (size_t)m * a.N + n) = *reinterpret_cast<const uint2*>(h);
}
__device__ __forceinline__ float4 add4(float4 u, float4 v) {
  return make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
}

// ---- split-K through global memory (the mma.sync kernel; the wgmma kernels reduce within a
// cluster instead, gemm_w4a16_wgmma.cu) ----

// First half: store this block's fp32 partial tile to partial[split, m, n] and count the block in
// on its output tile's counter; true in the last block to arrive, which then adds the S partials.
template <int NT, int NB>
__device__ __forceinline__ bool store_partial_is_last(float (&acc)[NT][NB][4], const BatchArgs& a, int counter,
                                                      int split, int row0, int step, int lane) {
  float* part = a.partial + (size_t)split * a.M * a.N;
  for_each_output(acc, row0, step, lane, [&](float& v, int m, int n) {
    if (m < a.M && n < a.N) __stcg(part + (size_t)m * a.N + n, v);
  });
  __threadfence();  // this block's partial is visible device-wide before it counts itself in
  mma_threads_sync();
  __shared__ int last;
  if (threadIdx.x == 0) last = atomicAdd(a.counters + counter, 1) == a.splits - 1;
  mma_threads_sync();
  if (last) __threadfence();  // order the partial reads after the counter read
  return last;
}

// Second half, in the last block: y for tokens [0, kTokens) x rows [n0, n0 + kRows) of N from the
// S partials, added in split order (whoever adds, the same bits), the bias in fp32, one rounding.
// The 256 threads walk the tile in units of 4 consecutive n (16 bytes of a partial row: N % 8 == 0
// and n0 % 8 == 0, so a unit lies wholly inside or outside N), 4 units a thread at a time with the
// loads of 4 splits issued before the first add, so that many loads are in flight at once.
template <int kTokens, int kRows>
__device__ __forceinline__ void reduce_split_tile(const BatchArgs& a, int n0) {
  constexpr int kUnitsPerRow = kRows / 4, kUnits = kTokens * kUnitsPerRow;
  constexpr int kUnitsAtOnce = 4, kSplitsAtOnce = 4;
  const size_t split_stride = (size_t)a.M * a.N;
  for (int first = threadIdx.x; first < kUnits; first += kBatchThreads * kUnitsAtOnce) {
    int row[kUnitsAtOnce], col[kUnitsAtOnce];
    bool ok[kUnitsAtOnce];
    float4 sum[kUnitsAtOnce];
#pragma unroll
    for (int u = 0; u < kUnitsAtOnce; ++u) {
      const int idx = first + u * kBatchThreads;
      row[u] = idx / kUnitsPerRow;
      col[u] = n0 + 4 * (idx % kUnitsPerRow);
      ok[u] = idx < kUnits && row[u] < a.M && col[u] < a.N;
      sum[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int s0 = 0; s0 < a.splits; s0 += kSplitsAtOnce) {
      float4 p[kSplitsAtOnce][kUnitsAtOnce];
#pragma unroll
      for (int j = 0; j < kSplitsAtOnce; ++j)
#pragma unroll
        for (int u = 0; u < kUnitsAtOnce; ++u)
          p[j][u] = ok[u] && s0 + j < a.splits
                        ? __ldcg(reinterpret_cast<const float4*>(a.partial + (s0 + j) * split_stride +
                                                                  (size_t)row[u] * a.N + col[u]))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < kSplitsAtOnce; ++j)
#pragma unroll
        for (int u = 0; u < kUnitsAtOnce; ++u)
          if (s0 + j < a.splits) sum[u] = s0 + j == 0 ? p[j][u] : add4(sum[u], p[j][u]);
    }
#pragma unroll
    for (int u = 0; u < kUnitsAtOnce; ++u)
      if (ok[u]) store_output4(a, sum[u], row[u], col[u]);
  }
}

// The mma.sync kernel's result. Its output tile is all tokens x rows [n0, n0 + 128 NT) of N (8
// warps of NT 16-row tiles; acc's tile i starts at row row0 + step i). Split-K (S > 1),
// deterministic: each block writes its partial; the last block of an output tile to arrive (an
// atomic counter per tile, zeroed by the launch) adds the S partials in split order (its own read
// back too: no second set of registers). The arrival order decides only who adds, never the order
// of the sum.
template <int NT, int NB>
__device__ __forceinline__ void write_result(float (&acc)[NT][NB][4], const BatchArgs& a, int counter, int split,
                                             int row0, int step, int lane, int n0) {
  if (a.splits == 1) {
    for_each_output(acc, row0, step, lane, [&](float& v, int m, int n) {
      if (m < a.M && n < a.N) store_output(a, v, m, n);
    });
    return;
  }
  if (store_partial_is_last(acc, a, counter, split, row0, step, lane)) reduce_split_tile<8 * NB, 128 * NT>(a, n0);
}

constexpr int64_t kSplitLatencyBytes = 20000;  // ~1 us of one SM's share of 3 TB/s

// How a kernel adds its split-K partials: through global memory (the mma.sync kernel, up to 64
// splits) or within a thread block cluster (the wgmma kernels, up to 8: gemm_w4a16_wgmma.cu).
enum class SplitSum { kGlobal, kCluster };
constexpr int kMaxClusterSplits = 8;  // the portable cluster size

// Whether blocks of 256 rows of N fill the GPU's SMs: alone (at least 4/5 of a block an SM), or
// four splits of them (15/16 of the SMs). The batch planners choose their row tiles by these (two
// m64 or 16-row tiles a warp; the mma.sync kernel's by the first alone).
inline bool rows256_fill_alone(int64_t N, int sms) { return N * 5 >= (int64_t)sms * 256 * 4; }
inline bool rows256_fill_split(int64_t N, int sms) { return (N + 255) / 256 * 4 * 16 >= (int64_t)sms * 15; }

// The split-K count (`requested`, or 0: from the model below) into plan->splits and
// plan->kb_per_split. stage_bytes: what one block copies per k-block (weights, x, scales).
inline void plan_splits(int requested, int kblocks, int row_blocks, int sms, int per_sm, int64_t stage_bytes,
                        int64_t M, int rows, SplitSum sum, BatchPlan* plan) {
  const int most = sum == SplitSum::kCluster ? kMaxClusterSplits : 64;
  int best = 1;
  if (requested > 0) {
    best = requested < kblocks ? requested : kblocks;
    best = best < most ? best : most;
  } else {
    // Bytes through the busiest SM: its blocks' stages (weights and activations), a pipeline fill
    // of 3 stages per round of resident blocks, and the split-K sum: through global memory the
    // partials written and read back and the last block's S dependent rounds of partial loads (an
    // L2 round trip each, about what an SM streams in a microsecond at the copy rate); within a
    // cluster one read of the tile's partials and two cluster barriers.
    // H100 (dev/LOG.md): through global memory within 4% of the best measured split (mma.sync
    // kernel); within a cluster within 2% on 18 of 21 cells at M = 17-32 (the barrier wgmma kernel).
    int64_t best_cost = INT64_MAX;
    for (int s = 1; s <= most && s <= kblocks; ++s) {
      const int per = (kblocks + s - 1) / s;
      if ((kblocks + per - 1) / per != s) continue;  // the same split as a smaller s
      const int64_t blocks = (int64_t)row_blocks * s;
      const int64_t rounds = (blocks + (int64_t)sms * per_sm - 1) / ((int64_t)sms * per_sm);
      // Blocks that share an SM: the mma.sync kernel's split them its bytes; the wgmma kernel's
      // (M <= 32: two an SM) each take 27-40% longer than one alone (H100, per-block stamps at
      // M = 32, dev/probes/barrier_timeline.py), two blocks' work in well under twice the time, so
      // a round of two an SM is counted as one (28672x8192 at M = 32: 3 splits 75 us, 2 splits 108).
      const int64_t busiest = sum == SplitSum::kCluster ? rounds : (blocks + sms - 1) / sms;
      const int64_t split_cost = sum == SplitSum::kCluster ? busiest * M * rows * 4 + 2 * kSplitLatencyBytes
                                                           : busiest * M * rows * 8 + s * kSplitLatencyBytes;
      const int64_t cost = busiest * per * stage_bytes + 3 * stage_bytes * rounds + (s > 1 ? split_cost : 0);
      if (cost < best_cost) best_cost = cost, best = s;
    }
  }
  const int per = (kblocks + best - 1) / best;
  plan->kb_per_split = per;
  plan->splits = (kblocks + per - 1) / per;  // no empty split
}

// The arguments every launch shares; M, K, N, G already checked by the launcher.
inline BatchArgs batch_args(const void* x, const int32_t* qweight, const int32_t* qzeros, const void* scales,
                            const void* bias, void* y, float* partial, int* counters, int64_t M, int64_t K,
                            int64_t N, int64_t G) {
  const int groups = static_cast<int>(K / G);
  BatchArgs a;
  a.x = static_cast<const __half*>(x);
  a.qweight = reinterpret_cast<const uint4*>(qweight);
  a.qzeros = reinterpret_cast<const uint32_t*>(qzeros);
  a.scales = static_cast<const __half*>(scales);
  a.bias = static_cast<const __half*>(bias);
  a.y = static_cast<__half*>(y);
  a.partial = partial;
  a.counters = counters;
  a.M = static_cast<int>(M);
  a.K = static_cast<int>(K);
  a.N = static_cast<int>(N);
  a.x_stride = a.x_cols = static_cast<int>(K);
  a.groups = groups;
  // group of a 32-k run r: r / (G/32), exact by the multiply-high (gemv_w4a16.cu says why)
  a.runs_per_group = G % 32 == 0 ? static_cast<int>(G / 32) : 1;
  a.group_magic = a.runs_per_group > 1 ? static_cast<uint32_t>((uint64_t{1} << 32) / a.runs_per_group + 1) : 0u;
  a.kblocks = static_cast<int>((K + 127) / 128);
  a.run_slots = (groups == 1 || G % 128 == 0) ? 1 : kRunSlots;
  a.m_tiles = 1;
  a.row_blocks = 0;
  a.sk_tiles = a.sk_blocks = 0;
  return a;
}

}  // namespace w4
