// gemv_w4a16.cu: y[M, N] = x[M, K] W^T (+ bias) for int4 W (w4-gemv layout), M = 1..32.
//
// Computes, for m < M and n < N, with W[n, k] = (q - z) * s (the AWQ formula), on one of two paths:
//   scale after the mma (G % 128 == 0 or one group, and K >= 4096):
//       y[m, n] = fp16( sum_b s[b, n] * sum_{k in block b} (q - z)[n, k] x[m, k]  (+ bias[n]) ):
//       the tensor cores sum exact products of small integers
//       (q - z in -15..15, exact in fp16) and fp16 activations in fp32 over each 128-k block, the
//       block's fp32 sum is scaled once by its group's scale (fp32 fma), one final rounding. The
//       weight is never rounded to fp16: the result differs from the fp16-weight reference
//       (w4cli.formats.w4_gemv.gemv_reference) by the weight rounding, |dw| <= 2^-11 |w| per
//       weight, so |dy| <= 2^-11 sum |x||w| in the worst case (all roundings one way) and about
//       sqrt(K) 2^-12 |x||w| typically. w4cli/gpu/checks.py's bound (2^-10 |ref| + 4 K 2^-24
//       |x|@|W| + 2^-24) holds it: its K term alone covers the worst case for K >= 2048, and the
//       path is only taken for K >= 4096, where that is at most half of the K term (without the
//       limit a K = 128 layer fails the bound: tests/test_gemv_cli_gpu.py). Data whose products
//       and sums are exact (x in {-1, 0, 1}, power-of-two scales: the exact tests) gives the
//       reference bit for bit either way.
//   G = 32 or 64 (a 128-k block spans several groups), or K < 4096: the per-weight path,
//       W16[n, k] = fp16((q - z) * s) bit-identical to w4_gemv.dequantize, products exact, fp32 sums.
// The pure-torch oracle is w4cli.formats.w4_gemv.gemv_reference (fp32 result from W16).
//
// Inputs (K = in_features, N = out_features, G = group size, Kp = K rounded up to 128):
//   x       [M, K]              fp16, row-major, 16-byte aligned (K % 8 == 0)
//   qweight [N/8, Kp/128, 8, 16] int32, 16-byte aligned: tiles of 8 rows x 128 k, row-major in
//           the tile; word [a, b, r, w] holds row n = 8a + r, k = 128b + 8w + e (e = 0..7),
//           nibble i = e[AWQ_ORDER[i]], AWQ_ORDER = [0,2,4,6,1,3,5,7]:
//               nibble : 0  1  2  3  4  5  6  7
//               k-off  : 0  2  4  6  1  3  5  7
//           codes at k >= K are 0 (padding).
//   qzeros  [K/G, N/8] int32   AWQ gemm zeros (nibble AWQ_REVERSE_ORDER[j] of word n/8 holds n%8=j)
//   scales  [K/G, N]   fp16    AWQ gemm scales
//   bias    [N] fp16 or null
//   y       [M, N] fp16
//
// How a warp works. The weight is the A operand of mma.sync.m16n8k16 (16 rows n x 16 k), the
// activations the B operand (16 k x 8 columns = the M tokens, columns >= M are zero), fp32 C.
// Lane L = 4g + t owns A rows g and g+8 and B column g. One 128-k block of a 16-row tile is two
// 512-byte qweight tiles (rows 0-7 and 8-15); the lane loads the 16 bytes at offset 16L of each:
// words 4t..4t+3 of rows g and g+8 = k 128b + 32t + [0, 32). Word j (k0 = 128b + 32t + 8j) gives,
// through int4_convert.cuh's lop3 conversion with the zero point folded into the bias removal, the
// fp16 pairs d0=(k0, k0+1), d1=(k0+2, k0+3), d2=(k0+4, k0+5), d3=(k0+6, k0+7) of exact q - z
// (the per-weight path then scales each by one mul.rn.f16x2; the other scales the mma sums).
// The mma only needs A and B to agree on which real k sits in each k-slot, so
//     mma 1: a0 = d0(row g), a1 = d0(row g+8), a2 = d1(row g), a3 = d1(row g+8); b = x[g, k0..k0+3]
//     mma 2: a0 = d2(row g), a1 = d2(row g+8), a2 = d3(row g), a3 = d3(row g+8); b = x[g, k0+4..+7]
// (slots 2t,2t+1 <-> b0, 2t+8,2t+9 <-> b1, the same real k for every lane with the same t), and
// lane (g, t) loads its activations as one 16-byte vector x[g, k0 .. k0+7]. No shuffles, no
// shared-memory staging: the A fragment comes straight out of the conversion.
// Token tiles: M = 9..16 (NB = 2) and 17..32 (NB = 4) run the same mma pair per word on each tile
// of 8 tokens (lane (g, t) loads x[g + 8 b, ...] for tile b), so the conversion, the costly part,
// is shared by NB tiles and the weight is read once; each tile's chains are the ones of M <= 8, so
// at the same split a token gets the same bits whatever M is.
//
// Launch shape: grid = ceil(N/16) blocks (one 16-row tile each), block = S warps (S in 1,2,4,8,16;
// at most 8 with NB > 1, whose accumulators need more than 128 registers), dynamic shared memory
// S * NB * 512 B. Warp w reduces k-blocks
// [w*P, (w+1)*P) of the tile (split-K inside the block). The S partial 16x8 tiles are summed in
// warp order through shared memory (deterministic: no atomics), bias added in fp32, one fp16
// rounding. S is the largest power of two for which all ceil(N/16) blocks are resident at once
// (one wave, from the occupancy API), or `splits` when given.
//
// Kernels, chosen by shape in launch_gemv_w4a16 (dev/LOG.md has the measurements behind each):
//   scale after the mma: the pipelined kernel, two register stages computed in order, two mma
//     chains per k-block and token tile; up to 128 registers at NB = 1 (one 16-warp block or
//     several smaller ones per SM), up to 255 beyond, and at NB = 2 a second build of 168
//     registers (12 warps an SM) where that gives each tile more warps
//   per weight: the lean kernel, one k-block at a time, unpredicated main loop, 64 registers at
//     NB = 1 (two 512-thread blocks per SM)
// Constraints (checked by kernels/ops.cpp; the launcher returns cudaErrorInvalidValue otherwise):
//   1 <= M <= 32 (four token tiles of 8 columns), N % 8 == 0,
//   K % 8 == 0, K % G == 0, G % 32 == 0 or G == K, K < 2^21, N < 2^31.
//   Tails: N % 16 == 8 (last tile half empty: rows g+8 not stored; the checked paths do not load
//   them, the unpredicated ones re-read rows g), K % 128 != 0 (qweight padded by repack;
//   activations past K are never read: the partial k-block takes the checked path).
//   Where M > 8 takes this kernel rather than the batch kernels: w4cli.gpu.kernels.gemv_path.
// Numerics: as above; the tensor cores add exact products in fp32 (their internal
//   accumulation order/truncation differs from a sequential fp32 loop by a few ulp of the partial
//   sums); the output is rounded once. Sums of small-integer-times-power-of-two data are exact.
// Archs: sm_80+ (mma.sync m16n8k16 f16 -> f32, ld.global.L2::cache_hint); tuned on sm_90 (H100 and H200).
// Test: pytest -m gpu tests/test_gemv_gpu.py.  Bench: dev/run_gemv_device.sh.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "int4_convert.cuh"
#include "launch.cuh"
#include "tensor_core.cuh"
#include "w4_kernels.h"

