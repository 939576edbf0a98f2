// TMA tensor maps of (batch, row, head, d) operands for the Hopper kernels: the plan (dimension order by
// stride, box, which dimension carries head / row / batch) and its encoding with cuTensorMapEncodeTiled
// from a dlopen'ed libcuda (the library never links it).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "core/problem.h"
#include "kernels/cuda/hopper/sm90_config.h"

namespace flashport::cuda::hopper {

/// Dimension 0 is the head dim (box 128 bytes, the 128B swizzle span: 64 16-bit or 128 fp8 columns); the
/// head, row and batch dimensions follow ordered by stride, extent-1 dimensions last (their coordinate is
/// always 0, so any stride serves). Box: 128 bytes of columns x `box_rows` rows x 1 head x 1 batch.
struct MapPlan {
  cuuint64_t dims[4];
  cuuint64_t strides[3];  // bytes, of dimensions 1..3
  cuuint32_t box[4];
  TmaDims pos;
  int swizzle_bytes = 128;  // 128, or 64 for rows of 64 bytes (fp8 at d 64)
  std::string error;        // empty when encodable
};

/// TMA and the kernels' 16-byte shared/global accesses need 16-byte aligned base pointers.
inline bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

/// The plan for operand `t` (`elem_bytes` 2: fp16 / bf16, 1: fp8) named `name` in errors.
MapPlan plan_map(const char* name, const Operand& t, long long d, long long heads, long long rows,
                 long long batch, int box_rows, int elem_bytes = 2);

/// Encodes `plan` over `ptr` (128B swizzle, zero fill out of bounds; fp8 types as bytes). An operand without
/// rows gets a zero map: kernels issue no load for it. Throws Error naming `name` when the driver refuses.
TmaDesc encode(const char* name, const MapPlan& plan, int elem_type, void* ptr, long long rows);

}  // namespace flashport::cuda::hopper
