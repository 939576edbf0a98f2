// The Hopper (sm_90a) forward called directly (hopper::forward on an AttnProblem built from device
// tensors) against the CPU oracle by SPEC's accuracy rule: every supported head dim, seqlen 1,
// 113 x 203, multi-tile pipelines, causal / window / softcap / ALiBi / dropout, GQA 4 and 7, varlen with
// empty sequences, seqused_k, paged K/V, strided layouts, the LSE, and every output element written exactly
// once.
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "backends/cuda/autotune.hpp"
#include "backends/cuda/sm80/forward.hpp"
#include "backends/cuda/sm90/hopper_fwd.hpp"
#include "common/kvcache_case.hpp"
#include "core/attn_validate.hpp"
#include "gpu/gpu_kvcache_util.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/hopper_support_problem.hpp"
#include "jit/test_jit_util.hpp"

namespace flashport::test::gpu {
namespace {

namespace hopper = cuda::hopper;

using HopperRun = std::function<void(const AttnProblem&)>;

/// `run` (hopper::forward unless given) on device copies of `in`, out and LSE poisoned (0xFF bytes =
/// NaN). False (with a test failure) when the kernel declines the case.
bool run_hopper(const Case& c, const FwdInputs& in, GpuResult& r, const HopperRun& run) {
  GpuForwardCall call(c, in);
  ForwardArgs& a = call.args;
  AttnProblem p = core::build_attention(a.q, a.k, a.v, a.out, a.options, a.layout, nullptr);
  core::attach_lse(p, *a.lse, a.q.device);
  const std::string why = hopper::unsupported(p, 90);
  if (!why.empty()) {
    ADD_FAILURE() << "the Hopper kernel declines this case: " << why;
    return false;
  }
  if (cpu_mode()) {
    a.impl = Impl::reference;
    forward(a);
  } else {
    run(p);
  }
  r = call.result(c);
  return true;
}

/// The Hopper result vs the oracle for out and LSE (accuracy rule), with no element left unwritten.
void expect_hopper_accurate(const Case& c, const FwdInputs& in, const HopperRun& run = hopper::forward) {
  SCOPED_TRACE(c.describe());
  GpuResult gpu;
  if (!run_hopper(c, in, gpu, run)) return;
  const FwdResult ref = run_cpu(c, in, Impl::reference);
  const FwdResult base = run_cpu(c, in, Impl::baseline);
  EXPECT_EQ(gpu.out_nan, 0) << "output elements unwritten (or padding overwritten)";
  EXPECT_EQ(gpu.lse_nan, 0) << "LSE elements unwritten";
  EXPECT_TRUE(accuracy_rule(gpu.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(gpu.lse, base.lse, ref.lse)) << "lse";
}
void expect_hopper_accurate(const Case& c) {
  expect_hopper_accurate(c, make_inputs(c));
}

TEST(HopperFwd, SmallSupportAndVariants) {
  const AttnProblem p = hopper_support_problem(kBF16, kBF16);
  const void* aligned = p.q.ptr;
  EXPECT_EQ(hopper::unsupported(p, 90), "");
  EXPECT_NE(hopper::unsupported(p, 80), "");
  auto declines = [&](auto change) {
    AttnProblem x = p;
    change(x);
    return !hopper::unsupported(x, 90).empty();
  };
  EXPECT_TRUE(declines([](AttnProblem& x) { x.d = x.dv = 80; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.dv = 64; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.in_type = x.out_type = kF32; }));
  // Dropout: alone up to d 128; beside softcap or ALiBi, or at d 192 / 256, on the portable kernel.
  EXPECT_FALSE(declines([](AttnProblem& x) { x.dropout_p = 0.1f; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.dropout_p = 0.1f, x.d = x.dv = 64; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.dropout_p = 0.1f, x.d = x.dv = 256; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.dropout_p = 0.1f, x.softcap = 5.0f; }));
  EXPECT_TRUE(
      declines([&](AttnProblem& x) { x.dropout_p = 0.1f, x.alibi = static_cast<const float*>(aligned); }));
  // Paged K/V (k's batches are the pool's pages): any page shorter than the 128-key tile where the cp.async
  // gather loads them (d <= 128, no softcap / ALiBi / dropout), else pages of a multiple of 8 tokens that
  // divide the key tile or are a multiple of it. cache_leftpad and cache_batch_idx run here over dense
  // caches; a left pad over pages stays on the portable kernel.
  const auto paged = [aligned](long long page) {
    return [aligned, page](AttnProblem& x) {
      x.block_table = static_cast<const int*>(aligned), x.block_table_stride = 3, x.page_size = page;
      x.kv_rows = 40, x.k.batch_stride = page * x.hk * x.d, x.v = x.k;
    };
  };
  for (long long page : {1, 4, 8, 12, 16, 24, 48, 64, 127, 128, 256, 1024})
    EXPECT_FALSE(declines(paged(page))) << "page " << page;
  for (long long page : {200, 136}) EXPECT_TRUE(declines(paged(page))) << "page " << page;
  for (long long page : {1, 24, 48}) {  // the boxes' rule where no gather build runs
    EXPECT_TRUE(declines([&](AttnProblem& x) { paged(page)(x), x.softcap = 5.0f; })) << "page " << page;
    EXPECT_TRUE(declines([&](AttnProblem& x) { paged(page)(x), x.d = x.dv = 192; })) << "page " << page;
  }
  EXPECT_FALSE(declines([&](AttnProblem& x) { paged(32)(x), x.softcap = 5.0f; }));
  // A pool the gather's 32-bit records cannot reach (past 64 GiB from a kv head's base): boxes only.
  EXPECT_TRUE(declines([&](AttnProblem& x) { paged(24)(x), x.kv_rows = 1LL << 28; }));
  EXPECT_FALSE(declines([&](AttnProblem& x) { paged(16)(x), x.kv_rows = 1LL << 28; }));
  EXPECT_TRUE(
      declines([&](AttnProblem& x) { paged(16)(x), x.leftpad_k = static_cast<const int*>(aligned); }));
  const auto* index = static_cast<const int*>(aligned);
  EXPECT_FALSE(declines([&](AttnProblem& x) { x.kv_batch_idx = index, x.kv_rows = 5; }));
  EXPECT_FALSE(declines([&](AttnProblem& x) { x.leftpad_k = index; }));
  EXPECT_FALSE(declines([&](AttnProblem& x) { x.leftpad_k = x.kv_batch_idx = index, x.kv_rows = 5; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.q.row_stride += 4; }));  // rows not 16-byte aligned
  EXPECT_TRUE(declines([](AttnProblem& x) { x.o.ptr = static_cast<char*>(x.o.ptr) + 8; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.k.batch_stride = 0; }));  // broadcast batch
  EXPECT_FALSE(declines([](AttnProblem& x) { x.q.head_stride = x.sq * x.d, x.q.row_stride = x.d; }));
  // Decode-sized calls (query rows, GQA heads packed in, <= 16) are the portable decode variant's, at any
  // batch: one query token with 4 heads per kv head, or 16 queries of MHA; 17 rows are not.
  AttnProblem decode = p;
  decode.batch = 512, decode.sq = 1, decode.hq = 32, decode.hk = 8;
  EXPECT_NE(hopper::declines(decode, 90), nullptr);
  decode.sq = 4, decode.hq = decode.hk = 8;
  EXPECT_NE(hopper::declines(decode, 90), nullptr);
  decode.sq = 16;
  EXPECT_NE(hopper::declines(decode, 90), nullptr);
  decode.sq = 3, decode.hq = 48, decode.hk = 8;  // 18 rows per kv head
  EXPECT_FALSE(cuda::decode_sized(decode));
  for (const auto& spec : hopper::variants(90)) EXPECT_TRUE(hopper::is_main_kernel(spec)) << spec.key();
  // 2 dtypes x (5 head dims + 5 persistent + 3 persistent with O apart + 10 alternatives + the launch
  // rule's d 64 persistent shapes, 128 and 192 rows + 2 transforms x the rule's 9 shapes + dropout's 4
  // + e4m3 at d 64, 128 and 256 writing this dtype, persistent at d 64 and 128, and d 64's 192-row tile
  // on both grids + e4m3 with ALiBi or softcap at d 64 (both tiles), 128 and 256, one CTA per block)
  EXPECT_EQ(hopper::variants(90).size(), 124u);
  EXPECT_TRUE(hopper::variants(80).empty());
}

TEST(HopperFwd, SmallHeadDims) {
  FP_SKIP_WITHOUT_SM90();
  int n = 0;
  for (int64_t d : {64, 96, 128, 192, 256}) {
    const DType dt = n++ % 2 ? DType::f16 : DType::bf16;
    expect_hopper_accurate(dense(dt, 2, 113, 203, 2, 1, d));
    expect_hopper_accurate(with(dense(dt, 1, 203, 113, 3, 3, d), kCausal));
  }
}

TEST(HopperFwd, SmallSeqlenOne) {
  FP_SKIP_WITHOUT_SM90();
  for (int64_t d : {64, 128}) {
    expect_hopper_accurate(dense(DType::bf16, 2, 1, 1, 2, 2, d));
    expect_hopper_accurate(dense(DType::bf16, 3, 1, 203, 4, 1, d));
    expect_hopper_accurate(with(dense(DType::f16, 1, 1, 203, 4, 4, d), kCausal));
    expect_hopper_accurate(with(dense(DType::bf16, 1, 203, 1, 2, 1, d), kCausal));  // most rows see nothing
  }
}

// Eight key tiles per query block: every stage of the ring is reused and both mbarrier phases occur;
// causal blocks run different tile counts.
TEST(HopperFwd, LongCausalAndFull) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_accurate(dense(DType::bf16, 1, 1024, 1024, 2, 1, 128));
  for (int64_t d : {64, 128, 256})
    expect_hopper_accurate(with(dense(DType::bf16, 1, 1024, 1024, 2, 2, d), kCausal));
  // d 256's launch rule: the persistent grid up to 2k keys (4k causal), 128 x 80 tiles past 2k non-causal
  // (2500 = 31 x 80 + 20: a partial last tile).
  expect_hopper_accurate(dense(DType::f16, 2, 700, 900, 2, 2, 256));
  expect_hopper_accurate(with(dense(DType::bf16, 1, 3000, 3000, 2, 1, 256), kCausal));
  expect_hopper_accurate(dense(DType::bf16, 1, 300, 2500, 2, 1, 256));
  // d 64 past 1k keys: 192-row blocks (three consumer warpgroups), dense on the persistent grid
  // (partial last block: 1300 = 6 x 192 + 148), windowed and varlen with one CTA per block.
  expect_hopper_accurate(with(dense(DType::bf16, 2, 1300, 1300, 3, 1, 64), kCausal));
  expect_hopper_accurate(dense(DType::f16, 1, 700, 2100, 2, 2, 64));
  expect_hopper_accurate(with(dense(DType::bf16, 1, 1100, 1500, 2, 1, 64), kWindowMasks[0]));
  Case c = with(dense(DType::bf16, 1, 1, 1, 4, 2, 64), kCausal);
  c.layout = Layout::varlen;
  c.q_lens = {1200, 0, 450};
  c.k_lens = {1300, 10, 1100};
  expect_hopper_accurate(c);
}

// More query blocks than SMs (132 on an H200): a persistent CTA (FLASHPORT_HOPPER_PERSISTENT=1) runs
// several blocks, carrying the K/V ring, the Q buffer and the ping-pong turn across blocks of
// different key-tile counts, blocks past a varlen sequence's end and blocks without keys.
TEST(HopperFwd, ManyBlocks) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_accurate(dense(DType::bf16, 24, 260, 130, 4, 2, 64));                 // 288 blocks
  expect_hopper_accurate(with(dense(DType::f16, 20, 300, 300, 4, 1, 128), kCausal));  // 1-3 key tiles
  expect_hopper_accurate(with(dense(DType::bf16, 12, 400, 100, 4, 1, 64), kCausal));  // blocks without keys
  Case c = with(dense(DType::bf16, 1, 1, 1, 4, 2, 128), kCausal);
  c.layout = Layout::varlen;
  c.q_lens.clear();
  c.k_lens.clear();
  for (int64_t i = 0; i < 30; ++i) {
    c.q_lens.push_back(i * 37 % 390);
    c.k_lens.push_back(i % 7 == 3 ? 0 : (i * 53 + 11) % 420);
  }
  expect_hopper_accurate(c);
}

// The causal persistent schedule in more than one section (causal_section: the pairs of kv heads whose
// K and V fit 32 MB, at least a block per CTA), each dealt in its own rounds.
TEST(HopperFwd, CausalSections) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_accurate(with(dense(DType::bf16, 32, 128, 1024, 8, 8, 64), kCausal));    // 132 + 124 pairs
  expect_hopper_accurate(with(dense(DType::bf16, 32, 256, 256, 16, 16, 128), kCausal));  // 2 x 256 pairs
}

