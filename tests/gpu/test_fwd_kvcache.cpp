// CUDA forward_kvcache vs the CPU oracle: append (bit-identical cache contents), rotary on k and q
// (both styles), cache_batch_idx, left pad, paged caches, split-KV counts.
#include <cmath>

#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

struct KvCase {
  DType dtype = DType::bf16;
  int64_t b = 2, sq = 1, s_new = 1, hq = 4, hk = 1, d = 64, s_cache = 300;
  std::vector<int32_t> cache_lens{10, 200};  // per batch entry, before the append
  int64_t page = 0;                          // > 0: paged cache (s_cache must be a multiple)
  bool batch_idx = false;                    // cache rows reached through cache_batch_idx (reversed)
  std::vector<int32_t> leftpad;              // empty: none
  int64_t rotary_dim = 0;
  bool interleaved = true;
  bool causal = false;
  int64_t wl = -1;
  int num_splits = 0;
  std::string describe() const {
    std::ostringstream s;
    s << dtype_name(dtype) << " b=" << b << " sq=" << sq << " s_new=" << s_new << " hq=" << hq << " hk=" << hk
      << " d=" << d << " s_cache=" << s_cache << " page=" << page << " batch_idx=" << batch_idx
      << " leftpad=" << !leftpad.empty() << " rotary=" << rotary_dim << (interleaved ? "i" : "n")
      << " causal=" << causal << " wl=" << wl << " splits=" << num_splits;
    return s.str();
  }
};

struct KvHost {
  HostTensor q, k_cache, v_cache, k_new, v_new, seqlens, batch_idx, leftpad, block_table, cos, sin;
};

