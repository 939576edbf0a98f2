// The Hopper (sm_90a) backward through the public backward() (Impl::automatic on an sm_90 device)
// against the CPU oracle by the accuracy rule, every gradient element written: each case is first
// checked to reach the Hopper kernel (cuda::hopper_bwd::unsupported on the problem backward() builds),
// so a support check that silently declines turns into a failure instead of a portable-kernel pass.
// Covers head dims 64/96/128 (narrow kernel) and 192/256 (wide kernel) in fp16/bf16, seqlen 1, sq < sk and sq
// > sk, rows without keys and keys without queries (exact zero gradients), windows, GQA 4:1 / 7:1 / MQA,
// varlen with empty sequences, seqused_k, padded and transposed strides, and multi-block sequences (~1100
// tokens, a varlen batch of 20), softcap and ALiBi (per head and per batch, alone, together and with windows,
// on both kernels), dropout (d 64 / 128 / 192 / 256, with windows, GQA, varlen, deterministic), and
// deterministic mode (bitwise over 50 runs, every dQ path). GpuBackwardPortable.SmallFeatures keeps small
// portable-only cases (dropout beside softcap / ALiBi or at d 96, d 160) in the *Small* set that gpu_suite.sh
// runs under compute-sanitizer.
//
// FLASHPORT_CUDA_BACKWARD=portable (read once per process) sends every case to the portable kernel:
// the HopperBwd cases then still run, as an A/B check of the harness against the portable backward.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/sm90/hopper_bwd.hpp"
#include "backends/cuda/sm90/hopper_fwd.hpp"
#include "core/attn_validate.hpp"
#include "core/tuning.hpp"
#include "gpu/test_bwd_util.hpp"

