// dequant_w4_awq.cu: AWQ "gemm" int4 checkpoint -> dense fp16 / bf16 / fp32 weight.
//
// Computes   W[n, k] = (q[k, n] - z[k / G, n]) * s[k / G, n]   rounded ONCE to the output dtype,
// bit-identical to w4cli.formats.awq_gemm.dequantize (exact float32 product, then one cast).
//
// Inputs (K = in_features, N = out_features, G = group size, all row-major, contiguous):
//   qweight [K, N/8]   int32  word (k, c) holds channels n = 8c..8c+7 of row k; nibble i (bits
//                             4i..4i+3) holds channel 8c + [0,2,4,6,1,3,5,7][i] (AWQ order)
//   qzeros  [K/G, N/8] int32  packed like qweight
//   scales  [K/G, N]   fp16 or bf16, 16-byte aligned (read as one 16-byte vector per word)
// Outputs (fp16, bf16 or fp32):
//   transpose = true:  [N, K]  (nn.Linear.weight, what `w4 dequantize` writes)
//   transpose = false: [K, N]  (the layout of vLLM's awq_dequantize, for dequantize-then-matmul)
//
// Arithmetic (see int4_convert.cuh for the magic numbers): q - z is formed exactly in fp16 with the
// 0x6400 trick (zero points prepared once per group). Then
//   fp16 out, fp16 scales: one mul.rn.f16x2. The exact product (q-z)*s has at most 4+11 significant
//                          bits, so rounding it once to fp16 equals rounding the exact fp32 product.
//   otherwise:             exact fp32 product (__fmul_rn of two exactly converted values), then one
//                          round-to-nearest-even cast (cvt.rn) to bf16 / fp16, or stored as fp32.
// No fast-math anywhere: flush-to-zero or contraction would break bit-exactness.
//
// Launch shape (1-D grid of tiles):
//   [N, K] kernel: a block of C * 16 threads owns C packed columns (8C channels) x TK rows,
//     TK = 16 * R, where R = 16 / sizeof(out) rows per thread (8 for 2-byte outputs, 4 for fp32;
//     TK = 128 / 64). C = 16 (256 threads, 32 KB of shared memory) by default; C = 32 (512
//     threads, 64 KB, two blocks per SM) for 2-byte outputs with G % 8 == 0 on grids of at least
//     16 waves, where reading 128 B instead of 64 B of each qweight row per block measured 2
//     points faster (dev/LOG.md). Thread (cl = tid % C, kq = tid / C) loads R words of column
//     cl (coalesced 4C-byte row pieces), dequantizes them, transposes 8 x R values in registers
//     (byte permutes) into 8 16-byte units "R consecutive k of one channel", and stores them to
//     the shared tile [8C channels][16 units], unit index XOR-swizzled by cl mod 16
//     (conflict-free in both phases). After one barrier every thread copies 8 units out: 16
//     consecutive units = one contiguous row piece of TK*sizeof(out) bytes (256 B for fp16) of
//     out[n, :], 16-byte streaming stores.
//     Tiles are ordered in bands of kDefaultBand column tiles, column-fastest inside a band, then
//     k: blocks in flight together read whole 128-byte lines of qweight rows and extend the same
//     output rows.
//   [K, N] kernel: a block owns 64 packed columns x 32 rows; each thread 8 rows of one column
//     (4-byte coalesced loads, scales/zeros loaded once per thread when G % 8 == 0) and writes
//     8 channels per row as one 16-byte store (two for fp32), 512 contiguous bytes per warp.
// Tails: K and N/8 need not be multiples of any tile. Out-of-range rows/columns are clamped on
//   load and never stored; when K is not a multiple of R the [N, K] rows are not 16-byte aligned
//   and the kernel stores element by element.
// Constraints: N % 8 == 0, K % G == 0, G >= 1 (any G; G % R == 0 takes the one-group-per-thread
//   fast path), K, N < 2^31, scales 16-byte aligned. Checked by kernels/ops.cpp.
// Archs: sm_80+ (bf16 conversions); built for the present GPU only (sm_90 on Hopper).
// Test: pytest -m gpu tests/test_kernels_gpu.py.  Bench: dev/run_device.sh.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "int4_convert.cuh"
#include "w4_kernels.h"

