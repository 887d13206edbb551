// gemm_w4a16_wgmma.cu: y[M, N] = x[M, K] W^T (+ bias) for int4 W (w4-gemv layout) on Hopper's
// warpgroup MMA (wgmma, sm_90a), two kernels: the barrier kernel for M = 1..128 (this header: every
// warp computes, one block barrier a k-block; the path from M = 17 to 32, and from 9 on layers
// under 8192x8192 weights), and the warp-specialised kernel for any M (its own header, "the
// warp-specialised kernel" below).
// gemm_w4a16_batch.cu is the same computation on mma.sync for sm_80+; on Hopper mma.sync issues
// too slowly to keep up with HBM from M = 32 up.
//
// Numerics: the batch kernel's per-weight path, W16[n, k] = fp16((q - z) * s) (one mul.rn.f16x2
// from the exact q - z), fp32 accumulation in the tensor cores, split partials added in split
// order, bias in fp32, one rounding; gemm_w4a16_batch.cu's header derives why w4cli/gpu/checks.py's
// bound holds it, and exact data (x in {-1, 0, 1}, power-of-two scales) gives the reference bit
// for bit. The barrier kernel on tiles of up to 32 tokens (one m64 tile a warpgroup at 32) takes
// the GEMV's scale after the mma where every 128-k block lies in one group and K >= 4096
// (wg_post_scale): the tensor cores sum the exact q - z times x over the k-block in fp32, and the
// sum is added to the row's total with one fp32 fma by its scale; the weight is never rounded to
// fp16, a difference from the reference that gemv_w4a16.cu's header bounds within the same
// tolerance for K >= 4096, and exact data still gives the reference's bits.
//
// Roles. The weight is wgmma's A operand, 64 rows of N per warpgroup, converted to fp16 in
// registers (the GEMV's lop3 path gives the mma A fragment, which is also wgmma's register
// fragment). The activations are the B operand (N = MT tokens), read by the tensor cores from
// shared memory through a descriptor.
//
// The k order. A lane's mma A fragment holds k 2 t, 2 t + 1, 2 t + 8, 2 t + 9 of a k16 step (t =
// lane % 4), and B must present its rows in the same k order. In the w4-gemv layout a 128-k block
// of one row is four 16-byte chunks, chunk c holding k 32 c .. 32 c + 31 as words j = 0..3 (k 32 c +
// 8 j ..), lane t of a quad holding chunk t. Two ways to meet (pick_k_order chooses per launch):
//   permuted  each lane converts its own chunk, word j at the loop's word j (1 shift, 4 lop3, 2 sub,
//             2 fma and 4 mul per 8 weights), so the 16 k of step s = 2 j + h are 4-element pieces of
//             four different 8-k runs; permute_x_kernel first writes x_perm [M, Kp] (Kp = K rounded
//             up to 128, zero past K) where, within each 128-k block, position p = 16 s + 8 c + 2 t + i
//             (8-k column c, element i) holds x[m, 32 t + 8 j + 4 h + 2 c + i]: 8 consecutive
//             positions a 16-byte chunk, staged like x itself. Costs a pass over x and a launch.
//   natural   x staged as it lies. Steps 2 c and 2 c + 1 (the loop's word c) take k 2 t of their 16
//             from words 0 and 2 of chunk c and k 2 t + 8 from words 1 and 3, always the pair in
//             nibbles t and t + 4 (the AWQ order puts elements 2 t, 2 t + 1 of a word there). So at
//             word c every lane loads chunk c of its row (the quad's four lanes the same 16 bytes, a
//             broadcast) and converts pair t of each of its words: 1 shift, 1 lop3, 1 sub and 1 mul
//             per 2 weights, a quarter more, and no pass over x. Its weight tiles are stored with the 128-byte swizzle
//             (16-byte unit u of 128-byte row r at u ^ (r % 8)), so that the 8 rows of a warp's load
//             fall on 8 different unit columns. One scale and zero a row and 128-k block only.
// Both orders give the same products, summed in the tensor cores' fp32 in a different order.
//
// How a block works. 8 warps = 2 warpgroups; each warpgroup owns NT m64 tiles (a block owns
// R = 128 NT rows of N) and the block a range of k-blocks (split-K over S blocks per row range).
// Each 128-k block is one stage of a ring in shared memory, up to 4 deep:
//   x        MT rows of x or x_perm, two 64-k swizzle atoms of [MT rows][128 B] (16-byte unit u of
//            row r at u ^ (r % 8), the 128-byte swizzle the descriptor names), k past the row
//            zero-filled; two boxes of M rows from the tensor copy engine (rows M..MT - 1 keep
//            what they held: they feed only token columns that nothing stores)
//   weights  the block's 16-row tiles of 1 KB, one box (L2 evict-first: read once), 128-byte
//            swizzled in the natural k order
//   scales, zeros  per 32-k run slot, as in the batch kernel (cp.async, by the Loader's threads)
// Thread 0 asks for a stage's boxes, on the stage's mbarrier; every thread waits for it and for its
// own cp.async group, then passes the one block barrier of the k-block, after which the stage
// read last is refilled. (Issued by every thread as 16-byte cp.async copies, the boxes' addresses
// took a fifth of the MMA warps' instructions, which set the pace at M <= 32: H200, Nsight
// Compute, dev/LOG.md.) Per k-block each warp converts, per word c, its NT 16-row tiles to A
// fragments (scale applied per weight) and issues 2 wgmma m64nMTk16 per tile (steps 2 c, 2 c + 1)
// with B at the step's 32-byte column of the atom; conversion of word c + 1 overlaps the wgmma of
// word c. The warp waits for its wgmmas before the next barrier, which frees the stage for
// refilling. The result leaves through shared memory ("the output tile" below).
// Split-K: the S blocks of a row range are one thread block cluster and add their partials
// through distributed shared memory ("split-K within a cluster" below; deterministic, in split
// order). With PDL the kernel asks for its first stage's weights, scales and zeros while the kernel
// before (or its own permute_x_kernel) still runs, its activations after pdl_wait; after its
// permute kernel it is launched without PDL where the plan says so (`permute_pdl`, below).
//
// Launch shape: permute_x_kernel in the permuted order, then grid (ceil(N / R), S) in clusters of
// (1, S, 1) (S <= 8),
// block 256 threads, dynamic shared memory kStages x (MT x 256 + R x 64 + R x 10, rounded up to
// 1 KB) + 1 KB; MT = M rounded up to 16, 32, 64 or 128; NT and S by plan_gemm_w4a16_wgmma (the
// batch kernel's byte model, in waves of resident blocks, S fitted to the clusters that run at
// once).
// Constraints (checked by kernels/ops.cpp and the launcher): as gemm_w4a16_batch.cu, with
// 1 <= M <= 128, x 16-byte aligned; in the permuted order x_perm [M, Kp] fp16 scratch from the caller.
// The tensor maps of x (or x_perm, boxes of M rows) and of the weights are encoded per launch and
// passed by value.
// Archs: sm_90a only (the kernels compile elsewhere to an empty body the launcher never runs).
// Test: pytest -m gpu tests/test_batch_gpu.py.  Bench: w4 bench --batch 16,32,64,128.

#include <cuda.h>  // CUtensorMap (the type only: the encoder comes from the runtime's driver entry point)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "batch_common.cuh"
#include "int4_convert.cuh"
#include "launch.cuh"
#include "tensor_core.cuh"
#include "w4_kernels.h"

namespace w4 {
namespace {

// One k-block's stage: x (the header's two swizzle atoms), weights, scales, zeros. kSwizzledW: the
// weights 128-byte swizzled (the natural k order, whose loads would otherwise meet four to a bank).
// WG: the MMA warpgroups, each NT m64 tiles of the block's rows.
template <int MT, int NT, bool kSwizzledW, int WG = 2>
struct StageLayout {
  static constexpr int kRows = WG * NT * 64;  // rows of N per block
  static constexpr int kTokens = MT;
  static constexpr int kXOff = 0;            // 1 KB aligned: the swizzle atoms need it
  static constexpr int kWOff = kXOff + kTokens * 256;  // 1 KB aligned: the weights' swizzle needs it
  static constexpr int kSOff = kWOff + kRows * 64;
  static constexpr int kZOff = kSOff + kRunSlots * kRows * 2;
  static constexpr int kStageBytes = (kZOff + kRunSlots * (kRows / 8) * 4 + 1023) / 1024 * 1024;
  // 16-byte chunk c (0..15) of x row r: 64-k atom c / 8, unit c % 8 swizzled by r % 8
  __device__ static __forceinline__ uint32_t x_dst(int r, int c) {
    return kXOff + (c >> 3) * (MT * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
  }
  // The weights' byte o (in the block's qweight tiles, as they lie in memory) within their part of
  // the stage: the 128-byte swizzle, which the tensor copy engine applies too (kWOff is 1 KB aligned)
  __device__ static __forceinline__ uint32_t w_dst(uint32_t o) { return kSwizzledW ? o ^ (((o >> 7) & 7) << 4) : o; }
};

// The barrier kernel's stages: up to 4 in 220 KB.
template <int MT, int NT, bool kNatural>
struct WgStage : StageLayout<MT, NT, kNatural> {
  using L = StageLayout<MT, NT, kNatural>;
  static constexpr int kStages = (220 * 1024) / L::kStageBytes >= 4 ? 4 : (220 * 1024) / L::kStageBytes;
  static constexpr int kSmem = kStages * L::kStageBytes + 1024;  // + room to align the base to 1 KB
  static_assert(kStages >= 2, "a stage must fit twice in shared memory");
};

#if defined(W4_HAS_WGMMA)
// This thread's release of a stage's part: an arrival on this block's barrier and, in a pair (kPair:
// the other block multicasts activations into this block's stages), lane 0's on the other block's
// once the warp's lanes are past it (kBatchThreads + kBatchWarps arrivals a phase). The other block
// writes only activations, which only wgmma reads (done at the wgmma wait before the release); the
// weights, scales and zeros, read by every thread, only this block's producer refills.
template <bool kPair>
__device__ __forceinline__ void release_stage(uint32_t bar, int lane) {
  mbar_arrive(bar);
  if constexpr (kPair) {
    __syncwarp();
    if (lane == 0) mbar_arrive_remote(bar, cluster_rank() ^ 1);
    __syncwarp();  // (converged again: else the warp walks on to a stream-K segment off the uniform datapath)
  }
}

// One k-block of one warp: its NT 16-row tiles (one per m64 tile of its warpgroup) x MT tokens.
// S: the stage's layout (WgStage or WsStage: kRows, kTokens, kXOff, kWOff, kSOff, kZOff, w_dst).
// kNatural: x staged in its own k order (the header's "x as it lies"; one scale and zero a row and
// k-block, a.run_slots == 1); else in the order of the lanes' words (x_perm). slot: the 32-k run
// slot of this lane's scales and zeros (the permuted order; 0 in the natural one).
// kDrain: wait for every wgmma before returning (the stage may be refilled after the next block
// barrier); else the last word's wgmmas are left in flight across the stage boundary, and
// `release`, when not 0, is the mbarrier this thread arrives on once the previous stage's wgmmas
// are done (after the first word's wait), so the tensor cores never idle between stages, and
// `release_a`, when not 0, the one it arrives on once words 0 and 1 are done (after the third
// word's wait): the stage's weights, scales and zeros are in registers or loads issued by then, and
// its first x atom read, so that part can be refilled half a k-block before the rest.
// kPairRelease: the stage is shared with the other block of a pair (its activations multicast into
// both), so the other block's barrier is arrived on too (release_stage).
// kPost: the scale after the wgmma (the header's "Numerics"; one scale a row and k-block, M <= 32,
// kDrain): the A fragments hold the exact q - z, the k-block's products sum into accumulators of
// their own (`part`, from zero at its first step), and once they are done each element is added to
// acc as one fp32 fma with its row's scale.
template <typename S, int NT, bool kNatural, bool kDrain = true, bool kPairRelease = false, bool kPost = false,
          int MT = S::kTokens>
__device__ __forceinline__ void wgmma_stage(const uint8_t* st, uint32_t st_addr, int wg, int wi, int lane,
                                            int slot, float (&acc)[NT][MT / 8][4], uint32_t release = 0,
                                            uint32_t release_a = 0) {
  const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + S::kSOff);
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(st + S::kZOff);
  const int g = lane >> 2;
  const int zshift = 4 * ((g >> 1) + 4 * (g & 1));  // AWQ_REVERSE_ORDER[g]: nibble of row g's zero
  // Per tile: the scales of rows g and g + 8 in both halves, and their zeros biased by 1024
  // (0x6400 | z: 1024 + z in fp16, exact).
  static_assert(!kPost || (kDrain && MT <= 32), "the scale after the wgmma: a drained k-block of at most 32 tokens");
  uint32_t slo[NT], shi[NT];  // f16x2, both halves the scale (kPost: the scale's fp16 bits, low half)
  ZeroF16x8 zlo[NT], zhi[NT];
  // Weight chunks: the permuted order takes the lane's own chunk of rows g and g + 8 (words 0..3)
  // at the stage's start; the natural one chunk c of the row at word c, word c + 1's loaded before
  // word c's wgmmas are issued so that the load's latency passes while they run.
  uint4 lo[NT], hi[NT];
  auto load_chunks = [&](int c) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      // chunk 0 of rows g and g + 8 (the tile's two 512-byte qweight tiles); chunk c is 16 c bytes on
      // before the swizzle, an XOR of those same address bits
      const uint32_t row = 1024 * ((wg * NT + i) * 4 + wi) + 64 * g;
      lo[i] = *reinterpret_cast<const uint4*>(st + ((S::kWOff + S::w_dst(row)) ^ (16 * c)));
      hi[i] = *reinterpret_cast<const uint4*>(st + ((S::kWOff + S::w_dst(row + 512)) ^ (16 * c)));
    }
  };
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int q = (wg * NT + i) * 4 + wi;  // the warp's 16-row tile of its warpgroup's m64 tile i
    const int row = 16 * q + g;
    slo[i] = ss[slot * S::kRows + row] * (kPost ? 1u : 0x10001u);
    shi[i] = ss[slot * S::kRows + row + 8] * (kPost ? 1u : 0x10001u);
    const uint32_t* zw = zs + slot * (S::kRows / 8) + 2 * q;
    zlo[i] = row_zero((zw[0] >> zshift) & 0xF);
    zhi[i] = row_zero((zw[1] >> zshift) & 0xF);
  }
  load_chunks(kNatural ? 0 : lane & 3);
  const uint32_t pair_shift = 4 * (lane & 3);  // the natural order's pair t: nibbles t and t + 4
  // x's descriptor once a stage, each step's an offset into its address field (16-byte units, bits
  // 0-13, no carry out: shared addresses stay below 256 KB): the MMA warps' instruction stream is
  // their pace, and a whole descriptor per step costs 4 more instructions 8 times a k-block
  const uint64_t x_desc = smem_desc_sw128(st_addr + S::kXOff);
  float part[kPost ? NT : 1][MT / 8][4];  // kPost: the k-block's own sums
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint32_t af[NT][8];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const uint32_t wl[4] = {lo[i].x, lo[i].y, lo[i].z, lo[i].w}, wh[4] = {hi[i].x, hi[i].y, hi[i].z, hi[i].w};
      if constexpr (kNatural) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // per weight: q - z (kPost), or (q - z) * s rounded once, the W16
          const uint32_t dl = u4_pair_minus_zero_f16x2(wl[j], pair_shift, zlo[i].biased[0]);
          const uint32_t dh = u4_pair_minus_zero_f16x2(wh[j], pair_shift, zhi[i].biased[0]);
          af[i][2 * j] = kPost ? dl : mul_f16x2(dl, slo[i]);
          af[i][2 * j + 1] = kPost ? dh : mul_f16x2(dh, shi[i]);
        }
      } else {
        uint32_t dl[4], dh[4];
        u4x8_minus_zero_f16x8(wl[c], zlo[i], dl);  // exact q - z, fp16 pairs (k, k+1)
        u4x8_minus_zero_f16x8(wh[c], zhi[i], dh);
#pragma unroll
        for (int p = 0; p < 4; ++p) {  // per weight: q - z (kPost), or (q - z) * s rounded once, the W16
          af[i][2 * p] = kPost ? dl[p] : mul_f16x2(dl[p], slo[i]);
          af[i][2 * p + 1] = kPost ? dh[p] : mul_f16x2(dh[p], shi[i]);
        }
      }
    }
    if (kNatural && c < 3) load_chunks(c + 1);
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint64_t desc = x_desc + (((c >> 1) * (MT * 128) + (2 * (c & 1) + h) * 32) >> 4);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        if constexpr (kPost) {
          if (c == 0 && h == 0) {
            wgmma_m64k16_rs_first<MT>(reinterpret_cast<float(&)[MT / 2]>(part[i]), af[i][0], af[i][1], af[i][2],
                                      af[i][3], desc);
          } else {
            wgmma_m64k16_rs<MT>(reinterpret_cast<float(&)[MT / 2]>(part[i]), af[i][4 * h], af[i][4 * h + 1],
                                af[i][4 * h + 2], af[i][4 * h + 3], desc);
          }
        } else {
          wgmma_m64k16_rs<MT>(reinterpret_cast<float(&)[MT / 2]>(acc[i]), af[i][4 * h], af[i][4 * h + 1],
                              af[i][4 * h + 2], af[i][4 * h + 3], desc);
        }
      }
    }
    wgmma_commit();
    wgmma_wait<1>();  // word c - 1's wgmmas are done: their A fragments' registers are free again
    if (!kDrain && c == 0 && release != 0) release_stage<kPairRelease>(release, lane);
    if (!kDrain && c == 2 && release_a != 0) release_stage<kPairRelease>(release_a, lane);
  }
  if (kDrain) wgmma_wait<0>();  // the stage's slot may be refilled after the next barrier
  if constexpr (kPost) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const float s_lo = __half2float(__ushort_as_half(static_cast<unsigned short>(slo[i])));
      const float s_hi = __half2float(__ushort_as_half(static_cast<unsigned short>(shi[i])));