namespace flashport::test::gpu {
namespace {

namespace hopper_bwd = cuda::hopper_bwd;

/// The Operand backward() makes of a dO or gradient view (core/api.cpp).
Operand operand_of(const TensorView& t) {
  if (t.ndim == 4) return {t.data, t.stride[0], t.stride[1], t.stride[2]};
  return {t.data, 0, t.stride[0], t.stride[1]};
}

/// The problem backward() builds for `c` (build_attention, attach_lse, dO and gradient operands) from the
/// device buffers run_gpu_backward uses, so pointers and strides are the ones the dispatcher will see;
/// `check` gets it while the buffers live. The values in the buffers do not matter.
template <class Check>
auto with_problem(const Case& c, const FwdInputs& in, Check check) {
  const GpuBackwardCall call(c, in, HostTensor(c.dtype, out_shape(c)), HostTensor(c.dtype, out_shape(c)),
                             HostTensor(DType::f32, lse_shape(c)));
  const BackwardArgs& a = call.args;
  AttnProblem p = core::build_attention(a.q, a.k, a.v, a.out, a.options, a.layout, a.stream);
  core::attach_lse(p, a.lse, a.q.device);
  p.dout = operand_of(a.dout);
  p.grad_q = operand_of(a.dq), p.grad_k = operand_of(a.dk), p.grad_v = operand_of(a.dv);
  return check(p);
}

/// Why the Hopper backward declines `c` on an sm_90 device; empty when it takes the case.
std::string hopper_declines(const Case& c, const FwdInputs& in) {
  return with_problem(c, in, [](const AttnProblem& p) { return hopper_bwd::unsupported(p, 90); });
}

/// Fails (and returns false) unless the Hopper backward takes `c` with the layouts of `in`.
bool expect_goes_to_hopper(const Case& c, const FwdInputs& in) {
  const std::string why = hopper_declines(c, in);
  if (why.empty()) return true;
  ADD_FAILURE() << "the Hopper backward declines " << c.describe() << ": " << why;
  return false;
}

/// A case the Hopper backward must take, then the public backward vs the oracle.
void expect_hopper_backward(const Case& c) {
  if (expect_goes_to_hopper(c, make_inputs(c))) expect_backward_accurate(c);
}

/// A case only the portable backward covers (so it runs under the sanitizer on every GPU).
void expect_portable_backward(const Case& c) {
  EXPECT_NE(hopper_declines(c, make_inputs(c)), "") << "expected a portable-only case: " << c.describe();
  expect_backward_accurate(c);
}

/// Whether dropout runs on the Hopper backward at head dim d (gpu_suite.sh reruns the suite with
/// FLASHPORT_HOPPER_BWD_DQ=0: d 128 then takes the portable kernel).
bool hopper_takes_dropout(int64_t d) {
  return hopper_bwd::takes_dropout((int)d);
}

/// A dropout case on the Hopper backward where it runs (hopper_takes_dropout), else on the portable one.
void expect_dropout_backward(const Case& c) {
  if (hopper_takes_dropout(c.d))
    expect_hopper_backward(c);
  else
    expect_portable_backward(c);
}

/// Rows [first, first + count) of a contiguous (rows, width) gradient are exactly zero.
void expect_zero_rows(const HostTensor& g, int64_t first, int64_t count, int64_t width, const char* what) {
  int64_t nonzero = 0;
  for (int64_t i = first * width; i < (first + count) * width; ++i) nonzero += g.get(i) != 0.0 ? 1 : 0;
  EXPECT_EQ(nonzero, 0) << what << ": rows " << first << ".." << first + count - 1 << " must be zero";
}

/// Batch-1 dense `c` (so rows are tokens): dQ of the first `q_rows` queries and dK / dV of the first
/// `k_rows` keys are exactly zero (they see no key / are seen by no query), besides the accuracy rule.
void expect_hopper_zero_grads(const Case& c, int64_t q_rows, int64_t k_rows) {
  SCOPED_TRACE(c.describe());
  const BwdInputs in = make_bwd_inputs(c);
  if (!expect_goes_to_hopper(c, in.fwd)) return;
  const Grads gpu = expect_backward_accurate_on(c, in);
  expect_zero_rows(gpu.dq, 0, q_rows, c.hq * c.d, "dq");
  expect_zero_rows(gpu.dk, 0, k_rows, c.hk * c.d, "dk");
  expect_zero_rows(gpu.dv, 0, k_rows, c.hk * c.dv, "dv");
}

/// Every query sees one key (sk = 1): P = 1, so dS = dP - D and dK are exactly 0, and so is the naive
/// baseline's error (it forms D from the same dP), which leaves the accuracy rule only its 1e-5 slack.
/// A kernel's D = rowsum(dO * O) comes from a different fp32 sum than its tensor-core dP (the H200 gave
/// dK up to 1.2e-5 at d 96, fp16, summed over 203 queries), so dK is held to 1e-4 absolute instead: a
/// wrong dK here is of the order of scale * |Q| * |dP| ~ 0.1. dQ and dV keep the rule.
void expect_single_key_backward(const Case& c) {
  SCOPED_TRACE(c.describe());
  const BwdInputs in = make_bwd_inputs(c);
  if (!expect_goes_to_hopper(c, in.fwd)) return;
  const Grads gpu = run_gpu_backward(c, in);
  const Grads ref = run_reference(c, in);
  const Grads base = run_baseline(c, in);
  EXPECT_EQ(gpu.unwritten, 0) << "gradient elements unwritten";
  EXPECT_TRUE(accuracy_rule(gpu.dq, base.dq, ref.dq, 3.0)) << "dq";
  EXPECT_TRUE(accuracy_rule(gpu.dv, base.dv, ref.dv, 3.0)) << "dv";
  EXPECT_LE(max_abs_diff(gpu.dk, ref.dk), 1e-4) << "dk";
}

TEST(HopperBwd, SmallSupportAndVariants) {
  AttnProblem p{};
  p.batch = 2, p.hq = 4, p.hk = 2, p.d = 128, p.dv = 128, p.sq = 100, p.sk = 300;
  p.in_type = p.out_type = kBF16;
  void* aligned = reinterpret_cast<void*>(uintptr_t{1} << 20);
  p.q = {aligned, p.sq * p.hq * p.d, p.hq * p.d, p.d};
  p.k = {aligned, p.sk * p.hk * p.d, p.hk * p.d, p.d};
  p.v = p.k;
  p.o = p.dout = p.grad_q = p.q;
  p.grad_k = p.grad_v = p.k;
  p.lse = static_cast<float*>(aligned);
  const int* index = static_cast<const int*>(aligned);  // a cu_seqlens / index tensor (never read)
  p.scale = 0.1f;
  p.window_left = p.window_right = -1;
  EXPECT_EQ(hopper_bwd::unsupported(p, 90), "");
  EXPECT_NE(hopper_bwd::unsupported(p, 80), "");
  EXPECT_NE(hopper_bwd::unsupported(p, 89), "");
  auto declines = [&](auto change) {
    AttnProblem x = p;
    change(x);
    return !hopper_bwd::unsupported(x, 90).empty();
  };
  // Covered: the other head dims and dtype, masks, GQA/MQA, varlen, seqused_k, transposed strides.
  EXPECT_FALSE(declines([](AttnProblem& x) { x.d = x.dv = 64; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.d = x.dv = 96; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.d = x.dv = 192; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.d = x.dv = 256; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.in_type = x.out_type = kF16; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.window_right = 0; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.window_left = 37, x.window_right = 5; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.hq = 7, x.hk = 1; }));
  EXPECT_FALSE(declines([=](AttnProblem& x) {
    x.cu_seqlens_q = x.cu_seqlens_k = index;
    x.total_q = 150, x.total_k = 400;
  }));
  EXPECT_FALSE(declines([=](AttnProblem& x) { x.seqused_k = index; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.q.head_stride = x.sq * x.d, x.q.row_stride = x.d; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.softcap = 5.0f; }));
  EXPECT_FALSE(declines([](AttnProblem& x) { x.deterministic = true; }));
  EXPECT_FALSE(declines([=](AttnProblem& x) { x.alibi = static_cast<const float*>(aligned); }));
  // Not covered.
  EXPECT_TRUE(declines([](AttnProblem& x) { x.d = x.dv = 80; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.dv = 64; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.d = 64; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.in_type = x.out_type = kF32; }));
  // Dropout: alone at d 64, 128 (bulk dQ, the default), 192 and 256; beside softcap or ALiBi, and at d 96,
  // not.
  auto dropout = [](AttnProblem& x) { x.dropout_p = 0.1f, x.dropout_threshold = 1u << 28; };
  EXPECT_EQ(declines(dropout), !hopper_takes_dropout(p.d));
  for (int64_t d : {64, 192, 256})
    EXPECT_FALSE(declines([&](AttnProblem& x) { dropout(x), x.d = x.dv = d; })) << d;
  EXPECT_TRUE(declines([&](AttnProblem& x) { dropout(x), x.d = x.dv = 96; }));
  EXPECT_TRUE(declines([&](AttnProblem& x) { dropout(x), x.softcap = 5.0f; }));
  EXPECT_TRUE(declines([&](AttnProblem& x) { dropout(x), x.alibi = static_cast<const float*>(aligned); }));
  EXPECT_TRUE(declines([=](AttnProblem& x) {
    x.block_table = index, x.block_table_stride = 4, x.page_size = 256;
    x.kv_rows = 8;
  }));
  EXPECT_TRUE(declines([=](AttnProblem& x) { x.kv_batch_idx = index, x.kv_rows = 2; }));
  EXPECT_TRUE(declines([=](AttnProblem& x) { x.leftpad_k = index; }));
  // 4096 one-query sequences: a tiled dQ accumulator (64 rows per sequence) would be 64x the row-major
  // one, 512 MB of padding, so theirs is row-major (unless FLASHPORT_HOPPER_BWD_DQ_ROWS says otherwise);
  // the same count of 100-query sequences stays under the bound (the padding below the row-major size).
  const int rows_knob = core::tuning().hopper_bwd_dq_rows.get();
  auto short_varlen = [=](AttnProblem& x) {
    x.cu_seqlens_q = x.cu_seqlens_k = index;
    x.batch = 4096, x.total_q = 4096, x.total_k = 4096 * 3;
  };
  auto short_dense = [](AttnProblem& x) { x.batch = 4096, x.sq = 1; };
  auto long_varlen = [=](AttnProblem& x) {
    x.cu_seqlens_q = x.cu_seqlens_k = index;
    x.batch = 4096, x.total_q = 4096 * 100, x.total_k = 4096 * 100;
  };
  auto tiled = [&](auto change) {
    AttnProblem x = p;
    change(x);
    EXPECT_EQ(hopper_bwd::unsupported(x, 90), "");
    return hopper_bwd::tiled_accumulator(x) != 0;
  };
  EXPECT_EQ(tiled(short_varlen), rows_knob == 0);
  EXPECT_EQ(tiled(short_dense), rows_knob == 0);
  EXPECT_EQ(tiled(long_varlen), rows_knob != 1);
  for (int64_t d : {64, 192, 256})  // 8 heads: at d 64 and 4 heads the padding is 256 MB, not over it
    EXPECT_EQ(tiled([&](AttnProblem& x) { short_varlen(x), x.d = x.dv = d, x.hq = 8; }), rows_knob == 0) << d;
  EXPECT_FALSE(tiled([&](AttnProblem& x) { long_varlen(x), x.d = x.dv = 96; }));  // row-major always
  // Dropout beside a row-major accumulator: at d 64, 192, 256 (their vector-reduction tiles take it).
  for (int64_t d : {64, 192, 256})
    EXPECT_FALSE(declines([&](AttnProblem& x) { short_varlen(x), dropout(x), x.d = x.dv = d; })) << d;
  // Rows of the operands the main kernel loads or stores must be 16-byte aligned (dQ goes through the
  // fp32 accumulator and O only into D = rowsum(dO * O), both portable aux kernels: not checked here).
  EXPECT_TRUE(declines([](AttnProblem& x) { x.q.row_stride += 4; }));
  EXPECT_TRUE(
      declines([](AttnProblem& x) { x.k.head_stride += 4, x.k.row_stride = x.hk * x.k.head_stride; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.v.batch_stride += 4; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.dout.row_stride += 4; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.grad_k.row_stride += 4; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.grad_v.row_stride += 4; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.k.ptr = static_cast<char*>(x.k.ptr) + 8; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.dout.ptr = static_cast<char*>(x.dout.ptr) + 8; }));
  EXPECT_TRUE(declines([](AttnProblem& x) { x.grad_v.ptr = static_cast<char*>(x.grad_v.ptr) + 8; }));

  const std::vector<jit::KernelSpec> specs = hopper_bwd::variants(90);
  // {f16, bf16} x (d {64, 128, 256} x dQ modes {0, 1}, d 96, d 192) x score stage {plain, ALiBi,
  // softcap}, plus deterministic mode's 64-query tile at d 64 with bulk dQ (the table's takes 128
  // queries), plus dropout's {f16, bf16} x (d 64 and 256 x dQ modes {0, 1}, d 128 bulk dQ, d 192), plus
  // FLASHPORT_HOPPER_BWD_ORDER=1's copies of the narrow serial-loop variants (30: test_arch_limits.cpp),
  // plus the row-major dQ accumulator's {f16, bf16} x d {64, 128, 192, 256} x score stage {plain, ALiBi,
  // softcap, dropout} but dropout at d 128 (30)
  EXPECT_EQ(specs.size(), 66u + 30u + 30u);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(hopper_bwd::is_main_kernel(specs[i])) << specs[i].key();
    for (size_t j = 0; j < i; ++j) EXPECT_NE(specs[i].key(), specs[j].key());
  }
  EXPECT_TRUE(hopper_bwd::variants(80).empty());
  EXPECT_TRUE(hopper_bwd::variants(89).empty());
  // is_main_kernel singles out the backward kernel (the no-spill check must not catch the forward).
  for (const auto& spec : cuda::hopper::variants(90))
    EXPECT_FALSE(hopper_bwd::is_main_kernel(spec)) << spec.key();
}

TEST(HopperBwd, SmallHeadDims) {
  FP_SKIP_WITHOUT_SM90();
  for (int64_t d : {64, 96, 128, 192, 256}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      expect_hopper_backward(dense(dt, 2, 113, 203, 2, 1, d));
      expect_hopper_backward(with(dense(dt, 1, 203, 113, 3, 3, d), kCausal));  // sq > sk
    }
  }
}

