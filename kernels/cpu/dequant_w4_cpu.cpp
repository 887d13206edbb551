// dequant_w4_cpu.cpp: int4 weights (AWQ, GPTQ, compressed-tensors, still packed) -> dense [N, K]
// fp16 | bf16 | fp32 on the CPU, bit-identical to the pure-torch reference
// (w4cli/formats/unpacked.py: (q - z) * s exact in float32, rounded once to the output dtype).
// Built by w4cli/cpu/kernel.py with torch.utils.cpp_extension.load (C++ only, no CUDA).
//
// Packed layouts (K = in_features, N = out_features, nib[i] = bits 4i..4i+3 of an int32 word):
//   kAwq          words [K, N/8]        nib[i] of word [k, c] is channel n = 8c + AWQ_ORDER[i]
//   kKInColumns   words [K/8, N]        nib[i] of word [j, n] is k = 8j + i            (GPTQ)
//   kKInRows      words [N, ceil(K/8)]  nib[i] of word [n, j] is k = 8j + i, padded  (compressed-tensors)
//   zeros  [N, groups] uint8 0..15, scales [N, groups] fp16 | bf16, both contiguous;
//   g_idx  [K] int64 (act-order) or empty: then group(k) = k / (K / groups)
//
// Why a table: W[n, k] takes one of 16 values within a group, (q - z) * s for q = 0..15. Each value
// is computed once per (row, group) with the reference's exact float32 product and rounded by the
// same IEEE round-to-nearest-even as torch's cast, so every output is a lookup of a bit pattern the
// reference would produce: bit-exact by construction, whatever the subnormals, signed zeros or
// overflow. The products are exact (|q - z| <= 15 has 4 bits, a 16-bit scale at most 11), so no
// fused multiply-add or reordering can change them; the build still uses no fast-math flags.
//
// Work: blocks of kRows rows are handed out one at a time to torch's intra-op threads (at::parallel_for, so
// torch.set_num_threads and `w4 dequantize --threads` limit it). Each block walks K in tiles of
// kTile: stage 1 unpacks the tile's codes, one byte per weight in k order, into a per-thread buffer
// (kRows x kTile = 32 KiB, L1-resident) from whichever layout the words are in; stage 2 looks each
// row's codes up in its group's table and writes the output row segment. With AVX2 the lookup is
// two byte shuffles (vpshufb) per 32 weights from the table's low and high bytes; without it, a
// scalar loop. The AVX2 + F16C path is compiled with function target attributes and chosen at run
// time (__builtin_cpu_supports), so the build runs on any x86-64 and on other architectures too.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define W4_X86 1
#endif

