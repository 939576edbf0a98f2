// CUDA backward vs the CPU oracle (3x a naive same-precision baseline's error, SPEC): awkward shapes,
// every head-dim bucket, GQA 1/4/7, dv != d, every score feature, varlen with empty sequences,
// seqused_k, unaligned strides (scalar path), fp16 and bf16; gradients poisoned so every element
// must be written.
#include "gpu/test_bwd_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuBackward, ShapesTimesFeatures) {
  FP_SKIP_WITHOUT_GPU();
  int n = 0;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const Features& f : kFeatures) {
      const Shape& s = kAwkwardShapes[(size_t)(n++ % std::size(kAwkwardShapes))];
      SCOPED_TRACE(f.name);
      expect_backward_accurate(with(dense(dt, s.b, s.sq, s.sk, s.hq, s.hk, s.d_cuda), f));
    }
  }
}

TEST(GpuBackward, HeadDimBuckets) {
  FP_SKIP_WITHOUT_GPU();
  for (int64_t d : {32, 40, 64, 96, 128, 160, 192, 224, 256}) {
    const DType dt = d % 64 == 0 ? DType::bf16 : DType::f16;
    expect_backward_accurate(dense(dt, 1, 97, 131, 2, 1, d));
    expect_backward_accurate(with(dense(dt, 1, 131, 97, 2, 2, d), kCausal));
  }
}

TEST(GpuBackward, ValueHeadDimDiffers) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::bf16, 1, 70, 90, 4, 2, 64);
  c.dv = 40;
  expect_backward_accurate(c);
  c = dense(DType::f16, 1, 90, 70, 2, 1, 40);
  c.dv = 128;
  expect_backward_accurate(with(c, kCausal));
}

TEST(GpuBackward, ManyKeyAndQueryBlocks) {
  FP_SKIP_WITHOUT_GPU();
  // Several key blocks per sequence and query blocks per key block, causal block skipping, and a
  // band that leaves whole (query block, key block) pairs out.
  expect_backward_accurate(with(dense(DType::bf16, 1, 300, 300, 2, 1, 64), kCausal));
  expect_backward_accurate(with(dense(DType::f16, 2, 260, 333, 4, 2, 128), kWindow));
  Case band = dense(DType::bf16, 1, 320, 320, 7, 1, 64);
  band.wl = 10, band.wr = 3;
  expect_backward_accurate(band);
}

TEST(GpuBackward, FullyMaskedRowsGiveZeroGradients) {
  FP_SKIP_WITHOUT_GPU();
  // sq > sk with a causal mask: the first sq - sk rows see no key (LSE -inf): dq = 0 there.
  const Case c = with(dense(DType::bf16, 1, 150, 40, 2, 1, 64), kCausal);
  expect_backward_accurate(c);
  const BwdInputs in = make_bwd_inputs(c);
  const Grads gpu = run_gpu_backward(c, in);
  for (int64_t i = 0; i < 150 - 40; ++i)
    for (int64_t ch = 0; ch < 2 * 64; ++ch) ASSERT_EQ(gpu.dq.get(i * 2 * 64 + ch), 0.0) << "row " << i;
  // Keys no query sees (window) get dK = dV = 0.
  Case w = dense(DType::f16, 1, 40, 300, 1, 1, 64);
  w.wl = 0, w.wr = 0;  // query i sees only key i + 260
  expect_backward_accurate(w);
}

TEST(GpuBackward, VarlenWithEmptySequences) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::bf16, 1, 1, 1, 8, 2, 64);
  c.layout = Layout::varlen;
  c.q_lens = {0, 37, 129, 1, 0, 64, 200};
  c.k_lens = {5, 0, 211, 64, 0, 64, 150};
  expect_backward_accurate(c);
  expect_backward_accurate(with(c, kCausal));
  c.dtype = DType::f16, c.hq = 7, c.hk = 1, c.d = c.dv = 40;
  expect_backward_accurate(with(c, kAll));
}

TEST(GpuBackward, SequsedK) {
  FP_SKIP_WITHOUT_GPU();
  // Keys past seqused_k are not attended and get zero gradients.
  Case c = dense(DType::bf16, 2, 50, 120, 4, 2, 64);
  c.used_k = {77, 0};
  expect_backward_accurate(c);
  Case v = dense(DType::f16, 1, 1, 1, 2, 1, 64);
  v.layout = Layout::varlen;
  v.q_lens = {30, 90}, v.k_lens = {100, 60}, v.used_k = {64, 60};
  expect_backward_accurate(with(v, kCausal));
}

TEST(GpuBackward, UnalignedStridesUseTheScalarPath) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::bf16, 2, 70, 150, 4, 2, 64);
  c.pad = 4;  // row stride 68 elements: not 16-byte aligned
  expect_backward_accurate(c);
  expect_backward_accurate(with(c, kAll));
}

}  // namespace
}  // namespace flashport::test::gpu