#pragma unroll
      for (int nb = 0; nb < MT / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][nb][e] = __fmaf_rn(e < 2 ? s_lo : s_hi, part[i][nb][e], acc[i][nb][e]);
    }
  }
}
#endif

// ---- split-K within a cluster (both kernels) ----
// The S blocks of an output tile are one cluster of (1, S, 1) blocks, S <= kMaxClusterSplits,
// cluster rank = split. Once its last k-block is done, each block leaves its fp32 partial tile in
// its own shared memory (the stages are free by then) as [MT tokens][R + 4 rows] (the padding puts
// the four token rows a warp's store touches on different banks). After a cluster barrier, block r
// adds tokens [r MT / S, (r + 1) MT / S) of all S partials in split order, reading the others'
// through distributed shared memory, and writes y (bias in fp32, one rounding); a second barrier,
// without a release (cluster_sync_reads_done: it would wait for the stores of y), keeps every
// block's shared memory alive until the others have read it. Nothing goes through
// global memory, and the bits of a sum do not depend on which block adds it. Pushed instead (each
// block storing the others' tokens from its registers into their shared memory, by st.async or
// plain remote stores) the launches ran 1-10% slower at M = 64 and no faster past it (within 3%
// either way; H200, dev/LOG.md), with the same bytes over the cluster network.
template <int MT, int R>
struct SplitTile {
  static constexpr int kStride = R + 4;  // floats per token row
  static constexpr int kBytes = MT * kStride * 4;
};

#if defined(W4_HAS_WGMMA)
// This thread's accumulators into the block's partial tile at `tile` (the stages' memory): the
// caller has made sure every MMA thread's wgmmas have read their last stage. row0_local: acc's
// tile 0's first row within the block's R rows.
template <int MT, int R, int NT, int NB>
__device__ __forceinline__ void store_split_partial(float (&acc)[NT][NB][4], float* tile, int row0_local, int step,
                                                    int lane) {
  for_each_output(acc, row0_local, step, lane,
                  [&](float& v, int m, int n) { tile[m * SplitTile<MT, R>::kStride + n] = v; });
}

// Between the two cluster barriers, the kThreads MMA threads of block `split`: its share of the tile's
// sum over the a.splits splits, in units of 4 rows of one token, two units a thread at a time with
// every split's loads of both issued before the adds (a read of another block's shared memory takes
// hundreds of cycles). tile: the partial tile's shared address (the same offset in every block);
// m0, n0: the tile's first token and row. kSplits: the split count as a compile-time constant
// (reduce_split_cluster_of below), or 0: looped over kMaxClusterSplits slots, each load and add
// behind a run-time test of a.splits, which runs at about half the rate (H100,
// dev/probes/dsmem_rate.cu: 2.37 against 1.38 us for a 128-token share of a 128-row tile) but
// adds one copy of the sum to its kernel instead of seven.
template <int MT, int R, int kSplits = 0, int kThreads = kBatchThreads>
__device__ __forceinline__ void reduce_split_cluster(const BatchArgs& a, uint32_t tile, int split, int m0, int n0) {
  constexpr int kUnitsPerRow = R / 4, kAtOnce = 2, kSlots = kSplits > 0 ? kSplits : kMaxClusterSplits;
  const int splits = kSplits > 0 ? kSplits : a.splits;
  const int t0 = split * MT / splits, t1 = (split + 1) * MT / splits;
  const int units = (t1 - t0) * kUnitsPerRow;
  uint32_t src[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) src[s] = s < splits ? cluster_smem_addr(tile, s) : 0u;
  for (int first = threadIdx.x; first < units; first += kAtOnce * kThreads) {
    float4 p[kAtOnce][kSlots];
    int m[kAtOnce], n[kAtOnce];
    bool ok[kAtOnce];
#pragma unroll
    for (int j = 0; j < kAtOnce; ++j) {
      const int u = first + j * kThreads;
      const int t = t0 + u / kUnitsPerRow, c = u % kUnitsPerRow;
      m[j] = m0 + t;
      n[j] = n0 + 4 * c;
      ok[j] = u < units && m[j] < a.M && n[j] < a.N;
      const uint32_t off = 4u * (t * SplitTile<MT, R>::kStride + 4 * c);
#pragma unroll
      for (int s = 0; s < kSlots; ++s)
        if (ok[j] && s < splits) p[j][s] = ld_cluster_f4(src[s] + off);
    }
#pragma unroll
    for (int j = 0; j < kAtOnce; ++j) {
      if (!ok[j]) continue;
      float4 sum = p[j][0];
#pragma unroll
      for (int s = 1; s < kSlots; ++s)
        if (s < splits) sum = add4(sum, p[j][s]);
      store_output4(a, sum, m[j], n[j]);
    }
  }
}
// The same with the split count a compile-time constant, one copy of the sum per cluster size: the
// warp-specialised kernel's (its tiles of up to 256 tokens make the sum several microseconds). In
// the barrier kernel the seven copies made the whole kernel compile 3-10% slower at M = 24-32
// (H100, dev/LOG.md), and its tiles of up to 128 tokens keep the run-time loop short.
template <int MT, int R, int kThreads>
__device__ __forceinline__ void reduce_split_cluster_of(const BatchArgs& a, uint32_t tile, int split, int m0, int n0) {
  static_assert(kMaxClusterSplits == 8, "a case for every cluster size");
  switch (a.splits) {
    case 2: reduce_split_cluster<MT, R, 2, kThreads>(a, tile, split, m0, n0); break;
    case 3: reduce_split_cluster<MT, R, 3, kThreads>(a, tile, split, m0, n0); break;
    case 4: reduce_split_cluster<MT, R, 4, kThreads>(a, tile, split, m0, n0); break;
    case 5: reduce_split_cluster<MT, R, 5, kThreads>(a, tile, split, m0, n0); break;
    case 6: reduce_split_cluster<MT, R, 6, kThreads>(a, tile, split, m0, n0); break;
    case 7: reduce_split_cluster<MT, R, 7, kThreads>(a, tile, split, m0, n0); break;
    default: reduce_split_cluster<MT, R, 8, kThreads>(a, tile, split, m0, n0); break;
  }
}
#endif

// ---- the output tile without split-K (both kernels) ----
// The block's MT x R result goes to y through shared memory (the stages are free by then): each
// thread adds the bias in fp32, rounds once to fp16 and stores its fragments transposed
// (stmatrix) into a [MT tokens][R + 8] tile; then the MMA threads write y's rows in whole
// 16-byte pieces. Stored straight from the fragments, each instruction would put 2 bytes a lane
// into 4 rows of y: 6-7 us a 256 x 128 tile on the H100 (dev/LOG.md), a tenth of a 4096-deep layer.
template <int MT, int R>
struct OutTile {
  // halves per token row: rows 16 bytes apart modulo 128, so stmatrix's 8 rows fill the 32 banks once
  static constexpr int kStride = R + 8;
  static constexpr int kBytes = MT * kStride * 2;
};

#if defined(W4_HAS_WGMMA)
__device__ __forceinline__ uint32_t f16x2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The caller has made sure every MMA thread's wgmmas are done with the memory at `tile` (and every
// copy into it landed). tile, tile_addr: generic and shared addresses of OutTile<MT, R / kPasses>
// bytes; row0_local: acc's tile 0's first row within the block's R rows (tile i at + 64 i); n0, m0:
// the block's first row of N and first token. kPasses > 1 writes the rows in that many slices
// through the same memory (a warpgroup's rows lie in one slice), where the whole tile does not fit.
// kThreads: the MMA threads (every one takes part).
template <int MT, int R, int NT, int kPasses = 1, int kThreads = kBatchThreads>
__device__ __forceinline__ void store_result_tile(float (&acc)[NT][MT / 8][4], const BatchArgs& a, const uint8_t* tile,
                                                  uint32_t tile_addr, int row0_local, int lane, int n0, int m0) {
  constexpr int kSliceRows = R / kPasses;
  using T = OutTile<MT, kSliceRows>;
  static_assert(MT % 16 == 0, "stmatrix x4 takes two n8 blocks of tokens at a time");
  static_assert(kSliceRows % (64 * NT) == 0, "a warpgroup's rows lie in one slice");
  const int g = lane >> 2, q = lane >> 3, j = lane & 7;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    if (pass > 0) mma_threads_sync<kThreads>();  // the previous slice has been read out
    if (row0_local / kSliceRows == pass) {
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const int r = row0_local + 64 * i;
        // -0.0 is the identity of fp32 addition (+0.0 would turn a -0.0 sum into +0.0)
        float blo = -0.f, bhi = -0.f;
        if (a.bias != nullptr) {
          if (n0 + r + g < a.N) blo = __half2float(a.bias[n0 + r + g]);
          if (n0 + r + g + 8 < a.N) bhi = __half2float(a.bias[n0 + r + g + 8]);
        }
        // matrices 0..3: rows r .. r + 7 and r + 8 .. r + 15 of tokens 8 nb .. 8 nb + 7, then of
        // the next 8 tokens; lane 8 q + j gives the address of matrix q's token row j
        const uint32_t at = tile_addr + 2 * ((8 * (q >> 1) + j) * T::kStride + r - pass * kSliceRows + 8 * (q & 1));
#pragma unroll
        for (int nb = 0; nb < MT / 8; nb += 2)
          stmatrix_x4_trans(at + 2 * 8 * nb * T::kStride, f16x2_bits(acc[i][nb][0] + blo, acc[i][nb][1] + blo),
                            f16x2_bits(acc[i][nb][2] + bhi, acc[i][nb][3] + bhi),
                            f16x2_bits(acc[i][nb + 1][0] + blo, acc[i][nb + 1][1] + blo),
                            f16x2_bits(acc[i][nb + 1][2] + bhi, acc[i][nb + 1][3] + bhi));
      }
    }
    mma_threads_sync<kThreads>();
    constexpr int kChunksPerRow = kSliceRows / 8;  // 16 bytes: 8 rows of N (N % 8 == 0: wholly in or out)
