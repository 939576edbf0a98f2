// FP8 forward checks on AMD (the model tests and the backend test): fp8 inputs with non-unit (b, hk)
// descales, the CPU reference on the same fp8 inputs as the oracle, and a bf16 baseline for SPEC's
// accuracy rule.
//
// Why a bf16 baseline: the CDNA fp8 forward dequantises to bf16 exactly and then computes as the bf16
// kernel does, so its error is a bf16 kernel's. The CPU baseline on fp8 inputs would round scores and
// P to fp8, a bound ~16x looser than that. The descales are drawn with at most 3 significant bits, so
// x8 * descale is exact in bf16 (e4m3 has 4, e5m2 3 significant bits; bf16 8): the bf16 baseline
// computes the very same attention as the fp8 call, with the descales folded into its inputs.
#pragma once

#include <cstring>
#include <random>
#include <string>

#include "common/cases.hpp"
#include "cpu/test_fast_util.hpp"

namespace flashport::test::fp8check {

struct Inputs {
  fastcheck::Inputs fp8;  // q, k, v in the case's fp8 dtype (plus the layout tensors)
  fastcheck::Inputs deq;  // bf16 q, k, v: fp8 value x its descale, exactly
  HostTensor descale[3];  // fp32 (b, hk): q, k, v
};

/// Element n of an int32 tensor (HostTensor::get reads float types only).
inline int64_t i32_at(const HostTensor& t, int64_t n) {
  int32_t v;
  std::memcpy(&v, t.bytes.data() + 4 * n, 4);
  return v;
}

/// The sequence index of token row `t` of an operand with `rows_per_seq` rows per sequence (dense),
/// cu_seqlens `cu` (varlen), or the block table's owner of page t / page (paged pools).
inline int64_t sequence_of(const Case& c, const HostTensor& cu, const HostTensor& table, int64_t t,
                           int64_t rows_per_seq) {
  if (c.layout == Layout::varlen) {
    int64_t b = 0;
    while (b + 1 < c.batch() && i32_at(cu, b + 1) <= t) ++b;
    return b;
  }
  if (c.layout == Layout::paged && rows_per_seq < 0) {  // a k/v pool row
    const int64_t block = t / c.page, per_seq = table.tv.shape[1];
    for (int64_t n = 0; n < table.numel(); ++n)
      if (i32_at(table, n) == block) return n / per_seq;
    return 0;  // a pool block no sequence owns: never read
  }
  return t / rows_per_seq;
}

/// The descale of element n of operand w (0 q, 1 k, 2 v) of `r`: its (sequence, kv head)'s.
inline double descale_of(const Case& c, const Inputs& r, int w, int64_t n) {
  const TensorView& tv = (w == 0 ? r.fp8.q : w == 1 ? r.fp8.k : r.fp8.v).tv;
  const HostTensor& cu = w == 0 ? r.fp8.cu_q : r.fp8.cu_k;
  const int64_t ch = tv.shape[tv.ndim - 1], heads = tv.shape[tv.ndim - 2];
  // Dense and paged q: (b, s, h, c), s rows per sequence; varlen: (total, h, c); paged k/v: pool.
  const int64_t rows_per_seq = c.layout == Layout::varlen            ? 1
                               : c.layout == Layout::paged && w != 0 ? -1
                                                                     : tv.shape[1];
  const int64_t t = n / (heads * ch), h = (n / ch) % heads;
  const int64_t b = sequence_of(c, cu, r.fp8.block_table, t, rows_per_seq);
  const int64_t hk = w == 0 ? h / (c.hq / c.hk) : h;
  return r.descale[w].get(b * c.hk + hk);
}

/// r.deq = r.fp8's values times their (b, hk) descales, stored as bf16. `exact`: each product must be a
/// bf16 (make's descales guarantee it); otherwise it is rounded, as a caller with arbitrary descales wants.
inline void dequantize(const Case& c, Inputs& r, bool exact) {
  const HostTensor* src[3] = {&r.fp8.q, &r.fp8.k, &r.fp8.v};
  HostTensor* dst[3] = {&r.deq.q, &r.deq.k, &r.deq.v};
  for (int w = 0; w < 3; ++w) {
    const TensorView& tv = src[w]->tv;
    HostTensor out(DType::bf16, std::vector<int64_t>(tv.shape.begin(), tv.shape.begin() + tv.ndim));
    for (int64_t n = 0; n < out.numel(); ++n) {
      const double x = src[w]->get(n) * descale_of(c, r, w, n);
      out.set(n, x);
      if (exact) {
        EXPECT_EQ(out.get(n), x) << "a dequantised value is not a bf16";
      }
    }
    *dst[w] = std::move(out);
  }
}

/// Fresh fp8 inputs for `c` (c.dtype an fp8 type), descales and the exact bf16 copies.
inline Inputs make(const Case& c) {
  Inputs r;
  r.fp8 = fastcheck::make_inputs(c);
  r.deq = r.fp8;
  const double kDescales[] = {0.375, 0.5, 0.75, 1.25, 1.5, 2.0, 3.0};
  std::uniform_int_distribution<int> pick(0, 6);
  for (HostTensor& ds : r.descale) {
    ds = HostTensor(DType::f32, {c.batch(), c.hk});
    for (int64_t n = 0; n < ds.numel(); ++n) ds.set(n, kDescales[pick(rng())]);
  }
  dequantize(c, r, true);
  return r;
}

/// Forward arguments for `c` on `in` (descales attached when given) writing `f`'s tensors.
inline ForwardArgs args(const Case& c, const fastcheck::Inputs& in, const HostTensor* descale,
                        fastcheck::Forward& f, Impl impl) {
  ForwardArgs a;
  a.q = in.q, a.k = in.k, a.v = in.v, a.out = f.out;
  a.lse = f.lse.view();
  a.options = fastcheck::options(c, in);
  if (descale) {
    a.options.q_descale = descale[0].view(), a.options.k_descale = descale[1].view();
    a.options.v_descale = descale[2].view();
  }
  a.layout = fastcheck::layout(c, in);
  a.impl = impl;
  return a;
}

/// Poisoned out (dtype `out`) and LSE tensors of `c`.
inline fastcheck::Forward outputs(const Case& c, DType out) {
  fastcheck::Forward f{HostTensor(out, out_shape(c)), HostTensor(DType::f32, lse_shape(c))};
  poison(f.out);
  poison(f.lse);
  return f;
}

/// The oracle: the CPU reference on the fp8 inputs with their descales, fp32 out.
inline fastcheck::Forward reference(const Case& c, const Inputs& in) {
  fastcheck::Forward f = outputs(c, DType::f32);
  forward(args(c, in.fp8, in.descale, f, Impl::reference));
  return f;
}

/// The bf16 baseline on the dequantised inputs (bf16 out).
inline fastcheck::Forward baseline(const Case& c, const Inputs& in) {
  Case cb = c;
  cb.dtype = DType::bf16;
  fastcheck::Forward f = outputs(cb, DType::bf16);
  forward(args(cb, in.deq, nullptr, f, Impl::baseline));
  return f;
}

/// SPEC's literal baseline on the fp8 inputs themselves (scores and P rounded to the fp8 type, bf16 out):
/// the bound for a kernel that multiplies e4m3 probabilities (the Hopper fp8 kernel, whose P V runs on
/// fp8 tensor cores), not one that dequantises to bf16.
inline fastcheck::Forward baseline_fp8(const Case& c, const Inputs& in) {
  fastcheck::Forward f = outputs(c, DType::bf16);
  forward(args(c, in.fp8, in.descale, f, Impl::baseline));
  return f;
}

/// SPEC's accuracy rule for `got` (out and LSE) against the reference and the bf16 baseline.
inline void expect_accurate(const fastcheck::Forward& got, const Case& c, const Inputs& in) {
  const fastcheck::Forward ref = reference(c, in), base = baseline(c, in);
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
}

}  // namespace flashport::test::fp8check
