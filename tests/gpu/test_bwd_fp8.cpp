// The fp8 backward on CUDA (launch_backward_fp8: q, k, v dequantised by fp8_scale.cu into the output
// dtype, that dtype's backward, the gradients times their (sequence, kv head) descales) against the CPU
// reference's fp8 backward (fp64; SPEC "Backward", fp8: gradients with respect to the fp8 values) by SPEC's
// gradient rule (3x), the baseline being, as SPEC's rule has it for FP8, the naive bf16 backward of the
// dequantised inputs times the descales (the chain rule the reference obeys,
// test_reference_fp8_backward.cpp). fp32 out must also come within 1/16 of that baseline's error: it computes
// in fp32, not in bf16. (An fp32 baseline made the rule flaky there, failing about 1 seed in 60: dequantised
// fp8 values carry 3-4 significant bits, so its products are exact and its error, a few 1e-6, is a bound no
// kernel with approximate exponentials meets every time.) e4m3 and e5m2, fp32 and bf16 out, GQA, causal /
// window, varlen with an empty sequence; gradients poisoned. fp32 out runs under the kernel emulator too (its
// fp32 backward is emulated; the 16-bit one is not).
#include "common/grad_baseline.hpp"
#include "gpu/gpu_fp8_util.hpp"

namespace flashport::test::gpu {
namespace {

/// The fp8 backward of `c` (output dtype `out`) on cuda:0 and the rule's checks.
void expect_fp8_backward(const Case& c, DType out) {
  SCOPED_TRACE(c.describe() + " out " + dtype_name(out));
  const fp8check::Inputs in = fp8check::make(c);
  // Out and LSE as the forward hands them over (the CPU reference, out in `out`), and dO.
  fastcheck::Forward f = fp8check::outputs(c, out);
  forward(fp8check::args(c, in.fp8, in.descale, f, Impl::reference));
  const HostTensor dout = randn(out, out_shape(c));

  // The oracle: the reference fp8 backward with fp32 out / dO / gradients (the same values).
  fastcheck::Grads ref{HostTensor(DType::f32, shape_of(in.fp8.q)), HostTensor(DType::f32, shape_of(in.fp8.k)),
                       HostTensor(DType::f32, shape_of(in.fp8.v))};
  {
    const HostTensor out32 = f.out.as(DType::f32), dout32 = dout.as(DType::f32);
    BackwardArgs a;
    a.q = in.fp8.q, a.k = in.fp8.k, a.v = in.fp8.v, a.out = out32, a.dout = dout32, a.lse = f.lse;
    a.dq = ref.dq, a.dk = ref.dk, a.dv = ref.dv;
    a.options = fastcheck::options(c, in.fp8);
    a.options.q_descale = in.descale[0].view(), a.options.k_descale = in.descale[1].view();
    a.options.v_descale = in.descale[2].view();
    a.layout = fastcheck::layout(c, in.fp8);
    a.impl = Impl::reference;
    backward(a);
  }
  // The baseline: the dequantised problem's naive backward in bf16, times the descales.
  Case cd = c;
  cd.dtype = DType::bf16;
  BaselineGrads base =
      baseline_backward(cd, in.deq.q.as(DType::bf16), in.deq.k.as(DType::bf16), in.deq.v.as(DType::bf16),
                        dout, in.fp8.alibi, fastcheck::options(c, in.fp8));
  HostTensor* base_g[3] = {&base.dq, &base.dk, &base.dv};
  for (int w = 0; w < 3; ++w)
    for (int64_t n = 0; n < base_g[w]->numel(); ++n)
      base_g[w]->set(n, base_g[w]->get(n) * fp8check::descale_of(c, in, w, n));

  // The device run: fp8 inputs and descales, out / dO / LSE, poisoned gradients in `out`.
  DeviceCopies dev;
  HostTensor grads[3] = {HostTensor(out, shape_of(in.fp8.q)), HostTensor(out, shape_of(in.fp8.k)),
                         HostTensor(out, shape_of(in.fp8.v))};
  std::vector<DeviceTensor> d_grads;
  for (HostTensor& g : grads) {
    poison(g);
    d_grads.push_back(DeviceTensor::from(g));
  }
  BackwardArgs a;
  a.q = dev.shell(in.fp8.q).tv, a.k = dev.shell(in.fp8.k).tv, a.v = dev.shell(in.fp8.v).tv;
  a.out = dev.shell(f.out).tv, a.dout = dev.shell(dout).tv, a.lse = dev.shell(f.lse).tv;
  a.dq = d_grads[0].view(), a.dk = d_grads[1].view(), a.dv = d_grads[2].view();
  fastcheck::Inputs idx;
  idx.cu_q = dev.shell(in.fp8.cu_q), idx.cu_k = dev.shell(in.fp8.cu_k), idx.used_k = dev.shell(in.fp8.used_k);
  a.options = fastcheck::options(c, in.fp8);
  const HostTensor ds[3] = {dev.shell(in.descale[0]), dev.shell(in.descale[1]), dev.shell(in.descale[2])};
  a.options.q_descale = ds[0].tv, a.options.k_descale = ds[1].tv, a.options.v_descale = ds[2].tv;
  a.layout = fastcheck::layout(c, idx);
  backward(a);
  const char* names[3] = {"dq", "dk", "dv"};
  const HostTensor* ref_g[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int w = 0; w < 3; ++w) {
    const HostTensor got = d_grads[w].to_host(grads[w]);
    EXPECT_EQ(count_nan(got), 0) << names[w] << " elements unwritten";
    EXPECT_TRUE(accuracy_rule(got, *base_g[w], *ref_g[w], 3.0)) << names[w];
    if (out == DType::f32) {
      EXPECT_LE(max_abs_diff(got, *ref_g[w]), max_abs_diff(*base_g[w], *ref_g[w]) / 16)
          << names[w] << ": fp32 out with a bf16-sized error";
    }
  }
}

TEST(GpuBackwardFp8, F32OutEveryFormat) {
  FP_SKIP_WITHOUT_GPU();
  expect_fp8_backward(with(dense(DType::e4m3, 2, 37, 53, 6, 2, 64), kCausal), DType::f32);  // GQA 3:1
  expect_fp8_backward(dense(DType::e5m2, 1, 70, 45, 2, 2, 128), DType::f32);                // sq > sk
  Case v = varlen(dense(DType::e4m3, 1, 1, 1, 4, 1, 64), {21, 0, 66}, {30, 9, 70});
  v.wl = 12, v.wr = 0;
  expect_fp8_backward(v, DType::f32);
}

TEST(GpuBackwardFp8, Bf16Out) {
  FP_SKIP_WITHOUT_GPU();
  if (kEmulated) GTEST_SKIP() << "the 16-bit backward is not emulated";
  expect_fp8_backward(with(dense(DType::e4m3, 2, 113, 203, 4, 2, 128), kCausal), DType::bf16);
  expect_fp8_backward(varlen(dense(DType::e5m2, 1, 1, 1, 2, 2, 64), {0, 50, 130}, {7, 60, 140}), DType::bf16);
}

}  // namespace
}  // namespace flashport::test::gpu
