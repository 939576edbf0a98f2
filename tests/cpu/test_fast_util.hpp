// Helpers of the CPU fast-path tests: fresh random inputs for a Case (common/cases.hpp: dense, varlen
// and paged layouts), and forward/backward calls through the public API with poisoned outputs.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/cases.hpp"

namespace flashport::test::fastcheck {

// The problem description (Case, Layout, dense, with) and the shared shape tables: common/cases.hpp.

/// The tensors of a case. Paged: k/v are (num_blocks, page, hk, d) caches reached through a shuffled
/// block table, q stays dense (b, max_q, hq, d).
struct Inputs {
  HostTensor q, k, v, alibi, cu_q, cu_k, used_k, block_table;
};

inline Inputs make_inputs(const Case& c) {
  EXPECT_EQ(c.pad, 0) << "row padding is a CUDA-harness feature";
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
      const int64_t blocks = page_pool_blocks(c);
      in.q = randn(c.dtype, {b, c.q_lens[0], c.hq, c.d}, c.q_stddev);
      in.k = randn(c.dtype, {blocks, c.page, c.hk, c.d});
      in.v = randn(c.dtype, {blocks, c.page, c.hk, c.dv});
      in.block_table = shuffled_block_table(c);
      break;
    }
  }
  in.used_k = used_k_tensor(c);
  in.alibi = alibi_slopes(c);
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
/// Runs fast, reference and baseline on fresh inputs; the fast output and LSE must satisfy the rule.
inline void expect_accurate(const Case& c) {
  SCOPED_TRACE(c.describe());
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const fastcheck::Forward fast = fastcheck::run_forward(c, in, Impl::fast);
  const fastcheck::Forward ref = fastcheck::run_forward(c, in, Impl::reference);
  const fastcheck::Forward base = fastcheck::run_forward(c, in, Impl::baseline);
  EXPECT_TRUE(accuracy_rule(fast.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(fast.lse, base.lse, ref.lse)) << "lse";
}

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