namespace {

enum Layout : int64_t { kAwq = 0, kKInColumns = 1, kKInRows = 2 };
enum Out { kF16, kBF16, kF32 };

constexpr int64_t kRows = 64;   // rows per block: 8 AWQ word columns, 256 bytes of a GPTQ word row
constexpr int64_t kTile = 512;  // k per tile: a multiple of 8 (whole words) and of the usual groups
constexpr int kAwqShift[8] = {0, 16, 4, 20, 8, 24, 12, 28};  // channel j sits at bits 4 * AWQ_REVERSE_ORDER[j]

inline uint16_t bf16_bits(float f) {
  // torch's float -> bfloat16 (c10::detail::round_to_nearest_even): round half to even on the bits
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline uint16_t f16_bits(float f) { return c10::detail::fp16_ieee_from_fp32_value(f); }

inline float scale_value(const void* scales, bool bf16, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(scales)[i];
  if (!bf16) return c10::detail::fp16_ieee_to_fp32_value(bits);
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// the 8 nibbles of a word as 8 bytes, nibble i in byte i (little-endian: byte i is k = 8j + i)
inline uint64_t spread(uint32_t w) {
  uint64_t x = w;
  x = (x | (x << 16)) & 0x0000ffff0000ffffull;
  x = (x | (x << 8)) & 0x00ff00ff00ff00ffull;
  x = (x | (x << 4)) & 0x0f0f0f0f0f0f0f0full;
  return x;
}

#ifdef W4_X86
// 8 AWQ words of one column (k .. k + 7, `stride` words apart) -> the 8 channels' codes for those k,
// 8 bytes per channel row (rows kTile bytes apart): an 8 x 8 byte transpose in SSE2 (every x86-64
// has it). Nibble i of each word is channel AWQ_ORDER[i] = (0, 2, 4, 6, 1, 3, 5, 7)[i].
inline void awq_transpose8(const int32_t* col, int64_t stride, uint8_t* dst) {
  const __m128i nib = _mm_set1_epi8(0x0f);
  const __m128i w0 = _mm_setr_epi32(col[0], col[stride], col[2 * stride], col[3 * stride]);
  const __m128i w1 = _mm_setr_epi32(col[4 * stride], col[5 * stride], col[6 * stride], col[7 * stride]);
  // each word's 8 nibbles as 8 bytes in nibble order: rows k of the 8 x 8 matrix, two per register
  const __m128i r01 = _mm_unpacklo_epi8(_mm_and_si128(w0, nib), _mm_and_si128(_mm_srli_epi16(w0, 4), nib));
  const __m128i r23 = _mm_unpackhi_epi8(_mm_and_si128(w0, nib), _mm_and_si128(_mm_srli_epi16(w0, 4), nib));
  const __m128i r45 = _mm_unpacklo_epi8(_mm_and_si128(w1, nib), _mm_and_si128(_mm_srli_epi16(w1, 4), nib));
  const __m128i r67 = _mm_unpackhi_epi8(_mm_and_si128(w1, nib), _mm_and_si128(_mm_srli_epi16(w1, 4), nib));
  const __m128i a0 = _mm_unpacklo_epi8(r01, _mm_srli_si128(r01, 8));  // k0 k1 interleaved per nibble
  const __m128i a1 = _mm_unpacklo_epi8(r23, _mm_srli_si128(r23, 8));
  const __m128i a2 = _mm_unpacklo_epi8(r45, _mm_srli_si128(r45, 8));
  const __m128i a3 = _mm_unpacklo_epi8(r67, _mm_srli_si128(r67, 8));
  const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);  // k0..3 of nibbles 0-3, 4-7
  const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);  // k4..7
  const __m128i n01 = _mm_unpacklo_epi32(b0, b2), n23 = _mm_unpackhi_epi32(b0, b2);  // nibbles 0,1 | 2,3
  const __m128i n45 = _mm_unpacklo_epi32(b1, b3), n67 = _mm_unpackhi_epi32(b1, b3);
  auto store = [&](int channel, __m128i v, bool high) {
    if (high) v = _mm_srli_si128(v, 8);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + channel * kTile), v);
  };
  store(0, n01, false), store(2, n01, true), store(4, n23, false), store(6, n23, true);
  store(1, n45, false), store(3, n45, true), store(5, n67, false), store(7, n67, true);
}
#endif

struct Job {
  const int32_t* words;
  Layout layout;
  int64_t n, k, groups, group_size;  // group_size 0 with g_idx
  const uint8_t* zeros;
  const void* scales;
  bool scales_bf16;
  const int64_t* g_idx;  // nullptr: contiguous groups
  Out out;
  void* dst;
};

