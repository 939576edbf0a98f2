// CUDA forward_kvcache vs the CPU oracle: append (bit-identical cache contents), rotary on k and q
// (both styles), cache_batch_idx, left pad, paged caches, split-KV counts; fp16, bf16 and fp32 caches.
#include <cstdlib>
#include <functional>
#include <string>

#include "common/kvcache_case.hpp"
#include "gpu/gpu_kvcache_util.hpp"
#include "gpu/gpu_test_util.hpp"

#ifdef FLASHPORT_GPU_EMU
#include "jit/jit.hpp"

namespace flashport::emu {
long long cluster_launches();  // emu_runtime.cpp
}  // namespace flashport::emu
#endif

namespace flashport::test::gpu {
namespace {

TEST(GpuKvCache, AppendAndAttend) {
  FP_SKIP_WITHOUT_GPU();
  for (const KvCase& c : kv_append_cases()) expect_kvcache_accurate(c);
}

TEST(GpuKvCache, Rotary) {
  FP_SKIP_WITHOUT_GPU();
  for (const KvCase& c : kv_rotary_cases(DType::bf16)) expect_kvcache_accurate(c);
}

TEST(GpuKvCache, BatchIndexLeftPadAndGqa) {
  FP_SKIP_WITHOUT_GPU();
  for (const KvCase& c : kv_batch_index_leftpad_gqa_cases()) expect_kvcache_accurate(c);
}

TEST(GpuKvCache, PagedCache) {
  FP_SKIP_WITHOUT_GPU();
  for (const KvCase& c : kv_paged_cases()) expect_kvcache_accurate(c);
}

TEST(GpuKvCache, Fp32CachesAppendRotateAndPage) {
  FP_SKIP_WITHOUT_GPU();
  // fp32 caches: the append copies 4-byte elements and rounds rotated ones to fp32; q's rotated scratch
  // holds fp32 (the fp32 forward reads it). Every case list of the 2-byte tests, in fp32.
  std::vector<KvCase> cases = kv_append_cases();
  for (auto list : {kv_rotary_cases(DType::f32), kv_batch_index_leftpad_gqa_cases(), kv_paged_cases()})
    cases.insert(cases.end(), list.begin(), list.end());
  for (KvCase& c : cases) {
    c.dtype = DType::f32;
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

TEST(GpuKvCache, SplitDecodeMergesInACluster) {
  // On sm_90+ a decode call of 2..8 splits merges them inside one thread-block cluster per (sequence, kv
  // head) unless FLASHPORT_DECODE_CLUSTER=0; both paths are accurate, so only the launch tells them apart,
  // and launches are visible under the emulator.
#ifndef FLASHPORT_GPU_EMU
  GTEST_SKIP() << "which launch a call made is checked under the emulator (tests/gpu/emu)";
#else
  const char* knob = std::getenv("FLASHPORT_DECODE_CLUSTER");
  const bool expect_cluster = jit::device_arch(0) >= 90 && !(knob && std::string(knob) == "0");
  const long long before = emu::cluster_launches();
  KvCase c;
  c.b = 1, c.hq = 8, c.hk = 1, c.d = 128, c.s_cache = 2048, c.cache_lens = {1999}, c.num_splits = 3;
  expect_kvcache_accurate(c);
  EXPECT_EQ(emu::cluster_launches() - before, expect_cluster ? 1 : 0);
#endif
}

TEST(GpuKvCacheSmall, DecodeChecksItsOwnIndices) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "host-resident indices are validated by the core";
  const char* checks = std::getenv("FLASHPORT_DEVICE_CHECKS");
  if (checks && std::string(checks) == "0")
    GTEST_SKIP() << "device checks off (the emulator's default: ctest emu.device_checks turns them on)";
  // A decode call checks cache_seqlens, cache_batch_idx, cache_leftpad and the block-table entries its
  // sequences use in the decode kernel (each split's CTA a share of the columns) instead of launching
  // index_check.cu before it; a broken rule is still reported, named, at the next check. Under the
  // emulator, which has no index_check.cu, a call that still launched it would throw.
  struct BadCase {
    const char* argument;  // null: a valid call
    const char* fragment;
    std::function<void(KvCase&)> edit;
    std::function<void(KvInputs&)> edit_inputs;
  };
  const auto nothing = [](KvInputs&) {};
  // Paged: 2 sequences over pages of 16 (19 columns each, sequence 1 using 13 after its append) or of 1
  // (300 columns, 201 used); `column` is sequence 1's.
  const auto pages = [](int64_t page, int splits) {
    return [=](KvCase& c) { c.page = page, c.s_cache = page == 16 ? 304 : 300, c.num_splits = splits; };
  };
  const auto entry = [](int64_t row, int64_t column, int32_t value) {
    return [=](KvInputs& in) { in.block_table.i32()[row * in.block_table.tv.shape[1] + column] = value; };
  };
  const BadCase bad[] = {
      {"cache_seqlens", "",
       [](KvCase& c) {
         c.cache_lens = {10, -7};
       },
       nothing},
      {"cache_seqlens", "",
       [](KvCase& c) {
         c.cache_lens = {300, 10}, c.num_splits = 3;
       },
       nothing},  // 301 > 300
      {"cache_batch_idx", "", [](KvCase& c) { c.batch_idx = true; },
       [](KvInputs& in) { in.batch_idx.i32()[1] = 7; }},
      {"cache_leftpad", "",
       [](KvCase& c) {
         c.leftpad = {0, 205}, c.num_splits = 1;
       },
       nothing},  // past 201
      {nullptr, "",
       [](KvCase& c) {
         c.batch_idx = true, c.leftpad = {3, 150};
       },
       nothing},
      // The last column sequence 1 uses, in the third split's share; the first one, with one CTA.
      {"block_table", "entry [1, 12] = -1", pages(16, 3), entry(1, 12, -1)},
      {"block_table", "entry [1, 0] = 40 is outside [0, num_blocks = 40)", pages(16, 1), entry(1, 0, 40)},
      // Two bad columns in one CTA's share: the lower one is reported.
      {"block_table", "entry [1, 2] = -3", pages(16, 1),
       [&](KvInputs& in) { entry(1, 11, 99)(in), entry(1, 2, -3)(in); }},
      {"block_table", "entry [1, 150] = 1000", pages(1, 0), entry(1, 150, 1000)},  // the generic copy
      {"cache_seqlens", "",
       [&](KvCase& c) {
         pages(16, 2)(c), c.cache_lens = {10, -7};
       },
       nothing},
      // Columns no sequence uses (sequence 0 one, sequence 1 thirteen) may hold anything.
      {nullptr, "", pages(16, 3), [&](KvInputs& in) { entry(1, 15, -5)(in), entry(0, 3, 999)(in); }},
  };
  for (const BadCase& t : bad) {
    KvCase c;  // 2 sequences, one new token each, 4:1 GQA, d 64, 300-token cache: decode-sized
    t.edit(c);
    SCOPED_TRACE(c.describe());
    KvInputs in = make_kv_inputs(c);
    t.edit_inputs(in);
    const KvResult r = run_kv_gpu(c, in);
    if (t.argument)
      expect_recorded_fault(Device{DeviceType::cuda, 0}, "cuda", {t.argument}, t.fragment);
    else
      EXPECT_NO_THROW(check_device(Device{DeviceType::cuda, 0}));
    EXPECT_EQ(count_nan(r.out), 0) << "clamped indices still give every output row";
  }
}

TEST(GpuKvCache, ServingGrid) {
  FP_SKIP_WITHOUT_GPU();
  // The serving shapes: 1..32 new tokens per step (speculative decoding past 1), appended and attended
  // to, over every cache layout (dense, pages of 1, 16, 64, 256) with GQA 1, 4 and 8:1, one split, the
  // heuristic's or a forced 5, rotary in either style or none. Every (sq, layout) pair once; the rest turn
  // with the case index so each value meets several of the others.
  const int64_t tokens[] = {1, 2, 4, 8, 16, 32}, pages[] = {0, 1, 16, 64, 256};
  const int64_t groups[] = {1, 4, 8};
  const int splits[] = {1, 0, 5};
  int i = 0;
  for (int64_t sq : tokens)
    for (int64_t page : pages) {
      KvCase c;
      c.b = 2, c.sq = sq, c.s_new = sq, c.d = 128, c.hk = 2, c.hq = 2 * groups[i % 3];
      c.s_cache = 256, c.page = page, c.cache_lens = {(int32_t)(200 - sq), 37};
      c.num_splits = splits[(i / 3) % 3];
      c.causal = true;
      c.rotary_dim = i % 4 == 3 ? 0 : 32, c.interleaved = i % 2 == 0;
      expect_kvcache_accurate(c);
      ++i;
    }
}

TEST(GpuKvCache, LongPagedCacheOneSplit) {
  FP_SKIP_WITHOUT_GPU();
  // One split over 7,900 cached tokens: each decode warp walks 41 tiles, past the 32 pages one read of the
  // block table gives its lanes (the window moves on), through a shuffled table; the second sequence's
  // table row is read through the batch stride.
  for (int64_t page : {16, 256}) {
    KvCase c;
    c.b = 2, c.hq = 8, c.hk = 1, c.d = 128, c.s_cache = 7936, c.page = page, c.cache_lens = {7900, 40};
    c.num_splits = 1;
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
  const KvInputs h = make_kv_inputs(c);
  const KvResult gpu = run_kv_gpu(c, h);
  EXPECT_EQ(count_nan(gpu.out), 0);
  EXPECT_EQ(max_abs_diff(gpu.k_cache, h.k_cache), 0.0) << "nothing may be appended";
  EXPECT_EQ(max_abs_diff(gpu.v_cache, h.v_cache), 0.0) << "nothing may be appended";
  expect_device_fault({"cache_seqlens", "cache_leftpad"}, "entry ");
}

}  // namespace
}  // namespace flashport::test::gpu