TEST(HopperBwd, SmallSeqlenOne) {
  FP_SKIP_WITHOUT_SM90();
  int n = 0;
  for (int64_t d : {64, 96, 128, 192, 256}) {
    const DType dt = n++ % 2 ? DType::f16 : DType::bf16;
    expect_hopper_backward(dense(dt, 2, 1, 1, 2, 2, d));
    expect_hopper_backward(dense(dt, 3, 1, 203, 4, 1, d));
    expect_single_key_backward(dense(dt, 1, 203, 1, 2, 1, d));
    expect_hopper_backward(with(dense(dt, 1, 1, 203, 4, 4, d), kCausal));
  }
  // One key, causal: only the last query sees it; the other 202 rows get dQ = 0.
  expect_hopper_zero_grads(with(dense(DType::bf16, 1, 203, 1, 2, 1, 128), kCausal), 202, 0);
}

// Rows that see no key (causal, sq > sk) and keys no query sees (a (0, 0) band with sk > sq: whole key
// blocks the kernel may skip must still get dK = dV = 0 written).
TEST(HopperBwd, SmallZeroGradients) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_zero_grads(with(dense(DType::bf16, 1, 300, 50, 2, 1, 128), kCausal), 250, 0);
  expect_hopper_zero_grads(with(dense(DType::f16, 1, 290, 161, 4, 2, 64), kCausal), 129, 0);
  expect_hopper_zero_grads(with(dense(DType::f16, 1, 290, 161, 4, 2, 256), kCausal), 129, 0);
  Case band = dense(DType::f16, 1, 40, 300, 2, 1, 64);
  band.wl = 0, band.wr = 0;  // query i sees only key i + 260
  expect_hopper_zero_grads(band, 0, 260);
  band = dense(DType::bf16, 1, 100, 300, 3, 3, 96);
  band.causal = true, band.wl = 10;  // query i sees keys i + 190 .. i + 200
  expect_hopper_zero_grads(band, 0, 190);
  band.dtype = DType::f16, band.d = band.dv = 256;
  expect_hopper_zero_grads(band, 0, 190);
}

