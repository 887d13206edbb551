// probe.cuh: what the standalone probes in kernels/probes/ share (not part of w4's build).
// Include after ../gemv_w4a16.cu: the probes read through the kernel's own load.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

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
// exactly as the kernel does. Include ../gemv_w4a16.cu before this header.
__device__ __forceinline__ uint64_t pol_ef() { return w4::evict_first_policy(); }
__device__ __forceinline__ uint4 ldw(const uint4* p, uint64_t pol) { return w4::load_weight(p, pol); }
