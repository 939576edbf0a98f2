// Bad device-resident cu_seqlens on the paths that store rows by address (the Hopper forward's O / LSE
// epilogue, the backward's dQ / dK / dV): nothing outside the outputs may change. Each output is a view into
// a larger buffer whose guard rows before and after it are poisoned and must stay so. Sizes are large
// enough for the Hopper families on sm_90 (the portable ones elsewhere); the device check reports the
// fault afterwards. Named *Small* so the compute-sanitizer sweep runs them too.
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

/// A tensor of `shape` (outer dimension first) with `guard` poisoned outer rows before and after it in one
/// device buffer.
struct Guarded {
  HostTensor host;
  DeviceTensor dev;
  int64_t guard_elems;

  Guarded(DType dt, std::vector<int64_t> shape, int64_t guard_rows) {
    int64_t row = 1;
    for (size_t i = 1; i < shape.size(); ++i) row *= shape[i];
    std::vector<int64_t> big = shape;
    big[0] += 2 * guard_rows;
    host = HostTensor(dt, big);
    std::fill(host.bytes.begin(), host.bytes.end(), 0xFF);  // NaN in every float type
    guard_elems = guard_rows * row;
    TensorView view = host.tv;
    view.shape[0] = shape[0];
    view.data = host.bytes.data() + guard_elems * (int64_t)dtype_size(dt);
    dev = DeviceTensor::from_view(host, view);
  }
  TensorView view() const { return dev.view(); }
  /// Elements of the guard rows that are no longer poisoned.
  int64_t guard_writes() const {
    const HostTensor back = dev.to_host(host);
    int64_t n = 0;
    const int64_t total = back.numel();
    for (int64_t i = 0; i < guard_elems; ++i)
      n += !std::isnan(back.get(i)) + !std::isnan(back.get(total - 1 - i));
    return n;
  }
};

DeviceTensor device_ints(const std::vector<int32_t>& v) {
  return DeviceTensor::from(int_tensor(v));
}

TEST(GpuIndexGuardsSmall, ForwardRowsStayInsideOutAndLse) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "host-resident indices are validated by the core";
  const int64_t h = 16, d = 128, total = 3000, max_len = 1024;
  const HostTensor q = randn(DType::bf16, {total, h, d}), k = randn(DType::bf16, {total, h, d});
  const DeviceTensor dq = DeviceTensor::from(q), dk = DeviceTensor::from(k), dv = DeviceTensor::from(k);
  const DeviceTensor cu_k = device_ints({0, 1024, 2048, 3000});
  // Past the end of the queries; a negative start (its length, 1024, is in range); valid, as a control.
  for (const std::vector<int32_t>& cu :
       {std::vector<int32_t>{0, 1024, 2048, 4000}, std::vector<int32_t>{-512, 512, 1536, 2560},
        std::vector<int32_t>{0, 1024, 2048, 3000}}) {
    SCOPED_TRACE("cu_seqlens_q " + std::to_string(cu[0]) + " .. " + std::to_string(cu[3]));
    const DeviceTensor cu_q = device_ints(cu);
    Guarded out(DType::bf16, {total, h, d}, 1024);
    Guarded lse(DType::f32, {h * total}, 2048);
    ForwardArgs a;
    a.q = dq.view(), a.k = dk.view(), a.v = dv.view(), a.out = out.view();
    TensorView lse_view = lse.view();
    lse_view.ndim = 2, lse_view.shape[0] = h, lse_view.shape[1] = total, lse_view.stride[0] = total;
    lse_view.stride[1] = 1;
    a.lse = lse_view;
    a.layout.cu_seqlens_q = cu_q.view(), a.layout.cu_seqlens_k = cu_k.view();
    a.layout.max_seqlen_q = max_len, a.layout.max_seqlen_k = max_len;
    a.options.causal = true;
    forward(a);
    EXPECT_EQ(out.guard_writes(), 0);
    EXPECT_EQ(lse.guard_writes(), 0);
    if (cu[3] != 3000 || cu[0] != 0)
      expect_device_fault({"cu_seqlens_q", "max_seqlen_q"}, "");
    else
      EXPECT_NO_THROW(check_device(Device{DeviceType::cuda, 0}));
  }
}

TEST(GpuIndexGuardsSmall, BackwardRowsStayInsideGradients) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "host-resident indices are validated by the core";
  const int64_t h = 8, d = 64, total_q = 512, total_k = 600;
  const HostTensor q = randn(DType::bf16, {total_q, h, d}), k = randn(DType::bf16, {total_k, h, d});
  const HostTensor dout = randn(DType::bf16, {total_q, h, d});
  const DeviceTensor dq_in = DeviceTensor::from(q), dk_in = DeviceTensor::from(k),
                     dv_in = DeviceTensor::from(k);
  const DeviceTensor ddout = DeviceTensor::from(dout);
  const DeviceTensor cu_q = device_ints({0, 256, 512});
  // Sequence 1's keys run past the 600 rows; a control with valid keys.
  for (const std::vector<int32_t>& cu :
       {std::vector<int32_t>{0, 300, 900}, std::vector<int32_t>{0, 300, 600}}) {
    SCOPED_TRACE("cu_seqlens_k ends at " + std::to_string(cu[2]));
    const DeviceTensor cu_k = device_ints(cu);
    HostTensor out_h(DType::bf16, {total_q, h, d}), lse_h(DType::f32, {h, total_q});
    const DeviceTensor out = DeviceTensor::poisoned(out_h), lse = DeviceTensor::poisoned(lse_h);
    SequenceLayout lay;
    lay.cu_seqlens_q = cu_q.view(), lay.cu_seqlens_k = cu_k.view();
    lay.max_seqlen_q = 256, lay.max_seqlen_k = 600;
    ForwardArgs f;
    f.q = dq_in.view(), f.k = dk_in.view(), f.v = dv_in.view(), f.out = out.view(), f.lse = lse.view();
    f.layout = lay;
    forward(f);
    if (cu[2] != 600) expect_device_fault({"cu_seqlens_k", "max_seqlen_k"}, "");
    Guarded gq(DType::bf16, {total_q, h, d}, 256), gk(DType::bf16, {total_k, h, d}, 512),
        gv(DType::bf16, {total_k, h, d}, 512);
    BackwardArgs b;
    b.dout = ddout.view(), b.q = dq_in.view(), b.k = dk_in.view(), b.v = dv_in.view(), b.out = out.view();
    b.lse = lse.view(), b.dq = gq.view(), b.dk = gk.view(), b.dv = gv.view(), b.layout = lay;
    backward(b);
    EXPECT_EQ(gq.guard_writes(), 0);
    EXPECT_EQ(gk.guard_writes(), 0);
    EXPECT_EQ(gv.guard_writes(), 0);
    if (cu[2] != 600)
      expect_device_fault({"cu_seqlens_k", "max_seqlen_k"}, "");
    else
      EXPECT_NO_THROW(check_device(Device{DeviceType::cuda, 0}));
  }
}

}  // namespace
}  // namespace flashport::test::gpu
