// Integer aliases and the fp16/bf16 element types of the CUDA kernels, with PTX conversions
// (NVRTC-safe: no toolkit header; storage is a plain 16-bit integer).
#pragma once

#define FP_DEV __device__ __forceinline__

namespace flashport::cuda {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i64 = long long;

/// Two floats (a pair of accumulator elements or an unpacked register).
struct Float2 {
  float x, y;
};

/// Reinterprets float bits as u32 and back.
FP_DEV u32 float_as_u32(float f) {
  return __float_as_uint(f);
}
FP_DEV float u32_as_float(u32 u) {
  return __uint_as_float(u);
}

/// PTX prmt: byte n of the result is byte (nibble n of `sel`) of the pair a (bytes 0-3), b (bytes 4-7).
FP_DEV u32 byte_perm(u32 a, u32 b, u32 sel) {
  return __byte_perm(a, b, sel);
}

/// fp16 (IEEE binary16). `kElemType` equals flashport::kF16.
struct f16 {
  static constexpr int kElemType = 2;
  using Storage = u16;
  /// Packs (lo, hi) into one register, lo in bits 0-15, round-to-nearest-even.
  static FP_DEV u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  /// Unpacks a register of two fp16 (exact).
  static FP_DEV Float2 unpack(u32 r) {
    u16 lo = (u16)(r & 0xffffu), hi = (u16)(r >> 16);
    return {to_float(lo), to_float(hi)};
  }
  /// One float to fp16 bits, round-to-nearest-even.
  static FP_DEV u16 from_float(float x) {
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
  /// fp16 bits to float (exact).
  static FP_DEV float to_float(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
};

/// bf16 (bfloat16). `kElemType` equals flashport::kBF16. Conversions need sm_80.
struct bf16 {
  static constexpr int kElemType = 3;
  using Storage = u16;
  /// Packs (lo, hi) into one register, lo in bits 0-15, round-to-nearest-even.
  static FP_DEV u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  /// Unpacks a register of two bf16 (exact: bf16 is the top half of an fp32).
  static FP_DEV Float2 unpack(u32 r) { return {u32_as_float(r << 16), u32_as_float(r & 0xffff0000u)}; }
  /// One float to bf16 bits, round-to-nearest-even.
  static FP_DEV u16 from_float(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
  /// bf16 bits to float (exact).
  static FP_DEV float to_float(u16 h) { return u32_as_float((u32)h << 16); }
};

/// OCP e4m3 (e4m3fn: no infinities, max 448), the Hopper FP8 forward's operand type. Conversions need
/// sm_89. `kElemType` equals flashport::kE4M3.
struct e4m3 {
  static constexpr int kElemType = 4;
  using Storage = u8;
  /// Packs four floats into one register, a in bits 0-7 .. d in bits 24-31, round-to-nearest-even
  /// with saturation to +-448 (NaN stays NaN).
  static FP_DEV u32 pack4(float a, float b, float c, float d) {
    u32 r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
  }
};

/// fp32 where a kernel takes every float dtype through one Elem interface (the backward's D and dQ
/// steps): the storage is the float itself. `kElemType` equals flashport::kF32.
struct f32 {
  static constexpr int kElemType = 1;
  using Storage = float;
  static FP_DEV float from_float(float x) { return x; }
  static FP_DEV float to_float(float x) { return x; }
};

/// Stores `x` rounded to ElemType `type` (kF64 = 0, kF32 = 1, kF16 = 2, kBF16 = 3) at element `off`
/// of `base`: for outputs whose dtype is a runtime value. Other types are ignored (rejected by the host).
FP_DEV void store_as(void* base, int type, i64 off, float x) {
  if (type == 0) static_cast<double*>(base)[off] = x;
  if (type == 1) static_cast<float*>(base)[off] = x;
  if (type == 2) static_cast<u16*>(base)[off] = f16::from_float(x);
  if (type == 3) static_cast<u16*>(base)[off] = bf16::from_float(x);
}

/// Loads element `off` of a buffer of ElemType `type` (kF64, kF32, kF16, kBF16) as float; 0 otherwise.
FP_DEV float load_as(const void* base, int type, i64 off) {
  if (type == 0) return (float)static_cast<const double*>(base)[off];
  if (type == 1) return static_cast<const float*>(base)[off];
  if (type == 2) return f16::to_float(static_cast<const u16*>(base)[off]);
  if (type == 3) return bf16::to_float(static_cast<const u16*>(base)[off]);
  return 0.0f;
}

}  // namespace flashport::cuda
