// wgmma_rate.cu: how fast the tensor cores run the warp-specialised kernel's wgmma, A from registers,
// with nothing else in the loop, then with the kernel's per-group and per-stage work added piece by
// piece (lab only). At 64- and 128-token tiles the kernel's k-blocks reach 40-65% of the tensor rate
// (dev/LOG.md, fifteenth session); this names which piece of the loop holds them there.
//
// One block an SM, WGS warpgroups, each looping `iters` groups of PER_GROUP wgmma.m64nNk16 (one
// accumulator, B one zeroed 64-k atom in shared memory with the 128-byte swizzle, as the kernel's x
// tile): fence, issue, commit, wait until one group is in flight, as wgmma_stage does.
//   kFresh      the A registers rewritten before each group (two sets in turn), else kept
//   kConvert 1  A converted before each group as the natural k order's word does it (two 16-byte
//               chunk loads from shared memory, then per pair a shift, lop3, sub and mul: 4 pairs a
//               wgmma)
//   kConvert 2  as the permuted order does it (a word a row: 1 shift, 4 lop3, 2 sub, 2 fma, 4 mul;
//               one 16-byte load a row every four words), the stream a layout in the mma fragments'
//               order would give the natural order
//   kStage      every four groups (a k-block's four words) what wgmma_stage does once a stage too:
//               wait on the stage's two full barriers (completed before the loop, so the wait is its
//               instructions alone), load each tile's scales and zero from shared memory, arrive on
//               the two empty barriers; the conversion then uses those scales and zeros
// Per configuration: the median block's cycles per wgmma against N / 2 cycles (2048 multiply-adds a
// cycle an SM, the H100's dense fp16 rate at its 1.83 GHz boost), and that as a percentage.
//
// ring_kernel then feeds the same loop as the kernel is fed: WGS MMA warpgroups (two, as the kernel)
// of NT m64 tiles each (the kernel's variants 2 and 3; 128 tokens on two tiles would need the
// kernel's setmaxnreg split, which this probe does not have) and a producer warp filling a ring of
// stages (two 64-k x atoms of N tokens, 64 WGS NT rows' weights, their scales and zeros) by bulk copies from global
// memory on full / empty mbarriers; the MMA warps read each stage's weights (at the 128-byte
// swizzle's addresses) and scales, their wgmmas read its x, and they release it as ws_consume does.
// The source is `src_bytes` of global memory walked stage by stage: 8 MB stay in L2, 512 MB come
// from DRAM. kFeed separates what the ring costs:
//   0  the stage's bytes, and the MMA warps wait for them to land (as the kernel)
//   1  no bytes: the producer completes each stage's full barrier with its arrival alone (the
//      handshake, no copy)
//   2  the bytes land as in 0, at the MMA warps' pace (a stage is refilled once released and its
//      last copy landed, on a barrier of the producer's own), but the MMA warps do not wait for
//      them: the copies' traffic through L2 and shared memory without their latency
//   3  no bytes, and the MMA warps do not wait on the full barriers either (they still release
//      each stage): the producer's hand-offs without anyone waiting for them
//   4  no producer at all: the MMA warps alone, releasing each stage on barriers nobody waits on
//      (ptxas serialises these builds' wgmmas, C7513: their rate is the serialisation's, not the
//      ring's; dev/LOG.md, seventeenth session)
// `wgmma_rate warpgroups` runs only the ring with its rows spread over 2, 3 or 4 warpgroups.
//
//     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels dev/probes/wgmma_rate.cu -o build/wgmma_rate
//     build/wgmma_rate [warpgroups]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "int4_convert.cuh"  // kernels/, through -I kernels
#include "probe.cuh"

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int WGS, int N, int PER_GROUP, bool kFresh, int kConvert = 0, bool kStage = false>
__global__ void __launch_bounds__(WGS * 128, 1) rate_kernel(int iters, unsigned long long* cycles, float* sink) {
#if defined(W4_HAS_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  uint4* b = reinterpret_cast<uint4*>(smem_raw + (base - raw));
  for (int i = threadIdx.x; i < N * 128 / 16 + 192; i += blockDim.x) b[i] = make_uint4(0, 0, 0, 0);  // + chunks, scales
  __shared__ __align__(8) uint64_t bars[4];  // full_a, full_b, empty_a, empty_b
  const uint32_t full_a = smem_addr(&bars[0]), full_b = full_a + 8, empty_a = full_a + 16, empty_b = full_a + 24;
  if (threadIdx.x == 0) {
    w4::mbar_init(full_a, 1);
    w4::mbar_init(full_b, 1);
    w4::mbar_init(empty_a, 0xFFFFF);  // (never completes here)
    w4::mbar_init(empty_b, 0xFFFFF);
    w4::fence_mbar_init();
    w4::mbar_arrive(full_a);  // phase 0 complete: waiting on it returns at once
    w4::mbar_arrive(full_b);
  }
  w4::fence_proxy_async_shared();
  __syncthreads();
  const uint8_t* stage_sz = smem_raw + (base - raw) + N * 128 + 1024;  // scales and zeros, 8 stages of 128 B
  uint32_t slo[2] = {0x3C003C00u, 0x3C003C00u}, shi[2] = {0x3C003C00u, 0x3C003C00u};
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  uint32_t a[2][4];
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[s][i] = 0x3C003C00u ^ (threadIdx.x + 7 * i + s);  // fp16 near 1.0
  uint4 words[2] = {};
  w4::ZeroF16x8 zero = w4::row_zero(threadIdx.x & 15);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; it += 4) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int s = g & 1;
      if (kFresh) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[s][i] ^= (uint32_t)(it & 0x00FF00FF);  // (the set used two groups ago)
      }
      if constexpr (kStage) {
        if (g == 0) {  // a stage's start, as ws_consume and wgmma_stage
          w4::mbar_wait(full_a, 0);
          w4::mbar_wait(full_b, 0);
          const int lane = threadIdx.x & 31, row = lane >> 2;
          const uint8_t* sz = stage_sz + 128 * ((it >> 2) & 7);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const unsigned short* ss = reinterpret_cast<const unsigned short*>(sz + 32 * t);
            slo[t] = ss[row] * 0x10001u;
            shi[t] = ss[row + 8] * 0x10001u;
          }
          const uint32_t zw = *reinterpret_cast<const uint32_t*>(sz + 64);
          zero = w4::row_zero((zw >> (4 * ((row >> 1) + 4 * (row & 1)))) & 0xF);
        }
      }
      if constexpr (kConvert == 2) {
        const int lane = threadIdx.x & 31;
        if (g == 0) {  // a row's 16 bytes cover four words (here, four groups)
          const uint8_t* chunks = smem_raw + (base - raw) + N * 128 + 16 * ((lane + it) & 31);
          words[0] = *reinterpret_cast<const uint4*>(chunks);
          words[1] = *reinterpret_cast<const uint4*>(chunks + 512);
        }
        uint32_t af[PER_GROUP * 4];
#pragma unroll
        for (int h = 0; h < PER_GROUP / 2; ++h) {
          const uint4 lo = words[0], hi = words[1];
          const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
          uint32_t dl[4], dh[4];
          w4::u4x8_minus_zero_f16x8(wl[(g + h) & 3], zero, dl);
          w4::u4x8_minus_zero_f16x8(wh[(g + h) & 3], zero, dh);
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            af[8 * h + 2 * p] = w4::mul_f16x2(dl[p], kStage ? slo[h] : a[0][p]);
            af[8 * h + 2 * p + 1] = w4::mul_f16x2(dh[p], kStage ? shi[h] : a[1][p]);
          }
        }
        w4::wgmma_fence();