TEST(HopperFwd, SmallMasks) {
  FP_SKIP_WITHOUT_SM90();
  for (const Features& f : kWindowMasks) {  // window-left-only: the lowest key tiles are skipped
    SCOPED_TRACE(f.name);
    expect_hopper_accurate(with(dense(DType::bf16, 2, 300, 400, 2, 1, 64), f));
    expect_hopper_accurate(with(dense(DType::f16, 1, 400, 300, 2, 2, 128), f));
  }
  // sq > sk, causal: the first query block sees no key at all (O = 0, LSE = -inf without a load).
  expect_hopper_accurate(with(dense(DType::bf16, 1, 300, 50, 2, 1, 128), kCausal));
  expect_hopper_accurate(with(dense(DType::bf16, 1, 50, 300, 2, 1, 128), kCausal));
}

TEST(HopperFwd, SmallSoftcapAlibi) {
  FP_SKIP_WITHOUT_SM90();
  const Features features[] = {
      kSoftcap, kAlibi, kAlibiPerBatch, {"all", true, 70, -1, 5.0, 2, 0.0},  // kAll without dropout
  };
  for (const Features& f : features) {
    SCOPED_TRACE(f.name);
    expect_hopper_accurate(with(dense(DType::bf16, 2, 113, 203, 2, 1, 128), f));
    expect_hopper_accurate(with(dense(DType::f16, 1, 200, 200, 2, 2, 64), f));
  }
  // The other kernels the launch rule picks with a transform compiled in: d 64 past 1k keys (192-row
  // blocks, persistent when dense and non-causal), d 96 / 192 / 256, and causal sq > sk (ALiBi's
  // diagonal shifted by sk - sq, first query block without keys).
  for (const Features& f : {kSoftcap, kAlibi, kAlibiPerBatch}) {
    SCOPED_TRACE(f.name);
    expect_hopper_accurate(with(dense(DType::bf16, 1, 300, 1100, 2, 1, 64), f));
    for (int d : {96, 192, 256}) expect_hopper_accurate(with(dense(DType::bf16, 1, 150, 170, 3, 1, d), f));
    Features causal = f;
    causal.causal = true;
    expect_hopper_accurate(with(dense(DType::f16, 2, 250, 120, 2, 1, 128), causal));
  }
}