TEST(HopperBwd, SmallMasks) {
  FP_SKIP_WITHOUT_SM90();
  for (const Features& f : kWindowMasks) {
    SCOPED_TRACE(f.name);
    expect_hopper_backward(with(dense(DType::bf16, 2, 257, 300, 2, 1, 64), f));
    expect_hopper_backward(with(dense(DType::f16, 1, 300, 200, 2, 2, &f - kWindowMasks < 2 ? 128 : 96), f));
    expect_hopper_backward(
        with(dense(&f - kWindowMasks < 2 ? DType::bf16 : DType::f16, 1, 200, 270, 2, 1, 256), f));
  }
}

TEST(HopperBwd, SmallGqa) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_backward(dense(DType::bf16, 2, 113, 203, 8, 2, 128));                        // 4:1
  expect_hopper_backward(with(dense(DType::f16, 1, 203, 113, 8, 2, 64), kCausal));           // 4:1, sq > sk
  expect_hopper_backward(with(dense(DType::bf16, 1, 150, 150, 7, 1, 64), kCausal));          // 7:1 (MQA)
  expect_hopper_backward(dense(DType::f16, 1, 129, 257, 7, 1, 128));                         // 7:1 (MQA)
  expect_hopper_backward(with(dense(DType::bf16, 2, 200, 260, 4, 1, 96), kWindowLeftOnly));  // MQA, window
  expect_hopper_backward(with(dense(DType::f16, 1, 203, 113, 7, 1, 256), kCausal));          // 7:1, sq > sk
  expect_hopper_backward(dense(DType::bf16, 1, 113, 203, 8, 2, 256));                        // 4:1
  expect_hopper_backward(with(dense(DType::bf16, 1, 150, 170, 6, 2, 192), kWindow));         // 3:1, window
}

TEST(HopperBwd, SmallVarlen) {
  FP_SKIP_WITHOUT_SM90();
  for (const Features& f : {kPlain, kCausal, kWindow}) {
    SCOPED_TRACE(f.name);
    // Entry 1 has no queries, entry 2 no keys, entries 5 and 6 neither.
    Case c = varlen(with(dense(DType::bf16, 1, 1, 1, 4, 2, 128), f), {37, 0, 200, 129, 1, 0, 0},
                    {50, 10, 0, 300, 1, 0, 0});
    expect_hopper_backward(c);
    c.dtype = DType::f16, c.d = c.dv = 64;
    c.used_k = {20, 10, 0, 250, 0, 0, 0};  // seqused_k: keys past it get zero gradients
    expect_hopper_backward(c);
    c.dtype = DType::bf16, c.d = c.dv = 96, c.hq = 7, c.hk = 1;
    c.used_k = {50, 3, 0, 129, 1, 0, 0};
    expect_hopper_backward(c);
    c.dtype = DType::f16, c.d = c.dv = 256, c.hq = 4, c.hk = 2;
    c.used_k = {};
    expect_hopper_backward(c);
    c.dtype = DType::bf16, c.d = c.dv = 192;
    expect_hopper_backward(c);
  }
}