#pragma unroll
        for (int j = 0; j < PER_GROUP; ++j)
          w4::wgmma_m64k16_rs<N>(acc, af[4 * j], af[4 * j + 1], af[4 * j + 2], af[4 * j + 3],
                                 w4::smem_desc_sw128(base + (j & 3) * 32));
      } else if constexpr (kConvert == 1) {
        const int lane = threadIdx.x & 31;
        const uint8_t* chunks = smem_raw + (base - raw) + N * 128 + 16 * ((lane + it + g) & 31);
        uint32_t af[PER_GROUP * 4];
#pragma unroll
        for (int h = 0; h < PER_GROUP / 2; ++h) {
          const uint4 lo = *reinterpret_cast<const uint4*>(chunks + 512 * h);
          const uint4 hi = *reinterpret_cast<const uint4*>(chunks + 512 * h + 256);
          const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            af[8 * h + 2 * j] = w4::mul_f16x2(w4::u4_pair_minus_zero_f16x2(wl[j], 4 * (lane & 3), zero.biased[0]),
                                              kStage ? slo[h] : a[0][j]);
            af[8 * h + 2 * j + 1] = w4::mul_f16x2(w4::u4_pair_minus_zero_f16x2(wh[j], 4 * (lane & 3), zero.biased[0]),
                                                  kStage ? shi[h] : a[1][j]);
          }
        }
        w4::wgmma_fence();
