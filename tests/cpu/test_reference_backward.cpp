// The CPU reference backward against central finite differences of the reference forward in fp64.
#include <functional>

#include "cpu/test_reference_util.hpp"

namespace flashport::test {
namespace {

/// One problem for the gradient check: fp64 inputs, the output/LSE shapes, options and layout.
struct GradCase {
  std::string name;
  HostTensor q, k, v;
  std::vector<int64_t> out_shape, lse_shape;
  AttentionOptions options;
  SequenceLayout layout;
  HostTensor alibi, cu_q, cu_k, used;  // owners of what options/layout point at
};

void run_fwd(const GradCase& gc, HostTensor& out, HostTensor& lse) {
  ForwardArgs a;
  a.q = gc.q, a.k = gc.k, a.v = gc.v, a.out = out, a.lse = lse.view();
  a.options = gc.options;
  a.layout = gc.layout;
  a.impl = Impl::reference;
  forward(a);
}

double loss(const GradCase& gc, const HostTensor& dout) {
  HostTensor out(DType::f64, gc.out_shape), lse(DType::f32, gc.lse_shape);
  run_fwd(gc, out, lse);
  double l = 0.0;
  for (int64_t n = 0; n < out.numel(); ++n) l += out.get(n) * dout.get(n);
  return l;
}

/// dQ, dK, dV from the reference backward equal d(sum(out * dout)) / d(q, k, v) by central differences.
void check_gradients(GradCase gc, double tol = 1e-6) {
  SCOPED_TRACE(gc.name);
  HostTensor out(DType::f64, gc.out_shape), lse(DType::f32, gc.lse_shape);
  poison(out);
  poison(lse);
  run_fwd(gc, out, lse);
  const HostTensor dout = randn(DType::f64, gc.out_shape);
  HostTensor dq(DType::f64,
                std::vector<int64_t>(gc.q.tv.shape.begin(), gc.q.tv.shape.begin() + gc.q.tv.ndim));
  HostTensor dk(DType::f64,
                std::vector<int64_t>(gc.k.tv.shape.begin(), gc.k.tv.shape.begin() + gc.k.tv.ndim));
  HostTensor dv(DType::f64,
                std::vector<int64_t>(gc.v.tv.shape.begin(), gc.v.tv.shape.begin() + gc.v.tv.ndim));
  poison(dq);
  poison(dk);
  poison(dv);
  BackwardArgs b;
  b.dout = dout, b.q = gc.q, b.k = gc.k, b.v = gc.v, b.out = out, b.lse = lse;
  b.dq = dq, b.dk = dk, b.dv = dv;
  b.options = gc.options;
  b.layout = gc.layout;
  b.impl = Impl::reference;
  backward(b);

  const double eps = 1e-6;
  HostTensor* inputs[3] = {&gc.q, &gc.k, &gc.v};
  const HostTensor* grads[3] = {&dq, &dk, &dv};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int w = 0; w < 3; ++w) {
    HostTensor& x = *inputs[w];
    double max_grad = 0.0, max_err = 0.0;
    for (int64_t n = 0; n < x.numel(); ++n) {
      const double analytic = grads[w]->get(n);
      ASSERT_FALSE(std::isnan(analytic)) << names[w] << "[" << n << "]";
      const double x0 = x.get(n);
      x.set(n, x0 + eps);
      const double up = loss(gc, dout);
      x.set(n, x0 - eps);
      const double down = loss(gc, dout);
      x.set(n, x0);
      const double fd = (up - down) / (2 * eps);
      max_grad = std::max(max_grad, std::fabs(analytic));
      max_err = std::max(max_err, std::fabs(fd - analytic));
    }
    EXPECT_GT(max_grad, 0.0) << names[w];
    EXPECT_LE(max_err, tol * std::max(max_grad, 1.0)) << names[w] << ": max grad " << max_grad;
  }
}

GradCase dense_case(std::string name, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d,
                    int64_t dv) {
  GradCase gc;
  gc.name = std::move(name);
  gc.q = randn(DType::f64, {b, sq, hq, d});
  gc.k = randn(DType::f64, {b, sk, hk, d});
  gc.v = randn(DType::f64, {b, sk, hk, dv});
  gc.out_shape = {b, sq, hq, dv};
  gc.lse_shape = {b, hq, sq};
  return gc;
}

TEST(ReferenceBackward, PlainAndUnequalLengths) {
  check_gradients(dense_case("plain", 2, 5, 7, 2, 2, 4, 3));
  check_gradients(dense_case("sq > sk", 1, 8, 3, 2, 1, 5, 5));
  check_gradients(dense_case("one query", 1, 1, 3, 1, 1, 3, 2));
}

TEST(ReferenceBackward, CausalAndWindow) {
  GradCase gc = dense_case("causal sq < sk", 2, 4, 7, 2, 1, 4, 3);
  gc.options.causal = true;
  check_gradients(gc);
  gc = dense_case("causal sq > sk (fully masked rows)", 1, 7, 3, 2, 2, 4, 4);
  gc.options.causal = true;
  check_gradients(gc);
  gc = dense_case("window (2, 1)", 1, 6, 8, 2, 1, 4, 3);
  gc.options.window_left = 2, gc.options.window_right = 1;
  check_gradients(gc);
}

TEST(ReferenceBackward, SoftcapAndAlibi) {
  GradCase gc = dense_case("softcap", 2, 5, 6, 2, 2, 4, 4);
  gc.options.softcap = 1.5;
  gc.options.softmax_scale = 0.9;
  check_gradients(gc);
  for (int mode : {1, 2}) {
    gc = dense_case(mode == 1 ? "alibi (hq,)" : "alibi (b, hq)", 2, 4, 6, 2, 1, 3, 3);
    gc.alibi = mode == 1 ? HostTensor(DType::f32, {2}) : HostTensor(DType::f32, {2, 2});
    for (int64_t n = 0; n < gc.alibi.numel(); ++n) gc.alibi.set(n, 0.1 + 0.3 * n);
    gc.options.alibi_slopes = gc.alibi.view();
    gc.options.causal = mode == 1;
    check_gradients(gc);
  }
}

TEST(ReferenceBackward, Gqa7To1) {
  check_gradients(dense_case("gqa 7:1", 1, 3, 4, 7, 1, 3, 2));
}

TEST(ReferenceBackward, Dropout) {
  GradCase gc = dense_case("dropout 0.3", 2, 5, 6, 2, 1, 3, 3);
  gc.options.dropout_p = 0.3;
  gc.options.dropout_seed = rng()();
  gc.options.dropout_offset = 12;
  check_gradients(gc);
}

TEST(ReferenceBackward, VarlenWithEmptySequencesAndSeqused) {
  // Sequence 1 has no queries, sequence 2 has queries but no keys; sequence 0 uses 3 of its 4 keys.
  GradCase gc;
  gc.name = "varlen";
  const int64_t hq = 2, hk = 1, d = 3, dv = 2;
  gc.q = randn(DType::f64, {7, hq, d});
  gc.k = randn(DType::f64, {6, hk, d});
  gc.v = randn(DType::f64, {6, hk, dv});
  gc.out_shape = {7, hq, dv};
  gc.lse_shape = {hq, 7};
  gc.cu_q = int_tensor({0, 3, 3, 7});
  gc.cu_k = int_tensor({0, 4, 6, 6});
  gc.used = int_tensor({3, 2, 0});
  gc.layout.cu_seqlens_q = gc.cu_q.view(), gc.layout.cu_seqlens_k = gc.cu_k.view();
  gc.layout.seqused_k = gc.used.view();
  gc.layout.max_seqlen_q = 4, gc.layout.max_seqlen_k = 4;
  gc.options.causal = true;
  check_gradients(gc);
}

/// Rows that see no key contribute nothing: their dQ rows are exactly 0, as are dK/dV of keys nobody sees.
TEST(ReferenceBackward, FullyMaskedRowsGiveZeroGradients) {
  const int64_t sq = 6, sk = 2, hq = 2, d = 8;
  HostTensor q = randn(DType::f32, {1, sq, hq, d}), k = randn(DType::f32, {1, sk, hq, d}),
             v = randn(DType::f32, {1, sk, hq, d}), out(DType::f32, {1, sq, hq, d}),
             lse(DType::f32, {1, hq, sq});
  ForwardArgs a;
  a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse.view();
  a.options.causal = true;
  a.impl = Impl::reference;
  forward(a);
  HostTensor dout = randn(DType::f32, {1, sq, hq, d}), dq(DType::f32, {1, sq, hq, d}),
             dk(DType::f32, {1, sk, hq, d}), dv(DType::f32, {1, sk, hq, d});
  poison(dq);
  poison(dk);
  poison(dv);
  BackwardArgs b;
  b.dout = dout, b.q = q, b.k = k, b.v = v, b.out = out, b.lse = lse, b.dq = dq, b.dk = dk, b.dv = dv;
  b.options = a.options;
  b.impl = Impl::reference;
  backward(b);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t e = 0; e < hq * d; ++e) {
      const double g = dq.get(i * hq * d + e);
      if (i < sq - sk) {
        ASSERT_EQ(g, 0.0) << i;
      } else {
        ASSERT_FALSE(std::isnan(g));
      }
    }
  for (int64_t n = 0; n < dk.numel(); ++n) ASSERT_FALSE(std::isnan(dk.get(n)) || std::isnan(dv.get(n)));
}