TEST(HopperBwd, SmallDenseSequsedK) {
  FP_SKIP_WITHOUT_SM90();
  Case c = dense(DType::bf16, 3, 150, 260, 2, 1, 128);
  c.used_k = {260, 0, 131};
  expect_hopper_backward(c);
  expect_hopper_backward(with(c, kCausal));
  c.dtype = DType::f16, c.d = c.dv = 64, c.used_k = {1, 200, 64};
  expect_hopper_backward(with(c, kWindow));
  c.d = c.dv = 256, c.used_k = {70, 1, 260};
  expect_hopper_backward(with(c, kCausal));
  c.d = c.dv = 192, c.used_k = {259, 65, 0};
  expect_hopper_backward(c);
}

TEST(HopperBwd, SmallStridedLayouts) {
  FP_SKIP_WITHOUT_SM90();
  // Padded rows (gradients padded alike; the padding must keep its poison): 72 and 136 elements,
  // still 16-byte aligned, odd strides for the tensor maps.
  Case padded = dense(DType::bf16, 2, 113, 203, 2, 1, 64);
  padded.pad = 8;
  expect_hopper_backward(padded);
  padded = with(dense(DType::f16, 1, 203, 150, 4, 2, 128), kCausal);
  padded.pad = 8;
  expect_hopper_backward(padded);
  padded = with(dense(DType::bf16, 2, 100, 130, 2, 2, 96), kWindow);
  padded.pad = 24;
  expect_hopper_backward(padded);
  padded = with(dense(DType::bf16, 2, 100, 130, 2, 1, 256), kCausal);
  padded.pad = 8;
  expect_hopper_backward(padded);

  // (b, h, s, d) storage viewed as (b, s, h, d): head stride above row stride, in the inputs and in
  // the gradients (laid out like the inputs).
  const Case c = with(dense(DType::f16, 2, 130, 190, 4, 2, 128), kCausal);
  BwdInputs in;
  in.fwd = make_inputs(c);
  auto transposed = [&](HostOperand& o, int64_t s, int64_t h, int64_t d) {
    o.storage = randn(c.dtype, {c.batch(), h, s, d});
    o.view = TensorView::strided(o.storage.tv.data, c.dtype, {c.batch(), s, h, d}, {h * s * d, d, s * d, 1});
  };
  transposed(in.fwd.q, 130, 4, 128);
  transposed(in.fwd.k, 190, 2, 128);
  transposed(in.fwd.v, 190, 2, 128);
  in.dout = randn(c.dtype, out_shape(c));
  const FwdResult f = run_cpu(c, in.fwd, Impl::reference);
  in.out = f.out, in.lse = f.lse;
  if (expect_goes_to_hopper(c, in.fwd)) expect_backward_accurate_on(c, in);
}

// Several key blocks (of 128, of 64 at d 256) per sequence and several query blocks per key-block CTA: the Q
// / dO pipeline wraps many times, causal CTAs run different query-block counts, GQA sums a group of heads
// into one dK / dV, and a varlen batch mixes long, short and empty sequences.
TEST(HopperBwd, ManyBlocks) {
  FP_SKIP_WITHOUT_SM90();
  expect_hopper_backward(dense(DType::bf16, 1, 1024, 1088, 2, 1, 128));
  expect_hopper_backward(with(dense(DType::f16, 1, 1100, 1100, 2, 2, 64), kCausal));
  expect_hopper_backward(dense(DType::f16, 1, 1024, 1088, 2, 1, 256));
  expect_hopper_backward(with(dense(DType::bf16, 1, 1100, 1100, 4, 2, 256), kCausal));
  expect_hopper_backward(with(dense(DType::f16, 1, 1000, 1100, 2, 1, 192), kCausal));
  // Group of 4 query heads per kv head; the first 76 queries see no key.
  expect_hopper_zero_grads(with(dense(DType::bf16, 1, 1100, 1024, 8, 2, 64), kCausal), 76, 0);
  Case band = dense(DType::f16, 1, 1050, 1050, 2, 1, 128);
  band.wl = 200, band.wr = 50;  // most (query block, key block) pairs see nothing
  expect_hopper_backward(band);
  Case c =
      varlen(with(dense(DType::bf16, 1, 1, 1, 4, 2, 128), kCausal),
             {0, 1100, 37, 513, 0, 1024, 129, 700, 64, 1, 900, 255, 0, 1090, 300, 128, 640, 77, 0, 450},
             {13, 1050, 0, 600, 0, 1100, 129, 650, 200, 1, 1024, 256, 40, 1000, 333, 128, 700, 77, 0, 0});
  expect_hopper_backward(c);
  // d 256 runs in clusters of two key blocks that add each other's dQ half (FLASHPORT_HOPPER_BWD_PAIR):
  // sequences of odd and even key-block counts (a pair's second block past the keys), empty ones, GQA
  // 2:1 (a pair's steps over two query heads), causal with sq != sk (the two blocks of a pair start at
  // different query blocks) and a band (they also end at different ones).
  Case wide = varlen(with(dense(DType::f16, 1, 1, 1, 4, 2, 256), kCausal), {0, 700, 37, 513, 65, 1, 300},
                     {13, 650, 0, 600, 129, 1, 333});
  expect_hopper_backward(wide);
  wide.causal = false, wide.wl = 150, wide.wr = 20;
  expect_hopper_backward(wide);
}

