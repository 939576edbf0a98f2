// Helpers of the CPU fast-path tests: a problem description covering dense, varlen and paged layouts,
// fresh random inputs, and forward/backward calls through the public API with poisoned outputs.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.hpp"

namespace flashport::test::fastcheck {

enum class Layout { dense, varlen, paged };

/// One attention problem. Dense layouts use q_lens[0] / k_lens[0] for every sequence.
struct Case {
  DType dtype = DType::f32;
  Layout layout = Layout::dense;
  int64_t hq = 1, hk = 1, d = 64, dv = 64;
  std::vector<int64_t> q_lens{1}, k_lens{1};  // one entry per sequence
  std::vector<int64_t> used_k;                // seqused_k; empty: absent
  int64_t page = 16;                          // paged only
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
    s << " hq=" << hq << " hk=" << hk << " d=" << d << " dv=" << dv << " causal=" << causal << " window=("
      << wl << "," << wr << ") softcap=" << softcap << " alibi=" << alibi << " dropout=" << dropout;
    return s.str();
  }
};

/// A dense case (b, sq, sk) with everything else default.
inline Case dense(DType dtype, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d,
                  int64_t dv) {
  Case c;
  c.dtype = dtype;
  c.q_lens.assign((size_t)b, sq);
  c.k_lens.assign((size_t)b, sk);
  c.hq = hq, c.hk = hk, c.d = d, c.dv = dv;
  return c;
}

/// The tensors of a case. Paged: k/v are (num_blocks, page, hk, d) caches reached through a shuffled
/// block table, q stays dense (b, max_q, hq, d).
struct Inputs {
  HostTensor q, k, v, alibi, cu_q, cu_k, used_k, block_table;
};

inline HostTensor cumsum_i32(const std::vector<int64_t>& lens) {
  std::vector<int32_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + (int32_t)n);
  return int_tensor(cu);
}

inline Inputs make_inputs(const Case& c) {
  Inputs in;
  const int64_t b = c.batch();
  switch (c.layout) {
    case Layout::dense:
      in.q = randn(c.dtype, {b, c.q_lens[0], c.hq, c.d}, c.q_stddev);
      in.k = randn(c.dtype, {b, c.k_lens[0], c.hk, c.d});
      in.v = randn(c.dtype, {b, c.k_lens[0], c.hk, c.dv});
      break;
    case Layout::varlen:
      in.q = randn(c.dtype, {c.total_q(), c.hq, c.d}, c.q_stddev);
      in.k = randn(c.dtype, {c.total_k(), c.hk, c.d});
      in.v = randn(c.dtype, {c.total_k(), c.hk, c.dv});
      in.cu_q = cumsum_i32(c.q_lens);
      in.cu_k = cumsum_i32(c.k_lens);
      break;
    case Layout::paged: {
      const int64_t per_seq = std::max<int64_t>(1, (c.max_k() + c.page - 1) / c.page);
      const int64_t blocks = b * per_seq + 3;  // spare blocks nobody reads
      in.q = randn(c.dtype, {b, c.q_lens[0], c.hq, c.d}, c.q_stddev);
      in.k = randn(c.dtype, {blocks, c.page, c.hk, c.d});
      in.v = randn(c.dtype, {blocks, c.page, c.hk, c.dv});
      std::vector<int32_t> ids((size_t)blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng());
      in.block_table = HostTensor(DType::i32, {b, per_seq});
      std::copy(ids.begin(), ids.begin() + b * per_seq, in.block_table.i32());
      break;
    }
  }
  if (!c.used_k.empty()) {
    std::vector<int32_t> u(c.used_k.begin(), c.used_k.end());
    in.used_k = int_tensor(u);
  }
  if (c.alibi) {
    in.alibi = c.alibi == 1 ? HostTensor(DType::f32, {c.hq}) : HostTensor(DType::f32, {b, c.hq});
    std::uniform_real_distribution<double> ud(0.02, 0.5);
    for (int64_t n = 0; n < in.alibi.numel(); ++n) in.alibi.set(n, ud(rng()));
  }
  return in;
}

