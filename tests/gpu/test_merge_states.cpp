// CUDA merge_states vs the CPU: fp32/fp16/bf16/fp64 states, -inf LSEs (one or both), in-place output.
#include "gpu/gpu_test_util.hpp"

namespace flashport::test::gpu {
namespace {

struct MergeHost {
  HostTensor a, b, lse_a, lse_b;
};

MergeHost make_merge(DType dt, int64_t b, int64_t s, int64_t h, int64_t d) {
  MergeHost m{randn(dt, {b, s, h, d}), randn(dt, {b, s, h, d}), randn(DType::f32, {b, h, s}, 3.0),
              randn(DType::f32, {b, h, s}, 3.0)};
  for (int64_t r = 0; r < m.lse_a.numel(); r += 5) m.lse_a.set(r, -INFINITY);
  for (int64_t r = 0; r < m.lse_b.numel(); r += 7) m.lse_b.set(r, -INFINITY);  // rows % 35 == 0: both
  return m;
}

TEST(GpuMergeStates, MatchesCpu) {
  FP_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const MergeHost m = make_merge(dt, 2, 37, 3, 72);
    HostTensor cpu_out(dt, {2, 37, 3, 72}), cpu_lse(DType::f32, {2, 3, 37});
    MergeArgs a{m.a, m.lse_a, m.b, m.lse_b, cpu_out, cpu_lse.view(), nullptr};
    merge_states(a);

    const DeviceTensor da = DeviceTensor::from(m.a), db = DeviceTensor::from(m.b);
    const DeviceTensor dla = DeviceTensor::from(m.lse_a), dlb = DeviceTensor::from(m.lse_b);
    const DeviceTensor dout = DeviceTensor::poisoned(cpu_out), dlse = DeviceTensor::poisoned(cpu_lse);
    merge_states(MergeArgs{da.view(), dla.view(), db.view(), dlb.view(), dout.view(), dlse.view(), nullptr});
    const HostTensor out = dout.to_host(cpu_out), lse = dlse.to_host(cpu_lse);
    EXPECT_EQ(count_nan(out), 0);
    // fp64 arithmetic on both sides; exp/log may differ in the last bit before rounding.
    const double tol = dt == DType::bf16 ? 1e-2 : dt == DType::f16 ? 2e-3 : 1e-5;
    EXPECT_LE(max_abs_diff(out, cpu_out), tol);
    EXPECT_LE(max_abs_diff(lse, cpu_lse), 1e-5);

    // In place: out aliases out_a, lse aliases lse_a.
    merge_states(MergeArgs{da.view(), dla.view(), db.view(), dlb.view(), da.view(), dla.view(), nullptr});
    EXPECT_LE(max_abs_diff(da.to_host(m.a), cpu_out), tol);
    EXPECT_LE(max_abs_diff(dla.to_host(m.lse_a), cpu_lse), 1e-5);
  }
}

}  // namespace
}  // namespace flashport::test::gpu
