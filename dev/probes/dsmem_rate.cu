// dsmem_rate.cu: how fast a split-K partial tile's shares cross a thread block cluster (lab only).
// Every block of a cluster of S holds S shares of `share` bytes of fp32 in its shared memory (its
// partial tile) and must sum share r (its rank's) over all S blocks, as the wgmma kernels' split-K
// does. Three ways, each timed per block from the first cluster barrier to the share summed
// (global timer, median and slowest block), with one block per SM on every SM a cluster can take:
//   pull   each thread loads 16-byte units of the other blocks' shares (ld.shared::cluster.v4),
//          `at_once` units a thread in flight (the kernels' reduce_split_cluster, at_once = 2)
//   push   one thread a block sends each other block its share with one bulk copy
//          (cp.async.bulk.shared::cluster.shared::cta), completing on the receiver's mbarrier; the
//          receiver then sums from its own shared memory
//   local  the same sum with every share in the block's own memory (no cluster traffic)
//
//     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels dev/probes/dsmem_rate.cu -o build/dsmem_rate
//     build/dsmem_rate
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "probe.cuh"

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t rank_in_cluster() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

enum Way { kPull = 0, kPush = 1, kLocal = 2 };

// smem: S shares (the partial tile), then for push S - 1 receive slots of `share` bytes, slot
// (s < rank ? s : s - 1) for block s's copy of this block's share
template <int S, int kAtOnce>
__global__ void __launch_bounds__(256, 1) move_shares(int way, int share, float* out, unsigned long long* ns) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the cluster and mbarrier helpers: sm_90a only
  extern __shared__ __align__(1024) float4 sm[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t rank = rank_in_cluster();
  const int units = share / 16;
  for (int i = threadIdx.x; i < S * units; i += 256) sm[i] = make_float4(rank + i, 1.f, 2.f, 3.f);
  const uint32_t bar_addr = smem_u32(&bar);
  if (threadIdx.x == 0) {
    w4::mbar_init(bar_addr, 1);
    w4::fence_mbar_init();
  }
  w4::fence_proxy_async_shared();  // the shares, for the bulk copies
  __syncthreads();
  w4::cluster_sync();
  const unsigned long long t0 = now_ns();
  const uint32_t base = smem_u32(sm);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (way == kPull) {
    uint32_t src[S];
#pragma unroll
    for (int s = 0; s < S; ++s) src[s] = w4::cluster_smem_addr(base + rank * share, s);
    for (int first = threadIdx.x; first < units; first += kAtOnce * 256) {
      float4 p[kAtOnce][S];
#pragma unroll
      for (int j = 0; j < kAtOnce; ++j)
#pragma unroll
        for (int s = 0; s < S; ++s)
          if (first + j * 256 < units) p[j][s] = w4::ld_cluster_f4(src[s] + 16 * (first + j * 256));
#pragma unroll
      for (int j = 0; j < kAtOnce; ++j)
        if (first + j * 256 < units)
#pragma unroll
          for (int s = 0; s < S; ++s) acc.x += p[j][s].x, acc.y += p[j][s].y, acc.z += p[j][s].z, acc.w += p[j][s].w;
    }
  } else {
    const float4* slots = sm + S * units;
    if (way == kPush) {
      if (threadIdx.x == 0) {
        w4::mbar_arrive_expect_tx(bar_addr, (S - 1) * share);
        for (int s = 0; s < S; ++s) {
          if (s == (int)rank) continue;
          const int slot = (int)rank < s ? (int)rank : (int)rank - 1;  // in block s's receive slots
          const uint32_t dst = w4::cluster_smem_addr(base + (S + slot) * share, s), remote_bar = w4::cluster_smem_addr(bar_addr, s);
          asm volatile(
              "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
              "r"(base + s * share), "r"(share), "r"(remote_bar)
              : "memory");
        }
      }
      w4::mbar_wait(bar_addr, 0);
    }
    for (int u = threadIdx.x; u < units; u += 256) {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        // local: every share from this block's own partial; push: the received slots and its own
        const float4 p = way == kLocal || s == (int)rank ? sm[s * units + u] : slots[(s < (int)rank ? s : s - 1) * units + u];
        acc.x += p.x, acc.y += p.y, acc.z += p.z, acc.w += p.w;
      }
    }
  }
  __syncthreads();
  const unsigned long long t1 = now_ns();
  out[blockIdx.x * 256 + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
  if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
  w4::cluster_sync();  // the senders' memory stays until every copy of it has landed
#endif
}

