// CUDA backward in deterministic mode: dq, dk, dv bitwise identical over runs, accurate, fully
// written; including the one-slice grid where every CTA walks several key blocks.
#include <cstring>

#include "gpu/test_bwd_util.hpp"

namespace flashport::test::gpu {
namespace {

::testing::AssertionResult same_bytes(const HostTensor& a, const HostTensor& b) {
  if (a.bytes.size() == b.bytes.size() && std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0)
    return ::testing::AssertionSuccess();
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += a.get(i) != b.get(i) ? 1 : 0;
  return ::testing::AssertionFailure() << n << " of " << a.numel() << " elements differ";
}

/// Three deterministic runs: identical bits, and the first one accurate.
void expect_deterministic(const Case& c) {
  SCOPED_TRACE(c.describe());
  const BwdInputs in = make_bwd_inputs(c);
  const Grads first = run_gpu_backward(c, in, true);
  EXPECT_EQ(first.unwritten, 0) << "gradient elements unwritten";
  for (int run = 1; run < 3; ++run) {
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

TEST(GpuBackwardDeterministic, BitwiseOverRuns) {
  FP_SKIP_WITHOUT_GPU();
  // Few (batch, kv head) pairs: many dQ slices, one key block each.
  Case c = dense(DType::bf16, 1, 257, 700, 8, 2, 64);
  c.causal = true, c.dropout = 0.1;
  expect_deterministic(c);
  Case v = dense(DType::f16, 1, 1, 1, 4, 4, 128);
  v.layout = Layout::varlen;
  v.q_lens = {0, 130, 300, 7}, v.k_lens = {3, 130, 280, 0};
  v.softcap = 4.0, v.q_stddev = 3.0;
  expect_deterministic(v);
}

TEST(GpuBackwardDeterministic, OneSliceWalksSeveralKeyBlocks) {
  FP_SKIP_WITHOUT_GPU();
  // batch * hk >= the SM count: one slice, so each CTA visits every key block of its head in turn.
  Case c = dense(DType::bf16, 2, 200, 200, 80, 80, 32);
  c.causal = true;
  expect_deterministic(c);
}

}  // namespace
}  // namespace flashport::test::gpu
