// The backward's two memory-bound kernels (kernels/cuda/attn_bwd_aux.cu) launched on their own with bf16
// operands: D = rowsum(dO * O) and the zeroing of the dQ accumulator and turn counters that comes with
// it; the convert of the fp32 accumulator (its slices summed in order, times the scale) into dq. Dense and
// varlen rows (an empty sequence), row-major and tiled accumulators, d 64 / 96 / 128 / 256 (8, 16 and 32
// lanes per row in the 16-byte path; 96 leaves 4 of 16 lanes idle), one and several CTAs per sequence. The
// 16-bit backward's main kernels are not emulated, so under the kernel emulator this is where the 16-byte
// path of both kernels is checked.
#include <cmath>

#include "backends/cuda/backward.hpp"
#include "backends/cuda/variants.hpp"
#include "core/attn_validate.hpp"
#include "gpu/gpu_test_util.hpp"
#include "kernels/cuda/bwd_params.cuh"

namespace flashport::test::gpu {
namespace {

struct AuxCase {
  int64_t d = 64;
  std::vector<int32_t> q_lens;  // one entry: dense (batch 2 of that length); more: varlen
  int64_t hq = 3;
  int tiled = 0;  // BwdParams::accum_tiled
  int slices = 1;
  std::string describe() const {
    std::string s = "d " + std::to_string(d) + (q_lens.size() == 1 ? " dense" : " varlen") + " tiled " +
                    std::to_string(tiled) + " slices " + std::to_string(slices) + " lens";
    for (int32_t n : q_lens) s += " " + std::to_string(n);
    return s;
  }
};

/// Offset of (row r < 64, column col) in a tiled accumulator's 64-row tile: bwd_seq.cuh's
/// accum_tile_offset, written out again here so that a change there cannot pass by changing both.
int64_t tile_offset(int r, int col, int w) {
  const int c = col / w, cc = col % w, j = cc >> 3, t = (cc >> 1) & 3, x = col & 1;
  const int q = 2 * j + ((r >> 3) & 1), tid = 32 * (r >> 4) + 4 * (r & 7) + t;
  return ((int64_t)(c * (w / 4) + q) * 128 + tid) * 2 + x;
}

/// The call's operands and BwdParams, built through the public validation like a backward call.
struct AuxCall {
  AuxCase c;
  bool varlen;
  int64_t batch, sq, total;  // total rows of q / o / dout / dq
  std::vector<int64_t> starts, lens;
  HostTensor q, o, dout, dq, cu;
  DeviceTensor d_q, d_o, d_dout, d_dq, d_cu;
  AttnProblem p{};
  cuda::BwdParams prm{};