namespace w4 {
namespace {

constexpr int kMaxWarps = 16;  // per block; 16 * 32 threads * 128 registers = one SM's 64K
constexpr int kMaxTiles = 4;   // token tiles of 8 (mma n8: one column per token)
// warps per block with NB token tiles: more than one tile's accumulators and activations take
// more than the 128 registers a thread of a 16-warp block can have
constexpr int max_warps(int nb) { return nb == 1 ? kMaxWarps : kMaxWarps / 2; }
constexpr int kMaxM = 8 * kMaxTiles;
constexpr int kSmemPerTile = 4 * 32 * sizeof(float);  // one warp's 16x8 fp32 partial tile
constexpr int kPdlPrefetch = 2;  // k-blocks of weights sent to L2 before waiting for the previous kernel

// Everything one k-block needs from global memory except the activations.
struct Block {
  uint4 lo, hi;  // words 4t..4t+3 of rows g and g+8
  uint32_t s;    // fp16 bits: scale of row g (low half), row g+8 (high half)
  uint32_t z;    // zero of row g (bits 0..3), row g+8 (bits 4..7)
};

struct Args {
  const __half* __restrict__ x;
  const uint4* __restrict__ qweight;
  const uint32_t* __restrict__ qzeros;
  const __half* __restrict__ scales;
  const __half* __restrict__ bias;
  __half* __restrict__ y;
  int M, K, N, groups, runs_per_group;
  uint32_t group_magic;
  int kblocks, kb_per_warp;
  int kb_per_group;  // G / 128 when G % 128 == 0, K-blocks + 1 for one group (pipelined kernel)
  uint32_t order_mask;  // always 0; the compiler cannot know that (the pipelined kernel's slot order)
};

// Per-lane constants.
template <int NB>
struct Lane {
  int g, t, tile, row_lo, words_n, zshift;
  bool has_hi;
  bool has_x[NB];         // token g + 8 b exists
  const uint4* wlo;       // this lane's uint4 in tile (2*tile, kb = 0)
  const uint4* whi;       // ... in tile (2*tile + 1, 0)
  const uint4* xrow[NB];  // x[g + 8 b, 0] (x[0, 0] where that token does not exist)
  uint64_t policy;
  int kb_end;
};

// Group of 32-k run r (all of a run lies in one group: G % 32 == 0, or a single group).
__device__ __forceinline__ int group_of_run(uint32_t run, const Args& a) {
  int grp = a.runs_per_group == 1 ? (int)run : (int)__umulhi(run, a.group_magic);
  return a.groups == 1 ? 0 : min(grp, a.groups - 1);
}

// Scale pair (rows g, g+8) and zero pair of the lane's 32-k run in k-block kb (0 past the range).
template <int NB>
__device__ __forceinline__ void load_sz(Block& b, int kb, const Args& a, const Lane<NB>& l) {
  const int grp = group_of_run(4u * kb + l.t, a);
  uint32_t s = 0, z = 0;
  if (kb < l.kb_end) {
    // re-read by neighbouring tiles (zeros) and cheap: cached loads
    const unsigned short* srow = reinterpret_cast<const unsigned short*>(a.scales) + (size_t)grp * a.N;
    const uint32_t* zrow = a.qzeros + (size_t)grp * l.words_n + 2 * l.tile;
    s = __ldg(srow + l.row_lo);
    z = (__ldg(zrow) >> l.zshift) & 0xF;
    if (l.has_hi) {
      s |= (uint32_t)__ldg(srow + l.row_lo + 8) << 16;
      z |= ((__ldg(zrow + 1) >> l.zshift) & 0xF) << 4;
    }
  }
  b.s = s;
  b.z = z;
}

template <int U, int NB>
__device__ __forceinline__ void load_blocks(Block (&b)[U], int kb0, const Args& a, const Lane<NB>& l) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int kb = kb0 + u;
    const bool valid = kb < l.kb_end;
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    b[u].lo = valid ? load_weight(l.wlo + (size_t)kb * 32, l.policy) : zero4;
    b[u].hi = (valid && l.has_hi) ? load_weight(l.whi + (size_t)kb * 32, l.policy) : zero4;
    load_sz(b[u], kb, a, l);
  }
}

