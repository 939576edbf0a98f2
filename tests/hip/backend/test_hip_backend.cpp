// The HIP backend end to end through the public API: tensors on DeviceType::hip, libamdhip64 replaced by
// tests/hip/backend/fake_hip_runtime.cpp (FLASHPORT_HIP_RUNTIME), which checks each code object and launch as
// a GPU would and runs the kernel on the CPU wave64 model. What this covers that the model tests do not:
// loading the runtime, the device's architecture and its code object, the variant a call picks, the
// parameters, grids and workspaces of each launch, and the errors of what the backend refuses.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/cases.hpp"
#include "common/device_fault.hpp"
#include "common/kvcache_case.hpp"
#include "cpu/test_fast_util.hpp"
#include "flashport/attention.hpp"
#include "flashport/error.hpp"
#include "hip/hip_fp8_inputs.hpp"
#include "hip/hip_grad_oracle.hpp"

namespace flashport::test {
namespace {

constexpr Device kHip0{DeviceType::hip, 0};

/// Launches of `entry` the fake runtime ran (its test hook; the backend loads the same library, so
/// before the first call nothing has run). -1: the hook is missing (not the fake runtime).
int launches(const char* entry) {
  const char* path = std::getenv("FLASHPORT_HIP_RUNTIME");
  void* handle = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (!handle) return 0;
  auto hook = reinterpret_cast<int (*)(const char*)>(dlsym(handle, "fake_hip_launches"));
  return hook ? hook(entry) : -1;
}

/// Grid dimension `dim` of the last launch of `entry` on the fake runtime (its test hook; 0 if none).
unsigned last_grid(const char* entry, int dim) {
  const char* path = std::getenv("FLASHPORT_HIP_RUNTIME");
  void* handle = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto hook = handle ? reinterpret_cast<unsigned (*)(const char*, int)>(dlsym(handle, "fake_hip_last_grid"))
                     : nullptr;
  return hook ? hook(entry, dim) : 0u;
}

/// Forward launches of either entry: attn_fwd, or attn_fwd_split where the call was split.
int forward_launches() {
  return launches("attn_fwd") + launches("attn_fwd_split");
}

void on(HostTensor& t, Device dev) {
  t.tv.device = dev;
}
void on(fastcheck::Inputs& in, Device dev) {
  for (HostTensor* t : {&in.q, &in.k, &in.v, &in.alibi, &in.cu_q, &in.cu_k, &in.used_k, &in.block_table})
    on(*t, dev);
}

/// Out and LSE of `c` through flashport::forward on hip:`dev.index` (the fake runtime).
fastcheck::Forward run_hip(const Case& c, fastcheck::Inputs in, Device dev = kHip0) {
  on(in, dev);
  fastcheck::Forward f{HostTensor(c.dtype, out_shape(c)), HostTensor(DType::f32, lse_shape(c))};
  poison(f.out);
  poison(f.lse);
  on(f.out, dev);
  on(f.lse, dev);
  ForwardArgs a;
  a.q = in.q, a.k = in.k, a.v = in.v, a.out = f.out;
  a.lse = f.lse.view();
  a.options = fastcheck::options(c, in);
  a.layout = fastcheck::layout(c, in);
  forward(a);
  on(f.out, Device{});
  on(f.lse, Device{});
  return f;
}

/// The forward of `c` on hip:0 against the CPU by SPEC's rule: one forward launch, and a combine after
/// it exactly when it was split. `split`: whether the call must (1) or must not (0) be split, -1 either.
void expect_matches_cpu(const Case& c, int split = -1) {
  SCOPED_TRACE(c.describe());
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const int before = forward_launches(), splits = launches("attn_fwd_split"),
            combines = launches("split_combine");
  const fastcheck::Forward got = run_hip(c, in);
  EXPECT_EQ(forward_launches(), before + 1) << "one forward launch on the fake runtime";
  const int split_now = launches("attn_fwd_split") - splits;
  EXPECT_EQ(launches("split_combine") - combines, split_now) << "split_combine follows attn_fwd_split";
  if (split >= 0) EXPECT_EQ(split_now, split) << "split-KV chosen";
  const fastcheck::Forward ref = fastcheck::run_forward(c, in, Impl::reference);
  const fastcheck::Forward base = fastcheck::run_forward(c, in, Impl::baseline);
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
}

TEST(HipBackend, ForwardShapesAndMasks) {
  Case c = dense(DType::bf16, 1, 113, 203, 2, 2, 64, 64);
  c.causal = true;
  expect_matches_cpu(c);
  c = dense(DType::f16, 2, 77, 20, 7, 1, 72, 72);  // sq > sk causal, GQA 7:1, bucket 96
  c.causal = true;
  expect_matches_cpu(c);
  c = dense(DType::bf16, 1, 1, 300, 4, 2, 256, 256);  // decode-like, the largest bucket
  c.softcap = 30.0;
  c.wl = 100, c.wr = 0;
  expect_matches_cpu(c);
}

TEST(HipBackend, VarlenAndPaged) {
  Case c = varlen(dense(DType::bf16, 1, 1, 1, 4, 2, 128), {17, 0, 64, 5}, {30, 0, 64, 90});
  c.causal = true;
  expect_matches_cpu(c);
  Case p;
  p.dtype = DType::f16, p.layout = Layout::paged, p.hq = 4, p.hk = 4, p.d = p.dv = 64;
  p.q_lens = {9, 9}, p.k_lens = {130, 130}, p.page = 16, p.used_k = {40, 130};
  expect_matches_cpu(p);
}

TEST(HipBackend, DropoutPicksTheDropoutVariant) {
  Case c = dense(DType::bf16, 2, 33, 70, 4, 2, 64, 64);
  c.dropout = 0.17;
  expect_matches_cpu(c);
  // No dropout code object for bucket 32: refused before any launch, naming the reason.
  Case d32 = dense(DType::bf16, 1, 8, 8, 2, 2, 32, 32);
  d32.dropout = 0.5;
  const int before = forward_launches();
  EXPECT_THROW(
      {
        try {
          run_hip(d32, fastcheck::make_inputs(d32));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("dropout on AMD"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_EQ(forward_launches(), before);
}

TEST(HipBackend, GridLimitsAreRefusedByName) {
  // 65536 sequences: grid z past amd::kMaxGridYZ (no batch chunking on AMD). Refused before any launch.
  const Case c = dense(DType::bf16, 65536, 1, 1, 1, 1, 8, 8);
  const int before = forward_launches();
  EXPECT_THROW(
      {
        try {
          run_hip(c, fastcheck::make_inputs(c));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("65535 sequences and query heads on AMD"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  EXPECT_EQ(forward_launches(), before);
}

/// Out (dtype `out`) and LSE of an fp8 case through flashport::forward on hip:0.
fastcheck::Forward run_hip_fp8(const Case& c, fp8check::Inputs in, DType out) {
  on(in.fp8, kHip0);
  for (HostTensor& ds : in.descale) on(ds, kHip0);
  fastcheck::Forward f = fp8check::outputs(c, out);
  on(f.out, kHip0);
  on(f.lse, kHip0);
  forward(fp8check::args(c, in.fp8, in.descale, f, Impl::automatic));
  on(f.out, Device{});
  on(f.lse, Device{});
  return f;
}

/// The message of the Error `fn` throws ("" and a failure when it throws none).
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(HipBackend, Fp8ForwardPicksTheFp8Variant) {
  // The fake refuses an fp8 call on a non-fp8 object (and the reverse) by the object's marker symbol.
  const std::pair<Case, DType> cases[] = {
      {dense(DType::e4m3fnuz, 1, 113, 203, 4, 2, 128, 128), DType::bf16},
      {dense(DType::e4m3, 2, 40, 77, 2, 2, 64, 64), DType::f32},
      {dense(DType::e5m2, 1, 20, 75, 2, 1, 256, 256), DType::f16},
  };
  for (auto [c, out] : cases) {
    c.causal = out == DType::bf16;
    SCOPED_TRACE(c.describe() + " out " + dtype_name(out));
    const fp8check::Inputs in = fp8check::make(c);
    const int before = forward_launches();
    const fastcheck::Forward got = run_hip_fp8(c, in, out);
    EXPECT_EQ(forward_launches(), before + 1);
    fp8check::expect_accurate(got, c, in);
  }
}

TEST(HipBackend, Fp8RefusalsAreNamed) {
  const int before = forward_launches();
  Case d96 = dense(DType::e4m3fnuz, 1, 8, 8, 2, 2, 96, 96);  // bucket 96: no fp8 object
  EXPECT_NE(error_of([&] { run_hip_fp8(d96, fp8check::make(d96), DType::bf16); }).find("kFwdFp8Buckets"),
            std::string::npos);
  Case drop = dense(DType::e4m3fnuz, 1, 8, 8, 2, 2, 64, 64);
  drop.dropout = 0.25;
  EXPECT_NE(error_of([&] { run_hip_fp8(drop, fp8check::make(drop), DType::bf16); }).find("fp8"),
            std::string::npos);
  EXPECT_EQ(forward_launches(), before);
}

TEST(HipBackend, UnsupportedDeviceIsANamedError) {
  Case c = dense(DType::bf16, 1, 16, 16, 2, 2, 64, 64);
  try {
    run_hip(c, fastcheck::make_inputs(c), Device{DeviceType::hip, 1});  // the fake's gfx1100
    FAIL() << "an RDNA device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
    EXPECT_NE(std::string(e.what()).find("RDNA"), std::string::npos) << e.what();
  }
  try {
    run_hip(c, fastcheck::make_inputs(c), Device{DeviceType::hip, 5});
    FAIL() << "a device the runtime does not see was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not visible"), std::string::npos) << e.what();
  }
}

/// dQ, dK, dV through flashport::backward on hip:0 (after a CPU reference forward hands over O and LSE).
fastcheck::Grads backward_hip(const Case& c, fastcheck::Inputs in, const fastcheck::Forward& fwd,
                              const HostTensor& dout, bool deterministic) {
  fastcheck::Forward f = fwd;
  HostTensor dout_d = dout;
  on(in, kHip0);
  for (HostTensor* t : {&dout_d, &f.out, &f.lse}) on(*t, kHip0);
  fastcheck::Grads g{in.q, in.k, in.v};
  for (HostTensor* t : {&g.dq, &g.dk, &g.dv}) poison(*t);
  BackwardArgs a;
  a.dout = dout_d, a.q = in.q, a.k = in.k, a.v = in.v, a.out = f.out, a.lse = f.lse;
  a.dq = g.dq, a.dk = g.dk, a.dv = g.dv;
  a.options = fastcheck::options(c, in);
  a.options.deterministic = deterministic;
  a.layout = fastcheck::layout(c, in);
  backward(a);
  for (HostTensor* t : {&g.dq, &g.dk, &g.dv}) on(*t, Device{});
  return g;
}

/// The backward's three launches per call, gradients by SPEC's rule; deterministic mode bitwise
/// repeatable (the model runs blocks in a shuffled order, so the atomic path would not be).
void expect_backward_matches_cpu(const Case& c) {
  SCOPED_TRACE(c.describe());
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const fastcheck::Forward fwd = fastcheck::run_forward(c, in, Impl::reference);
  const HostTensor dout = randn(c.dtype, out_shape(c));
  const int before = launches("attn_bwd");
  const fastcheck::Grads got = backward_hip(c, in, fwd, dout, false);
  EXPECT_EQ(launches("attn_bwd"), before + 1);
  const fastcheck::Grads ref = reference_grads(c, in, fwd, dout), base = baseline_grads(c, in, dout);
  EXPECT_TRUE(accuracy_rule(got.dq, base.dq, ref.dq, 3.0)) << "dq";
  EXPECT_TRUE(accuracy_rule(got.dk, base.dk, ref.dk, 3.0)) << "dk";
  EXPECT_TRUE(accuracy_rule(got.dv, base.dv, ref.dv, 3.0)) << "dv";
  const fastcheck::Grads det1 = backward_hip(c, in, fwd, dout, true),
                         det2 = backward_hip(c, in, fwd, dout, true);
  EXPECT_TRUE(accuracy_rule(det1.dq, base.dq, ref.dq, 3.0)) << "deterministic dq";
  EXPECT_TRUE(det1.dq.bytes == det2.dq.bytes && det1.dk.bytes == det2.dk.bytes &&
              det1.dv.bytes == det2.dv.bytes)
      << "deterministic gradients differ between runs";
}

TEST(HipBackend, BackwardMatchesCpu) {
  Case c = dense(DType::bf16, 1, 113, 203, 7, 1, 64, 64);  // GQA 7:1, more keys than queries, causal
  c.causal = true;
  expect_backward_matches_cpu(c);
  Case v = varlen(dense(DType::f16, 1, 1, 1, 2, 2, 128), {40, 0, 90}, {100, 0, 30});
  v.softcap = 20.0;
  expect_backward_matches_cpu(v);
}

/// flash_attn_with_kvcache's decode step: append 3 tokens per sequence into a cache, attend causally;
/// without rotary, then with it (interleaved and not: kv_append rotates k, rotate_q a scratch copy of q).
void expect_kvcache_matches_cpu(int64_t rotary_dim, bool interleaved) {
  SCOPED_TRACE("rotary_dim " + std::to_string(rotary_dim) + (interleaved ? " interleaved" : ""));
  const int64_t b = 2, s_cache = 40, hk = 2, hq = 4, d = 64, s_new = 3;
  const DType dt = DType::bf16;
  HostTensor q = randn(dt, {b, s_new, hq, d}), k_new = randn(dt, {b, s_new, hk, d}),
             v_new = randn(dt, {b, s_new, hk, d});
  const HostTensor k_cache0 = randn(dt, {b, s_cache, hk, d}), v_cache0 = randn(dt, {b, s_cache, hk, d});
  const HostTensor seqlens = int_tensor({5, 30});
  const HostTensor cos = randn(dt, {s_cache, std::max<int64_t>(rotary_dim / 2, 1)}),
                   sin = randn(dt, {s_cache, std::max<int64_t>(rotary_dim / 2, 1)});
  struct Result {
    HostTensor out, lse, k_cache, v_cache;
  };
  auto run = [&](Device dev, Impl impl) {
    Result r{HostTensor(dt, {b, s_new, hq, d}), HostTensor(DType::f32, {b, hq, s_new}), k_cache0, v_cache0};
    poison(r.out);
    poison(r.lse);
    HostTensor q_d = q, kn = k_new, vn = v_new, sl = seqlens, c = cos, s = sin;
    for (HostTensor* t : {&q_d, &kn, &vn, &sl, &c, &s, &r.out, &r.lse, &r.k_cache, &r.v_cache}) on(*t, dev);
    KvCacheArgs a;
    a.q = q_d, a.k_cache = r.k_cache, a.v_cache = r.v_cache, a.out = r.out;
    a.k_new = kn.view(), a.v_new = vn.view(), a.cache_seqlens = sl.view(), a.lse = r.lse.view();
    a.options.causal = true;
    if (rotary_dim > 0) a.rotary_cos = c.view(), a.rotary_sin = s.view(), a.rotary_interleaved = interleaved;
    a.impl = impl;
    forward_kvcache(a);
    for (HostTensor* t : {&r.out, &r.lse, &r.k_cache, &r.v_cache}) on(*t, Device{});
    return r;
  };
  const int appends = launches("kv_append");
  const Result got = run(kHip0, Impl::automatic);
  EXPECT_EQ(launches("kv_append"), appends + 1);
  const Result ref = run(Device{}, Impl::reference), base = run(Device{}, Impl::baseline);
  EXPECT_TRUE(got.k_cache.bytes == ref.k_cache.bytes) << "k_cache after append";
  EXPECT_TRUE(got.v_cache.bytes == ref.v_cache.bytes) << "v_cache after append";
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
}

TEST(HipBackend, KvCacheAppendThenAttend) {
  const int rotations = launches("rotate_q");
  expect_kvcache_matches_cpu(0, false);
  EXPECT_EQ(launches("rotate_q"), rotations) << "no rotary: q is read in place";
  expect_kvcache_matches_cpu(32, true);
  expect_kvcache_matches_cpu(64, false);
  EXPECT_EQ(launches("rotate_q"), rotations + 2);
}

/// Split-KV chosen by FlashAttention-2's heuristic over the fake's 304 CUs (core::heuristic_splits, the
/// CUDA launcher's rule): a decode step over 1000 keys (two blocks) and a short causal window over 600
/// keys (each block's ~5 tiles cut into 10 splits: half of them empty, rows masked inside others) are
/// split; three key tiles and varlen queries are not. The fake checks the split count against the key
/// tiles, grid z = batch x splits, the combine's grid, and that both workspaces lie in one stream-ordered
/// allocation (NaN until written).
TEST(HipBackend, SplitKvByTheHeuristic) {
  expect_matches_cpu(dense(DType::bf16, 2, 1, 1000, 8, 1, 128, 128), 1);
  EXPECT_EQ(last_grid("attn_fwd_split", 2), 2u * 16u) << "16 splits of 16 key tiles";
  Case window = dense(DType::f16, 1, 70, 600, 4, 2, 64, 64);
  window.causal = true, window.wl = 300;
  expect_matches_cpu(window, 1);
  EXPECT_EQ(last_grid("attn_fwd_split", 2), 10u);
  expect_matches_cpu(dense(DType::bf16, 1, 16, 192, 2, 2, 64, 64), 0);  // three key tiles
  expect_matches_cpu(varlen(dense(DType::bf16, 1, 1, 1, 8, 1, 128), {1, 1}, {900, 400}), 0);
}

/// forward_kvcache of `c` on hip:0 against the CPU backend's: caches bit-identical after the append, out
/// and LSE by SPEC's rule; returns the splits of the forward (1 when attn_fwd ran).
int kvcase_matches_cpu(const KvCase& c) {
  SCOPED_TRACE(c.describe());
  const KvInputs in = make_kv_inputs(c);
  KvInputs dev = in;
  KvResult got = poisoned_kv_result(c);
  HostTensor* tensors[] = {&dev.q,       &dev.k_cache,   &dev.v_cache, &dev.k_new,       &dev.v_new,
                           &dev.seqlens, &dev.batch_idx, &dev.leftpad, &dev.block_table, &dev.cos,
                           &dev.sin,     &got.out,       &got.lse};
  for (HostTensor* t : tensors) on(*t, kHip0);
  const int plain = launches("attn_fwd"), split = launches("attn_fwd_split");
  forward_kvcache(kv_args(c, dev, got));
  for (HostTensor* t : tensors) on(*t, Device{});
  got.k_cache = dev.k_cache, got.v_cache = dev.v_cache;
  const KvResult ref = run_kv_cpu(c, in, Impl::reference), base = run_kv_cpu(c, in, Impl::baseline);
  EXPECT_TRUE(got.k_cache.bytes == ref.k_cache.bytes) << "k_cache after append";
  EXPECT_TRUE(got.v_cache.bytes == ref.v_cache.bytes) << "v_cache after append";
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
  EXPECT_EQ(launches("attn_fwd") - plain + launches("attn_fwd_split") - split, 1);
  return launches("attn_fwd_split") > split ? (int)last_grid("attn_fwd_split", 2) / (int)c.b : 1;
}

/// KvCacheArgs::num_splits as on CUDA: 1 off, n forced but at most the key tiles (7 of a 300-slot cache's
/// 5 tiles runs 5), 0 the heuristic (5 here: one packed block per sequence); a paged cache with rotary
/// and a causal append of 4 tokens.
TEST(HipBackend, KvCacheSplits) {
  KvCase c;  // b 2, one token appended to caches holding 10 and 200 of 300 slots, GQA 4:1
  for (auto [asked, runs] : {std::pair{1, 1}, {3, 3}, {7, 5}, {0, 5}}) {
    c.num_splits = asked;
    EXPECT_EQ(kvcase_matches_cpu(c), runs) << "num_splits " << asked;
  }
  KvCase p = kv_paged_cases()[1];  // pages of 16, s_cache 512: 8 key tiles
  p.num_splits = 3;
  EXPECT_EQ(kvcase_matches_cpu(p), 3);
}

/// flashport::check_device(hip:0) raises the fault index_check recorded, naming `args` (any of them) and
/// saying where it was found, exactly once.
void expect_hip_fault(std::initializer_list<std::string> args, const std::string& fragment) {
  expect_recorded_fault(kHip0, "hip", args, fragment);
}

/// Index tensors in device memory are not read on the host outside checked mode: index_check runs the
/// rules of core/index_rules.h on the device ahead of the call's kernels (which clamp every index) and
/// the next call, or check_device, raises the named error. Valid indices record nothing; a decreasing
/// cu_seqlens_q (which also makes the next sequence too long), a block-table entry past the pool beyond the
/// first 256-column chunk (two of them in one chunk: the lowest column is named) and a negative cache_seqlens
/// each are named; a pending fault stops the next call before it runs, and the call after that runs.
TEST(HipBackend, DeviceIndexChecksNameTheBadTensor) {
  const int checks = launches("index_check");
  Case c = varlen(dense(DType::bf16, 1, 1, 1, 2, 2, 64), {17, 9, 30}, {20, 9, 40});
  fastcheck::Inputs in = fastcheck::make_inputs(c);
  run_hip(c, in);
  EXPECT_EQ(launches("index_check"), checks + 1) << "device-resident cu_seqlens are checked";
  EXPECT_NO_THROW(check_device(kHip0)) << "valid indices";

  in.cu_q.i32()[2] = 10;  // 17 then 10: decreasing, and the next sequence 46 > max_seqlen_q long
  run_hip(c, in);
  expect_hip_fault({"cu_seqlens_q", "max_seqlen_q"}, "");  // whichever wave claimed the record first

  Case p = paged(dense(DType::f16, 1, 3, 1, 2, 2, 64), 1, {400});
  fastcheck::Inputs pin = fastcheck::make_inputs(p);
  const int64_t pages = pin.k.tv.shape[0];
  // Chunk 1 (columns 256..511): the lowest bad column (319) on lane 63, 63 more bad ones (320..382) on
  // lanes 0..62, so a wave that let any bad lane report would name another column 63 times in 64.
  for (int col = 320; col <= 382; ++col) pin.block_table.i32()[col] = (int32_t)pages + 5;
  pin.block_table.i32()[319] = -1;
  run_hip(p, pin);
  expect_hip_fault({"block_table"}, "entry [0, 319] = -1");

  {  // a decode step over a cache whose second sequence claims -3 tokens
    HostTensor q = randn(DType::bf16, {2, 1, 4, 64}), out(DType::bf16, {2, 1, 4, 64});
    HostTensor k_cache = randn(DType::bf16, {2, 40, 2, 64}), v_cache = randn(DType::bf16, {2, 40, 2, 64});
    HostTensor seqlens = int_tensor({7, -3});
    for (HostTensor* t : {&q, &out, &k_cache, &v_cache, &seqlens}) on(*t, kHip0);
    KvCacheArgs a;
    a.q = q, a.k_cache = k_cache, a.v_cache = v_cache, a.out = out, a.cache_seqlens = seqlens.view();
    forward_kvcache(a);
    expect_hip_fault({"cache_seqlens"}, "entry 1 = -3 must be >= 0");
  }

  run_hip(c, in);  // the bad cu_seqlens_q again: recorded, raised by the next call instead of it running
  const int forwards = forward_launches();
  try {
    run_hip(p, fastcheck::make_inputs(p));
    ADD_FAILURE() << "a call ran past a pending device fault";
  } catch (const Error& e) {
    EXPECT_TRUE(e.argument() == "cu_seqlens_q" || e.argument() == "max_seqlen_q") << e.what();
    EXPECT_NE(std::string(e.what()).find("found on hip:0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(forward_launches(), forwards) << "the call that raised did not launch";
  EXPECT_NO_THROW(run_hip(p, fastcheck::make_inputs(p)));
  EXPECT_NO_THROW(check_device(kHip0));
}

/// merge_states on hip:0 against the CPU merge, equal to the bit (both merge in fp64 by the same steps;
/// the model computes exp and log with the host's libm): every element type, d 130 (a wave's lanes
/// take three passes, the last partial), LSEs of -inf in one state or both, out_a a head slice of a
/// wider tensor (strided), a poisoned output; then out and lse in place over out_a and lse_a.
TEST(HipBackend, MergeStatesMatchesCpu) {
  const int64_t b = 2, s = 9, h = 3, d = 130;
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    HostTensor wide = randn(dt, {b, s, h + 1, d}), out_b = randn(dt, {b, s, h, d});
    HostTensor lse_a = randn(DType::f32, {b, h, s}, 3.0), lse_b = randn(DType::f32, {b, h, s}, 3.0);
    for (int64_t r = 0; r < lse_a.numel(); r += 5) lse_a.set(r, -INFINITY);
    for (int64_t r = 0; r < lse_b.numel(); r += 3) lse_b.set(r, -INFINITY);  // rows % 15 == 0: both
    TensorView a_view = wide.view();
    a_view.shape[2] = h;  // heads 0..h-1 of h + 1: row stride (h + 1) * d
    HostTensor cpu_out(dt, {b, s, h, d}), cpu_lse(DType::f32, {b, h, s});
    merge_states(MergeArgs{a_view, lse_a, out_b, lse_b, cpu_out, cpu_lse.view(), nullptr});

    HostTensor hip_wide = wide, hip_b = out_b, hip_la = lse_a, hip_lb = lse_b;
    HostTensor out(dt, {b, s, h, d}), lse(DType::f32, {b, h, s});
    poison(out);
    poison(lse);
    for (HostTensor* t : {&hip_wide, &hip_b, &hip_la, &hip_lb, &out, &lse}) on(*t, kHip0);
    TensorView hip_a = hip_wide.view();
    hip_a.shape[2] = h;
    const int before = launches("merge_states");
    merge_states(MergeArgs{hip_a, hip_la, hip_b, hip_lb, out, lse.view(), nullptr});
    EXPECT_EQ(launches("merge_states"), before + 1) << "one merge_states launch on the fake runtime";
    EXPECT_EQ(max_abs_diff(out, cpu_out), 0.0) << "out";
    EXPECT_EQ(max_abs_diff(lse, cpu_lse), 0.0) << "lse";

    // In place: out over out_b (contiguous), lse over lse_a.
    merge_states(MergeArgs{hip_a, hip_la, hip_b, hip_lb, hip_b, hip_la.view(), nullptr});
    EXPECT_EQ(max_abs_diff(hip_b, cpu_out), 0.0) << "out in place";
    EXPECT_EQ(max_abs_diff(hip_la, cpu_lse), 0.0) << "lse in place";
  }
}

}  // namespace
}  // namespace flashport::test