#pragma unroll 4
    for (int c = thread_index_here(); c < MT * kChunksPerRow; c += kThreads) {
      const int t = c / kChunksPerRow, u = c - t * kChunksPerRow;
      const int m = m0 + t, n = n0 + pass * kSliceRows + 8 * u;
      if (m < a.M && n < a.N)
        *reinterpret_cast<uint4*>(a.y + (size_t)m * a.N + n) =
            *reinterpret_cast<const uint4*>(tile + 2 * (t * T::kStride + 8 * u));
    }
  }
}
#endif

// kSplit: split-K (S > 1, launched in clusters of S blocks); a kernel of its own, so that the
// cluster code is in no kernel launched without clusters. kNatural, kPost: wgmma_stage's k order and
// scale (after the wgmma: wg_post_scale).
template <int MT, int NT, bool kSplit, bool kNatural, bool kPost>
__global__ void __launch_bounds__(kBatchThreads, MT <= 32 ? 2 : 1)
    gemm_w4a16_wgmma_kernel(const BatchArgs a, const __grid_constant__ CUtensorMap wmap,
                            const __grid_constant__ CUtensorMap xmap) {
#if defined(W4_HAS_WGMMA)
  using S = WgStage<MT, NT, kNatural>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[S::kStages];  // a stage's tensor copies have landed
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem0 = (raw + 1023) & ~1023u;
  const uint8_t* smem = smem_raw + (smem0 - raw);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cb = blockIdx.x;
  const int split = blockIdx.y;
  const int kb0 = split * a.kb_per_split;
  const int nkb = min(a.kblocks, kb0 + a.kb_per_split) - kb0;
  const Loader<S> loader(a, cb);
  const int slot = a.run_slots == 1 ? 0 : (lane & 3);
  const uint32_t full0 = smem_u32(full);
  const bool copier = threadIdx.x == 0;
  pdl_launch_dependents();  // a kernel launched after this one with PDL waits (pdl_wait) before its reads
  if (copier) {
    prefetch_tensor_map(&wmap);
    prefetch_tensor_map(&xmap);
    for (int s = 0; s < S::kStages; ++s) mbar_init(full0 + 8 * s, 1);
    fence_mbar_init();
  }
  __syncthreads();

  float acc[NT][MT / 8][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int nb = 0; nb < MT / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][nb][e] = 0.f;

  // Stage i (k-block kb0 + i): thread 0's boxes on the stage's barrier (the weights' box counts
  // whole, also past N), the Loader's threads' scales and zeros in one cp.async group a stage.
  // The weights may be asked for before pdl_wait, x only after.
  constexpr uint32_t kWeightBytes = S::kRows / 8 * 512;
  const uint32_t atom = static_cast<uint32_t>(a.M) * 128u;
  auto copy_weights = [&](int i) {
    const uint32_t bar = full0 + 8 * (i % S::kStages);
    mbar_arrive_expect_tx(bar, kWeightBytes + 2 * atom);
    tensor_copy_4d_g2s(smem0 + (i % S::kStages) * S::kStageBytes + S::kWOff, &wmap, 0, 0, kb0 + i,
                       cb * (S::kRows / 8), bar, evict_first_policy());
  };
  auto copy_x = [&](int i) {
    const uint32_t bar = full0 + 8 * (i % S::kStages), st = smem0 + (i % S::kStages) * S::kStageBytes + S::kXOff;
    const int k0 = (kb0 + i) * 128;
    tensor_copy_2d_g2s(st, &xmap, k0, 0, bar, evict_normal_policy());
    tensor_copy_2d_g2s(st + MT * 128, &xmap, k0 + 64, 0, bar, evict_normal_policy());
  };
  if (copier && nkb > 0) copy_weights(0);
  if (nkb > 0) loader.load_scales(smem0, kb0, a);
  pdl_wait();
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < nkb) {
      if (copier) {
        if (s > 0) copy_weights(s);
        copy_x(s);
      }
      if (s > 0) loader.load_scales(smem0 + s * S::kStageBytes, kb0 + s, a);
    }
    cp_async_commit();
  }
  for (int i = 0; i < nkb; ++i) {
    cp_async_wait<S::kStages - 2>();                            // stage i's scales and zeros (this thread's)
    mbar_wait(full0 + 8 * (i % S::kStages), (i / S::kStages) & 1);  // ... and its tensor copies
    __syncthreads();  // ... everyone's; and stage i - 1 is no longer read
    const int next = i + S::kStages - 1;
    if (next < nkb) {
      if (copier) {
        copy_weights(next);
        copy_x(next);
      }
      loader.load_scales(smem0 + (next % S::kStages) * S::kStageBytes, kb0 + next, a);
    }
    cp_async_commit();
    const int at = (i % S::kStages) * S::kStageBytes;
    wgmma_stage<S, NT, kNatural, true, false, kPost>(smem + at, smem0 + at, warp >> 2, warp & 3, lane, slot, acc);
  }
  cp_async_wait<0>();
  const int row0 = cb * S::kRows + (warp >> 2) * NT * 64 + (warp & 3) * 16;
  if constexpr (!kSplit) {
    static_assert(OutTile<MT, S::kRows>::kBytes <= S::kStages * S::kStageBytes, "the output tile fits");
    __syncthreads();  // every warp's wgmmas have read their last stage
    store_result_tile<MT, S::kRows>(acc, a, smem, smem0, row0 - cb * S::kRows, lane, cb * S::kRows, 0);
  } else {
    static_assert(SplitTile<MT, S::kRows>::kBytes <= S::kStages * S::kStageBytes, "the partial tile fits");
    __syncthreads();  // every warp's wgmmas have read their last stage
    store_split_partial<MT, S::kRows>(acc, reinterpret_cast<float*>(const_cast<uint8_t*>(smem)), row0 - cb * S::kRows,
                                      64, lane);
    cluster_sync();
    reduce_split_cluster<MT, S::kRows>(a, smem0, split, 0, cb * S::kRows);
    cluster_sync_reads_done();
  }
#endif
}

// ---- the warp-specialised kernel: any M, tokens in tiles of MT, a producer warp ----
//
// Same numerics and k order as above. An output tile is R = 64 NT WG rows of N by MT = 64, 128 or
// 256 tokens (variant 1..5 = MT 64/64/128/128/256 with NT 1/2/1/2/1 on WG = 2; 6 = 5 in pairs; 7 =
// MT 128, NT 1 on WG = 3, 192 rows). Warps 0 .. 4 WG - 1 are WG MMA warpgroups (wgmma_stage,
// m64nMT, one per m64 tile); the next four the producer's warpgroup, whose first warp
// fills a ring of 3-8 stages (as many as fit) through the tensor copy engine (activations: two
// boxes of x or x_perm a stage, one per 64-k atom, with the 128-byte swizzle, k past the row
// zero-filled; weights: one box a stage, swizzled too in the natural order) and the bulk copy
// engine or cp.async (scales, zeros) on mbarriers, each stage in two parts filled and freed apart
// (WsBarriers; no block barrier in the loop), while the MMA warps keep the last word's wgmmas in
// flight across stage boundaries.
// Three launches (plan_gemm_w4a16_ws picks the variant and which, see its comments):
//   persistent  at most one block per SM (P blocks), each walking its share of the tiles (WsWork):
//               whole tiles in grid order, then, where the last wave would leave SMs idle, an equal
//               share of the last tiles' k-blocks, mostly with the last whole wave's (stream-K,
//               WsSpread; a tile cut between blocks is added in a fixed order, "stream-K" below).
//               The ring runs on from one tile to the next, and each tile's result leaves through
//               its last stage while the next tile's stages fill.
//   split-K     fewer tiles than half the SMs, and 16 k-blocks or more: one block per tile and split,
//               the splits of a tile one cluster, added as the barrier kernel's; unless stream-K
//               over every SM is modelled cheaper (the clusters that fit at once can leave SMs idle).
//   pairs       variant 6, x as it lies: clusters of two blocks on neighbouring row blocks of one
//               token tile, each tensor-copying half of every x atom's tokens into both (multicast),
//               persistent over the pairs of tiles (no split-K; past one wave of pairs, the last
//               shared out by stream-K over the clusters, both blocks of a cluster cut at the same
//               k-blocks); a stage is refilled once both blocks released it (release_stage).
// A last token tile that M does not fill is copied with a box of its own tokens only (xtail, a
// second map of the same rows): a box reaching past the map's rows is filled there with zeros, and
// the copy engine does that so slowly that such tiles ran up to twice as long as full ones (H100,
// dev/LOG.md). The stage's rows past M keep whatever they held; they feed only the wgmmas' token
// columns past M, which nothing stores (every store of y, and of a partial, checks m < M). The
// pairs keep xmap for every tile (a half box past M cost them nothing there).
// Launch shape: grid (P), grid (ceil(N / R), S, m_tiles) in clusters of (1, S, 1), or grid (P, 2) in
// clusters of (1, 2, 1) (pairs, xmap's box half the tile's tokens); 384 threads (512 in variant 7),
// dynamic shared memory kStages x (MT x 256 + R x 64 + R x 10, rounded up to 1 KB) + 1 KB (227 KB
// opt-in at MT = 256), 1 block/SM; preceded (PDL) by permute_x_kernel in the permuted order, and by
// zero_flags_kernel where the launch has stream-K.
// Constraints: as the barrier kernel, with 1 <= M <= 65536; scratch from the caller (WsScratch):
// x_perm in the permuted order, and for stream-K partial [Q, MT x R] fp32 and flags [Q] int32 for
// its Q blocks (2 x its Q clusters in the pairs' launch). The tensor maps of x (or x_perm: xmap and
// xtail) and of the weights are encoded per launch (x_tensor_map, weight_tensor_map) and passed by
// value.

// Zeroes the stream-K flags (flags[0 .. n)) of the GEMM launched after it, after pdl_wait: the
// GEMM before may still be using the same memory for its own.
__global__ void __launch_bounds__(256) zero_flags_kernel(int* __restrict__ flags, int n) {
  pdl_launch_dependents();  // the GEMM copies its first stage's weights meanwhile
  pdl_wait();
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i < n) flags[i] = 0;
}

// WG MMA warpgroups (two, or three in variant 7), then the producer's warpgroup (one warp of it
// copies, three leave at once). Registers are split unevenly (setmaxnreg): with two MMA warpgroups
// 232 a thread for the MMA warps, which hold a 64 x 256 fp32 accumulator, 40 for the producer's
// (224 and 56 in the pairs' launch, whose producer also walks stream-K's shares and multicasts: at
// 40 it spilled); with three, 152 (a 64 x 128 accumulator) and 56. The block is launched with
// 65536 / threads a thread (168 at 384 threads, 128 at 512) and setmaxnreg.inc waits until the
// block's pool has the registers: WG x MMA + producer must be (WG + 1) x that, or the block hangs
// (seen on the H100 with 2 x 240 + 32).
__host__ __device__ constexpr int ws_threads(int wg) { return wg * 128 + 128; }
__host__ __device__ constexpr int ws_mma_regs(int wg, bool pair) { return wg == 3 ? 152 : pair ? 224 : 232; }
__host__ __device__ constexpr int ws_producer_regs(int wg, bool pair) { return wg == 3 || pair ? 56 : 40; }
constexpr bool ws_regs_fill_the_pool(int wg, bool pair) {
  return wg * ws_mma_regs(wg, pair) + ws_producer_regs(wg, pair) == (wg + 1) * (65536 / ws_threads(wg) / 8 * 8);
}
static_assert(ws_regs_fill_the_pool(2, false) && ws_regs_fill_the_pool(2, true) && ws_regs_fill_the_pool(3, false),
              "the pool the block starts with");
constexpr int kWsSmemLimit = 227 * 1024;        // the H100's and H200's opt-in limit per block

