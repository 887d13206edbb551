// read_pattern.cu: a standalone probe (not built into w4): how fast can the GEMV's weight access
// pattern read DRAM when the arithmetic is taken away? Answers dev/LOG.md, GEMV, step 18.
//
// Reads 122 MB (the int4 weights of an 8192x28672 layer) from 4 rotating buffers (> 4x L2), each
// 16-byte load `ld.global.nc.L1::no_allocate` with an L2 evict-first policy as in the kernel, and
// XOR-reduces the data (the result is stored only if it hits a magic value, so nothing is
// optimised away). Patterns, each with D k-blocks (2 x 512 B per warp) loaded before use:
//   linear       grid-stride 16-byte loads (the ceiling for a pure read)
//   w4-gemv      the layout [N/8][K/128][8][16] int32: warp w of tile t reads tiles 2t and 2t+1
//                (32 KB apart) over k-blocks [wP, (w+1)P), S warps per tile
//   kb-major     [K/128][N/8][8][16]: neighbouring tiles read neighbouring memory
//   tile-contig  [N/16][K/128][2][8][16]: one contiguous stream per warp
// Also timed: linear reads of 8.4 / 29.4 / 33.6 MB (the small shapes' int4 weights), with one and
// with four loads in flight per thread, and an empty kernel (the launch's fixed cost in a graph).
// Buffers hold a constant byte: plain cudaMalloc memory is never compressed, so the content does
// not change the read rate.
// Launch: one block of S warps per 16-row tile (1792 tiles), as the kernel. Timing: CUDA graph of
// 8 launches, 40 replays, median, GB/s of the bytes read.
// Build and run on a GPU machine (from the repository root):
//   mkdir -p build && nvcc -O3 -std=c++17 -arch=sm_90 -I kernels dev/probes/read_pattern.cu -o build/read_pattern
//   build/read_pattern
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "gemv_w4a16.cu"  // kernels/, through -I kernels
#include "probe.cuh"

// linear grid-stride read, U independent 16-byte loads in flight per thread
template <int U>
__global__ void lin_u(const uint4* __restrict__ a, size_t n, uint32_t* out) {
  uint32_t acc = 0; uint64_t pol = pol_ef();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ldw(a + i + u * stride, pol);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) { uint4 v = ldw(a + i, pol); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678) out[0] = acc;
}

// the fixed cost of one launch in this harness: a kernel that does nothing
__global__ void empty_kernel(uint32_t* out) { if (threadIdx.x == 1023) out[0] = 1; }

// mode 0: w4-gemv layout [N/8][KB][512B]: lo = tile 2t, hi = tile 2t+1 (kblocks*512 B apart)
// mode 1: k-block-major [KB][N/8][512B]
// mode 2: per 16-row tile contiguous [N/16][KB][1024B]
// D k-blocks loaded before use.
template <int D>
__global__ void gemv_like(const uint4* __restrict__ a, int kblocks, int tiles, int S, int mode, uint32_t* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tile = blockIdx.x;
  const int P = (kblocks + S - 1) / S;
  const int kb0 = warp * P, kb1 = min(kblocks, kb0 + P);
  uint64_t pol = pol_ef();
  uint32_t acc = 0;
  for (int kb = kb0; kb < kb1; kb += D) {
    uint4 v[D][2];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int k = min(kb + d, kb1 - 1);
      size_t lo, hi;
      if (mode == 0) { lo = ((size_t)(2 * tile) * kblocks + k) * 32; hi = lo + (size_t)kblocks * 32; }
      else if (mode == 1) { lo = ((size_t)k * (2 * tiles) + 2 * tile) * 32; hi = lo + 32; }
      else { lo = ((size_t)tile * kblocks + k) * 64; hi = lo + 32; }
      v[d][0] = ldw(a + lo + lane, pol); v[d][1] = ldw(a + hi + lane, pol);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) acc ^= v[d][0].x ^ v[d][0].y ^ v[d][1].z ^ v[d][1].w;
  }
  if (acc == 0x12345678) out[0] = acc;
}

