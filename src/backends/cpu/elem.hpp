// Scalar loads and stores of every storage type, for the CPU paths (promotes to double or float).
#pragma once

#include "core/numeric.h"
#include "core/problem.h"

namespace flashport::cpu {

/// Bytes per element of ElemType `type`.
inline int elem_bytes(int type) {
  switch (type) {
    case kF64:
      return 8;
    case kF32:
      return 4;
    case kF16:
    case kBF16:
      return 2;
    default:
      return 1;
  }
}

/// The fp8 format of an fp8 ElemType (is_fp8_elem(type)).
inline num::Fp8Format fp8_format(int type) {
  return type == kE5M2 ? num::kE5M2 : type == kE4M3FNUZ ? num::kE4M3FNUZ : num::kE4M3;
}

/// Value of element `off` of a buffer of ElemType `type`, widened to float.
inline float load_f32(const void* base, int type, long long off) {
  switch (type) {
    case kF64:
      return (float)static_cast<const double*>(base)[off];
    case kF32:
      return static_cast<const float*>(base)[off];
    case kF16:
      return num::f16_to_f32(static_cast<const unsigned short*>(base)[off]);
    case kBF16:
      return num::bf16_to_f32(static_cast<const unsigned short*>(base)[off]);
    case kE4M3:
    case kE4M3FNUZ:
    case kE5M2:
      return num::fp8_to_f32(static_cast<const unsigned char*>(base)[off], fp8_format(type));
  }
  return 0.0f;
}

/// Same, kept in double where the storage is double (the reference accumulates in fp64).
inline double load_f64(const void* base, int type, long long off) {
  return type == kF64 ? static_cast<const double*>(base)[off] : (double)load_f32(base, type, off);
}

/// Rounds `v` to ElemType `type` (round-to-nearest-even; fp8 saturates).
inline void store(void* base, int type, long long off, double v) {
  switch (type) {
    case kF64:
      static_cast<double*>(base)[off] = v;
      return;
    case kF32:
      static_cast<float*>(base)[off] = (float)v;
      return;
    case kF16:
      static_cast<unsigned short*>(base)[off] = num::f32_to_f16((float)v);
      return;
    case kBF16:
      static_cast<unsigned short*>(base)[off] = num::f32_to_bf16((float)v);
      return;
    case kE4M3:
    case kE4M3FNUZ:
    case kE5M2:
      static_cast<unsigned char*>(base)[off] = num::f32_to_fp8((float)v, fp8_format(type));
      return;
  }
}

/// `v` rounded to ElemType `type` and widened back: the baseline's "round to the input dtype".
inline double round_to(int type, double v) {
  switch (type) {
    case kF32:
      return (double)(float)v;
    case kF16:
      return num::f16_to_f32(num::f32_to_f16((float)v));
    case kBF16:
      return num::bf16_to_f32(num::f32_to_bf16((float)v));
    case kE4M3:
    case kE4M3FNUZ:
    case kE5M2:
      return num::fp8_to_f32(num::f32_to_fp8((float)v, fp8_format(type)), fp8_format(type));
    default:
      return v;
  }
}

}  // namespace flashport::cpu
