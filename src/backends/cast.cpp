// flashport::cast: host conversion through the CPU backend's element loads and stores, so it rounds
// exactly as the CPU kernels do. Beside registry.cpp: like it, a public entry point that knows a backend.
#include <array>
#include <string>

#include "backends/cpu/elem.hpp"
#include "flashport/error.hpp"
#include "flashport/tensor.hpp"

namespace flashport {

void cast(const TensorView& src, const TensorView& dst) {
  for (const TensorView* t : {&src, &dst}) {
    const char* name = t == &src ? "src" : "dst";
    if (t->device.type != DeviceType::cpu) throw Error(name, "cast() runs on host memory only");
    if (t->dtype == DType::i32 || t->dtype == DType::i64)
      throw Error(name,
                  "cast() converts floating-point types only, got " + std::string(dtype_name(t->dtype)));
  }
  if (src.ndim != dst.ndim || src.shape != dst.shape)
    throw Error("dst", "has shape " + dst.describe() + ", src has " + src.describe());
  // Four nested loops over the shape padded with leading 1s (any ndim up to kMaxDims).
  std::array<int64_t, kMaxDims> shape{1, 1, 1, 1}, ss{}, ds{};
  const int pad = kMaxDims - src.ndim;
  for (int d = 0; d < src.ndim; ++d) {
    shape[pad + d] = src.shape[d];
    ss[pad + d] = src.stride[d];
    ds[pad + d] = dst.stride[d];
  }
  const int st = (int)src.dtype, dt = (int)dst.dtype;
  for (int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < shape[3]; ++i3) {
          const int64_t so = i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3];
          const int64_t doff = i0 * ds[0] + i1 * ds[1] + i2 * ds[2] + i3 * ds[3];
          cpu::store(dst.data, dt, doff, cpu::load_f64(src.data, st, so));
        }
}

}  // namespace flashport
