// The gradient oracle of the CDNA backward tests (the model harness, test_hip_backward.cpp, and the HIP
// backend through its stand-in runtime, backend/test_hip_backend.cpp): SPEC's accuracy rule for
// gradients compares against the CPU reference backward in fp64 and a naive same-precision baseline.
#pragma once

#include <utility>

#include "common/grad_baseline.hpp"
#include "cpu/test_fast_util.hpp"

namespace flashport::test {

/// The kernels' view of a contiguous host tensor (as api.cpp's operand()).
inline Operand operand(const HostTensor& t) {
  const TensorView& v = t.tv;
  return v.ndim == 4 ? Operand{v.data, v.stride[0], v.stride[1], v.stride[2]}
                     : Operand{v.data, 0, v.stride[0], v.stride[1]};
}

/// The accuracy rule's baseline for gradients (common/grad_baseline.hpp) over contiguous dense or
/// varlen inputs (make_inputs).
inline fastcheck::Grads baseline_grads(const Case& c, const fastcheck::Inputs& in, const HostTensor& dout) {
  BaselineGrads g = baseline_backward(c, in.q, in.k, in.v, dout, in.alibi, fastcheck::options(c, in));
  return {std::move(g.dq), std::move(g.dk), std::move(g.dv)};
}

/// The oracle: the CPU reference backward on fp64 copies of the same inputs (no rounding on the way out).
inline fastcheck::Grads reference_grads(const Case& c, const fastcheck::Inputs& in,
                                        const fastcheck::Forward& fwd, const HostTensor& dout) {
  fastcheck::Inputs in64 = in;
  in64.q = in.q.as(DType::f64), in64.k = in.k.as(DType::f64), in64.v = in.v.as(DType::f64);
  Case c64 = c;
  c64.dtype = DType::f64;
  const fastcheck::Forward fwd64{fwd.out.as(DType::f64), fwd.lse};
  return fastcheck::run_backward(c64, in64, fwd64, dout.as(DType::f64), Impl::reference);
}

}  // namespace flashport::test
