// The CDNA KV-cache update (kernels/hip/kvcache_append.hpp) and the CDNA forward over the updated cache,
// on the CPU wave64 model, against the CPU backend's forward_kvcache on the same inputs: the caches after
// the append must be bit-identical (rotary included: the same core rules and conversions), out and LSE
// must pass the accuracy rule. The model run takes exactly the problem block the core builds for a
// backend (core::build_kvcache) and launches what a HIP backend would: kv_append, rotate_q into a dense
// scratch, then the forward with q replaced by the scratch (the CUDA launcher's sequence).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <sstream>

#include "common/test_util.hpp"
#include "core/attn_validate.hpp"
#include "core/check.hpp"
#include "hip/kvcache_append.hpp"
#include "hip_model_forward.hpp"

namespace flashport::test {
namespace {

struct KvCase {
  DType dtype = DType::bf16;
  int64_t b = 2, sq = 1, s_new = 1, hq = 4, hk = 1, d = 64, s_cache = 300;
  std::vector<int32_t> cache_lens{10, 200};  // per batch entry, before the append
  int64_t page = 0;                          // > 0: paged cache (s_cache a multiple of it)
  bool batch_idx = false;                    // cache rows through cache_batch_idx (reversed, row 0 unused)
  std::vector<int32_t> leftpad;              // empty: none
  int64_t rotary_dim = 0;
  bool interleaved = true;
  bool causal = false;
  int64_t wl = -1;
  std::string describe() const {
    std::ostringstream s;
    s << dtype_name(dtype) << " b=" << b << " sq=" << sq << " s_new=" << s_new << " hq=" << hq << " hk=" << hk
      << " d=" << d << " s_cache=" << s_cache << " page=" << page << " batch_idx=" << batch_idx
      << " leftpad=" << !leftpad.empty() << " rotary=" << rotary_dim << (interleaved ? "i" : "n")
      << " causal=" << causal << " wl=" << wl;
    return s.str();
  }
};

struct KvInputs {
  HostTensor q, k_cache, v_cache, k_new, v_new, seqlens, batch_idx, leftpad, block_table, cos, sin;
};

KvInputs make_inputs(const KvCase& c) {
  KvInputs in;
  in.q = randn(c.dtype, {c.b, c.sq, c.hq, c.d});
  if (c.page > 0) {
    const int64_t per_seq = c.s_cache / c.page, blocks = c.b * per_seq + 2;
    in.k_cache = randn(c.dtype, {blocks, c.page, c.hk, c.d});
    in.v_cache = randn(c.dtype, {blocks, c.page, c.hk, c.d});
    std::vector<int32_t> ids((size_t)blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    in.block_table = HostTensor(DType::i32, {c.b, per_seq});
    std::copy(ids.begin(), ids.begin() + c.b * per_seq, in.block_table.i32());
  } else {
    const int64_t rows = c.batch_idx ? c.b + 1 : c.b;
    in.k_cache = randn(c.dtype, {rows, c.s_cache, c.hk, c.d});
    in.v_cache = randn(c.dtype, {rows, c.s_cache, c.hk, c.d});
    if (c.batch_idx) {
      std::vector<int32_t> idx;
      for (int64_t i = 0; i < c.b; ++i) idx.push_back((int32_t)(c.b - i));
      in.batch_idx = int_tensor(idx);
    }
  }
  if (c.s_new > 0) {
    in.k_new = randn(c.dtype, {c.b, c.s_new, c.hk, c.d});
    in.v_new = randn(c.dtype, {c.b, c.s_new, c.hk, c.d});
  }
  in.seqlens = int_tensor(c.cache_lens);
  if (!c.leftpad.empty()) in.leftpad = int_tensor(c.leftpad);
  if (c.rotary_dim > 0) {
    const int64_t max_pos = c.s_cache + c.sq + c.s_new, half = c.rotary_dim / 2;
    in.cos = HostTensor(c.dtype, {max_pos, half});
    in.sin = HostTensor(c.dtype, {max_pos, half});
    for (int64_t p = 0; p < max_pos; ++p)
      for (int64_t f = 0; f < half; ++f) {
        const double theta = (double)p * std::pow(10000.0, -2.0 * (double)f / (double)c.rotary_dim);
        in.cos.set(p * half + f, std::cos(theta));
        in.sin.set(p * half + f, std::sin(theta));
      }
  }
  return in;
}

struct KvResult {
  HostTensor out, lse, k_cache, v_cache;
};

/// The arguments over `in` (whose caches the call appends to) writing into `r`'s out and LSE.
KvCacheArgs kv_args(const KvCase& c, KvInputs& in, KvResult& r) {
  KvCacheArgs a;
  a.q = in.q, a.k_cache = in.k_cache, a.v_cache = in.v_cache;
  if (c.s_new > 0) a.k_new = in.k_new.view(), a.v_new = in.v_new.view();
  a.cache_seqlens = in.seqlens.view();
  if (c.batch_idx) a.cache_batch_idx = in.batch_idx.view();
  if (!c.leftpad.empty()) a.cache_leftpad = in.leftpad.view();
  if (c.page > 0) a.block_table = in.block_table.view();
  if (c.rotary_dim > 0) a.rotary_cos = in.cos.view(), a.rotary_sin = in.sin.view();
  a.rotary_interleaved = c.interleaved;
  a.options.causal = c.causal;
  a.options.window_left = c.wl;
  a.out = r.out, a.lse = r.lse.view();
  return a;
}

KvResult poisoned_result(const KvCase& c) {
  KvResult r{HostTensor(c.dtype, {c.b, c.sq, c.hq, c.d}), HostTensor(DType::f32, {c.b, c.hq, c.sq}), {}, {}};
  poison(r.out);
  poison(r.lse);
  return r;
}

KvResult run_cpu(const KvCase& c, const KvInputs& inputs, Impl impl) {
  KvInputs in = inputs;  // the append writes into this copy's caches
  KvResult r = poisoned_result(c);
  KvCacheArgs a = kv_args(c, in, r);
  a.impl = impl;
  forward_kvcache(a);
  r.k_cache = in.k_cache, r.v_cache = in.v_cache;
  return r;
}

/// What a HIP backend would launch for the problem: kv_append (when appending), rotate_q into a dense
/// (b, sq, hq, d) scratch (with rotary), then the forward reading q from the scratch.
KvResult run_model(const KvCase& c, const KvInputs& inputs) {
  KvInputs in = inputs;
  KvResult r = poisoned_result(c);
  core::begin_call(nullptr);
  const core::KvCacheProblem kp = core::build_kvcache(kv_args(c, in, r));
  amd::KvAppendParams prm = core::append_params(kp);
  const AttnProblem& a = kp.attn;
  auto blocks = [](int64_t rows) {
    return wave::model::Dim3{(unsigned)((rows + amd::kKvWaves - 1) / amd::kKvWaves), 1, 1};
  };
  if (kp.k_new.ptr && kp.s_new > 0)
    wave::model::launch(blocks(a.batch * kp.s_new * a.hk), amd::kKvThreads, 0,
                        [&](unsigned char*) { amd::kv::append(prm); });
  AttnProblem attn = a;
  HostTensor q_rot(c.dtype, {c.b, c.sq, c.hq, c.d});
  if (kp.rotary_dim > 0) {
    poison(q_rot);
    prm.q_rot = q_rot.tv.data;
    wave::model::launch(blocks(a.batch * a.sq * a.hq), amd::kKvThreads, 0,
                        [&](unsigned char*) { amd::kv::rotate_q(prm); });
    attn.q = {q_rot.tv.data, a.sq * a.hq * a.d, a.hq * a.d, a.d};
  }
  hipmodel::forward(attn);
  r.k_cache = in.k_cache, r.v_cache = in.v_cache;
  return r;
}

void expect_kvcache_accurate(const KvCase& c) {
  SCOPED_TRACE(c.describe());
  const KvInputs in = make_inputs(c);
  const KvResult got = run_model(c, in);
  const KvResult ref = run_cpu(c, in, Impl::reference);
  const KvResult base = run_cpu(c, in, Impl::baseline);
  // The append (rotary included) is the CPU's arithmetic, operation by operation: identical bytes.
  EXPECT_TRUE(got.k_cache.bytes == ref.k_cache.bytes) << "k_cache after append";
  EXPECT_TRUE(got.v_cache.bytes == ref.v_cache.bytes) << "v_cache after append";
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
}

TEST(HipModelKvCache, AppendAndAttend) {
  KvCase c;
  expect_kvcache_accurate(c);
  c.sq = 5, c.s_new = 5, c.causal = true, c.dtype = DType::f16;
  expect_kvcache_accurate(c);
  c.s_new = 0;  // attention over the cache only: nothing appended
  expect_kvcache_accurate(c);
}

TEST(HipModelKvCache, RotaryBothStyles) {
  for (bool interleaved : {true, false}) {
    for (int64_t rot : {64, 32}) {
      KvCase c;
      c.rotary_dim = rot, c.interleaved = interleaved;
      c.sq = 3, c.s_new = 3;
      expect_kvcache_accurate(c);  // q at cache_seqlens for every query
      c.causal = true;             // q at cache_seqlens + i
      c.dtype = DType::f16;
      expect_kvcache_accurate(c);
    }
  }
}

TEST(HipModelKvCache, BatchIndexLeftPadAndGqa) {
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

TEST(HipModelKvCache, PagedCache) {
  for (int64_t page : {1, 16, 256}) {
    KvCase c;
    c.page = page, c.s_cache = 512, c.cache_lens = {7, 400}, c.s_new = 4, c.sq = 4, c.causal = true;
    c.rotary_dim = 64, c.interleaved = false;
    SCOPED_TRACE("page " + std::to_string(page));
    expect_kvcache_accurate(c);
  }
}

}  // namespace
}  // namespace flashport::test