// The warp-specialised kernel's stages: as many as fit the opt-in limit, up to 8 (3 at MT = 256).
template <int MT, int NT, bool kNatural, int WG = 2>
struct WsStage : StageLayout<MT, NT, kNatural, WG> {
  using L = StageLayout<MT, NT, kNatural, WG>;
  static constexpr int kMmaThreads = WG * 128;  // the threads that hold accumulators
  static_assert(kMmaThreads + 128 == ws_threads(WG), "the MMA warpgroups, then the producer's");
  static constexpr int kStages =
      (kWsSmemLimit - 1024) / L::kStageBytes >= 8 ? 8 : (kWsSmemLimit - 1024) / L::kStageBytes;
  static constexpr int kSmem = kStages * L::kStageBytes + 1024;  // + room to align the base to 1 KB
  static_assert(kStages >= 2, "a stage must fit twice in shared memory");
};

// The persistent walk's units: tiles, or in the pairs' launch pairs of neighbouring row blocks'
// tiles (WsWork on the device; the plan, the launch check and the pairs' rule on the host).
__host__ __device__ __forceinline__ int64_t walk_units(bool pairs, int m_tiles, int row_blocks) {
  return pairs ? (int64_t)m_tiles * ((row_blocks + 1) / 2) : (int64_t)row_blocks * m_tiles;
}

#if defined(W4_HAS_WGMMA)
// A stage is filled and freed in two parts, so that the first can be refilled half a k-block
// before the second is read: part A, the x tile's first 64-k atom (read by words 0 and 1), the
// weights, scales and zeros (in registers, or their loads issued, by the third word's wait); part
// B, the second atom.
// Barriers, kStages each: full_a, full_b (landed), empty_a, empty_b (every MMA thread done).
struct WsBarriers {
  uint32_t full_a, full_b, empty_a, empty_b;
  __device__ WsBarriers(uint32_t base, int stages)
      : full_a(base), full_b(base + 8 * stages), empty_a(base + 16 * stages), empty_b(base + 24 * stages) {}
};

// One output tile's k-blocks [kb_lo, kb_hi) in a block's work: tile u = mt * row_blocks + cb
// (tokens mt * MT .., rows cb * R ..); `unit`, the walk's unit it lies in (the tile, or the pair of
// tiles in a pairs launch), which stream-K's cuts count in.
struct WsSegment {
  int64_t tile, mt, unit;
  int cb, kb_lo, kb_hi;
};

// A block's work, in order. Persistent launch of P blocks over T units (tiles; pairs of tiles in a
// pairs launch) whose last a.sk_tiles are shared out by stream-K: first the whole units c, c + P,
// c + 2 P, ... below T - sk_tiles (the blocks of a wave walk the same k-blocks at about the same
// time, and the tiles of one row block share its weights through L2), then the steps
// [first + S min(c, Q) / Q, first + S min(c + 1, Q) / Q) of the S = sk_tiles x kblocks steps
// u x kblocks + kb after them, for the first Q = a.sk_blocks blocks (the others' share is empty).
// Split-K in clusters: one split's k-blocks of one tile.
// Pairs (kPair, clusters of (1, 2, 1) along the grid's y): c = blockIdx.x counts clusters, P is
// the clusters launched, and unit q of the m_tiles x ceil(row_blocks / 2) pairs holds row blocks
// 2 j and 2 j + 1 of one token tile, block blockIdx.y the one of them (with an odd row-block count,
// the last pair's second tile lies past N: computed on zeros, not stored). Both blocks of a
// cluster walk the same units and k-blocks, so that every stage's activations serve both.
// kSplit: a split-K launch's walk (its one segment).
template <bool kPair = false, bool kSplit = false>
struct WsWork {
  int64_t next_unit, dp_end;  // the next whole unit, and the first that is not one
  int64_t step, end;          // the stream-K steps left

  __device__ __forceinline__ static int64_t units(const BatchArgs& a) {
    return walk_units(kPair, a.m_tiles, a.row_blocks);
  }
  __device__ __forceinline__ explicit WsWork(const BatchArgs& a) {
    if (kSplit) {
      const int64_t tile = (int64_t)blockIdx.z * a.row_blocks + blockIdx.x;
      const int kb0 = blockIdx.y * a.kb_per_split;
      next_unit = dp_end = 0;
      step = tile * a.kblocks + kb0;
      end = tile * a.kblocks + min(a.kblocks, kb0 + a.kb_per_split);
    } else {
      dp_end = units(a) - a.sk_tiles;
      next_unit = blockIdx.x;
      step = sk_begin(a, blockIdx.x);
      end = sk_begin(a, blockIdx.x + 1);
    }
  }
  // The first stream-K step of `block`'s share (`block` counts clusters in a pairs launch).
  __device__ __forceinline__ static int64_t sk_begin(const BatchArgs& a, int block) {
    const int64_t first = (units(a) - a.sk_tiles) * a.kblocks;
    return a.sk_blocks == 0 ? first : first + (int64_t)a.sk_tiles * a.kblocks * min(block, a.sk_blocks) / a.sk_blocks;
  }
  // The next segment, false when none is left.
  __device__ __forceinline__ bool next(const BatchArgs& a, WsSegment& seg) {
    if (next_unit < dp_end) {
      seg.unit = next_unit;
      seg.kb_lo = 0;
      seg.kb_hi = a.kblocks;
      next_unit += gridDim.x;
    } else if (step < end) {
      seg.unit = step / a.kblocks;
      seg.kb_lo = (int)(step - seg.unit * a.kblocks);
      seg.kb_hi = (int)min((int64_t)a.kblocks, seg.kb_lo + (end - step));
      step += seg.kb_hi - seg.kb_lo;
    } else {
      return false;
    }
    if (kPair) {
      const int64_t pairs = (a.row_blocks + 1) / 2;
      seg.mt = seg.unit / pairs;
      seg.cb = 2 * (int)(seg.unit - seg.mt * pairs) + (int)blockIdx.y;
      seg.tile = seg.mt * a.row_blocks + seg.cb;
    } else {
      seg.tile = seg.unit;
      seg.mt = seg.tile / a.row_blocks;
      seg.cb = (int)(seg.tile - seg.mt * a.row_blocks);
    }
    return true;
  }
};

// The producer warp: per k-block, once the MMA warps have released part A of the stage, lane 0
// expects its bytes on full_a and starts one tensor copy of the block's 8-row weight tiles at this
// k-block (R / 8 tiles of 512 B, kblocks x 512 B apart in the w4-gemv layout: one box of `wmap`,
// rows past N zero-filled) and the copy of the x tile's first atom (one box of `xmap`); the scales
// and zeros go as two bulk copies from lane 0 (kBulk, below) or as every lane's cp.async chunks,
// each lane arriving on full_a when its chunks land (33 arrivals a phase either way). Once part B
// is released, lane 0 copies the second atom, expecting it on full_b. The first stage's weights,
// scales and zeros go out before pdl_wait (with PDL, while the kernel before still runs); only the
// first's: an SM's share of the memory bandwidth is about 23 bytes a nanosecond, so every stage's
// weights queued ahead of the first activations could hold those back by microseconds.
//
// kBulk: a launch whose stages have one scale and zero a row (run_slots == 1) and whose row blocks
// all lie inside N copies each stage's scales and zeros, two contiguous runs (R fp16 scales, R / 8
// zero words), with the bulk copy engine from lane 0, instead of 32 lanes' cp.async and arrivals:
// at M = 64-128, where the split launches wait on a producer that issues about one stage a
// k-block, leaving those copies out made them 2-8% faster, far more than their bytes, and the bulk
// copies 1-4% (H200, dev/LOG.md). Both runs must be 16-byte aligned: N a multiple of 32 (as R is)
// and the tensors' bases aligned (checked: the caller may pass views). In a pairs launch every
// pair's second tile too must lie inside N: with an odd row-block count the last one lies past it
// (computed on zeros), and the bulk copies of its scales and zeros would read past the end of the
// last group's (the cp.async path zero-fills rows past N instead). Decided once a launch, so that
// each producer loop is compiled for one way only (both in one loop spilled at the producer's 40
// registers).
template <typename S, bool kPair>
__device__ __forceinline__ bool ws_bulk_constants(const BatchArgs& a) {
  return a.run_slots == 1 && a.N % (kPair ? 2 * S::kRows : S::kRows) == 0 &&
         ((reinterpret_cast<uintptr_t>(a.scales) | reinterpret_cast<uintptr_t>(a.qzeros)) & 15) == 0;
}

// Stage i's part A but its x atom, for k-block kb of row block cb: the expected bytes (x atom of
// `atom` bytes included), the weights, scales and zeros.
template <typename S, bool kBulk>
__device__ __forceinline__ void ws_copy_constants(const BatchArgs& a, const CUtensorMap& wmap, uint32_t smem0,
                                                  const WsBarriers& b, int i, int cb, int kb, uint32_t atom,
                                                  uint64_t wpolicy, int lane) {
  constexpr int kTiles8 = S::kRows / 8;
  const uint32_t full = b.full_a + 8 * (i % S::kStages);
  const uint32_t st = smem0 + (i % S::kStages) * S::kStageBytes;
  if constexpr (kBulk) {
    if (lane == 0) {
      const int grp = group_of_run(4u * kb, a);
      mbar_arrive_expect_tx(full, atom + kTiles8 * 512 + S::kRows * 2 + kTiles8 * 4);
      tensor_copy_4d_g2s(st + S::kWOff, &wmap, 0, 0, kb, cb * kTiles8, full, wpolicy);
      bulk_copy_g2s(st + S::kSOff, a.scales + (size_t)grp * a.N + cb * S::kRows, S::kRows * 2, full);
      bulk_copy_g2s(st + S::kZOff, a.qzeros + (size_t)grp * (a.N >> 3) + cb * kTiles8, kTiles8 * 4, full);
      mbar_arrive_n(full, 32);  // the lanes' arrivals, which have no copies of their own to wait for
    }
    return;
  }
  if (lane == 0) {
    mbar_arrive_expect_tx(full, atom + kTiles8 * 512);
    tensor_copy_4d_g2s(st + S::kWOff, &wmap, 0, 0, kb, cb * kTiles8, full, wpolicy);
  }
  // scales and zeros: per 32-k run slot, one 16-byte scale chunk and one zero word per 8 rows
#pragma unroll
  for (int j = 0; j < (kRunSlots * kTiles8 + 31) / 32; ++j) {
    const int idx = lane + 32 * j;
    const int slot = idx / kTiles8;
    const int c = idx - slot * kTiles8;
    if (slot < a.run_slots) {
      const int n0 = cb * S::kRows + 8 * c;
      const bool ok = n0 < a.N;
      const int grp = group_of_run(4u * kb + slot, a);
      cp_async16(st + S::kSOff + 2 * (slot * S::kRows + 8 * c), a.scales + (ok ? (size_t)grp * a.N + n0 : 0), ok);
      cp_async4(st + S::kZOff + 4 * (slot * kTiles8 + c), a.qzeros + (ok ? (size_t)grp * (a.N >> 3) + (n0 >> 3) : 0),
                ok);
    }
  }
  mbar_arrive_cp_async(full);
}

