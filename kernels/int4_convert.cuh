// int4_convert.cuh: unsigned int4 -> fp16 / bf16 conversion with lop3 and magic numbers.
//
// Self-contained (CUDA headers only, no torch): included by the dequantize kernel and by the GEMV
// kernel. Device functions only. Requires sm_80+ (bf16 arithmetic); the fp16 path needs sm_75+.
//
// ---------------------------------------------------------------------------------------------
// The trick, once.
//
// fp16 is [sign:1][exponent:5][mantissa:10]. 0x6400 has exponent 25 (bias 15 -> 2^10) and a zero
// mantissa, so it is 1024.0. Between 1024 and 2048 the spacing of fp16 values is exactly 1.0 (10
// mantissa bits cover 2^10 steps of one unit), so writing an integer q in 0..15 into the low
// mantissa bits gives the fp16 number 1024 + q, exactly. No int->float conversion instruction is
// needed: one bitwise OR builds the float, one subtraction of 1024 removes the bias.
//
// A 32-bit register holds two fp16 values (f16x2), so a mask of 0x000F000F picks two nibbles at
// once -- bits 0..3 and bits 16..19 -- and OR-ing with 0x64006400 makes the pair (1024+q_a,
// 1024+q_b). `lop3.b32 d, a, b, c, LUT` computes any 3-input bitwise function; the LUT is found by
// evaluating the wanted function on the canonical operands a=0xF0, b=0xCC, c=0xAA:
// (a & b) | c = (0xF0 & 0xCC) | 0xAA = 0xC0 | 0xAA = 0xEA. So one lop3 with LUT 0xEA does the
// mask-and-OR in a single instruction.
//
// The next nibble up (bits 4..7 and 20..23) is extracted with the mask 0x00F000F0 without shifting:
// it lands at mantissa bits 4..7, i.e. the value is 1024 + 16q. One fma with 1/16 (0x2C00) and
// -64 (0xD400) turns it into (1024 + 16q)/16 - 64 = q; every intermediate is a small integer, so
// the fma is exact. sub and fma have the same throughput, so this saves a shift per pair.
// A single shift of the word by 8 then exposes nibbles 2, 3, 6, 7 to the same two masks. Total per
// 32-bit word (8 values): 1 shift, 4 lop3, 2 sub + 2 fma.
//
// Which values land together: lop3 with mask 0x000F000F on w gives (nib0, nib4); mask 0x00F000F0
// gives (nib1, nib5); on w >> 8: (nib2, nib6) and (nib3, nib7). A pair of consecutive elements
// (e[2j], e[2j+1]) must therefore sit in nibbles (j, j+4), i.e. element order per nibble
//     nibble : 0  1  2  3  4  5  6  7
//     element: e0 e2 e4 e6 e1 e3 e5 e7      (nib[i] = e[[0,2,4,6,1,3,5,7][i]])
// which is exactly the AWQ packing order. With it, step j of the sequence above yields the f16x2
// register (e[2j], e[2j+1]) -- elements in natural order, ready to be stored or fed to an
// f16x2 multiply against the pair of scales (s[2j], s[2j+1]) -- with no permute instruction.
//
// bf16 is [sign:1][exponent:8][mantissa:7]: 0x4300 is 128.0 and the spacing in [128, 256) is 1,
// so (0x4300 | q) = 128 + q. Only 7 mantissa bits exist, so a nibble at bits 4..7 would hit the
// exponent: every nibble must be shifted down to bits 0..3 first (shifts by 0, 4, 8, 12 with the
// 0x000F000F mask), and the bias is removed with one bf16x2 fma (x * 1 - 128), exact.
//
// All results here are the *unsigned* codes q (0..15); AWQ subtracts its own zero point later.
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace w4 {

// Bitwise function chosen by the LUT byte; LUT 0xEA = (a & b) | c (see above).
template <uint32_t kLut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return d;
}

constexpr uint32_t kLutAndOr = (0xF0 & 0xCC) | 0xAA;  // 0xEA: (a & b) | c
constexpr uint32_t kLowNibbles = 0x000F000Fu;         // bits 0..3 of each 16-bit half
constexpr uint32_t kHighNibbles = 0x00F000F0u;        // bits 4..7 of each 16-bit half
constexpr uint32_t kF16x2Magic = 0x64006400u;         // fp16 {1024, 1024}
constexpr uint32_t kF16x2OneSixteenth = 0x2C002C00u;  // fp16 {1/16, 1/16}
constexpr uint32_t kF16x2MinusOneSixteenth = 0xAC00AC00u;  // fp16 {-1/16, -1/16}
constexpr uint32_t kF16x2Minus64 = 0xD400D400u;       // fp16 {-64, -64}
constexpr uint32_t kBF16x2Magic = 0x43004300u;        // bf16 {128, 128}
constexpr uint32_t kBF16x2One = 0x3F803F80u;          // bf16 {1, 1}
constexpr uint32_t kBF16x2Minus128 = 0xC300C300u;     // bf16 {-128, -128}