// Dropout (SPEC's Philox mask, one call per 4 probabilities as in the portable backward): the CPU oracle
// draws the same mask, so a wrong keep bit fails the accuracy rule. d 64 short and past 1k keys (the rule
// would take 192-row blocks; dropout keeps 128), d 96 and 128 (one CTA per block), causal with sq > sk,
// windows, GQA 7:1, varlen with empty sequences, several key tiles.
TEST(HopperFwd, SmallDropout) {
  FP_SKIP_WITHOUT_SM90();
  const Features causal{"dropout-causal", true, -1, -1, 0.0, 0, 0.3};
  const Features window{"dropout-window", false, 37, 5, 0.0, 0, 0.1};
  for (const Features& f : {kDropout, causal, window}) {
    SCOPED_TRACE(f.name);
    expect_hopper_accurate(with(dense(DType::bf16, 2, 113, 203, 2, 1, 128), f));
    expect_hopper_accurate(with(dense(DType::f16, 1, 200, 200, 7, 1, 64), f));
    expect_hopper_accurate(with(dense(DType::bf16, 1, 300, 1100, 2, 1, 64), f));
    expect_hopper_accurate(with(dense(DType::f16, 1, 150, 170, 3, 1, 96), f));
  }
  expect_hopper_accurate(with(dense(DType::f16, 2, 250, 120, 2, 1, 128), causal));  // sq > sk
  expect_hopper_accurate(
      varlen(with(dense(DType::bf16, 1, 1, 1, 4, 1, 128), causal), {0, 37, 130, 1, 0}, {5, 0, 129, 64, 0}));
}

