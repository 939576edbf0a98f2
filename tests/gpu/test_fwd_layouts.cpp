// CUDA forward with varlen (empty sequences, seqused_k) and paged K/V (page sizes 1, 16, 256) vs
// the CPU oracle.
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

/// A narrower two-sided window than common/cases.hpp's kWindow.
constexpr Features kShortWindow{"window", false, 30, 3, 0.0, 0, 0.0};

TEST(GpuForwardVarlen, EmptySequencesAndSequsedK) {
  FP_SKIP_WITHOUT_GPU();
  Case c = varlen(dense(DType::bf16, 1, 1, 1, 7, 1, 64), kEmptySequences.q, kEmptySequences.k);
  for (DType dt : {DType::bf16, DType::f16}) {
    c.dtype = dt;
    c.used_k.clear();
    expect_forward_accurate(c);
    expect_forward_accurate(with(c, kCausal));
    c.used_k = kEmptySequences.used_k;
    expect_forward_accurate(with(c, kAll));
  }
}

TEST(GpuForwardVarlen, GqaAndHeadDims) {
  FP_SKIP_WITHOUT_GPU();
  Case c;
  c.layout = Layout::varlen;
  c.q_lens = {17, 1, 200};
  c.k_lens = {300, 9, 150};
  for (auto [hq, hk, d] : {std::tuple{4, 4, 40}, {8, 2, 128}, {7, 1, 96}}) {
    c.hq = hq, c.hk = hk, c.d = d, c.dv = d;
    expect_forward_accurate(with(c, kShortWindow));
  }
}

TEST(GpuForwardPaged, PageSizes) {
  FP_SKIP_WITHOUT_GPU();
  for (int64_t page : {1, 16, 256}) {
    Case c = dense(DType::bf16, 3, 37, 0, 8, 2, 64);
    c.layout = Layout::paged;
    c.page = page;
    c.k_lens = {300, 1, 77};
    c.used_k = c.k_lens;
    SCOPED_TRACE("page " + std::to_string(page));
    expect_forward_accurate(c);
    expect_forward_accurate(with(c, kCausal));
    c.dtype = DType::f16;
    expect_forward_accurate(with(c, kAll));
  }
}

TEST(GpuForwardPaged, DecodeWithSplits) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::bf16, 2, 1, 0, 8, 1, 128);
  c.layout = Layout::paged;
  c.page = 16;
  c.k_lens = {2000, 333};
  c.used_k = c.k_lens;
  expect_forward_accurate(c);
  expect_forward_accurate(with(c, kCausal));
}

}  // namespace
}  // namespace flashport::test::gpu
