// Emulator stand-in for cuda/common/math.cuh: shuffles as warp collectives of emu_runtime.
#pragma once

#include <cmath>

#include "core/semantics.h"
#include "cuda/common/types.cuh"

namespace flashport::emu {
unsigned shfl_xor_bits(unsigned v, int mask);  // value of lane ^ mask (all 32 lanes take part)
long long shfl_i64(long long v, int src);      // value of lane src (all 32 lanes take part)
}  // namespace flashport::emu

namespace flashport::cuda {

// The constants of core/semantics.h, as the real math.cuh takes them (defined once since 4e78e90).
using sem::kLn2;
using sem::kLog2e;
using sem::kNegInf;
inline constexpr unsigned kFullMask = 0xffffffffu;

inline float fast_exp2(float x) {
  return std::exp2(x);
}
/// tanh.approx.f32 (max relative error 2^-11 on the GPU): exact here.
inline float fast_tanh(float x) {
  return std::tanh(x);
}
inline float fast_log2(float x) {
  return std::log2(x);
}
inline float shfl_xor(float v, int mask) {
  return u32_as_float(emu::shfl_xor_bits(float_as_u32(v), mask));
}
inline u32 shfl_xor(u32 v, int mask) {
  return emu::shfl_xor_bits(v, mask);
}
inline i64 shfl_i64(i64 v, int src) {
  return emu::shfl_i64(v, src);
}
inline bool warp_all(bool v) {
  unsigned x = v ? 1u : 0u;
  for (int m = 16; m > 0; m >>= 1) x &= emu::shfl_xor_bits(x, m);
  return x != 0;
}
inline float quad_max(float v) {
  v = std::fmax(v, shfl_xor(v, 1));
  return std::fmax(v, shfl_xor(v, 2));
}
inline float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}
inline float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = std::fmax(v, shfl_xor(v, m));
  return v;
}
inline float warp_sum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}

}  // namespace flashport::cuda