// stage 1: codes[r * kTile + (k - k0)] for rows n0 .. n0 + rows, k in [k0, k1); k0 a multiple of 8
void unpack_tile(const Job& job, int64_t n0, int64_t rows, int64_t k0, int64_t k1, uint8_t* codes) {
  const int64_t j0 = k0 / 8, j1 = (k1 + 7) / 8;
  if (job.layout == kAwq) {
    const int64_t stride = job.n / 8;
    int64_t k = k0;
#ifdef W4_X86
    for (; k + 8 <= k1; k += 8) {
      for (int64_t c = 0; c < rows / 8; ++c) {
        const int32_t* col = job.words + k * stride + n0 / 8 + c;
        awq_transpose8(col, stride, codes + (8 * c) * kTile + (k - k0));
      }
    }
#endif
    for (; k < k1; ++k) {
      const int32_t* row = job.words + k * stride + n0 / 8;
      for (int64_t c = 0; c < rows / 8; ++c) {
        const uint32_t w = static_cast<uint32_t>(row[c]);
        uint8_t* dst = codes + (8 * c) * kTile + (k - k0);
        for (int j = 0; j < 8; ++j) dst[j * kTile] = (w >> kAwqShift[j]) & 15u;
      }
    }
  } else if (job.layout == kKInColumns) {
    for (int64_t j = j0; j < j1; ++j) {
      const int32_t* row = job.words + j * job.n + n0;
      for (int64_t r = 0; r < rows; ++r) {
        const uint64_t x = spread(static_cast<uint32_t>(row[r]));
        std::memcpy(codes + r * kTile + 8 * (j - j0), &x, 8);
      }
    }
  } else {
    const int64_t stride = (job.k + 7) / 8;
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* row = job.words + (n0 + r) * stride;
      for (int64_t j = j0; j < j1; ++j) {
        const uint64_t x = spread(static_cast<uint32_t>(row[j]));
        std::memcpy(codes + r * kTile + 8 * (j - j0), &x, 8);
      }
    }
  }
}

// the 16 values (q - z) * s of one row and group, as output bits (float32 kept whole for kF32)
inline void group_table_scalar(const Job& job, int64_t n, int64_t g, uint32_t* table) {
  const int64_t i = n * job.groups + g;
  const float s = scale_value(job.scales, job.scales_bf16, i);
  const int z = job.zeros[i];
  for (int q = 0; q < 16; ++q) {
    const float v = static_cast<float>(q - z) * s;
    if (job.out == kF16) table[q] = f16_bits(v);
    else if (job.out == kBF16) table[q] = bf16_bits(v);
    else std::memcpy(&table[q], &v, 4);
  }
}

template <typename T>
inline void lookup_scalar(const uint8_t* codes, int64_t count, const uint32_t* table, T* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(table[codes[i]]);
}

void row_segment_scalar(const Job& job, int64_t n, int64_t k0, int64_t k1, const uint8_t* codes) {
  uint32_t table[16];
  const int64_t g_size = job.group_size;
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / g_size, end = std::min(k1, (g + 1) * g_size);
    group_table_scalar(job, n, g, table);
    if (job.out == kF32) {
      lookup_scalar(codes + (k - k0), end - k, table, static_cast<uint32_t*>(job.dst) + n * job.k + k);
    } else {
      lookup_scalar(codes + (k - k0), end - k, table, static_cast<uint16_t*>(job.dst) + n * job.k + k);
    }
    k = end;
  }
}

#ifdef W4_X86
// bf16_bits on 8 lanes (32-bit lanes holding the 16-bit result)
__attribute__((target("avx2,f16c"))) inline __m256i bf16_bits_avx2(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bias =
      _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
}

