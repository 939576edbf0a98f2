// The CDNA KV-cache update (kernels/hip/kvcache_append.hpp) and the CDNA forward over the updated cache,
// on the CPU wave64 model, against the CPU backend's forward_kvcache on the same inputs: the caches after
// the append must be bit-identical (rotary included: the same core rules and conversions), out and LSE
// must pass the accuracy rule. The model run takes exactly the problem block the core builds for a
// backend (core::build_kvcache) and launches what a HIP backend would: kv_append, rotate_q into a dense
// scratch, then the forward with q replaced by the scratch (the CUDA launcher's sequence).
#include <gtest/gtest.h>

#include "common/kvcache_case.hpp"
#include "core/attn_validate.hpp"
#include "core/check.hpp"
#include "hip/kvcache_append.hpp"
#include "hip_model_forward.hpp"

namespace flashport::test {
namespace {

/// What a HIP backend would launch for the problem: kv_append (when appending), rotate_q into a dense
/// (b, sq, hq, d) scratch (with rotary), then the forward reading q from the scratch, split into
/// c.num_splits as given (0 or 1: not split).
KvResult run_model(const KvCase& c, const KvInputs& inputs) {
  KvInputs in = inputs;
  KvResult r = poisoned_kv_result(c);
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
  hipmodel::forward(attn, true, 0, c.num_splits);
  r.k_cache = in.k_cache, r.v_cache = in.v_cache;
  return r;
}

void expect_kvcache_accurate(const KvCase& c) {
  SCOPED_TRACE(c.describe());
  const KvInputs in = make_kv_inputs(c);
  const KvResult got = run_model(c, in);
  const KvResult ref = run_kv_cpu(c, in, Impl::reference);
  const KvResult base = run_kv_cpu(c, in, Impl::baseline);
  // The append (rotary included) is the CPU's arithmetic, operation by operation: identical bytes.
  EXPECT_TRUE(got.k_cache.bytes == ref.k_cache.bytes) << "k_cache after append";
  EXPECT_TRUE(got.v_cache.bytes == ref.v_cache.bytes) << "v_cache after append";
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
}

TEST(HipModelKvCache, AppendAndAttend) {
  for (const KvCase& c : kv_append_cases()) expect_kvcache_accurate(c);
}

TEST(HipModelKvCache, RotaryBothStyles) {
  for (const KvCase& c : kv_rotary_cases(DType::f16)) expect_kvcache_accurate(c);
}

TEST(HipModelKvCache, BatchIndexLeftPadAndGqa) {
  for (const KvCase& c : kv_batch_index_leftpad_gqa_cases()) expect_kvcache_accurate(c);
}

TEST(HipModelKvCache, PagedCache) {
  for (const KvCase& c : kv_paged_cases()) expect_kvcache_accurate(c);
}

/// Split-KV over the updated cache: appends (causal, none), cache_batch_idx with an empty sequence,
/// left padding with rotary, GQA with a window, a paged cache; 8 splits of a 300-slot cache's 5 key
/// tiles leave splits without tiles (the backend would cap them at 5).
TEST(HipModelKvCache, SplitKv) {
  std::vector<KvCase> cases = kv_append_cases();
  for (const KvCase& c : kv_batch_index_leftpad_gqa_cases()) cases.push_back(c);
  cases.push_back(kv_paged_cases()[1]);
  for (KvCase c : cases) {
    for (int splits : {3, 8}) {
      c.num_splits = splits;
      expect_kvcache_accurate(c);
    }
  }
}

}  // namespace
}  // namespace flashport::test
