// The CPU decode kernel (fast_decode.hpp: a few query tokens, the GQA group's heads packed into one
// tile, split-KV with an LSE merge) against the fp64 reference by SPEC's accuracy rule: flash_attn_with_
// kvcache shapes (GQA 7:1 and 4:1, MQA, MHA), dense and paged caches (pages of 1, 16 and 256 tokens),
// cache_seqlens of 0, 1 and full capacity, left pad, batch index, one and three query tokens
// (speculative decoding) with and without an append, masks, softcap, ALiBi, every ISA copy. Fresh
// random inputs each run (FLASHPORT_TEST_SEED replays); outputs are poisoned with NaN first, so an
// element the kernel leaves unwritten fails the comparison.
#include "backends/cpu/fast.hpp"
#include "cpu/test_fast_util.hpp"

namespace flashport::test {
namespace {

/// One flash_attn_with_kvcache call. seqlens are the tokens in the cache before the append of sq new
/// ones (append) or the cache lengths (no append).
struct DecodeCase {
  DType dtype = DType::bf16;
  int64_t sq = 1, hq = 32, hk = 8, d = 128, cap = 300;
  std::vector<int32_t> seqlens{0, 1, 300};
  int64_t page = 0;  // 0: dense (rows, cap, hk, d) cache
  bool append = false, leftpad = false, batch_idx = false;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  double softcap = 0.0;
  bool alibi = false;

  int64_t batch() const { return (int64_t)seqlens.size(); }
  std::string describe() const {
    std::ostringstream s;
    s << dtype_name(dtype) << " sq=" << sq << " hq=" << hq << " hk=" << hk << " d=" << d << " cap=" << cap
      << " seqlens=(";
    for (int32_t n : seqlens) s << n << ",";
    s << ") page=" << page << " append=" << append << " leftpad=" << leftpad << " batch_idx=" << batch_idx
      << " causal=" << causal << " window=(" << wl << "," << wr << ") softcap=" << softcap
      << " alibi=" << alibi;
    return s.str();
  }
};

struct DecodeInputs {
  HostTensor q, k_cache, v_cache, k_new, v_new, seqlens, leftpad, batch_idx, table, alibi;
};

DecodeInputs make_inputs(const DecodeCase& c) {
  DecodeInputs in;
  const int64_t b = c.batch(), rows = c.batch_idx ? b + 2 : b;
  in.q = randn(c.dtype, {b, c.sq, c.hq, c.d}, c.softcap > 0 ? 3.0 : 1.0);
  if (c.page > 0) {
    const int64_t per_seq = (c.cap + c.page - 1) / c.page, blocks = b * per_seq + 3;  // 3 spare pages
    in.k_cache = randn(c.dtype, {blocks, c.page, c.hk, c.d});
    in.v_cache = randn(c.dtype, {blocks, c.page, c.hk, c.d});
    std::vector<int32_t> ids((size_t)blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    in.table = HostTensor(DType::i32, {b, per_seq});
    std::copy(ids.begin(), ids.begin() + b * per_seq, in.table.i32());
  } else {
    in.k_cache = randn(c.dtype, {rows, c.cap, c.hk, c.d});
    in.v_cache = randn(c.dtype, {rows, c.cap, c.hk, c.d});
  }
  if (c.append) {
    in.k_new = randn(c.dtype, {b, c.sq, c.hk, c.d});
    in.v_new = randn(c.dtype, {b, c.sq, c.hk, c.d});
  }
  in.seqlens = int_tensor(c.seqlens);
  std::vector<int32_t> pads, idx((size_t)rows);
  for (int32_t n : c.seqlens) {
    const int32_t end = n + (c.append ? (int32_t)c.sq : 0);
    pads.push_back((int32_t)std::uniform_int_distribution<int>(0, end)(rng()));
  }
  in.leftpad = int_tensor(pads);
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), rng());
  idx.resize((size_t)b);
  in.batch_idx = int_tensor(idx);
  if (c.alibi) {
    in.alibi = HostTensor(DType::f32, {b, c.hq});
    std::uniform_real_distribution<double> ud(0.02, 0.5);
    for (int64_t n = 0; n < in.alibi.numel(); ++n) in.alibi.set(n, ud(rng()));
  }
  return in;
}

/// Runs the call with `impl` on poisoned outputs. An append writes the same values every time.
fastcheck::Forward run(const DecodeCase& c, DecodeInputs& in, Impl impl) {
  const int64_t b = c.batch();
  fastcheck::Forward f{HostTensor(c.dtype, {b, c.sq, c.hq, c.d}), HostTensor(DType::f32, {b, c.hq, c.sq})};
  poison(f.out);
  poison(f.lse);
  KvCacheArgs a;
  a.q = in.q, a.k_cache = in.k_cache, a.v_cache = in.v_cache, a.out = f.out, a.lse = f.lse.view();
  a.cache_seqlens = in.seqlens.view();
  if (c.append) a.k_new = in.k_new.view(), a.v_new = in.v_new.view();
  if (c.page > 0) a.block_table = in.table.view();
  if (c.leftpad) a.cache_leftpad = in.leftpad.view();
  if (c.batch_idx) a.cache_batch_idx = in.batch_idx.view();
  a.options.causal = c.causal;
  a.options.window_left = c.wl;
  a.options.window_right = c.wr;
  a.options.softcap = c.softcap;
  if (c.alibi) a.options.alibi_slopes = in.alibi.view();
  a.impl = impl;
  forward_kvcache(a);
  return f;
}

void expect_accurate(const DecodeCase& c) {
  SCOPED_TRACE(c.describe());
  DecodeInputs in = make_inputs(c);
  const fastcheck::Forward fast = run(c, in, Impl::fast);
  const fastcheck::Forward ref = run(c, in, Impl::reference);
  const fastcheck::Forward base = run(c, in, Impl::baseline);
  EXPECT_TRUE(accuracy_rule(fast.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(fast.lse, base.lse, ref.lse)) << "lse";
}

DecodeCase shape(DType dt, int64_t sq, int64_t hq, int64_t hk, int64_t d, int64_t cap, bool append) {
  DecodeCase c;
  c.dtype = dt, c.sq = sq, c.hq = hq, c.hk = hk, c.d = d, c.cap = cap, c.append = append;
  // Empty, one token, full capacity (after the append), and one in between.
  const int32_t full = (int32_t)(cap - (append ? sq : 0));
  c.seqlens = {0, 1, full, std::uniform_int_distribution<int32_t>(2, full)(rng())};
  return c;
}

TEST(FastDecode, GqaMqaMhaOneAndThreeTokens) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t sq : {1, 3}) {
      for (bool append : {false, true}) {
        expect_accurate(shape(dt, sq, 28, 4, 64, 150, append));   // GQA 7:1
        expect_accurate(shape(dt, sq, 32, 8, 128, 200, append));  // GQA 4:1
        expect_accurate(shape(dt, sq, 8, 1, 40, 130, append));    // MQA
        expect_accurate(shape(dt, sq, 3, 3, 59, 90, append));     // MHA, odd head dim
      }
    }
  }
}

