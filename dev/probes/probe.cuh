// probe.cuh: what the standalone probes in dev/probes/ share (not part of w4's build): error
// checks, the kernels' own instructions (kernels/tensor_core.cuh: build with -I kernels), the
// GEMV's weight load and the graph timing.
#pragma once

#include <cuda_runtime.h>

#include "tensor_core.cuh"  // kernels/, through -I kernels

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>

// A probe has nothing to recover to: report the failing call and stop.
#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

// The GEMV's own weight load (16 bytes, no L1 allocation, L2 evict-first), so a probe reads
// exactly as the kernel does.
__device__ __forceinline__ uint64_t pol_ef() { return w4::evict_first_policy(); }
__device__ __forceinline__ uint4 ldw(const uint4* p, uint64_t pol) { return w4::load_weight(p, pol); }

// The harness's method in miniature: `warmup` launches, then a CUDA graph of `per_graph` launches
// (launch(i) picks the i-th rotating input set) replayed 40 times; median us per launch.
template <class Launch>
double graph_time_us(cudaStream_t st, int per_graph, int warmup, Launch launch) {
  for (int i = 0; i < warmup; ++i) launch(i);
  CK(cudaStreamSynchronize(st));
  cudaGraph_t gr;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < per_graph; ++i) launch(i);
  CK(cudaStreamEndCapture(st, &gr));
  CK(cudaGraphInstantiate(&ge, gr, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int r = 0; r < 40; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.f / per_graph);
  }
  CK(cudaGetLastError());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(gr));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return (double)t[t.size() / 2];
}