// Activations of U k-blocks, issued together: x[g + 8 b, k0 .. k0+7] for k0 = 128 kb + 32 t + 8 j.
// K % 8 == 0, so a 16-byte vector is all in or all out; columns of tokens >= M are zero.
template <int U, int NB>
__device__ __forceinline__ void load_x(uint4 (&xv)[U][NB][4], int kb0, const Args& a, const Lane<NB>& l) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k0 = 128 * (kb0 + u) + 32 * l.t + 8 * j;
        xv[u][b][j] = (kb0 + u < l.kb_end && l.has_x[b] && k0 < a.K) ? __ldg(l.xrow[b] + (k0 >> 3))
                                                                      : make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// Dequantize one k-block (the lane's 4 words of rows g and g+8) and run its 8 mma per token
// tile. acc0 takes the first mma of each word, acc1 the second: two independent dependency chains
// through the tensor core per tile (the same chains for every token, whatever M: at the same
// split, a token's result does not depend on the batch around it). s: fp16 scale of row g (low half) and g+8 (high half);
// z: zero of row g (bits 0..3) and g+8 (bits 4..7).
template <int NB>
__device__ __forceinline__ void compute_one(const uint4& lo, const uint4& hi, uint32_t s, uint32_t z,
                                            const uint4 (&xv)[NB][4], float (&acc0)[NB][4],
                                            float (&acc1)[NB][4]) {
  const ZeroF16x8 zlo = row_zero(z & 0xF);
  const ZeroF16x8 zhi = row_zero(z >> 4);
  const uint32_t slo = (s & 0xFFFFu) * 0x10001u;  // (s_g, s_g)
  const uint32_t shi = (s >> 16) * 0x10001u;      // (s_g+8, s_g+8)
  const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w};
  const uint32_t wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t dl[4], dh[4];
    u4x8_minus_zero_f16x8(wl[j], zlo, dl);  // exact q - z, fp16 pairs (k, k+1)
    u4x8_minus_zero_f16x8(wh[j], zhi, dh);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dl[i] = mul_f16x2(dl[i], slo);  // (q - z) * s rounded once: the reference's fp16 weight
      dh[i] = mul_f16x2(dh[i], shi);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      mma_16816(acc0[b], dl[0], dh[0], dl[1], dh[1], xv[b][j].x, xv[b][j].y);
      mma_16816(acc1[b], dl[2], dh[2], dl[3], dh[3], xv[b][j].z, xv[b][j].w);
    }
  }
}

