// The CPU reference forward against an independent naive attention: masks, softcap, ALiBi, GQA, head dims,
// storage types, strides, fully masked rows, the baseline and FP8 with descales.
#include <cstring>

#include "cpu/test_reference_util.hpp"

namespace flashport::test {
namespace {

using refcheck::Spec;

/// LSE is stored in fp32: compare with a relative tolerance; -inf must match exactly.
void expect_lse_near(const HostTensor& lse, const std::vector<double>& want) {
  for (int64_t n = 0; n < lse.numel(); ++n) {
    const double x = lse.get(n), y = want[(size_t)n];
    if (std::isinf(y)) {
      ASSERT_EQ(x, y) << "lse[" << n << "]";
      continue;
    }
    ASSERT_NEAR(x, y, 1e-6 * std::max(1.0, std::fabs(y))) << "lse[" << n << "]";
  }
}

void expect_matches_naive(const Spec& sp) {
  SCOPED_TRACE(sp.describe());
  const refcheck::Inputs in = refcheck::make_inputs(sp);
  HostTensor dmask;
  const refcheck::Result r = refcheck::run_forward(sp, in, Impl::reference, &dmask);
  const refcheck::Naive want = refcheck::naive_forward(sp, in);
  EXPECT_LE(refcheck::max_diff(r.out, want.out), 1e-12);
  expect_lse_near(r.lse, want.lse);
  EXPECT_LE(refcheck::max_diff(dmask, want.probs), 1e-7);
}

Spec make(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, int64_t dv) {
  Spec s;
  s.batch = b, s.sq = sq, s.sk = sk, s.hq = hq, s.hk = hk, s.d = d, s.dv = dv;
  return s;
}

TEST(ReferenceForward, PlainAwkwardShapes) {
  expect_matches_naive(make(2, 113, 203, 2, 1, 59, 59));
  expect_matches_naive(make(1, 1, 1, 1, 1, 40, 40));
  expect_matches_naive(make(3, 1, 77, 2, 2, 64, 64));
  expect_matches_naive(make(1, 45, 9, 3, 3, 8, 8));
}

TEST(ReferenceForward, CausalBothAlignments) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{37, 64}, {50, 17}, {33, 33}, {1, 40}, {9, 1}}) {
    Spec s = make(2, sq, sk, 2, 2, 40, 40);
    s.causal = true;
    expect_matches_naive(s);
  }
}

TEST(ReferenceForward, SlidingWindows) {
  const int64_t windows[][2] = {{8, 3}, {5, -1}, {-1, 4}, {0, 0}, {2, 0}};
  for (const auto& w : windows)
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{61, 61}, {20, 47}, {47, 20}}) {
      Spec s = make(1, sq, sk, 2, 1, 24, 24);
      s.wl = w[0], s.wr = w[1];
      expect_matches_naive(s);
    }
}

TEST(ReferenceForward, SoftcapAndScale) {
  Spec s = make(2, 31, 45, 2, 2, 64, 64);
  s.softcap = 3.0;
  s.scale = 0.4;  // large scores, so the cap matters
  expect_matches_naive(s);
  s.causal = true;
  s.softcap = 0.7;
  expect_matches_naive(s);
}

TEST(ReferenceForward, AlibiPerHeadAndPerBatch) {
  Spec s = make(2, 29, 53, 3, 1, 16, 16);
  s.alibi = 1;
  s.causal = true;
  expect_matches_naive(s);
  s.alibi = 2;
  s.causal = false;
  expect_matches_naive(s);
  s.sq = 53, s.sk = 29;  // the bias is measured from the bottom-right diagonal
  expect_matches_naive(s);
}

TEST(ReferenceForward, GqaRatiosAndHeadDims) {
  expect_matches_naive(make(2, 19, 23, 4, 4, 40, 40));
  expect_matches_naive(make(2, 19, 23, 8, 2, 59, 59));
  expect_matches_naive(make(1, 19, 23, 7, 1, 64, 64));
  expect_matches_naive(make(1, 17, 21, 4, 2, 40, 24));  // dv < d
  expect_matches_naive(make(1, 17, 21, 2, 1, 24, 72));  // dv > d
}

