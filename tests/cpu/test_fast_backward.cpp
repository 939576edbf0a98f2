// The CPU fast backward against the fp64 reference backward: awkward shapes x masks, softcap, ALiBi,
// dropout, GQA, varlen with empty sequences and seqused_k, every ISA copy, determinism.
#include "cpu/test_fast_util.hpp"

namespace flashport::test {
namespace {

/// There is no baseline backward, so the bound is relative to the gradient's size: both sides see the
/// same rounded inputs, the reference accumulates in fp64 and the fast path in fp32, and both round
/// the result to the input dtype. Allowed: 3 (SPEC's gradient factor) x one rounding step of the
/// dtype (2^-8 bf16, 2^-11 fp16; 2^-17 for fp32 covers fp32 accumulation over a few hundred terms)
/// x max|grad| + 1e-5.
::testing::AssertionResult grads_close(const HostTensor& fast, const HostTensor& ref, DType dtype) {
  const double step = dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0x1p-17;
  const double scale = fastcheck::max_abs(ref), err = max_abs_diff(fast, ref);
  const double bound = 3.0 * step * scale + 1e-5;
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max|fast-ref| = " << err << " > " << bound << " (max|ref| = " << scale << ")";
}

/// Forward once (reference), then the fast and reference backward on the same out/LSE/dO.
void expect_grads(const Case& c) {
  SCOPED_TRACE(c.describe());
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const fastcheck::Forward fwd = fastcheck::run_forward(c, in, Impl::reference);
  const HostTensor dout = randn(c.dtype, out_shape(c));
  const fastcheck::Grads fast = fastcheck::run_backward(c, in, fwd, dout, Impl::fast);
  const fastcheck::Grads ref = fastcheck::run_backward(c, in, fwd, dout, Impl::reference);
  EXPECT_TRUE(grads_close(fast.dq, ref.dq, c.dtype)) << "dq";
  EXPECT_TRUE(grads_close(fast.dk, ref.dk, c.dtype)) << "dk";
  EXPECT_TRUE(grads_close(fast.dv, ref.dv, c.dtype)) << "dv";
}

Case with(Case c, bool causal, int64_t wl, int64_t wr, double softcap, int alibi, double dropout) {
  c.causal = causal, c.wl = wl, c.wr = wr, c.softcap = softcap, c.alibi = alibi, c.dropout = dropout;
  if (softcap > 0) c.q_stddev = 3.0;
  return c;
}

TEST(FastBackward, ShapesFeaturesDtypes) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    expect_grads(dense(dt, 2, 1, 1, 1, 1, 40, 40));
    expect_grads(with(dense(dt, 1, 113, 203, 7, 1, 59, 59), true, -1, -1, 0, 0, 0));
    expect_grads(with(dense(dt, 1, 203, 113, 4, 1, 64, 64), false, 30, 7, 0, 0, 0));
    expect_grads(with(dense(dt, 2, 70, 70, 2, 2, 128, 128), false, -1, -1, 4.0, 0, 0));
    expect_grads(with(dense(dt, 1, 90, 130, 4, 4, 40, 40), true, -1, -1, 0, 2, 0));
    expect_grads(with(dense(dt, 1, 77, 77, 4, 2, 64, 64), false, -1, -1, 0, 0, 0.2));
    expect_grads(with(dense(dt, 1, 65, 150, 4, 1, 59, 40), true, 60, -1, 3.0, 1, 0.1));
  }
}

TEST(FastBackward, FullyMaskedRows) {
  expect_grads(with(dense(DType::f32, 1, 150, 40, 2, 1, 64, 64), true, -1, -1, 0, 0, 0));
}

TEST(FastBackward, VarlenWithEmptySequencesAndSequsedK) {
  Case c = varlen(dense(DType::bf16, 1, 1, 1, 7, 1, 59), kEmptySequences.q, kEmptySequences.k);
  for (DType dt : {DType::f32, DType::bf16}) {
    c.dtype = dt;
    c.used_k.clear();
    expect_grads(with(c, true, -1, -1, 0, 0, 0));
    c.used_k = kEmptySequences.used_k;
    expect_grads(with(c, false, -1, -1, 2.0, 1, 0.15));
  }
}

TEST(FastBackward, EveryIsaCopy) {
  for (const char* isa : {"avx512", "avx2", "base"}) {
    fastcheck::with_isa(isa, [&] {
      SCOPED_TRACE(isa);
      expect_grads(with(dense(DType::f32, 1, 113, 203, 7, 1, 59, 59), true, 70, -1, 5.0, 2, 0.1));
      expect_grads(with(dense(DType::bf16, 2, 70, 70, 4, 2, 40, 128), false, -1, -1, 0, 0, 0));
    });
  }
}

TEST(FastBackward, DeterministicAndAutomaticIsFast) {
  Case c = with(dense(DType::bf16, 2, 130, 203, 4, 2, 64, 64), true, -1, -1, 0, 0, 0.1);
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const fastcheck::Forward fwd = fastcheck::run_forward(c, in, Impl::reference);
  const HostTensor dout = randn(c.dtype, out_shape(c));
  const fastcheck::Grads a = fastcheck::run_backward(c, in, fwd, dout, Impl::fast, true);
  const fastcheck::Grads b = fastcheck::run_backward(c, in, fwd, dout, Impl::fast, true);
  const fastcheck::Grads automatic = fastcheck::run_backward(c, in, fwd, dout, Impl::automatic);
  for (const fastcheck::Grads* g : {&b, &automatic}) {
    EXPECT_TRUE(fastcheck::bitwise_equal(a.dq, g->dq));
    EXPECT_TRUE(fastcheck::bitwise_equal(a.dk, g->dk));
    EXPECT_TRUE(fastcheck::bitwise_equal(a.dv, g->dv));
  }
}

}  // namespace
}  // namespace flashport::test