// f16x2 arithmetic on raw registers. Explicit .rn: the rounding mode is fixed, and ptxas may not
// contract a separately written mul and add into an fma (which would round once instead of twice).
__device__ __forceinline__ uint32_t sub_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// 8 unsigned int4 codes (AWQ nibble order) -> 8 fp16 values q in natural order:
// h[j] = (e[2j] low half, e[2j+1] high half). Exact.
__device__ __forceinline__ void u4x8_to_f16x8(uint32_t w, uint32_t (&h)[4]) {
  const uint32_t top = w >> 8;  // nibbles 2,3,6,7 move to the positions of 0,1,4,5
  h[0] = sub_f16x2(lop3<kLutAndOr>(w, kLowNibbles, kF16x2Magic), kF16x2Magic);
  h[1] = fma_f16x2(lop3<kLutAndOr>(w, kHighNibbles, kF16x2Magic), kF16x2OneSixteenth, kF16x2Minus64);
  h[2] = sub_f16x2(lop3<kLutAndOr>(top, kLowNibbles, kF16x2Magic), kF16x2Magic);
  h[3] = fma_f16x2(lop3<kLutAndOr>(top, kHighNibbles, kF16x2Magic), kF16x2OneSixteenth, kF16x2Minus64);
}

// 8 unsigned int4 codes (AWQ nibble order) -> 8 bf16 values q in natural order, same pairing.
// Four shifts (bf16 has no room for a nibble at bits 4..7, see above). Exact.
__device__ __forceinline__ void u4x8_to_bf16x8(uint32_t w, uint32_t (&h)[4]) {
  h[0] = fma_bf16x2(lop3<kLutAndOr>(w, kLowNibbles, kBF16x2Magic), kBF16x2One, kBF16x2Minus128);
  h[1] = fma_bf16x2(lop3<kLutAndOr>(w >> 4, kLowNibbles, kBF16x2Magic), kBF16x2One, kBF16x2Minus128);
  h[2] = fma_bf16x2(lop3<kLutAndOr>(w >> 8, kLowNibbles, kBF16x2Magic), kBF16x2One, kBF16x2Minus128);
  h[3] = fma_bf16x2(lop3<kLutAndOr>(w >> 12, kLowNibbles, kBF16x2Magic), kBF16x2One, kBF16x2Minus128);
}

// Zero points of one packed word, prepared once per group so that the per-weight cost of
// "q - z" is the same single sub/fma that removes the magic bias:
//   even pairs: (1024 + q) - (1024 + z)                 = q - z   (sub, exact)
//   odd pairs:  (1024 + 16q) * (1/16) + (-(64 + z))     = q - z   (fma, exact)
struct ZeroF16x8 {
  uint32_t biased[2];   // fp16 pairs (1024+z0, 1024+z1), (1024+z4, 1024+z5)
  uint32_t neg_high[2]; // fp16 pairs (-(64+z2), -(64+z3)), (-(64+z6), -(64+z7))
};

__device__ __forceinline__ ZeroF16x8 prepare_zero_f16x8(uint32_t zw) {
  const uint32_t top = zw >> 8;
  ZeroF16x8 z;
  z.biased[0] = lop3<kLutAndOr>(zw, kLowNibbles, kF16x2Magic);
  z.biased[1] = lop3<kLutAndOr>(top, kLowNibbles, kF16x2Magic);
  // (1024 + 16z) * (-1/16) = -(64 + z): exact (a small integer).
  z.neg_high[0] = mul_f16x2(lop3<kLutAndOr>(zw, kHighNibbles, kF16x2Magic), kF16x2MinusOneSixteenth);
  z.neg_high[1] = mul_f16x2(lop3<kLutAndOr>(top, kHighNibbles, kF16x2Magic), kF16x2MinusOneSixteenth);
  return z;
}

// One row's zero point, replicated into the pairs u4x8_minus_zero_f16x8 expects when all 8 codes
// of a word share it (the w4-gemv layout packs along k): (1024 + z) and -(64 + z) in fp16.
// 1024 + z: exponent of 1024, z in the low mantissa bits (spacing 1 in [1024, 2048)).
// 64 + z: spacing 1/16 in [64, 128), so z moves the mantissa by 16z; the sign bit negates.
__device__ __forceinline__ ZeroF16x8 row_zero(uint32_t z) {
  ZeroF16x8 r;
  r.biased[0] = r.biased[1] = (0x6400u | z) * 0x10001u;
  r.neg_high[0] = r.neg_high[1] = (0xD400u + (z << 4)) * 0x10001u;
  return r;
}

// 8 codes minus their zero points, as exact fp16 integers in -15..15, natural order pairs.
// 1 shift + 4 lop3 + 2 sub + 2 fma per word.
__device__ __forceinline__ void u4x8_minus_zero_f16x8(uint32_t w, const ZeroF16x8& z, uint32_t (&d)[4]) {
  const uint32_t top = w >> 8;
  d[0] = sub_f16x2(lop3<kLutAndOr>(w, kLowNibbles, kF16x2Magic), z.biased[0]);
  d[1] = fma_f16x2(lop3<kLutAndOr>(w, kHighNibbles, kF16x2Magic), kF16x2OneSixteenth, z.neg_high[0]);
  d[2] = sub_f16x2(lop3<kLutAndOr>(top, kLowNibbles, kF16x2Magic), z.biased[1]);
  d[3] = fma_f16x2(lop3<kLutAndOr>(top, kHighNibbles, kF16x2Magic), kF16x2OneSixteenth, z.neg_high[1]);
}

// The two codes in nibbles p and p + 4 of w (elements 2 p and 2 p + 1 in AWQ order) minus their
// zero point, as an exact fp16 pair: shift = 4 p, zero_biased = (1024 + z) in both halves (row_zero's
// `biased`). For a lane that needs one pair of each of several words. 1 shift + 1 lop3 + 1 sub.
__device__ __forceinline__ uint32_t u4_pair_minus_zero_f16x2(uint32_t w, uint32_t shift, uint32_t zero_biased) {
  return sub_f16x2(lop3<kLutAndOr>(w >> shift, kLowNibbles, kF16x2Magic), zero_biased);
}

}  // namespace w4