template <int U, int NB>
__device__ __forceinline__ void compute_blocks(const Block (&b)[U], const uint4 (&xv)[U][NB][4], int kb0,
                                               const Lane<NB>& l, float (&acc0)[NB][4], float (&acc1)[NB][4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kb0 + u >= l.kb_end) break;  // warp-uniform
    compute_one(b[u].lo, b[u].hi, b[u].s, b[u].z, xv[u], acc0, acc1);
  }
}

template <int NB>
__device__ __forceinline__ Lane<NB> make_lane(const Args& a, int lane, int warp) {
  Lane<NB> l;
  l.g = lane >> 2;
  l.t = lane & 3;
  l.tile = blockIdx.x;
  l.row_lo = l.tile * 16 + l.g;      // always < N (N % 8 == 0)
  l.has_hi = l.tile * 16 + 8 < a.N;  // the tile's second half exists
  l.words_n = a.N >> 3;
  // nibble of qzeros word n/8 that holds row n: AWQ_REVERSE_ORDER[n % 8] = (j >> 1) + 4 (j & 1)
  l.zshift = 4 * ((l.g >> 1) + 4 * (l.g & 1));
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    l.has_x[b] = l.g + 8 * b < a.M;
    l.xrow[b] = reinterpret_cast<const uint4*>(a.x + (size_t)(l.has_x[b] ? l.g + 8 * b : 0) * a.K);
  }
  // qweight tiles (2*tile, kb) and (2*tile + 1, kb), 32 uint4 each; the lane's uint4 is `lane`
  l.wlo = a.qweight + (size_t)(2 * l.tile) * a.kblocks * 32 + lane;
  l.whi = l.wlo + (size_t)a.kblocks * 32;
  l.policy = evict_first_policy();
  l.kb_end = min((warp + 1) * a.kb_per_warp, a.kblocks);
  return l;
}

// Sum the block's per-warp 16x8 partial tiles in warp order (deterministic), add the bias in
// fp32, round once to fp16 and store the valid (m < M, n < N) outputs.
// acc[b]: [0] (row g, token 8b+2t), [1] (row g, 8b+2t+1), [2] (row g+8, 8b+2t), [3] (row g+8, 8b+2t+1)
template <int NB>
__device__ __forceinline__ void reduce_store(const Args& a, const Lane<NB>& l, int lane, int warp,
                                             const float (&acc0)[NB][4], const float (&acc1)[NB][4],
                                             float (*partial)[NB][4][32]) {
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][b][i][lane] = acc0[b][i] + acc1[b][i];
  __syncthreads();
  const int warps = blockDim.x >> 5;
  for (int o = threadIdx.x; o < 128 * NB; o += blockDim.x) {
    const int ln = o & 31;
    const int i = (o >> 5) & 3;
    const int b = o >> 7;
    const int n = l.tile * 16 + (ln >> 2) + 8 * (i >> 1);
    const int m = 8 * b + 2 * (ln & 3) + (i & 1);
    if (m >= a.M || n >= a.N) continue;
    float sum = 0.f;
    for (int w = 0; w < warps; ++w) sum += partial[w][b][i][ln];
    if (a.bias != nullptr) sum += __half2float(a.bias[n]);
    a.y[(size_t)m * a.N + n] = __float2half_rn(sum);
  }
}

// The end of every kernel's warp: the k-blocks its main loop left (a partial k-block past K, or
// a remainder below the loop's step) through the checked path, then the block's reduction.
template <int NB>
__device__ __forceinline__ void finish_warp(const Args& a, const Lane<NB>& l, int lane, int warp, int kb,
                                            float (&acc0)[NB][4], float (&acc1)[NB][4],
                                            float (*partial)[NB][4][32]) {
  for (; kb < l.kb_end; ++kb) {  // checked tail
    Block b[1];
    uint4 xv[1][NB][4];
    load_blocks<1>(b, kb, a, l);
    load_x<1>(xv, kb, a, l);
    compute_blocks<1>(b, xv, kb, l, acc0, acc1);
  }
  reduce_store(a, l, lane, warp, acc0, acc1, partial);
}