// Two loops of that one protocol. Split-K in clusters: the k-blocks [kb0, kb0 + nkb) of tile (cb,
// mt), counted from kb0. Driven by the persistent launch's walk over segments instead, the split
// kernel's producer compiled to half as many instructions again, its cp.async arrival in a
// waterfall loop (the barrier no longer provably the same in every lane), and the kernel ran
// 11-17% slower at M = 64, where it is bound by memory (H100, same-run builds, dev/LOG.md).
template <typename S, bool kBulk>
__device__ __forceinline__ void ws_produce_split(const BatchArgs& a, const CUtensorMap& wmap, const CUtensorMap& xmap,
                                                 const CUtensorMap& xtail, uint32_t smem0, const WsBarriers& b, int cb,
                                                 int mt, int kb0, int nkb, int lane) {
  constexpr uint32_t kAtom = S::kTokens * 128;  // bytes of one 64-k atom of the x tile (its place in the stage)
  const uint64_t wpolicy = a.m_tiles == 1 ? evict_first_policy() : evict_normal_policy();
  const uint64_t xpolicy = evict_normal_policy();
  const int m0 = mt * S::kTokens;
  const bool tail = mt == a.m_tiles - 1;  // (xtail is xmap where M fills the last tile)
  const CUtensorMap* x = tail ? &xtail : &xmap;
  const uint32_t atom = tail ? (a.M - m0) * 128u : kAtom;  // bytes the x box brings
  if (nkb > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, cb, kb0, atom, wpolicy, lane);
  pdl_wait();
  for (int i = 0; i < nkb; ++i) {
    const int s = i % S::kStages;
    const uint32_t parity = ((i / S::kStages) + 1) & 1;
    const uint32_t st = smem0 + s * S::kStageBytes;
    const int k0 = (kb0 + i) * 128;
    if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);
    if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
    if (lane == 0) {
      mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);
    }
  }
  // Leave only once the MMA warps have consumed every stage: no copy outlives its issuer.
  for (int i = nkb > S::kStages ? nkb - S::kStages : 0; i < nkb; ++i) {
    mbar_wait(b.empty_a + 8 * (i % S::kStages), (i / S::kStages) & 1);
    mbar_wait(b.empty_b + 8 * (i % S::kStages), (i / S::kStages) & 1);
  }
}
// A persistent launch: the block's segments (WsWork) one after another, the ring running on from
// one tile to the next. kPair: each block of the pair copies half the tokens of each x atom into
// both blocks' stage (multicast; each block's full barrier expects the whole atom), and refills a
// stage only once both blocks have released it (their MMA warps arrive on both blocks' barriers:
// release_stage).
template <typename S, bool kPair, bool kBulk>
__device__ __forceinline__ void ws_produce(const BatchArgs& a, const CUtensorMap& wmap, const CUtensorMap& xmap,
                                           const CUtensorMap& xtail, uint32_t smem0, const WsBarriers& b, int lane) {
  constexpr uint32_t kAtom = S::kTokens * 128;  // bytes of one 64-k atom of the x tile (its place in the stage)
  const uint64_t wpolicy = a.m_tiles == 1 ? evict_first_policy() : evict_normal_policy();
  const uint64_t xpolicy = evict_normal_policy();
  // the last token tile's x box brings only its tokens (the pairs: every box as xmap's)
  auto tail = [&](const WsSegment& seg) { return !kPair && (int)seg.mt == a.m_tiles - 1; };
  auto copy_x = [&](uint32_t dst, const CUtensorMap* x, int k0, int m0, uint32_t bar) {
    if constexpr (kPair) {
      const uint32_t rank = cluster_rank();  // (read here each time: the producer has 40 registers)
      tensor_copy_2d_g2s_multicast<0x3>(dst + rank * (kAtom / 2), x, k0, m0 + rank * (S::kTokens / 2), bar);
    } else {
      tensor_copy_2d_g2s(dst, x, k0, m0, bar, xpolicy);
    }
  };
  WsWork<kPair> work(a);
  WsSegment seg;
  bool more = work.next(a, seg);
  // bytes the x box of a segment's tile brings
  auto atom_of = [&](const WsSegment& seg) { return tail(seg) ? (a.M - (int)seg.mt * S::kTokens) * 128u : kAtom; };
  if (more) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, seg.cb, seg.kb_lo, atom_of(seg), wpolicy, lane);
  pdl_wait();
  int i = 0;  // steps into the ring
  for (; more; more = work.next(a, seg)) {
    const int m0 = (int)seg.mt * S::kTokens;
    const CUtensorMap* x = tail(seg) ? &xtail : &xmap;
    const uint32_t atom = atom_of(seg);
    for (int kb = seg.kb_lo; kb < seg.kb_hi; ++kb, ++i) {
      const int s = i % S::kStages;
      const uint32_t parity = ((i / S::kStages) + 1) & 1;
      const uint32_t st = smem0 + s * S::kStageBytes;
      if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);
      if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
      if (lane == 0) {
        mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
        copy_x(st + S::kXOff + kAtom, x, kb * 128 + 64, m0, b.full_b + 8 * s);
      }
    }
  }
  // Leave only once the MMA warps have consumed every stage: no copy outlives its issuer.
  for (int j = i > S::kStages ? i - S::kStages : 0; j < i; ++j) {
    mbar_wait(b.empty_a + 8 * (j % S::kStages), (j / S::kStages) & 1);
    mbar_wait(b.empty_b + 8 * (j % S::kStages), (j / S::kStages) & 1);
  }
}

// ---- stream-K: a tile cut between the blocks of a persistent launch ----
// A tile whose k-blocks fall into several blocks' ranges: the first block has k-blocks 0 .. j at
// the end of its range, each later one a piece at the start of its own (or its whole range, where
// ranges are shorter than a tile: a tile meets as many ranges as it takes). A later block stores its fp32
// partial tile to global memory in its own registers' order (partial [slot][MT R / 4 / T][T MMA
// threads] float4, one coalesced 512-byte piece a warp and instruction) and raises its flag
// (counters[slot], zeroed by zero_flags_kernel); the first block, at the end of its range, waits for
// each flag in block order and adds the partials to its own sum in that order, so the bits depend
// only on where the cuts lie, which depends only on the shape and the SM count. A block's slot is
// its index, or in a pairs launch (whose ranges are the clusters') 2 x its cluster's + its rank:
// the two blocks of a cluster cut the two tiles of a pair at the same k-blocks.
template <bool kPair>
__device__ __forceinline__ int stream_k_slot(int block) {
  return kPair ? 2 * block + (int)blockIdx.y : block;
}
template <int kThreads, int NT, int NB>
__device__ __forceinline__ void stream_k_store(const float (&acc)[NT][NB][4], const BatchArgs& a, int slot) {
  float4* part = reinterpret_cast<float4*>(a.partial) + (size_t)slot * NT * NB * kThreads + threadIdx.x;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
      __stcg(part + (i * NB + nb) * kThreads, make_float4(acc[i][nb][0], acc[i][nb][1], acc[i][nb][2], acc[i][nb][3]));
  __threadfence();    // this thread's partial is visible device-wide ...
  mma_threads_sync<kThreads>();  // ... and every MMA thread's, before the flag
  if (threadIdx.x == 0) st_release_gpu(a.counters + slot, 1);
}
// unit_end: the step after the unit's last. Blocks with an empty share store nothing.
template <bool kPair, int kThreads, int NT, int NB>
__device__ __forceinline__ void stream_k_add(float (&acc)[NT][NB][4], const BatchArgs& a, int64_t unit_end) {
  using Work = WsWork<kPair>;
  for (int block = blockIdx.x + 1; block < a.sk_blocks && Work::sk_begin(a, block) < unit_end; ++block) {
    if (Work::sk_begin(a, block + 1) == Work::sk_begin(a, block)) continue;
    const int slot = stream_k_slot<kPair>(block);
    if (threadIdx.x == 0)
      while (ld_acquire_gpu(a.counters + slot) == 0) __nanosleep(64);
    mma_threads_sync<kThreads>();
    const float4* part =
        reinterpret_cast<const float4*>(a.partial) + (size_t)slot * NT * NB * kThreads + threadIdx.x;
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const float4 p = __ldcg(part + (i * NB + nb) * kThreads);
        acc[i][nb][0] += p.x;
        acc[i][nb][1] += p.y;
        acc[i][nb][2] += p.z;
        acc[i][nb][3] += p.w;
      }
  }
}

// The MMA warps: per k-block, wait for the stage to land, convert and multiply it (wgmma_stage),
// releasing its part A once words 0 and 1 are done and the previous stage's part B once its
// wgmmas are. At a tile's last k-block in the range the stage is kept whole: its memory holds the
// output tile on its way to y (the other stages fill with the next tile meanwhile), and both parts
// are released once this thread is done with it. Split-K in a cluster (kSplit) leaves the partial
// tile in the stages' memory instead, the producer gone. kPair: a pair's launch (ws_produce), its
// releases on both blocks' barriers (release_stage).
template <typename S, int NT, bool kSplit, bool kNatural, bool kPair = false, int MT = S::kTokens>
__device__ __forceinline__ void ws_consume(const BatchArgs& a, const uint8_t* smem, uint32_t smem0, const WsBarriers& b,
                                           int warp, int lane) {
  WsWork<kPair, kSplit> work(a);
  constexpr int kThreads = S::kMmaThreads, kWarpgroups = kThreads / 128;
  // where the whole output tile does not fit the held stage, one warpgroup's rows at a time
  constexpr int kPasses = OutTile<MT, S::kRows>::kBytes <= S::kStageBytes ? 1 : kWarpgroups;
  static_assert(OutTile<MT, S::kRows / kPasses>::kBytes <= S::kStageBytes, "the output tile fits a stage");
  const int slot = a.run_slots == 1 ? 0 : (lane & 3);
  const int row0_local = (warp >> 2) * NT * 64 + (warp & 3) * 16;
  if (!kSplit) pdl_wait();  // (the producer waited before the activations; the writes wait too)
  float acc[NT][MT / 8][4];
  int i = 0;  // steps into the ring
  WsSegment seg;
  // (no early exit for split-K's single segment: a `break` at the end made ptxas serialise the
  // split kernels' wgmmas, C7515, which kernels/check.sh refuses)
  while (work.next(a, seg)) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int nb = 0; nb < MT / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][nb][e] = 0.f;
    for (int kb = seg.kb_lo; kb < seg.kb_hi; ++kb, ++i) {
      const int s = i % S::kStages;
      mbar_wait(b.full_a + 8 * s, (i / S::kStages) & 1);
      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);
      const int off = s * S::kStageBytes;
      // every thread releases the parts it read (an arrive orders only its own thread's reads)
      wgmma_stage<S, NT, kNatural, false, kPair>(smem + off, smem0 + off, warp >> 2, warp & 3, lane, slot, acc,
                                          kb > seg.kb_lo ? b.empty_b + 8 * ((i - 1) % S::kStages) : 0u,
                                          kSplit || kb + 1 < seg.kb_hi ? b.empty_a + 8 * s : 0u);
    }
    wgmma_wait<0>();
    const int held = (i - 1) % S::kStages;  // the tile's last stage, neither part released (but with split-K)
    if constexpr (kSplit) {
      mbar_arrive(b.empty_b + 8 * held);
      pdl_wait();  // (the producer waited before the activations; the writes wait too)
      mma_threads_sync<kThreads>();  // every MMA thread's wgmmas have read their last stage (and every copy landed)
      static_assert(SplitTile<MT, S::kRows>::kBytes <= S::kStages * S::kStageBytes, "the partial tile fits");
      store_split_partial<MT, S::kRows>(acc, reinterpret_cast<float*>(const_cast<uint8_t*>(smem)), row0_local, 64,
                                        lane);
    } else {
      if (seg.kb_lo > 0) {
        // a later piece of a tile an earlier block began
        stream_k_store<kThreads>(acc, a, stream_k_slot<kPair>(blockIdx.x));
      } else {
        if (seg.kb_hi < a.kblocks)  // later blocks have the rest
          stream_k_add<kPair, kThreads>(acc, a, (seg.unit + 1) * a.kblocks);
        mma_threads_sync<kThreads>();  // every MMA thread's wgmmas have read the held stage
        store_result_tile<MT, S::kRows, NT, kPasses, kThreads>(acc, a, smem + held * S::kStageBytes,
                                                               smem0 + held * S::kStageBytes, row0_local, lane,
                                                               seg.cb * S::kRows, (int)(seg.mt * MT));
      }
      fence_proxy_async_shared();  // this thread's writes to the stage before the copy engines' next ones
      release_stage<kPair>(b.empty_a + 8 * held, lane);
      release_stage<kPair>(b.empty_b + 8 * held, lane);
    }
  }
}
#endif

// Persistent (!kSplit): grid (P), P <= the tile count and the SM count; split-K in clusters
// (kSplit): grid (ceil(N / R), S, m_tiles) in clusters of (1, S, 1). ws_threads(WG) threads, S::kSmem
// bytes of dynamic shared memory; wmap, xmap, xtail: the tensor maps of the weights, of x and of
// x's last token tile (weight_tensor_map, x_tensor_map). kNatural: wgmma_stage's k order. kPair
// (persistent only): grid (P, 2) in clusters of (1, 2, 1), P <= the pairs of tiles and half the SM
// count (WsWork), xmap's box half a tile's tokens. WG: the MMA warpgroups (2, or 3 without pairs).
template <int MT, int NT, bool kSplit, bool kNatural, bool kPair = false, int WG = 2>
__global__ void __launch_bounds__(ws_threads(WG), 1) gemm_w4a16_ws_kernel(const BatchArgs a,
                                                                          const __grid_constant__ CUtensorMap wmap,
                                                                          const __grid_constant__ CUtensorMap xmap,
                                                                          const __grid_constant__ CUtensorMap xtail) {
#if defined(W4_HAS_WGMMA)
  static_assert(WG == 2 || (WG == 3 && !kPair), "the pairs' release counts two MMA warpgroups");
  using S = WsStage<MT, NT, kNatural, WG>;
  constexpr int kMmaWarps = S::kMmaThreads / 32;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bars[4 * S::kStages];  // WsBarriers
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem0 = (raw + 1023) & ~1023u;
  const uint8_t* smem = smem_raw + (smem0 - raw);
  const WsBarriers b(smem_u32(bars), S::kStages);
  pdl_launch_dependents();  // a kernel launched after this one with PDL waits (pdl_wait) before its reads
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(b.full_a + 8 * s, 1 + 32);  // the producer's expect_tx, its 32 lanes' cp.async
      mbar_init(b.full_b + 8 * s, 1);       // its expect_tx
      mbar_init(b.empty_a + 8 * s, S::kMmaThreads + (kPair ? kMmaWarps : 0));  // (release_stage)
      mbar_init(b.empty_b + 8 * s, S::kMmaThreads + (kPair ? kMmaWarps : 0));
    }
    fence_mbar_init();
  }
  // a pair's other block copies into this one's stages and arrives on its barriers: both initialised
  if constexpr (kPair) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  // Split-K: the cluster's sum (ws_consume left the partial tile), whose barriers every thread of
  // the cluster passes; each role passes them in its own branch, so that no code past the branches
  // is bound to the producer's 40 registers.
  if (warp >= kMmaWarps) {
    setmaxnreg_dec<ws_producer_regs(WG, kPair)>();
    if (warp == kMmaWarps) {
      const bool bulk = ws_bulk_constants<S, kPair>(a);
      if constexpr (kSplit) {
        const int kb0 = blockIdx.y * a.kb_per_split, nkb = min(a.kblocks, kb0 + a.kb_per_split) - kb0;
        if (bulk) {
          ws_produce_split<S, true>(a, wmap, xmap, xtail, smem0, b, blockIdx.x, blockIdx.z, kb0, nkb, lane);
        } else {
          ws_produce_split<S, false>(a, wmap, xmap, xtail, smem0, b, blockIdx.x, blockIdx.z, kb0, nkb, lane);
        }
      } else if (bulk) {
        ws_produce<S, kPair, true>(a, wmap, xmap, xtail, smem0, b, lane);
      } else {
        ws_produce<S, kPair, false>(a, wmap, xmap, xtail, smem0, b, lane);
      }
    }
    if constexpr (kSplit) {
      cluster_sync();
      cluster_sync_reads_done();
    }
    if constexpr (kPair) cluster_sync();  // neither block leaves while the other may still reach into it
  } else {
    setmaxnreg_inc<ws_mma_regs(WG, kPair)>();
    ws_consume<S, NT, kSplit, kNatural, kPair>(a, smem, smem0, b, warp, lane);
    if constexpr (kSplit) {
      cluster_sync();
      reduce_split_cluster_of<MT, S::kRows, S::kMmaThreads>(a, smem0, blockIdx.y, blockIdx.z * MT,
                                                            blockIdx.x * S::kRows);
      cluster_sync_reads_done();
    }
    if constexpr (kPair) cluster_sync();
  }