TEST(FastDecode, Bf16RowsReadInPlace) {
  // bf16 items of up to W / 2 rows read K and V as stored and widen them in registers (dot_scores_bf16,
  // pv_bf16): 1, 2, 3 (one padding row), 4 and 8 rows; head dims of 2, 3 and 4 vector blocks; dense
  // caches (whole panels in place, the last one copied) and pages of 16 and 1 (copied), a window with
  // softcap and ALiBi; every ISA copy (W = 16, 8, 4 floats: AVX2 takes up to 4 rows, base up to 2).
  struct Shape {
    int64_t hq, hk, d;
  };
  for (const char* isa : {"avx512", "avx2", "base"}) {
    fastcheck::with_isa(isa, [&] {
      SCOPED_TRACE(isa);
      for (const Shape& s :
           {Shape{16, 16, 64}, Shape{16, 8, 128}, Shape{3, 1, 96}, Shape{32, 8, 128}, Shape{8, 1, 64}}) {
        for (int64_t page : {0, 16, 1}) {
          DecodeCase c = shape(DType::bf16, 1, s.hq, s.hk, s.d, 333, page == 1);
          c.page = page;
          expect_accurate(c);
        }
        DecodeCase c = shape(DType::bf16, 1, s.hq, s.hk, s.d, 333, false);
        c.wl = 150, c.softcap = 5.0, c.alibi = true, c.leftpad = true;
        expect_accurate(c);
      }
    });
  }
}

TEST(FastDecode, RowsBeyondOneTile) {
  // MQA with 48 query heads: 3 tokens give 144 rows of one kv head, split into tiles of 64.
  for (bool causal : {false, true}) {
    DecodeCase c = shape(DType::bf16, 3, 48, 1, 64, 120, true);
    c.causal = causal;
    expect_accurate(c);
  }
}

TEST(FastDecode, MasksSoftcapAlibi) {
  struct Feature {
    bool causal;
    int64_t wl, wr;
    double softcap;
    bool alibi;
  };
  const Feature features[] = {{true, -1, -1, 0.0, false},  {false, 37, 0, 0.0, false},
                              {true, 20, -1, 0.0, false},  {false, 5, 1, 0.0, false},
                              {false, -1, -1, 8.0, false}, {true, -1, -1, 0.0, true},
                              {true, 50, -1, 5.0, true}};
  for (const Feature& f : features) {
    for (int64_t sq : {1, 3}) {
      for (DType dt : {DType::f32, DType::bf16}) {
        DecodeCase c = shape(dt, sq, 28, 4, 64, 180, sq > 1);
        c.causal = f.causal, c.wl = f.wl, c.wr = f.wr, c.softcap = f.softcap, c.alibi = f.alibi;
        expect_accurate(c);
      }
    }
  }
}

