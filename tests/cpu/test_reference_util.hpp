// Helpers of the CPU reference tests: a problem description, random inputs, calls through the public API,
// and an independent naive attention written straight from SPEC.md (no shared semantics code but Philox).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "core/semantics.h"

namespace flashport::test::refcheck {

/// One dense attention problem.
struct Spec {
  int64_t batch = 1, sq = 1, sk = 1, hq = 1, hk = 1, d = 16, dv = 16;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  double softcap = 0.0;
  int alibi = 0;  // 0: off, 1: slopes (hq,), 2: slopes (b, hq)
  double dropout_p = 0.0;
  uint64_t seed = 0;
  uint32_t offset = 0;
  std::optional<double> scale;
  DType dtype = DType::f64;

  // The problem block carries scale, softcap and dropout_p in fp32; the naive oracle uses the same values.
  double scale_value() const { return (float)(scale ? *scale : 1.0 / std::sqrt((double)d)); }
  double softcap_value() const { return (float)softcap; }
  double dropout_value() const { return (float)dropout_p; }
  std::string describe() const {
    std::ostringstream s;
    s << "b=" << batch << " sq=" << sq << " sk=" << sk << " hq=" << hq << " hk=" << hk << " d=" << d
      << " dv=" << dv << " causal=" << causal << " window=(" << wl << "," << wr << ") softcap=" << softcap
      << " alibi=" << alibi << " dropout=" << dropout_p << " dtype=" << dtype_name(dtype);
    return s.str();
  }
};

struct Inputs {
  HostTensor q, k, v, alibi;
};

/// Fresh random q (b, sq, hq, d), k (b, sk, hk, d), v (b, sk, hk, dv) and positive ALiBi slopes.
inline Inputs make_inputs(const Spec& sp) {
  Inputs in;
  in.q = randn(sp.dtype, {sp.batch, sp.sq, sp.hq, sp.d});
  in.k = randn(sp.dtype, {sp.batch, sp.sk, sp.hk, sp.d});
  in.v = randn(sp.dtype, {sp.batch, sp.sk, sp.hk, sp.dv});
  if (sp.alibi) {
    in.alibi = sp.alibi == 1 ? HostTensor(DType::f32, {sp.hq}) : HostTensor(DType::f32, {sp.batch, sp.hq});
    std::uniform_real_distribution<double> ud(0.05, 0.6);
    for (int64_t n = 0; n < in.alibi.numel(); ++n) in.alibi.set(n, ud(rng()));
  }
  return in;
}

inline AttentionOptions options(const Spec& sp, const Inputs& in) {
  AttentionOptions o;
  o.softmax_scale = sp.scale;
  o.causal = sp.causal;
  o.window_left = sp.wl;
  o.window_right = sp.wr;
  o.softcap = sp.softcap;
  if (sp.alibi) o.alibi_slopes = in.alibi.view();
  o.dropout_p = sp.dropout_p;
  o.dropout_seed = sp.seed;
  o.dropout_offset = sp.offset;
  return o;
}

struct Result {
  HostTensor out, lse;
};

/// Dense forward through the public API with poisoned outputs.
inline Result run_forward(const Spec& sp, const Inputs& in, Impl impl = Impl::reference,
                          HostTensor* s_dmask = nullptr, DType out_type = DType::f32,
                          bool same_out_type = true) {
  Result r{HostTensor(same_out_type ? sp.dtype : out_type, {sp.batch, sp.sq, sp.hq, sp.dv}),
           HostTensor(DType::f32, {sp.batch, sp.hq, sp.sq})};
  poison(r.out);
  poison(r.lse);
  ForwardArgs a;
  a.q = in.q, a.k = in.k, a.v = in.v, a.out = r.out;
  a.lse = r.lse.view();
  if (s_dmask) {
    *s_dmask = HostTensor(DType::f32, {sp.batch, sp.hq, sp.sq, sp.sk});
    poison(*s_dmask);
    a.s_dmask = s_dmask->view();
  }
  a.options = options(sp, in);
  a.impl = impl;
  forward(a);
  return r;
}

/// The SPEC keep decision, evaluated from the Philox words directly (not through sem::dropout_keep).
inline bool spec_keep(const Spec& sp, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (sp.dropout_p <= 0.0) return true;
  const uint32_t threshold = (uint32_t)std::floor(sp.dropout_p * 4294967296.0);
  const sem::Philox4 w = sem::philox4x32_10((uint32_t)(j / 4), (uint32_t)i, (uint32_t)(b * sp.hq + h),
                                            sp.offset, (uint32_t)sp.seed, (uint32_t)(sp.seed >> 32));
  return w.x[j % 4] >= threshold;
}

/// Naive attention output (b, sq, hq, dv), LSE (b, hq, sq) and signed probabilities (b, hq, sq, sk).
struct Naive {
  std::vector<double> out, lse, probs;
};

/// SPEC.md steps 1-6 in the plainest form. `keys_used` (b,), when given, limits each sequence's keys.
inline Naive naive_forward(const Spec& sp, const Inputs& in,
                           const std::vector<int64_t>* keys_used = nullptr) {
  Naive n;
  n.out.assign((size_t)(sp.batch * sp.sq * sp.hq * sp.dv), 0.0);
  n.lse.assign((size_t)(sp.batch * sp.hq * sp.sq), -INFINITY);
  n.probs.assign((size_t)(sp.batch * sp.hq * sp.sq * sp.sk), 0.0);
  const int64_t group = sp.hq / sp.hk, wr = sp.causal ? 0 : sp.wr;
  for (int64_t b = 0; b < sp.batch; ++b) {
    const int64_t sk = keys_used ? (*keys_used)[(size_t)b] : sp.sk, sq = sp.sq;
    for (int64_t h = 0; h < sp.hq; ++h) {
      const int64_t g = h / group;
      const double slope = sp.alibi == 0 ? 0.0 : in.alibi.get(sp.alibi == 1 ? h : b * sp.hq + h);
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> s((size_t)sk, -INFINITY);
        const int64_t r = i + sk - sq;
        for (int64_t j = 0; j < sk; ++j) {
          const bool visible = (sp.wl < 0 || j >= r - sp.wl) && (wr < 0 || j <= r + wr);
          if (!visible) continue;
          double dot = 0.0;
          for (int64_t c = 0; c < sp.d; ++c)
            dot += in.q.get(((b * sp.sq + i) * sp.hq + h) * sp.d + c) *
                   in.k.get(((b * sp.sk + j) * sp.hk + g) * sp.d + c);
          double x = sp.scale_value() * dot;
          if (sp.softcap > 0) x = sp.softcap_value() * std::tanh(x / sp.softcap_value());
          x -= slope * std::fabs((double)(r - j));
          s[(size_t)j] = x;
        }
        double m = -INFINITY;
        for (double x : s) m = std::max(m, x);
        if (m == -INFINITY) continue;  // fully masked: out 0, LSE -inf
        double sum = 0.0;
        for (double x : s) sum += std::exp(x - m);
        n.lse[(size_t)((b * sp.hq + h) * sp.sq + i)] = m + std::log(sum);
        for (int64_t j = 0; j < sk; ++j) {
          const double p = std::exp(s[(size_t)j] - m) / sum;
          const bool keep = spec_keep(sp, b, h, i, j);
          n.probs[(size_t)(((b * sp.hq + h) * sp.sq + i) * sp.sk + j)] = keep ? p : -p;
          const double pz = keep ? p / (1.0 - sp.dropout_value()) : 0.0;
          for (int64_t c = 0; c < sp.dv; ++c)
            n.out[(size_t)(((b * sp.sq + i) * sp.hq + h) * sp.dv + c)] +=
                pz * in.v.get(((b * sp.sk + j) * sp.hk + g) * sp.dv + c);
        }
      }
    }
  }
  return n;
}

/// max |t - want| over all elements; NaN anywhere gives +inf; equal infinities match.
inline double max_diff(const HostTensor& t, const std::vector<double>& want) {
  double m = 0.0;
  for (int64_t n = 0; n < t.numel(); ++n) {
    const double x = t.get(n), y = want[(size_t)n];
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    if (x == y) continue;
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

/// A copy of `t` (b, s, h, c) keeping tokens [lo, hi) of batch row `b` as a (1, hi - lo, h, c) tensor.
inline HostTensor slice_tokens(const HostTensor& t, int64_t b, int64_t lo, int64_t hi) {
  const int64_t s = t.tv.shape[1], h = t.tv.shape[2], c = t.tv.shape[3];
  HostTensor out(t.tv.dtype, {1, hi - lo, h, c});
  for (int64_t tok = lo; tok < hi; ++tok)
    for (int64_t e = 0; e < h * c; ++e) out.set((tok - lo) * h * c + e, t.get((b * s + tok) * h * c + e));
  return out;
}

}  // namespace flashport::test::refcheck