/// One shape per head dim for the score-feature sweeps: GQA 2:1, 7:1 with sq > sk (d 64), 1:1 (d 96).
Case feature_shape(DType dt, int64_t d) {
  switch (d) {
    case 64:
      return dense(dt, 1, 130, 65, 7, 1, 64);
    case 96:
      return dense(dt, 1, 100, 150, 2, 2, 96);
    case 192:
      return dense(dt, 1, 100, 170, 6, 2, 192);
    case 256:
      return dense(dt, 2, 90, 140, 4, 2, 256);
    default:
      return dense(dt, 2, 113, 130, 4, 2, 128);
  }
}

/// `expect` on every feature (bf16 and fp16 in turn) at feature_shape of each head dim in `dims`, then
/// on varlen batches with empty sequences (d 128 bf16 with tail[0], d 64 fp16 with tail[1]) and on
/// several key blocks (d 64 700 x 1100 with tail[2], d 256 600 x 600 fp16 with tail[3]).
template <class Expect>
void feature_sweep(std::initializer_list<Features> features, std::initializer_list<int64_t> dims,
                   const Features (&tail)[4], Expect expect) {
  int n = 0;
  for (const Features& f : features) {
    SCOPED_TRACE(f.name);
    const DType dt = n++ % 2 ? DType::f16 : DType::bf16;
    for (int64_t d : dims) expect(with(feature_shape(dt, d), f));
  }
  Case v =
      varlen(with(dense(DType::bf16, 1, 1, 1, 4, 1, 128), tail[0]), {0, 37, 130, 1, 0}, {5, 0, 129, 64, 0});
  expect(v);
  v.d = v.dv = 64, v.dtype = DType::f16;
  expect(with(v, tail[1]));
  expect(with(dense(DType::bf16, 1, 700, 1100, 4, 2, 64), tail[2]));
  expect(with(dense(DType::f16, 1, 600, 600, 2, 1, 256), tail[3]));
}

// Softcap (its derivative in dS) and ALiBi (per head, per batch) on both Hopper kernels: alone, together,
// with causal and two-sided windows, GQA, sq > sk, varlen with empty sequences, and several key blocks.
TEST(HopperBwd, SmallSoftcapAlibi) {
  FP_SKIP_WITHOUT_SM90();
  const Features softcap_window{"softcap-window", false, 37, 5, 3.0, 0, 0.0};
  const Features alibi_b_window{"alibi-b-window", false, 50, 20, 0.0, 2, 0.0};
  const Features all{"softcap-alibi-causal", true, -1, -1, 5.0, 2, 0.0};
  feature_sweep({kSoftcap, softcap_window, kAlibi, alibi_b_window, all}, {128, 64, 96, 192, 256},
                {all, alibi_b_window, all, softcap_window}, expect_hopper_backward);
}

// Dropout on the Hopper kernels (SPEC's Philox mask, drawn in the transposed layout: four lanes share each
// call): alone and with causal / two-sided windows, GQA 7:1, sq > sk, d 64 (64 queries per step, both dQ
// paths when gpu_suite reruns this with FLASHPORT_HOPPER_BWD_DQ=0), 128, 192 and 256, varlen with empty
// sequences, several key blocks, and bitwise repeatable in deterministic mode. The CPU oracle draws the
// same mask, so a wrong keep bit (a lane's bits swapped, a wrong counter word) fails the accuracy rule.
TEST(HopperBwd, SmallDropout) {
  FP_SKIP_WITHOUT_SM90();
  const Features causal{"dropout-causal", true, -1, -1, 0.0, 0, 0.3};
  const Features window{"dropout-window", false, 37, 5, 0.0, 0, 0.1};
  feature_sweep({kDropout, causal, window}, {128, 64, 192, 256}, {causal, window, causal, kDropout},
                expect_dropout_backward);
  const Case det[] = {
      with(dense(DType::bf16, 1, 300, 400, 4, 2, 128), causal),
      with(dense(DType::f16, 1, 200, 300, 2, 1, 64), kDropout),
  };
  for (const Case& c : det)
    if (!hopper_takes_dropout(c.d) || expect_goes_to_hopper(c, make_inputs(c))) expect_deterministic(c, 3);
}

// Deterministic mode: each 64-query dQ tile takes its key blocks' additions in key-block order (turn
// counters), on every dQ path: bulk reduce-adds from one staging tile (d 128) or two per tile (d 64, split
// by keys), the drain warps' reductions (d 96; d 64 / 128 too when gpu_suite reruns this suite with
// FLASHPORT_HOPPER_BWD_DQ=0) and the wide kernel's consumers (d 256). Shapes with several key blocks per
// query tile and several query tiles per CTA (GQA, causal, windows, varlen with empty sequences); 50 runs
// each must give the same bits, the first accurate by the rule.
TEST(HopperBwd, DeterministicBitwise) {
  FP_SKIP_WITHOUT_SM90();
  const Case cases[] = {
      with(dense(DType::bf16, 1, 1100, 1100, 4, 2, 64), kCausal),
      with(dense(DType::f16, 2, 700, 900, 4, 1, 128), kWindow),
      with(dense(DType::bf16, 1, 600, 800, 2, 2, 96), kLeftWindow),
      with(dense(DType::bf16, 1, 700, 700, 4, 2, 256), kCausal),
      with(dense(DType::f16, 1, 600, 700, 2, 1, 192), kWindow),
      varlen(with(dense(DType::f16, 1, 1, 1, 4, 2, 128), {"softcap-alibi", true, -1, -1, 5.0, 2, 0.0}),
             {0, 700, 37, 513, 1}, {13, 650, 0, 600, 1}),
  };
  for (const Case& c : cases)
    if (expect_goes_to_hopper(c, make_inputs(c))) expect_deterministic(c, 50);
}

