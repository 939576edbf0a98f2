// KV-cache problems shared by the CUDA (tests/gpu/test_fwd_kvcache.cpp) and CDNA model
// (tests/hip/test_hip_kvcache.cpp) suites: one case description, its fresh host inputs, the public
// call's arguments over them, and the CPU run both suites judge against. Each harness adds its own
// run (device copies, or the kernels on the wave64 model).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.hpp"

namespace flashport::test {

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
  int num_splits = 0;  // KvCacheArgs::num_splits (0: the backend's heuristic)
  std::string describe() const {
    std::ostringstream s;
    s << dtype_name(dtype) << " b=" << b << " sq=" << sq << " s_new=" << s_new << " hq=" << hq << " hk=" << hk
      << " d=" << d << " s_cache=" << s_cache << " page=" << page << " batch_idx=" << batch_idx
      << " leftpad=" << !leftpad.empty() << " rotary=" << rotary_dim << (interleaved ? "i" : "n")
      << " causal=" << causal << " wl=" << wl << " splits=" << num_splits;
    return s.str();
  }
};

struct KvInputs {
  HostTensor q, k_cache, v_cache, k_new, v_new, seqlens, batch_idx, leftpad, block_table, cos, sin;
};

/// Fresh inputs for `c`. Paged: a shuffled block table over a pool with two blocks no sequence uses.
inline KvInputs make_kv_inputs(const KvCase& c) {
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
      for (int64_t i = 0; i < c.b; ++i) idx.push_back((int32_t)(c.b - i));  // reversed, row 0 unused
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

/// out and LSE shaped for `c`, caches empty (filled from the inputs after a run).
inline KvResult empty_kv_result(const KvCase& c) {
  return {HostTensor(c.dtype, {c.b, c.sq, c.hq, c.d}), HostTensor(DType::f32, {c.b, c.hq, c.sq}), {}, {}};
}

/// The same with out and LSE poisoned, so that an unwritten element cannot pass a comparison.
inline KvResult poisoned_kv_result(const KvCase& c) {
  KvResult r = empty_kv_result(c);
  poison(r.out);
  poison(r.lse);
  return r;
}

/// The arguments over the views `t` gives of `in`'s members (the host tensors themselves, or device
/// copies of them); out and LSE are left to the caller.
inline KvCacheArgs kv_args(const KvCase& c, const KvInputs& in,
                           const std::function<TensorView(const HostTensor&)>& t) {
  KvCacheArgs a;
  a.q = t(in.q), a.k_cache = t(in.k_cache), a.v_cache = t(in.v_cache);
  if (c.s_new > 0) a.k_new = t(in.k_new), a.v_new = t(in.v_new);
  a.cache_seqlens = t(in.seqlens);
  if (c.batch_idx) a.cache_batch_idx = t(in.batch_idx);
  if (!c.leftpad.empty()) a.cache_leftpad = t(in.leftpad);
  if (c.page > 0) a.block_table = t(in.block_table);
  if (c.rotary_dim > 0) a.rotary_cos = t(in.cos), a.rotary_sin = t(in.sin);
  a.rotary_interleaved = c.interleaved;
  a.num_splits = c.num_splits;
  a.options.causal = c.causal;
  a.options.window_left = c.wl;
  return a;
}

/// The arguments over `in`'s host tensors (a call appends into its caches), writing into `r`'s out
/// and LSE.
inline KvCacheArgs kv_args(const KvCase& c, const KvInputs& in, KvResult& r) {
  KvCacheArgs a = kv_args(c, in, [](const HostTensor& x) { return x.view(); });
  a.out = r.out, a.lse = r.lse.view();
  return a;
}

/// The CPU backend's forward_kvcache (`impl`: the oracle or the baseline), on a copy of `inputs` so
/// that every run appends into the same caches.
inline KvResult run_kv_cpu(const KvCase& c, const KvInputs& inputs, Impl impl) {
  KvInputs in = inputs;
  KvResult r = poisoned_kv_result(c);
  KvCacheArgs a = kv_args(c, in, r);
  a.impl = impl;
  forward_kvcache(a);
  r.k_cache = in.k_cache, r.v_cache = in.v_cache;
  return r;
}

// The case lists both suites run, one list a test; a suite adds cases only it can check (the CUDA
// split counts and device-resident index guards).

/// One appended token, then five with causal masking in f16, then attention over the cache alone.
inline std::vector<KvCase> kv_append_cases() {
  std::vector<KvCase> cs;
  KvCase c;
  cs.push_back(c);
  c.sq = 5, c.s_new = 5, c.causal = true, c.dtype = DType::f16;
  cs.push_back(c);
  c.s_new = 0;  // nothing appended
  cs.push_back(c);
  return cs;
}

/// Both rotary styles at full and half the head dimension, non-causal (q rotated at cache_seqlens for
/// every query) then causal (at cache_seqlens + i) in `causal_dtype`.
inline std::vector<KvCase> kv_rotary_cases(DType causal_dtype) {
  std::vector<KvCase> cs;
  for (bool interleaved : {true, false}) {
    for (int64_t rot : {64, 32}) {
      KvCase c;
      c.rotary_dim = rot, c.interleaved = interleaved;
      c.sq = 3, c.s_new = 3;
      cs.push_back(c);
      c.causal = true, c.dtype = causal_dtype;
      cs.push_back(c);
    }
  }
  return cs;
}

/// cache_batch_idx with an empty sequence and GQA, then left padding with causal rotary, then d = 128
/// with a sliding window.
inline std::vector<KvCase> kv_batch_index_leftpad_gqa_cases() {
  std::vector<KvCase> cs;
  KvCase c;
  c.b = 3, c.hq = 7, c.hk = 1, c.cache_lens = {0, 250, 31}, c.s_new = 2, c.sq = 2;
  c.batch_idx = true;
  cs.push_back(c);
  c.leftpad = {0, 100, 30};
  c.causal = true;
  c.rotary_dim = 16;
  cs.push_back(c);
  c.d = 128, c.hq = 8, c.hk = 2, c.wl = 40;
  cs.push_back(c);
  return cs;
}

/// Paged caches (pages of 1, 16 and 256 rows), causal with rotary.
inline std::vector<KvCase> kv_paged_cases() {
  std::vector<KvCase> cs;
  for (int64_t page : {1, 16, 256}) {
    KvCase c;
    c.page = page, c.s_cache = 512, c.cache_lens = {7, 400}, c.s_new = 4, c.sq = 4, c.causal = true;
    c.rotary_dim = 64, c.interleaved = false;
    cs.push_back(c);
  }
  return cs;
}

}  // namespace flashport::test
