// The fp32 forward on CUDA (kernels/cuda/attn_fwd_f32.cu, exact fp32 on the CUDA cores) against the CPU
// oracle by SPEC's rule with an fp32 baseline: the awkward shapes times every score feature, each
// head-dim bucket with d != dv, varlen with empty sequences, paged K/V, a KV cache read through
// cache_batch_idx, unaligned rows, outputs poisoned so an unwritten element fails. Runs on a GPU and
// under the kernel emulator (tests/gpu/emu).
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuForwardF32, AwkwardShapesTimesFeatures) {
  FP_SKIP_WITHOUT_GPU();
  size_t n = 0;
  for (const Shape& s : kAwkwardShapes) {
    const Features& f = kFeatures[n++ % std::size(kFeatures)];
    SCOPED_TRACE(f.name);
    expect_forward_accurate(with(dense(DType::f32, s.b, s.sq, s.sk, s.hq, s.hk, s.d_cuda), f));
  }
}

TEST(GpuForwardF32, EveryBucketAndDvUnlikeD) {
  FP_SKIP_WITHOUT_GPU();
  // Buckets 64, 128, 256 (the call takes the smallest holding max(d, dv)); dv != d on each.
  const std::pair<int64_t, int64_t> dims[] = {{8, 8}, {64, 32}, {96, 128}, {200, 256}, {256, 136}};
  int n = 0;
  for (auto [d, dv] : dims) {
    Case c = dense(DType::f32, 2, 45, 70, 4, 2, d, dv);  // GQA 2:1
    c.causal = (n++ % 2) == 0;
    expect_forward_accurate(c);
  }
}

TEST(GpuForwardF32, VarlenPagedAndUnaligned) {
  FP_SKIP_WITHOUT_GPU();
  const VarlenLens& e = kEmptySequences;
  Case v = varlen(dense(DType::f32, 1, 1, 1, 6, 2, 64), e.q, e.k);
  v.used_k = e.used_k;
  expect_forward_accurate(with(v, kCausal));
  expect_forward_accurate(with(varlen(dense(DType::f32, 1, 1, 1, 2, 1, 128), e.q, e.k), kAll));
  expect_forward_accurate(with(paged(dense(DType::f32, 2, 7, 0, 4, 1, 96), 5, {61, 3}), kCausal));
  expect_forward_accurate(paged(dense(DType::f32, 2, 40, 0, 2, 2, 64), 16, {100, 33}));
  Case u = dense(DType::f32, 2, 33, 50, 2, 1, 40);  // rows not 16-byte aligned: scalar K/V loads
  u.pad = 1;
  expect_forward_accurate(with(u, kWindow));
}

TEST(GpuForwardF32, KvCacheReadsAndRefusesAppend) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "the CPU backend appends to fp32 caches";
  const int64_t b = 2, rows = 3, cap = 40, hq = 4, hk = 2, d = 64;
  const HostTensor q = randn(DType::f32, {b, 1, hq, d}), kc = randn(DType::f32, {rows, cap, hk, d}),
                   vc = randn(DType::f32, {rows, cap, hk, d}), lens = int_tensor({17, 40}),
                   idx = int_tensor({2, 0});
  const DeviceTensor dq = DeviceTensor::from(q), dk = DeviceTensor::from(kc), dv = DeviceTensor::from(vc);
  const DeviceTensor dl = DeviceTensor::from(lens), di = DeviceTensor::from(idx);
  HostTensor out_host(DType::f32, {b, 1, hq, d});
  const DeviceTensor out = DeviceTensor::poisoned(out_host);
  KvCacheArgs a;
  a.q = dq.view(), a.k_cache = dk.view(), a.v_cache = dv.view(), a.out = out.view();
  a.cache_seqlens = dl.view(), a.cache_batch_idx = di.view();
  forward_kvcache(a);
  const HostTensor got = out.to_host(out_host);
  EXPECT_EQ(count_nan(got), 0);
  // The same call on the CPU backend (host copies) is the oracle here.
  HostTensor want(DType::f32, {b, 1, hq, d});
  KvCacheArgs h;
  h.q = q, h.k_cache = kc, h.v_cache = vc, h.out = want, h.cache_seqlens = lens, h.cache_batch_idx = idx;
  forward_kvcache(h);
  EXPECT_LE(max_abs_diff(got, want), 1e-5);
  const HostTensor kn = randn(DType::f32, {b, 1, hk, d});
  const DeviceTensor dkn = DeviceTensor::from(kn), dvn = DeviceTensor::from(kn);
  a.k_new = dkn.view(), a.v_new = dvn.view();
  try {
    forward_kvcache(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(std::string(err.argument()), "k_new");
    EXPECT_NE(std::string(err.what()).find("fp32 KV cache"), std::string::npos) << err.what();
  }
}

TEST(GpuForwardF32, BackwardIsRefusedByName) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "the CPU backend differentiates fp32";
  const HostTensor q = randn(DType::f32, {1, 8, 2, 64}), o(DType::f32, {1, 8, 2, 64}),
                   lse(DType::f32, {1, 2, 8});
  const DeviceTensor dq = DeviceTensor::from(q), dout = DeviceTensor::from(o), dlse = DeviceTensor::from(lse);
  const DeviceTensor g1 = DeviceTensor::from(o), g2 = DeviceTensor::from(o), g3 = DeviceTensor::from(o);
  BackwardArgs a;
  a.q = dq.view(), a.k = dq.view(), a.v = dq.view(), a.out = dout.view(), a.dout = dout.view();
  a.lse = dlse.view(), a.dq = g1.view(), a.dk = g2.view(), a.dv = g3.view();
  try {
    backward(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("fp32"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace flashport::test::gpu
