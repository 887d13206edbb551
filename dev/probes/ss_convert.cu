// ss_convert.cu: whether MMA warps that only issue wgmmas, both operands in shared memory (SS),
// fed fp16 weights by converter warps, run closer to the tensor rate than the kernel's structure,
// where the MMA warps convert their own weights into wgmma's A registers (RS) (lab only; dev/LOG.md,
// twentieth session, step 8: the ring alone runs 1.3-2.2 times as fast as the kernel, the wgmma
// stream alone 12-20% above cuBLAS at M = 1024, so the MMA warps' own work is what to take away).
//
// One block an SM, two MMA warpgroups of one m64 tile each (128 rows, the kernel's variants 3 and
// 5), N tokens (64, 128, 256). A data stage is a k-block's x, two 64-k swizzle atoms of [N][128 B]
// (the B operand, as the kernel's x stage), then its packed weights, [4 chunks][128 rows][16 B]
// (8 KB: 16 words a row, word w holding k 8 w .. 8 w + 7). A k-block is 8 k16 steps. Modes:
//   rs_const  RS wgmmas, A registers set once, one data stage written once: the RS stream alone
//   rs_words  RS, each MMA warp converting its A fragments from the stage's packed words by whole
//             words (1 shift, 4 lop3, 2 sub, 2 fma, 4 mul for 8 weights), two steps a group, one
//             group in flight, as the kernel's wgmma_stage does: the best the kernel's structure gets
//             (its natural order converts by pairs, a quarter more)
//   ss_const  SS wgmmas from one fp16 A stage written once: the SS stream alone
//   ss_conv   converter warps convert each k-block's packed words into a 32 KB fp16 A stage (two
//             64-k atoms of [128 rows][128 B], the 128-byte swizzle), a ring of D2 stages on full /
//             empty mbarriers; the MMA warps wait for a stage, issue its wgmmas (8 a warpgroup) as one
//             group and release the stage once the next group is issued and that one has completed
//   rs_feed, ss_feed  rs_words and ss_conv fed as the kernel is: a producer warp (lane 0) refills a
//             ring of D1 data stages with bulk copies, x from a 2 MB buffer that stays in L2 and the
//             packed weights from a 512 MB one (DRAM), each block its own run of it; a data stage is
//             released by the MMA warps (x read) and, in ss_feed, the converters (packed words read)
// Roles by warpgroup: 0 and 1 MMA; then (ss_conv) CW converter warpgroups, or (rs_feed) one whose
// first warp is the producer, or (ss_feed) CW whose first warp is the producer and the rest convert.
// Registers as the kernel splits them (setmaxnreg): the MMA warps take what the others give up
// (two extra warpgroups only up to N = 128: ptxas compiles the whole kernel within the 128
// registers a thread that 512 threads start with, short of an m64n256 wgmma's).
// Per configuration: the median block's cycles a k-block against 8 N (128 rows x N tokens x 128 k
// at 2,048 multiply-adds a cycle an SM, the H100's dense fp16 rate).
//
//     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I kernels dev/probes/ss_convert.cu -o build/ss_convert
//     build/ss_convert [kblocks]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "int4_convert.cuh"  // kernels/, through -I kernels
#include "probe.cuh"

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(W4_HAS_WGMMA)
// mbar_wait's spin loop as one PTX loop: with w4::mbar_wait's C++ loop between the wgmmas' issue and
// their wait, ptxas serialised every wgmma of the MMA warps here (C7514), which this form avoids.
__device__ __forceinline__ void mbar_wait_in_ptx(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n W4_WAIT_%=:\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra W4_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// D[64, N] += A[64, 16] B[16, N], both K-major in shared memory by descriptor (smem_desc_sw128).
template <int N>
__device__ __forceinline__ void wgmma_m64k16_ss(float (&d)[N / 2], uint64_t a, uint64_t b);
template <>
__device__ __forceinline__ void wgmma_m64k16_ss<64>(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_m64k16_ss<128>(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_m64k16_ss<256>(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
        "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
        "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b));
}
#endif

struct Config {
  bool ss, convert, feed;
  const char* name;
};
constexpr Config kRsConst{false, false, false, "rs_const"}, kRsWords{false, true, false, "rs_words"},
    kSsConst{true, false, false, "ss_const"}, kSsConv{true, true, false, "ss_conv"},
    kRsFeed{false, true, true, "rs_feed"}, kSsFeed{true, true, true, "ss_feed"};

constexpr int kRows = 128;                  // two MMA warpgroups of one m64 tile each
constexpr uint32_t kAtomA = kRows * 128;    // one 64-k atom of fp16 A: [128 rows][128 B]
constexpr uint32_t kAStage = 2 * kAtomA;    // a k-block's fp16 A
constexpr uint32_t kPacked = kRows * 64;    // a k-block's packed words: [4 chunks][128 rows][16 B]
constexpr int kXStages = 32;                // x's source: 32 k-blocks' x, 2 MB at N = 256 (L2)
constexpr size_t kWBytes = size_t{512} << 20;  // the packed words' source (DRAM)

// the block: two MMA warpgroups, then CW converter warpgroups (SS with conversion) or one holding
// the producer (RS fed)
__host__ __device__ constexpr int block_threads(bool ss, bool convert, bool feed, int cw) {
  return 256 + (ss && convert ? 128 * cw : feed ? 128 : 0);
}
template <int N>
__host__ __device__ constexpr uint32_t data_stage() { return N * 256 + kPacked; }
template <int N, int D1, int D2>
constexpr uint32_t smem_bytes() { return D1 * data_stage<N>() + D2 * kAStage + 1024; }  // + room to align

#if defined(W4_HAS_WGMMA)
// The producer's lane 0: data stage kb of this block, x and packed words, as bulk copies.
template <int N, int D1>
__device__ void produce(const uint8_t* xsrc, const uint8_t* wsrc, int kblocks, uint32_t base, uint32_t data_full,
                        uint32_t data_empty) {
  constexpr uint32_t kX = N * 256, kDS = data_stage<N>();
  const size_t first = (size_t)blockIdx.x * kblocks, wstages = kWBytes / kPacked;
  int s = 0;
  uint32_t phase = 1;  // a stage's first use waits for nothing; its n-th for the (n - 1)-th release
  for (int kb = 0; kb < kblocks; ++kb) {
    if (kb >= D1) w4::mbar_wait(data_empty + 8 * s, phase);
    const uint32_t dst = base + s * kDS, bar = data_full + 8 * s;
    w4::mbar_arrive_expect_tx(bar, kDS);
    const uint8_t* x = xsrc + (size_t)((first + kb) % kXStages) * kX;
    for (uint32_t o = 0; o < kX; o += 16384) w4::bulk_copy_g2s(dst + o, x + o, min(16384u, kX - o), bar);
    w4::bulk_copy_g2s(dst + kX, wsrc + (first + kb) % wstages * kPacked, kPacked, bar);
    if (++s == D1) s = 0, phase ^= 1;
  }
  for (int kb = max(0, kblocks - D1); kb < kblocks; ++kb)  // no copy outlives its issuer
    w4::mbar_wait(data_full + 8 * (kb % D1), (kb / D1) & 1);
}

// Converter thread ct of nconv: 16-byte chunks of packed words (512 a k-block) into the fp16 A stage.
template <int N, int D1, int D2, bool kFeed>
__device__ void convert(uint8_t* sm, int ct, int nconv, int kblocks, uint32_t data_full, uint32_t data_empty,
                        uint32_t a_full, uint32_t a_empty) {
  constexpr uint32_t kDS = data_stage<N>(), kA = D1 * kDS;
  const w4::ZeroF16x8 zero = w4::row_zero(8);
  const uint32_t scale = 0x3C003C00u;
  int s = 0, t = 0;
  uint32_t data_phase = 0, a_phase = 1;
  for (int kb = 0; kb < kblocks; ++kb) {
    if (kFeed) w4::mbar_wait(data_full + 8 * s, data_phase);
    if (kb >= D2) w4::mbar_wait(a_empty + 8 * t, a_phase);
    const uint8_t* packed = sm + s * kDS + N * 256;
    uint8_t* a = sm + kA + t * kAStage;
    for (int u = ct; u < 512; u += nconv) {
      const int row = u & 127, chunk = u >> 7;
      const uint4 w = *reinterpret_cast<const uint4*>(packed + chunk * 2048 + row * 16);
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int unit = (4 * chunk + j) & 7;  // words 0-7 in atom 0, 8-15 in atom 1
        uint32_t d[4];
        w4::u4x8_minus_zero_f16x8(ws[j], zero, d);
        *reinterpret_cast<uint4*>(a + (chunk >> 1) * kAtomA + row * 128 + ((unit ^ (row & 7)) << 4)) =
            make_uint4(w4::mul_f16x2(d[0], scale), w4::mul_f16x2(d[1], scale), w4::mul_f16x2(d[2], scale),
                       w4::mul_f16x2(d[3], scale));
      }
    }
    w4::fence_proxy_async_shared();  // the wgmmas read the stage through the async proxy
    if (kFeed) w4::mbar_arrive(data_empty + 8 * s);
    w4::mbar_arrive(a_full + 8 * t);
    if (kFeed && ++s == D1) s = 0, data_phase ^= 1;
    if (++t == D2) t = 0, a_phase ^= 1;
  }
}
#endif

template <int N, int kC, int D1, int D2, int CW>
__global__ void __launch_bounds__(block_threads((kC >> 2) & 1, (kC >> 1) & 1, kC & 1, CW), 1)
    ss_kernel(int kblocks, const uint8_t* xsrc, const uint8_t* wsrc, unsigned long long* cycles, float* sink) {
#if defined(W4_HAS_WGMMA)
  constexpr bool kSs = (kC >> 2) & 1, kConvert = (kC >> 1) & 1, kFeed = kC & 1;
  constexpr int kThreads = block_threads(kSs, kConvert, kFeed, CW);
  constexpr bool kConverters = kSs && kConvert;
  constexpr uint32_t kDS = data_stage<N>(), kA = D1 * kDS;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  uint8_t* sm = smem_raw + (base - raw);
  __shared__ __align__(8) uint64_t bars[2 * (D1 + D2)];  // (D2 = 0: RS, no A ring)
  const uint32_t data_full = smem_addr(&bars[0]), data_empty = data_full + 8 * D1, a_full = data_empty + 8 * D1,
                 a_empty = a_full + 8 * D2;
  // the converters: every thread of the extra warpgroups, but the producer's warp where fed
  const int nconv = kConverters ? 128 * CW - (kFeed ? 32 : 0) : 0;
  for (uint32_t i = threadIdx.x; i < (kA + D2 * kAStage) / 16; i += kThreads)
    reinterpret_cast<uint4*>(sm)[i] = make_uint4(0, 0, 0, 0);  // x, packed words and A: zeros
  if (threadIdx.x == 0) {
    for (int s = 0; s < D1; ++s) {
      w4::mbar_init(data_full + 8 * s, 1);               // the producer's arrival, with the bytes
      w4::mbar_init(data_empty + 8 * s, 256 + nconv);    // every MMA and converter thread
    }
    for (int t = 0; t < D2; ++t) {
      w4::mbar_init(a_full + 8 * t, nconv > 0 ? nconv : 1);  // every converter thread, after its proxy fence
      w4::mbar_init(a_empty + 8 * t, 256);                  // every MMA thread, after its wait
    }
    w4::fence_mbar_init();
  }
  w4::fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  if constexpr (kThreads > 256) {
    constexpr int kMmaRegs = kThreads == 384 ? 216 : 192, kOtherRegs = kThreads == 384 ? 72 : 64;
    static_assert(2 * kMmaRegs + (kThreads / 128 - 2) * kOtherRegs == (kThreads / 128) * (65536 / kThreads / 8 * 8),
                  "the block's pool");
    if (warp >= 8) {
      w4::setmaxnreg_dec<kOtherRegs>();
      if (kFeed && warp == 8) {
        if (threadIdx.x == 256) produce<N, D1>(xsrc, wsrc, kblocks, base, data_full, data_empty);
      } else if (kConverters) {
        convert<N, D1, D2, kFeed>(sm, threadIdx.x - 256 - (kFeed ? 32 : 0), nconv, kblocks, data_full, data_empty,
                                  a_full, a_empty);
      }
      return;
    }
    w4::setmaxnreg_inc<kMmaRegs>();
  }
  const int wg = warp >> 2, lane = threadIdx.x & 31;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  const unsigned long long t0 = clock64();
  // stages and phases as running counters (kb % 3 made ptxas serialise the wgmmas, C7514)
  int s = 0, t = 0, prev_s = 0, prev_t = 0;
  uint32_t data_phase = 0, a_phase = 0;
  if constexpr (kSs) {
    for (int kb = 0; kb < kblocks; ++kb) {
      if (kConvert) mbar_wait_in_ptx(a_full + 8 * t, a_phase);
      if (kFeed) mbar_wait_in_ptx(data_full + 8 * s, data_phase);
      const uint32_t a0 = base + kA + t * kAStage + wg * 64 * 128, x0 = base + s * kDS;  // this warpgroup's rows
      // a step's descriptors as offsets to the stage's (the address field, 16-byte units in bits 0-13,
      // never carries within shared memory): computed whole for each step, they left ptxas too few
      // uniform registers in ss_feed, and it serialised the wgmmas (C7514)
      const uint64_t da = w4::smem_desc_sw128(a0), dx = w4::smem_desc_sw128(x0);
      w4::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 8; ++j)
        wgmma_m64k16_ss<N>(acc, da + (((j >> 2) * kAtomA + (j & 3) * 32) >> 4),
                           dx + (((j >> 2) * (N * 128) + (j & 3) * 32) >> 4));
      w4::wgmma_commit();
      w4::wgmma_wait<1>();
      if (kb > 0) {
        if (kConvert) w4::mbar_arrive(a_empty + 8 * prev_t);
        if (kFeed) w4::mbar_arrive(data_empty + 8 * prev_s);
      }
      prev_s = s, prev_t = t;
      if (kConvert && ++t == D2) t = 0, a_phase ^= 1;
      if (kFeed && ++s == D1) s = 0, data_phase ^= 1;
    }
  } else {
    uint32_t af[2][8];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 8; ++i) af[r][i] = 0x3C003C00u ^ (threadIdx.x + 7 * i + r);  // fp16 near 1.0
    const w4::ZeroF16x8 zero = w4::row_zero(8);
    const uint32_t scale = 0x3C003C00u;
    uint4 words[2];
    for (int kb = 0; kb < kblocks; ++kb) {
      if (kFeed) mbar_wait_in_ptx(data_full + 8 * s, data_phase);
      const uint64_t dx = w4::smem_desc_sw128(base + s * kDS);
#pragma unroll
      for (int g = 0; g < 4; ++g) {  // a group: two k16 steps, as the kernel's word
        uint32_t(&a)[8] = af[g & 1];
        if constexpr (kConvert) {
          if (g == 0) {  // the k-block's 8 words of this thread: two 16-byte chunks
            const uint8_t* packed = sm + s * kDS + N * 256 + (threadIdx.x & 127) * 16 + 2 * (lane & 1) * 2048;
            words[0] = *reinterpret_cast<const uint4*>(packed);
            words[1] = *reinterpret_cast<const uint4*>(packed + 2048);
          }
          const uint4 w = words[g >> 1];
          const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t d[4];
            w4::u4x8_minus_zero_f16x8(ws[2 * (g & 1) + h], zero, d);
#pragma unroll
            for (int p = 0; p < 4; ++p) a[4 * h + p] = w4::mul_f16x2(d[p], scale);
          }
        }
        w4::wgmma_fence();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * g + h;
          w4::wgmma_m64k16_rs<N>(acc, a[4 * h], a[4 * h + 1], a[4 * h + 2], a[4 * h + 3],
                                 dx + (((j >> 2) * (N * 128) + (j & 3) * 32) >> 4));
        }
        w4::wgmma_commit();
        w4::wgmma_wait<1>();
        if (kFeed && g == 0 && kb > 0) w4::mbar_arrive(data_empty + 8 * prev_s);  // the previous k-block is done
      }
      prev_s = s;
      if (kFeed && ++s == D1) s = 0, data_phase ^= 1;
    }
  }
  w4::wgmma_wait<0>();
  const unsigned long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sum += acc[i];
  if (sum == 12345.f) sink[threadIdx.x] = sum;  // keeps the accumulators live