// The kernels' own sum (reduce_split_cluster) with one factor changed at a time: a partial tile of
// [MT tokens][128 + kPad floats], block r summing tokens [r MT / S, (r + 1) MT / S) two 4-row units a
// thread at a time, the split loop over kMaxSplits with run-time predicates (8, as the kernels) or
// exactly S, and the sums rounded to fp16 and stored to y [.., 8192] (kStore) or kept.
template <int S, int kPad, bool kStore, int kMaxSplits>
__global__ void __launch_bounds__(256, 1) sum_like_kernels(int mt, int splits, __half2* y, float* out,
                                                          unsigned long long* ns) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the cluster and mbarrier helpers: sm_90a only
  extern __shared__ __align__(1024) float4 sm[];
  constexpr int kR = 128, kStride = kR + kPad, kUnitsPerRow = kR / 4, kN = 8192;
  const uint32_t rank = rank_in_cluster();
  float* tile = reinterpret_cast<float*>(sm);
  for (int i = threadIdx.x; i < mt * kStride; i += 256) tile[i] = rank + i;
  __syncthreads();
  w4::cluster_sync();
  const unsigned long long t0 = now_ns();
  const int t0_ = rank * mt / splits, t1_ = (rank + 1) * mt / splits, units = (t1_ - t0_) * kUnitsPerRow;
  const uint32_t base = smem_u32(sm);
  uint32_t src[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) src[s] = s < splits ? w4::cluster_smem_addr(base, s) : 0u;
  const int m0 = (blockIdx.x / S) * mt, n0 = 0;
  float acc = 0.f;
  for (int first = threadIdx.x; first < units; first += 2 * 256) {
    float4 p[2][kMaxSplits];
    int m[2], n[2];
    bool ok[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int u = first + j * 256;
      const int t = t0_ + u / kUnitsPerRow, c = u % kUnitsPerRow;
      m[j] = m0 + t;
      n[j] = n0 + 4 * c;
      ok[j] = u < units;
      const uint32_t off = 4u * (t * kStride + 4 * c);
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s)
        if (ok[j] && s < splits) p[j][s] = w4::ld_cluster_f4(src[s] + off);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (!ok[j]) continue;
      float4 sum = p[j][0];
#pragma unroll
      for (int s = 1; s < kMaxSplits; ++s)
        if (s < splits) sum.x += p[j][s].x, sum.y += p[j][s].y, sum.z += p[j][s].z, sum.w += p[j][s].w;
      if (kStore) {
        __half2* at = y + ((size_t)m[j] * kN + n[j]) / 2;
        at[0] = __floats2half2_rn(sum.x, sum.y);
        at[1] = __floats2half2_rn(sum.z, sum.w);
      } else {
        acc += sum.x + sum.y + sum.z + sum.w;
      }
    }
  }
  __syncthreads();
  const unsigned long long t1 = now_ns();
  out[blockIdx.x * 256 + threadIdx.x] = acc;
  if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
  w4::cluster_sync();
#endif
}

// Launches `fn(args..., ns)` in clusters of S blocks of 256 threads on every SM such clusters can
// take, once to warm up and 20 times timed; the kernel writes each block's time to ns[block].
// Returns the blocks launched and every timed block's ns, sorted.
template <int S, typename... Args>
std::pair<int, std::vector<unsigned long long>> time_blocks(void (*fn)(Args..., unsigned long long*), int smem,
                                                           int sms, Args... args) {
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(256);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = S;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  config.gridDim = dim3(S);
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, fn, &config));
  const int blocks = std::min(clusters * S, sms / S * S);
  config.gridDim = dim3(blocks);
  unsigned long long* ns;
  CK(cudaMalloc(&ns, blocks * sizeof(unsigned long long)));
  std::vector<unsigned long long> all;
  for (int rep = 0; rep < 21; ++rep) {
    CK(cudaLaunchKernelEx(&config, fn, args..., ns));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (rep < 1) continue;
    std::vector<unsigned long long> h(blocks);
    CK(cudaMemcpy(h.data(), ns, blocks * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    all.insert(all.end(), h.begin(), h.end());
  }
  CK(cudaFree(ns));
  std::sort(all.begin(), all.end());
  return {blocks, all};
}

template <int S, int kPad, bool kStore, int kMaxSplits>
void run_like(const char* name, int mt, int sms) {
  __half2* y;
  float* out;
  CK(cudaMalloc(&y, (size_t)sms / S * mt * 8192 * 2));
  CK(cudaMalloc(&out, sms * 256 * sizeof(float)));
  const auto [blocks, all] = time_blocks<S, int, int, __half2*, float*>(sum_like_kernels<S, kPad, kStore, kMaxSplits>,
                                                                        mt * (128 + kPad) * 4, sms, mt, S, y, out);
  printf("%-22s S=%d MT=%3d pad %d store %d loop %d  median %6.2f us  p90 %6.2f us\n", name, S, mt, kPad, kStore,
         kMaxSplits, all[all.size() / 2] / 1e3, all[all.size() * 9 / 10] / 1e3);
  CK(cudaFree(y));
  CK(cudaFree(out));
}

template <int S, int kAtOnce>
void run(const char* name, int way, int share, int sms) {
  float* out;
  CK(cudaMalloc(&out, sms * 256 * sizeof(float)));
  const auto [blocks, all] = time_blocks<S, int, int, float*>(move_shares<S, kAtOnce>,
                                                              (way == kPush ? 2 * S - 1 : S) * share, sms, way, share, out);
  const double med = all[all.size() / 2];
  printf("%-6s S=%d at_once=%d share %3d KB  blocks %3d  median %7.2f us  p90 %7.2f us  remote %5.1f B/ns\n", name, S,
         kAtOnce, share / 1024, blocks, med / 1e3, all[all.size() * 9 / 10] / 1e3, (double)(S - 1) * share / med);
  CK(cudaFree(out));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, sms);
  for (int share : {32 << 10, 64 << 10}) {
    run<2, 2>("pull", kPull, share, sms);
    run<2, 8>("pull", kPull, share, sms);
    run<2, 2>("push", kPush, share, sms);
    run<2, 2>("local", kLocal, share, sms);
  }
  for (int share : {16 << 10, 32 << 10}) {
    run<4, 2>("pull", kPull, share, sms);
    run<4, 4>("pull", kPull, share, sms);
    run<4, 2>("push", kPush, share, sms);
    run<4, 2>("local", kLocal, share, sms);
  }
  for (int mt : {128, 256}) {
    run_like<2, 4, true, 8>("as the kernels", mt, sms);
    run_like<2, 4, false, 8>("no stores", mt, sms);
    run_like<2, 0, true, 8>("no padding", mt, sms);
    run_like<2, 4, true, 2>("exact split loop", mt, sms);
    run_like<2, 0, false, 2>("none of them", mt, sms);
  }
  return 0;
}
