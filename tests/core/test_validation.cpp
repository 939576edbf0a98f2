// Bad input cannot get past the core: each case raises flashport::Error naming the argument.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "common/test_util.hpp"
#include "core/attn_validate.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"

namespace flashport::test {
namespace {

/// Runs `fn`, expects an Error whose argument is `arg` and whose message contains `fragment`.
void expect_error(const std::function<void()>& fn, const std::string& arg, const std::string& fragment) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
    EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << "message does not name " << arg;
    return;
  }
  ADD_FAILURE() << "no flashport::Error for " << arg;
}

struct Dense {
  HostTensor q, k, v, out, lse;
  ForwardArgs args() const {
    ForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.out = out;
    a.lse = lse.view();
    return a;
  }
};

Dense dense(int64_t b = 2, int64_t sq = 5, int64_t sk = 7, int64_t hq = 4, int64_t hk = 2, int64_t d = 16,
            DType dt = DType::f32) {
  Dense t{randn(dt, {b, sq, hq, d}), randn(dt, {b, sk, hk, d}), randn(dt, {b, sk, hk, d}),
          HostTensor(dt, {b, sq, hq, d}), HostTensor(DType::f32, {b, hq, sq})};
  poison(t.out);
  return t;
}

TEST(Validation, ValidCallRunsAndWritesEverything) {
  Dense t = dense();
  ForwardArgs a = t.args();
  a.options.causal = true;
  forward(a);
  for (int64_t i = 0; i < t.out.numel(); ++i) ASSERT_FALSE(std::isnan(t.out.get(i))) << "element " << i;
}

TEST(Validation, DtypeMismatch) {
  Dense t = dense();
  HostTensor k16 = randn(DType::f16, {2, 7, 2, 16});
  ForwardArgs a = t.args();
  a.k = k16;
  expect_error([&] { forward(a); }, "k", "expected dtype float32, got float16");
}

TEST(Validation, ShapeMismatch) {
  Dense t = dense();
  HostTensor v = randn(DType::f32, {2, 6, 2, 16});
  ForwardArgs a = t.args();
  a.v = v;
  expect_error([&] { forward(a); }, "v", "expected shape (2, 7, 2, *)");
  HostTensor out = HostTensor(DType::f32, {2, 5, 4, 8});
  a = t.args();
  a.out = out;
  expect_error([&] { forward(a); }, "out", "expected shape (2, 5, 4, 16)");
}

TEST(Validation, LastDimensionMustBeContiguous) {
  Dense t = dense();
  ForwardArgs a = t.args();
  a.q.stride = {5 * 4 * 16 * 2, 4 * 16 * 2, 16 * 2, 2};  // every other element of a larger buffer
  a.q.shape[3] = 8;
  expect_error([&] { forward(a); }, "q", "stride 1");
}

TEST(Validation, HeadsMustDivide) {
  Dense t = dense(1, 3, 3, 6, 4, 8);
  expect_error([&] { forward(t.args()); }, "k", "hq = 6, hk = 4");
}

TEST(Validation, HeadDimRange) {
  Dense t = dense(1, 2, 2, 1, 1, 300);
  expect_error([&] { forward(t.args()); }, "q", "head dim must be in [1, 256], got 300");
}

TEST(Validation, NullPointer) {
  Dense t = dense();
  ForwardArgs a = t.args();
  a.k.data = nullptr;
  expect_error([&] { forward(a); }, "k", "null");
}

TEST(Validation, OptionRanges) {
  Dense t = dense();
  ForwardArgs a = t.args();
  a.options.window_left = -2;
  expect_error([&] { forward(a); }, "window_left", "got -2");
  a = t.args();
  a.options.window_right = -5;
  expect_error([&] { forward(a); }, "window_right", "got -5");
  a = t.args();
  a.options.dropout_p = 1.0;
  expect_error([&] { forward(a); }, "dropout_p", "[0, 1)");
  a.options.dropout_p = -0.1;
  expect_error([&] { forward(a); }, "dropout_p", "[0, 1)");
  a = t.args();
  a.options.softcap = -1.0;
  expect_error([&] { forward(a); }, "softcap", ">= 0");
  a = t.args();
  a.options.softmax_scale = std::nan("");
  expect_error([&] { forward(a); }, "softmax_scale", "finite");
  a = t.args();
  a.options.softcap = std::nan("");
  expect_error([&] { forward(a); }, "softcap", "finite");
}