TEST(ReferenceForward, AllFeaturesTogether) {
  Spec s = make(2, 27, 41, 8, 2, 40, 24);
  s.causal = true, s.wl = 9, s.softcap = 2.5, s.alibi = 2, s.dropout_p = 0.3;
  s.seed = rng()(), s.offset = (uint32_t)rng()();
  expect_matches_naive(s);
}

TEST(ReferenceForward, DropoutMatchesSpecCounter) {
  // Several batches and heads: the counter word 2 is b * hq + h.
  Spec s = make(3, 21, 26, 3, 1, 16, 16);
  s.dropout_p = 0.2;
  s.seed = rng()(), s.offset = (uint32_t)rng()();
  expect_matches_naive(s);
}

TEST(ReferenceForward, FullyMaskedRowsAreZeroWithInfiniteLse) {
  Spec causal = make(2, 10, 3, 2, 1, 16, 16);
  causal.causal = true;  // rows 0..6 see no key
  Spec window = make(1, 10, 3, 2, 2, 16, 8);
  window.wl = 1, window.wr = 0;
  Spec behind = make(1, 6, 12, 1, 1, 16, 16);
  behind.wl = 0, behind.wr = -1;
  for (const Spec& s : {causal, window}) {
    SCOPED_TRACE(s.describe());
    const refcheck::Inputs in = refcheck::make_inputs(s);
    const refcheck::Result r = refcheck::run_forward(s, in);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.hq; ++h)
        for (int64_t i = 0; i < s.sq; ++i) {
          const bool empty = i < 7;
          const double lse = r.lse.get((b * s.hq + h) * s.sq + i);
          EXPECT_EQ(std::isinf(lse) && lse < 0, empty) << b << " " << h << " " << i;
          for (int64_t c = 0; c < s.dv; ++c) {
            const double o = r.out.get(((b * s.sq + i) * s.hq + h) * s.dv + c);
            ASSERT_FALSE(std::isnan(o));
            if (empty) {
              ASSERT_EQ(o, 0.0);
            }
          }
        }
  }
  expect_matches_naive(behind);
}

/// Half-precision storage: the reference result equals the naive fp64 result on the same stored
/// values up to the final rounding of the output.
TEST(ReferenceForward, HalfAndSingleStorage) {
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    Spec s = make(2, 33, 47, 4, 2, 40, 40);
    s.causal = true, s.dtype = t;
    SCOPED_TRACE(s.describe());
    const refcheck::Inputs in = refcheck::make_inputs(s);
    const refcheck::Result r = refcheck::run_forward(s, in);
    const refcheck::Naive want = refcheck::naive_forward(s, in);
    const double ulp = t == DType::bf16 ? 1.0 / 256 : t == DType::f16 ? 1.0 / 2048 : 1.2e-7;
    const double subnormal = t == DType::f16 ? 3e-8 : 1e-38;  // half the fp16 subnormal spacing
    for (int64_t n = 0; n < r.out.numel(); ++n)
      ASSERT_NEAR(r.out.get(n), want.out[(size_t)n], ulp * std::fabs(want.out[(size_t)n]) + subnormal) << n;
    expect_lse_near(r.lse, want.lse);
  }
}

/// The baseline rounds scores and P to the input dtype: plain fp32 for fp32 inputs, visibly (but
/// boundedly) worse than the reference for bf16.
TEST(ReferenceForward, BaselineRoundsToInputDtype) {
  Spec s = make(2, 64, 96, 2, 1, 64, 64);
  s.dtype = DType::f32;
  refcheck::Inputs in = refcheck::make_inputs(s);
  refcheck::Result ref = refcheck::run_forward(s, in, Impl::reference);
  refcheck::Result base = refcheck::run_forward(s, in, Impl::baseline);
  EXPECT_LE(max_abs_diff(base.out, ref.out), 2e-6);
  EXPECT_LE(max_abs_diff(base.lse, ref.lse), 2e-5);
  s.dtype = DType::bf16;
  s.scale = 0.5;  // sharper softmax: scores rounding to bf16 matters
  in = refcheck::make_inputs(s);
  ref = refcheck::run_forward(s, in, Impl::reference);
  base = refcheck::run_forward(s, in, Impl::baseline);
  const double err = max_abs_diff(base.out, ref.out);
  EXPECT_GT(err, 0.0);
  EXPECT_LE(err, 0.1);
  EXPECT_TRUE(accuracy_rule(ref.out, base.out, ref.out));
}

