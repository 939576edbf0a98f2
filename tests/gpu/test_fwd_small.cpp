// A quick cross-section of the forward-side CUDA paths on tiny shapes, for compute-sanitizer
// (scripts/gpu_suite.sh runs memcheck and racecheck on tests matching *Small*).
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuForwardSmall, DenseMasksAndFeatures) {
  FP_SKIP_WITHOUT_GPU();
  FwdCase c = dense(DType::bf16, 1, 70, 90, 2, 1, 64);
  expect_forward_accurate(c);
  c.causal = true, c.softcap = 4.0, c.alibi = 1, c.dropout = 0.2;
  expect_forward_accurate(c);
  FwdCase f = dense(DType::f16, 1, 33, 17, 1, 1, 40);  // sq > sk: empty rows; d padded to 64
  f.causal = true, f.pad = 3;                          // unaligned rows: scalar loads and stores
  expect_forward_accurate(f);
}

TEST(GpuForwardSmall, VarlenAndPaged) {
  FP_SKIP_WITHOUT_GPU();
  FwdCase v;
  v.layout = Layout::varlen;
  v.hq = 2, v.hk = 1, v.d = 128, v.dv = 128;
  v.q_lens = {0, 20, 1};
  v.k_lens = {3, 50, 0};
  expect_forward_accurate(v);
  FwdCase p = dense(DType::bf16, 2, 5, 0, 4, 2, 64);
  p.layout = Layout::paged;
  p.page = 1;
  p.k_lens = {19, 3};
  p.used_k = p.k_lens;
  expect_forward_accurate(p);
}

TEST(GpuForwardSmall, SplitKv) {
  FP_SKIP_WITHOUT_GPU();
  expect_forward_accurate(dense(DType::bf16, 1, 1, 300, 2, 1, 64));  // heuristic: several splits
}

}  // namespace
}  // namespace flashport::test::gpu