namespace w4 {
namespace {

constexpr int kThreads = 256;
// [N, K] tile order: column tiles per band (see dequant_awq_nk_kernel); chosen by measurement.
constexpr int kDefaultBand = 4;

// Zero points and scales of one packed column within one group.
struct GroupParams {
  ZeroF16x8 z;
  uint32_t s[4];  // scale pairs (s[2j], s[2j+1]) as raw fp16x2 or bf16x2 bits
};

template <typename ScaleT>
__device__ __forceinline__ GroupParams load_group(const uint32_t* __restrict__ qzeros,
                                                  const ScaleT* __restrict__ scales, int g, int c,
                                                  int Nw) {
  // Scales and zeros are small and re-read by the other blocks of the same column: keep them
  // cacheable (__ldg: read-only path).
  const uint32_t zw = __ldg(qzeros + (size_t)g * Nw + c);
  const uint4 s = __ldg(reinterpret_cast<const uint4*>(scales + (size_t)g * Nw * 8 + (size_t)c * 8));
  GroupParams p;
  p.z = prepare_zero_f16x8(zw);
  p.s[0] = s.x;
  p.s[1] = s.y;
  p.s[2] = s.z;
  p.s[3] = s.w;
  return p;
}

template <typename ScaleT>
__device__ __forceinline__ float2 scale_pair_to_float2(uint32_t bits) {
  if constexpr (std::is_same_v<ScaleT, __half>) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = bits;
    return __half22float2(h);  // exact
  } else {
    // bf16 is the top half of an fp32: exact by construction.
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xFFFF0000u));
  }
}

// 32-bit words per 8 output values: 4 for 2-byte outputs, 8 for fp32.
template <typename OutT>
constexpr int kWordsPer8 = 2 * (int)sizeof(OutT);

// One packed word -> its 8 outputs (natural channel order) as raw bits:
// 2-byte outputs: v[j] = (out[2j] low, out[2j+1] high); fp32: v[j] = out[j].
template <typename OutT, typename ScaleT>
__device__ __forceinline__ void dequant_word(uint32_t w, const GroupParams& p,
                                             uint32_t (&v)[kWordsPer8<OutT>]) {
  uint32_t d[4];
  u4x8_minus_zero_f16x8(w, p.z, d);  // exact q - z, fp16 pairs
  if constexpr (std::is_same_v<OutT, __half> && std::is_same_v<ScaleT, __half>) {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = mul_f16x2(d[j], p.s[j]);  // single rounding
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      __half2 dh;
      *reinterpret_cast<uint32_t*>(&dh) = d[j];
      const float2 df = __half22float2(dh);
      const float2 sf = scale_pair_to_float2<ScaleT>(p.s[j]);
      const float a = __fmul_rn(df.x, sf.x);  // exact: <= 4 + 11 (fp16) or 4 + 8 (bf16) bits
      const float b = __fmul_rn(df.y, sf.y);
      if constexpr (std::is_same_v<OutT, float>) {
        v[2 * j] = __float_as_uint(a);
        v[2 * j + 1] = __float_as_uint(b);
      } else if constexpr (std::is_same_v<OutT, __half>) {
        const __half2 o = __floats2half2_rn(a, b);  // the one rounding
        v[j] = *reinterpret_cast<const uint32_t*>(&o);
      } else {
        const __nv_bfloat162 o = __floats2bfloat162_rn(a, b);  // the one rounding
        v[j] = *reinterpret_cast<const uint32_t*>(&o);
      }
    }
  }
}