// the table of one row and group as two 16-byte shuffles (low and high bytes of 16-bit outputs)
__attribute__((target("avx2,f16c"))) inline void group_table_avx2(const Job& job, int64_t n, int64_t g,
                                                                  __m256i* low, __m256i* high) {
  const int64_t i = n * job.groups + g;
  const __m256 s = _mm256_set1_ps(scale_value(job.scales, job.scales_bf16, i));
  const __m256 z = _mm256_set1_ps(static_cast<float>(job.zeros[i]));
  const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 q1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
  // q - z is exact in float32, and so is its product with s: the reference's two float32 steps
  const __m256 v0 = _mm256_mul_ps(_mm256_sub_ps(q0, z), s);
  const __m256 v1 = _mm256_mul_ps(_mm256_sub_ps(q1, z), s);
  __m128i b0, b1;  // 8 x 16-bit output bits each
  if (job.out == kF16) {
    b0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    b1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    // packus works within 128-bit lanes: q 0-3, 8-11 | 4-7, 12-15, put back in order
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits_avx2(v0), bf16_bits_avx2(v1)), 0xd8);
    b0 = _mm256_castsi256_si128(packed);
    b1 = _mm256_extracti128_si256(packed, 1);
  }
  const __m128i mask = _mm_set1_epi16(0xff);
  const __m128i lo = _mm_packus_epi16(_mm_and_si128(b0, mask), _mm_and_si128(b1, mask));
  const __m128i hi = _mm_packus_epi16(_mm_srli_epi16(b0, 8), _mm_srli_epi16(b1, 8));
  *low = _mm256_broadcastsi128_si256(lo);
  *high = _mm256_broadcastsi128_si256(hi);
}

// The output goes to memory with streaming stores where 32 bytes are aligned (every store when K is
// a multiple of 16): the writer reads it back only after the whole layer, from memory either way,
// and a plain store would first read each line it fills. Half the memory traffic; one layer of
// 4096 x 14336 fp16 went from 48 to 26 ms (GPTQ) on one thread (dev/LOG.md). The block's rows end
// with a store fence (run_blocks), so the data is in memory before parallel_for returns.
__attribute__((target("avx2,f16c"))) inline void store_streaming(uint16_t* dst, __m256i v) {
  if ((reinterpret_cast<uintptr_t>(dst) & 31) == 0) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), v);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
}

__attribute__((target("avx2,f16c"))) void row_segment_avx2(const Job& job, int64_t n, int64_t k0, int64_t k1,
                                                           const uint8_t* codes) {
  const int64_t g_size = job.group_size;
  uint16_t* out = static_cast<uint16_t*>(job.dst) + n * job.k;
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / g_size, end = std::min(k1, (g + 1) * g_size);
    __m256i low, high;
    group_table_avx2(job, n, g, &low, &high);
    for (; k + 32 <= end; k += 32) {
      const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (k - k0)));
      const __m256i lo = _mm256_shuffle_epi8(low, idx), hi = _mm256_shuffle_epi8(high, idx);
      const __m256i a = _mm256_unpacklo_epi8(lo, hi);  // k 0..7 | 16..23
      const __m256i b = _mm256_unpackhi_epi8(lo, hi);  // k 8..15 | 24..31
      store_streaming(out + k, _mm256_permute2x128_si256(a, b, 0x20));
      store_streaming(out + k + 16, _mm256_permute2x128_si256(a, b, 0x31));
    }
    if (k < end) {
      alignas(32) uint8_t lo_bytes[32], hi_bytes[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lo_bytes), low);
      _mm256_store_si256(reinterpret_cast<__m256i*>(hi_bytes), high);
      for (; k < end; ++k) {
        const uint8_t q = codes[k - k0];
        out[k] = static_cast<uint16_t>(lo_bytes[q] | (hi_bytes[q] << 8));
      }
    }
  }
}

bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }
#else
bool has_avx2() { return false; }
#endif

// act-order rows: each k has its own group, so a block's tables (rows x groups x 16) come first
void row_segment_gathered(const Job& job, int64_t n, int64_t k0, int64_t k1, const uint8_t* codes,
                          const uint32_t* tables) {
  for (int64_t k = k0; k < k1; ++k) {
    const uint32_t v = tables[16 * job.g_idx[k] + codes[k - k0]];
    if (job.out == kF32) static_cast<uint32_t*>(job.dst)[n * job.k + k] = v;
    else static_cast<uint16_t*>(job.dst)[n * job.k + k] = static_cast<uint16_t>(v);
  }
}

