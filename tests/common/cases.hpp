// Attention problems shared by the C++ suites: one problem description (`Case`) that the CPU fast-path
// tests (tests/cpu) and the CUDA tests (tests/gpu) both take, the score features (masks and score
// transforms) and the awkward shapes every backend must get right, and the index tensors built from a
// case. Each harness turns a Case into its own inputs (host tensors, or padded device operands).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.hpp"

namespace flashport::test {

enum class Layout { dense, varlen, paged };

/// One forward/backward problem. Dense and paged layouts use q_lens[0] (dense also k_lens[0]) for every
/// sequence; varlen has one entry per sequence; paged has one k_lens entry per sequence.
struct Case {
  DType dtype = DType::bf16;
  Layout layout = Layout::dense;
  int64_t hq = 1, hk = 1, d = 64, dv = 64;
  std::vector<int64_t> q_lens{1}, k_lens{1};
  std::vector<int64_t> used_k;  // seqused_k; empty: absent
  int64_t page = 16;            // paged only
  int64_t pad = 0;              // dense, CUDA harness only: spare channels after each operand row
  bool causal = false;
  int64_t wl = -1, wr = -1;
  double softcap = 0.0;
  int alibi = 0;  // 0 off, 1 slopes (hq,), 2 slopes (b, hq)
  double dropout = 0.0;
  double q_stddev = 1.0;  // larger values make softcap bite

  int64_t batch() const { return (int64_t)q_lens.size(); }
  int64_t max_q() const { return *std::max_element(q_lens.begin(), q_lens.end()); }
  int64_t max_k() const { return *std::max_element(k_lens.begin(), k_lens.end()); }
  int64_t total_q() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t{0}); }
  int64_t total_k() const { return std::accumulate(k_lens.begin(), k_lens.end(), int64_t{0}); }
  std::string describe() const {
    std::ostringstream s;
    s << dtype_name(dtype)
      << (layout == Layout::dense    ? " dense"
          : layout == Layout::varlen ? " varlen"
                                     : " paged")
      << " q_lens=(";
    for (int64_t n : q_lens) s << n << ",";
    s << ") k_lens=(";
    for (int64_t n : k_lens) s << n << ",";
    s << ")";
    if (!used_k.empty()) {
      s << " used_k=(";
      for (int64_t n : used_k) s << n << ",";
      s << ")";
    }
    if (layout == Layout::paged) s << " page=" << page;
    s << " hq=" << hq << " hk=" << hk << " d=" << d << " dv=" << dv << " pad=" << pad << " causal=" << causal
      << " window=(" << wl << "," << wr << ") softcap=" << softcap << " alibi=" << alibi
      << " dropout=" << dropout;
    return s.str();
  }
};

/// A dense case (b, sq, sk) with everything else default; dv < 0 means dv = d.
inline Case dense(DType dtype, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d,
                  int64_t dv = -1) {
  Case c;
  c.dtype = dtype;
  c.q_lens.assign((size_t)b, sq);
  c.k_lens.assign((size_t)b, sk);
  c.hq = hq, c.hk = hk, c.d = d, c.dv = dv < 0 ? d : dv;
  return c;
}

/// `c` as a varlen batch with these per-sequence lengths.
inline Case varlen(Case c, std::vector<int64_t> q_lens, std::vector<int64_t> k_lens) {
  c.layout = Layout::varlen;
  c.q_lens = std::move(q_lens);
  c.k_lens = std::move(k_lens);
  return c;
}

/// `c` over a paged cache of `page`-token pages holding `k_lens` keys per sequence, all of them used
/// (seqused_k = k_lens); the queries stay as `c` has them.
inline Case paged(Case c, int64_t page, std::vector<int64_t> k_lens) {
  c.layout = Layout::paged;
  c.page = page;
  c.k_lens = std::move(k_lens);
  c.used_k = c.k_lens;
  return c;
}

// --- score features ---------------------------------------------------------------------------------

/// Masks and score transforms applied to a case by with().
struct Features {
  const char* name;
  bool causal;
  int64_t wl, wr;
  double softcap;
  int alibi;
  double dropout;
};
inline constexpr Features kPlain{"plain", false, -1, -1, 0.0, 0, 0.0};
inline constexpr Features kCausal{"causal", true, -1, -1, 0.0, 0, 0.0};
inline constexpr Features kWindow{"window", false, 37, 5, 0.0, 0, 0.0};
inline constexpr Features kLeftWindow{"left-window", true, 20, -1, 0.0, 0, 0.0};
inline constexpr Features kSoftcap{"softcap", false, -1, -1, 3.0, 0, 0.0};
inline constexpr Features kAlibi{"alibi", true, -1, -1, 0.0, 1, 0.0};
inline constexpr Features kAlibiPerBatch{"alibi-b", false, 50, 50, 0.0, 2, 0.0};
inline constexpr Features kDropout{"dropout", false, -1, -1, 0.0, 0, 0.17};
inline constexpr Features kAll{"all", true, 70, -1, 5.0, 2, 0.1};  // every feature at once
/// Every feature set above, in the order the shape-times-features tests walk them.
inline constexpr Features kFeatures[] = {kPlain, kCausal,        kWindow,  kLeftWindow, kSoftcap,
                                         kAlibi, kAlibiPerBatch, kDropout, kAll};