inline AttentionOptions options(const Case& c, const Inputs& in) {
  AttentionOptions o;
  o.causal = c.causal;
  o.window_left = c.wl;
  o.window_right = c.wr;
  o.softcap = c.softcap;
  if (c.alibi) o.alibi_slopes = in.alibi.view();
  o.dropout_p = c.dropout;
  o.dropout_seed = 0x1234567887654321ULL;
  o.dropout_offset = 7;
  return o;
}

inline SequenceLayout layout(const Case& c, const Inputs& in) {
  SequenceLayout l;
  if (c.layout == Layout::varlen) {
    l.cu_seqlens_q = in.cu_q.view();
    l.cu_seqlens_k = in.cu_k.view();
    l.max_seqlen_q = c.max_q();
    l.max_seqlen_k = c.max_k();
  }
  if (c.layout == Layout::paged) l.block_table = in.block_table.view();
  if (!c.used_k.empty()) l.seqused_k = in.used_k.view();
  return l;
}

/// Output (same layout as q with dv channels) and LSE shapes of a case.
inline std::vector<int64_t> out_shape(const Case& c) {
  if (c.layout == Layout::varlen) return {c.total_q(), c.hq, c.dv};
  return {c.batch(), c.q_lens[0], c.hq, c.dv};
}
inline std::vector<int64_t> lse_shape(const Case& c) {
  if (c.layout == Layout::varlen) return {c.hq, c.total_q()};
  return {c.batch(), c.hq, c.q_lens[0]};
}

struct Forward {
  HostTensor out, lse;
};

inline Forward run_forward(const Case& c, const Inputs& in, Impl impl) {
  Forward f{HostTensor(c.dtype, out_shape(c)), HostTensor(DType::f32, lse_shape(c))};
  poison(f.out);
  poison(f.lse);
  ForwardArgs a;
  a.q = in.q, a.k = in.k, a.v = in.v, a.out = f.out;
  a.lse = f.lse.view();
  a.options = options(c, in);
  a.layout = layout(c, in);
  a.impl = impl;
  forward(a);
  return f;
}

struct Grads {
  HostTensor dq, dk, dv;
};

/// Backward of `fwd` (out and LSE of one forward) with upstream gradient `dout`.
inline Grads run_backward(const Case& c, const Inputs& in, const Forward& fwd, const HostTensor& dout,
                          Impl impl, bool deterministic = false) {
  Grads g{HostTensor(in.q.tv.dtype,
                     std::vector<int64_t>(in.q.tv.shape.begin(), in.q.tv.shape.begin() + in.q.tv.ndim)),
          HostTensor(in.k.tv.dtype,
                     std::vector<int64_t>(in.k.tv.shape.begin(), in.k.tv.shape.begin() + in.k.tv.ndim)),
          HostTensor(in.v.tv.dtype,
                     std::vector<int64_t>(in.v.tv.shape.begin(), in.v.tv.shape.begin() + in.v.tv.ndim))};
  poison(g.dq);
  poison(g.dk);
  poison(g.dv);
  BackwardArgs a;
  a.dout = dout, a.q = in.q, a.k = in.k, a.v = in.v, a.out = fwd.out, a.lse = fwd.lse;
  a.dq = g.dq, a.dk = g.dk, a.dv = g.dv;
  a.options = options(c, in);
  a.options.deterministic = deterministic;
  a.layout = layout(c, in);
  a.impl = impl;
  backward(a);
  return g;
}

/// max |x| over a tensor (NaN gives +inf).
inline double max_abs(const HostTensor& t) {
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = t.get(i);
    if (std::isnan(x)) return INFINITY;
    m = std::max(m, std::fabs(x));
  }
  return m;
}

inline bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.bytes == b.bytes;
}

/// Runs `body` with the fast path capped to one ISA copy (FLASHPORT_CPU_ISA), restoring the default.
template <class F>
void with_isa(const char* isa, F&& body) {
  setenv("FLASHPORT_CPU_ISA", isa, 1);
  body();
  unsetenv("FLASHPORT_CPU_ISA");
}

}  // namespace flashport::test::fastcheck