TEST(HopperFwd, SmallGqa) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_accurate(dense(DType::bf16, 2, 113, 203, 8, 2, 128));                // 4:1
  expect_hopper_accurate(with(dense(DType::bf16, 1, 150, 150, 7, 1, 64), kCausal));  // 7:1
  expect_hopper_accurate(with(dense(DType::f16, 1, 129, 257, 7, 1, 256), kPlain));   // 7:1, d 256
}

TEST(HopperFwd, SmallVarlen) {
  FP_SKIP_WITHOUT_SM90();
  for (const Features& f : {kPlain, kCausal}) {
    SCOPED_TRACE(f.name);
    Case c = with(dense(DType::bf16, 1, 1, 1, 4, 2, 128), f);
    c.layout = Layout::varlen;
    c.q_lens = {37, 0, 200, 129, 1};
    c.k_lens = {50, 10, 0, 300, 1};  // an empty query sequence and an empty key sequence
    expect_hopper_accurate(c);
    c.d = c.dv = 64;
    c.used_k = {20, 10, 0, 250, 0};
    expect_hopper_accurate(c);
  }
}

TEST(HopperFwd, SmallDenseSequsedK) {
  FP_SKIP_WITHOUT_SM90();
  Case c = dense(DType::bf16, 3, 150, 260, 2, 1, 128);
  c.used_k = {260, 0, 131};
  expect_hopper_accurate(c);
  expect_hopper_accurate(with(c, kCausal));
}