// 16-byte global store; .cs = "streaming, likely accessed once": the output is never re-read by
// this kernel, so it should not evict the scales/zeros other blocks still need from L2.
__device__ __forceinline__ void store16(void* ptr, uint4 v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Element i of a 16-byte unit, for the unaligned tail path.
template <typename OutT, int I>
__device__ __forceinline__ OutT unit_elem(const uint4& u) {
  constexpr int kPer32 = 4 / (int)sizeof(OutT);
  const uint32_t word = (&u.x)[I / kPer32];
  if constexpr (sizeof(OutT) == 4) {
    return __uint_as_float(word);
  } else {
    const unsigned short bits = (unsigned short)(word >> (16 * (I % 2)));
    OutT o;
    *reinterpret_cast<unsigned short*>(&o) = bits;
    return o;
  }
}

template <typename OutT, int I, int R>
__device__ __forceinline__ void store_tail(OutT* dst, const uint4& u, int count) {
  if constexpr (I < R) {
    if (I < count) dst[I] = unit_elem<OutT, I>(u);
    store_tail<OutT, I + 1, R>(dst, u, count);
  }
}

// ------------------------------------------------------------------------------------------------
// [N, K] output: transpose through shared memory.
template <typename OutT, typename ScaleT, bool kAligned, int kCols>
__global__ void __launch_bounds__(kCols * 16)
    dequant_awq_nk_kernel(const uint32_t* __restrict__ qweight, const uint32_t* __restrict__ qzeros,
                          const ScaleT* __restrict__ scales, OutT* __restrict__ out, int K, int Nw,
                          int G, int tiles_k, int tiles_c, int band) {
  constexpr int R = 16 / (int)sizeof(OutT);  // rows per thread: one 16-byte unit per channel
  constexpr int TK = 16 * R;                 // rows per tile
  constexpr int kW = kWordsPer8<OutT>;
  constexpr int kBlock = kCols * 16;         // threads
  // [channel within tile][16-byte unit = R consecutive k] (dynamic: kCols * 2 KB); unit index
  // XOR-swizzled with the packed column (channel / 8) mod 16: phase 1 (writes) and phase 2
  // (reads) both hit all bank groups.
  extern __shared__ uint4 nk_smem[];
  auto tile = reinterpret_cast<uint4 (*)[16]>(nk_smem);

  const int tid = threadIdx.x;
  // Tile order: bands of `band` column tiles; inside a band, column-fastest then k. Blocks in
  // flight together then read band*64 contiguous bytes of each qweight row and extend the same
  // output rows (band = 1: k-fastest; band = tiles_c: column-fastest).
  const int per_band = band * tiles_k;
  const int band_start = (blockIdx.x / per_band) * band;
  const int band_w = min(band, tiles_c - band_start);
  const int rem = blockIdx.x % per_band;
  const int tc = band_start + rem % band_w;
  const int tk = rem / band_w;
  const int k0 = tk * TK;
  const int c0 = tc * kCols;
  const int cl = tid % kCols;
  const int kq = tid / kCols;
  const int c = min(c0 + cl, Nw - 1);  // clamped: tail columns compute garbage, never stored
  const int kb = k0 + kq * R;

  // All R loads in flight before the first use.
  uint32_t w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int k = min(kb + r, K - 1);
    w[r] = __ldg(qweight + (size_t)k * Nw + c);
  }

  uint32_t v[R][kW];
  if constexpr (kAligned) {  // G % R == 0: the thread's R rows share one group
    const GroupParams p = load_group(qzeros, scales, min(kb, K - 1) / G, c, Nw);
#pragma unroll
    for (int r = 0; r < R; ++r) dequant_word<OutT, ScaleT>(w[r], p, v[r]);
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const GroupParams p = load_group(qzeros, scales, min(kb + r, K - 1) / G, c, Nw);
      dequant_word<OutT, ScaleT>(w[r], p, v[r]);
    }
  }

  // Register transpose: unit for channel e = its R values along k.
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    uint4 u;
    if constexpr (sizeof(OutT) == 2) {
      // v[r][e/2] holds channels (e&~1, e|1) of row r; pick the half for e from rows r, r+1.
      const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;
      u.x = __byte_perm(v[0][e / 2], v[1][e / 2], sel);
      u.y = __byte_perm(v[2][e / 2], v[3][e / 2], sel);
      u.z = __byte_perm(v[4][e / 2], v[5][e / 2], sel);
      u.w = __byte_perm(v[6][e / 2], v[7][e / 2], sel);
    } else {
      u = make_uint4(v[0][e], v[1][e], v[2][e], v[3][e]);
    }
    tile[cl * 8 + e][kq ^ (cl & 15)] = u;
  }
  __syncthreads();

  const int N = Nw * 8;
  const bool vec = (K % R) == 0;  // rows of out start 16-byte aligned