// The same turn-taking on small shapes, so that gpu_suite.sh runs it under compute-sanitizer (*Small*).
TEST(HopperBwd, SmallDeterministic) {
  FP_SKIP_WITHOUT_SM90();
  const Case cases[] = {
      with(dense(DType::bf16, 1, 200, 300, 2, 1, 64), kCausal),
      with(dense(DType::f16, 1, 150, 300, 2, 2, 96), kWindow),
      dense(DType::bf16, 1, 130, 200, 2, 1, 128),
      with(dense(DType::f16, 1, 150, 200, 2, 1, 256), kCausal),
      with(dense(DType::bf16, 1, 140, 260, 2, 1, 192), kWindow),
  };
  for (const Case& c : cases)
    if (expect_goes_to_hopper(c, make_inputs(c))) expect_deterministic(c, 3);
}

// Query blocks that no key block sees beside ones that several do (their dq rows are the convert kernel's
// zeros, from an accumulator no key block added to), at d 128 and 64: causal (sq < sk, sq == sk, sq > sk)
// and not, GQA 4:1, ALiBi, windows, sequence lengths that are not multiples of 64 (the last block's rows
// past the end must stay unwritten: the gradient buffers' poison is checked), varlen with empty entries,
// seqused_k. (Written for the fused dQ convert, since removed: BWD_NOTES part 14.)
TEST(HopperBwd, SmallBlocksWithoutKeys) {
  FP_SKIP_WITHOUT_SM90();
  std::vector<Case> cases = {
      dense(DType::bf16, 2, 113, 203, 8, 2, 128),                 // GQA 4:1, batch 2
      with(dense(DType::f16, 1, 150, 300, 2, 1, 128), kCausal),   // causal, sq < sk
      with(dense(DType::bf16, 2, 600, 600, 4, 1, 128), kCausal),  // several key blocks, GQA
      with(dense(DType::f16, 1, 257, 300, 4, 2, 128), kAlibi),    // ALiBi
      dense(DType::bf16, 2, 257, 300, 2, 1, 64),                  // d 64
      with(dense(DType::f16, 1, 600, 600, 8, 2, 64), kCausal),    // d 64 causal, GQA 4:1
      with(dense(DType::bf16, 2, 65, 130, 4, 1, 128), kCausal),   // one row into the last block
      // Rows that see no key beside rows that do: causal with sq > sk, windows, varlen with empty
      // entries (below), seqused_k.
      with(dense(DType::bf16, 1, 203, 113, 2, 1, 128), kCausal),  // rows 0..89 see no key
      with(dense(DType::f16, 2, 300, 200, 4, 2, 128), kWindow),
      with(dense(DType::bf16, 1, 260, 270, 2, 1, 64), kWindowLeftOnly),
      with(dense(DType::f16, 1, 400, 150, 2, 2, 64), kCausal),  // whole 64-row blocks unseen
  };
  for (const Features& f : {kPlain, kCausal, kWindow}) {
    // Entry 1 has no queries, entry 2 no keys, entries 5 and 6 neither.
    Case v = varlen(with(dense(DType::bf16, 1, 1, 1, 4, 2, 128), f), {37, 0, 200, 129, 1, 0, 0},
                    {50, 10, 0, 300, 1, 0, 0});
    cases.push_back(v);
    v.dtype = DType::f16, v.d = v.dv = 64;
    v.used_k = {20, 10, 0, 250, 0, 0, 0};
    cases.push_back(v);
  }
  Case used = dense(DType::bf16, 3, 150, 260, 2, 1, 128);
  used.used_k = {260, 0, 131};
  cases.push_back(with(used, kCausal));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.describe());
    const FwdInputs in = make_inputs(c);
    if (!expect_goes_to_hopper(c, in)) continue;
    expect_backward_accurate(c);
  }
}

/// Whether the Hopper backward's dQ accumulator for `c` is row-major (hopper_bwd::tiled_accumulator 0).
bool row_major_dq(const Case& c, const FwdInputs& in) {
  return with_problem(c, in, [](const AttnProblem& p) { return hopper_bwd::tiled_accumulator(p) == 0; });
}

/// Batches of short sequences (most under 64 queries, empty ones, one spanning several key blocks): `c`'s
/// head dim, dtype, heads and features over them, run on the Hopper backward (deterministic: 3 runs
/// bitwise equal), after checking its dQ accumulator is row-major exactly when `row_major`.
void expect_short_sequences(const Case& c, bool row_major, bool deterministic = false) {
  const Case v =
      varlen(c, {1, 0, 37, 5, 63, 64, 65, 2, 130, 0, 17}, {3, 7, 37, 0, 64, 80, 65, 1, 150, 0, 129});
  SCOPED_TRACE(v.describe());
  const FwdInputs in = make_inputs(v);
  if (!expect_goes_to_hopper(v, in)) return;
  EXPECT_EQ(row_major_dq(v, in), row_major) << "dQ accumulator layout";
  if (deterministic)
    expect_deterministic(v, 3);
  else
    expect_backward_accurate(v);
}