TEST(Validation, AlibiAndDescaleShapes) {
  Dense t = dense();
  HostTensor slopes = randn(DType::f32, {3});
  ForwardArgs a = t.args();
  a.options.alibi_slopes = slopes.view();
  expect_error([&] { forward(a); }, "alibi_slopes", "expected shape (4,)");
  HostTensor ds = randn(DType::f32, {2, 2});
  a = t.args();
  a.options.q_descale = ds.view();
  expect_error([&] { forward(a); }, "q_descale", "fp8 inputs only");
}

TEST(Validation, OutputMayNotAliasInput) {
  Dense t = dense(2, 5, 5, 2, 2, 16);
  ForwardArgs a = t.args();
  a.out = t.q;
  expect_error([&] { forward(a); }, "out", "overlaps q");
}

TEST(Validation, LseShape) {
  Dense t = dense();
  HostTensor lse(DType::f32, {2, 5, 4});
  ForwardArgs a = t.args();
  a.lse = lse.view();
  expect_error([&] { forward(a); }, "lse", "expected shape (2, 4, 5)");
}

struct Varlen {
  HostTensor q, k, v, out, cu_q, cu_k;
  ForwardArgs args() const {
    ForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.out = out;
    a.layout.cu_seqlens_q = cu_q.view();
    a.layout.cu_seqlens_k = cu_k.view();
    a.layout.max_seqlen_q = 6;
    a.layout.max_seqlen_k = 6;
    return a;
  }
};

Varlen varlen(std::vector<int32_t> cu_q, std::vector<int32_t> cu_k) {
  const int64_t tq = 10, tk = 12;
  return {randn(DType::f32, {tq, 2, 8}),
          randn(DType::f32, {tk, 2, 8}),
          randn(DType::f32, {tk, 2, 8}),
          HostTensor(DType::f32, {tq, 2, 8}),
          int_tensor(cu_q),
          int_tensor(cu_k)};
}

TEST(Validation, CuSeqlens) {
  Varlen ok = varlen({0, 4, 4, 10}, {0, 6, 6, 12});
  forward(ok.args());  // an empty middle sequence is fine
  Varlen t = varlen({0, 6, 4, 10}, {0, 6, 6, 12});
  expect_error([&] { forward(t.args()); }, "cu_seqlens_q", "non-decreasing");
  t = varlen({1, 4, 6, 10}, {0, 6, 6, 12});
  expect_error([&] { forward(t.args()); }, "cu_seqlens_q", "start at 0");
  t = varlen({0, 4, 6, 10}, {0, 6, 6, 11});
  expect_error([&] { forward(t.args()); }, "cu_seqlens_k", "end at the total token count 12");
  t = varlen({0, 4, 4, 10}, {0, 6, 6, 12});
  ForwardArgs a = t.args();
  a.layout.max_seqlen_q = 5;
  expect_error([&] { forward(a); }, "max_seqlen_q", "upper bound");
  a = t.args();
  a.layout.cu_seqlens_k.reset();
  expect_error([&] { forward(a); }, "cu_seqlens_k", "both");
}

TEST(Validation, BlockTableRange) {
  const int64_t page = 4, blocks = 5;
  HostTensor q = randn(DType::f32, {2, 3, 2, 8}), out(DType::f32, {2, 3, 2, 8});
  HostTensor kc = randn(DType::f32, {blocks, page, 2, 8}), vc = randn(DType::f32, {blocks, page, 2, 8});
  HostTensor bt = int_tensor({0, 1, 2, 5});
  bt.tv = TensorView::contiguous(bt.bytes.data(), DType::i32, {2, 2});
  ForwardArgs a;
  a.q = q, a.k = kc, a.v = vc, a.out = out;
  a.layout.block_table = bt.view();
  expect_error([&] { forward(a); }, "block_table", "entry [1, 1] = 5 is outside [0, num_blocks = 5)");
  bt.i32()[3] = -1;
  expect_error([&] { forward(a); }, "block_table", "= -1 is outside");
  bt.i32()[3] = 4;
  forward(a);
  a.layout.block_table = TensorView::contiguous(bt.bytes.data(), DType::i32, {2, 0});
  expect_error([&] { forward(a); }, "block_table", "needs at least one column (page) per sequence");
}