// Per-weight kernel: the checked path's work with the addressing hoisted out of the loop. The
// k-blocks that lie wholly inside K are walked one at a time with running pointers; the partial
// k-block past K goes through the checked path above. The compiler's version of the checked loop
// recomputes 64-bit addresses and bounds for every load, about as many instructions as the
// dequantization itself.
//
// No predicates in the main loop. Lanes whose B column g >= M load x row 0 and a half-empty last
// tile (N % 16 == 8) re-reads its rows g as rows g+8: both only feed outputs (m >= M, n >= N) that
// are never stored, and the mma keeps columns and rows independent, so the stored outputs are
// unchanged. This drops the per-iteration zeroing of the skipped registers. 64 registers
// (__launch_bounds__ with 2 blocks per SM) let two 16-warp blocks share an SM at one token tile;
// more tiles take more, in blocks of at most 8 warps.
template <int NB>
__global__ void __launch_bounds__(max_warps(NB) * 32, NB == 1 ? 2 : 1) gemv_w4a16_lean_kernel(const Args a) {
  extern __shared__ __align__(128) uint8_t dsmem[];
  auto partial = reinterpret_cast<float (*)[NB][4][32]>(dsmem);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const Lane<NB> l = make_lane<NB>(a, lane, warp);
  int kb = warp * a.kb_per_warp;
  const int kb_main_end = min(l.kb_end, a.K >> 7);  // k-blocks with all 128 k < K
  float acc0[NB][4] = {}, acc1[NB][4] = {};

  const uint4* pw = l.wlo + (size_t)kb * 32;
  const size_t hi_off = l.has_hi ? (size_t)a.kblocks * 32 : 0;
  const uint4* px[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) px[b] = l.xrow[b] + (size_t)kb * 16 + 4 * l.t;
  const unsigned short* sp = reinterpret_cast<const unsigned short*>(a.scales) + l.row_lo;
  const uint32_t* zp = a.qzeros + 2 * l.tile;
  const int s_hi = l.has_hi ? 8 : 0;  // element offset of row g+8's scale
  const int z_hi = l.has_hi ? 1 : 0;  // word offset of row g+8's zeros
  // under programmatic dependent launch: the first k-blocks' weights head for L2 while the previous
  // kernel finishes; the activations are its output, read only after pdl_wait
  for (int d = 0; d < kPdlPrefetch && kb + d < kb_main_end; ++d) {
    prefetch_l2(pw + 32 * d);
    prefetch_l2(pw + 32 * d + hi_off);
  }
  pdl_launch_dependents();
  pdl_wait();
  for (; kb < kb_main_end; ++kb) {
    uint4 xv[NB][4];
    const uint4 lo = load_weight(pw, l.policy);
    const uint4 hi = load_weight(pw + hi_off, l.policy);
    const int grp = group_of_run(4u * kb + l.t, a);
    const unsigned short* srow = sp + (size_t)grp * a.N;
    const uint32_t* zrow = zp + (size_t)grp * l.words_n;
    uint32_t sc = __ldg(srow);
    uint32_t z = (__ldg(zrow) >> l.zshift) & 0xF;
    sc |= (uint32_t)__ldg(srow + s_hi) << 16;
    z |= ((__ldg(zrow + z_hi) >> l.zshift) & 0xF) << 4;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int j = 0; j < 4; ++j) xv[b][j] = __ldg(px[b] + j);
      px[b] += 16;
    }
    pw += 32;
    compute_one<NB>(lo, hi, sc, z, xv, acc0, acc1);
  }
  finish_warp(a, l, lane, warp, kb, acc0, acc1, partial);
}


// Pipelined kernel (where the scale goes after the mma): D register stages in a ring with
// compile-time slots (no stage is ever copied: a copy waits for the load it copies, which would
// serialise the buffers again). While a warp converts and multiplies one
// k-block, the next D - 1 k-blocks' weights, scales and zeros are in flight. Scale after the mma
// only (G % 128 == 0 or one group): the group advances every kb_per_group k-blocks, so scales and
// zeros are reached by running pointers, without the per-k-block group division and 64-bit
// address arithmetic of the lean kernel. The activations are read per 8-k word just before their
// mma (L1 hits). D = 2 at up to 128 registers measured best (D = 3 or 4 and an 80-register cap
// were slower: dev/LOG.md, GEMV); a data dependency between the slots keeps ptxas from merging
// them into one batch (see `order` below).
struct Stage {
  uint4 lo, hi;    // words 4t..4t+3 of rows g and g+8
  uint32_t s0, s1; // fp16 scale bits of rows g, g+8
  uint32_t z0, z1; // qzeros words holding rows g, g+8
};

