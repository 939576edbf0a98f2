// The fp32 forward on CUDA (kernels/cuda/attn_fwd_f32.cu, exact fp32 on the CUDA cores) against the CPU
// oracle by SPEC's rule with an fp32 baseline: the awkward shapes times every score feature, each
// head-dim bucket with d != dv, varlen with empty sequences, paged K/V (kv-cache calls in fp32:
// test_fwd_kvcache.cpp), unaligned rows, outputs poisoned so an unwritten element fails. Runs on a GPU and
// under the kernel emulator (tests/gpu/emu). The fp32 backward: test_bwd_f32.cpp.
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuForwardF32, AwkwardShapesTimesFeatures) {
  FP_SKIP_WITHOUT_GPU();
  size_t n = 0;
  for (const Shape& s : kAwkwardShapes) {
    const Features& f = kFeatures[n++ % std::size(kFeatures)];
    SCOPED_TRACE(f.name);
    expect_forward_accurate(with(dense(DType::f32, s.b, s.sq, s.sk, s.hq, s.hk, s.d_cuda), f));
  }
}

TEST(GpuForwardF32, EveryBucketAndDvUnlikeD) {
  FP_SKIP_WITHOUT_GPU();
  // Buckets 64, 128, 256 (the call takes the smallest holding max(d, dv)); dv != d on each.
  const std::pair<int64_t, int64_t> dims[] = {{8, 8}, {64, 32}, {96, 128}, {200, 256}, {256, 136}};
  int n = 0;
  for (auto [d, dv] : dims) {
    Case c = dense(DType::f32, 2, 45, 70, 4, 2, d, dv);  // GQA 2:1
    c.causal = (n++ % 2) == 0;
    expect_forward_accurate(c);
  }
}

TEST(GpuForwardF32, VarlenPagedAndUnaligned) {
  FP_SKIP_WITHOUT_GPU();
  const VarlenLens& e = kEmptySequences;
  Case v = varlen(dense(DType::f32, 1, 1, 1, 6, 2, 64), e.q, e.k);
  v.used_k = e.used_k;
  expect_forward_accurate(with(v, kCausal));
  expect_forward_accurate(with(varlen(dense(DType::f32, 1, 1, 1, 2, 1, 128), e.q, e.k), kAll));
  expect_forward_accurate(with(paged(dense(DType::f32, 2, 7, 0, 4, 1, 96), 5, {61, 3}), kCausal));
  expect_forward_accurate(paged(dense(DType::f32, 2, 40, 0, 2, 2, 64), 16, {100, 33}));
  Case u = dense(DType::f32, 2, 33, 50, 2, 1, 40);  // rows not 16-byte aligned: scalar K/V loads
  u.pad = 1;
  expect_forward_accurate(with(u, kWindow));
}

}  // namespace
}  // namespace flashport::test::gpu