TEST(Validation, SequsedK) {
  Dense t = dense();
  HostTensor used = int_tensor({3, 8});
  ForwardArgs a = t.args();
  a.layout.seqused_k = used.view();
  expect_error([&] { forward(a); }, "seqused_k", "entry 1 = 8 is outside [0, 7]");
}

TEST(Validation, DeviceMismatch) {
  Dense t = dense();
  ForwardArgs a = t.args();
  a.k.device = {DeviceType::cuda, 0};
  expect_error([&] { forward(a); }, "k", "expected device cpu");
}

TEST(Validation, BackwardGradients) {
  Dense t = dense();
  forward(t.args());
  HostTensor dout = randn(DType::f32, {2, 5, 4, 16});
  HostTensor dq(DType::f16, {2, 5, 4, 16}), dk(DType::f32, {2, 7, 2, 16}), dv(DType::f32, {2, 7, 2, 16});
  BackwardArgs b;
  b.dout = dout, b.q = t.q, b.k = t.k, b.v = t.v, b.out = t.out, b.lse = t.lse;
  b.dq = dq, b.dk = dk, b.dv = dv;
  expect_error([&] { backward(b); }, "dq", "expected dtype float32");
  HostTensor dq32(DType::f32, {2, 5, 4, 16});
  b.dq = dq32;
  b.dv = dk;
  expect_error([&] { backward(b); }, "dv", "overlaps dk");
}

// flash_attn_qkvpacked_func's backward writes dq, dk and dv as the interleaved slices of one dqkv
// (batch, seqlen, 3, heads, d): their byte ranges overlap, their elements do not. Slices shifted into
// each other's elements are still refused, and the CPU backend writes the strided slices with the same
// bits as separate tensors.
TEST(Validation, BackwardIntoInterleavedSlicesOfOnePackedGradient) {
  Dense t = dense(2, 6, 6, 3, 3, 16);
  ForwardArgs fa = t.args();
  fa.options.causal = true;
  forward(fa);
  HostTensor dout = randn(DType::f32, {2, 6, 3, 16});
  HostTensor packed(DType::f32, {2, 6, 3, 3 * 16});  // (batch, seqlen, 3, heads x d): 4 dimensions at most
  poison(packed);
  auto slice = [&](int which, int64_t shift) {
    return TensorView::strided(static_cast<float*>(packed.tv.data) + which * 3 * 16 + shift, DType::f32,
                               {2, 6, 3, 16}, {6 * 3 * 48, 3 * 48, 16, 1});
  };
  BackwardArgs b;
  b.dout = dout, b.q = t.q, b.k = t.k, b.v = t.v, b.out = t.out, b.lse = t.lse;
  b.options.causal = true;
  b.dq = slice(0, 0), b.dk = slice(1, 0), b.dv = slice(2, 0);
  backward(b);
  HostTensor dq(DType::f32, {2, 6, 3, 16}), dk(DType::f32, {2, 6, 3, 16}), dv(DType::f32, {2, 6, 3, 16});
  BackwardArgs separate = b;
  separate.dq = dq, separate.dk = dk, separate.dv = dv;
  backward(separate);
  const HostTensor* grads[] = {&dq, &dk, &dv};
  for (int which = 0; which < 3; ++which)
    for (int64_t row = 0; row < 12; ++row)  // every (batch, token): 3 heads x 16 in both layouts
      ASSERT_EQ(std::memcmp(static_cast<const float*>(packed.tv.data) + (row * 3 + which) * 48,
                            static_cast<const float*>(grads[which]->tv.data) + row * 48, 48 * sizeof(float)),
                0)
          << "gradient " << which << ", token " << row;
  b.dv = slice(1, 8);  // half a head into dk's elements of every token
  expect_error([&] { backward(b); }, "dv", "overlaps dk");
  b.dv = slice(2, 0), b.dk = slice(0, 3 * 48);  // dq's layout one token later: shares tokens 1..5
  expect_error([&] { backward(b); }, "dk", "overlaps dq");
}