__device__ __forceinline__ uint32_t ld_nc_u16(const unsigned short* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_nc_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// Timeline hooks for dev/probes/gemv_trace.cu only (w4's own build leaves W4_GEMV_TRACE
// undefined and the stamps compile to nothing): lane 0 of each warp records the global timer (ns)
// and its SM's cycle counter at the kernel's entry, after the ring's last trip, after its last
// k-block and after the store.
#ifdef W4_GEMV_TRACE
__device__ unsigned long long g_gemv_trace[W4_GEMV_TRACE][9];  // [warp][4 timers, 4 clocks, smid]
__device__ __forceinline__ void gemv_trace(int slot) {
  const int id = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if ((threadIdx.x & 31) != 0 || id >= W4_GEMV_TRACE) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_gemv_trace[id][slot] = t;
  g_gemv_trace[id][4 + slot] = clock64();
  if (slot == 0) {
    unsigned int sm;
    asm("mov.u32 %0, %%smid;" : "=r"(sm));
    g_gemv_trace[id][8] = sm;
  }
}
#define W4_GEMV_STAMP(slot) gemv_trace(slot)
#else
#define W4_GEMV_STAMP(slot)
#endif

// Registers: SmWarps warps fit an SM, up to 128 registers at NB = 1 (one 16-warp block or several
// smaller ones), up to 255 at NB > 1 (8 warps); NB = 2 has a second build of 12 (168 registers),
// taken where it gives a tile more warps (launch_gemv_w4a16).
template <int D, bool kG128, int NB, int SmWarps = max_warps(NB)>
__global__ void __launch_bounds__(SmWarps * 32, 1) gemv_w4a16_pipe_kernel(const Args a) {
  W4_GEMV_STAMP(0);
  extern __shared__ __align__(128) uint8_t dsmem[];
  auto partial = reinterpret_cast<float (*)[NB][4][32]>(dsmem);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const Lane<NB> l = make_lane<NB>(a, lane, warp);
  int kb = warp * a.kb_per_warp;
  const int kb_main_end = min(l.kb_end, a.K >> 7);
  float acc0[NB][4] = {}, acc1[NB][4] = {};

  const uint4* pw = l.wlo + (size_t)kb * 32;
  const int hi_off = l.has_hi ? a.kblocks * 32 : 0;  // a half-empty last tile re-reads rows g
  // the activations of token tile b: x row g + 8 b, 16 uint4 (128 k) a k-block apart
  const uint4* px = l.xrow[0] + (size_t)kb * 16 + 4 * l.t;
  int x_tile[NB];  // < 32 rows of K < 2^21 halves: 2^23 uint4
#pragma unroll
  for (int b = 0; b < NB; ++b) x_tile[b] = (int)(l.xrow[b] - l.xrow[0]);
  const int kbpg = a.kb_per_group;
  const int grp = kb / kbpg;
  int left = kbpg - (kb - grp * kbpg);  // k-blocks left in the current group
  const unsigned short* sp = reinterpret_cast<const unsigned short*>(a.scales) + (size_t)grp * a.N + l.row_lo;
  const uint32_t* zp = a.qzeros + (size_t)grp * l.words_n + 2 * l.tile;
  const int s_hi = l.has_hi ? 8 : 0;
  const int z_hi = l.has_hi ? 1 : 0;

  auto load = [&](Stage& st) {
    st.lo = load_weight(pw, l.policy);
    st.hi = load_weight(pw + hi_off, l.policy);
    st.s0 = ld_nc_u16(sp);
    st.s1 = ld_nc_u16(sp + s_hi);
    st.z0 = ld_nc_u32(zp);
    st.z1 = ld_nc_u32(zp + z_hi);
    pw += 32;
    if (kG128 || --left == 0) {
      left = kbpg;
      sp += a.N;
      zp += l.words_n;
    }
  };
  // Slot order. Left alone, ptxas interleaves the slots' conversions and mma and issues every
  // refill at the end of the trip, so all of a trip's loads are waited for together. `order` is
  // 0 at run time but the compiler cannot know it: adding it to the zero-point shift makes each
  // slot's conversion wait for the previous slot's result, so ptxas issues a slot's refill as
  // soon as its registers are free, before the next slot's work (one AND and one add per k-block
  // buy 1.3-2.6% at M = 1 on the H100 and the H200: dev/LOG.md, GEMV).
  uint32_t order = 0;
  auto compute = [&](const Stage& st, float (&acc)[NB][4]) {
    const int zshift = l.zshift + (int)order;
    const ZeroF16x8 zlo = row_zero((st.z0 >> zshift) & 0xF);
    const ZeroF16x8 zhi = row_zero((st.z1 >> zshift) & 0xF);
    const uint32_t wl[4] = {st.lo.x, st.lo.y, st.lo.z, st.lo.w};
    const uint32_t wh[4] = {st.hi.x, st.hi.y, st.hi.z, st.hi.w};
    // two mma chains per token tile (even and odd words): a k-block's 8 dependent mma become two
    // chains of 4, which halves the warp's wait on the tensor core (-1..-7% at M = 8, M = 1
    // unchanged); the same chains for every tile, so a token's bits do not depend on M
    float te[NB][4] = {}, to[NB][4] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t dl[4], dh[4];
      u4x8_minus_zero_f16x8(wl[j], zlo, dl);
      u4x8_minus_zero_f16x8(wh[j], zhi, dh);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const uint4 xv = __ldg(px + x_tile[b] + j);
        float (&t)[4] = j % 2 ? to[b] : te[b];
        mma_16816(t, dl[0], dh[0], dl[1], dh[1], xv.x, xv.y);
        mma_16816(t, dl[2], dh[2], dl[3], dh[3], xv.z, xv.w);
      }
    }
    px += 16;
    const float slo = __half2float(__ushort_as_half((unsigned short)st.s0));
    const float shi = __half2float(__ushort_as_half((unsigned short)st.s1));
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      acc[b][0] = fmaf(slo, te[b][0] + to[b][0], acc[b][0]);
      acc[b][1] = fmaf(slo, te[b][1] + to[b][1], acc[b][1]);
      acc[b][2] = fmaf(shi, te[b][2] + to[b][2], acc[b][2]);
      acc[b][3] = fmaf(shi, te[b][3] + to[b][3], acc[b][3]);
    }
    order = __float_as_uint(acc[0][3]) & a.order_mask;
  };

  // D stages in a ring with compile-time slots: slot d is computed, then immediately refilled
  // with the k-block D ahead, so D k-blocks are always in flight and no stage is ever copied.
  int n = kb_main_end - kb;  // whole k-blocks of this warp not yet loaded
  pdl_launch_dependents();
  if (n >= D) {
    Stage st[D];
#pragma unroll
    for (int d = 0; d < D; ++d) load(st[d]);
    // under programmatic dependent launch the first stages' weights, scales and zeros load while
    // the previous kernel finishes; the activations are its output, read only after this
    pdl_wait();
    n -= D;
    for (; n >= D; n -= D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        compute(st[d], d % 2 ? acc1 : acc0);
        load(st[d]);
      }
    }
    W4_GEMV_STAMP(1);