#endif
}

constexpr int code(const Config& c) { return (c.ss ? 4 : 0) | (c.convert ? 2 : 0) | (c.feed ? 1 : 0); }

struct Buffers {
  int sms, kblocks;
  const uint8_t *xsrc, *wsrc;
  unsigned long long* cycles;
  float* sink;
};

template <int N, int kC, int D1 = 1, int D2 = 0, int CW = 1>
void run(const Buffers& b, const char* name) {
  constexpr bool kSs = (kC >> 2) & 1, kConvert = (kC >> 1) & 1, kFeed = kC & 1;
  constexpr uint32_t smem = smem_bytes<N, D1, D2>();
  static_assert(smem <= 227 * 1024, "the opt-in limit");
  auto fn = ss_kernel<N, kC, D1, D2, CW>;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int rep = 0; rep < 2; ++rep)  // (the first warms up)
    fn<<<b.sms, block_threads(kSs, kConvert, kFeed, CW), smem>>>(b.kblocks, b.xsrc, b.wsrc, b.cycles, b.sink);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> c(b.sms);
  CK(cudaMemcpy(c.data(), b.cycles, b.sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::sort(c.begin(), c.end());
  const double per = (double)c[b.sms / 2] / b.kblocks, ideal = 8.0 * N;
  char shape[64] = "";
  if (kFeed || (kSs && kConvert))
    snprintf(shape, sizeof shape, "data ring %d, A ring %d, %d extra warpgroup%s", D1, kSs ? D2 : 0,
             kSs && kConvert ? CW : 1, (kSs && kConvert ? CW : 1) > 1 ? "s" : "");
  printf("N %3d  %-8s  %-42s  %8.1f cycles a k-block (ideal %5.0f)  %5.1f%% of the tensor rate\n", N, name, shape,
         per, ideal, 100.0 * ideal / per);
}

template <int N>
void run_all(const Buffers& b) {
  run<N, code(kRsConst)>(b, kRsConst.name);
  run<N, code(kRsWords)>(b, kRsWords.name);
  run<N, code(kSsConst), 1, 1>(b, kSsConst.name);
  run<N, code(kSsConv), 1, 2, 1>(b, kSsConv.name);
  run<N, code(kSsConv), 1, 3, 1>(b, kSsConv.name);
  run<N, code(kSsConv), 1, 4, 1>(b, kSsConv.name);
  constexpr int kRsRing = N == 256 ? 3 : N == 128 ? 4 : 6, kSsRing = N == 256 ? 2 : N == 128 ? 3 : 4;
  run<N, code(kRsFeed), kRsRing>(b, kRsFeed.name);
  run<N, code(kSsFeed), kSsRing, 2, 1>(b, kSsFeed.name);
  if constexpr (N <= 128) {  // 512 threads start with 128 registers, fewer than an m64n256 wgmma needs
    run<N, code(kSsConv), 1, 2, 2>(b, kSsConv.name);
    run<N, code(kSsConv), 1, 3, 2>(b, kSsConv.name);
    run<N, code(kSsFeed), kSsRing, 2, 2>(b, kSsFeed.name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Buffers b{};
  b.kblocks = argc > 1 ? atoi(argv[1]) : 512;
  int device = 0;
  CK(cudaGetDevice(&device));
  CK(cudaDeviceGetAttribute(&b.sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  printf("%s, %d SMs, one block an SM, %d k-blocks a block\n", prop.name, b.sms, b.kblocks);
  uint8_t *xsrc, *wsrc;
  CK(cudaMalloc(&xsrc, (size_t)kXStages * 256 * 256));
  CK(cudaMalloc(&wsrc, kWBytes));
  CK(cudaMemset(xsrc, 0, (size_t)kXStages * 256 * 256));
  CK(cudaMemset(wsrc, 0, kWBytes));
  b.xsrc = xsrc, b.wsrc = wsrc;
  CK(cudaMalloc(&b.cycles, b.sms * sizeof(unsigned long long)));
  CK(cudaMalloc(&b.sink, 1024 * sizeof(float)));
  run_all<64>(b);
  run_all<128>(b);
  run_all<256>(b);
  CK(cudaFree(b.cycles));
  CK(cudaFree(b.sink));
  CK(cudaFree(xsrc));
  CK(cudaFree(wsrc));
  return 0;
}
