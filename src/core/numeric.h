// Bit-exact conversions between float and the storage types (fp16, bf16, fp8), round-to-nearest-even.
// Self-contained so host code and JIT-compiled kernels share one definition.
#pragma once

#include "semantics.h"

namespace flashport::num {

using u16 = unsigned short;
using u8 = unsigned char;
using sem::u32;

FP_HD u32 f32_bits(float f) {
  union {
    float f;
    u32 u;
  } c{f};
  return c.u;
}
FP_HD float bits_f32(u32 u) {
  union {
    u32 u;
    float f;
  } c{u};
  return c.f;
}

// bf16 ------------------------------------------------------------------------------------------
FP_HD float bf16_to_f32(u16 h) {
  return bits_f32((u32)h << 16);
}
FP_HD u16 f32_to_bf16(float f) {
  const u32 u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // quiet NaN
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// fp16 ------------------------------------------------------------------------------------------
FP_HD float f16_to_f32(u16 h) {
  const u32 sign = (u32)(h & 0x8000u) << 16;
  const u32 exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  // Subnormal: man * 2^-24.
  const float v = (float)man * 5.9604644775390625e-8f;
  return sign ? -v : v;
}
FP_HD u16 f32_to_f16(float f) {
  const u32 u = f32_bits(f);
  const u16 sign = (u16)((u >> 16) & 0x8000u);
  const u32 a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (u16)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {                              // normal fp16
    const u32 r = a + 0xfff + ((a >> 13) & 1u) - (112u << 23);
    return (u16)(sign | (r >> 13));
  }
  // Subnormal or zero: scale so the fp16 subnormal unit is 1, then round to nearest even.
  const float v = bits_f32(a) * 16777216.0f;  // 2^24
  u32 m = (u32)v;
  const float rem = v - (float)m;
  if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
  return (u16)(sign | m);
}

// fp8 -------------------------------------------------------------------------------------------
// Generic small-float encoder: `man_bits` mantissa bits, exponent bias, largest finite value.
// e4m3fn: bias 7, max 448, no inf, NaN = 0x7f. e4m3fnuz: bias 8, max 240, NaN = 0x80 (no -0).
// e5m2: bias 15, max 57344, inf and NaN like IEEE. Out-of-range values saturate to +-max (the
// behaviour of NVIDIA's cvt with .satfinite, and what quantisation wants).
struct Fp8Format {
  int man_bits, bias;
  float max_finite;
  bool fnuz;
};
inline constexpr Fp8Format kE4M3{3, 7, 448.0f, false};
inline constexpr Fp8Format kE4M3FNUZ{3, 8, 240.0f, true};
inline constexpr Fp8Format kE5M2{2, 15, 57344.0f, false};

FP_HD float fp8_to_f32(u8 x, Fp8Format fmt) {
  const int exp_bits = 7 - fmt.man_bits;
  const u32 sign = x >> 7, e = (x >> fmt.man_bits) & ((1u << exp_bits) - 1),
            m = x & ((1u << fmt.man_bits) - 1);
  if (fmt.fnuz && x == 0x80) return bits_f32(0x7fc00000u);
  if (!fmt.fnuz && fmt.man_bits == 3 && e == 15 && m == 7) return bits_f32(0x7fc00000u);
  if (!fmt.fnuz && fmt.man_bits == 2 && e == 31)
    return bits_f32(m ? 0x7fc00000u : 0x7f800000u) * (sign ? -1.f : 1.f);
  float v;
  if (e == 0) {
    v = (float)m;
    for (int k = 0; k < fmt.bias - 1 + fmt.man_bits; ++k) v *= 0.5f;
  } else {
    v = 1.0f + (float)m / (float)(1u << fmt.man_bits);
    for (int k = 0; k < (int)e - fmt.bias; ++k) v *= 2.0f;
    for (int k = 0; k < fmt.bias - (int)e; ++k) v *= 0.5f;
  }
  return sign ? -v : v;
}

FP_HD u8 f32_to_fp8(float f, Fp8Format fmt) {
  const u32 u = f32_bits(f);
  const u8 sign = (u8)((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return fmt.fnuz ? (u8)0x80 : (u8)(fmt.man_bits == 3 ? 0x7f : 0x7f);
  float a = bits_f32(u & 0x7fffffffu);
  if (a >= fmt.max_finite) a = fmt.max_finite;
  // Exponent of a (floor log2), clamped to the subnormal range.
  const int min_exp = 1 - fmt.bias;
  int e = (int)((f32_bits(a) >> 23) & 0xff) - 127;
  if (e < min_exp) e = min_exp;
  // Quantum at this exponent: 2^(e - man_bits); round a / quantum to nearest even.
  float quantum = 1.0f;
  for (int k = 0; k < fmt.man_bits - e; ++k) quantum *= 0.5f;
  for (int k = 0; k < e - fmt.man_bits; ++k) quantum *= 2.0f;
  const float q = a / quantum;
  u32 n = (u32)q;
  const float rem = q - (float)n;
  if (rem > 0.5f || (rem == 0.5f && (n & 1u))) ++n;
  // n counts quanta: rebuild exponent/mantissa (rounding may carry into the next binade).
  const u32 implicit = 1u << fmt.man_bits;
  u32 biased, man;
  if (n >= 2 * implicit) {  // carried past the binade
    n >>= 1;
    ++e;
  }
  if (n >= implicit) {
    biased = (u32)(e + fmt.bias);
    man = n - implicit;
  } else {
    biased = 0;
    man = n;
  }
  u8 out = (u8)((biased << fmt.man_bits) | man);
  if (fmt.fnuz && out == 0) return 0;  // fnuz has no negative zero
  return (u8)(sign | out);
}

}  // namespace flashport::num
