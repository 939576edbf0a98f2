// Emulator stand-in for cuda/common/types.cuh: the same names, bit-exact conversions in C++.
#pragma once

#include <cstring>

#include "core/numeric.h"

#define FP_DEV inline

namespace flashport::cuda {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i64 = long long;

inline u32 byte_perm(u32 a, u32 b, u32 sel) {
  const u64 pair = (u64)b << 32 | a;
  u32 r = 0;
  for (int n = 0; n < 4; ++n) r |= (u32)(pair >> (8 * ((sel >> (4 * n)) & 7)) & 0xffu) << (8 * n);
  return r;
}

struct Float2 {
  float x, y;
};

inline u32 float_as_u32(float f) {
  return num::f32_bits(f);
}
inline float u32_as_float(u32 u) {
  return num::bits_f32(u);
}

struct f16 {
  static constexpr int kElemType = 2;
  using Storage = u16;
  static u32 pack(float lo, float hi) { return (u32)num::f32_to_f16(lo) | (u32)num::f32_to_f16(hi) << 16; }
  static Float2 unpack(u32 r) { return {to_float((u16)(r & 0xffffu)), to_float((u16)(r >> 16))}; }
  static u16 from_float(float x) { return num::f32_to_f16(x); }
  static float to_float(u16 h) { return num::f16_to_f32(h); }
};

struct bf16 {
  static constexpr int kElemType = 3;
  using Storage = u16;
  static u32 pack(float lo, float hi) { return (u32)num::f32_to_bf16(lo) | (u32)num::f32_to_bf16(hi) << 16; }
  static Float2 unpack(u32 r) { return {u32_as_float(r << 16), u32_as_float(r & 0xffff0000u)}; }
  static u16 from_float(float x) { return num::f32_to_bf16(x); }
  static float to_float(u16 h) { return num::bf16_to_f32(h); }
};

struct e4m3 {
  static constexpr int kElemType = 4;
  using Storage = u8;
  /// cvt.rn.satfinite.e4m3x2.f32 twice: a in bits 0-7 .. d in bits 24-31.
  static u32 pack4(float a, float b, float c, float d) {
    const num::Fp8Format f = num::kE4M3;
    return (u32)num::f32_to_fp8(a, f) | (u32)num::f32_to_fp8(b, f) << 8 | (u32)num::f32_to_fp8(c, f) << 16 |
           (u32)num::f32_to_fp8(d, f) << 24;
  }
};

struct f32 {
  static constexpr int kElemType = 1;
  using Storage = float;
  static float from_float(float x) { return x; }
  static float to_float(float x) { return x; }
};

inline void store_as(void* base, int type, i64 off, float x) {
  if (type == 0) static_cast<double*>(base)[off] = x;
  if (type == 1) static_cast<float*>(base)[off] = x;
  if (type == 2) static_cast<u16*>(base)[off] = f16::from_float(x);
  if (type == 3) static_cast<u16*>(base)[off] = bf16::from_float(x);
}
inline float load_as(const void* base, int type, i64 off) {
  if (type == 0) return (float)static_cast<const double*>(base)[off];
  if (type == 1) return static_cast<const float*>(base)[off];
  if (type == 2) return f16::to_float(static_cast<const u16*>(base)[off]);
  if (type == 3) return bf16::to_float(static_cast<const u16*>(base)[off]);
  return 0.0f;
}

}  // namespace flashport::cuda