// check_no_overlap on two views of one layout (the case it decides element by element) against marking
// every byte each view covers, over random shapes, strides (overlapping themselves or not), dtypes and
// offsets.
TEST(Validation, SameLayoutOverlapMatchesByteMarking) {
  std::uniform_int_distribution<int> ndim_dist(1, 4), extent(1, 4), stride_dist(0, 24), shift(-160, 160);
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f64};
  std::vector<unsigned char> buffer(
      8192);  // views reach 2,304 bytes past their start, shifts 1,280 either side
  int refused = 0, allowed = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const DType dt = dtypes[trial % 3];
    const int64_t elem = dtype_size(dt);
    TensorView a;
    a.dtype = dt, a.ndim = ndim_dist(rng());
    for (int d = 0; d < a.ndim; ++d) a.shape[d] = extent(rng()), a.stride[d] = stride_dist(rng());
    a.data = buffer.data() + 4096;
    TensorView b = a;
    b.data = static_cast<unsigned char*>(a.data) + shift(rng()) * (trial % 7 == 0 ? 1 : elem);
    std::vector<int> owner(buffer.size(), 0);
    bool shared = false;
    for (int pass = 0; pass < 2; ++pass) {
      const TensorView& t = pass ? b : a;
      for (int64_t i = 0; i < t.numel(); ++i) {
        int64_t offset = 0, rest = i;
        for (int d = t.ndim - 1; d >= 0; --d) offset += rest % t.shape[d] * t.stride[d], rest /= t.shape[d];
        for (int64_t byte = 0; byte < elem; ++byte) {
          const size_t at = static_cast<unsigned char*>(t.data) - buffer.data() + offset * elem + byte;
          if (pass == 0) owner[at] = 1;
          shared |= pass == 1 && owner[at] == 1;
        }
      }
    }
    bool threw = false;
    try {
      core::check_no_overlap(b, "b", a, "a");
    } catch (const Error&) {
      threw = true;
    }
    // Self-overlapping views whose byte ranges meet are refused (conservative); every other answer is exact.
    bool self_overlap = false;
    try {
      core::check_no_self_overlap(a, "a", "test");
    } catch (const Error&) {
      self_overlap = true;
    }
    const auto span_a = a.byte_span(), span_b = b.byte_span();
    if (self_overlap && !shared) {
      EXPECT_EQ(threw, span_a[0] < span_b[1] && span_b[0] < span_a[1]) << "trial " << trial;
      continue;
    }
    ASSERT_EQ(threw, shared) << "trial " << trial << ": " << a.describe() << " at byte offset "
                             << static_cast<unsigned char*>(b.data) - static_cast<unsigned char*>(a.data);
    (threw ? refused : allowed)++;
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(allowed, 100);
}

TEST(Validation, BackwardFp8GradientsTakeTheOutputDtype) {
  // fp8 inputs: dq / dk / dv in out's dtype (the CPU reference computes them; test_reference_fp8_backward).
  Dense t = dense(1, 3, 3, 2, 2, 16, DType::e4m3);
  HostTensor out(DType::bf16, {1, 3, 2, 16}), dq(DType::e4m3, {1, 3, 2, 16}), dk(DType::bf16, {1, 3, 2, 16}),
      dv(DType::bf16, {1, 3, 2, 16});
  BackwardArgs b;
  b.dout = out, b.q = t.q, b.k = t.k, b.v = t.v, b.out = out, b.lse = t.lse;
  b.dq = dq, b.dk = dk, b.dv = dv;
  expect_error([&] { backward(b); }, "dq", "expected dtype bfloat16");
}

