// The accuracy rule's baseline for gradients, one implementation for the CUDA harness
// (tests/gpu/test_bwd_util.hpp) and the CDNA ones (tests/hip/hip_grad_oracle.hpp), so that both
// backends are held to the same naive error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/elem.hpp"
#include "common/cases.hpp"
#include "core/semantics.h"

namespace flashport::test {

/// fp32 gradients laid out like q / k / v.
struct BaselineGrads {
  HostTensor dq, dk, dv;
};

/// Attention and its backward computed naively in fp32 with every intermediate tensor rounded to the
/// input dtype, as eager PyTorch autograd does in bf16/fp16 (flash-attn's own test baseline): S, the
/// softcapped and biased scores, P, P Z, dO V^T, its dropout product, dS (softmax backward), dS times
/// the softcap derivative, and dQ, dK, dV (each a fp32 sum rounded once; dK/dV summed over a GQA group
/// before rounding). q, k, v and dout are contiguous dense (b, s, h, d) or varlen (total, h, d);
/// `alibi` holds the slopes when c.alibi is set; `opt` gives the dropout seed and offset (each harness
/// draws its own).
inline BaselineGrads baseline_backward(const Case& c, const HostTensor& q, const HostTensor& k,
                                       const HostTensor& v, const HostTensor& dout, const HostTensor& alibi,
                                       const AttentionOptions& opt) {
  const int type = (int)c.dtype;
  auto rnd = [type](double x) { return (float)cpu::round_to(type, x); };
  BaselineGrads g{HostTensor(DType::f32, shape_of(q)), HostTensor(DType::f32, shape_of(k)),
                  HostTensor(DType::f32, shape_of(v))};
  const bool varlen = c.layout == Layout::varlen;
  const int64_t hq = c.hq, hk = c.hk, d = c.d, dv = c.dv, group = hq / hk;
  const float scale = (float)(1.0 / std::sqrt((double)d)), cap = (float)c.softcap;
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
      const float slope = c.alibi ? (float)alibi.get(c.alibi == 2 ? b * hq + h : h) : 0.0f;
      for (int64_t i = 0; i < sq; ++i) {
        const sem::KeyRange kr = sem::visible_keys(i, sq, sk, c.wl, c.causal ? 0 : c.wr);
        const int64_t n = std::max<int64_t>(kr.hi - kr.lo, 0);
        std::vector<float> capped(n), p(n), pz(n), dp(n);
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
          const float z = keep ? rp : 0.0f;
          pz[jj] = rnd(p[jj] * z);
          float dpd = 0.0f;
          for (int64_t ch = 0; ch < dv; ++ch) dpd += qv(dout, i, h, ch, dv) * kvv(v, j, kh, ch, dv);
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
            dq[ch] += ds * kvv(k, j, kh, ch, d);
            dk_acc[(j * hk + kh) * d + ch] += ds * qv(q, i, h, ch, d);
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

}  // namespace flashport::test
