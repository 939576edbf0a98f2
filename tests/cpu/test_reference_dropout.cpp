// Dropout in the CPU reference: keep fraction, reproducibility by (seed, offset), and p = 0 drawing no mask.
#include "cpu/test_reference_util.hpp"

namespace flashport::test {
namespace {

using refcheck::Spec;

Spec big(double p) {
  Spec s;
  s.batch = 1, s.sq = 256, s.sk = 256, s.hq = 2, s.hk = 1, s.d = 8, s.dv = 8;
  s.dtype = DType::f32;
  s.dropout_p = p;
  s.seed = rng()();
  s.offset = (uint32_t)rng()();
  return s;
}

double dropped_fraction(const HostTensor& dmask) {
  int64_t dropped = 0;
  for (int64_t n = 0; n < dmask.numel(); ++n) dropped += std::signbit(dmask.get(n));
  return (double)dropped / (double)dmask.numel();
}

int64_t mask_differences(const HostTensor& a, const HostTensor& b) {
  int64_t diff = 0;
  for (int64_t n = 0; n < a.numel(); ++n) diff += std::signbit(a.get(n)) != std::signbit(b.get(n));
  return diff;
}

TEST(ReferenceDropout, KeepFractionMatchesProbability) {
  for (double p : {0.1, 0.5}) {
    const Spec s = big(p);
    const refcheck::Inputs in = refcheck::make_inputs(s);
    HostTensor dmask;
    refcheck::run_forward(s, in, Impl::reference, &dmask);
    EXPECT_NEAR(dropped_fraction(dmask), p, 0.01) << "p = " << p;
  }
}

TEST(ReferenceDropout, ReproducibleBySeedAndOffset) {
  Spec s = big(0.3);
  s.sq = s.sk = 64;
  const refcheck::Inputs in = refcheck::make_inputs(s);
  HostTensor m1, m2, m_offset, m_seed, m_none;
  const refcheck::Result r1 = refcheck::run_forward(s, in, Impl::reference, &m1);
  const refcheck::Result r2 = refcheck::run_forward(s, in, Impl::reference, &m2);
  EXPECT_EQ(r1.out.bytes, r2.out.bytes);
  EXPECT_EQ(m1.bytes, m2.bytes);
  Spec other = s;
  other.offset = s.offset + 1;
  const refcheck::Result r_offset = refcheck::run_forward(other, in, Impl::reference, &m_offset);
  other = s;
  other.seed = s.seed ^ (1ull << 40);  // the high word of the seed is Philox key word 1
  refcheck::run_forward(other, in, Impl::reference, &m_seed);
  // Independent masks differ in about 2 p (1 - p) = 42% of the entries.
  const int64_t n = m1.numel();
  EXPECT_GT(mask_differences(m1, m_offset), n / 4);
  EXPECT_GT(mask_differences(m1, m_seed), n / 4);
  EXPECT_GT(max_abs_diff(r1.out, r_offset.out), 1e-3);
  // |P| is the pre-dropout probability whatever the mask.
  other = s;
  other.dropout_p = 0.0;
  const refcheck::Result r_none = refcheck::run_forward(other, in, Impl::reference, &m_none);
  for (int64_t e = 0; e < n; ++e) ASSERT_EQ(std::fabs(m1.get(e)), m_none.get(e)) << e;
  EXPECT_LE(max_abs_diff(r1.lse, r_none.lse), 0.0);  // LSE is taken before dropout
}

TEST(ReferenceDropout, ZeroProbabilityDrawsNoMask) {
  Spec s = big(0.0);
  s.sq = 40, s.sk = 50;
  const refcheck::Inputs in = refcheck::make_inputs(s);
  HostTensor dmask;
  const refcheck::Result r = refcheck::run_forward(s, in, Impl::reference, &dmask);
  EXPECT_EQ(dropped_fraction(dmask), 0.0);
  Spec other = s;
  other.seed = s.seed + 1, other.offset = s.offset + 7;
  const refcheck::Result r2 = refcheck::run_forward(other, in);
  EXPECT_EQ(r.out.bytes, r2.out.bytes);
}

}  // namespace
}  // namespace flashport::test
