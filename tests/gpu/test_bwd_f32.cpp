// The fp32 backward on CUDA (kernels/cuda/attn_bwd_f32.cu with attn_bwd_aux.cu's fp32 D and dQ steps)
// against the CPU oracle by SPEC's rule with an fp32 baseline: the awkward shapes times every score
// feature (dropout's masks must match the CPU's Philox stream), each head-dim bucket with d != dv,
// several key and query blocks per sequence with causal and band skipping, varlen with empty sequences
// and seqused_k, unaligned rows, deterministic mode bitwise over runs; gradients poisoned so every
// element must be written. Runs on a GPU and under the kernel emulator (tests/gpu/emu).
#include "gpu/f32_cases.hpp"
#include "gpu/test_bwd_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuBackwardF32, AwkwardShapesTimesFeatures) {
  FP_SKIP_WITHOUT_GPU();
  for (const Case& c : f32_awkward_cases()) expect_backward_accurate(c);
}

TEST(GpuBackwardF32, EveryBucketAndDvUnlikeD) {
  FP_SKIP_WITHOUT_GPU();
  for (const Case& c : f32_bucket_cases()) expect_backward_accurate(c);
}

TEST(GpuBackwardF32, ManyBlocksFullyMaskedRowsAndBands) {
  FP_SKIP_WITHOUT_GPU();
  expect_backward_accurate(with(dense(DType::f32, 1, 150, 150, 2, 1, 64), kCausal));
  Case band = dense(DType::f32, 1, 140, 140, 7, 1, 128);  // GQA 7:1, whole block pairs outside the band
  band.wl = 10, band.wr = 3;
  expect_backward_accurate(band);
  // sq > sk, causal: the first sq - sk rows see no key (LSE -inf): dq = 0 there, not NaN.
  const Case c = with(dense(DType::f32, 1, 90, 30, 2, 1, 64), kCausal);
  const BwdInputs in = make_bwd_inputs(c);
  const Grads gpu = expect_backward_accurate_on(c, in);
  for (int64_t i = 0; i < 90 - 30; ++i)
    for (int64_t ch = 0; ch < 2 * 64; ++ch) ASSERT_EQ(gpu.dq.get(i * 2 * 64 + ch), 0.0) << "row " << i;
}

TEST(GpuBackwardF32, VarlenUsedKAndUnaligned) {
  FP_SKIP_WITHOUT_GPU();
  for (const Case& c : f32_varlen_unaligned_cases()) expect_backward_accurate(c);
}

TEST(GpuBackwardF32, DeterministicIsBitwiseRepeatable) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::f32, 1, 97, 160, 4, 2, 64);  // several key blocks, so several dQ slices
  c.causal = true, c.dropout = 0.1;
  expect_deterministic(c);
  Case v = varlen(dense(DType::f32, 1, 1, 1, 2, 2, 128), {0, 70, 9}, {3, 70, 0});
  v.softcap = 4.0, v.q_stddev = 3.0;
  expect_deterministic(v);
}

}  // namespace
}  // namespace flashport::test::gpu
