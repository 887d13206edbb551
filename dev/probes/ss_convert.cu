// ss_convert.cu: whether MMA warps that only issue wgmmas, both operands in shared memory (SS),
// fed fp16 weights by converter warps, run closer to the tensor rate than the kernel's structure,
// where the MMA warps convert their own weights into wgmma's A registers (RS) (lab only; dev/LOG.md,
// twentieth session, step 8: the ring alone runs 1.3-2.2 times as fast as the kernel, the wgmma
// stream alone 12-20% above cuBLAS at M = 1024, so the MMA warps' own work is what to take away).
//
// One block an SM, no global memory: two MMA warpgroups of one m64 tile each (128 rows, the kernel's
// variants 3 and 5), N tokens (64, 128, 256) in one B operand of two 64-k swizzle atoms of
// [N][128 B] (zeros, as the kernel's x stage), reused every k-block of 8 k16 steps. Modes:
//   rs_const  RS wgmmas, A registers set once: the RS stream alone
//   rs_words  RS, each MMA warp converting its A fragments from packed words in shared memory by
//             whole words (1 shift, 4 lop3, 2 sub, 2 fma, 4 mul for 8 weights), two steps a group,
//             one group in flight, as the kernel's wgmma_stage does: the best the kernel's structure
//             gets (its natural order converts by pairs, a quarter more)
//   ss_const  SS wgmmas from one fp16 A stage written once: the SS stream alone
//   ss_conv   CW converter warpgroups convert each k-block's 8 KB of packed words (128 rows x 64 B) into
//             a 32 KB fp16 A stage (two 64-k atoms of [128 rows][128 B], 128-byte swizzle, as x), a ring
//             of D stages on full / empty mbarriers; the MMA warps wait for a stage, issue its 16
//             wgmmas (8 a warpgroup) as one group and release the stage once the next group is issued
//             and that one has completed (wait until one group is in flight)
// Registers as the kernel splits them (setmaxnreg): with converters, the MMA warps take what the
// converters give up (two converter warpgroups only up to N = 128: ptxas compiles the whole kernel
// within the 128 registers a thread that 512 threads start with, short of an m64n256 wgmma's). Per mode and N: the median block's cycles a k-block against 8 N (128 rows x N
// tokens x 128 k at 2,048 multiply-adds a cycle an SM, the H100's dense fp16 rate).
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

enum Mode { kRsConst, kRsWords, kSsConst, kSsConvert };
const char* const kModeNames[] = {"rs_const", "rs_words", "ss_const", "ss_conv"};

constexpr int kRows = 128;                  // two MMA warpgroups of one m64 tile each
constexpr uint32_t kAtomA = kRows * 128;    // one 64-k atom of fp16 A: [128 rows][128 B]
constexpr uint32_t kAStage = 2 * kAtomA;    // a k-block's fp16 A
constexpr uint32_t kPacked = kRows * 64;    // a k-block's packed words: [4 chunks][128 rows][16 B]

__host__ __device__ constexpr int block_threads(int mode, int cw) { return 256 + (mode == kSsConvert ? 128 * cw : 0); }
template <int N, int D>
constexpr uint32_t smem_bytes() { return N * 256 + D * kAStage + kPacked + 1024; }  // + room to align to 1 KB