void run_blocks(const Job& job, int64_t first, int64_t last, bool simd) {
  std::vector<uint8_t> codes(kRows * kTile);
  std::vector<uint32_t> tables;  // act-order only: the block's tables, [rows][groups][16]
  for (int64_t block = first; block < last; ++block) {
    const int64_t n0 = block * kRows, rows = std::min(kRows, job.n - n0);
    if (job.g_idx != nullptr) {
      tables.resize(rows * job.groups * 16);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < job.groups; ++g) group_table_scalar(job, n0 + r, g, &tables[(r * job.groups + g) * 16]);
    }
    for (int64_t k0 = 0; k0 < job.k; k0 += kTile) {
      const int64_t k1 = std::min(job.k, k0 + kTile);
      unpack_tile(job, n0, rows, k0, k1, codes.data());
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row_codes = codes.data() + r * kTile;
        if (job.g_idx != nullptr) row_segment_gathered(job, n0 + r, k0, k1, row_codes, &tables[r * job.groups * 16]);
#ifdef W4_X86
        else if (simd && job.out != kF32) row_segment_avx2(job, n0 + r, k0, k1, row_codes);
#endif
        else row_segment_scalar(job, n0 + r, k0, k1, row_codes);
      }
    }
  }
#ifdef W4_X86
  _mm_sfence();
#endif
}

// Output memory, recycled. A fresh allocation of tens of MB is new pages from the kernel: a fault
// and a zeroed page per 4 KiB, and a TLB shootdown on every thread when it is unmapped, which cost
// as much as the dequantization itself (a fresh [14336, 4096] fp16 tensor takes 47 ms to fill on
// this class of machine, 17 ms when reused). `w4 dequantize` frees each output once the writer has
// written it, so a few buffers go round: up to kKeptBuffers idle ones are kept for the next
// outputs (the smallest that fits is taken), the rest go back to the system.
class BufferPool {
 public:
  at::Tensor take(int64_t n, int64_t k, at::ScalarType dtype) {
    const size_t bytes = static_cast<size_t>(n) * k * c10::elementSize(dtype);
    void* data = nullptr;
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> hold(mutex_);
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->second >= bytes && (best == idle_.end() || it->second < best->second)) best = it;
      if (best != idle_.end()) {
        data = best->first, capacity = best->second;
        idle_.erase(best);
      }
    }
    if (data == nullptr) {
      capacity = (bytes + 63) / 64 * 64;
      data = std::aligned_alloc(64, capacity);
      TORCH_CHECK(data != nullptr, "out of memory allocating " + std::to_string(capacity) + " bytes");
    }
    return at::from_blob(data, {n, k}, [this, capacity](void* p) { give_back(p, capacity); },
                         at::TensorOptions().dtype(dtype));
  }

 private:
  static constexpr size_t kKeptBuffers = 2;

  void give_back(void* data, size_t capacity) {
    void* drop = nullptr;
    {
      std::lock_guard<std::mutex> hold(mutex_);
      idle_.emplace_back(data, capacity);
      if (idle_.size() > kKeptBuffers) {  // the smallest goes: the large ones fit every later output
        auto smallest = std::min_element(idle_.begin(), idle_.end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; });
        drop = smallest->first;
        idle_.erase(smallest);
      }
    }
    std::free(drop);
  }

  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> idle_;
};

BufferPool& output_buffers() {
  static BufferPool* pool = new BufferPool();  // never destroyed: tensors may outlive static destruction
  return *pool;
}

std::string shape(const at::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + " [";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void expect(const at::Tensor& t, const char* name, at::ScalarType dtype, std::vector<int64_t> sizes) {
  std::string want = std::string(c10::toString(dtype)) + " [";
  for (size_t i = 0; i < sizes.size(); ++i) want += (i ? ", " : "") + std::to_string(sizes[i]);
  want += "]";
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.sizes().vec() == sizes && t.is_contiguous(),
              std::string(name) + " must be a contiguous CPU " + want + ", got " + shape(t));
}

