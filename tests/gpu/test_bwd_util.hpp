// Backward test harness: the CUDA backward on poisoned device gradients vs the CPU oracle (fp64
// reference on the same low-precision inputs) and the naive same-precision baseline of
// common/grad_baseline.hpp.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/grad_baseline.hpp"
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {

/// Host inputs of a backward case: the forward inputs, dO, and O / LSE from the CPU reference forward
/// (O rounded to the input dtype, as a real forward would hand it over).
struct BwdInputs {
  FwdInputs fwd;
  HostTensor dout, out, lse;  // contiguous (b, sq, hq, dv) / (total_q, hq, dv); lse fp32
};

inline BwdInputs make_bwd_inputs(const Case& c) {
  BwdInputs in{make_inputs(c), randn(c.dtype, out_shape(c)), {}, {}};
  const FwdResult f = run_cpu(c, in.fwd, Impl::reference);
  in.out = f.out, in.lse = f.lse;
  return in;
}

/// Gradients, contiguous in the layout of q / k / v.
struct Grads {
  HostTensor dq, dk, dv;
  int64_t unwritten = 0;  // NaN elements left in poisoned outputs, plus stray writes into row padding
};

inline void set_layout(BackwardArgs& a, const Case& c, const TensorView& cu_q, const TensorView& cu_k,
                       const TensorView* used_k) {
  if (c.layout == Layout::varlen) {
    a.layout.cu_seqlens_q = cu_q, a.layout.cu_seqlens_k = cu_k;
    a.layout.max_seqlen_q = c.max_q(), a.layout.max_seqlen_k = c.max_k();
  }
  if (used_k) a.layout.seqused_k = *used_k;
}

/// The oracle: the CPU reference backward on fp64 copies of the same inputs (exact input values, no
/// rounding of the gradients on the way out).
inline Grads run_reference(const Case& c, const BwdInputs& in) {
  const HostTensor q = gather(in.fwd.q).as(DType::f64), k = gather(in.fwd.k).as(DType::f64),
                   v = gather(in.fwd.v).as(DType::f64);
  const HostTensor out = in.out.as(DType::f64), dout = in.dout.as(DType::f64);
  Grads g{HostTensor(DType::f64, shape_of(q)), HostTensor(DType::f64, shape_of(k)),
          HostTensor(DType::f64, shape_of(v))};
  BackwardArgs a;
  a.q = q, a.k = k, a.v = v, a.out = out, a.dout = dout, a.lse = in.lse;
  a.dq = g.dq, a.dk = g.dk, a.dv = g.dv;
  a.options = options(c);
  if (c.alibi) a.options.alibi_slopes = in.fwd.alibi.view();
  const TensorView used = in.fwd.used_k.view();
  set_layout(a, c, in.fwd.cu_q, in.fwd.cu_k, c.used_k.empty() ? nullptr : &used);
  a.impl = Impl::reference;
  backward(a);
  return g;
}

/// The accuracy rule's baseline for gradients (common/grad_baseline.hpp) on contiguous copies of the
/// inputs.
inline Grads run_baseline(const Case& c, const BwdInputs& in) {
  BaselineGrads g = baseline_backward(c, gather(in.fwd.q), gather(in.fwd.k), gather(in.fwd.v), in.dout,
                                      in.fwd.alibi, options(c));
  return {std::move(g.dq), std::move(g.dk), std::move(g.dv)};
}

/// Gradient buffers on the device laid out like q / k / v (row padding included), filled with 0xFF
/// (NaN); `gathered` contiguous copies after the run, with unwritten elements and padding writes counted.
struct DeviceGrad {
  HostOperand host;
  DeviceTensor dev;

  explicit DeviceGrad(const HostOperand& like) : host(like) {
    // The copied view still points into like's buffer: re-base it onto our copy.
    host.view.data =
        static_cast<char*>(host.storage.tv.data) +
        (static_cast<const char*>(like.view.data) - static_cast<const char*>(like.storage.tv.data));
    dev = DeviceTensor::from_view(host.storage, host.view);
    fill_bytes(dev.mem.get(), 0xFF, dev.bytes);
  }
  HostTensor gathered(int64_t width, int64_t pad, int64_t& unwritten) {
    host.storage = dev.to_host(host.storage);
    host.view.data = static_cast<char*>(host.storage.tv.data) +
                     (static_cast<const char*>(dev.tv.data) - static_cast<const char*>(dev.mem.get()));
    HostTensor out = gather(host);
    unwritten += count_nan(out);
    if (pad > 0) {  // padding channels must keep their poison
      const int64_t row = width + pad, rows = host.storage.numel() / row;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t ch = width; ch < row; ++ch)
          unwritten += std::isnan(host.storage.get(i * row + ch)) ? 0 : 1;
    }
    return out;
  }
};

/// The public backward's arguments over device copies of `in` (gradients poisoned), kept alive together;
/// built in place (views point into the members).
struct GpuBackwardCall {
  DeviceTensor q, k, v, out, dout, lse;
  DeviceGrad dq, dk, dv;
  std::vector<DeviceTensor> keep;  // index tensors, ALiBi slopes
  BackwardArgs args;

