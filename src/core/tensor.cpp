// TensorView helpers and the names used in error messages.
#include <string>

#include "core/problem.h"
#include "flashport/error.hpp"
#include "flashport/tensor.hpp"

namespace flashport {

// Backends receive the dtype as the kernels' ElemType (core/problem.h) by a plain cast: the two
// enumerations must agree on every floating-point type.
static_assert((int)DType::f64 == kF64 && (int)DType::f32 == kF32 && (int)DType::f16 == kF16 &&
              (int)DType::bf16 == kBF16 && (int)DType::e4m3 == kE4M3 && (int)DType::e4m3fnuz == kE4M3FNUZ &&
              (int)DType::e5m2 == kE5M2);

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "float64";
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::e4m3:
      return "float8_e4m3fn";
    case DType::e4m3fnuz:
      return "float8_e4m3fnuz";
    case DType::e5m2:
      return "float8_e5m2";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
  }
  return "unknown";
}

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::cuda:
      return "cuda";
    case DeviceType::hip:
      return "hip";
  }
  return "unknown";
}

namespace {
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  if (shape.size() > (size_t)kMaxDims) throw Error("shape", "at most 4 dimensions are supported");
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = (int)shape.size();
  t.device = device;
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  return t;
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView t = make_view(data, dtype, shape, device);
  int64_t n = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = n;
    n *= t.shape[d];
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> stride, Device device) {
  if (stride.size() != shape.size()) throw Error("stride", "needs one stride per dimension");
  TensorView t = make_view(data, dtype, shape, device);
  int d = 0;
  for (int64_t s : stride) t.stride[d++] = s;
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // no element to address, whatever the strides say
  int64_t n = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != n) return false;
    n *= shape[d];
  }
  return true;
}

std::array<uintptr_t, 2> TensorView::byte_span() const {
  const auto base = reinterpret_cast<uintptr_t>(data);
  if (numel() == 0) return {base, base};
  int64_t lo = 0, hi = 0;  // element offsets of the extreme elements
  for (int d = 0; d < ndim; ++d) {
    const int64_t reach = (shape[d] - 1) * stride[d];
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t es = dtype_size(dtype);
  return {base + (uintptr_t)(lo * es), base + (uintptr_t)((hi + 1) * es)};
}

std::string TensorView::describe() const {
  // No iostreams in the library: a host process with another libstdc++ (Python + torch) crashed in them.
  std::string s = "(";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  if (ndim == 1) s += ",";
  s += std::string(") ") + dtype_name(dtype) + " " + device_type_name(device.type);
  if (device.type != DeviceType::cpu) s += ":" + std::to_string(device.index);
  return s;
}

}  // namespace flashport