  explicit AuxCall(const AuxCase& cs) : c(cs), varlen(cs.q_lens.size() > 1) {
    batch = varlen ? (int64_t)c.q_lens.size() : 2;
    int64_t start = 0;
    sq = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = c.q_lens[varlen ? (size_t)b : 0];
      starts.push_back(varlen ? start : 0), lens.push_back(len);
      start += len, sq = std::max(sq, len);
    }
    total = varlen ? start : batch * sq;
    const std::vector<int64_t> shape =
        varlen ? std::vector<int64_t>{total, c.hq, c.d} : std::vector<int64_t>{batch, sq, c.hq, c.d};
    q = randn(DType::bf16, shape), o = randn(DType::bf16, shape), dout = randn(DType::bf16, shape);
    dq = HostTensor(DType::bf16, shape);
    d_q = DeviceTensor::from(q), d_o = DeviceTensor::from(o), d_dout = DeviceTensor::from(dout);
    d_dq = DeviceTensor::poisoned(dq);
    AttentionOptions opt;
    opt.softmax_scale = 0.37f;
    SequenceLayout layout;
    if (varlen) {
      std::vector<int32_t> offsets{0};
      for (int64_t len : lens) offsets.push_back(offsets.back() + (int32_t)len);
      cu = int_tensor(offsets);
      d_cu = DeviceTensor::from(cu);
      layout.cu_seqlens_q = layout.cu_seqlens_k = d_cu.view();
      layout.max_seqlen_q = layout.max_seqlen_k = sq;
    }
    p = core::build_attention(d_q.view(), d_q.view(), d_q.view(), d_o.view(), opt, layout, nullptr);
    const auto operand = [](const TensorView& t) {
      return t.ndim == 4 ? Operand{t.data, t.stride[0], t.stride[1], t.stride[2]}
                         : Operand{t.data, 0, t.stride[0], t.stride[1]};
    };
    p.dout = operand(d_dout.view()), p.grad_q = operand(d_dq.view());
    prm.p = p;
    prm.accum_tiled = c.tiled;
    prm.rows_total = c.tiled ? cuda::accum_rows_tiled(p) : cuda::accum_rows(p);
    prm.accum_ld = c.tiled ? c.d : (c.d + 31) / 32 * 32;
    prm.num_slices = c.slices;
    prm.vec = 1;
  }
  /// Row of (b, query 0) in one head of the accumulator (bwd_seq.cuh's accum_row0, written out again).
  int64_t accum_row0(int64_t b) const {
    if (c.tiled) return varlen ? (starts[(size_t)b] + 64 * b) / 64 * 64 : b * ((sq + 63) / 64 * 64);
    return varlen ? starts[(size_t)b] : b * sq;
  }
  int64_t accum_at(int64_t b, int64_t h, int64_t i, int col) const {
    const int64_t row = h * prm.rows_total + accum_row0(b);
    if (c.tiled) return (row + (i & ~63)) * prm.accum_ld + tile_offset((int)(i & 63), col, c.tiled);
    return (row + i) * prm.accum_ld + col;
  }
  int64_t elem(int64_t b, int64_t i, int64_t h, int64_t col) const {  // q / o / dout / dq element index
    return ((varlen ? starts[(size_t)b] + i : b * sq + i) * c.hq + h) * c.d + col;
  }
  void launch(jit::KernelSpec (*spec)(int, int)) {
    const int arch = jit::device_arch(0);
    const jit::Kernel& k = cuda::cached_kernel(spec, 0, 0, arch, (int)kBF16);
    void* args[] = {&prm};
    const unsigned ctas_x = (unsigned)((sq + cuda::kBwdAuxRows - 1) / cuda::kBwdAuxRows);
    jit::launch(k, ctas_x, (unsigned)c.hq, (unsigned)batch, cuda::kBwdAuxThreads, 0, nullptr, args);
  }
};

const AuxCase kCases[] = {
    {64, {113}, 3, 0, 1},
    {128, {113}, 3, 64, 1},
    {256, {77}, 2, 128, 1},
    {64, {50, 0, 113, 7}, 3, 64, 1},
    {128, {50, 0, 113, 7}, 3, 0, 2},
    {256, {1, 64, 0}, 2, 0, 1},
    // Several CTAs per sequence with a partial last one, lanes past d (96: 12 chunks over 16 lanes).
    {96, {300}, 2, 0, 1},
    {64, {130, 1, 0, 200}, 2, 64, 1},
    {128, {190}, 1, 0, 3},
};

TEST(GpuBackwardAux, DotSumsRowsAndZeroesTheAccumulator) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "launches the CUDA kernels themselves";
  for (const AuxCase& cs : kCases) {
    AuxCall call(cs);
    SCOPED_TRACE(cs.describe());
    const int64_t rows = call.varlen ? cs.hq * call.total : call.batch * cs.hq * call.sq;
    const int64_t accum_floats = cs.slices * cs.hq * call.prm.rows_total * call.prm.accum_ld;
    const int64_t count_ints = 20;  // stands for the turn counters after the accumulator
    const size_t zero_bytes = (size_t)(accum_floats + count_ints) * 4;
    DevicePtr dsum(device_alloc((size_t)rows * 4)), accum(device_alloc(zero_bytes + 64));
    fill_bytes(dsum.get(), 0xFF, (size_t)rows * 4);
    fill_bytes(accum.get(), 0xFF, zero_bytes + 64);
    call.prm.dsum = static_cast<float*>(dsum.get());
    call.prm.dq_accum = static_cast<float*>(accum.get());
    call.prm.zero_words = (long long)(zero_bytes / 16);
    call.launch(cuda::backward_dot_spec);
    std::vector<float> got((size_t)rows);
    std::vector<uint32_t> zeroed((zero_bytes + 64) / 4);
    if (!host_memory()) check_cuda(cudaDeviceSynchronize(), "kernel execution");
    copy_bytes(got.data(), dsum.get(), (size_t)rows * 4, cudaMemcpyDeviceToHost);
    copy_bytes(zeroed.data(), accum.get(), zero_bytes + 64, cudaMemcpyDeviceToHost);
    int64_t bad = 0;
    for (int64_t b = 0; b < call.batch; ++b)
      for (int64_t h = 0; h < cs.hq; ++h)
        for (int64_t i = 0; i < call.lens[(size_t)b]; ++i) {
          double want = 0.0, mag = 0.0;
          for (int64_t col = 0; col < cs.d; ++col) {
            const double t = call.o.get(call.elem(b, i, h, col)) * call.dout.get(call.elem(b, i, h, col));
            want += t, mag += std::fabs(t);
          }
          const int64_t at =
              call.varlen ? h * call.total + call.starts[(size_t)b] + i : (b * cs.hq + h) * call.sq + i;
          const double diff = std::fabs((double)got[(size_t)at] - want);
          bad += !(diff <= 3e-5 * mag + 1e-6) ? 1 : 0;  // fp32 sums of exact products, any order
        }
    EXPECT_EQ(bad, 0) << "D rows off";
    int64_t unzeroed = 0;
    for (size_t w = 0; w < zero_bytes / 4; ++w) unzeroed += zeroed[w] != 0 ? 1 : 0;
    EXPECT_EQ(unzeroed, 0) << "accumulator words left unzeroed";
    for (size_t w = zero_bytes / 4; w < zeroed.size(); ++w)
      EXPECT_EQ(zeroed[w], 0xFFFFFFFFu) << "written past zero_words at word " << w;
  }
}

