// The CPU KV-cache path (append with rotary, batch index, left pad, paged cache) and merge_states, against
// caches and attention built by hand in the test.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "cpu/test_reference_util.hpp"

namespace flashport::test {
namespace {

using refcheck::Spec;

struct KvCase {
  std::string name;
  int64_t batch = 3, hq = 4, hk = 2, d = 16, dv = 16, sq = 2, s_new = 3, capacity = 24;
  std::vector<int32_t> seqlens = {5, 0, 11};
  std::vector<int32_t> leftpad, batch_idx;  // empty: absent
  int64_t cache_rows = 3;
  int rotary_dim = 0;
  bool interleaved = true, causal = false;
  int64_t wl = -1, wr = -1;
  int64_t page = 0;  // 0: dense cache
  DType dtype = DType::f32;
};

/// The test's own rotary: GPT-J pairs or NeoX halves of the first `rot` channels, in fp32.
std::vector<float> rotate(const std::vector<float>& x, int rot, bool interleaved, const HostTensor& cos_t,
                          const HostTensor& sin_t, int64_t pos) {
  std::vector<float> y = x;
  const int half = rot / 2;
  for (int k = 0; k < half; ++k) {
    const float c = (float)cos_t.get(pos * half + k), s = (float)sin_t.get(pos * half + k);
    const int a = interleaved ? 2 * k : k, b = interleaved ? 2 * k + 1 : k + half;
    y[a] = x[a] * c - x[b] * s;
    y[b] = x[b] * c + x[a] * s;
  }
  return y;
}

void check_kvcache(const KvCase& kc) {
  SCOPED_TRACE(kc.name);
  const bool paged = kc.page > 0, append = kc.s_new > 0;
  const int64_t rows = paged ? 0 : kc.cache_rows;
  const int64_t per_seq = paged ? kc.capacity / kc.page : 0, blocks = paged ? kc.batch * per_seq + 1 : 0;
  HostTensor q = randn(kc.dtype, {kc.batch, kc.sq, kc.hq, kc.d});
  HostTensor k_new = randn(kc.dtype, {kc.batch, std::max<int64_t>(kc.s_new, 1), kc.hk, kc.d});
  HostTensor v_new = randn(kc.dtype, {kc.batch, std::max<int64_t>(kc.s_new, 1), kc.hk, kc.dv});
  const std::vector<int64_t> k_shape = paged ? std::vector<int64_t>{blocks, kc.page, kc.hk, kc.d}
                                             : std::vector<int64_t>{rows, kc.capacity, kc.hk, kc.d};
  std::vector<int64_t> v_shape = k_shape;
  v_shape[3] = kc.dv;
  // Whole cache starts poisoned; the valid old tokens [leftpad, seqlens) get random values.
  HostTensor k_cache(kc.dtype, k_shape), v_cache(kc.dtype, v_shape),
      table(DType::i32, {kc.batch, std::max<int64_t>(per_seq, 1)});
  poison(k_cache);
  poison(v_cache);
  if (paged) {
    std::vector<int32_t> perm((size_t)blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    std::copy(perm.begin(), perm.begin() + kc.batch * per_seq, table.i32());
  }
  // Element offset of (batch entry b, absolute slot, kv head h) in the cache, channel 0.
  const auto cache_at = [&](int64_t b, int64_t slot, int64_t h, int64_t width) -> int64_t {
    if (paged)
      return ((table.i32()[b * per_seq + slot / kc.page] * kc.page + slot % kc.page) * kc.hk + h) * width;
    const int64_t row = kc.batch_idx.empty() ? b : kc.batch_idx[(size_t)b];
    return ((row * kc.capacity + slot) * kc.hk + h) * width;
  };
  const auto pad = [&](int64_t b) -> int64_t { return kc.leftpad.empty() ? 0 : kc.leftpad[(size_t)b]; };
  std::normal_distribution<double> nd;
  for (int64_t b = 0; b < kc.batch; ++b)
    for (int64_t slot = pad(b); slot < kc.seqlens[(size_t)b]; ++slot)
      for (int64_t h = 0; h < kc.hk; ++h) {
        for (int64_t c = 0; c < kc.d; ++c) k_cache.set(cache_at(b, slot, h, kc.d) + c, nd(rng()));
        for (int64_t c = 0; c < kc.dv; ++c) v_cache.set(cache_at(b, slot, h, kc.dv) + c, nd(rng()));
      }
  // Rotary tables: cos/sin of pos * 10000^(-2k / rot).
  const int half = kc.rotary_dim / 2;
  HostTensor cos_t(kc.dtype, {kc.capacity, std::max(half, 1)}),
      sin_t(kc.dtype, {kc.capacity, std::max(half, 1)});
  for (int64_t pos = 0; pos < kc.capacity; ++pos)
    for (int k = 0; k < half; ++k) {
      const double theta = (double)pos * std::pow(10000.0, -2.0 * k / kc.rotary_dim);
      cos_t.set(pos * half + k, std::cos(theta));
      sin_t.set(pos * half + k, std::sin(theta));
    }

  // Expected cache after the append.
  HostTensor k_want = k_cache, v_want = v_cache;
  for (int64_t b = 0; b < kc.batch && append; ++b)
    for (int64_t t = 0; t < kc.s_new; ++t)
      for (int64_t h = 0; h < kc.hk; ++h) {
        const int64_t pos = kc.seqlens[(size_t)b] + t;
        std::vector<float> x((size_t)kc.d);
        for (int64_t c = 0; c < kc.d; ++c)
          x[(size_t)c] = (float)k_new.get(((b * kc.s_new + t) * kc.hk + h) * kc.d + c);
        if (kc.rotary_dim) x = rotate(x, kc.rotary_dim, kc.interleaved, cos_t, sin_t, pos);
        for (int64_t c = 0; c < kc.d; ++c) k_want.set(cache_at(b, pos, h, kc.d) + c, x[(size_t)c]);
        for (int64_t c = 0; c < kc.dv; ++c)
          v_want.set(cache_at(b, pos, h, kc.dv) + c, v_new.get(((b * kc.s_new + t) * kc.hk + h) * kc.dv + c));
      }

  HostTensor out(kc.dtype, {kc.batch, kc.sq, kc.hq, kc.dv}), lse(DType::f32, {kc.batch, kc.hq, kc.sq});
  poison(out);
  poison(lse);
  HostTensor seqlens_t = int_tensor(kc.seqlens), pad_t, idx_t;
  KvCacheArgs a;
  a.q = q, a.k_cache = k_cache, a.v_cache = v_cache, a.out = out, a.lse = lse.view();
  if (append) a.k_new = k_new.view(), a.v_new = v_new.view();
  a.cache_seqlens = seqlens_t.view();
  if (!kc.leftpad.empty()) pad_t = int_tensor(kc.leftpad), a.cache_leftpad = pad_t.view();
  if (!kc.batch_idx.empty()) idx_t = int_tensor(kc.batch_idx), a.cache_batch_idx = idx_t.view();
  if (paged) a.block_table = table.view();
  if (kc.rotary_dim) a.rotary_cos = cos_t.view(), a.rotary_sin = sin_t.view();
  a.rotary_interleaved = kc.interleaved;
  a.options.causal = kc.causal, a.options.window_left = kc.wl, a.options.window_right = kc.wr;
  a.impl = Impl::reference;
  forward_kvcache(a);

  // The cache: appended slots as expected, every other byte untouched (poison included).
  const double tol = kc.dtype == DType::f32 ? 1e-6 : 1.0 / 128;
  for (const auto& [got, want] : {std::pair{&k_cache, &k_want}, std::pair{&v_cache, &v_want}})
    for (int64_t n = 0; n < got->numel(); ++n) {
      const double x = got->get(n), y = want->get(n);
      if (std::isnan(y)) {
        ASSERT_TRUE(std::isnan(x)) << "cache element " << n << " was written";
        continue;
      }
      ASSERT_NEAR(x, y, tol * std::max(1.0, std::fabs(y))) << "cache element " << n;
    }

  // Attention: a dense forward per sequence over the hand-built cache and the hand-rotated q.
  const bool q_per_token = kc.causal || kc.wl >= 0 || kc.wr >= 0;
  for (int64_t b = 0; b < kc.batch; ++b) {
    SCOPED_TRACE("batch entry " + std::to_string(b));
    const int64_t first = pad(b), end = kc.seqlens[(size_t)b] + kc.s_new, sk = end - first;
    Spec sp;
    sp.batch = 1, sp.sq = kc.sq, sp.sk = sk, sp.hq = kc.hq, sp.hk = kc.hk, sp.d = kc.d, sp.dv = kc.dv;
    sp.causal = kc.causal, sp.wl = kc.wl, sp.wr = kc.wr, sp.dtype = kc.dtype;
    refcheck::Inputs in{HostTensor(kc.dtype, {1, kc.sq, kc.hq, kc.d}),
                        HostTensor(kc.dtype, {1, sk, kc.hk, kc.d}),
                        HostTensor(kc.dtype, {1, sk, kc.hk, kc.dv}),
                        {}};
    for (int64_t i = 0; i < kc.sq; ++i)
      for (int64_t h = 0; h < kc.hq; ++h) {
        std::vector<float> x((size_t)kc.d);
        for (int64_t c = 0; c < kc.d; ++c)
          x[(size_t)c] = (float)q.get(((b * kc.sq + i) * kc.hq + h) * kc.d + c);
        const int64_t pos = kc.seqlens[(size_t)b] + (q_per_token ? i : 0);
        if (kc.rotary_dim) x = rotate(x, kc.rotary_dim, kc.interleaved, cos_t, sin_t, pos);
        for (int64_t c = 0; c < kc.d; ++c) in.q.set((i * kc.hq + h) * kc.d + c, x[(size_t)c]);
      }
    for (int64_t j = 0; j < sk; ++j)
      for (int64_t h = 0; h < kc.hk; ++h) {
        for (int64_t c = 0; c < kc.d; ++c)
          in.k.set((j * kc.hk + h) * kc.d + c, k_want.get(cache_at(b, first + j, h, kc.d) + c));
        for (int64_t c = 0; c < kc.dv; ++c)
          in.v.set((j * kc.hk + h) * kc.dv + c, v_want.get(cache_at(b, first + j, h, kc.dv) + c));
      }
    std::vector<double> want_out((size_t)(kc.sq * kc.hq * kc.dv), 0.0),
        want_lse((size_t)(kc.hq * kc.sq), -INFINITY);
    if (sk > 0) {
      const refcheck::Result r = refcheck::run_forward(sp, in);
      want_out = r.out.to_double(), want_lse = r.lse.to_double();
    }
    const double out_tol = kc.dtype == DType::f32 ? 1e-5 : 2e-2;
    for (int64_t n = 0; n < kc.sq * kc.hq * kc.dv; ++n)
      ASSERT_NEAR(out.get(b * kc.sq * kc.hq * kc.dv + n), want_out[(size_t)n], out_tol) << n;
    for (int64_t n = 0; n < kc.hq * kc.sq; ++n) {
      const double got = lse.get(b * kc.hq * kc.sq + n), want = want_lse[(size_t)n];
      if (std::isinf(want)) {
        ASSERT_EQ(got, want) << n;
      } else {
        ASSERT_NEAR(got, want, out_tol) << n;
      }
    }
  }
}

TEST(ReferenceKvCache, AppendWithRotary) {
  KvCase kc;
  kc.name = "dense, interleaved, causal";
  kc.rotary_dim = 16, kc.causal = true;
  check_kvcache(kc);
  kc.name = "dense, NeoX halves of 8 of 16 channels, non-causal (q at cache_seqlens)";
  kc.rotary_dim = 8, kc.interleaved = false, kc.causal = false;
  check_kvcache(kc);
  kc.name = "bf16, interleaved partial, local window";
  kc.dtype = DType::bf16, kc.interleaved = true, kc.wl = 4, kc.wr = 0;
  check_kvcache(kc);
}

TEST(ReferenceKvCache, BatchIndexLeftPadAndPaged) {
  KvCase kc;
  kc.name = "cache_batch_idx";
  kc.cache_rows = 5, kc.batch_idx = {4, 0, 2}, kc.rotary_dim = 16, kc.causal = true;
  check_kvcache(kc);
  kc = KvCase{};
  kc.name = "cache_leftpad";
  kc.leftpad = {2, 0, 3}, kc.rotary_dim = 16, kc.interleaved = false, kc.causal = true;
  check_kvcache(kc);
  kc.name = "cache_leftpad, no rotary, sq > s_new";
  kc.rotary_dim = 0, kc.sq = 5, kc.s_new = 1;
  check_kvcache(kc);
  for (int64_t page : {1, 3, 8}) {
    kc = KvCase{};
    kc.name = "paged " + std::to_string(page);
    kc.page = page, kc.rotary_dim = 8, kc.interleaved = page != 3, kc.causal = true;
    check_kvcache(kc);
  }
}

TEST(ReferenceKvCache, NoAppendAndDecode) {
  KvCase kc;
  kc.name = "attention over the cache only, rotary q";
  kc.s_new = 0, kc.rotary_dim = 16, kc.causal = true, kc.seqlens = {5, 1, 11};
  check_kvcache(kc);
  kc = KvCase{};
  kc.name = "decode: one new token, gqa 4:1";
  kc.sq = 1, kc.s_new = 1, kc.hq = 8, kc.hk = 2, kc.dv = 8;
  check_kvcache(kc);
}

// ---------------------------------------------------------------------------------------------
// merge_states

TEST(ReferenceMerge, TwoKeyHalvesEqualTheWhole) {
  for (DType t : {DType::f64, DType::bf16}) {
    Spec s;
    s.batch = 2, s.sq = 5, s.sk = 21, s.hq = 3, s.hk = 3, s.d = 8, s.dv = 8, s.dtype = t;
    SCOPED_TRACE(dtype_name(t));
    const refcheck::Inputs in = refcheck::make_inputs(s);
    const refcheck::Result whole = refcheck::run_forward(s, in);
    const int64_t split = 8;
    refcheck::Result part[2];
    for (int half = 0; half < 2; ++half) {
      Spec sh = s;
      const int64_t lo = half ? split : 0, hi = half ? s.sk : split;
      sh.sk = hi - lo;
      refcheck::Inputs in_h{
          in.q, HostTensor(t, {s.batch, sh.sk, s.hk, s.d}), HostTensor(t, {s.batch, sh.sk, s.hk, s.dv}), {}};
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t j = 0; j < sh.sk; ++j)
          for (int64_t e = 0; e < s.hk * s.d; ++e) {
            in_h.k.set((b * sh.sk + j) * s.hk * s.d + e, in.k.get((b * s.sk + lo + j) * s.hk * s.d + e));
            in_h.v.set((b * sh.sk + j) * s.hk * s.dv + e, in.v.get((b * s.sk + lo + j) * s.hk * s.dv + e));
          }
      part[half] = refcheck::run_forward(sh, in_h);
    }
    HostTensor out(t, {s.batch, s.sq, s.hq, s.dv}), lse(DType::f32, {s.batch, s.hq, s.sq});
    poison(out);
    poison(lse);
    MergeArgs m{part[0].out, part[0].lse, part[1].out, part[1].lse, out, lse.view()};
    merge_states(m);
    const double tol = t == DType::f64 ? 1e-6 : 2e-2;
    EXPECT_LE(max_abs_diff(out, whole.out), tol);
    EXPECT_LE(max_abs_diff(lse, whole.lse), 1e-5);
    // In place: out and lse alias the first state.
    MergeArgs in_place{part[0].out, part[0].lse, part[1].out, part[1].lse, part[0].out, part[0].lse.view()};
    merge_states(in_place);
    EXPECT_EQ(part[0].out.bytes, out.bytes);
    EXPECT_EQ(part[0].lse.bytes, lse.bytes);
  }
}

TEST(ReferenceMerge, EmptyStatesDoNotLeakNaN) {
  const int64_t b = 1, s = 3, h = 2, d = 4;
  HostTensor out_a = randn(DType::f32, {b, s, h, d}), out_b = randn(DType::f32, {b, s, h, d});
  HostTensor lse_a = randn(DType::f32, {b, h, s}), lse_b = randn(DType::f32, {b, h, s});
  // Row (h 0, s 1): a empty (its output is garbage); row (h 1, s 2): both empty.
  lse_a.f32()[1] = -INFINITY;
  for (int64_t c = 0; c < d; ++c) out_a.set((1 * h + 0) * d + c, NAN);
  lse_a.f32()[1 * s + 2] = lse_b.f32()[1 * s + 2] = -INFINITY;
  for (int64_t c = 0; c < d; ++c) out_a.set((2 * h + 1) * d + c, NAN), out_b.set((2 * h + 1) * d + c, NAN);
  HostTensor out(DType::f32, {b, s, h, d}), lse(DType::f32, {b, h, s});
  poison(out);
  poison(lse);
  merge_states(MergeArgs{out_a, lse_a, out_b, lse_b, out, lse.view()});
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_EQ(out.get((1 * h + 0) * d + c), out_b.get((1 * h + 0) * d + c));
    EXPECT_EQ(out.get((2 * h + 1) * d + c), 0.0);
  }
  EXPECT_EQ(lse.f32()[1], lse_b.f32()[1]);
  EXPECT_EQ(lse.f32()[1 * s + 2], -INFINITY);
  for (int64_t n = 0; n < out.numel(); ++n) EXPECT_FALSE(std::isnan(out.get(n))) << n;
}

}  // namespace
}  // namespace flashport::test