#pragma unroll
        for (int j = 0; j < PER_GROUP; ++j)
          w4::wgmma_m64k16_rs<N>(acc, af[4 * j], af[4 * j + 1], af[4 * j + 2], af[4 * j + 3],
                                 w4::smem_desc_sw128(base + (j & 3) * 32));
      } else {
        w4::wgmma_fence();
#pragma unroll
        for (int j = 0; j < PER_GROUP; ++j)
          w4::wgmma_m64k16_rs<N>(acc, a[s][0], a[s][1], a[s][2], a[s][3], w4::smem_desc_sw128(base + (j & 3) * 32));
      }
      w4::wgmma_commit();
      w4::wgmma_wait<1>();
      if (kStage && g == 0) w4::mbar_arrive(empty_b);  // (the previous stage's second part)
      if (kStage && g == 2) w4::mbar_arrive(empty_a);
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

template <int WGS, int N, int PER_GROUP, bool kFresh, int kConvert = 0, bool kStage = false>
void run(int sms, unsigned long long* cycles, float* sink) {
  const int iters = 4096, smem = N * 128 + 1024 + 3072;
  auto fn = rate_kernel<WGS, N, PER_GROUP, kFresh, kConvert, kStage>;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int rep = 0; rep < 2; ++rep) fn<<<sms, WGS * 128, smem>>>(iters, cycles, sink);  // (the first warms up)
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> c(sms);
  CK(cudaMemcpy(c.data(), cycles, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::sort(c.begin(), c.end());
  const double per = (double)c[sms / 2] / ((double)WGS * iters * PER_GROUP), ideal = N / 2.0;
  printf("warpgroups %d  m64n%-3dk16  %d a group  A %-9s%s  %7.1f cycles a wgmma (ideal %5.1f)  "
         "%5.1f%% of the tensor rate\n",
         WGS, N, PER_GROUP, kConvert == 2 ? "by words" : kConvert ? "converted" : kFresh ? "rewritten" : "kept",
         kStage ? " + stage" : "        ", per, ideal, 100.0 * ideal / per);
}

template <int N, int NT, int kConvert, int kStages, int kFeed = 0, int WGS = 2>
__global__ void __launch_bounds__(WGS * 128 + 32, 1) ring_kernel(int kblocks, const uint8_t* src, size_t src_stages,
                                                              unsigned long long* cycles, float* sink) {
#if defined(W4_HAS_WGMMA)
  constexpr uint32_t kX = 2 * N * 128, kW = WGS * NT * 4096, kStage = kX + kW + 1024;  // x atoms, weights, scales
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint8_t* sm = smem_raw + (base - raw);
  __shared__ __align__(8) uint64_t bars[3 * kStages];  // full, empty, then landed (kFeed 2)
  const uint32_t full = smem_addr(&bars[0]), empty = full + 8 * kStages, landed = full + 16 * kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      w4::mbar_init(full + 8 * s, 1);
      w4::mbar_init(empty + 8 * s, WGS * 128);
      w4::mbar_init(landed + 8 * s, 1);
    }
    w4::fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x >= WGS * 128) {  // the producer warp's lane 0
    if (threadIdx.x == WGS * 128 && kFeed != 4) {
      const uint32_t copied = kFeed == 2 ? landed : full;  // the barrier the copies complete on
      for (int kb = 0; kb < kblocks; ++kb) {
        const int s = kb % kStages;
        if (kb >= kStages) w4::mbar_wait(empty + 8 * s, ((kb / kStages) + 1) & 1);
        if (kFeed == 1 || kFeed == 3) {
          w4::mbar_arrive_expect_tx(full + 8 * s, 0);
          continue;
        }
        if (kFeed == 2) {
          if (kb >= kStages) w4::mbar_wait(landed + 8 * s, ((kb / kStages) + 1) & 1);
          w4::mbar_arrive_expect_tx(full + 8 * s, 0);
        }
        w4::mbar_arrive_expect_tx(copied + 8 * s, kStage);
        const uint8_t* from = src + ((size_t)blockIdx.x * kblocks + kb) % src_stages * kStage;
        for (uint32_t o = 0; o < kStage; o += 16384)
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                  base + s * kStage + o),
              "l"(from + o), "r"(kStage - o < 16384 ? kStage - o : 16384u), "r"(copied + 8 * s)
              : "memory");
      }
      // no copy outlives its issuer: leave once the last stages have landed
      if (kFeed == 0 || kFeed == 2)
        for (int kb = kblocks > kStages ? kblocks - kStages : 0; kb < kblocks; ++kb)
          w4::mbar_wait(copied + 8 * (kb % kStages), (kb / kStages) & 1);
    }
    return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2, wi = warp & 3, row = lane >> 2;
  float acc[NT][N / 2];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[t][i] = 0.f;
  // chunk c of rows row and row + 8 of tile t within a stage's weights, as the kernel's swizzled load
  auto chunk_at = [&](int t, int h, int c) {
    const uint32_t o = 1024u * ((wg * NT + t) * 4 + wi) + 64u * row + 512u * h;
    return kX + ((o ^ (((o >> 7) & 7) << 4)) ^ (16u * c));
  };
  const unsigned long long t0 = clock64();
  for (int kb = 0; kb < kblocks; ++kb) {
    const int s = kb % kStages;
    if (kFeed < 3) w4::mbar_wait(full + 8 * s, (kb / kStages) & 1);
    const uint8_t* st = sm + s * kStage;
    uint32_t slo[NT], shi[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + kX + kW + 64 * (wg * NT + t));
      slo[t] = ss[row] * 0x10001u;
      shi[t] = ss[row + 8] * 0x10001u;
    }
    const uint32_t zw = *reinterpret_cast<const uint32_t*>(st + kX + kW + 512);
    const w4::ZeroF16x8 zero = w4::row_zero((zw >> (4 * ((row >> 1) + 4 * (row & 1)))) & 0xF);
    uint4 lo[NT], hi[NT];
    if (kConvert == 2) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        lo[t] = *reinterpret_cast<const uint4*>(st + chunk_at(t, 0, lane & 3));
        hi[t] = *reinterpret_cast<const uint4*>(st + chunk_at(t, 1, lane & 3));
      }
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t af[NT][8];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (kConvert == 1) {
          lo[t] = *reinterpret_cast<const uint4*>(st + chunk_at(t, 0, g));
          hi[t] = *reinterpret_cast<const uint4*>(st + chunk_at(t, 1, g));
        }
        const uint32_t wl[4] = {lo[t].x, lo[t].y, lo[t].z, lo[t].w}, wh[4] = {hi[t].x, hi[t].y, hi[t].z, hi[t].w};
        if (kConvert == 1) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            af[t][2 * j] = w4::mul_f16x2(w4::u4_pair_minus_zero_f16x2(wl[j], 4 * (lane & 3), zero.biased[0]), slo[t]);
            af[t][2 * j + 1] =
                w4::mul_f16x2(w4::u4_pair_minus_zero_f16x2(wh[j], 4 * (lane & 3), zero.biased[0]), shi[t]);
          }
        } else {
          uint32_t dl[4], dh[4];
          w4::u4x8_minus_zero_f16x8(wl[g], zero, dl);
          w4::u4x8_minus_zero_f16x8(wh[g], zero, dh);
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            af[t][2 * p] = w4::mul_f16x2(dl[p], slo[t]);
            af[t][2 * p + 1] = w4::mul_f16x2(dh[p], shi[t]);
          }
        }
      }
      w4::wgmma_fence();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int t = 0; t < NT; ++t)
          w4::wgmma_m64k16_rs<N>(acc[t], af[t][4 * h], af[t][4 * h + 1], af[t][4 * h + 2], af[t][4 * h + 3],
                                 w4::smem_desc_sw128(base + s * kStage + (g >> 1) * (N * 128) +
                                                     (2 * (g & 1) + h) * 32));
      w4::wgmma_commit();
      w4::wgmma_wait<1>();
      if (g == 0 && kb > 0) w4::mbar_arrive(empty + 8 * ((kb - 1) % kStages));  // its last wgmmas are done
    }
  }
  w4::wgmma_wait<0>();
  const unsigned long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  float sum = 0.f;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sum += acc[t][i];
  if (sum == 12345.f) sink[threadIdx.x] = sum;