#pragma unroll
    for (int d = 0; d < D; ++d) compute(st[d], d % 2 ? acc1 : acc0);
    kb = kb_main_end - n;  // the last n < D whole k-blocks go through the checked path
  }
  W4_GEMV_STAMP(2);
  pdl_wait();  // (again, for the warps with fewer than D whole k-blocks; a no-op otherwise)
  if constexpr (SmWarps == 12) {
    // the lane's pointers rebuilt, not kept live across the loop (at 168 registers ptxas spilled one)
    finish_warp(a, make_lane<NB>(a, lane, warp), lane, warp, kb, acc0, acc1, partial);
  } else {
    finish_warp(a, l, lane, warp, kb, acc0, acc1, partial);
  }
  W4_GEMV_STAMP(3);
}

using KernelFn = void (*)(const Args);

// Warps per 16-row tile: the largest power of two (<= 16, <= k-blocks) such that all blocks are
// resident at once (one wave), from the occupancy of this kernel at that block size.
int auto_warps(KernelFn fn, int tiles, int kblocks, int smem_per_warp, int most) {
  int device = 0, sms = 132;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  int best = 1;
  for (int w = 1; w <= most && w <= kblocks; w *= 2) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, w * 32, w * smem_per_warp) !=
        cudaSuccess)
      break;
    if ((int64_t)tiles <= (int64_t)per_sm * sms) best = w;
  }
  return best;
}

// The kernel for this layer and token tiles (NB = 1, 2 or 4).
template <int NB>
KernelFn pick_kernel(bool post, bool g128) {
  return !post ? gemv_w4a16_lean_kernel<NB> : g128 ? gemv_w4a16_pipe_kernel<2, true, NB> : gemv_w4a16_pipe_kernel<2, false, NB>;
}