/// The error names the reason, so a rejection for some other (validation) cause cannot pass.
void expect_rejected(const BackwardArgs& b, const std::string& reason) {
  try {
    backward(b);
    ADD_FAILURE() << "expected an Error mentioning '" << reason << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

TEST(ReferenceBackward, UnsupportedCombinationsAreRejected) {
  const auto make = [](std::vector<int64_t> shape) { return randn(DType::f32, std::move(shape)); };
  HostTensor q = make({1, 4, 1, 8}), k = make({1, 4, 1, 8}), v = make({1, 4, 1, 8}),
             dout = make({1, 4, 1, 8});
  HostTensor out = make({1, 4, 1, 8}), lse = make({1, 1, 4}), dq = make({1, 4, 1, 8}),
             dk = make({1, 4, 1, 8}), dv = make({1, 4, 1, 8});
  BackwardArgs b;
  b.dout = dout, b.q = q, b.k = k, b.v = v, b.out = out, b.lse = lse, b.dq = dq, b.dk = dk, b.dv = dv;
  b.impl = Impl::baseline;
  expect_rejected(b, "baseline");
  // Paged K/V: (2 blocks of 2 tokens) through a block table.
  HostTensor k_pages = make({2, 2, 1, 8}), v_pages = make({2, 2, 1, 8}), dk_pages = make({2, 2, 1, 8}),
             dv_pages = make({2, 2, 1, 8}), table = int_tensor({1, 0});
  table.tv = TensorView::contiguous(table.bytes.data(), DType::i32, {1, 2});
  b.k = k_pages, b.v = v_pages, b.dk = dk_pages, b.dv = dv_pages;
  b.layout.block_table = table.view();
  b.impl = Impl::reference;
  expect_rejected(b, "paged");
}

}  // namespace
}  // namespace flashport::test
