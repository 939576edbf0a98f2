// KV-cache calls on device copies of a KvCase's inputs (common/kvcache_case.hpp), judged against the CPU
// backend: the kv-cache suite (test_fwd_kvcache.cpp) runs the public forward_kvcache, the Hopper suite
// (test_hopper_fwd.cpp) its kernel on the problem that call builds.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "common/kvcache_case.hpp"
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {

/// What runs a kv-cache call on its (device) arguments.
using KvRun = std::function<void(KvCacheArgs&)>;

/// `run` on the arguments over device copies of `h`, out and LSE poisoned; returns out, LSE and both caches
/// as they are afterwards.
inline KvResult run_kv_gpu(const KvCase& c, const KvInputs& h, const KvRun& run) {
  std::vector<std::pair<const HostTensor*, DeviceTensor>> dev;
  dev.reserve(16);
  auto to_dev = [&](const HostTensor& x) {
    dev.emplace_back(&x, DeviceTensor::from(x));
    return dev.back().second.view();
  };
  KvCacheArgs a = kv_args(c, h, to_dev);
  KvResult r = empty_kv_result(c);
  const DeviceTensor out = DeviceTensor::poisoned(r.out), lse = DeviceTensor::poisoned(r.lse);
  a.out = out.view(), a.lse = lse.view();
  run(a);
  r.out = out.to_host(r.out), r.lse = lse.to_host(r.lse);
  for (const auto& [host, d] : dev) {
    if (host == &h.k_cache) r.k_cache = d.to_host(h.k_cache);
    if (host == &h.v_cache) r.v_cache = d.to_host(h.v_cache);
  }
  return r;
}
inline KvResult run_kv_gpu(const KvCase& c, const KvInputs& h) {
  return run_kv_gpu(c, h, [](KvCacheArgs& a) { forward_kvcache(a); });
}

/// `run`'s result for fresh inputs of `c` against the CPU backend's forward_kvcache: no output element
/// unwritten, caches bit-identical (the append, rotary included, is exact arithmetic shared with the CPU),
/// out and LSE by the accuracy rule.
inline void expect_kvcache_accurate(const KvCase& c, const KvRun& run) {
  SCOPED_TRACE(c.describe());
  const KvInputs h = make_kv_inputs(c);
  const KvResult gpu = run_kv_gpu(c, h, run);
  const KvResult ref = run_kv_cpu(c, h, Impl::reference);
  const KvResult base = run_kv_cpu(c, h, Impl::baseline);
  EXPECT_EQ(count_nan(gpu.out), 0) << "output elements unwritten";
  EXPECT_EQ(count_nan(gpu.lse), 0) << "LSE elements unwritten";
  EXPECT_EQ(max_abs_diff(gpu.k_cache, ref.k_cache), 0.0) << "k_cache after append";
  EXPECT_EQ(max_abs_diff(gpu.v_cache, ref.v_cache), 0.0) << "v_cache after append";
  EXPECT_TRUE(accuracy_rule(gpu.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(gpu.lse, base.lse, ref.lse)) << "lse";
}
inline void expect_kvcache_accurate(const KvCase& c) {
  expect_kvcache_accurate(c, [](KvCacheArgs& a) { forward_kvcache(a); });
}

}  // namespace flashport::test::gpu