#endif
}

struct WgVariant {
  using Kernel = void (*)(const BatchArgs, const CUtensorMap, const CUtensorMap);
  Kernel fn[2][2];  // [natural][split]
  int rows, smem, tokens;
};

template <int MT, int NT, bool kPost = false>
WgVariant wg_variant() {
  static_assert(WgStage<MT, NT, true>::kSmem == WgStage<MT, NT, false>::kSmem, "one launch shape for both k orders");
  return {{{gemm_w4a16_wgmma_kernel<MT, NT, false, false, kPost>, gemm_w4a16_wgmma_kernel<MT, NT, true, false, kPost>},
           {gemm_w4a16_wgmma_kernel<MT, NT, false, true, kPost>, gemm_w4a16_wgmma_kernel<MT, NT, true, true, kPost>}},
          WgStage<MT, NT, true>::kRows,
          WgStage<MT, NT, true>::kSmem,
          MT};
}

// The barrier kernel scales after the wgmma (the header's "Numerics") where every 128-k block lies in
// one group and K >= 4096 (the GEMV's rule and reason: the skipped weight rounding stays within
// half of the bound's K term), on tiles of up to 32 tokens, where the MMA warps' instructions set
// the pace; not on two m64 tiles of 32 tokens, whose second set of sums spills at two blocks an SM.
bool wg_post_scale(int64_t M, int64_t K, int64_t G, int tiles) {
  return (G == K || G % 128 == 0) && K >= 4096 && (M <= 16 || (M <= 32 && tiles == 1));
}

bool pick_wg_variant(int64_t M, int tiles, bool post, WgVariant* v) {
  const int mt = M <= 16 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : 128;
  if (post && (mt > 32 || (mt == 32 && tiles != 1))) return false;
  switch (mt * 10 + tiles) {
    case 161: *v = post ? wg_variant<16, 1, true>() : wg_variant<16, 1>(); return true;
    case 162: *v = post ? wg_variant<16, 2, true>() : wg_variant<16, 2>(); return true;
    case 321: *v = post ? wg_variant<32, 1, true>() : wg_variant<32, 1>(); return true;
    case 322: *v = wg_variant<32, 2>(); return true;
    case 641: *v = wg_variant<64, 1>(); return true;
    case 642: *v = wg_variant<64, 2>(); return true;
    case 1281: *v = wg_variant<128, 1>(); return true;
    default: return false;
  }
}

// Both wgmma kernels' shape rules; max_m: kWgmmaMaxM or kWsMaxM.
bool wgmma_shapes_ok(int64_t M, int64_t max_m, int64_t K, int64_t N, int64_t G) {
  return M >= 1 && M <= max_m && K >= 8 && K % 8 == 0 && N >= 8 && N % 8 == 0 && G >= 1 && K % G == 0 &&
         (G % 32 == 0 || G == K) && K < (int64_t{1} << 21) && N < (int64_t{1} << 31);
}

struct WsVariant {
  using Kernel = void (*)(const BatchArgs, const CUtensorMap, const CUtensorMap, const CUtensorMap);
  Kernel fn[2][2];  // [natural][split]
  int rows, smem, tokens, threads;
  Kernel pair;  // the pairs' launch (natural order), or null
};

template <int MT, int NT, bool kPairs = false, int WG = 2>
WsVariant ws_variant() {
  using S = WsStage<MT, NT, true, WG>;
  static_assert(S::kSmem == WsStage<MT, NT, false, WG>::kSmem, "one launch shape for both k orders");
  WsVariant v = {{{gemm_w4a16_ws_kernel<MT, NT, false, false, false, WG>,
                   gemm_w4a16_ws_kernel<MT, NT, true, false, false, WG>},
                  {gemm_w4a16_ws_kernel<MT, NT, false, true, false, WG>,
                   gemm_w4a16_ws_kernel<MT, NT, true, true, false, WG>}},
                 S::kRows,
                 S::kSmem,
                 S::kTokens,
                 ws_threads(WG),
                 nullptr};
  if constexpr (kPairs) v.pair = gemm_w4a16_ws_kernel<MT, NT, false, true, true>;
  return v;
}

// A tensor map, elements outside the tensor read as zeros; `swizzled`: with the 128-byte swizzle (the
// stages' layout: 128-byte rows, 16-byte unit u of row r at u ^ (r % 8) from a 1 KB aligned start;
// the box's innermost 128 bytes). dims, box: innermost first; strides: bytes, dims 1 and up. The
// encoder is the driver's, reached through the runtime (no link to libcuda); it is looked up once.
cudaError_t encode_tensor_map(CUtensorMapDataType type, int rank, const void* base, const cuuint64_t* dims,
                              const cuuint64_t* strides, const cuuint32_t* box, bool swizzled, CUtensorMap* map) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  const CUtensorMapSwizzle swizzle = swizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUresult r = encode(map, type, rank, const_cast<void*>(base), dims, strides, box, steps,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The w4-gemv qweight as the tensor copy engine sees it: int32 [N/8 tiles][kblocks][4][32] (a
// tile's 512 B at one k-block as four 128-byte rows), in boxes of [tiles8][1][4][32]: one box is a
// block's weights at one k-block, landing as tiles8 consecutive 512-byte tiles, swizzled for the
// natural k order; for the permuted one as [N/8][kblocks][1][128] in boxes of [tiles8][1][1][128],
// whole 512-byte rows, which the tensor copy engine moves 1-3% faster (H100, dev/LOG.md).
cudaError_t weight_tensor_map(const int32_t* qweight, int64_t N, int kblocks, int tiles8, bool natural,
                              CUtensorMap* map) {
  const cuuint32_t row = natural ? 32 : 128;  // int32 per box row
  const cuuint64_t dims[4] = {row, 128 / row, static_cast<cuuint64_t>(kblocks), static_cast<cuuint64_t>(N / 8)};
  const cuuint64_t strides[3] = {row * 4, 512, static_cast<cuuint64_t>(kblocks) * 512};
  const cuuint32_t box[4] = {row, 128 / row, 1, static_cast<cuuint32_t>(tiles8)};
  return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_INT32, 4, qweight, dims, strides, box, natural, map);
}

// x [M, cols] fp16 (x itself, or x_perm) in boxes of 64 k x `tokens` rows: one 64-k atom of a
// stage's x tile.
cudaError_t x_tensor_map(const void* x, int64_t M, int64_t cols, int tokens, CUtensorMap* map) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(M)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(tokens)};
  return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, x, dims, strides, box, true, map);
}

// variant: 1 = (MT 64, NT 1), 2 = (64, 2), 3 = (128, 1), 4 = (128, 2), 5 = (256, 1) on two MMA
// warpgroups; 6 = 5 in pairs of blocks sharing each stage's activations (x as it lies, no split-K);
// 7 = (128, 1) on three MMA warpgroups (192 rows)
bool pick_ws_variant(int variant, WsVariant* v) {
  switch (variant) {
    case 1: *v = ws_variant<64, 1>(); return true;
    case 2: *v = ws_variant<64, 2>(); return true;
    case 3: *v = ws_variant<128, 1>(); return true;
    case 4: *v = ws_variant<128, 2>(); return true;
    case 5: *v = ws_variant<256, 1>(); return true;
    case 6: *v = ws_variant<256, 1, true>(); return true;
    case 7: *v = ws_variant<128, 1, false, 3>(); return true;
    default: return false;
  }
}

// Clusters of (1, size, 1) blocks of `fn` that fit on the GPU at once (0 if the driver cannot say),
// asked once per device, kernel and size (its shared-memory attribute set to `smem` first).
int max_active_clusters(const void* fn, int threads, int smem, int size) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, int> known;
  int device = 0;
  cudaGetDevice(&device);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, fn, size);
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) cudaGetLastError();
  cudaLaunchAttribute attribute = cluster_attribute(size);
  const cudaLaunchConfig_t config = launch_config(dim3(1, size, 1), dim3(threads), smem, nullptr, &attribute, 1);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, fn, &config) != cudaSuccess) {
    cudaGetLastError();  // (clear it: the answer is "unknown")
    clusters = 0;
  }
  known[key] = clusters;
  return clusters;
}

// The most splits up to `splits` whose clusters (one per output tile, `tiles` of them) take no more
// waves than the same blocks would on free SMs: a GPC whose SM count the cluster size does not
// divide leaves SMs out, so 4 clusters of 32 may need two waves where 128 blocks need one.
int fit_cluster_splits(const void* fn, int threads, int smem, int64_t tiles, int splits, int64_t blocks_per_wave) {
  for (; splits > 1; --splits) {
    const int64_t clusters = max_active_clusters(fn, threads, smem, splits);
    if (clusters > 0 && (tiles + clusters - 1) / clusters <= (tiles * splits + blocks_per_wave - 1) / blocks_per_wave)
      break;
  }
  return splits;
}

