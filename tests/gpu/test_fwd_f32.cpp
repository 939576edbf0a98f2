// The fp32 forward on CUDA (kernels/cuda/attn_fwd_f32.cu, exact fp32 on the CUDA cores) against the CPU
// oracle by SPEC's rule with an fp32 baseline: the awkward shapes times every score feature, each
// head-dim bucket with d != dv, varlen with empty sequences, paged K/V (kv-cache calls in fp32:
// test_fwd_kvcache.cpp), unaligned rows, outputs poisoned so an unwritten element fails. Runs on a GPU and
// under the kernel emulator (tests/gpu/emu). The fp32 backward: test_bwd_f32.cpp.
#include "gpu/f32_cases.hpp"
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuForwardF32, AwkwardShapesTimesFeatures) {
  FP_SKIP_WITHOUT_GPU();
  for (const Case& c : f32_awkward_cases()) expect_forward_accurate(c);
}

TEST(GpuForwardF32, EveryBucketAndDvUnlikeD) {
  FP_SKIP_WITHOUT_GPU();
  for (const Case& c : f32_bucket_cases()) expect_forward_accurate(c);
}

TEST(GpuForwardF32, VarlenPagedAndUnaligned) {
  FP_SKIP_WITHOUT_GPU();
  for (const Case& c : f32_varlen_unaligned_cases()) expect_forward_accurate(c);
  expect_forward_accurate(with(paged(dense(DType::f32, 2, 7, 0, 4, 1, 96), 5, {61, 3}), kCausal));
  expect_forward_accurate(paged(dense(DType::f32, 2, 40, 0, 2, 2, 64), 16, {100, 33}));
}

}  // namespace
}  // namespace flashport::test::gpu