TEST(Validation, KvCache) {
  const int64_t b = 2, s_cache = 8, hk = 1, d = 8;
  HostTensor q = randn(DType::f32, {b, 1, 2, d}), out(DType::f32, {b, 1, 2, d});
  HostTensor kc = randn(DType::f32, {b, s_cache, hk, d}), vc = randn(DType::f32, {b, s_cache, hk, d});
  HostTensor kn = randn(DType::f32, {b, 2, hk, d}), vn = randn(DType::f32, {b, 2, hk, d});
  HostTensor seqlens = int_tensor({3, 7});
  KvCacheArgs a;
  a.q = q, a.k_cache = kc, a.v_cache = vc, a.out = out;
  a.k_new = kn.view();
  a.v_new = vn.view();
  a.cache_seqlens = seqlens.view();
  expect_error([&] { forward_kvcache(a); }, "cache_seqlens",
               "entry 1 = 7 plus 2 new tokens exceeds the cache capacity 8");
  seqlens.i32()[1] = 6;
  a.options.dropout_p = 0.1;
  expect_error([&] { forward_kvcache(a); }, "dropout_p", "must be 0");
  a.options.dropout_p = 0.0;
  HostTensor idx = int_tensor({0, 2});
  a.cache_batch_idx = idx.view();
  expect_error([&] { forward_kvcache(a); }, "cache_batch_idx", "entry 1 = 2 is outside [0, 2)");
  // The rows cache_batch_idx picks must exist in v_cache too (found by the fuzzer: v_cache with no rows
  // was read out of bounds).
  idx.i32()[1] = 1;
  HostTensor vc_one = randn(DType::f32, {1, s_cache, hk, d});
  a.v_cache = vc_one;
  expect_error([&] { forward_kvcache(a); }, "v_cache", "expected 2 rows like k_cache");
  a.v_cache = vc;
  a.cache_batch_idx.reset();
  // A rotary table's extent is bounded before it is doubled into rotary_dim (found by the fuzzer: an
  // extent of INT64_MIN overflowed the product).
  HostTensor cos_t = randn(DType::f32, {16, 2}), sin_t = randn(DType::f32, {16, 2});
  a.rotary_cos = cos_t.view(), a.rotary_sin = sin_t.view();
  for (int64_t half : {INT64_MIN, int64_t{0}, int64_t{d / 2 + 1}, INT64_MAX}) {
    a.rotary_cos->shape[1] = half;
    expect_error([&] { forward_kvcache(a); }, "rotary_cos", "must be in [2, head dim 8]");
  }
  a.rotary_cos.reset(), a.rotary_sin.reset();
  a.v_new.reset();
  expect_error([&] { forward_kvcache(a); }, "v_new", "together");
}

/// Varlen queries over a paged cache: q (9, 4, 8) (GQA 2:1), 4 pages of 4 slots, block table (2, 3).
struct Paged {
  HostTensor q = randn(DType::f32, {9, 4, 8}), out{DType::f32, {9, 4, 8}}, lse{DType::f32, {4, 9}};
  HostTensor kc = randn(DType::f32, {4, 4, 2, 8}), vc = randn(DType::f32, {4, 4, 2, 8});
  HostTensor cu_q = int_tensor({0, 5, 9}), cu_k, bt = int_tensor({0, 1, 2, 3, 2, 1});
  explicit Paged(std::vector<int32_t> k_lens) : cu_k(int_tensor(k_lens)) {
    bt.tv = TensorView::contiguous(bt.bytes.data(), DType::i32, {2, 3});
  }
  ForwardArgs args() const {
    ForwardArgs a;
    a.q = q, a.k = kc, a.v = vc, a.out = out;
    a.lse = lse.view();
    a.layout.cu_seqlens_q = cu_q.view();
    a.layout.cu_seqlens_k = cu_k.view();
    a.layout.block_table = bt.view();
    a.layout.max_seqlen_q = 5;
    a.layout.max_seqlen_k = 12;
    return a;
  }
};

TEST(Validation, PagedCuSeqlensKMustBeNonDecreasing) {
  // [0, -5, 7] made the fast path pack a negative length: an out-of-bounds heap write.
  Paged t({0, -5, 7});
  expect_error([&] { forward(t.args()); }, "cu_seqlens_k", "non-decreasing");
  Paged zeros({0, 10, 4});  // the second sequence silently gave zeros
  expect_error([&] { forward(zeros.args()); }, "cu_seqlens_k", "got 10 then 4 at index 2");
  Paged too_long({0, 3, 16});
  expect_error([&] { forward(too_long.args()); }, "max_seqlen_k", "has length 13 > 12");
  Paged ok({0, 3, 12});
  forward(ok.args());
}

