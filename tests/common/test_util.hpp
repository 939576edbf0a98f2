// Test helpers: owning host tensors, fresh random fills, poison, and SPEC.md's accuracy rule.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/elem.hpp"
#include "flashport/flashport.hpp"

namespace flashport::test {

/// A contiguous host tensor that owns its bytes. `view()` hands out a TensorView.
struct HostTensor {
  std::vector<unsigned char> bytes;
  TensorView tv;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape) {
    tv.dtype = dtype;
    tv.ndim = (int)shape.size();
    int64_t n = 1;
    for (int d = tv.ndim - 1; d >= 0; --d) {
      tv.shape[d] = shape[d];
      tv.stride[d] = n;
      n *= shape[d];
    }
    bytes.assign((size_t)std::max<int64_t>(n, 1) * dtype_size(dtype), 0);
    tv.data = bytes.data();
  }
  HostTensor(const HostTensor& o) : bytes(o.bytes), tv(o.tv) { tv.data = bytes.data(); }
  HostTensor& operator=(const HostTensor& o) {
    bytes = o.bytes;
    tv = o.tv;
    tv.data = bytes.data();
    return *this;
  }
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;

  int64_t numel() const { return tv.numel(); }
  int type() const { return (int)tv.dtype; }
  TensorView view() const { return tv; }
  operator TensorView() const { return tv; }

  double get(int64_t i) const { return cpu::load_f64(tv.data, type(), i); }
  void set(int64_t i, double v) { cpu::store(tv.data, type(), i, v); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(bytes.data()); }
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  std::vector<double> to_double() const {
    std::vector<double> out((size_t)numel());
    for (int64_t i = 0; i < numel(); ++i) out[(size_t)i] = get(i);
    return out;
  }
  /// Same data converted to another dtype (e.g. the fp64 copy for the reference).
  HostTensor as(DType dtype) const {
    HostTensor out(dtype, std::vector<int64_t>(tv.shape.begin(), tv.shape.begin() + tv.ndim));
    for (int64_t i = 0; i < numel(); ++i) out.set(i, get(i));
    return out;
  }
};

inline std::vector<int64_t> shape_of(const HostTensor& t) {
  return std::vector<int64_t>(t.tv.shape.begin(), t.tv.shape.begin() + t.tv.ndim);
}

/// A per-test generator seeded from the clock unless FLASHPORT_TEST_SEED is set; the seed is
/// printed on failure through SCOPED_TRACE by callers that want it.
inline std::mt19937_64& rng() {
  static std::mt19937_64 gen([] {
    const char* s = std::getenv("FLASHPORT_TEST_SEED");
    return s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
  }());
  return gen;
}

/// Normal(0, stddev) values rounded to the tensor's dtype.
inline HostTensor randn(DType dtype, std::vector<int64_t> shape, double stddev = 1.0) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<double> nd(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(rng()));
  return t;
}

/// Fill with NaN (float types) or 0x7f bytes so an unwritten element cannot pass a comparison.
inline void poison(HostTensor& t) {
  if (t.tv.dtype == DType::i32 || is_fp8(t.tv.dtype)) {
    std::fill(t.bytes.begin(), t.bytes.end(), (unsigned char)0x7f);
    return;
  }
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::nan(""));
}

inline HostTensor int_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, {(int64_t)values.size()});
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), values.size() * 4);  // data() may be null
  return t;
}

/// max |a - b| over all elements; NaN anywhere gives +inf. Equal infinities compare equal.
inline double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  double m = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    if (x == y) continue;
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

/// SPEC.md: pass iff max|out - ref| <= factor * max|baseline - ref| + 1e-5 (factor 2; 3 for grads).
inline ::testing::AssertionResult accuracy_rule(const HostTensor& out, const HostTensor& baseline,
                                                const HostTensor& ref, double factor = 2.0) {
  const double err = max_abs_diff(out, ref), base = max_abs_diff(baseline, ref);
  if (err <= factor * base + 1e-5) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max|out-ref| = " << err << " > " << factor << " * max|baseline-ref| (" << base << ") + 1e-5";
}

}  // namespace flashport::test
