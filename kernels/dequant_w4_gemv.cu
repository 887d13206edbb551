// dequant_w4_gemv.cu: the w4-gemv layout back to an fp16 weight [N, K] on the GPU, for the batch
// sizes where dequantize + cuBLAS beats the fused kernels (w4cli.gpu.kernels.gemv picks it).
//
// out[n, k] = fp16((q - z) * s): the exact q - z from int4_convert.cuh, one mul.rn.f16x2 by the
// scale pair; the exact product has at most 4 + 11 significant bits, so one rounding gives the
// reference's fp16 (w4cli.formats.w4_gemv.dequantize) bit for bit.
//
// Layout in: qweight [N/8, Kp/128, 8, 16] int32, word [a, b, r, w] = row n = 8a + r, k = 128b + 8w
// + e (e = 0..7, nibble AWQ_REVERSE_ORDER[e]); qzeros [K/G, N/8] int32 (AWQ order along N);
// scales [K/G, N] fp16. Out: [N, K] fp16 row-major.
// Launch shape: one thread per packed word (8 k of one row), 256 threads per block; consecutive
// threads take consecutive words of one qweight tile row, so 16 threads store one contiguous
// 256-byte piece of an output row and a warp loads 128 contiguous bytes. Words at k >= K
// (padding) are skipped; K % 8 == 0 makes every word all-in or all-out.
// Constraints: K % 8 == 0, N % 8 == 0, K % G == 0, G % 8 == 0 or G == K (a word's 8 k share a
// group), K < 2^21, N < 2^31. Archs: sm_80+.
// Test: pytest -m gpu tests/test_batch_gpu.py.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "int4_convert.cuh"
#include "w4_kernels.h"

namespace w4 {
namespace {

__global__ void __launch_bounds__(256) dequant_w4_gemv_kernel(const uint32_t* __restrict__ qweight,
                                                              const uint32_t* __restrict__ qzeros,
                                                              const unsigned short* __restrict__ scales,
                                                              uint4* __restrict__ out, int K, int N,
                                                              int G, int kblocks, int64_t words) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= words) return;
  const int w = (int)(i & 15);
  const int r = (int)((i >> 4) & 7);
  const int64_t ab = i >> 7;  // a * kblocks + b
  const int b = (int)(ab % kblocks);
  const int n = (int)(ab / kblocks) * 8 + r;
  const int k = 128 * b + 8 * w;
  if (k >= K) return;
  const int grp = k / G;
  const uint32_t zword = __ldg(qzeros + (size_t)grp * (N >> 3) + (n >> 3));
  const uint32_t z = (zword >> (4 * ((r >> 1) + 4 * (r & 1)))) & 0xF;  // AWQ_REVERSE_ORDER[n % 8]
  const uint32_t s = (uint32_t)__ldg(scales + (size_t)grp * N + n) * 0x10001u;
  uint32_t d[4];
  u4x8_minus_zero_f16x8(__ldg(qweight + i), row_zero(z), d);
  uint4 v;
  v.x = mul_f16x2(d[0], s);
  v.y = mul_f16x2(d[1], s);
  v.z = mul_f16x2(d[2], s);
  v.w = mul_f16x2(d[3], s);
  out[((size_t)n * K + k) >> 3] = v;
}

}  // namespace

cudaError_t launch_dequant_w4_gemv(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                                   void* out, int64_t K, int64_t N, int64_t G, cudaStream_t stream) {
  if (K < 8 || K % 8 || N < 8 || N % 8 || G < 1 || K % G || (G % 8 && G != K) ||
      K >= (int64_t{1} << 21) || N >= (int64_t{1} << 31))
    return cudaErrorInvalidValue;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int64_t words = N * kblocks * 16;
  const int64_t blocks = (words + 255) / 256;
  dequant_w4_gemv_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(qweight), reinterpret_cast<const uint32_t*>(qzeros),
      static_cast<const unsigned short*>(scales), static_cast<uint4*>(out), static_cast<int>(K),
      static_cast<int>(N), static_cast<int>(G), kblocks, words);
  return cudaGetLastError();
}

}  // namespace w4
