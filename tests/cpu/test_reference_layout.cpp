// The CPU reference over sequence layouts: varlen with empty sequences, seqused_k, and paged K/V with
// several page sizes, each against dense calls on the same data.
#include <algorithm>
#include <numeric>

#include "cpu/test_reference_util.hpp"

namespace flashport::test {
namespace {

using refcheck::Spec;

/// Rows [lo, hi) of a varlen (total, h, c) tensor as a dense (1, hi - lo, h, c) tensor.
HostTensor varlen_rows(const HostTensor& t, int64_t lo, int64_t hi) {
  const int64_t h = t.tv.shape[1], c = t.tv.shape[2];
  HostTensor out(t.tv.dtype, {1, hi - lo, h, c});
  for (int64_t n = 0; n < (hi - lo) * h * c; ++n) out.set(n, t.get(lo * h * c + n));
  return out;
}

std::vector<int32_t> cumulative(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  return cu;
}

/// Varlen forward (optionally with seqused_k) equals one dense call per sequence; sequences without
/// keys give zeros and LSE -inf; sequences without queries write nothing (nothing to write).
void check_varlen(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& k_lens, Spec sp,
                  const std::vector<int32_t>* used) {
  const std::vector<int32_t> cu_q = cumulative(q_lens), cu_k = cumulative(k_lens);
  const int64_t batch = (int64_t)q_lens.size(), total_q = cu_q.back(), total_k = cu_k.back();
  const int64_t max_q = *std::max_element(q_lens.begin(), q_lens.end());
  const int64_t max_k = *std::max_element(k_lens.begin(), k_lens.end());
  HostTensor q = randn(sp.dtype, {total_q, sp.hq, sp.d}), k = randn(sp.dtype, {total_k, sp.hk, sp.d}),
             v = randn(sp.dtype, {total_k, sp.hk, sp.dv});
  HostTensor out(sp.dtype, {total_q, sp.hq, sp.dv}), lse(DType::f32, {sp.hq, total_q});
  poison(out);
  poison(lse);
  HostTensor cu_q_t = int_tensor(cu_q), cu_k_t = int_tensor(cu_k), used_t;
  refcheck::Inputs alibi_holder;
  sp.batch = batch;
  if (sp.alibi) {
    Spec slopes;
    slopes.batch = batch, slopes.hq = sp.hq, slopes.alibi = sp.alibi;
    alibi_holder = refcheck::make_inputs(slopes);
  }
  ForwardArgs a;
  a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse.view();
  a.layout.cu_seqlens_q = cu_q_t.view(), a.layout.cu_seqlens_k = cu_k_t.view();
  a.layout.max_seqlen_q = max_q, a.layout.max_seqlen_k = max_k;
  if (used) {
    used_t = int_tensor(*used);
    a.layout.seqused_k = used_t.view();
  }
  a.options = refcheck::options(sp, alibi_holder);
  a.impl = Impl::reference;
  forward(a);

  for (int64_t b = 0; b < batch; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const int64_t sq = q_lens[(size_t)b], sk = used ? (*used)[(size_t)b] : k_lens[(size_t)b];
    if (sq == 0) continue;
    std::vector<double> want_out((size_t)(sq * sp.hq * sp.dv), 0.0),
        want_lse((size_t)(sp.hq * sq), -INFINITY);
    if (sk > 0) {
      Spec one = sp;
      one.batch = 1, one.sq = sq, one.sk = sk;
      refcheck::Inputs in{varlen_rows(q, cu_q[(size_t)b], cu_q[(size_t)b + 1]),
                          varlen_rows(k, cu_k[(size_t)b], cu_k[(size_t)b] + sk),
                          varlen_rows(v, cu_k[(size_t)b], cu_k[(size_t)b] + sk),
                          HostTensor(DType::f32, {sp.hq})};
      for (int64_t h = 0; h < sp.hq; ++h)
        if (sp.alibi) in.alibi.set(h, alibi_holder.alibi.get(sp.alibi == 1 ? h : b * sp.hq + h));
      one.alibi = sp.alibi ? 1 : 0;
      const refcheck::Result r = refcheck::run_forward(one, in);
      want_out = r.out.to_double();
      want_lse = r.lse.to_double();
    }
    for (int64_t n = 0; n < sq * sp.hq * sp.dv; ++n)
      ASSERT_EQ(out.get(cu_q[(size_t)b] * sp.hq * sp.dv + n), want_out[(size_t)n]) << n;
    for (int64_t h = 0; h < sp.hq; ++h)
      for (int64_t i = 0; i < sq; ++i)
        ASSERT_EQ(lse.get(h * total_q + cu_q[(size_t)b] + i), want_lse[(size_t)(h * sq + i)])
            << h << " " << i;
  }
}

TEST(ReferenceLayout, VarlenWithEmptySequences) {
  Spec sp;
  sp.hq = 4, sp.hk = 2, sp.d = 24, sp.dv = 16;
  check_varlen({0, 5, 0, 7}, {0, 5, 0, 7}, sp, nullptr);
  sp.causal = true;
  check_varlen({0, 5, 0, 7, 1}, {3, 0, 6, 9, 4}, sp, nullptr);  // sequence 1 has queries but no keys
  sp.causal = false, sp.wl = 2, sp.wr = 1, sp.alibi = 2, sp.softcap = 4.0;
  check_varlen({4, 1, 11}, {9, 2, 3}, sp, nullptr);
}

TEST(ReferenceLayout, SequsedK) {
  Spec sp;
  sp.hq = 2, sp.hk = 1, sp.d = 16, sp.dv = 16, sp.causal = true;
  const std::vector<int32_t> used = {9, 0, 4};
  check_varlen({3, 6, 5}, {12, 2, 4}, sp, &used);
  // Dense q/k with seqused_k: like a dense call over the first seqused_k[b] keys (bottom-right aligned).
  Spec dense = sp;
  dense.batch = 3, dense.sq = 7, dense.sk = 20;
  const refcheck::Inputs in = refcheck::make_inputs(dense);
  const std::vector<int32_t> lens = {20, 11, 3};
  HostTensor used_t = int_tensor(lens), out(DType::f64, {3, 7, 2, 16}), lse(DType::f32, {3, 2, 7});
  poison(out);
  poison(lse);
  ForwardArgs a;
  a.q = in.q, a.k = in.k, a.v = in.v, a.out = out, a.lse = lse.view();
  a.layout.seqused_k = used_t.view();
  a.options = refcheck::options(dense, in);
  a.impl = Impl::reference;
  forward(a);
  const std::vector<int64_t> used64(lens.begin(), lens.end());
  const refcheck::Naive want = refcheck::naive_forward(dense, in, &used64);
  EXPECT_LE(refcheck::max_diff(out, want.out), 1e-12);
  for (int64_t n = 0; n < lse.numel(); ++n) {
    if (std::isinf(want.lse[(size_t)n])) {
      EXPECT_EQ(lse.get(n), want.lse[(size_t)n]) << n;
    } else {
      EXPECT_NEAR(lse.get(n), want.lse[(size_t)n], 1e-5) << n;
    }
  }
}

/// Paged K/V: a random permutation of blocks (plus spare poisoned blocks) gives exactly the dense result.
TEST(ReferenceLayout, PagedKvEqualsDense) {
  Spec sp;
  sp.batch = 3, sp.sq = 9, sp.sk = 40, sp.hq = 4, sp.hk = 2, sp.d = 16, sp.dv = 8, sp.causal = true;
  const refcheck::Inputs in = refcheck::make_inputs(sp);
  const std::vector<int32_t> lens = {40, 17, 33};
  HostTensor used_t = int_tensor(lens);
  // Dense reference with the same per-sequence key counts.
  HostTensor want(DType::f64, {3, 9, 4, 8}), want_lse(DType::f32, {3, 4, 9});
  ForwardArgs d;
  d.q = in.q, d.k = in.k, d.v = in.v, d.out = want, d.lse = want_lse.view();
  d.layout.seqused_k = used_t.view();
  d.options = refcheck::options(sp, in);
  d.impl = Impl::reference;
  forward(d);

  for (int64_t page : {1, 3, 16, 256}) {
    SCOPED_TRACE("page " + std::to_string(page));
    const int64_t per_seq = (sp.sk + page - 1) / page, blocks = sp.batch * per_seq + 2;
    std::vector<int32_t> perm((size_t)blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    HostTensor k_cache(DType::f64, {blocks, page, sp.hk, sp.d}),
        v_cache(DType::f64, {blocks, page, sp.hk, sp.dv});
    poison(k_cache);
    poison(v_cache);
    HostTensor table(DType::i32, {sp.batch, per_seq});
    for (int64_t b = 0; b < sp.batch; ++b)
      for (int64_t blk = 0; blk < per_seq; ++blk)
        table.i32()[b * per_seq + blk] = perm[(size_t)(b * per_seq + blk)];
    for (int64_t b = 0; b < sp.batch; ++b)
      for (int64_t t = 0; t < lens[(size_t)b]; ++t) {
        const int64_t blk = table.i32()[b * per_seq + t / page], slot = t % page;
        for (int64_t e = 0; e < sp.hk * sp.d; ++e)
          k_cache.set((blk * page + slot) * sp.hk * sp.d + e, in.k.get((b * sp.sk + t) * sp.hk * sp.d + e));
        for (int64_t e = 0; e < sp.hk * sp.dv; ++e)
          v_cache.set((blk * page + slot) * sp.hk * sp.dv + e, in.v.get((b * sp.sk + t) * sp.hk * sp.dv + e));
      }
    HostTensor out(DType::f64, {3, 9, 4, 8}), lse(DType::f32, {3, 4, 9});
    poison(out);
    poison(lse);
    ForwardArgs a = d;
    a.k = k_cache, a.v = v_cache, a.out = out, a.lse = lse.view();
    a.layout.block_table = table.view();
    forward(a);
    EXPECT_EQ(max_abs_diff(out, want), 0.0);
    EXPECT_EQ(max_abs_diff(lse, want_lse), 0.0);
  }
}

}  // namespace
}  // namespace flashport::test