TEST(GpuBackwardAux, ConvertSumsSlicesIntoDq) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "launches the CUDA kernels themselves";
  for (const AuxCase& cs : kCases) {
    AuxCall call(cs);
    SCOPED_TRACE(cs.describe());
    const int64_t slice = cs.hq * call.prm.rows_total * call.prm.accum_ld;
    const HostTensor acc = randn(DType::f32, {cs.slices * slice});
    DeviceTensor d_acc = DeviceTensor::from(acc);
    call.prm.dq_accum = static_cast<float*>(d_acc.mem.get());
    call.launch(cuda::backward_convert_spec);
    const HostTensor got = call.d_dq.to_host(call.dq);
    int64_t bad = 0;
    for (int64_t b = 0; b < call.batch; ++b)
      for (int64_t h = 0; h < cs.hq; ++h)
        for (int64_t i = 0; i < call.lens[(size_t)b]; ++i)
          for (int col = 0; col < (int)cs.d; ++col) {
            float s = 0.0f;  // the kernel's order: slice 0, 1, ...; then the scale; then the rounding
            for (int sl = 0; sl < cs.slices; ++sl)
              s += (float)acc.get(sl * slice + call.accum_at(b, h, i, col));
            HostTensor want(DType::bf16, {1});
            want.set(0, s * 0.37f);
            bad += got.get(call.elem(b, i, h, col)) != want.get(0) ? 1 : 0;
          }
    EXPECT_EQ(bad, 0) << "dq elements off";
    EXPECT_EQ(count_nan(got), 0) << "dq elements unwritten";  // every row belongs to a sequence
  }
}

}  // namespace
}  // namespace flashport::test::gpu