TEST(Validation, NegativeDeviceLengthsAreEmptySequences) {
  // Device-side index tensors are never value-checked: the addressing clamps a negative length to 0.
  Paged t({0, 5, 12});
  AttnProblem p = core::build_attention(t.q, t.kc, t.vc, t.out, {}, t.args().layout, nullptr);
  core::attach_lse(p, t.lse, {});
  t.cu_k.i32()[1] = -5;  // [0, -5, 7] as a GPU kernel would read it: lengths -5 and 12
  t.cu_k.i32()[2] = 7;
  t.cu_q.i32()[1] = 11;  // query lengths 11 and -2
  EXPECT_EQ(seqlen_k(p, 0), 0);
  EXPECT_EQ(seqlen_k(p, 1), 12);
  EXPECT_EQ(key_rows(p, 0), 0);
  EXPECT_EQ(seqlen_q(p, 1), 0);
  t.cu_q.i32()[1] = 5;
  const int pad[2] = {9, 0};
  AttnProblem padded = p;
  padded.leftpad_k = pad;  // a left pad past the sequence end
  EXPECT_EQ(seqlen_k(padded, 0), 0);
  // Both CPU implementations run it: sequence 0 fully masked (0, LSE -inf), sequence 1 alike in both.
  HostTensor ref_out(DType::f32, {9, 4, 8});
  const core::Backend& cpu = *core::backend_for(DeviceType::cpu);
  cpu.forward(p, Impl::fast);
  AttnProblem r = p;
  r.o.ptr = ref_out.view().data;
  r.lse = nullptr;
  cpu.forward(r, Impl::reference);
  for (int64_t i = 0; i < 5 * 4; ++i) {  // (query, head) rows of sequence 0
    ASSERT_EQ(t.out.get(i * 8), 0.0) << "row " << i;
    ASSERT_EQ(t.lse.get((i % 4) * 9 + i / 4), -INFINITY) << "row " << i;
  }
  EXPECT_LT(max_abs_diff(t.out, ref_out), 1e-5);
}

TEST(Validation, HugeWindowIsUnbounded) {
  Dense t = dense(2, 5, 7, 2, 2, 16);
  forward(t.args());
  const HostTensor unbounded = t.out;
  for (auto [wl, wr] : {std::pair<int64_t, int64_t>{-1, INT64_MAX},
                        {INT64_MAX, -1},
                        {INT64_MAX, INT64_MAX},
                        {12, 12}}) {  // 12 = sq + sk: the first window that needs no mask
    ForwardArgs a = t.args();
    a.options.window_left = wl;
    a.options.window_right = wr;
    poison(t.out);
    forward(a);
    EXPECT_EQ(max_abs_diff(t.out, unbounded), 0.0) << "window (" << wl << ", " << wr << ")";
  }
}

TEST(Validation, ScalarsMustFitTheirKernelTypes) {
  Dense t = dense();
  for (double bad : {1e39, -1e39, 1e-300, -1e-300, double(INFINITY)}) {
    ForwardArgs a = t.args();
    a.options.softmax_scale = bad;
    expect_error([&] { forward(a); }, "softmax_scale", "fit float32");
    a = t.args();
    a.options.softcap = std::fabs(bad);
    expect_error([&] { forward(a); }, "softcap", "fit float32");
  }
  ForwardArgs a = t.args();
  a.options.dropout_p = 1e-300;
  expect_error([&] { forward(a); }, "dropout_p", "fit float32");
  Varlen v = varlen({0, 4, 4, 10}, {0, 6, 6, 12});
  a = v.args();
  a.layout.max_seqlen_q = int64_t{1} << 31;
  expect_error([&] { forward(a); }, "max_seqlen_q", "int32");
  a = v.args();
  a.layout.max_seqlen_k = -1;
  expect_error([&] { forward(a); }, "max_seqlen_k", "got -1");
}

