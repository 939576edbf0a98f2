// The CDNA backward kernels on the CPU wave64 model against the CPU reference backward (SPEC's accuracy
// rule for gradients, 3x a naive same-precision baseline): awkward shapes, masks, softcap, ALiBi,
// dropout, GQA, varlen with empty sequences, seqused_k. dQ/dK/dV are poisoned with NaN first, and the
// kernels' fp32 workspaces start as NaN too (hip_model_backward.hpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "backends/cpu/elem.hpp"
#include "core/attn_validate.hpp"
#include "cpu/test_fast_util.hpp"
#include "hip_grad_oracle.hpp"
#include "hip_model_backward.hpp"

namespace flashport::test {
namespace {

/// Forward once (CPU reference: O in the input dtype and the LSE, as a real forward hands them over),
/// then the model backward on poisoned gradients against the oracle. Returns the model's gradients.
fastcheck::Grads check(const Case& c, bool vec = true, bool deterministic = false) {
  SCOPED_TRACE(c.describe() + (vec ? "" : " (2-byte loads)") + (deterministic ? " (deterministic)" : ""));
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const fastcheck::Forward fwd = fastcheck::run_forward(c, in, Impl::reference);
  const HostTensor dout = randn(c.dtype, out_shape(c));
  fastcheck::Grads got{HostTensor(c.dtype, shape_of(in.q)), HostTensor(c.dtype, shape_of(in.k)),
                       HostTensor(c.dtype, shape_of(in.v))};
  poison(got.dq);
  poison(got.dk);
  poison(got.dv);
  AttnProblem p = core::build_attention(in.q, in.k, in.v, fwd.out, fastcheck::options(c, in),
                                        fastcheck::layout(c, in), nullptr);
  core::attach_lse(p, fwd.lse, Device{});
  p.deterministic = deterministic;
  p.dout = operand(dout);
  p.grad_q = operand(got.dq), p.grad_k = operand(got.dk), p.grad_v = operand(got.dv);
  hipmodel::backward(p, vec);
  const fastcheck::Grads ref = reference_grads(c, in, fwd, dout);
  const fastcheck::Grads base = baseline_grads(c, in, dout);
  if (std::getenv("FLASHPORT_TEST_VERBOSE"))
    std::printf(
        "  %s\n    max|err| model/baseline: dq %.3g/%.3g dk %.3g/%.3g dv %.3g/%.3g (max|ref| dq %.3g)\n",
        c.describe().c_str(), max_abs_diff(got.dq, ref.dq), max_abs_diff(base.dq, ref.dq),
        max_abs_diff(got.dk, ref.dk), max_abs_diff(base.dk, ref.dk), max_abs_diff(got.dv, ref.dv),
        max_abs_diff(base.dv, ref.dv), fastcheck::max_abs(ref.dq));
  EXPECT_TRUE(accuracy_rule(got.dq, base.dq, ref.dq, 3.0)) << "dq";
  EXPECT_TRUE(accuracy_rule(got.dk, base.dk, ref.dk, 3.0)) << "dk";
  EXPECT_TRUE(accuracy_rule(got.dv, base.dv, ref.dv, 3.0)) << "dv";
  return got;
}

TEST(HipModelBackward, SeqlenOne) {
  check(dense(DType::bf16, 2, 1, 1, 2, 1, 64, 64));
  Case c = dense(DType::f16, 1, 1, 37, 2, 2, 32, 32);
  c.causal = true;
  check(c);
}

TEST(HipModelBackward, OddLengthsBothDtypes) {
  for (DType dt : {DType::bf16, DType::f16}) {
    check(dense(dt, 1, 113, 203, 2, 2, 64, 64));
    Case c = dense(dt, 1, 113, 203, 2, 1, 128, 128);
    c.causal = true;
    check(c);
  }
}

TEST(HipModelBackward, QueriesLongerThanKeysCausal) {
  Case c = dense(DType::bf16, 2, 77, 20, 2, 2, 32, 32);
  c.causal = true;  // bottom-right: the first 57 rows see nothing: their dQ is exactly 0
  const fastcheck::Grads got = check(c);
  int64_t nonzero = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 57; ++i)
      for (int64_t e = 0; e < c.hq * c.d; ++e) nonzero += got.dq.get((b * 77 + i) * c.hq * c.d + e) != 0.0;
  EXPECT_EQ(nonzero, 0) << "dQ of fully masked rows";
}

TEST(HipModelBackward, Gqa7To1WithWindow) {
  Case c = dense(DType::bf16, 1, 33, 70, 7, 1, 64, 64);
  check(c);
  c.wl = 9, c.wr = 3;
  check(c);
  check(c, /*vec=*/true, /*deterministic=*/true);
}

TEST(HipModelBackward, PaddedHeadDims) {
  check(dense(DType::bf16, 1, 20, 40, 1, 1, 72, 72));    // bucket 96
  check(dense(DType::f16, 1, 20, 30, 1, 1, 40, 24));     // bucket 64, d != dv
  check(dense(DType::bf16, 1, 21, 35, 1, 1, 152, 152));  // bucket 160: 2 waves, 32-key tiles
  check(dense(DType::f16, 1, 40, 70, 1, 1, 256, 256));
}

TEST(HipModelBackward, ScoreVariants) {
  Case c = dense(DType::bf16, 1, 50, 90, 2, 1, 32, 32);
  c.softcap = 5.0, c.q_stddev = 3.0;
  check(c);
  c.softcap = 0.0, c.q_stddev = 1.0;
  c.alibi = 1, c.causal = true;
  check(c);
  c.alibi = 2, c.causal = false, c.wl = 20, c.wr = 0;
  check(c);
}

TEST(HipModelBackward, Dropout) {
  Case c = dense(DType::f16, 1, 40, 70, 2, 1, 32, 32);
  c.dropout = 0.2, c.causal = true;
  check(c);
}

TEST(HipModelBackward, VarlenWithEmptySequencesAndSequsedK) {
  Case c;
  c.dtype = DType::bf16, c.layout = Layout::varlen, c.hq = 2, c.hk = 1, c.d = c.dv = 64;
  c.q_lens = {0, 50, 1, 33}, c.k_lens = {5, 0, 40, 70};
  check(c);
  c.causal = true;
  c.used_k = {3, 0, 17, 70};
  check(c);
}

// Deterministic mode: 3 dQ slices over up to 4 key tiles per (kv head, batch), so blocks visit several
// tiles. The model runs blocks and interleaves lanes in a different shuffled order on each launch, which
// in this mode must not change a bit of the fp32 dQ accumulator (without it, the atomics' order follows
// the block order and the accumulator's last bits vary) or of the gradients.
TEST(HipModelBackward, DeterministicIsAccurateAndRepeatable) {
  std::vector<Case> cases;
  Case c = dense(DType::bf16, 2, 70, 203, 4, 2, 64, 64);
  c.causal = true;
  cases.push_back(c);
  Case v;
  v.dtype = DType::f16, v.layout = Layout::varlen, v.hq = 2, v.hk = 1, v.d = v.dv = 32;
  v.q_lens = {0, 50, 33}, v.k_lens = {5, 150, 90}, v.used_k = {5, 120, 0};
  cases.push_back(v);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.describe());
    const fastcheck::Inputs in = fastcheck::make_inputs(k);
    const fastcheck::Forward fwd = fastcheck::run_forward(k, in, Impl::reference);
    const HostTensor dout = randn(k.dtype, out_shape(k));
    std::vector<float> accum[2];
    int runs = 0;
    auto run = [&] {
      fastcheck::Grads g{HostTensor(k.dtype, shape_of(in.q)), HostTensor(k.dtype, shape_of(in.k)),
                         HostTensor(k.dtype, shape_of(in.v))};
      poison(g.dq), poison(g.dk), poison(g.dv);
      AttnProblem p = core::build_attention(in.q, in.k, in.v, fwd.out, fastcheck::options(k, in),
                                            fastcheck::layout(k, in), nullptr);
      core::attach_lse(p, fwd.lse, Device{});
      p.deterministic = true;
      p.dout = operand(dout), p.grad_q = operand(g.dq), p.grad_k = operand(g.dk), p.grad_v = operand(g.dv);
      accum[runs++] = hipmodel::backward(p);
      return g;
    };
    const fastcheck::Grads first = run(), again = run();
    EXPECT_TRUE(accum[0] == accum[1]) << "fp32 dQ accumulator";
    EXPECT_EQ(first.dq.bytes, again.dq.bytes) << "dq";
    EXPECT_EQ(first.dk.bytes, again.dk.bytes) << "dk";
    EXPECT_EQ(first.dv.bytes, again.dv.bytes) << "dv";
    const fastcheck::Grads ref = reference_grads(k, in, fwd, dout);
    const fastcheck::Grads base = baseline_grads(k, in, dout);
    EXPECT_TRUE(accuracy_rule(first.dq, base.dq, ref.dq, 3.0)) << "dq";
    EXPECT_TRUE(accuracy_rule(first.dk, base.dk, ref.dk, 3.0)) << "dk";
    EXPECT_TRUE(accuracy_rule(first.dv, base.dv, ref.dv, 3.0)) << "dv";
  }
}

TEST(HipModelBackward, UnalignedRowsTakeTheScalarPath) {
  check(dense(DType::bf16, 1, 30, 45, 1, 1, 64, 64), /*vec=*/false);
}

}  // namespace
}  // namespace flashport::test
