// Helpers the C++ drivers share: comparing outputs through flashport::cast (the library's widening).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashport/flashport.hpp"

namespace bench {

using flashport::DType;
using flashport::TensorView;

/// `v` as a contiguous f64 copy (any strides): the library's own widening.
inline std::vector<double> to_f64(const TensorView& v) {
  std::vector<double> out((size_t)v.numel());
  TensorView dst = v;
  dst.data = out.data();
  dst.dtype = DType::f64;
  for (int d = v.ndim - 1, n = 1; d >= 0; n *= (int)v.shape[d--]) dst.stride[d] = n;
  flashport::cast(v, dst);
  return out;
}

/// max |a - b| over two views of the same shape (any strides); infinite for different sizes.
inline double max_diff(const TensorView& a, const TensorView& b) {
  const std::vector<double> x = to_f64(a), y = to_f64(b);
  if (x.size() != y.size()) return INFINITY;
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    m = std::max(m, std::fabs(x[i] - y[i]));
  }
  return m;
}

inline double max_abs(const TensorView& a) {
  double m = 0.0;
  for (double x : to_f64(a)) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace bench