// Split-K only to fill SMs that would otherwise idle, and only over at least kWsSplitMinKblocks
// k-blocks a split: below that the reduction outweighs the k-blocks it spreads.
constexpr int kWsSplitMinKblocks = 8;
int ws_auto_splits(int64_t blocks, int kblocks, int sms) {
  const int64_t want = blocks < sms ? sms / blocks : 1;
  const int64_t by_k = kblocks / kWsSplitMinKblocks, cap = by_k < kMaxClusterSplits ? by_k : kMaxClusterSplits;
  const int64_t splits = want < cap ? want : cap;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

// Split-K's reduction, in k-blocks of a block's time: each block stores its partial tile, the
// cluster's barriers wait for its slowest block, and the blocks read S slices of a tile about a
// k-block's stage in bytes: S + kSplitBaseCost.
constexpr int64_t kSplitBaseCost = 2;

// A persistent launch without split-K: `ctas` blocks (one per SM at most) over `tiles` tiles, the
// last `sk_tiles` of them shared out by stream-K among the first `sk_blocks`; `waves`, in
// thousandths, the tiles' time a block. Stream-K takes a last wave where its shares plus
// kStreamKCost (the partials, and weights no longer shared through L2 by blocks each at its own
// k-block) come to less than a wave, each block's share then at least half a tile. Past a whole
// wave, the last whole wave joins that share, spread over every block, where that gains more than
// the extra cuts cost. Every range is then longer than a tile, so a tile is cut once at most: its
// later piece comes first in its block's range and is stored long before the tile's first block,
// whose piece ends its range, adds it. It gains where the last wave alone would leave ranges
// shorter than a tile (tiles in three pieces, the middle one stored while the tile's first block
// waits for it), or where the last wave is at most 40% of one (its halves on at most 80% of the
// blocks: the even spread is a tenth of a tile shorter or more). H100, against the last wave
// alone: 1-4% faster on the pairs' 4096x14336 at M = 1024 and 8192x28672 and 4096x28672 at M = 256
// and 512, level on 4096x14336 at M = 512, 4% slower on 4096x6144 at M = 1024 (a last wave of 30
// pairs on 66 clusters, left to itself; dev/LOG.md). A launch of fewer tiles than half the SMs
// (where split-K is the planner's usual choice) spreads its k-blocks over every SM where the
// shares plus kStreamKCutKblocks a cut come to less than 90% of a tile's k-blocks: there a tile is
// cut into about SMs / tiles pieces, whose 64-128 KB fp32 partials the blocks store at the end of
// their ranges, all at once, and the tile's first block then reads in turn (about 3 k-blocks of
// the tile's variant a cut; H100, dev/LOG.md).
struct WsSpread {
  static constexpr int64_t kStreamKCost = 250;  // thousandths of a wave (H100, dev/LOG.md)
  static constexpr int64_t kStreamKCutKblocks = 3;
  int ctas, sk_tiles, sk_blocks;
  int64_t waves;
  WsSpread(int64_t tiles, int kblocks, int sms) {
    const int64_t rest = tiles % sms, whole = tiles / sms, steps = rest * kblocks;
    if (whole == 0 && 2 * rest <= sms) {
      const int64_t blocks = steps < sms ? steps : sms;
      // thousandths of a k-block
      const int64_t cost = steps * 1000 / blocks + kStreamKCutKblocks * 1000 * blocks / tiles;
      const bool sk = cost * 10 < 9 * 1000 * int64_t{kblocks};
      sk_tiles = sk ? static_cast<int>(tiles) : 0;
      sk_blocks = ctas = sk ? static_cast<int>(blocks) : static_cast<int>(tiles);
      waves = sk ? cost / kblocks : 1000;
      return;
    }
    const int64_t share = 2 * rest < sms ? 2 * rest : sms;
    const int64_t blocks = steps < share ? steps : share;
    const bool sk = rest > 0 && rest * 1000 / blocks + kStreamKCost < 1000;
    const bool with_a_wave = whole > 0 && (2 * rest > sms || 5 * rest <= 2 * sms);
    sk_tiles = sk ? static_cast<int>(with_a_wave ? rest + sms : rest) : 0;
    sk_blocks = sk ? static_cast<int>(with_a_wave ? sms : blocks) : 0;
    ctas = whole > 0 ? sms : sk ? sk_blocks : static_cast<int>(tiles);
    // (priced as the last wave alone, as the variant costs were fitted)
    waves = whole * 1000 + (sk ? rest * 1000 / blocks + kStreamKCost : rest > 0 ? 1000 : 0);
  }
};

// The variant whose waves of blocks cost least: the waves (whole ones with split-K, WsSpread's
// without) x the block's MT x R
// x (its k-blocks, plus a split-K reduction's, at the split count whose clusters fit, as the
// launch will run it) x the variant's cost per unit of work (relative to variant 5: smaller tiles
// pay more conversion and shared-memory traffic per MMA). H100, fitted to the medians of four
// sweeps of every variant at its automatic split on the seven Llama shapes at M = 64-1024, where
// this pick is within 3% of the best on 34 of 35 cells (7% off on 28672x8192 at M = 128), and
// checked on 8192x10240, 4096x28672 and 8192x57344 at M = 64-512 (within 3% on all 12; dev/LOG.md).
// Variant 2 at 140 rather than the fit's 130: between the tables' sizes, where its 64-token tiles
// stream each weight once a tile, two to four times as often as the tiles it competes with, 130
// chose it on 8192x28672 at M = 129-192 and on 4096x14336 at M = 513-576, 10-15% slower than
// variant 5 or 4 (H200); 140 gives those to them and changes no pick at the tables' M (replayed
// by dev/probes/variant_model.py).
// The pairs' clusters that run at once (a GPC of an odd SM count leaves one SM out of them).
int64_t pair_clusters(const WsVariant& v, int sms) {
  const int fit = max_active_clusters(reinterpret_cast<const void*>(v.pair), v.threads, v.smem, 2);
  return fit > 0 && fit < sms / 2 ? fit : sms / 2;
}
// Whether the driver says how many of them fit: stream-K over the pairs needs that (its ranges
// must all be resident), where pair_clusters' half the SMs is only a guess.
bool pair_clusters_known(const WsVariant& v) {
  return max_active_clusters(reinterpret_cast<const void*>(v.pair), v.threads, v.smem, 2) > 0;
}

constexpr int64_t kPairsMinFill = 95, kPairsOneWaveFill = 70;  // percent
int default_ws_variant(int64_t M, int64_t K, int64_t N, int sms) {
  static constexpr int kTokens[8] = {0, 64, 64, 128, 128, 256, 0, 128}, kRows[8] = {0, 128, 256, 128, 256, 128, 0, 192};
  static constexpr int64_t kCost[8] = {0, 210, 140, 130, 100, 100, 0, 110};
  const int kblocks = static_cast<int>((K + 127) / 128);
  auto cost_of = [&](int v) {
    const int64_t blocks = (N + kRows[v] - 1) / kRows[v] * ((M + kTokens[v] - 1) / kTokens[v]);
    WsVariant variant;
    pick_ws_variant(v, &variant);
    const int splits = fit_cluster_splits(reinterpret_cast<const void*>(variant.fn[1][1]), variant.threads,
                                          variant.smem, blocks, ws_auto_splits(blocks, kblocks, sms), sms);
    const int64_t per_block = (kblocks + splits - 1) / splits + (splits > 1 ? splits + kSplitBaseCost : 0);
    // in thousandths of a wave: split-K clusters run in whole waves
    const int64_t waves = splits > 1 ? (blocks * splits + sms - 1) / sms * 1000 : WsSpread(blocks, kblocks, sms).waves;
    return waves * kTokens[v] * kRows[v] * kCost[v] * per_block;
  };
  int best = 5;
  int64_t best_cost = INT64_MAX;
  for (int v = 5; v >= 1; --v) {  // ties go to the larger tile
    const int64_t cost = cost_of(v);
    if (cost < best_cost) best_cost = cost, best = v;
  }
  if (best == 5 && M >= 256) {
    // Variant 5 in pairs (6) from one token tile on: the same cycles a k-block at a higher clock,
    // the activations' L2 traffic halved under the power limit (dev/LOG.md). Past one wave of
    // pairs, as variant 5 runs them (whole waves, the last shared out by stream-K where that pays,
    // WsSpread) where the driver says how many clusters fit (stream-K's ranges must all be
    // resident): H100, 1.4-2.4% faster at M = 256 on 4096x28672, 8192x28672 and 8192x57344, 1-4.5%
    // at M = 512-1024. Otherwise only from two token tiles on (one token tile's single wave of
    // pairs measured level with variant 5), where whole waves of pairs leave at most 5% of the
    // clusters idle or one wave fills at least kPairsOneWaveFill of them: there variant 5's
    // stream-K cuts every tile, and its fix-up, a 128 KB partial stored and read at the end of the
    // ranges, costs more than the idle clusters (H100: 4096x6144 at M = 512, 48 pairs on 66
    // clusters, 4% faster; 48 pairs on N = 4096 at M = 640 within 1%).
    WsVariant pair;
    pick_ws_variant(6, &pair);
    const int64_t clusters = pair_clusters(pair, sms);
    const int64_t pairs = walk_units(true, static_cast<int>((M + pair.tokens - 1) / pair.tokens),
                                     static_cast<int>((N + pair.rows - 1) / pair.rows));
    if (pairs > clusters && pair_clusters_known(pair)) return 6;
    if (M > 256 && (pairs * 100 >= kPairsMinFill * ((pairs + clusters - 1) / clusters * clusters) ||
                    (pairs <= clusters && pairs * 100 >= kPairsOneWaveFill * clusters))) {
      // One wave of variant 7's tiles where N is whole row blocks of 192, rather than one wave of
      // pairs: 4096x6144 at M = 512 is 128 tiles of 128 x 192 on 128 SMs against 48 pairs on 96.
      // Alternately against the pairs: 3% faster at M = 400, 7% at 448, 4% at 512 (H100); 2%, 4%
      // and 3% (H200). Variant 7's tiles in pairs ran level with variant 5's at M = 448-512 and
      // 10-13% slower than the planner at 768-1024 (dev/LOG.md).
      const int64_t tiles7 = N / kRows[7] * ((M + kTokens[7] - 1) / kTokens[7]);
      return pairs <= clusters && N % kRows[7] == 0 && tiles7 <= sms ? 7 : 6;
    }
  }
  // Variant 7's 192-row tiles fill the SMs where 128 and 256 rows do not divide evenly: 4096x6144
  // at M = 256 is 64 tiles of 192 x 128 at S = 2 on 128 SMs against variant 5's 48 of 128 x 256
  // on 96; 14336x4096 at M = 128 22 row blocks at S = 5 on 110 against variant 4's 16 at S = 6 on
  // 96. Priced by the same model at 110 a unit of work (between variants 4 and 3, whose tiles have
  // as many tokens), only up to one token tile, or two where N is whole row blocks of 192: with two
  // token tiles and a last row block a third full (8192x10240 at M = 200-256) it ran 11-15% slower,
  // and on 4096x4096 at M = 128-512 6-22% slower (H100 and H200, dev/LOG.md). H100, against the
  // model's pick: 4096x6144 at M = 144-256 8-12% faster, 14336x4096 at M = 80-128 4-8%, 8192x10240
  // at M = 128 13%.
  if (M <= 256 && (M <= 128 || N % kRows[7] == 0) && cost_of(7) < best_cost) return 7;
  return best;
}

// The k order of a launch (`order`: 0 = by the rule below, 1 = permuted, 2 = natural; false when
// natural is asked of a layer it cannot take). x as it lies costs each lane about a quarter more
// work a weight (the header's "k order"); the permuted order costs a pass over x (read x, write
// x_perm) and a launch. Natural where a stage has one scale and zero a row (run_slots == 1) and
// either the tiles have 128 tokens or more (the conversion is then hidden under the tensor cores'
// work) or the layer has fewer than `small` weights, where the pass over x costs more than the
// conversion: 2^25 for the barrier kernel, 2^26 for the warp-specialised one (H100, dev/LOG.md).
bool pick_k_order(int order, int64_t K, int64_t N, int64_t G, int tokens, int64_t small, int* natural) {
  const bool one_run = G == K || G % 128 == 0;
  if (order < 0 || order > 2 || (order == 2 && !one_run)) return false;
  *natural = order == 2 || (order == 0 && one_run && (tokens >= 128 || K * N < small)) ? 1 : 0;
  return true;
}
constexpr int64_t kWgmmaSmallLayer = int64_t{1} << 25, kWsSmallLayer = int64_t{1} << 26;

// One thread per 16-byte chunk of x_perm [M, Kp]: chunk oc (0..15) of row m's 128-k block b holds
// the fp16 pairs 16 t + oc (t = 0..3) of that block of x (the header's permuted order, in pairs),
// zero past K. Lets the GEMM launch at once (PDL): it copies its first stage's weights meanwhile.
__global__ void __launch_bounds__(256) permute_x_kernel(const uint32_t* __restrict__ x, uint4* __restrict__ xp,
                                                        int M, int K, int kblocks) {
  pdl_launch_dependents();
  pdl_wait();  // x is the previous kernel's output
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

// The x a launch stages, and its row length: x itself, or x_perm [M, Kp] at the scratch's start,
// written by permute_x_kernel (launched here, `pdl` as asked; the GEMM then follows it with PDL).
// The permute kernel asks for the largest shared-memory carveout, the GEMMs' own: under PDL the
// GEMM's blocks are placed while its blocks still run, and an SM that would have to change its
// carveout first took none of them until it drained (the reading that fits the H100's numbers:
// 14336x4096 at M = 24-32 7-15% faster with it, and no launch whose last cluster waits a whole
// wave; dev/LOG.md).
cudaError_t stage_x(bool natural, const void* x, void* scratch, int64_t M, int64_t K, bool* pdl, cudaStream_t stream,
                    const void** staged, int* cols) {
  if (natural) {
    *staged = x;
    *cols = static_cast<int>(K);
    return cudaSuccess;
  }
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int64_t chunks = M * kblocks * 16;
  *staged = scratch;
  *cols = kblocks * 128;
  cudaError_t err = cudaFuncSetAttribute(permute_x_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) return err;
  err = launch_kernel(permute_x_kernel, dim3(static_cast<unsigned>((chunks + 255) / 256)), dim3(256), 0, stream, *pdl, 1,
                      static_cast<const uint32_t*>(x), static_cast<uint4*>(scratch), static_cast<int>(M),
                      static_cast<int>(K), kblocks);
  *pdl = true;
  return err;
}

int64_t x_perm_bytes(bool natural, int64_t M, int64_t K) { return natural ? 0 : M * ((K + 127) / 128) * 128 * 2; }

}  // namespace

cudaError_t plan_gemm_w4a16_wgmma(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int tiles, int order,
                                  BatchPlan* plan) {
  int device = 0, sms = 132, per_sm = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Two m64 tiles a warpgroup (256 rows a block) halve the activation reads a weight byte. They win
  // where four splits of the layer's 256-row blocks fill at least 15/16 of the SMs (N >= 8192 on
  // 132 SMs), and lose where fewer row blocks need eight splits of a few k-blocks each or leave
  // SMs idle (H100 at M = 17-32, dev/LOG.md: 17-19% faster on 28672x8192 at M <= 24 and on
  // 8192x10240, 2-9% on 8192x8192; 30-40% slower on 14336x4096 and 4096x4096, 4-12% on 4096x6144).
  // At M > 64 only one fits in registers.
  const bool fill_alone = rows256_fill_alone(N, sms), fill_split = rows256_fill_split(N, sms);
  if (tiles == 0) tiles = M <= 64 && (fill_alone || fill_split) ? 2 : 1;
  WgVariant v;
  int natural = 0;
  if (!wgmma_shapes_ok(M, kWgmmaMaxM, K, N, G) || splits < 0 || splits > 64 ||
      !pick_wg_variant(M, tiles, wg_post_scale(M, K, G, tiles), &v) ||
      !pick_k_order(order, K, N, G, v.tokens, kWgmmaSmallLayer, &natural))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  for (int split = 0; split < 2 && err == cudaSuccess; ++split)
    err = cudaFuncSetAttribute(v.fn[natural][split], cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem);
  if (err != cudaSuccess) return err;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fn[natural][0], kBatchThreads, v.smem);
  if (err != cudaSuccess) return err;
  per_sm = per_sm < 1 ? 1 : per_sm;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int row_blocks = static_cast<int>((N + v.rows - 1) / v.rows);
  const int64_t stage_bytes = (int64_t)v.rows * 64 + (int64_t)v.tokens * 256;
  plan_splits(splits, kblocks, row_blocks, sms, per_sm, stage_bytes, M, v.rows, SplitSum::kCluster, plan);
  if (splits == 0) {
    const int fit = fit_cluster_splits(reinterpret_cast<const void*>(v.fn[natural][1]), kBatchThreads, v.smem,
                                       row_blocks, plan->splits, (int64_t)sms * per_sm);
    if (fit != plan->splits)
      plan_splits(fit, kblocks, row_blocks, sms, per_sm, stage_bytes, M, v.rows, SplitSum::kCluster, plan);
  }
  plan->row_blocks = row_blocks;
  plan->rows = v.rows;
  plan->tiles = tiles;
  plan->m_tiles = 1;
  plan->kernel = 2;
  plan->natural = natural;
  // Past 24 tokens on more than 64 k-blocks, where four splits of the row blocks fill the SMs and
  // the row blocks alone do not (28672x8192 at M = 25-32), two tiles launched under PDL after their
  // permute kernel ran in one of two modes from one launch to the next (H100: 57 or 67-69 us at
  // M = 25-28, 68-69 at 32: one cluster in a second wave, dev/probes/barrier_timeline.py); launched
  // after it without PDL they run a steady 59-61, faster than one tile (66) and the mma.sync
  // kernel (64-72; the H200 alike). At M <= 24 the same launch is steady under PDL, and 4% slower
  // without it.
  plan->permute_pdl = natural || tiles != 2 || M <= 24 || kblocks <= 64 || !fill_split || fill_alone ? 1 : 0;
  plan->ctas = plan->sk_tiles = plan->sk_blocks = 0;
  plan->scratch_bytes = x_perm_bytes(natural, M, K);
  return cudaSuccess;
}