TEST(HopperFwd, SmallPagedKv) {
  FP_SKIP_WITHOUT_SM90();
  // A prefill chunk against a paged cache (shuffled pages, the last one partly used, an empty sequence):
  // pages shorter than the key tile (at d <= 128 the producer warpgroup's cp.async gather; otherwise one
  // box per page, d 192's 112-key tile taking 7 of 16 tokens), as long as it, and longer;
  // causal bottom-right, GQA, every supported head dim.
  int n = 0;
  for (int64_t d : {64, 96, 128, 192, 256}) {
    const DType dt = n++ % 2 ? DType::f16 : DType::bf16;
    expect_hopper_accurate(paged(with(dense(dt, 3, 100, 1, 4, 2, d), kCausal), 16, {300, 517, 0}));
    // d 192: pages of its tile's 112 tokens (256 is no multiple of 112: the portable kernel's).
    expect_hopper_accurate(paged(dense(dt, 2, 77, 1, 4, 1, d), d == 192 ? 112 : 256, {600, 129}));
  }
  expect_hopper_accurate(paged(with(dense(DType::bf16, 2, 300, 1, 4, 4, 128), kCausal), 128, {1000, 300}));
  // Pages below the key tile at d <= 128 load through the producer warpgroup's gather: enough key tiles
  // (9) to cycle its three row slots and two-tile copy pipeline several times; pages of 32 at d 96 (its
  // padding columns zero-filled); softcap keeps one box per page (no gather build with a transform).
  expect_hopper_accurate(paged(with(dense(DType::bf16, 2, 150, 1, 4, 2, 128), kCausal), 16, {1100, 700}));
  expect_hopper_accurate(paged(dense(DType::bf16, 1, 64, 1, 2, 1, 64), 8, {203}));
  expect_hopper_accurate(paged(with(dense(DType::f16, 2, 90, 1, 6, 2, 96), kCausal), 32, {700, 333}));
  expect_hopper_accurate(paged(with(dense(DType::bf16, 2, 70, 1, 4, 2, 128), kSoftcap), 32, {500, 260}));
  // Pages the boxes cannot take, gathered: one token (every row its own page), 24 (rows straddling pages).
  expect_hopper_accurate(paged(with(dense(DType::bf16, 2, 96, 1, 4, 1, 128), kCausal), 1, {300, 77}));
  expect_hopper_accurate(paged(dense(DType::f16, 2, 70, 1, 4, 2, 64), 24, {500, 131}));
  // d 64 above 1k keys: the launch rule's 192-row tile (three consumers) over pages.
  expect_hopper_accurate(paged(with(dense(DType::bf16, 2, 200, 1, 4, 2, 64), kCausal), 16, {1500, 1100}));
  Case w = paged(dense(DType::f16, 2, 129, 1, 2, 2, 128), 64, {400, 140});
  w.wl = 100, w.wr = 0;
  expect_hopper_accurate(w);
}

