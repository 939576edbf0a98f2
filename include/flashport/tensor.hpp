// Non-owning tensor views: the only way data crosses the flashport API.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashport {

/// Element types flashport understands. `e4m3` is OCP e4m3fn (NVIDIA), `e4m3fnuz` AMD gfx94x's variant.
enum class DType : uint8_t { f64, f32, f16, bf16, e4m3, e4m3fnuz, e5m2, i32, i64 };

/// Bytes per element of `t`.
constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    default:
      return 1;
  }
}
/// "bf16", "f32", ...: used in error messages.
const char* dtype_name(DType t);
constexpr bool is_fp8(DType t) {
  return t == DType::e4m3 || t == DType::e4m3fnuz || t == DType::e5m2;
}
constexpr bool is_half(DType t) {
  return t == DType::f16 || t == DType::bf16;
}

enum class DeviceType : uint8_t { cpu, cuda, hip };
const char* device_type_name(DeviceType t);

/// Where a tensor's memory lives. `index` is the GPU ordinal (ignored for the CPU).
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

inline constexpr int kMaxDims = 4;

/// A strided view over memory somebody else owns. Strides are in elements, 64-bit.
/// flashport requires the last dimension to be contiguous (stride 1) for every attention operand.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};
  Device device{};

  /// A row-major (contiguous) view of `data` with the given shape.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  /// A view with explicit strides (elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> stride, Device device = {});

  int64_t numel() const;
  int64_t size(int dim) const { return shape[dim]; }
  /// True when the strides are exactly row-major (always for a view with no elements).
  bool is_contiguous() const;
  /// Byte range [lo, hi) the view can touch; empty views give lo == hi.
  std::array<uintptr_t, 2> byte_span() const;
  /// "(2, 128, 8, 64) bf16 cuda:0"
  std::string describe() const;
};

/// dst = src converted elementwise with the library's rounding (round to nearest even; fp8 saturates;
/// f64 stays f64), on the host. Both views are host memory of floating-point dtypes with equal shapes,
/// any strides; numpy has no bf16 or fp8, so this is how callers produce and read such storage. Throws
/// Error naming "src" or "dst" otherwise. Overlapping views give unspecified results.
void cast(const TensorView& src, const TensorView& dst);

}  // namespace flashport
