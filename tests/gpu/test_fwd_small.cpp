// A quick cross-section of the forward-side CUDA paths on tiny shapes, for compute-sanitizer
// (scripts/gpu_suite.sh runs memcheck and racecheck on tests matching *Small*).
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

TEST(GpuForwardSmall, DenseMasksAndFeatures) {
  FP_SKIP_WITHOUT_GPU();
  Case c = dense(DType::bf16, 1, 70, 90, 2, 1, 64);
  expect_forward_accurate(c);
  c.causal = true, c.softcap = 4.0, c.alibi = 1, c.dropout = 0.2;
  expect_forward_accurate(c);
  Case f = dense(DType::f16, 1, 33, 17, 1, 1, 40);  // sq > sk: empty rows; d padded to 64
  f.causal = true, f.pad = 3;                       // unaligned rows: scalar loads and stores
  expect_forward_accurate(f);
}

TEST(GpuForwardSmall, VarlenAndPaged) {
  FP_SKIP_WITHOUT_GPU();
  expect_forward_accurate(varlen(dense(DType::bf16, 1, 1, 1, 2, 1, 128), {0, 20, 1}, {3, 50, 0}));
  expect_forward_accurate(paged(dense(DType::bf16, 2, 5, 0, 4, 2, 64), 1, {19, 3}));
}

TEST(GpuForwardSmall, SplitKv) {
  FP_SKIP_WITHOUT_GPU();
  expect_forward_accurate(dense(DType::bf16, 1, 1, 300, 2, 1, 64));  // heuristic: several splits
}

/// The decode variant (FP_DECODE: query rows, GQA heads packed in, <= 16; warps split the keys and
/// merge at the end): warps with no key tile, the 2-warp d 256 shape, rows without keys, masks, every
/// score feature, splits, varlen and a paged cache.
TEST(GpuForwardSmall, DecodeVariant) {
  FP_SKIP_WITHOUT_GPU();
  expect_forward_accurate(dense(DType::bf16, 1, 2, 203, 7, 1, 40));  // GQA 7:1, 14 rows, d padded
  expect_forward_accurate(with(dense(DType::f16, 2, 16, 113, 3, 3, 64), kCausal));  // 16 rows, MHA
  expect_forward_accurate(with(dense(DType::bf16, 1, 3, 2, 4, 1, 128), kCausal));   // sq > sk: empty rows
  expect_forward_accurate(dense(DType::bf16, 1, 1, 40, 2, 1, 64));     // 2-3 key tiles: warps idle
  expect_forward_accurate(dense(DType::bf16, 1, 1, 1000, 4, 2, 256));  // 2 warps, splits
  Case f = dense(DType::bf16, 2, 1, 500, 8, 2, 128);
  f.wl = 100, f.softcap = 4.0, f.alibi = 2, f.dropout = 0.2, f.q_stddev = 3.0;
  expect_forward_accurate(f);
  expect_forward_accurate(varlen(dense(DType::bf16, 1, 1, 1, 8, 1, 128), {1, 0, 2}, {300, 5, 0}));
  expect_forward_accurate(with(paged(dense(DType::f16, 2, 1, 0, 4, 1, 96), 7, {150, 64}), kCausal));
}

/// Index tensors in device memory are not validated by the core (it cannot read them): the kernels
/// must treat bad entries as empty sequences / zero keys instead of reading or writing out of bounds.
/// Outputs are unspecified where indices are bad; here every output row still gets written.
TEST(GpuForwardSmall, InvalidDeviceIndicesStayInBounds) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "host-resident indices are validated by the core";
  const int64_t hq = 2, d = 64;
  const HostTensor q = randn(DType::bf16, {20, hq, d}), k = randn(DType::bf16, {80, 1, d}),
                   v = randn(DType::bf16, {80, 1, d});
  // q: sequence 1 has a negative length; k: sequence 1 decreases and sequence 2 runs past total_k.
  const HostTensor cu_q = int_tensor({0, 10, 5, 20}), cu_k = int_tensor({0, 50, 30, 200});
  const DeviceTensor dq = DeviceTensor::from(q), dk = DeviceTensor::from(k), dv = DeviceTensor::from(v);
  const DeviceTensor dcq = DeviceTensor::from(cu_q), dck = DeviceTensor::from(cu_k);
  HostTensor out_host(DType::bf16, {20, hq, d});
  const DeviceTensor out = DeviceTensor::poisoned(out_host);
  ForwardArgs a;
  a.q = dq.view(), a.k = dk.view(), a.v = dv.view(), a.out = out.view();
  a.layout.cu_seqlens_q = dcq.view(), a.layout.cu_seqlens_k = dck.view();
  a.layout.max_seqlen_q = 15, a.layout.max_seqlen_k = 200;
  a.options.causal = true;
  forward(a);
  EXPECT_EQ(count_nan(out.to_host(out_host)), 0);
  // The device check found the first broken rule and the next look at the device raises it (once).
  expect_device_fault({"cu_seqlens_q", "cu_seqlens_k"}, "must");

  // Paged: block-table entries outside [0, num_blocks) read as zero keys; cache lengths past the table
  // clamp.
  Case c = dense(DType::bf16, 2, 3, 0, 4, 1, 64);
  c.layout = Layout::paged, c.page = 16, c.k_lens = {40, 20};
  FwdInputs in = make_inputs(c);
  in.block_table.i32()[1] = -5;
  in.block_table.i32()[2] = 1 << 24;
  in.used_k = int_tensor({1000, -7});
  c.used_k = {40, 20};  // makes run_gpu pass the (overwritten) seqused_k tensor
  const GpuResult r = run_gpu(c, in);
  EXPECT_EQ(r.out_nan, 0);
  EXPECT_EQ(r.lse_nan, 0);
  expect_device_fault({"seqused_k"}, "is outside [0, ");
}

}  // namespace
}  // namespace flashport::test::gpu