/// Arbitrary (non-contiguous) strides on q, k, v and out give the same result as contiguous tensors.
TEST(ReferenceForward, StridedOperands) {
  Spec s = make(2, 13, 17, 4, 2, 24, 16);
  s.causal = true;
  const refcheck::Inputs in = refcheck::make_inputs(s);
  const refcheck::Result want = refcheck::run_forward(s, in);
  // q stored head-major (b, hq, sq, d); k padded per head; v with a row gap; out head-major.
  HostTensor q_store(DType::f64, {s.batch, s.hq, s.sq, s.d}),
      k_store(DType::f64, {s.batch, s.sk, s.hk, s.d + 5}),
      v_store(DType::f64, {s.batch, s.sk, s.hk * s.dv + 3}), o_store(DType::f64, {s.batch, s.hq, s.sq, s.dv});
  poison(o_store);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < s.hq; ++h)
        for (int64_t c = 0; c < s.d; ++c)
          q_store.set(((b * s.hq + h) * s.sq + i) * s.d + c, in.q.get(((b * s.sq + i) * s.hq + h) * s.d + c));
    for (int64_t j = 0; j < s.sk; ++j)
      for (int64_t h = 0; h < s.hk; ++h) {
        for (int64_t c = 0; c < s.d; ++c)
          k_store.set(((b * s.sk + j) * s.hk + h) * (s.d + 5) + c,
                      in.k.get(((b * s.sk + j) * s.hk + h) * s.d + c));
        for (int64_t c = 0; c < s.dv; ++c)
          v_store.set((b * s.sk + j) * (s.hk * s.dv + 3) + h * s.dv + c,
                      in.v.get(((b * s.sk + j) * s.hk + h) * s.dv + c));
      }
  }
  ForwardArgs a;
  a.q = TensorView::strided(q_store.tv.data, DType::f64, {s.batch, s.sq, s.hq, s.d},
                            {s.hq * s.sq * s.d, s.d, s.sq * s.d, 1});
  a.k = TensorView::strided(k_store.tv.data, DType::f64, {s.batch, s.sk, s.hk, s.d},
                            {s.sk * s.hk * (s.d + 5), s.hk * (s.d + 5), s.d + 5, 1});
  a.v = TensorView::strided(v_store.tv.data, DType::f64, {s.batch, s.sk, s.hk, s.dv},
                            {s.sk * (s.hk * s.dv + 3), s.hk * s.dv + 3, s.dv, 1});
  a.out = TensorView::strided(o_store.tv.data, DType::f64, {s.batch, s.sq, s.hq, s.dv},
                              {s.hq * s.sq * s.dv, s.dv, s.sq * s.dv, 1});
  a.options = refcheck::options(s, in);
  a.impl = Impl::reference;
  forward(a);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < s.hq; ++h)
        for (int64_t c = 0; c < s.dv; ++c)
          ASSERT_EQ(o_store.get(((b * s.hq + h) * s.sq + i) * s.dv + c),
                    want.out.get(((b * s.sq + i) * s.hq + h) * s.dv + c));
}

