// partial_read.cu: how fast a block reads another block's fp32 partial tile back from global memory
// (lab only), as the warp-specialised kernel's stream-K does at the end of a cut tile. Each of
// `blocks` blocks (one per SM) reads its own partial of `kb` KB, just written by another kernel (so
// in L2), two ways, timed per block from its start to every byte in registers (global timer,
// median and slowest block):
//   lsu   every thread loads its 16-byte pieces with ld.global.cg, all of them issued before the
//         first use (stream_k_add: 32 pieces a thread for a 128 KB partial)
//   bulk  one thread starts bulk copies (cp.async.bulk.shared::cluster.global) of the partial into
//         shared memory, 32 KB a copy, completing on one mbarrier; then each thread reads its
//         pieces from shared memory
//   store the other direction, as stream_k_store: the pieces stored (st.global.cg), a fence in
//         every thread, a block barrier (timed from the loads' end)
//
//     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels dev/probes/partial_read.cu -o build/partial_read
//     build/partial_read
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe.cuh"

constexpr int kThreads = 256;
enum Way { kLsu = 0, kBulk = 1, kStore = 2 };  // kStore: read as kLsu, then store

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void write_partials(float4* p, int pieces) {
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < pieces * (int)gridDim.x; i += gridDim.x * kThreads)
    p[i] = make_float4(i, 1.f, 2.f, 3.f);
}

// kPieces: 16-byte pieces a thread (partial bytes = kPieces x 256 x 16)
template <int kPieces>
__global__ void __launch_bounds__(kThreads, 1) read_partial(const float4* __restrict__ p, int way, float* out,
                                                          unsigned long long* ns) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the mbarrier helpers and bulk copies: sm_90a only
  extern __shared__ __align__(1024) float4 sm[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    w4::mbar_init(bar_addr, 1);
    w4::fence_mbar_init();
  }
  __syncthreads();
  const float4* part = p + (size_t)blockIdx.x * kPieces * kThreads;
  const unsigned long long t0 = now_ns();
  float4 v[kPieces];
  if (way != kBulk) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) v[i] = __ldcg(part + i * kThreads + threadIdx.x);
  } else {
    constexpr uint32_t kBytes = kPieces * kThreads * 16, kChunk = 32 * 1024;
    if (threadIdx.x == 0) {
      w4::mbar_arrive_expect_tx(bar_addr, kBytes);
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
      for (uint32_t o = 0; o < kBytes; o += kChunk)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst + o),
            "l"(reinterpret_cast<const char*>(part) + o), "r"(kBytes - o < kChunk ? kBytes - o : kChunk),
            "r"(bar_addr)
            : "memory");
    }
    w4::mbar_wait(bar_addr, 0);
#pragma unroll
    for (int i = 0; i < kPieces; ++i) v[i] = sm[i * kThreads + threadIdx.x];
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kPieces; ++i) acc += v[i].x + v[i].y + v[i].z + v[i].w;
  __syncthreads();
  const unsigned long long t1 = now_ns();
  if (way == kStore) {  // the other direction, as stream_k_store: the partial stored, fenced, a barrier
    float4* mine = const_cast<float4*>(part) + (size_t)gridDim.x * kPieces * kThreads;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) __stcg(mine + i * kThreads + threadIdx.x, v[i]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ns[gridDim.x + blockIdx.x] = now_ns() - t1;
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
  if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
#endif
}

template <int kPieces>
void run(int blocks, int way, const float4* p, float* out, unsigned long long* ns) {
  const int smem = kPieces * kThreads * 16;
  CK(cudaFuncSetAttribute(read_partial<kPieces>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<unsigned long long> all;
  for (int rep = 0; rep < 21; ++rep) {
    write_partials<<<132, kThreads>>>(const_cast<float4*>(p), kPieces * kThreads);
    read_partial<kPieces><<<blocks, kThreads, smem>>>(p, way, out, ns);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (rep < 1) continue;
    std::vector<unsigned long long> h(2 * blocks);
    CK(cudaMemcpy(h.data(), ns, 2 * blocks * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    all.insert(all.end(), h.begin() + (way == kStore ? blocks : 0), h.begin() + (way == kStore ? 2 * blocks : blocks));
  }
  std::sort(all.begin(), all.end());
  const double med = all[all.size() / 2], worst = all.back();
  const double bytes = (double)kPieces * kThreads * 16;
  printf("%-5s partial %3d KB  blocks %3d  median %6.2f us (%5.1f B/ns)  slowest %6.2f us\n",
         way == kStore ? "store" : way == kBulk ? "bulk" : "lsu",
         (int)(bytes / 1024), blocks, med / 1e3, bytes / med, worst / 1e3);
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  float4* p;
  float* out;
  unsigned long long* ns;
  CK(cudaMalloc(&p, (size_t)2 * 132 * 32 * kThreads * 16));
  CK(cudaMalloc(&out, 132 * kThreads * sizeof(float)));
  CK(cudaMalloc(&ns, 2 * 132 * sizeof(unsigned long long)));
  for (int blocks : {1, 16, 48, 132})
    for (int way : {kLsu, kBulk, kStore}) {
      run<16>(blocks, way, p, out, ns);  // 64 KB: variants 2 and 3
      run<32>(blocks, way, p, out, ns);  // 128 KB: variants 4 and 5
    }
  return 0;
}
