// tensor_core.cuh: the memory and tensor-core instructions the GEMV and the batch kernel share.
// Device functions only, sm_80+ (mma.sync m16n8k16, L2 cache hints).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace w4 {

// Weights are read exactly once: tell L2 to evict them first so that the activations, scales
// and zeros (re-read by every row tile) stay resident.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes of weights straight into registers, L1 bypassed (nothing re-reads them).
__device__ __forceinline__ uint4 load_weight(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile(
      "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
  return v;
}

// fp16 A (row) x fp16 B (col) -> fp32, 16x8x16, accumulating into c in place.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace w4