/// FP8 e4m3 with per-(batch, kv head) descales equals attention over the dequantised values.
TEST(ReferenceForward, Fp8WithDescales) {
  for (DType t : {DType::e4m3, DType::e4m3fnuz, DType::e5m2}) {
    Spec s = make(2, 23, 37, 4, 2, 32, 32);
    s.causal = true;
    SCOPED_TRACE(dtype_name(t));
    refcheck::Inputs deq = refcheck::make_inputs(s);  // f64 values to quantise
    refcheck::Inputs q8{deq.q.as(t), deq.k.as(t), deq.v.as(t), {}};
    HostTensor descale[3] = {HostTensor(DType::f32, {s.batch, s.hk}), HostTensor(DType::f32, {s.batch, s.hk}),
                             HostTensor(DType::f32, {s.batch, s.hk})};
    std::uniform_real_distribution<double> ud(0.5, 2.0);
    for (auto& ds : descale)
      for (int64_t n = 0; n < ds.numel(); ++n) ds.set(n, ud(rng()));
    // Dequantise exactly in fp64: x8 * descale(b, kv head of x).
    HostTensor* dq_targets[3] = {&deq.q, &deq.k, &deq.v};
    const HostTensor* src[3] = {&q8.q, &q8.k, &q8.v};
    for (int w = 0; w < 3; ++w) {
      const int64_t tokens = src[w]->tv.shape[1], heads = src[w]->tv.shape[2], ch = src[w]->tv.shape[3];
      for (int64_t n = 0; n < src[w]->numel(); ++n) {
        const int64_t b = n / (tokens * heads * ch), h = (n / ch) % heads;
        const int64_t hk = w == 0 ? h / (s.hq / s.hk) : h;
        dq_targets[w]->set(n, src[w]->get(n) * descale[w].get(b * s.hk + hk));
      }
    }
    const refcheck::Result want = refcheck::run_forward(s, deq);
    Spec s8 = s;
    s8.dtype = t;
    HostTensor out(DType::bf16, {s.batch, s.sq, s.hq, s.dv}), lse(DType::f32, {s.batch, s.hq, s.sq});
    poison(out);
    poison(lse);
    ForwardArgs a;
    a.q = q8.q, a.k = q8.k, a.v = q8.v, a.out = out, a.lse = lse.view();
    a.options = refcheck::options(s8, q8);
    a.options.q_descale = descale[0].view(), a.options.k_descale = descale[1].view();
    a.options.v_descale = descale[2].view();
    a.impl = Impl::reference;
    forward(a);
    // Only the bf16 rounding of the output separates the two.
    for (int64_t n = 0; n < out.numel(); ++n)
      ASSERT_NEAR(out.get(n), want.out.get(n), std::fabs(want.out.get(n)) / 256 + 1e-30) << n;
    EXPECT_LE(max_abs_diff(lse, want.lse), 1e-4);
    // And the bf16 forward of the same dequantised inputs is close (the SPEC's FP8 error report).
    Spec sb = s;
    sb.dtype = DType::bf16;
    const refcheck::Inputs deq_bf16{deq.q.as(DType::bf16), deq.k.as(DType::bf16), deq.v.as(DType::bf16), {}};
    const refcheck::Result bf16 = refcheck::run_forward(sb, deq_bf16);
    double peak = 1.0;
    for (int64_t n = 0; n < bf16.out.numel(); ++n) peak = std::max(peak, std::fabs(bf16.out.get(n)));
    // Loose: bf16 rounding of the dequantised q/k shifts scores of magnitude ~10 by ~0.05.
    EXPECT_LE(max_abs_diff(out, bf16.out), 5e-2 * peak);
  }
}

/// s_dmask exists in the reference only: `automatic` falls back to it, `fast` refuses by name.
TEST(ReferenceForward, DmaskSelectsTheReference) {
  Spec s = make(1, 17, 29, 2, 1, 16, 16);
  s.dtype = DType::f32, s.dropout_p = 0.25, s.seed = rng()();
  const refcheck::Inputs in = refcheck::make_inputs(s);
  HostTensor m_ref, m_auto, m_fast;
  const refcheck::Result ref = refcheck::run_forward(s, in, Impl::reference, &m_ref);
  const refcheck::Result automatic = refcheck::run_forward(s, in, Impl::automatic, &m_auto);
  EXPECT_EQ(ref.out.bytes, automatic.out.bytes);
  EXPECT_EQ(m_ref.bytes, m_auto.bytes);
  try {
    refcheck::run_forward(s, in, Impl::fast, &m_fast);
    ADD_FAILURE() << "Impl::fast accepted s_dmask";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s_dmask"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashport::test
