// The CPU reference backward on fp8 inputs (SPEC "Backward", fp8: gradients with respect to the fp8
// tensors' values, the descales being constants, in the output dtype), by the chain rule: with
// x = x8 * descale exactly (fp8check's descales keep the product a bf16), dL/dx8 = dL/dx * descale, where
// dL/dx is the same reference backward on the dequantised inputs (fp32, no descales), itself checked
// against finite differences (test_reference_backward.cpp). e4m3 and e5m2, dense and varlen (an empty
// sequence), causal and window, GQA 3:1; gradients poisoned beforehand.
#include <cmath>

#include "hip/hip_fp8_inputs.hpp"

namespace flashport::test {
namespace {

/// Forward and backward of `c` on `in` (descales attached for fp8) into fp32 out / dout / gradients.
fastcheck::Grads grads_of(const Case& c, const fastcheck::Inputs& in, const HostTensor* descale,
                          const HostTensor& dout) {
  fastcheck::Forward f = fp8check::outputs(c, DType::f32);
  forward(fp8check::args(c, in, descale, f, Impl::reference));
  auto shaped = [](const HostTensor& t) {
    HostTensor g(DType::f32, shape_of(t));
    poison(g);
    return g;
  };
  fastcheck::Grads g{shaped(in.q), shaped(in.k), shaped(in.v)};
  BackwardArgs a;
  a.dout = dout, a.q = in.q, a.k = in.k, a.v = in.v, a.out = f.out, a.lse = f.lse;
  a.dq = g.dq, a.dk = g.dk, a.dv = g.dv;
  a.options = fastcheck::options(c, in);
  if (descale) {
    a.options.q_descale = descale[0].view(), a.options.k_descale = descale[1].view();
    a.options.v_descale = descale[2].view();
  }
  a.layout = fastcheck::layout(c, in);
  a.impl = Impl::automatic;  // fp8 inputs: the reference
  backward(a);
  return g;
}

void expect_chain_rule(const Case& c) {
  SCOPED_TRACE(c.describe());
  const fp8check::Inputs in = fp8check::make(c);
  fastcheck::Inputs deq = in.deq;
  deq.q = in.deq.q.as(DType::f32), deq.k = in.deq.k.as(DType::f32), deq.v = in.deq.v.as(DType::f32);
  HostTensor dout = randn(DType::f32, out_shape(c));
  const fastcheck::Grads g8 = grads_of(c, in.fp8, in.descale, dout);
  Case c32 = c;
  c32.dtype = DType::f32;
  const fastcheck::Grads g = grads_of(c32, deq, nullptr, dout);
  const HostTensor* got[3] = {&g8.dq, &g8.dk, &g8.dv};
  const HostTensor* base[3] = {&g.dq, &g.dk, &g.dv};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int w = 0; w < 3; ++w) {
    double worst = 0.0, scale = 1e-30;
    for (int64_t n = 0; n < got[w]->numel(); ++n) {
      const double want = base[w]->get(n) * fp8check::descale_of(c, in, w, n);
      worst = std::max(worst, std::abs(got[w]->get(n) - want));
      scale = std::max(scale, std::abs(want));
    }
    int64_t nan = 0;
    for (int64_t n = 0; n < got[w]->numel(); ++n) nan += std::isnan(got[w]->get(n)) ? 1 : 0;
    EXPECT_EQ(nan, 0) << names[w] << " elements unwritten";
    EXPECT_LE(worst, 1e-5 * scale) << names[w] << ": dL/dx8 != dL/dx * descale";
  }
}

TEST(ReferenceFp8Backward, ChainRuleThroughTheDescales) {
  expect_chain_rule(with(dense(DType::e4m3, 2, 13, 21, 6, 2, 32), kCausal));  // GQA 3:1
  expect_chain_rule(dense(DType::e5m2, 1, 17, 9, 2, 2, 48));                  // sq > sk
  Case w = dense(DType::e4m3, 1, 19, 25, 2, 1, 16);
  w.wl = 4, w.wr = 2;
  expect_chain_rule(w);
  expect_chain_rule(varlen(dense(DType::e4m3, 1, 1, 1, 3, 1, 32), {5, 0, 11}, {7, 4, 0}));
}

TEST(ReferenceFp8Backward, GradientsComeInTheOutputDtype) {
  const Case c = dense(DType::e4m3, 1, 5, 6, 2, 1, 16);
  const fp8check::Inputs in = fp8check::make(c);
  fastcheck::Forward f = fp8check::outputs(c, DType::bf16);
  forward(fp8check::args(c, in.fp8, in.descale, f, Impl::reference));
  HostTensor dq(DType::e4m3, {1, 5, 2, 16}), dk(DType::bf16, {1, 6, 1, 16}), dv(DType::bf16, {1, 6, 1, 16});
  BackwardArgs a;
  a.dout = f.out, a.q = in.fp8.q, a.k = in.fp8.k, a.v = in.fp8.v, a.out = f.out, a.lse = f.lse;
  a.dq = dq, a.dk = dk, a.dv = dv;
  try {
    backward(a);
    ADD_FAILURE() << "an fp8 dq was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "dq");
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashport::test