int main() {
  const int K = 8192, N = 28672, kblocks = K / 128, tiles = N / 16;
  const size_t bytes = (size_t)K * N / 2, n4 = bytes / 16;
  const int NB = 4;
  std::vector<uint4*> buf(NB);
  for (auto& b : buf) { CK(cudaMalloc(&b, bytes)); CK(cudaMemset(b, 0x5a, bytes)); }
  uint32_t* out; CK(cudaMalloc(&out, 4));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  // time `launch` over `nb` rotating buffers (each of `nbytes`), graph of 2 rounds, median of 40
  auto time_n = [&](const char* name, size_t nbytes, int nb, auto launch) {
    const double us = graph_time_us(st, 2 * nb, 20, [&](int i) { launch(buf[i % nb]); });
    printf("%-40s %8.2f us  %7.0f GB/s\n", name, us, nbytes / (us * 1e3));
  };
  auto time = [&](const char* name, auto launch) { time_n(name, bytes, NB, launch); };
  time("linear 132x16 blocks x 256", [&](uint4* b) { lin_u<1><<<132 * 8, 256, 0, st>>>(b, n4, out); });
  time("linear 132x4 blocks x 512", [&](uint4* b) { lin_u<1><<<132 * 4, 512, 0, st>>>(b, n4, out); });
  // smaller reads (the int4 weights of 4096x4096, 4096x14336, 8192x8192): sub-buffers of the big
  // ones, as many as needed for > 4x the 60 MiB L2 per graph round (sub-buffer i of buffer i % 4)
  for (double mb : {8.4, 29.4, 33.6}) {
    const size_t nb_bytes = (size_t)(mb * 1e6) / 16 * 16;
    const int nb = (int)std::min<size_t>(bytes / nb_bytes * NB, (size_t)(4.0 * 60 * 1048576 / nb_bytes) + 1);
    std::vector<uint4*> sub(nb);
    for (int i = 0; i < nb; ++i) sub[i] = buf[i % NB] + (size_t)(i / NB) * (nb_bytes / 16);
    int idx = 0;
    char name[128];
    snprintf(name, sizeof name, "linear %.1f MB (%d sets)", mb, nb);
    time_n(name, nb_bytes, nb, [&](uint4*) { lin_u<1><<<132 * 8, 256, 0, st>>>(sub[idx++ % nb], nb_bytes / 16, out); });
    snprintf(name, sizeof name, "linear U=4 %.1f MB (%d sets)", mb, nb);
    time_n(name, nb_bytes, nb, [&](uint4*) { lin_u<4><<<132 * 8, 256, 0, st>>>(sub[idx++ % nb], nb_bytes / 16, out); });
    snprintf(name, sizeof name, "linear U=4 x2 blocks %.1f MB", mb);
    time_n(name, nb_bytes, nb, [&](uint4*) { lin_u<4><<<132 * 4, 512, 0, st>>>(sub[idx++ % nb], nb_bytes / 16, out); });
  }
  time_n("empty kernel 1056x256 (us only)", 0, NB, [&](uint4*) { empty_kernel<<<132 * 8, 256, 0, st>>>(out); });
  time_n("empty kernel 132x32 (us only)", 0, NB, [&](uint4*) { empty_kernel<<<132, 32, 0, st>>>(out); });
  const char* mn[3] = {"w4-gemv", "kb-major", "tile-contig"};
  for (int mode = 0; mode < 3; ++mode)
    for (int S : {1, 2, 4}) {
      char name[128];
      snprintf(name, sizeof name, "%s S=%d D=1", mn[mode], S);
      time(name, [&](uint4* b) { gemv_like<1><<<tiles, 32 * S, 0, st>>>(b, kblocks, tiles, S, mode, out); });
      snprintf(name, sizeof name, "%s S=%d D=2", mn[mode], S);
      time(name, [&](uint4* b) { gemv_like<2><<<tiles, 32 * S, 0, st>>>(b, kblocks, tiles, S, mode, out); });
      snprintf(name, sizeof name, "%s S=%d D=4", mn[mode], S);
      time(name, [&](uint4* b) { gemv_like<4><<<tiles, 32 * S, 0, st>>>(b, kblocks, tiles, S, mode, out); });
    }
  return 0;
}