// Short sequences at every head dim whose dQ accumulator is tiled by default (d 64, 128, 192, 256) with
// causal, windows, GQA 7:1, softcap and ALiBi, dropout and deterministic mode. Small enough to stay tiled
// unless FLASHPORT_HOPPER_BWD_DQ_ROWS=1 (gpu_suite.sh's rerun of the small cases, ctest
// emu.hopper_bwd_dq_rows) makes it row-major, as a batch of many short sequences is by default
// (HopperBwd.ManyShortSequences): row offsets not a multiple of 64, rows past each sequence unwritten.
TEST(HopperBwd, SmallShortSequences) {
  FP_SKIP_WITHOUT_SM90();
  const bool rows = core::tuning().hopper_bwd_dq_rows.get() == 1;
  const Features dropout_causal{"dropout-causal", true, -1, -1, 0.0, 0, 0.2};
  const Features softcap_alibi{"softcap-alibi-window", false, 30, 10, 5.0, 2, 0.0};
  int n = 0;
  for (int64_t d : {64, 128, 192, 256}) {
    const DType dt = n++ % 2 ? DType::f16 : DType::bf16;
    expect_short_sequences(with(dense(dt, 1, 1, 1, 7, 1, d), kCausal), rows);
    expect_short_sequences(with(dense(dt, 1, 1, 1, 4, 2, d), softcap_alibi), rows);
    expect_short_sequences(with(dense(dt, 1, 1, 1, 2, 2, d), kWindow), rows, true);
    if (hopper_takes_dropout(d))
      expect_short_sequences(with(dense(dt, 1, 1, 1, 4, 1, d), dropout_causal), rows);
  }
}

// A batch of 2048 short sequences (0-40 queries, 4096 bytes of dQ per row): a tiled dQ accumulator would
// pad each to 64 rows (512 MB: over 256 MB and over the row-major size), so it is row-major (unless
// FLASHPORT_HOPPER_BWD_DQ_ROWS=0), on the Hopper kernels rather than the portable backward as before: d 64
// and 128 (narrow kernel), 256 (wide), causal with GQA 4:1, and deterministic at d 128.
TEST(HopperBwd, ManyShortSequences) {
  FP_SKIP_WITHOUT_SM90();
  const bool rows = core::tuning().hopper_bwd_dq_rows.get() != 0;
  std::vector<int64_t> q_lens(2048), k_lens(2048);
  for (size_t i = 0; i < q_lens.size(); ++i) {
    q_lens[i] = (int64_t)((i * 7919) % 41);               // 0..40
    k_lens[i] = q_lens[i] + (int64_t)((i * 104729) % 9);  // sk >= sq: causal rows all see keys
  }
  const Case cases[] = {
      varlen(with(dense(DType::bf16, 1, 1, 1, 16, 4, 64), kCausal), q_lens, k_lens),
      varlen(with(dense(DType::f16, 1, 1, 1, 8, 2, 128), kCausal), q_lens, k_lens),
      varlen(dense(DType::bf16, 1, 1, 1, 4, 1, 256), q_lens, k_lens),
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.describe());
    const FwdInputs in = make_inputs(c);
    if (!expect_goes_to_hopper(c, in)) continue;
    EXPECT_EQ(row_major_dq(c, in), rows) << "dQ accumulator layout";
    expect_backward_accurate(c);
  }
  expect_deterministic(cases[1], 3);
}

// The portable backward on small shapes (so under compute-sanitizer via *Small*) for what the Hopper
// backward never takes: dropout beside softcap / ALiBi and at d 96, and d 160.
TEST(GpuBackwardPortable, SmallFeatures) {
  FP_SKIP_WITHOUT_GPU();
  const Features features[] = {{"dropout-softcap", true, 20, -1, 3.0, 0, 0.1}, kAll};
  int n = 0;
  for (const Features& f : features) {
    SCOPED_TRACE(f.name);
    const DType dt = n++ % 2 ? DType::f16 : DType::bf16;
    expect_portable_backward(with(dense(dt, 2, 113, 130, 4, 2, 128), f));
    expect_portable_backward(with(dense(dt, 1, 130, 65, 7, 1, 64), f));
  }
  expect_portable_backward(with(dense(DType::f16, 1, 100, 150, 2, 2, 96), kDropout));
  Case v = varlen(with(dense(DType::bf16, 1, 1, 1, 4, 1, 96), kAll), {0, 37, 130, 1, 0}, {5, 0, 129, 64, 0});
  expect_portable_backward(v);
  expect_portable_backward(dense(DType::bf16, 1, 97, 130, 2, 1, 160));
  expect_portable_backward(with(dense(DType::f16, 1, 130, 77, 2, 2, 160), kCausal));
  expect_portable_backward(with(dense(DType::bf16, 2, 64, 100, 4, 2, 160), kWindow));
}

}  // namespace
}  // namespace flashport::test::gpu
