// CUDA forward on dense inputs vs the CPU oracle: awkward shapes, every head-dim bucket class, GQA,
// every score feature (causal, window, softcap, ALiBi, dropout), fp16 and bf16, unaligned strides.
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuForward, ShapesTimesFeatures) {
  FP_SKIP_WITHOUT_GPU();
  int n = 0;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const Features& f : kFeatures) {
      const Shape& s = kAwkwardShapes[(size_t)(n++ % std::size(kAwkwardShapes))];
      SCOPED_TRACE(f.name);
      expect_forward_accurate(with(dense(dt, s.b, s.sq, s.sk, s.hq, s.hk, s.d_cuda), f));
    }
  }
}

TEST(GpuForward, HeadDims) {
  FP_SKIP_WITHOUT_GPU();
  for (int64_t d : {32, 40, 64, 96, 128, 160, 256}) {
    const DType dt = d % 64 == 0 ? DType::bf16 : DType::f16;
    expect_forward_accurate(dense(dt, 1, 97, 131, 2, 1, d));
    expect_forward_accurate(with(dense(dt, 1, 131, 97, 2, 2, d), kCausal));
  }
}

TEST(GpuForward, ValueHeadDimDiffers) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::bf16, 1, 70, 90, 4, 2, 64);
  c.dv = 40;
  expect_forward_accurate(c);
  c = dense(DType::f16, 1, 90, 70, 2, 1, 40);
  c.dv = 128;
  expect_forward_accurate(with(c, kCausal));
}

TEST(GpuForward, FullyMaskedRowsAreZeroWithNegInfLse) {
  FP_SKIP_WITHOUT_GPU();
  // sq > sk with a causal mask: the first sq - sk rows see no key.
  Case c = with(dense(DType::bf16, 1, 150, 40, 2, 1, 64), kCausal);
  const FwdInputs in = make_inputs(c);
  const GpuResult gpu = run_gpu(c, in);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 150 - 40; ++i) {
      EXPECT_EQ(gpu.lse.get(h * 150 + i), -INFINITY) << "row " << i;
      for (int64_t ch = 0; ch < 64; ++ch) ASSERT_EQ(gpu.out.get((i * 2 + h) * 64 + ch), 0.0) << "row " << i;
    }
  }
  expect_forward_accurate(c);
  // A window that leaves whole query blocks without keys.
  Case w = dense(DType::f16, 1, 300, 300, 1, 1, 64);
  w.wl = 0, w.wr = -1;  // key j visible iff j >= i: the last rows see only themselves
  expect_forward_accurate(w);
  w.wl = -1, w.wr = 0, w.k_lens = {20};  // sk < sq, causal-like: most rows empty
  expect_forward_accurate(w);
}

TEST(GpuForward, DropoutMatchesCpuMask) {
  FP_SKIP_WITHOUT_GPU();
  // Same seed -> identical Philox mask: a different mask would miss the rule by far at p = 0.5.
  for (double p : {0.5, 0.9}) {
    Case c = dense(DType::bf16, 2, 67, 129, 3, 1, 64);
    c.dropout = p;
    expect_forward_accurate(c);
    expect_forward_accurate(with(c, kCausal));
  }
}

TEST(GpuForward, UnalignedStridesUseTheScalarPath) {
  FP_SKIP_WITHOUT_GPU();
  for (int64_t pad : {1, 3, 8}) {
    Case c = dense(DType::bf16, 2, 45, 77, 4, 2, 64);
    c.pad = pad;
    expect_forward_accurate(c);
    expect_forward_accurate(with(c, kAll));
  }
}

TEST(GpuForward, DecodeShapesUseSplitKv) {
  FP_SKIP_WITHOUT_GPU();
  // Few CTAs and many key tiles: the heuristic splits the key range (fp32 partials + combine).
  for (int64_t sk : {1, 63, 1000, 4097}) {
    expect_forward_accurate(dense(DType::bf16, 1, 1, sk, 8, 1, 128));
    expect_forward_accurate(with(dense(DType::f16, 2, 3, sk, 4, 2, 64), kAlibi));
  }
  expect_forward_accurate(with(dense(DType::bf16, 1, 2, 3000, 2, 2, 64), kDropout));  // dropout
  // Grids of at least two CTAs per SM (an H100/H200's 132 SMs) take the two-CTA shape (FLASHPORT_DECODE 6).
  expect_forward_accurate(dense(DType::bf16, 300, 1, 203, 4, 1, 128));
  expect_forward_accurate(with(dense(DType::f16, 150, 2, 77, 8, 2, 64), kCausal));
}

}  // namespace
}  // namespace flashport::test::gpu