// words int32 (layout above); zeros uint8 [N, groups]; scales fp16|bf16 [N, groups]; g_idx int64 [K]
// or empty -> [N, K] in dtype. simd false: the scalar loop even where AVX2 exists (for the tests).
at::Tensor dequantize_w4(const at::Tensor& words, int64_t layout, int64_t n, int64_t k, const at::Tensor& zeros,
                         const at::Tensor& scales, const at::Tensor& g_idx, at::ScalarType dtype, bool simd) {
  TORCH_CHECK(n > 0 && k > 0, "N and K must be positive");
  TORCH_CHECK(layout == kAwq || layout == kKInColumns || layout == kKInRows, "unknown layout");
  const int64_t groups = zeros.dim() == 2 ? zeros.size(1) : 0;
  TORCH_CHECK(groups > 0, "zeros must be [N, groups], got " + shape(zeros));
  const std::vector<int64_t> words_shape =
      layout == kAwq ? std::vector<int64_t>{k, n / 8}
                     : (layout == kKInColumns ? std::vector<int64_t>{k / 8, n} : std::vector<int64_t>{n, (k + 7) / 8});
  TORCH_CHECK(layout != kAwq || n % 8 == 0, "the AWQ layout needs N a multiple of 8");
  TORCH_CHECK(layout != kKInColumns || k % 8 == 0, "the GPTQ layout needs K a multiple of 8");
  expect(words, "words", at::kInt, words_shape);
  expect(zeros, "zeros", at::kByte, {n, groups});
  TORCH_CHECK(scales.scalar_type() == at::kHalf || scales.scalar_type() == at::kBFloat16,
              "scales must be float16 or bfloat16, got " + shape(scales));
  expect(scales, "scales", scales.scalar_type(), {n, groups});
  const bool gathered = g_idx.numel() > 0;
  if (gathered) {
    expect(g_idx, "g_idx", at::kLong, {k});
    const auto [low, high] = at::aminmax(g_idx);
    TORCH_CHECK(low.item<int64_t>() >= 0 && high.item<int64_t>() < groups, "g_idx names a group outside 0.." +
                std::to_string(groups - 1));
  } else {
    TORCH_CHECK(k % groups == 0, "K must be a multiple of the group count without g_idx");
  }
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat,
              std::string("the output dtype must be float16, bfloat16 or float32, got ") + c10::toString(dtype));
  at::Tensor out = output_buffers().take(n, k, dtype);
  const Job job{words.data_ptr<int32_t>(), static_cast<Layout>(layout), n, k, groups, gathered ? 0 : k / groups,
                zeros.data_ptr<uint8_t>(), scales.data_ptr(), scales.scalar_type() == at::kBFloat16,
                gathered ? g_idx.data_ptr<int64_t>() : nullptr,
                dtype == at::kHalf ? kF16 : (dtype == at::kBFloat16 ? kBF16 : kF32), out.data_ptr()};
  const bool use_simd = simd && has_avx2();
  {
    // the writer thread writes the previous tensor meanwhile: it needs the GIL only between writes
    pybind11::gil_scoped_release no_gil;
    // Blocks are handed out one at a time rather than split in equal shares up front: the writer
    // thread (and anything else on the machine) takes cores away unevenly, and an equal share
    // would make the whole layer wait for the thread that got the least CPU.
    const int64_t blocks = (n + kRows - 1) / kRows;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(blocks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
      for (int64_t block = next++; block < blocks; block = next++) run_blocks(job, block, block + 1, use_simd);
    });
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dequantize_w4", &dequantize_w4, "packed int4 (AWQ, GPTQ, compressed-tensors) -> dense [N, K], bit-exact");
  m.def("has_avx2", &has_avx2, "whether this CPU runs the AVX2 + F16C path");
}