#endif
}

template <int N, int NT, int kConvert, int kFeed = 0, int WGS = 2>
void run_ring(int sms, unsigned long long* cycles, float* sink, const uint8_t* src, size_t src_bytes) {
  constexpr int kStageBytes = 2 * N * 128 + WGS * NT * 4096 + 1024;
  constexpr int kStages = (220 * 1024) / kStageBytes > 6 ? 6 : (220 * 1024) / kStageBytes;
  const int kblocks = 512, smem = kStages * kStageBytes + 1024;
  auto fn = ring_kernel<N, NT, kConvert, kStages, kFeed, WGS>;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int rep = 0; rep < 2; ++rep)  // (the first warms up)
    fn<<<sms, WGS * 128 + 32, smem>>>(kblocks, src, src_bytes / kStageBytes, cycles, sink);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> c(sms);
  CK(cudaMemcpy(c.data(), cycles, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::sort(c.begin(), c.end());
  const double per = (double)c[sms / 2] / ((double)kblocks * WGS * NT * 8), ideal = N / 2.0;
  const char* feed = kFeed == 1   ? "no bytes"
                     : kFeed == 2 ? "unwaited"
                     : kFeed == 3 ? "no wait"
                     : kFeed == 4 ? "no prod."
                                  : "waited";
  printf("ring of %d stages  m64n%-3dk16  %d warpgroups of %d tile(s)  A %-9s  source %4zu MB  data %-8s  %7.1f cycles "
         "a wgmma (ideal %5.1f)  %5.1f%% of the tensor rate\n",
         kStages, N, WGS, NT, kConvert == 2 ? "by words" : "converted", src_bytes >> 20, feed, per, ideal, 100.0 * ideal / per);
}

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs, one block an SM\n", prop.name, sms);
  unsigned long long* cycles;
  float* sink;
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  CK(cudaMalloc(&sink, 1024 * sizeof(float)));
  // The ring's rows over 2, 3 or 4 MMA warpgroups (at 128 tokens four need more registers than the
  // 120 a thread a block of 544 threads leaves, and ptxas serialises their wgmmas: not run).
  if (argc > 1 && std::string(argv[1]) == "warpgroups") {
    uint8_t* src;
    const size_t small = size_t{8} << 20;
    CK(cudaMalloc(&src, small));
    CK(cudaMemset(src, 0, small));
    for (int rep = 0; rep < 2; ++rep) {
      run_ring<64, 2, 1, 0, 2>(sms, cycles, sink, src, small);  // 256 rows: the kernel's variant 2
      run_ring<64, 1, 1, 0, 4>(sms, cycles, sink, src, small);
      run_ring<64, 2, 2, 0, 2>(sms, cycles, sink, src, small);
      run_ring<64, 1, 2, 0, 4>(sms, cycles, sink, src, small);
      run_ring<64, 1, 1, 0, 2>(sms, cycles, sink, src, small);  // 128 rows: variant 1
      run_ring<64, 1, 1, 0, 3>(sms, cycles, sink, src, small);  // 192 rows
      run_ring<128, 1, 1, 0, 2>(sms, cycles, sink, src, small);  // 128 rows: variant 3
      run_ring<128, 1, 2, 0, 2>(sms, cycles, sink, src, small);
      run_ring<64, 1, 1, 1, 4>(sms, cycles, sink, src, small);  // no bytes
      run_ring<64, 2, 1, 1, 2>(sms, cycles, sink, src, small);
    }
    return 0;
  }
  run<1, 64, 2, false>(sms, cycles, sink);
  run<2, 64, 2, false>(sms, cycles, sink);
  run<2, 64, 2, true>(sms, cycles, sink);
  run<2, 64, 4, true>(sms, cycles, sink);
  run<3, 64, 2, true>(sms, cycles, sink);
  run<1, 128, 2, false>(sms, cycles, sink);
  run<2, 128, 2, false>(sms, cycles, sink);
  run<2, 128, 2, true>(sms, cycles, sink);
  run<2, 128, 4, true>(sms, cycles, sink);
  run<3, 128, 2, true>(sms, cycles, sink);
  run<1, 256, 2, false>(sms, cycles, sink);
  run<2, 256, 2, false>(sms, cycles, sink);
  run<2, 256, 2, true>(sms, cycles, sink);
  run<2, 64, 2, false, 1>(sms, cycles, sink);
  run<2, 64, 4, false, 1>(sms, cycles, sink);
  run<3, 64, 2, false, 1>(sms, cycles, sink);
  run<2, 128, 2, false, 1>(sms, cycles, sink);
  run<2, 128, 4, false, 1>(sms, cycles, sink);
  run<2, 256, 2, false, 1>(sms, cycles, sink);
  run<2, 64, 2, false, 2>(sms, cycles, sink);
  run<2, 64, 4, false, 2>(sms, cycles, sink);
  run<3, 64, 2, false, 2>(sms, cycles, sink);
  run<2, 128, 2, false, 2>(sms, cycles, sink);
  run<2, 128, 4, false, 2>(sms, cycles, sink);
  run<2, 256, 2, false, 2>(sms, cycles, sink);
  run<2, 64, 2, false, 1, true>(sms, cycles, sink);
  run<2, 64, 4, false, 1, true>(sms, cycles, sink);
  run<2, 128, 2, false, 1, true>(sms, cycles, sink);
  run<2, 128, 4, false, 1, true>(sms, cycles, sink);
  run<2, 64, 2, false, 2, true>(sms, cycles, sink);
  run<2, 64, 4, false, 2, true>(sms, cycles, sink);
  run<2, 128, 2, false, 2, true>(sms, cycles, sink);
  run<2, 128, 4, false, 2, true>(sms, cycles, sink);
  uint8_t* src;
  const size_t big = size_t{512} << 20, small = size_t{8} << 20;
  CK(cudaMalloc(&src, big));
  CK(cudaMemset(src, 0, big));
  for (size_t bytes : {small, big}) {
    run_ring<64, 2, 1>(sms, cycles, sink, src, bytes);
    run_ring<64, 2, 2>(sms, cycles, sink, src, bytes);
    run_ring<128, 1, 1>(sms, cycles, sink, src, bytes);
    run_ring<128, 1, 2>(sms, cycles, sink, src, bytes);
  }
  for (size_t bytes : {small, big}) {  // the ring's handshake alone, then its traffic alone
    run_ring<64, 2, 2, 1>(sms, cycles, sink, src, bytes);
    run_ring<64, 2, 2, 2>(sms, cycles, sink, src, bytes);
    run_ring<128, 1, 2, 1>(sms, cycles, sink, src, bytes);
    run_ring<128, 1, 2, 2>(sms, cycles, sink, src, bytes);
    run_ring<64, 2, 1, 2>(sms, cycles, sink, src, bytes);
  }
  // the hand-off without its waits, and no producer at all (no bytes either way: one source)
  run_ring<64, 2, 2, 3>(sms, cycles, sink, src, small);
  run_ring<64, 2, 2, 4>(sms, cycles, sink, src, small);
  run_ring<128, 1, 2, 3>(sms, cycles, sink, src, small);
  run_ring<128, 1, 2, 4>(sms, cycles, sink, src, small);
  run_ring<64, 2, 1, 3>(sms, cycles, sink, src, small);
  run_ring<64, 2, 1, 4>(sms, cycles, sink, src, small);
  return 0;
}