/// A prefill chunk against a dense kv cache (no append) on the Hopper kernel, called directly on the problem
/// flash_attn_with_kvcache builds (core::build_kvcache), against the CPU backend's forward_kvcache.
void expect_hopper_kvcache_accurate(const KvCase& c) {
  expect_kvcache_accurate(c, [](KvCacheArgs& a) {
    const core::KvCacheProblem kp = core::build_kvcache(a);
    if (const std::string why = hopper::unsupported(kp.attn, 90); !why.empty()) {
      ADD_FAILURE() << "the Hopper kernel declines this case: " << why;
    } else if (cpu_mode()) {
      a.impl = Impl::reference;
      forward_kvcache(a);
    } else {
      hopper::forward(kp.attn);
    }
  });
}

// cache_batch_idx (cache rows in reverse, row 0 unused) and cache_leftpad (keys from token pad, at pads
// that are no multiple of 8 or of the key tile) on a chunk of 150-300 queries: several key tiles, a
// sequence with no keys (cache length 0, or the pad at its end), causal bottom-right with more queries than
// keys, a window, GQA 4:1 and 7:1, d 64 / 128 / 256.
TEST(HopperFwd, SmallKvCacheBatchIndexLeftPad) {
  FP_SKIP_WITHOUT_SM90();
  KvCase c;
  c.b = 3, c.sq = 150, c.s_new = 0, c.hq = 4, c.hk = 1, c.d = 128, c.s_cache = 400;
  c.cache_lens = {330, 0, 213};
  c.batch_idx = true;
  expect_hopper_kvcache_accurate(c);
  c.leftpad = {37, 0, 70};  // entry 2: 143 keys for 150 queries
  c.causal = true, c.dtype = DType::f16;
  expect_hopper_kvcache_accurate(c);
  c.batch_idx = false, c.leftpad = {129, 0, 213}, c.hq = 7;  // entry 2: the pad at the end, no keys
  expect_hopper_kvcache_accurate(c);
  c.d = 64, c.hq = 8, c.hk = 2, c.wl = 40, c.dtype = DType::bf16, c.batch_idx = true;
  expect_hopper_kvcache_accurate(c);
  c.d = 256, c.wl = -1, c.sq = 300, c.leftpad = {5, 0, 1}, c.cache_lens = {400, 17, 300};
  expect_hopper_kvcache_accurate(c);
}