// NB = 2's pipelined build of 12 warps an SM (168 registers), taken where this layer's tiles get more
// warps each from it than from the 8-warp one (fewer registers a warp, more of them and more bytes
// in flight: 4096x6144 at M = 16 gets 4 warps a tile instead of 2, 10% faster on the H100; where
// both give the same warps, the 255-register build is 2-3% faster: dev/LOG.md). Chosen by the
// layer alone, not by the splits asked for, so fixed splits run the build the automatic launch
// does; at the same warps both builds give the same bits. `fn` and `warps`: the 8-warp build and its
// automatic warps, replaced by the wider build's where it wins.
void widen_nb2(bool g128, int tiles, int kblocks, int smem_per_warp, KernelFn* fn, int* warps) {
  const KernelFn wide = g128 ? gemv_w4a16_pipe_kernel<2, true, 2, 12> : gemv_w4a16_pipe_kernel<2, false, 2, 12>;
  const int wide_warps = auto_warps(wide, tiles, kblocks, smem_per_warp, max_warps(2));
  if (wide_warps > *warps) *fn = wide, *warps = wide_warps;
}

}  // namespace

cudaError_t launch_gemv_w4a16(const void* x, const int32_t* qweight, const int32_t* qzeros,
                              const void* scales, const void* bias, void* y, int64_t M, int64_t K,
                              int64_t N, int64_t G, int splits, bool pdl, cudaStream_t stream) {
  if (M < 1 || M > kMaxM || K < 8 || K % 8 || N < 8 || N % 8 || G < 1 || K % G ||
      (G % 32 && G != K) || K >= (int64_t{1} << 21) || N >= (int64_t{1} << 31) || splits < 0 ||
      splits > kMaxWarps) {
    return cudaErrorInvalidValue;
  }
  const int groups = static_cast<int>(K / G);
  // group of a 32-k run r: r / (G/32). G/32 < 2^16 and r < 2^16, so r * m >> 32 with
  // m = floor(2^32 / d) + 1 is the exact quotient (the error term r * (m d - 2^32) < 2^32).
  const int runs_per_group = G % 32 == 0 ? static_cast<int>(G / 32) : 1;
  const uint32_t magic =
      runs_per_group > 1 ? static_cast<uint32_t>((uint64_t{1} << 32) / runs_per_group + 1) : 0u;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int tiles = static_cast<int>((N + 15) / 16);

  // scale after the mma: needs every 128-k block inside one group, and K >= 4096 so that the
  // skipped weight rounding (at most 2^-11 sum |x||w|) stays within half of the tolerance's K term
  // (4 K 2^-24 sum |x||w|, w4cli/gpu/checks.py); smaller layers take the per-weight path
  const bool post = (groups == 1 || G % 128 == 0) && K >= 4096;
  // token tiles of 8: the conversion of each weight is shared by every tile
  const int nb = M <= 8 ? 1 : M <= 16 ? 2 : 4;
  const bool g128 = G == 128 && groups > 1;
  const int smem_per_warp = nb * kSmemPerTile;
  KernelFn fn = nb == 1 ? pick_kernel<1>(post, g128) : nb == 2 ? pick_kernel<2>(post, g128) : pick_kernel<4>(post, g128);
  const int most = nb == 1 ? max_warps(1) : nb == 2 ? max_warps(2) : max_warps(4);
  int wave_warps = auto_warps(fn, tiles, kblocks, smem_per_warp, most);
  if (nb == 2 && post) widen_nb2(g128, tiles, kblocks, smem_per_warp, &fn, &wave_warps);
  int warps = splits > 0 ? min(splits, most) : wave_warps;
  warps = warps > kblocks ? kblocks : warps;
  const int kb_per_warp = (kblocks + warps - 1) / warps;
  warps = (kblocks + kb_per_warp - 1) / kb_per_warp;  // no idle warps

  Args a;
  a.x = static_cast<const __half*>(x);
  a.qweight = reinterpret_cast<const uint4*>(qweight);
  a.qzeros = reinterpret_cast<const uint32_t*>(qzeros);
  a.scales = static_cast<const __half*>(scales);
  a.bias = static_cast<const __half*>(bias);
  a.y = static_cast<__half*>(y);
  a.M = static_cast<int>(M);
  a.K = static_cast<int>(K);
  a.N = static_cast<int>(N);
  a.groups = groups;
  a.runs_per_group = runs_per_group;
  a.group_magic = magic;
  a.kblocks = kblocks;
  a.kb_per_warp = kb_per_warp;
  a.order_mask = 0;
  a.kb_per_group = groups == 1 ? kblocks + 1 : (G % 128 == 0 ? static_cast<int>(G / 128) : 1);
  return launch_kernel(fn, dim3(tiles), dim3(warps * 32), (size_t)warps * smem_per_warp, stream, pdl, 1, a);
}

}  // namespace w4