#pragma unroll
  for (int i = 0; i < (kCols * 8 * 16) / kBlock; ++i) {
    const int idx = i * kBlock + tid;
    const int nl = idx >> 4;  // channel within tile
    const int u = idx & 15;   // unit within the row piece
    const uint4 val = tile[nl][u ^ ((nl >> 3) & 15)];
    const int n = c0 * 8 + nl;
    const int k = k0 + u * R;
    if (n < N && k < K) {
      OutT* dst = out + (size_t)n * K + k;
      if (vec) {
        store16(dst, val);
      } else {
        store_tail<OutT, 0, R>(dst, val, K - k);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// [K, N] output: no transpose; each word's 8 channels are contiguous in the output row.
constexpr int kKnRows = 8;   // rows per thread
constexpr int kKnCols = 64;  // packed columns per block
template <typename OutT, typename ScaleT, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    dequant_awq_kn_kernel(const uint32_t* __restrict__ qweight, const uint32_t* __restrict__ qzeros,
                          const ScaleT* __restrict__ scales, OutT* __restrict__ out, int K, int Nw,
                          int G, int tiles_c) {
  constexpr int kW = kWordsPer8<OutT>;
  const int tid = threadIdx.x;
  const int tc = blockIdx.x % tiles_c;
  const int tk = blockIdx.x / tiles_c;
  const int c = tc * kKnCols + (tid % kKnCols);
  const int kb = tk * (kThreads / kKnCols) * kKnRows + (tid / kKnCols) * kKnRows;
  if (c >= Nw || kb >= K) return;  // no barrier in this kernel

  uint32_t w[kKnRows];
#pragma unroll
  for (int r = 0; r < kKnRows; ++r) {
    const int k = min(kb + r, K - 1);
    w[r] = __ldg(qweight + (size_t)k * Nw + c);
  }
  const size_t N = (size_t)Nw * 8;
  GroupParams p;
  if constexpr (kAligned) p = load_group(qzeros, scales, kb / G, c, Nw);
#pragma unroll
  for (int r = 0; r < kKnRows; ++r) {
    const int k = kb + r;
    if (k < K) {
      if constexpr (!kAligned) p = load_group(qzeros, scales, k / G, c, Nw);
      uint32_t v[kW];
      dequant_word<OutT, ScaleT>(w[r], p, v);
      uint4* dst = reinterpret_cast<uint4*>(out + (size_t)k * N + (size_t)c * 8);
#pragma unroll
      for (int q = 0; q < kW / 4; ++q)
        store16(dst + q, make_uint4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// [N, K] launch for a tile of kCols packed columns (kCols * 16 threads, kCols * 2 KB of shared).
template <typename OutT, typename ScaleT, int kCols>
cudaError_t launch_nk(const uint32_t* qw, const uint32_t* qz, const ScaleT* s, OutT* out, int K,
                      int Nw, int G, int band, cudaStream_t stream) {
  constexpr int R = 16 / (int)sizeof(OutT);
  constexpr int kSmem = kCols * 8 * 16 * 16;
  const int tiles_k = (K + 16 * R - 1) / (16 * R);
  const int tiles_c = (Nw + kCols - 1) / kCols;
  const long long blocks = (long long)tiles_k * tiles_c;
  if (blocks > 0x7FFFFFFFLL) return cudaErrorInvalidValue;
  band = max(1, min(band, tiles_c));
  auto kernel = (G % R == 0) ? dequant_awq_nk_kernel<OutT, ScaleT, true, kCols>
                             : dequant_awq_nk_kernel<OutT, ScaleT, false, kCols>;
  if (kSmem > 48 * 1024) {  // above 48 KB a kernel must opt in
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) return e;
  }
  kernel<<<(unsigned)blocks, kCols * 16, kSmem, stream>>>(qw, qz, s, out, K, Nw, G, tiles_k, tiles_c, band);
  return cudaGetLastError();
}

// The 32-column tile reads 128 B of each qweight row per block instead of 64 and was 2 points
// faster on 8192x28672 and 28672x8192 (dev/LOG.md, dequantize), but its 64 KB blocks
// (two per SM) drain more slowly at the end of a grid: it lost 1-3 points on layers of a few waves.
// Used for 2-byte outputs with one group per thread's rows, from kWideMinWaves waves on.
constexpr int kWideMinWaves = 16;
bool use_wide_tile(int K, int Nw, int out_bytes, bool aligned) {
  if (out_bytes != 2 || !aligned) return false;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return false;
  const long long blocks = (long long)((K + 127) / 128) * ((Nw + 31) / 32);
  return blocks >= (long long)kWideMinWaves * 2 * sms;
}

template <typename OutT, typename ScaleT>
cudaError_t launch_typed(const uint32_t* qw, const uint32_t* qz, const void* scales, void* out_,
                         int K, int Nw, int G, bool transpose, cudaStream_t stream) {
  const auto* s = static_cast<const ScaleT*>(scales);
  auto* out = static_cast<OutT*>(out_);
  if (transpose) {
    constexpr int R = 16 / (int)sizeof(OutT);
    if (use_wide_tile(K, Nw, (int)sizeof(OutT), G % R == 0))  // half the band: the same bytes per band
      return launch_nk<OutT, ScaleT, 32>(qw, qz, s, out, K, Nw, G, kDefaultBand / 2, stream);
    return launch_nk<OutT, ScaleT, 16>(qw, qz, s, out, K, Nw, G, kDefaultBand, stream);
  } else {
    const int rows_per_block = (kThreads / kKnCols) * kKnRows;
    const int tiles_k = (K + rows_per_block - 1) / rows_per_block;
    const int tiles_c = (Nw + kKnCols - 1) / kKnCols;
    const long long blocks = (long long)tiles_k * tiles_c;
    if (blocks > 0x7FFFFFFFLL) return cudaErrorInvalidValue;
    if (G % kKnRows == 0)
      dequant_awq_kn_kernel<OutT, ScaleT, true>
          <<<(unsigned)blocks, kThreads, 0, stream>>>(qw, qz, s, out, K, Nw, G, tiles_c);
    else
      dequant_awq_kn_kernel<OutT, ScaleT, false>
          <<<(unsigned)blocks, kThreads, 0, stream>>>(qw, qz, s, out, K, Nw, G, tiles_c);
  }
  return cudaGetLastError();
}

template <typename ScaleT>
cudaError_t launch_scale(const uint32_t* qw, const uint32_t* qz, const void* s, void* out,
                         DType out_dtype, int K, int Nw, int G, bool transpose, cudaStream_t stream) {
  switch (out_dtype) {
    case DType::kF16:
      return launch_typed<__half, ScaleT>(qw, qz, s, out, K, Nw, G, transpose, stream);
    case DType::kBF16:
      return launch_typed<__nv_bfloat16, ScaleT>(qw, qz, s, out, K, Nw, G, transpose, stream);
    case DType::kF32:
      return launch_typed<float, ScaleT>(qw, qz, s, out, K, Nw, G, transpose, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_dequant_awq(const int32_t* qweight, const int32_t* qzeros, const void* scales,
                               DType scale_dtype, void* out, DType out_dtype, int64_t K, int64_t N,
                               int64_t G, bool transpose, cudaStream_t stream) {
  if (K < 1 || N < 8 || N % 8 != 0 || G < 1 || K % G != 0) return cudaErrorInvalidValue;
  if (K > 0x7FFFFFFFLL || N > 0x7FFFFFFFLL) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(scales) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return cudaErrorMisalignedAddress;
  const auto* qw = reinterpret_cast<const uint32_t*>(qweight);
  const auto* qz = reinterpret_cast<const uint32_t*>(qzeros);
  const int k = (int)K, nw = (int)(N / 8), g = (int)G;

  switch (scale_dtype) {
    case DType::kF16:
      return launch_scale<__half>(qw, qz, scales, out, out_dtype, k, nw, g, transpose, stream);
    case DType::kBF16:
      return launch_scale<__nv_bfloat16>(qw, qz, scales, out, out_dtype, k, nw, g, transpose, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace w4
