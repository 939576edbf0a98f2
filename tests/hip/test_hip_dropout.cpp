// Dropout in the CDNA forward (the kDropout variants) on the CPU wave64 model. Two kinds of checks:
// outputs against the CPU backend's forward with the same seed and offset (the accuracy rule, which
// only holds if the masks agree), and the mask itself read back exactly: with V one-hot (value row j
// is e_j) output channel j of row i is P_ij * M_ij / (1 - p), nonzero iff key j was kept, so every keep
// bit the kernel drew is compared with core/semantics.h's dropout_keep, and the kept fraction and the
// dependence on head and batch are measured on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "hip_model_check.hpp"

namespace flashport::test {
namespace {

using hipmodel::check;

constexpr double kPs[] = {0.17, 0.5};

TEST(HipModelDropout, DenseCausalAndNot) {
  for (double p : kPs) {
    for (bool causal : {false, true}) {
      Case c = dense(DType::bf16, 2, 70, 100, 2, 2, 64, 64);
      c.dropout = p, c.causal = causal;
      check(c);
    }
  }
}

TEST(HipModelDropout, GqaAndBothDtypes) {
  for (double p : kPs) {
    Case c = dense(DType::f16, 1, 33, 75, 4, 1, 128, 128);  // bucket 128: 64-key tiles, 4 Philox calls
    c.dropout = p;
    check(c);
    c.dtype = DType::bf16, c.wl = 20, c.wr = 5;
    check(c);
  }
}

TEST(HipModelDropout, VarlenWithEmptySequences) {
  Case c;
  c.dtype = DType::bf16, c.layout = Layout::varlen, c.hq = 2, c.hk = 1, c.d = c.dv = 64;
  c.q_lens = {0, 70, 1, 33}, c.k_lens = {5, 0, 40, 90};
  for (double p : kPs) {
    c.dropout = p, c.causal = p > 0.3;
    check(c);
  }
}

TEST(HipModelDropout, BucketWithoutVariantIsRefused) {
  Case c = dense(DType::bf16, 1, 8, 8, 1, 1, 96, 96);  // bucket 96: not in kFwdDropoutBuckets
  c.dropout = 0.5;
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  EXPECT_THROW(hipmodel::run_model(c, in), std::runtime_error);
}

/// A case whose inputs make every keep bit visible: dv >= every key count and V one-hot per sequence.
struct MaskRun {
  Case c;
  std::vector<int32_t> q_start, k_start;  // first row of each sequence in q/out and in k/v
  HostTensor out;
};

MaskRun run_mask_case(Case c) {
  MaskRun r{c, {}, {}, {}};
  for (int64_t b = 0, qs = 0, ks = 0; b < c.batch(); ++b) {
    const bool dense_layout = c.layout == Layout::dense;
    r.q_start.push_back((int32_t)(dense_layout ? b * c.q_lens[0] : qs));
    r.k_start.push_back((int32_t)(dense_layout ? b * c.k_lens[0] : ks));
    qs += c.q_lens[(size_t)b], ks += c.k_lens[(size_t)b];
  }
  fastcheck::Inputs in = fastcheck::make_inputs(c);
  EXPECT_GE(c.dv, c.max_k());
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t len_k = c.layout == Layout::dense ? c.k_lens[0] : c.k_lens[(size_t)b];
    for (int64_t j = 0; j < len_k; ++j)
      for (int64_t g = 0; g < c.hk; ++g)
        for (int64_t ch = 0; ch < c.dv; ++ch)
          in.v.set(((r.k_start[(size_t)b] + j) * c.hk + g) * c.dv + ch, ch == j ? 1.0 : 0.0);
  }
  r.out = hipmodel::run_model(c, in).out;
  return r;
}

/// Every (sequence, head, row, key) keep bit the kernel drew against dropout_keep with the harness's
/// seed and offset; returns the bits as [b][h][i][j] flattened, for the statistics below.
std::vector<bool> expect_mask_matches(const MaskRun& r) {
  const Case& c = r.c;
  const AttentionOptions o = fastcheck::options(c, fastcheck::Inputs{});
  const uint32_t threshold = sem::dropout_threshold(c.dropout);
  std::vector<bool> bits;
  int64_t mismatches = 0;
  for (int64_t b = 0; b < c.batch(); ++b) {
    const bool dense_layout = c.layout == Layout::dense;
    const int64_t len_q = dense_layout ? c.q_lens[0] : c.q_lens[(size_t)b];
    const int64_t len_k = dense_layout ? c.k_lens[0] : c.k_lens[(size_t)b];
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < len_q; ++i)
        for (int64_t j = 0; j < len_k; ++j) {
          const double y = r.out.get(((r.q_start[(size_t)b] + i) * c.hq + h) * c.dv + j);
          EXPECT_FALSE(std::isnan(y)) << "unwritten output b=" << b << " h=" << h << " i=" << i;
          const bool kept = y != 0.0;
          const bool want =
              sem::dropout_keep(o.dropout_seed, (uint32_t)o.dropout_offset, threshold, i, j, b, c.hq, h);
          mismatches += kept != want;
          bits.push_back(kept);
        }
  }
  EXPECT_EQ(mismatches, 0) << "keep bits differing from core/semantics.h's dropout_keep";
  return bits;
}

TEST(HipModelDropout, MaskIsTheCpuBackendsBitForBit) {
  for (double p : kPs) {
    SCOPED_TRACE("p " + std::to_string(p));
    Case c = dense(DType::bf16, 2, 40, 128, 2, 1, 128, 128);  // GQA 2:1, two 64-key tiles
    c.dropout = p;
    const std::vector<bool> bits = expect_mask_matches(run_mask_case(c));
    // Kept fraction: 2 * 2 * 40 * 128 = 20480 draws, standard deviation of the fraction <= 0.0035.
    const double kept = (double)std::count(bits.begin(), bits.end(), true) / (double)bits.size();
    EXPECT_NEAR(kept, 1.0 - p, 0.02);
    // Layout [b][h][i][j]: the masks of head 1 and of batch 1 differ from batch 0 head 0's (a kernel
    // that left h or b out of the counter would repeat them).
    const size_t plane = 40 * 128;
    int64_t head_diff = 0, batch_diff = 0;
    for (size_t e = 0; e < plane; ++e) {
      head_diff += bits[e] != bits[plane + e];
      batch_diff += bits[e] != bits[2 * plane + e];
    }
    const double expect_diff = 2.0 * p * (1.0 - p) * (double)plane;  // two independent draws disagree
    EXPECT_GT((double)head_diff, 0.8 * expect_diff) << "heads share a mask";
    EXPECT_GT((double)batch_diff, 0.8 * expect_diff) << "batch entries share a mask";
  }
}

TEST(HipModelDropout, VarlenMaskUsesPositionsWithinTheSequence) {
  Case c;
  c.dtype = DType::f16, c.layout = Layout::varlen, c.hq = 3, c.hk = 3, c.d = c.dv = 64;
  c.q_lens = {0, 23, 17}, c.k_lens = {9, 64, 33}, c.dropout = 0.17;
  expect_mask_matches(run_mask_case(c));
}

}  // namespace
}  // namespace flashport::test