TEST(Validation, EmptyInputsGiveEmptyOrMaskedOutputs) {
  // numpy reports stride 0 for an empty dimension: an empty view's strides address nothing.
  Dense none = dense(2, 0, 7, 4, 2, 16);
  ForwardArgs a = none.args();
  a.q.stride = {0, 0, 0, 0};
  a.out.stride = {0, 0, 0, 0};
  a.lse->stride = {0, 0, 0};
  forward(a);
  for (int64_t b : {0, 3}) {
    Dense t = dense(b, 3, 3, 4, 2, 16);
    forward(t.args());
  }
  Dense keyless = dense(2, 3, 0, 4, 2, 16);  // no keys: every row fully masked
  forward(keyless.args());
  for (int64_t i = 0; i < keyless.out.numel(); ++i) ASSERT_EQ(keyless.out.get(i), 0.0) << i;
  for (int64_t i = 0; i < keyless.lse.numel(); ++i) ASSERT_EQ(keyless.lse.get(i), -INFINITY) << i;
  float buf[1];
  EXPECT_TRUE(TensorView::strided(buf, DType::f32, {2, 0, 3}, {1, 0, 7}).is_contiguous());
}

/// A decode step: q (2, 1, 2, 8) over dense caches (2, 8, 1, 8), appending 2 tokens.
struct Decode {
  HostTensor q = randn(DType::f32, {2, 1, 2, 8}), out{DType::f32, {2, 1, 2, 8}};
  HostTensor kc = randn(DType::f32, {2, 8, 1, 8}), vc = randn(DType::f32, {2, 8, 1, 8});
  HostTensor kn = randn(DType::f32, {2, 2, 1, 8}), vn = randn(DType::f32, {2, 2, 1, 8});
  HostTensor seqlens = int_tensor({3, 5});
  KvCacheArgs args(bool append = true) const {
    KvCacheArgs a;
    a.q = q, a.k_cache = kc, a.v_cache = vc, a.out = out;
    if (append) a.k_new = kn.view(), a.v_new = vn.view();
    a.cache_seqlens = seqlens.view();
    return a;
  }
};

TEST(Validation, KvCacheReasons) {
  Decode t;
  t.seqlens.i32()[0] = -3;
  expect_error([&] { forward_kvcache(t.args()); }, "cache_seqlens", "entry 0 = -3 must be >= 0");
  t.seqlens.i32()[0] = 3;
  KvCacheArgs a = t.args();
  a.num_splits = 129;
  expect_error([&] { forward_kvcache(a); }, "num_splits", "[0, 128]");
}

TEST(Validation, KvCacheAppendMayNotAliasInputs) {
  Decode t;
  HostTensor big = randn(DType::f32, {2, 8, 1, 8});
  KvCacheArgs a = t.args();
  a.q = TensorView::contiguous(big.view().data, DType::f32, {2, 1, 2, 8});  // q inside v_cache
  a.v_cache = big.view();
  expect_error([&] { forward_kvcache(a); }, "v_cache", "overlaps q");
  a = t.args();
  a.k_new = TensorView::contiguous(big.view().data, DType::f32, {2, 2, 1, 8});  // k_new inside v_cache
  a.v_cache = big.view();
  expect_error([&] { forward_kvcache(a); }, "v_cache", "overlaps k_new");
  a = t.args();
  a.k_cache.stride[0] = 0;  // one row broadcast to the batch: appending would write it twice
  expect_error([&] { forward_kvcache(a); }, "k_cache", "must not share memory");
}

TEST(Validation, OutputsMayNotAliasSmallInputs) {
  // The fuzzer's case: out written over cache_leftpad changed the pads mid-call (the CPU forward then
  // read past K). Every output is checked against every index tensor, ALiBi, descale and rotary table.
  Decode t;
  // Each output and the input it covers share one allocation: an output laid over a small tensor alone
  // would also cover whichever tensor the heap placed next, and be named for that one.
  HostTensor out_over_seqlens(DType::f32, {2, 1, 2, 8});
  std::memcpy(out_over_seqlens.bytes.data(), t.seqlens.bytes.data(), t.seqlens.bytes.size());
  KvCacheArgs a = t.args(false);
  a.cache_seqlens = TensorView::contiguous(out_over_seqlens.bytes.data(), DType::i32, {2});
  a.out = out_over_seqlens.view();
  expect_error([&] { forward_kvcache(a); }, "out", "overlaps cache_seqlens");
  t.kc.set(0, 0.0), t.kc.set(1, 0.0);  // valid pads (0, 0) as int32 bits, inside the k_cache written
  a = t.args();
  a.cache_leftpad = TensorView::contiguous(t.kc.view().data, DType::i32, {2});
  expect_error([&] { forward_kvcache(a); }, "k_cache", "overlaps cache_leftpad");
  Paged p({0, 4, 7});
  ForwardArgs f = p.args();
  HostTensor shared(DType::f32, {4, 9});
  std::memcpy(shared.bytes.data(), p.bt.bytes.data(), p.bt.bytes.size());
  f.layout.block_table = TensorView::contiguous(shared.bytes.data(), DType::i32, {2, 3});
  f.lse = shared.view();
  expect_error([&] { forward(f); }, "lse", "overlaps block_table");
}