cudaError_t launch_gemm_w4a16_wgmma(const void* x, void* scratch, const int32_t* qweight, const int32_t* qzeros,
                                    const void* scales, const void* bias, void* y, int64_t M, int64_t K, int64_t N,
                                    int64_t G, const BatchPlan& plan, bool pdl, cudaStream_t stream) {
  WgVariant v;
  int natural = 0;
  if (!wgmma_shapes_ok(M, kWgmmaMaxM, K, N, G) || !pick_wg_variant(M, plan.tiles, wg_post_scale(M, K, G, plan.tiles), &v) ||
      v.rows != plan.rows ||
      plan.splits < 1 || plan.splits > kMaxClusterSplits ||
      !pick_k_order(plan.natural ? 2 : 1, K, N, G, v.tokens, kWgmmaSmallLayer, &natural) ||
      plan.scratch_bytes != x_perm_bytes(natural, M, K) || (!natural && scratch == nullptr) ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return cudaErrorInvalidValue;
  const void* staged = nullptr;
  int cols = 0;
  const cudaError_t err = stage_x(natural, x, scratch, M, K, &pdl, stream, &staged, &cols);
  if (err != cudaSuccess) return err;
  if (!natural && !plan.permute_pdl) pdl = false;
  BatchArgs a = batch_args(staged, qweight, qzeros, scales, bias, y, nullptr, nullptr, M, K, N, G);
  a.x_stride = a.x_cols = cols;
  a.kb_per_split = plan.kb_per_split;
  a.splits = plan.splits;
  CUtensorMap wmap, xmap;  // x's boxes of M rows: none reaches past the map (the copy engine's slow zero fill)
  cudaError_t map_err = weight_tensor_map(qweight, N, a.kblocks, v.rows / 8, natural, &wmap);
  if (map_err == cudaSuccess) map_err = x_tensor_map(staged, M, cols, static_cast<int>(M), &xmap);
  if (map_err != cudaSuccess) return map_err;
  return launch_kernel(v.fn[natural][plan.splits > 1], dim3(plan.row_blocks, plan.splits), dim3(kBatchThreads), v.smem,
                       stream, pdl, plan.splits, a, wmap, xmap);
}

// The scratch of a warp-specialised launch: x_perm [M, Kp] fp16 in the permuted order, then, with
// stream-K, the partials [slots, MT x R] fp32 and the flags [slots] int32, a slot a block that
// shares out the last wave (stream_k_slot: two a cluster in a pairs launch).
struct WsScratch {
  int64_t x_bytes, partial_bytes, flag_bytes;
  WsScratch(bool natural, int64_t M, int64_t K, int slots, int tokens, int rows)
      : x_bytes(x_perm_bytes(natural, M, K)), partial_bytes((int64_t)slots * tokens * rows * 4),
        flag_bytes((int64_t)slots * 4) {}
  int64_t total() const { return x_bytes + partial_bytes + flag_bytes; }
};
int sk_slots(int sk_blocks, const WsVariant& v) { return v.pair != nullptr ? 2 * sk_blocks : sk_blocks; }

cudaError_t plan_gemm_w4a16_ws(int64_t M, int64_t K, int64_t N, int64_t G, int splits, int variant, int order,
                               BatchPlan* plan) {
  int device = 0, sms = 132;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (!wgmma_shapes_ok(M, kWsMaxM, K, N, G) || splits < 0 || splits > 64) return cudaErrorInvalidValue;
  if (variant == 0) {
    variant = default_ws_variant(M, K, N, sms);
    if (variant == 6 && (splits > 1 || order == 1 || !(G == K || G % 128 == 0))) variant = 5;  // (the pairs' limits)
  }
  WsVariant v;
  int natural = 0;
  if (!pick_ws_variant(variant, &v) || !pick_k_order(order, K, N, G, v.tokens, kWsSmallLayer, &natural) ||
      (v.pair != nullptr && (!natural || splits > 1)))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  for (int split = 0; split < 2 && err == cudaSuccess; ++split)
    err = cudaFuncSetAttribute(v.fn[natural][split], cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem);
  if (err == cudaSuccess && v.pair != nullptr)
    err = cudaFuncSetAttribute(v.pair, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem);
  if (err != cudaSuccess) return err;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int row_blocks = static_cast<int>((N + v.rows - 1) / v.rows);
  const int m_tiles = static_cast<int>((M + v.tokens - 1) / v.tokens);
  const int64_t tiles = (int64_t)row_blocks * m_tiles;
  const WsSpread spread(tiles, kblocks, sms);
  if (v.pair != nullptr) {
    splits = 1;  // (the pairs: no split)
  } else if (splits == 0) {
    splits = fit_cluster_splits(reinterpret_cast<const void*>(v.fn[natural][1]), v.threads, v.smem, tiles,
                                ws_auto_splits(tiles, kblocks, sms), sms);
    // split-K against stream-K over every SM, in thousandths of a k-block of one block's time:
    // clusters need whole GPCs' worth of free SMs, so the S that fits can leave SMs idle
    const int64_t split_cost = ((kblocks + splits - 1) / splits + splits + kSplitBaseCost) * 1000;
    if (splits > 1 && spread.sk_tiles > 0 && spread.waves * kblocks * 10 < 9 * split_cost) splits = 1;
  }
  plan_splits(splits, kblocks, row_blocks * m_tiles, sms, 1, (int64_t)v.rows * 64 + (int64_t)v.tokens * 256,
              M < v.tokens ? M : v.tokens, v.rows, SplitSum::kCluster, plan);
  plan->row_blocks = row_blocks;
  plan->m_tiles = m_tiles;
  plan->rows = v.rows;
  plan->tiles = variant;
  plan->kernel = 3;
  plan->natural = natural;
  const bool persistent = plan->splits == 1;
  if (v.pair != nullptr) {  // the pairs of tiles, a cluster of two blocks each, as many as run at once
    const int64_t pairs = walk_units(v.pair != nullptr, m_tiles, row_blocks), clusters = pair_clusters(v, sms);
    // Past one wave, a last wave shared out by stream-K as variant 5's, over the clusters
    // (WsSpread), where the driver says how many fit (stream-K's ranges must all be resident);
    // within one, the pairs' one wave, whose stream-K would cut every pair (variant 5's lost to the
    // pairs' one wave: H100, 4096x6144 at M = 512, dev/LOG.md).
    const WsSpread pair_spread(pairs, kblocks, static_cast<int>(clusters));
    const bool sk = pairs > clusters && pair_spread.sk_tiles > 0 && pair_clusters_known(v);
    plan->ctas = 2 * static_cast<int>(pairs < clusters ? pairs : clusters);
    plan->sk_tiles = sk ? pair_spread.sk_tiles : 0;
    plan->sk_blocks = sk ? pair_spread.sk_blocks : 0;
  } else {
    plan->ctas = persistent ? spread.ctas : 0;
    plan->sk_tiles = persistent ? spread.sk_tiles : 0;
    plan->sk_blocks = persistent ? spread.sk_blocks : 0;
  }
  plan->scratch_bytes = WsScratch(natural, M, K, sk_slots(plan->sk_blocks, v), v.tokens, v.rows).total();
  return cudaSuccess;
}

cudaError_t launch_gemm_w4a16_ws(const void* x, void* scratch, const int32_t* qweight, const int32_t* qzeros,
                                 const void* scales, const void* bias, void* y, int64_t M, int64_t K, int64_t N,
                                 int64_t G, const BatchPlan& plan, bool pdl, cudaStream_t stream) {
  WsVariant v;
  int natural = 0;
  if (!wgmma_shapes_ok(M, kWsMaxM, K, N, G) || !pick_ws_variant(plan.tiles, &v) || v.rows != plan.rows ||
      !pick_k_order(plan.natural ? 2 : 1, K, N, G, v.tokens, kWsSmallLayer, &natural) || plan.splits < 1 ||
      plan.splits > kMaxClusterSplits || plan.m_tiles != (M + v.tokens - 1) / v.tokens ||
      plan.row_blocks != (N + v.rows - 1) / v.rows || (plan.splits > 1) != (plan.ctas == 0) || plan.sk_tiles < 0 ||
      (v.pair != nullptr && (!natural || plan.splits != 1 || plan.ctas % 2 != 0)))
    return cudaErrorInvalidValue;
  // stream-K's walk units (tiles, or pairs of them) and the ranges that share them (blocks, or clusters)
  const int64_t units = walk_units(v.pair != nullptr, plan.m_tiles, plan.row_blocks);
  const int ranges = v.pair != nullptr ? plan.ctas / 2 : plan.ctas;
  if (plan.sk_blocks < (plan.sk_tiles > 0 ? 1 : 0) || plan.sk_blocks > ranges || plan.sk_tiles > units)
    return cudaErrorInvalidValue;
  const WsScratch layout(natural, M, K, sk_slots(plan.sk_blocks, v), v.tokens, v.rows);
  if (plan.scratch_bytes != layout.total() || (layout.total() > 0 && scratch == nullptr) ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return cudaErrorInvalidValue;
  if (plan.sk_tiles > 0) {  // stream-K's blocks wait on later ones: all must be resident at once (one an SM)
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (ranges > (v.pair != nullptr ? pair_clusters(v, sms) : sms)) return cudaErrorInvalidValue;
  }
  char* bytes = static_cast<char*>(scratch);
  float* partial = plan.sk_blocks > 0 ? reinterpret_cast<float*>(bytes + layout.x_bytes) : nullptr;  // 256 B aligned
  int* flags = plan.sk_blocks > 0 ? reinterpret_cast<int*>(bytes + layout.x_bytes + layout.partial_bytes) : nullptr;
  const void* staged = nullptr;
  int cols = 0;
  cudaError_t err = stage_x(natural, x, scratch, M, K, &pdl, stream, &staged, &cols);
  if (err != cudaSuccess) return err;
  BatchArgs a = batch_args(staged, qweight, qzeros, scales, bias, y, partial, flags, M, K, N, G);
  a.kb_per_split = plan.kb_per_split;
  a.splits = plan.splits;
  a.m_tiles = plan.m_tiles;
  a.row_blocks = plan.row_blocks;
  a.sk_tiles = plan.sk_tiles;
  a.sk_blocks = plan.sk_blocks;
  // the last token tile's tokens: a box of its own where M leaves it part empty (the header's xtail)
  const int tail_tokens = static_cast<int>(M - (int64_t)(plan.m_tiles - 1) * v.tokens);
  CUtensorMap wmap, xmap, xtail;
  err = weight_tensor_map(qweight, N, a.kblocks, v.rows / 8, natural, &wmap);
  if (err == cudaSuccess) err = x_tensor_map(staged, M, cols, v.pair != nullptr ? v.tokens / 2 : v.tokens, &xmap);
  xtail = xmap;
  if (err == cudaSuccess && v.pair == nullptr && tail_tokens < v.tokens)
    err = x_tensor_map(staged, M, cols, tail_tokens, &xtail);
  if (err != cudaSuccess) return err;
  if (plan.sk_tiles > 0) {
    const int slots = sk_slots(plan.sk_blocks, v);
    err = launch_kernel(zero_flags_kernel, dim3(static_cast<unsigned>((slots + 255) / 256)), dim3(256), 0, stream, pdl,
                        1, flags, slots);
    if (err != cudaSuccess) return err;
    pdl = true;  // the GEMM starts under its own flags' kernel
  }
  if (v.pair != nullptr)  // (plan_gemm_w4a16_ws: natural order, no split)
    return launch_kernel(v.pair, dim3(plan.ctas / 2, 2), dim3(v.threads), v.smem, stream, pdl, 2, a, wmap, xmap,
                         xtail);
  return launch_kernel(v.fn[natural][plan.splits > 1],
                       plan.splits > 1 ? dim3(plan.row_blocks, plan.splits, plan.m_tiles) : dim3(plan.ctas),
                       dim3(v.threads), v.smem, stream, pdl, plan.splits, a, wmap, xmap, xtail);
}

}  // namespace w4
