// FP8 -> bf16 for the CDNA kernels' tile loads. Every e4m3fn, e4m3fnuz and e5m2 value (NaN and, for
// e5m2, +-inf included) is exactly a bf16: bf16 has fp32's 8 exponent bits, and at most 3 mantissa bits
// arrive. So the fp8 forward dequantises while staging tiles into LDS and keeps the bf16 MFMA path,
// and its products are those of a bf16 kernel on the same values (the descales are applied in fp32 to
// the scores and the output, SPEC's "FP8"). Decodes core/numeric.h's fp8_to_f32 bit for bit, with the
// format's constants picked once per launch instead of a per-element loop.
#pragma once

#include "core/problem.h"
#include "wave/wave.hpp"

namespace flashport::amd {

/// The constants of one fp8 format's decode (wave-uniform: they come from the problem's in_type).
struct Fp8Decode {
  wave::u32 shift;       // 23 - man_bits: the magnitude's exponent and mantissa into fp32's fields
  wave::u32 rebias;      // (127 - bias) << 23: fp8 exponent bias to fp32's
  wave::u32 min_normal;  // 1 << man_bits: smaller magnitudes are subnormal
  float sub_quantum;     // 2^(1 - bias - man_bits): the value of subnormal magnitude 1
  wave::u32 nan_from;    // magnitudes >= this are NaN (0x100: none)
  wave::u32 inf_at;      // this magnitude is +-inf (0x100: none)
  bool fnuz;             // 0x80 (negative zero's code) is the NaN
};

/// The decode of ElemType `in_type` (kE4M3, kE4M3FNUZ or kE5M2).
FP_HD constexpr Fp8Decode fp8_decode(int in_type) {
  if (in_type == kE5M2) return {21, 112u << 23, 4, 1.0f / 65536.0f, 0x7d, 0x7c, false};
  if (in_type == kE4M3FNUZ) return {20, 119u << 23, 8, 1.0f / 1024.0f, 0x100, 0x100, true};
  return {20, 120u << 23, 8, 1.0f / 512.0f, 0x7f, 0x100, false};  // e4m3fn
}

/// The bf16 bits of fp8 code `x`.
FP_DEV wave::u16 fp8_to_bf16(wave::u32 x, const Fp8Decode& f) {
  const wave::u32 mag = x & 0x7fu;
  wave::u32 bits =
      mag < f.min_normal ? num::f32_bits((float)mag * f.sub_quantum) : (mag << f.shift) + f.rebias;
  if (mag == f.inf_at) bits = 0x7f800000u;
  if (mag >= f.nan_from || (f.fnuz && x == 0x80u)) bits = 0x7fc00000u;
  bits |= (x & 0x80u) << 24;  // the sign (a NaN's sign is not part of its meaning)
  return (wave::u16)(bits >> 16);
}

}  // namespace flashport::amd