template <int N, int kMode, int D, int CW>
__global__ void __launch_bounds__(block_threads(kMode, CW), 1)
    ss_kernel(int kblocks, unsigned long long* cycles, float* sink) {
#if defined(W4_HAS_WGMMA)
  constexpr int kThreads = block_threads(kMode, CW);
  constexpr uint32_t kA = N * 256, kP = kA + D * kAStage;  // offsets: x at 0, the A stages, the packed words
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  uint8_t* sm = smem_raw + (base - raw);
  __shared__ __align__(8) uint64_t bars[2 * D];  // full, then empty
  const uint32_t full = smem_addr(&bars[0]), empty = full + 8 * D;
  for (uint32_t i = threadIdx.x; i < (kP + kPacked) / 16; i += kThreads)
    reinterpret_cast<uint4*>(sm)[i] = make_uint4(0, 0, 0, 0);  // x, A and packed words: zeros
  if (threadIdx.x == 0) {
    for (int s = 0; s < D; ++s) {
      w4::mbar_init(full + 8 * s, 128 * CW);  // every converter thread, after its proxy fence
      w4::mbar_init(empty + 8 * s, 256);      // every MMA thread, after its wait
    }
    w4::fence_mbar_init();
  }
  w4::fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  if constexpr (kMode == kSsConvert) {
    constexpr int kMmaRegs = CW == 1 ? 216 : 192, kConvRegs = CW == 1 ? 72 : 64;
    static_assert(2 * kMmaRegs + CW * kConvRegs == (2 + CW) * (65536 / kThreads / 8 * 8), "the block's pool");
    if (warp >= 8) {
      w4::setmaxnreg_dec<kConvRegs>();
      // thread ct converts row ct % 128's words of k-block kb: all 16 (CW = 1) or one atom's 8 (CW = 2)
      const int ct = threadIdx.x - 256, row = ct & 127, part = ct >> 7;
      constexpr int kChunks = 4 / CW;
      const w4::ZeroF16x8 zero = w4::row_zero(8);
      const uint32_t scale = 0x3C003C00u;
      int s = 0;
      uint32_t phase = 1;  // a stage's first use waits for nothing; its n-th for the (n - 1)-th release
      for (int kb = 0; kb < kblocks; ++kb) {
        if (kb >= D) w4::mbar_wait(empty + 8 * s, phase);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int chunk = part * kChunks + c;
          const uint4 w = *reinterpret_cast<const uint4*>(sm + kP + chunk * 2048 + row * 16);
          const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int word = 4 * chunk + j, atom = word >> 3, unit = word & 7;
            uint32_t d[4];
            w4::u4x8_minus_zero_f16x8(ws[j], zero, d);
            *reinterpret_cast<uint4*>(sm + kA + s * kAStage + atom * kAtomA + row * 128 + ((unit ^ (row & 7)) << 4)) =
                make_uint4(w4::mul_f16x2(d[0], scale), w4::mul_f16x2(d[1], scale), w4::mul_f16x2(d[2], scale),
                           w4::mul_f16x2(d[3], scale));
          }
        }
        w4::fence_proxy_async_shared();  // the wgmmas read the stage through the async proxy
        w4::mbar_arrive(full + 8 * s);
        if (++s == D) s = 0, phase ^= 1;
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
  if constexpr (kMode == kSsConst || kMode == kSsConvert) {
    // the ring's stage and phase as running counters (kb % 3 made ptxas serialise the wgmmas, C7514)
    int s = 0, prev = 0;
    uint32_t phase = 0;
    for (int kb = 0; kb < kblocks; ++kb) {
      if constexpr (kMode == kSsConvert) mbar_wait_in_ptx(full + 8 * s, phase);
      const uint32_t a0 = base + kA + s * kAStage + wg * 64 * 128;  // this warpgroup's 64 rows, atom 0
      w4::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 8; ++j)
        wgmma_m64k16_ss<N>(acc, w4::smem_desc_sw128(a0 + (j >> 2) * kAtomA + (j & 3) * 32),
                           w4::smem_desc_sw128(base + (j >> 2) * (N * 128) + (j & 3) * 32));
      w4::wgmma_commit();
      w4::wgmma_wait<1>();
      if constexpr (kMode == kSsConvert) {
        if (kb > 0) w4::mbar_arrive(empty + 8 * prev);
        prev = s;
        if (++s == D) s = 0, phase ^= 1;
      }
    }
  } else {
    uint32_t af[2][8];
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int i = 0; i < 8; ++i) af[s][i] = 0x3C003C00u ^ (threadIdx.x + 7 * i + s);  // fp16 near 1.0
    const w4::ZeroF16x8 zero = w4::row_zero(8);
    const uint32_t scale = 0x3C003C00u;
    uint4 words[2];
    for (int kb = 0; kb < kblocks; ++kb) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {  // a group: two k16 steps, as the kernel's word
        uint32_t(&a)[8] = af[g & 1];
        if constexpr (kMode == kRsWords) {
          if (g == 0) {  // the k-block's 8 words of this thread: two 16-byte chunks
            const int row = threadIdx.x & 127, c0 = 2 * (lane & 1);
            words[0] = *reinterpret_cast<const uint4*>(sm + kP + c0 * 2048 + row * 16);
            words[1] = *reinterpret_cast<const uint4*>(sm + kP + (c0 + 1) * 2048 + row * 16);
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
                                 w4::smem_desc_sw128(base + (j >> 2) * (N * 128) + (j & 3) * 32));
        }
        w4::wgmma_commit();
        w4::wgmma_wait<1>();
      }
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

template <int N, int kMode, int D = 1, int CW = 1>
void run(int sms, int kblocks, unsigned long long* cycles, float* sink) {
  constexpr uint32_t smem = smem_bytes<N, D>();
  auto fn = ss_kernel<N, kMode, D, CW>;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int rep = 0; rep < 2; ++rep) fn<<<sms, block_threads(kMode, CW), smem>>>(kblocks, cycles, sink);  // (the first warms up)
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> c(sms);
  CK(cudaMemcpy(c.data(), cycles, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::sort(c.begin(), c.end());
  const double per = (double)c[sms / 2] / kblocks, ideal = 8.0 * N;
  printf("N %3d  %-8s", N, kModeNames[kMode]);
  if (kMode == kSsConvert)
    printf("  ring %d, %d converter warpgroup%s", D, CW, CW > 1 ? "s" : " ");
  else
    printf("  %-36s", "");
  printf("  %8.1f cycles a k-block (ideal %5.0f)  %5.1f%% of the tensor rate\n", per, ideal, 100.0 * ideal / per);
}

template <int N>
void run_all(int sms, int kblocks, unsigned long long* cycles, float* sink) {
  run<N, kRsConst>(sms, kblocks, cycles, sink);
  run<N, kRsWords>(sms, kblocks, cycles, sink);
  run<N, kSsConst>(sms, kblocks, cycles, sink);
  run<N, kSsConvert, 2, 1>(sms, kblocks, cycles, sink);
  run<N, kSsConvert, 3, 1>(sms, kblocks, cycles, sink);
  run<N, kSsConvert, 4, 1>(sms, kblocks, cycles, sink);
  if constexpr (N <= 128) {  // 512 threads start with 128 registers, fewer than an m64n256 wgmma needs
    run<N, kSsConvert, 2, 2>(sms, kblocks, cycles, sink);
    run<N, kSsConvert, 3, 2>(sms, kblocks, cycles, sink);
    run<N, kSsConvert, 4, 2>(sms, kblocks, cycles, sink);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int kblocks = argc > 1 ? atoi(argv[1]) : 512;
  int device = 0, sms = 0;
  CK(cudaGetDevice(&device));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  printf("%s, %d SMs, one block an SM, %d k-blocks a block\n", prop.name, sms, kblocks);
  unsigned long long* cycles;
  float* sink;
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  CK(cudaMalloc(&sink, 1024 * sizeof(float)));
  run_all<64>(sms, kblocks, cycles, sink);
  run_all<128>(sms, kblocks, cycles, sink);
  run_all<256>(sms, kblocks, cycles, sink);
  CK(cudaFree(cycles));
  CK(cudaFree(sink));
  return 0;
}