/// Sliding windows only: two-sided, causal with a left window, left-only (the lowest key tiles see no
/// query tile: skipped) and right-only.
inline constexpr Features kWindowLeftOnly{"window-left-only", false, 64, -1, 0.0, 0, 0.0};
inline constexpr Features kWindowRightOnly{"window-right-only", false, -1, 0, 0.0, 0, 0.0};
inline constexpr Features kWindowMasks[] = {kWindow, kLeftWindow, kWindowLeftOnly, kWindowRightOnly};

inline Case with(Case c, const Features& f) {
  c.causal = f.causal, c.wl = f.wl, c.wr = f.wr, c.softcap = f.softcap, c.alibi = f.alibi,
  c.dropout = f.dropout;
  if (f.softcap > 0) c.q_stddev = 3.0;  // push scores into tanh's curved range
  return c;
}

// --- awkward shapes ---------------------------------------------------------------------------------

/// A dense shape. `d` is any head dim (the CPU takes [1, 256]); `d_cuda` is the head dim the CUDA tests
/// use for it (the kernels take multiples of 8; the Python layer pads the others).
struct Shape {
  int64_t b, sq, sk, hq, hk, d, d_cuda;
};
/// Seqlen 1, 113 x 203, sq > sk, a single query over many keys, heads 1:1, 4:1 and 7:1, head dims
/// 40, 59, 64, 128 (CUDA: 40, 64, 96, 128). The shape-times-features tests pair them round-robin with
/// kFeatures.
inline constexpr Shape kAwkwardShapes[] = {
    {2, 1, 1, 1, 1, 40, 40},       // seqlen 1
    {1, 113, 203, 7, 1, 59, 64},   // 113 x 203, GQA 7:1, head dim 59
    {1, 203, 113, 4, 1, 64, 64},   // sq > sk
    {2, 64, 64, 2, 2, 128, 128},   // 64 x 64, batch 2
    {1, 1, 203, 4, 4, 64, 64},     // one query, many keys
    {1, 130, 257, 8, 2, 40, 40},   // GQA 4:1, ragged tiles
    {2, 77, 77, 7, 7, 59, 96},     // 7 heads, ragged square
    {1, 150, 65, 1, 1, 128, 128},  // sq > sk
    {1, 200, 200, 4, 1, 64, 64},   // MQA 4:1, square
};

/// Varlen lengths with empty sequences: no queries but keys, neither, queries but no keys, 113 x 203;
/// `used_k` (seqused_k) cuts some key sequences short and empties one.
struct VarlenLens {
  std::vector<int64_t> q, k, used_k;
};
inline const VarlenLens kEmptySequences{
    {0, 113, 1, 64, 0, 90}, {5, 203, 0, 64, 0, 120}, {3, 150, 0, 64, 0, 17}};

// --- what a harness builds from a case --------------------------------------------------------------

/// Output (same layout as q with dv channels) and LSE shapes of a case.
inline std::vector<int64_t> out_shape(const Case& c) {
  if (c.layout == Layout::varlen) return {c.total_q(), c.hq, c.dv};
  return {c.batch(), c.q_lens[0], c.hq, c.dv};
}
inline std::vector<int64_t> lse_shape(const Case& c) {
  if (c.layout == Layout::varlen) return {c.hq, c.total_q()};
  return {c.batch(), c.hq, c.q_lens[0]};
}

/// cu_seqlens of `lens`: 0, then the running sums (int32).
inline HostTensor cumsum_i32(const std::vector<int64_t>& lens) {
  std::vector<int32_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + (int32_t)n);
  return int_tensor(cu);
}

/// Paged K/V geometry: pages per sequence and pool size (spare blocks nobody reads).
inline int64_t pages_per_sequence(const Case& c) {
  return std::max<int64_t>(1, (c.max_k() + c.page - 1) / c.page);
}
inline int64_t page_pool_blocks(const Case& c) {
  return c.batch() * pages_per_sequence(c) + 3;
}

/// A (b, pages_per_sequence) block table of distinct block ids drawn in random order from the pool.
inline HostTensor shuffled_block_table(const Case& c) {
  const int64_t b = c.batch(), per_seq = pages_per_sequence(c), blocks = page_pool_blocks(c);
  std::vector<int32_t> ids((size_t)blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  HostTensor table(DType::i32, {b, per_seq});
  std::copy(ids.begin(), ids.begin() + b * per_seq, table.i32());
  return table;
}

/// seqused_k of a case as an int32 tensor (empty when the case has none).
inline HostTensor used_k_tensor(const Case& c) {
  if (c.used_k.empty()) return {};
  return int_tensor(std::vector<int32_t>(c.used_k.begin(), c.used_k.end()));
}

/// Positive ALiBi slopes, (hq) or (b, hq) as the case asks; empty when it has none.
inline HostTensor alibi_slopes(const Case& c) {
  if (!c.alibi) return {};
  HostTensor t = c.alibi == 1 ? HostTensor(DType::f32, {c.hq}) : HostTensor(DType::f32, {c.batch(), c.hq});
  std::uniform_real_distribution<double> ud(0.02, 0.5);
  for (int64_t n = 0; n < t.numel(); ++n) t.set(n, ud(rng()));
  return t;
}

}  // namespace flashport::test
