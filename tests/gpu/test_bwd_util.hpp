// Backward test harness: the CUDA backward on poisoned device gradients vs the CPU oracle (fp64
// reference on the same low-precision inputs) and a naive same-precision baseline written here.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cpu/elem.hpp"
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

inline std::vector<int64_t> shape_of(const HostTensor& t) {
  return std::vector<int64_t>(t.tv.shape.begin(), t.tv.shape.begin() + t.tv.ndim);
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

/// The accuracy rule's baseline for gradients: attention and its backward computed naively in fp32
/// with every intermediate tensor rounded to the input dtype, as eager PyTorch autograd does in
/// bf16/fp16 (flash-attn's own test baseline): S, the softcapped and biased scores, P, P Z, dO V^T,
/// its dropout product, dS (softmax backward), dS times the softcap derivative, and dQ, dK, dV
/// (each a fp32 sum rounded once; dK/dV summed over a GQA group before rounding).
inline Grads run_baseline(const Case& c, const BwdInputs& in) {
  const int type = (int)c.dtype;
  auto rnd = [type](double x) { return (float)cpu::round_to(type, x); };
  const HostTensor q = gather(in.fwd.q), k = gather(in.fwd.k), v = gather(in.fwd.v);
  Grads g{HostTensor(DType::f32, shape_of(q)), HostTensor(DType::f32, shape_of(k)),
          HostTensor(DType::f32, shape_of(v))};
  const bool varlen = c.layout == Layout::varlen;
  const int64_t hq = c.hq, hk = c.hk, d = c.d, dv = c.dv, group = hq / hk;
  const float scale = (float)(1.0 / std::sqrt((double)d)), cap = (float)c.softcap;
  const AttentionOptions opt = options(c);
  const unsigned threshold = sem::dropout_threshold(c.dropout);
  const float rp = c.dropout > 0 ? (float)(1.0 / (1.0 - c.dropout)) : 1.0f;
  int64_t q0 = 0, k0 = 0;  // first row of the sequence (varlen)
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t sq = varlen ? c.q_lens[b] : c.q_lens[0], rows_k = varlen ? c.k_lens[b] : c.k_lens[0];
    const int64_t sk = c.used_k.empty() ? rows_k : c.used_k[b];
    const int64_t qb = varlen ? q0 : b * sq, kb = varlen ? k0 : b * rows_k;  // row bases
    auto qv = [&](const HostTensor& t, int64_t i, int64_t h, int64_t ch, int64_t w) {
      return (float)t.get(((qb + i) * hq + h) * w + ch);
    };
    auto kvv = [&](const HostTensor& t, int64_t j, int64_t h, int64_t ch, int64_t w) {
      return (float)t.get(((kb + j) * hk + h) * w + ch);
    };
    std::vector<float> dk_acc(rows_k * hk * d, 0.0f), dv_acc(rows_k * hk * dv, 0.0f);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      float slope = 0.0f;
      if (c.alibi) slope = (float)in.fwd.alibi.get(c.alibi == 2 ? b * hq + h : h);
      for (int64_t i = 0; i < sq; ++i) {
        const sem::KeyRange kr = sem::visible_keys(i, sq, sk, c.wl, c.causal ? 0 : c.wr);
        const int64_t n = std::max<int64_t>(kr.hi - kr.lo, 0);
        std::vector<float> capped(n), p(n), pz(n), z(n), dp(n);
        float mx = -INFINITY;
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t j = kr.lo + jj;
          float dot = 0.0f;
          for (int64_t ch = 0; ch < d; ++ch) dot += qv(q, i, h, ch, d) * kvv(k, j, kh, ch, d);
          float s = rnd(scale * dot);
          if (cap > 0) s = rnd(cap * std::tanh(s / cap));
          capped[jj] = s;
          if (c.alibi) s = rnd(s + sem::alibi_bias(slope, i, j, sq, sk));
          p[jj] = s;
          mx = std::max(mx, s);
        }
        float sum = 0.0f;
        for (int64_t jj = 0; jj < n; ++jj) sum += (p[jj] = std::exp(p[jj] - mx));
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t j = kr.lo + jj;
          p[jj] = rnd(p[jj] / sum);
          const bool keep = c.dropout == 0 || sem::dropout_keep(opt.dropout_seed, opt.dropout_offset,
                                                                threshold, i, j, b, hq, h);
          z[jj] = keep ? rp : 0.0f;
          pz[jj] = rnd(p[jj] * z[jj]);
          float dpd = 0.0f;
          for (int64_t ch = 0; ch < dv; ++ch) dpd += qv(in.dout, i, h, ch, dv) * kvv(v, j, kh, ch, dv);
          dp[jj] = rnd(rnd(dpd) * z[jj]);
        }
        float dsum = 0.0f;
        for (int64_t jj = 0; jj < n; ++jj) dsum += p[jj] * dp[jj];
        std::vector<float> dq(d, 0.0f);
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t j = kr.lo + jj;
          float ds = rnd(p[jj] * (dp[jj] - dsum));
          if (cap > 0) ds = rnd(ds * sem::softcap_grad(capped[jj], cap));
          for (int64_t ch = 0; ch < d; ++ch) {
            dq[ch] += ds * kvv(k, j, kh, ch, d);
            dk_acc[(j * hk + kh) * d + ch] += ds * qv(q, i, h, ch, d);
          }
          for (int64_t ch = 0; ch < dv; ++ch)
            dv_acc[(j * hk + kh) * dv + ch] += pz[jj] * qv(in.dout, i, h, ch, dv);
        }
        for (int64_t ch = 0; ch < d; ++ch) g.dq.set(((qb + i) * hq + h) * d + ch, rnd(scale * dq[ch]));
      }
    }
    for (int64_t j = 0; j < rows_k; ++j) {
      for (int64_t kh = 0; kh < hk; ++kh) {
        for (int64_t ch = 0; ch < d; ++ch)
          g.dk.set(((kb + j) * hk + kh) * d + ch, rnd(scale * dk_acc[(j * hk + kh) * d + ch]));
        for (int64_t ch = 0; ch < dv; ++ch)
          g.dv.set(((kb + j) * hk + kh) * dv + ch, rnd(dv_acc[(j * hk + kh) * dv + ch]));
      }
    }
    q0 += varlen ? c.q_lens[b] : 0;
    k0 += varlen ? c.k_lens[b] : 0;
  }
  return g;
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

}  // namespace flashport::test::gpu