TEST(HopperFwd, SmallStridedLayouts) {
  FP_SKIP_WITHOUT_SM90();
  Case padded = dense(DType::bf16, 2, 113, 203, 2, 1, 64);
  padded.pad = 8;  // rows of 72 elements: still 16-byte aligned, tensor maps with odd strides
  expect_hopper_accurate(padded);

  // (b, h, s, d) storage viewed as (b, s, h, d): the head stride exceeds the row stride.
  Case c = with(dense(DType::f16, 2, 130, 190, 4, 2, 128), kCausal);
  FwdInputs in = make_inputs(c);
  auto transposed = [&](HostOperand& o, int64_t s, int64_t h, int64_t d) {
    o.storage = randn(c.dtype, {c.batch(), h, s, d});
    o.view = TensorView::strided(o.storage.tv.data, c.dtype, {c.batch(), s, h, d}, {h * s * d, d, s * d, 1});
  };
  transposed(in.q, 130, 4, 128);
  transposed(in.k, 190, 2, 128);
  transposed(in.v, 190, 2, 128);
  expect_hopper_accurate(c, in);
}

// Autotuning in a fresh cache directory: every candidate is timed on the problem, the winner is
// stored in the GPU's autotune file and its output (left in out / LSE) meets the accuracy rule; a
// new process (store state dropped) reads the entry back instead of timing again.
TEST(HopperFwd, SmallAutotune) {
  FP_SKIP_WITHOUT_SM90();
  if (cpu_mode()) GTEST_SKIP() << "autotuning times the kernel";
  ScopedCacheDir cache;
  cuda::autotune::reset_for_testing();
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  const std::string file =
      cache.path() + "/" + cuda::autotune::file_name(jit::device_name(device), jit::driver_version());
  hopper::TunedShape tuned;
  const auto tune = [&](const AttnProblem& p) { tuned = hopper::autotune_shape(p); };
  const Case c = with(dense(DType::bf16, 2, 300, 333, 4, 2, 128), kCausal);
  testing::internal::CaptureStderr();
  expect_hopper_accurate(c, make_inputs(c), tune);
  const std::string err = testing::internal::GetCapturedStderr();
  // The table's shape and the three d = 128 alternatives (hopper_fwd.cpp kAlternatives), each timed.
  for (const char* shape : {"128x128x2 ", "128x176x2 ", "128x128x3 ", "128x128x2/emu1 "}) {
    EXPECT_NE(err.find(std::string("flashport: autotune hopper_fwd d=128 causal=1 bf16: ") + shape),
              std::string::npos)
        << shape << "\n"
        << err;
  }
  EXPECT_EQ(err.find("skipped"), std::string::npos) << err;
  EXPECT_NE(err.find(" -> 128x"), std::string::npos) << err;
  const std::string value = std::to_string(tuned.block_n) + ":" + std::to_string(tuned.stages) + ":" +
                            std::to_string(tuned.exp_emu);
  EXPECT_TRUE(value == "128:2:0" || value == "176:2:0" || value == "128:3:0" || value == "128:2:1") << value;

  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  // The key gains " persistent=<mode>" under FLASHPORT_HOPPER_PERSISTENT.
  const size_t line = text.str().find("hopper_fwd d=128 causal=1 dtype=bf16");
  ASSERT_NE(line, std::string::npos) << file << "\n" << text.str();
  EXPECT_EQ(text.str().find(" " + value + "\n", line), text.str().find('\n', line) - value.size() - 1)
      << text.str();

  // A new process: the entry is read back (no timing lines), the same shape runs, still accurate.
  cuda::autotune::reset_for_testing();
  hopper::TunedShape again;
  testing::internal::CaptureStderr();
  const Case other = with(dense(DType::bf16, 1, 129, 500, 2, 1, 128), kCausal);  // same bucket
  expect_hopper_accurate(other, make_inputs(other),
                         [&](const AttnProblem& p) { again = hopper::autotune_shape(p); });
  const std::string err_again = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err_again.find("flashport: autotune"), std::string::npos) << "tuned again: " << err_again;
  EXPECT_EQ(again.block_n, tuned.block_n);
  EXPECT_EQ(again.stages, tuned.stages);
  EXPECT_EQ(again.exp_emu, tuned.exp_emu);
  cuda::autotune::reset_for_testing();
}

}  // namespace
}  // namespace flashport::test::gpu