TEST(FastDecode, PagedCaches) {
  for (int64_t page : {1, 16, 256}) {
    for (int64_t sq : {1, 3}) {
      // fp32 pages of 256 tokens are read in place (fast_decode.hpp), pages of 1 and 16 widened.
      const DType dt = page == 1 ? DType::bf16 : page == 16 ? DType::f32 : sq == 1 ? DType::f32 : DType::bf16;
      DecodeCase c = shape(dt, sq, 32, 8, 128, 600, sq > 1);
      c.page = page;
      c.causal = sq > 1;
      expect_accurate(c);
      c.leftpad = true;  // a left pad shifts the key runs against the page boundaries
      c.wl = 70;
      expect_accurate(c);
    }
  }
}

TEST(FastDecode, LeftPadAndBatchIndex) {
  for (int64_t sq : {1, 3}) {
    DecodeCase c = shape(DType::bf16, sq, 28, 4, 64, 160, sq > 1);
    c.leftpad = true;
    expect_accurate(c);
    c.batch_idx = true;
    c.causal = true;
    expect_accurate(c);
    c.leftpad = false;
    c.softcap = 4.0;
    expect_accurate(c);
  }
}

TEST(FastDecode, SplitKvMergesLongContexts) {
  // One sequence and one kv head: the keys are split across the threads and the states merged by
  // their LSE. A window leaves splits with no visible key for some rows (LSE -inf, weight 0).
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t sq : {1, 3}) {
      DecodeCase c = shape(dt, sq, 7, 1, 128, 5000, sq > 1);
      c.seqlens = {(int32_t)(5000 - (c.append ? sq : 0))};
      expect_accurate(c);
      c.causal = true, c.wl = 700;
      expect_accurate(c);
      c.wl = -1, c.softcap = 6.0, c.alibi = true;
      expect_accurate(c);
    }
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    // Items of several kv heads (one token of GQA 4:1) split: per-head states, some empty under a window.
    DecodeCase c = shape(dt, 1, 32, 8, 128, 6000, false);
    c.seqlens = {6000};
    expect_accurate(c);
    c.wl = 900, c.alibi = true;
    expect_accurate(c);
  }
  DecodeCase mixed = shape(DType::bf16, 1, 32, 8, 64, 4000, false);  // long and short sequences mixed
  mixed.seqlens = {4000, 3, 0, 2500};
  expect_accurate(mixed);
}

TEST(FastDecode, EmptyCachesGiveZeroAndNegInfLse) {
  DecodeCase c = shape(DType::bf16, 3, 8, 2, 64, 40, false);
  c.seqlens = {0, 0};
  DecodeInputs in = make_inputs(c);
  const fastcheck::Forward fast = run(c, in, Impl::fast);
  for (int64_t n = 0; n < fast.out.numel(); ++n) ASSERT_EQ(fast.out.get(n), 0.0) << n;
  for (int64_t n = 0; n < fast.lse.numel(); ++n) ASSERT_EQ(fast.lse.get(n), -INFINITY) << n;
}

TEST(FastDecode, VarlenForwardWithFewQueries) {
  // flash_attn_varlen_func with at most 16 queries per sequence takes the decode kernel too.
  Case c;
  c.layout = Layout::varlen;
  c.hq = 12, c.hk = 3, c.d = 64, c.dv = 64;
  c.q_lens = {1, 0, 3, 16, 2};
  c.k_lens = {90, 7, 0, 700, 3};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool causal : {false, true}) {
      c.dtype = dt, c.causal = causal;
      fastcheck::expect_accurate(c);
    }
  }
}

TEST(FastDecode, EveryIsaCopy) {
  // The decode kernel never runs on AMX ("amx" gives the AVX-512 copy); each cap must be obeyed.
  const std::vector<std::string> order{"base", "avx2", "avx512", "amx"};
  for (const char* isa : {"amx", "avx512", "avx2", "base"}) {
    fastcheck::with_isa(isa, [&] {
      SCOPED_TRACE(isa);
      const std::string chosen = cpu::fast::forward_isa(kBF16, true);
      const auto rank = std::find(order.begin(), order.end(), chosen);
      ASSERT_NE(rank, order.end()) << chosen;
      EXPECT_NE(chosen, "avx512-amx");
      EXPECT_LE(rank - order.begin(), std::find(order.begin(), order.end(), isa) - order.begin()) << chosen;
      DecodeCase c = shape(DType::bf16, 3, 28, 4, 64, 700, true);
      c.page = 16, c.causal = true, c.softcap = 5.0;
      expect_accurate(c);
      c = shape(DType::f32, 1, 32, 8, 128, 1500, false);
      c.seqlens = {1500};
      expect_accurate(c);
      c = shape(DType::f16, 1, 8, 1, 59, 300, true);
      c.leftpad = true, c.wl = 33;
      expect_accurate(c);
    });
  }
  EXPECT_EQ(std::string(cpu::fast::forward_isa(kF32, true)),
            std::string(cpu::fast::forward_isa(kF32, false)));
}

}  // namespace
}  // namespace flashport::test
