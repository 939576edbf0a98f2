// FP8 -> bf16 for the fp8 variant of the portable forward (attn_fwd.cu with -D FP_FP8=1). Every
// e4m3fn, e4m3fnuz and e5m2 value (NaN and, for e5m2, +-inf included) is exactly a bf16: bf16 has
// fp32's 8 exponent bits, and at most 3 mantissa bits arrive. So the kernel dequantises while staging
// tiles into shared memory and keeps the bf16 mma.sync path; its products are those of a bf16 kernel
// on the same values (the descales are applied in fp32 to the scores and the output, SPEC "FP8").
// Decodes core/numeric.h's fp8_to_f32 bit for bit, with the format's constants picked once per launch
// from p.in_type, so one variant serves all three formats. The same decode as the CDNA kernels'
// hip/fp8_decode.hpp (kept separate: each side has its own integer aliases and bit-cast helpers).
#pragma once

#include "cuda/common/common.cuh"

namespace flashport::cuda {

/// The constants of one fp8 format's decode (uniform over the grid: they come from p.in_type).
struct Fp8Decode {
  u32 shift;          // 23 - man_bits: the magnitude's exponent and mantissa into fp32's fields
  u32 rebias;         // (127 - bias) << 23: fp8 exponent bias to fp32's
  u32 min_normal;     // 1 << man_bits: smaller magnitudes are subnormal
  float sub_quantum;  // 2^(1 - bias - man_bits): the value of subnormal magnitude 1
  u32 nan_from;       // magnitudes >= this are NaN (0x100: none)
  u32 inf_at;         // this magnitude is +-inf (0x100: none)
  bool fnuz;          // 0x80 (negative zero's code) is the NaN
};

/// The decode of ElemType `in_type` (kE4M3 = 4, kE4M3FNUZ = 5 or kE5M2 = 6).
FP_DEV Fp8Decode fp8_decode(int in_type) {
  if (in_type == 6) return {21, 112u << 23, 4, 1.0f / 65536.0f, 0x7d, 0x7c, false};
  if (in_type == 5) return {20, 119u << 23, 8, 1.0f / 1024.0f, 0x100, 0x100, true};
  return {20, 120u << 23, 8, 1.0f / 512.0f, 0x7f, 0x100, false};  // e4m3fn
}

/// The bf16 bits of fp8 code `x` (the top half of the exact fp32).
FP_DEV u32 fp8_to_bf16(u32 x, const Fp8Decode& f) {
  const u32 mag = x & 0x7fu;
  u32 bits = mag < f.min_normal ? float_as_u32((float)mag * f.sub_quantum) : (mag << f.shift) + f.rebias;
  if (mag == f.inf_at) bits = 0x7f800000u;
  if (mag >= f.nan_from || (f.fnuz && x == 0x80u)) bits = 0x7fc00000u;
  bits |= (x & 0x80u) << 24;  // the sign (a NaN's sign is not part of its meaning)
  return bits >> 16;
}

/// Two fp8 codes (bits 0-7 and 8-15 of `w`) as a register of two bf16, the first in the low half.
FP_DEV u32 fp8x2_to_bf16x2(u32 w, const Fp8Decode& f) {
  return fp8_to_bf16(w & 0xffu, f) | fp8_to_bf16((w >> 8) & 0xffu, f) << 16;
}

}  // namespace flashport::cuda
