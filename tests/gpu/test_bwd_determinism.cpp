// CUDA backward in deterministic mode: dq, dk, dv bitwise identical over runs, accurate, fully
// written; including the one-slice grid where every CTA walks several key blocks.
#include "gpu/test_bwd_util.hpp"

namespace flashport::test::gpu {
namespace {

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