  /// `fwd` is referenced, not copied: its views point into its own storage (a copied FwdInputs keeps
  /// views into the original's bytes).
  GpuBackwardCall(const Case& c, const FwdInputs& fwd, const HostTensor& out_h, const HostTensor& dout_h,
                  const HostTensor& lse_h, bool deterministic = false)
      : q(DeviceTensor::from_view(fwd.q.storage, fwd.q.view)),
        k(DeviceTensor::from_view(fwd.k.storage, fwd.k.view)),
        v(DeviceTensor::from_view(fwd.v.storage, fwd.v.view)),
        out(DeviceTensor::from(out_h)),
        dout(DeviceTensor::from(dout_h)),
        lse(DeviceTensor::from(lse_h)),
        dq(fwd.q),
        dk(fwd.k),
        dv(fwd.v) {
    keep.reserve(4);
    auto dev = [&](const HostTensor& h) {
      keep.push_back(DeviceTensor::from(h));
      return keep.back().view();
    };
    BackwardArgs& a = args;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.dout = dout.view(),
    a.lse = lse.view();
    a.dq = dq.dev.view(), a.dk = dk.dev.view(), a.dv = dv.dev.view();
    a.options = options(c);
    a.options.deterministic = deterministic;
    if (c.alibi) a.options.alibi_slopes = dev(fwd.alibi);
    TensorView cu_q, cu_k, used;
    if (c.layout == Layout::varlen) cu_q = dev(fwd.cu_q), cu_k = dev(fwd.cu_k);
    if (!c.used_k.empty()) used = dev(fwd.used_k);
    set_layout(a, c, cu_q, cu_k, c.used_k.empty() ? nullptr : &used);
  }
  GpuBackwardCall(const GpuBackwardCall&) = delete;
  GpuBackwardCall& operator=(const GpuBackwardCall&) = delete;
};

/// The CUDA backward (Impl::automatic on device tensors); `deterministic` sets the option.
inline Grads run_gpu_backward(const Case& c, const BwdInputs& in, bool deterministic = false) {
  GpuBackwardCall call(c, in.fwd, in.out, in.dout, in.lse, deterministic);
  backward(call.args);
  Grads g;
  const int64_t pad = c.layout == Layout::dense ? c.pad : 0;
  g.dq = call.dq.gathered(c.d, pad, g.unwritten);
  g.dk = call.dk.gathered(c.d, pad, g.unwritten);
  g.dv = call.dv.gathered(c.dv, pad, g.unwritten);
  return g;
}

/// GPU gradients for `in` vs the oracle by the accuracy rule (3x the baseline's error), every element
/// written; returns them for further checks.
inline Grads expect_backward_accurate_on(const Case& c, const BwdInputs& in) {
  SCOPED_TRACE(c.describe());
  Grads gpu = run_gpu_backward(c, in);
  const Grads ref = run_reference(c, in);
  const Grads base = run_baseline(c, in);
  EXPECT_EQ(gpu.unwritten, 0) << "gradient elements unwritten (or row padding overwritten)";
  if (std::getenv("FLASHPORT_TEST_VERBOSE")) {
    std::printf("  %s\n    max|err| gpu/baseline: dq %.3g/%.3g dk %.3g/%.3g dv %.3g/%.3g\n",
                c.describe().c_str(), max_abs_diff(gpu.dq, ref.dq), max_abs_diff(base.dq, ref.dq),
                max_abs_diff(gpu.dk, ref.dk), max_abs_diff(base.dk, ref.dk), max_abs_diff(gpu.dv, ref.dv),
                max_abs_diff(base.dv, ref.dv));
  }
  EXPECT_TRUE(accuracy_rule(gpu.dq, base.dq, ref.dq, 3.0)) << "dq";
  EXPECT_TRUE(accuracy_rule(gpu.dk, base.dk, ref.dk, 3.0)) << "dk";
  EXPECT_TRUE(accuracy_rule(gpu.dv, base.dv, ref.dv, 3.0)) << "dv";
  return gpu;
}

/// The same on fresh inputs for `c`.
inline void expect_backward_accurate(const Case& c) {
  expect_backward_accurate_on(c, make_bwd_inputs(c));
}

/// Whether a and b hold the same bytes (else how many elements differ).
inline ::testing::AssertionResult same_bytes(const HostTensor& a, const HostTensor& b) {
  if (a.bytes.size() == b.bytes.size() && std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0)
    return ::testing::AssertionSuccess();
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += a.get(i) != b.get(i) ? 1 : 0;
  return ::testing::AssertionFailure() << n << " of " << a.numel() << " elements differ";
}

/// `runs` deterministic runs on the same inputs: identical bits, and the first one accurate.
inline void expect_deterministic(const Case& c, int runs = 3) {
  SCOPED_TRACE(c.describe());
  const BwdInputs in = make_bwd_inputs(c);
  const Grads first = run_gpu_backward(c, in, true);
  EXPECT_EQ(first.unwritten, 0) << "gradient elements unwritten";
  for (int run = 1; run < runs; ++run) {
    const Grads again = run_gpu_backward(c, in, true);
    EXPECT_TRUE(same_bytes(first.dq, again.dq)) << "dq, run " << run;
    EXPECT_TRUE(same_bytes(first.dk, again.dk)) << "dk, run " << run;
    EXPECT_TRUE(same_bytes(first.dv, again.dv)) << "dv, run " << run;
  }
  const Grads ref = run_reference(c, in), base = run_baseline(c, in);
  EXPECT_TRUE(accuracy_rule(first.dq, base.dq, ref.dq, 3.0)) << "dq";
  EXPECT_TRUE(accuracy_rule(first.dk, base.dk, ref.dk, 3.0)) << "dk";
  EXPECT_TRUE(accuracy_rule(first.dv, base.dv, ref.dv, 3.0)) << "dv";
}

}  // namespace flashport::test::gpu
