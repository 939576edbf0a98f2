// The gradient oracle of the CDNA backward tests (the model harness, test_hip_backward.cpp, and the HIP
// backend through its stand-in runtime, backend/test_hip_backend.cpp): SPEC's accuracy rule for
// gradients compares against the CPU reference backward in fp64 and a naive same-precision baseline.
#pragma once

#include <cmath>
#include <vector>

#include "backends/cpu/elem.hpp"
#include "cpu/test_fast_util.hpp"

namespace flashport::test {

inline std::vector<int64_t> shape_of(const HostTensor& t) {
  return std::vector<int64_t>(t.tv.shape.begin(), t.tv.shape.begin() + t.tv.ndim);
}

/// The kernels' view of a contiguous host tensor (as api.cpp's operand()).
inline Operand operand(const HostTensor& t) {
  const TensorView& v = t.tv;
  return v.ndim == 4 ? Operand{v.data, v.stride[0], v.stride[1], v.stride[2]}
                     : Operand{v.data, 0, v.stride[0], v.stride[1]};
}

/// The accuracy rule's baseline for gradients, as the CUDA harness computes it (tests/gpu/
/// test_bwd_util.hpp, run_baseline, over that harness's own input type): attention and its backward in
/// fp32 with every intermediate rounded to the input dtype (eager PyTorch autograd in bf16/fp16), dK/dV
/// summed over a GQA group before rounding. Contiguous dense or varlen inputs (make_inputs).
inline fastcheck::Grads baseline_grads(const Case& c, const fastcheck::Inputs& in, const HostTensor& dout) {
  const int type = (int)c.dtype;
  auto rnd = [type](double x) { return (float)cpu::round_to(type, x); };
  fastcheck::Grads g{HostTensor(DType::f32, shape_of(in.q)), HostTensor(DType::f32, shape_of(in.k)),
                     HostTensor(DType::f32, shape_of(in.v))};
  const bool varlen = c.layout == Layout::varlen;
  const int64_t hq = c.hq, hk = c.hk, d = c.d, dv = c.dv, group = hq / hk;
  const float scale = (float)(1.0 / std::sqrt((double)d)), cap = (float)c.softcap;
  const unsigned threshold = sem::dropout_threshold(c.dropout);
  const float rp = c.dropout > 0 ? (float)(1.0 / (1.0 - c.dropout)) : 1.0f;
  const AttentionOptions opt = fastcheck::options(c, in);
  int64_t q0 = 0, k0 = 0;
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t sq = varlen ? c.q_lens[b] : c.q_lens[0], rows_k = varlen ? c.k_lens[b] : c.k_lens[0];
    const int64_t sk = c.used_k.empty() ? rows_k : c.used_k[b];
    const int64_t qb = varlen ? q0 : b * sq, kb = varlen ? k0 : b * rows_k;
    auto qv = [&](const HostTensor& t, int64_t i, int64_t h, int64_t ch, int64_t w) {
      return (float)t.get(((qb + i) * hq + h) * w + ch);
    };
    auto kvv = [&](const HostTensor& t, int64_t j, int64_t h, int64_t ch, int64_t w) {
      return (float)t.get(((kb + j) * hk + h) * w + ch);
    };
    std::vector<float> dk_acc(rows_k * hk * d, 0.0f), dv_acc(rows_k * hk * dv, 0.0f);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      const float slope = c.alibi ? (float)in.alibi.get(c.alibi == 2 ? b * hq + h : h) : 0.0f;
      for (int64_t i = 0; i < sq; ++i) {
        const sem::KeyRange kr = sem::visible_keys(i, sq, sk, c.wl, c.causal ? 0 : c.wr);
        const int64_t n = std::max<int64_t>(kr.hi - kr.lo, 0);
        std::vector<float> capped(n), p(n), pz(n), dp(n);
        float mx = -INFINITY;
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t j = kr.lo + jj;
          float dot = 0.0f;
          for (int64_t ch = 0; ch < d; ++ch) dot += qv(in.q, i, h, ch, d) * kvv(in.k, j, kh, ch, d);
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
          const float z = keep ? rp : 0.0f;
          pz[jj] = rnd(p[jj] * z);
          float dpd = 0.0f;
          for (int64_t ch = 0; ch < dv; ++ch) dpd += qv(dout, i, h, ch, dv) * kvv(in.v, j, kh, ch, dv);
          dp[jj] = rnd(rnd(dpd) * z);
        }
        float dsum = 0.0f;
        for (int64_t jj = 0; jj < n; ++jj) dsum += p[jj] * dp[jj];
        std::vector<float> dq(d, 0.0f);
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t j = kr.lo + jj;
          float ds = rnd(p[jj] * (dp[jj] - dsum));
          if (cap > 0) ds = rnd(ds * sem::softcap_grad(capped[jj], cap));
          for (int64_t ch = 0; ch < d; ++ch) {
            dq[ch] += ds * kvv(in.k, j, kh, ch, d);
            dk_acc[(j * hk + kh) * d + ch] += ds * qv(in.q, i, h, ch, d);
          }
          for (int64_t ch = 0; ch < dv; ++ch)
            dv_acc[(j * hk + kh) * dv + ch] += pz[jj] * qv(dout, i, h, ch, dv);
        }
        for (int64_t ch = 0; ch < d; ++ch) g.dq.set(((qb + i) * hq + h) * d + ch, rnd(scale * dq[ch]));
      }
    }
    for (int64_t j = 0; j < rows_k; ++j)
      for (int64_t kh = 0; kh < hk; ++kh) {
        for (int64_t ch = 0; ch < d; ++ch)
          g.dk.set(((kb + j) * hk + kh) * d + ch, rnd(scale * dk_acc[(j * hk + kh) * d + ch]));
        for (int64_t ch = 0; ch < dv; ++ch)
          g.dv.set(((kb + j) * hk + kh) * dv + ch, rnd(dv_acc[(j * hk + kh) * dv + ch]));
      }
    q0 += varlen ? c.q_lens[b] : 0;
    k0 += varlen ? c.k_lens[b] : 0;
  }
  return g;
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
