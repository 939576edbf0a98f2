// The fp32 case lists the forward and backward fp32 suites share (test_fwd_f32.cpp, test_bwd_f32.cpp):
// one list each, so both kernels face the same shapes and features.
#pragma once

#include <iterator>
#include <utility>
#include <vector>

#include "common/cases.hpp"

namespace flashport::test::gpu {

/// The awkward shapes, each with the next score feature in turn (CUDA head dims).
inline std::vector<Case> f32_awkward_cases() {
  std::vector<Case> cs;
  size_t n = 0;
  for (const Shape& s : kAwkwardShapes)
    cs.push_back(with(dense(DType::f32, s.b, s.sq, s.sk, s.hq, s.hk, s.d_cuda),
                      kFeatures[n++ % std::size(kFeatures)]));
  return cs;
}

/// Buckets 64, 128, 256 (a call takes the smallest holding max(d, dv)), dv != d on each, GQA 2:1,
/// causal on every other case.
inline std::vector<Case> f32_bucket_cases() {
  std::vector<Case> cs;
  const std::pair<int64_t, int64_t> dims[] = {{8, 8}, {64, 32}, {96, 128}, {200, 256}, {256, 136}};
  for (auto [d, dv] : dims) {
    Case c = dense(DType::f32, 2, 45, 70, 4, 2, d, dv);
    c.causal = cs.size() % 2 == 0;
    cs.push_back(c);
  }
  return cs;
}

/// Varlen with empty sequences (with and without seqused_k, every feature on the second) and rows that
/// are not 16-byte aligned (the scalar load and store paths), windowed.
inline std::vector<Case> f32_varlen_unaligned_cases() {
  const VarlenLens& e = kEmptySequences;
  Case v = varlen(dense(DType::f32, 1, 1, 1, 6, 2, 64), e.q, e.k);
  v.used_k = e.used_k;
  Case u = dense(DType::f32, 2, 33, 50, 2, 1, 40);
  u.pad = 1;
  return {with(v, kCausal), with(varlen(dense(DType::f32, 1, 1, 1, 2, 1, 128), e.q, e.k), kAll),
          with(u, kWindow)};
}

}  // namespace flashport::test::gpu