TEST(Validation, HugeBlockTableIsNamed) {
  // An empty block table (batch 0) with 3 * 2^61 columns: its token count overflows int64.
  Paged p({0, 4, 7});
  ForwardArgs f = p.args();
  f.layout.block_table->shape = {2, int64_t(3) << 61};
  f.layout.block_table->stride = {int64_t(3) << 61, 1};
  expect_error([&] { forward(f); }, "block_table", "");
  Decode t;
  HostTensor table(DType::i32, {0, 1});
  KvCacheArgs a = t.args(false);
  a.q.shape[0] = 0, a.out.shape[0] = 0, a.cache_seqlens->shape[0] = 0;
  a.block_table = TensorView::contiguous(table.view().data, DType::i32, {0, int64_t(3) << 61});
  expect_error([&] { forward_kvcache(a); }, "block_table", "int64");
}

TEST(Validation, KvCacheWithoutAppendIsAnInput) {
  // Nothing appended: the caches are inputs, so a broadcast cache and a q inside it are fine.
  Decode t;
  for (int64_t i = 64; i < 128; ++i) t.kc.set(i, t.kc.get(i - 64)), t.vc.set(i, t.vc.get(i - 64));
  HostTensor q_copy(DType::f32, {2, 1, 2, 8});
  for (int64_t i = 0; i < q_copy.numel(); ++i) q_copy.set(i, t.kc.get(i));
  KvCacheArgs a = t.args(false);
  a.q = q_copy;
  forward_kvcache(a);
  const HostTensor expected = t.out;
  a.k_cache.stride[0] = 0, a.v_cache.stride[0] = 0;  // row 0 broadcast to both batch entries
  a.q = TensorView::contiguous(t.kc.view().data, DType::f32, {2, 1, 2, 8});  // q reads k_cache's memory
  poison(t.out);
  forward_kvcache(a);
  EXPECT_EQ(max_abs_diff(t.out, expected), 0.0);
}

TEST(Validation, MergeStates) {
  HostTensor oa = randn(DType::f32, {1, 3, 2, 8}), ob = randn(DType::f32, {1, 3, 2, 8});
  HostTensor la = randn(DType::f32, {1, 2, 3}), lb = randn(DType::f32, {1, 3, 2});
  HostTensor out(DType::f32, {1, 3, 2, 8});
  MergeArgs m{oa, la, ob, lb, out, std::nullopt, nullptr};
  expect_error([&] { merge_states(m); }, "lse_b", "expected shape (1, 2, 3)");
  HostTensor empty(DType::f32, {1, 3, 2, 0});
  MergeArgs z{empty, la, empty, la, empty, std::nullopt, nullptr};
  expect_error([&] { merge_states(z); }, "out_a", "head dim must be >= 1");
}

TEST(TensorView, DescribeSpanContiguity) {
  float buf[24];
  TensorView t = TensorView::contiguous(buf, DType::f32, {2, 3, 4});
  EXPECT_EQ(t.describe(), "(2, 3, 4) float32 cpu");
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.byte_span()[1] - t.byte_span()[0], sizeof(buf));
  TensorView s = TensorView::strided(buf, DType::f32, {2, 2}, {12, 2});
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.byte_span()[1] - s.byte_span()[0], (12 + 2 + 1) * sizeof(float));
}

}  // namespace
}  // namespace flashport::test