KvHost make_kv_inputs(const KvCase& c) {
  KvHost h;
  h.q = randn(c.dtype, {c.b, c.sq, c.hq, c.d});
  if (c.page > 0) {
    const int64_t per_seq = c.s_cache / c.page, blocks = c.b * per_seq + 2;
    h.k_cache = randn(c.dtype, {blocks, c.page, c.hk, c.d});
    h.v_cache = randn(c.dtype, {blocks, c.page, c.hk, c.d});
    std::vector<int32_t> ids((size_t)blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    h.block_table = HostTensor(DType::i32, {c.b, per_seq});
    std::copy(ids.begin(), ids.begin() + c.b * per_seq, h.block_table.i32());
  } else {
    const int64_t rows = c.batch_idx ? c.b + 1 : c.b;
    h.k_cache = randn(c.dtype, {rows, c.s_cache, c.hk, c.d});
    h.v_cache = randn(c.dtype, {rows, c.s_cache, c.hk, c.d});
    if (c.batch_idx) {
      std::vector<int32_t> idx;
      for (int64_t i = 0; i < c.b; ++i) idx.push_back((int32_t)(c.b - i));  // reversed, row 0 unused
      h.batch_idx = int_tensor(idx);
    }
  }
  if (c.s_new > 0) {
    h.k_new = randn(c.dtype, {c.b, c.s_new, c.hk, c.d});
    h.v_new = randn(c.dtype, {c.b, c.s_new, c.hk, c.d});
  }
  h.seqlens = int_tensor(c.cache_lens);
  if (!c.leftpad.empty()) h.leftpad = int_tensor(c.leftpad);
  if (c.rotary_dim > 0) {
    const int64_t max_pos = c.s_cache + c.sq + c.s_new, half = c.rotary_dim / 2;
    h.cos = HostTensor(c.dtype, {max_pos, half});
    h.sin = HostTensor(c.dtype, {max_pos, half});
    for (int64_t p = 0; p < max_pos; ++p)
      for (int64_t f = 0; f < half; ++f) {
        const double theta = p * std::pow(10000.0, -2.0 * f / c.rotary_dim);
        h.cos.set(p * half + f, std::cos(theta));
        h.sin.set(p * half + f, std::sin(theta));
      }
  }
  return h;
}

/// Fills the arguments from tensors `t` (host or device views of a KvHost's members).
KvCacheArgs kv_args(const KvCase& c, const std::function<TensorView(const HostTensor&)>& t, const KvHost& h) {
  KvCacheArgs a;
  a.q = t(h.q), a.k_cache = t(h.k_cache), a.v_cache = t(h.v_cache);
  if (c.s_new > 0) a.k_new = t(h.k_new), a.v_new = t(h.v_new);
  a.cache_seqlens = t(h.seqlens);
  if (c.batch_idx) a.cache_batch_idx = t(h.batch_idx);
  if (!c.leftpad.empty()) a.cache_leftpad = t(h.leftpad);
  if (c.page > 0) a.block_table = t(h.block_table);
  if (c.rotary_dim > 0) a.rotary_cos = t(h.cos), a.rotary_sin = t(h.sin);
  a.rotary_interleaved = c.interleaved;
  a.num_splits = c.num_splits;
  a.options.causal = c.causal;
  a.options.window_left = c.wl;
  return a;
}

struct KvResult {
  HostTensor out, lse, k_cache, v_cache;
};

KvResult run_kv_cpu(const KvCase& c, const KvHost& inputs, Impl impl) {
  KvHost h = inputs;  // the append writes into this copy of the caches
  KvResult r{HostTensor(c.dtype, {c.b, c.sq, c.hq, c.d}), HostTensor(DType::f32, {c.b, c.hq, c.sq}), {}, {}};
  poison(r.out);
  poison(r.lse);
  KvCacheArgs a = kv_args(
      c, [](const HostTensor& x) { return x.view(); }, h);
  a.out = r.out, a.lse = r.lse.view();
  a.impl = impl;
  forward_kvcache(a);
  r.k_cache = h.k_cache, r.v_cache = h.v_cache;
  return r;
}

KvResult run_kv_gpu(const KvCase& c, const KvHost& h) {
  std::vector<std::pair<const HostTensor*, DeviceTensor>> dev;
  dev.reserve(16);
  auto to_dev = [&](const HostTensor& x) {
    dev.emplace_back(&x, DeviceTensor::from(x));
    return dev.back().second.view();
  };
  KvCacheArgs a = kv_args(c, to_dev, h);
  KvResult r{HostTensor(c.dtype, {c.b, c.sq, c.hq, c.d}), HostTensor(DType::f32, {c.b, c.hq, c.sq}), {}, {}};
  const DeviceTensor out = DeviceTensor::poisoned(r.out), lse = DeviceTensor::poisoned(r.lse);
  a.out = out.view(), a.lse = lse.view();
  forward_kvcache(a);
  r.out = out.to_host(r.out), r.lse = lse.to_host(r.lse);
  for (const auto& [host, d] : dev) {
    if (host == &h.k_cache) r.k_cache = d.to_host(h.k_cache);
    if (host == &h.v_cache) r.v_cache = d.to_host(h.v_cache);
  }
  return r;
}

void expect_kvcache_accurate(const KvCase& c) {
  SCOPED_TRACE(c.describe());
  const KvHost h = make_kv_inputs(c);
  const KvResult gpu = run_kv_gpu(c, h);
  const KvResult ref = run_kv_cpu(c, h, Impl::reference);
  const KvResult base = run_kv_cpu(c, h, Impl::baseline);
  EXPECT_EQ(count_nan(gpu.out), 0) << "output elements unwritten";
  EXPECT_EQ(count_nan(gpu.lse), 0) << "LSE elements unwritten";
  // The append (rotary included) is exact arithmetic shared with the CPU: bit-identical caches.
  EXPECT_EQ(max_abs_diff(gpu.k_cache, ref.k_cache), 0.0) << "k_cache after append";
  EXPECT_EQ(max_abs_diff(gpu.v_cache, ref.v_cache), 0.0) << "v_cache after append";
  EXPECT_TRUE(accuracy_rule(gpu.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(gpu.lse, base.lse, ref.lse)) << "lse";
}

TEST(GpuKvCache, AppendAndAttend) {
  FP_SKIP_WITHOUT_GPU();
  KvCase c;
  expect_kvcache_accurate(c);
  c.sq = 5, c.s_new = 5, c.causal = true, c.dtype = DType::f16;
  expect_kvcache_accurate(c);
  c.s_new = 0;  // attention over the cache only
  expect_kvcache_accurate(c);
}

TEST(GpuKvCache, Rotary) {
  FP_SKIP_WITHOUT_GPU();
  for (bool interleaved : {true, false}) {
    for (int64_t rot : {64, 32}) {
      KvCase c;
      c.rotary_dim = rot, c.interleaved = interleaved;
      c.sq = 3, c.s_new = 3;
      expect_kvcache_accurate(c);  // q at cache_seqlens for every query
      c.causal = true;             // q at cache_seqlens + i
      expect_kvcache_accurate(c);
    }
  }
}

TEST(GpuKvCache, BatchIndexLeftPadAndGqa) {
  FP_SKIP_WITHOUT_GPU();
  KvCase c;
  c.b = 3, c.hq = 7, c.hk = 1, c.cache_lens = {0, 250, 31}, c.s_new = 2, c.sq = 2;
  c.batch_idx = true;
  expect_kvcache_accurate(c);
  c.leftpad = {0, 100, 30};
  c.causal = true;
  c.rotary_dim = 16;
  expect_kvcache_accurate(c);
  c.d = 128, c.hq = 8, c.hk = 2, c.wl = 40;
  expect_kvcache_accurate(c);
}

TEST(GpuKvCache, PagedCache) {
  FP_SKIP_WITHOUT_GPU();
  for (int64_t page : {1, 16, 256}) {
    KvCase c;
    c.page = page, c.s_cache = 512, c.cache_lens = {7, 400}, c.s_new = 4, c.sq = 4, c.causal = true;
    c.rotary_dim = 64, c.interleaved = false;
    SCOPED_TRACE("page " + std::to_string(page));
    expect_kvcache_accurate(c);
  }
}

TEST(GpuKvCache, SplitCounts) {
  FP_SKIP_WITHOUT_GPU();
  for (int splits : {0, 1, 3, 16, 128}) {  // 128: the most a call may ask for
    KvCase c;
    c.b = 1, c.hq = 8, c.hk = 1, c.d = 128, c.s_cache = 2048, c.cache_lens = {1999}, c.num_splits = splits;
    expect_kvcache_accurate(c);
    c.cache_lens = {0};  // everything but the appended token empty: most splits see no key
    expect_kvcache_accurate(c);
  }
}

/// Device-resident cache_seqlens / cache_leftpad are not validated by the core: bad entries must skip
/// the append and read as empty or clamped sequences, never touch memory outside the cache.
TEST(GpuKvCacheSmall, InvalidDeviceSeqlensStayInBounds) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "host-resident indices are validated by the core";
  KvCase c;
  c.cache_lens = {-3, 9999};
  c.leftpad = {-1, 5};
  c.rotary_dim = 32;
  const KvHost h = make_kv_inputs(c);
  const KvResult gpu = run_kv_gpu(c, h);
  EXPECT_EQ(count_nan(gpu.out), 0);
  EXPECT_EQ(max_abs_diff(gpu.k_cache, h.k_cache), 0.0) << "nothing may be appended";
  EXPECT_EQ(max_abs_diff(gpu.v_cache, h.v_cache), 0.0) << "nothing may be appended";
  expect_device_fault({"cache_seqlens", "cache_leftpad"}, "entry ");
}

}  // namespace
}  // namespace flashport::test::gpu
