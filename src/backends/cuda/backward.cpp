// The CUDA backward's orchestration (see backward.hpp): the steps every main kernel shares.
#include "backends/cuda/backward.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/family.hpp"
#include "backends/cuda/operand_align.hpp"
#include "backends/cuda/sm80/backward.hpp"
#include "backends/cuda/sm80/tiles.hpp"
#include "backends/cuda/variants.hpp"
#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "flashport/tensor.hpp"
#include "kernels/cuda/fp8_scale_params.cuh"

namespace flashport::cuda {
namespace {

const char* type_define(int elem_type) {
  return elem_type == kF32 ? "f32" : elem_type == kBF16 ? "bf16" : "f16";
}

bool all_rows_aligned(const AttnProblem& p) {
  const int elem_bytes = (int)dtype_size(static_cast<DType>(p.in_type));
  for (const Operand* t : {&p.q, &p.k, &p.v, &p.o, &p.dout, &p.grad_q, &p.grad_k, &p.grad_v})
    if (!rows_aligned(*t, elem_bytes)) return false;
  return true;
}

}  // namespace

jit::KernelSpec backward_dot_spec(int arch, int elem_type) {
  return {"cuda/attn_bwd_aux.cu", "attn_bwd_dot_do_o", {{"FP_DTYPE", type_define(elem_type)}}, arch};
}

jit::KernelSpec backward_convert_spec(int arch, int elem_type) {
  return {"cuda/attn_bwd_aux.cu", "attn_bwd_dq_convert", {{"FP_DTYPE", type_define(elem_type)}}, arch};
}

namespace {
/// Scratch sections start 256-byte aligned.
constexpr size_t align_256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}
constexpr size_t align_16(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}
}  // namespace

jit::KernelSpec fp8_scale_spec(int arch) {
  return {"cuda/fp8_scale.cu", "fp8_scale", {}, arch};
}

std::vector<jit::KernelSpec> backward_aux_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int type : {kF16, kBF16, kF32}) {
    specs.push_back(backward_dot_spec(arch, type));
    specs.push_back(backward_convert_spec(arch, type));
  }
  specs.push_back(fp8_scale_spec(arch));
  return specs;
}

namespace {

/// One fp8_scale pass over q, k and v at once (ops[0..2]): from ElemType src_type into dst_type, times each
/// (sequence, kv head)'s descale.
void scale_operands(const AttnProblem& p, const Fp8ScaleOperand (&ops)[3], int src_type, int dst_type) {
  Fp8ScaleParams prm{p, {ops[0], ops[1], ops[2]}, src_type, dst_type, p.cu_seqlens_q ? 1 : p.batch};
  constexpr long long kThreads = kFp8ScaleThreads, kChunk = kFp8ScaleChunk;
  long long items = 0;
  for (const Fp8ScaleOperand& op : ops)
    items = std::max(items, prm.batch * op.rows * op.heads * ((op.cols + kChunk - 1) / kChunk));
  if (items <= 0) return;
  const jit::Kernel& kernel = cached_kernel(fp8_scale_spec, p.device, 0, jit::device_arch(p.device));
  void* args[] = {&prm};
  jit::launch(kernel, (unsigned)((items + kThreads - 1) / kThreads), 3, 1, (unsigned)kThreads, 0, p.stream,
              args);
}

/// The fp8 backward (see launch_backward): dequantise, the backward of the dequantised problem, descale
/// the gradients.
void launch_backward_fp8(const AttnProblem& p) {
  const int t = grad_type(p);
  const size_t elem = (size_t)dtype_size(static_cast<DType>(t));
  const bool varlen = p.cu_seqlens_q != nullptr;  // validation pairs it with cu_seqlens_k
  const long long q_rows = varlen ? p.total_q : p.sq, k_rows = varlen ? p.total_k : p.sk;
  const long long batch = varlen ? 1 : p.batch;
  const long long q_elems = batch * q_rows * p.hq * p.d, k_elems = batch * k_rows * p.hk * p.d;
  const long long v_elems = batch * k_rows * p.hk * p.dv;
  const size_t q_bytes = align_256((size_t)q_elems * elem), k_bytes = align_256((size_t)k_elems * elem);
  jit::AsyncScratch ws(std::max<size_t>(q_bytes + k_bytes + (size_t)v_elems * elem, 256), p.stream);
  char* scratch = ws.bytes();
  AttnProblem d = p;  // the dequantised problem: dense scratch q, k, v in the output dtype, no descales
  d.in_type = t;
  d.q = {scratch, q_rows * p.hq * p.d, p.hq * p.d, p.d};
  d.k = {scratch + q_bytes, k_rows * p.hk * p.d, p.hk * p.d, p.d};
  d.v = {scratch + q_bytes + k_bytes, k_rows * p.hk * p.dv, p.hk * p.dv, p.dv};
  d.q_descale = d.k_descale = d.v_descale = nullptr;
  scale_operands(
      p, {{p.q, d.q, q_rows, p.hq, p.d}, {p.k, d.k, k_rows, p.hk, p.d}, {p.v, d.v, k_rows, p.hk, p.dv}},
      p.in_type, t);
  launch_backward(d);
  scale_operands(p,
                 {{p.grad_q, p.grad_q, q_rows, p.hq, p.d},
                  {p.grad_k, p.grad_k, k_rows, p.hk, p.d},
                  {p.grad_v, p.grad_v, k_rows, p.hk, p.dv}},
                 t, t);
  ws.free();
}

}  // namespace

// The backward's kernels launch plainly (jit::LaunchOrder::serial): overlapping them with their
// predecessors measured 2-4% slower at d 128 and 512-1k tokens, +0-1% at d 64 (H200, docs/PERF.md).
void launch_backward(const AttnProblem& p) {
  if (p.batch <= 0 || p.hq <= 0) return;
  if (is_fp8_elem(p.in_type)) return launch_backward_fp8(p);
  if (p.sq >= (1LL << 30) || p.sk >= (1LL << 30))
    throw Error("q", "the CUDA backward needs sequence lengths < 2^30 (32-bit positions)");
  const int device = p.device;
  const int arch = jit::device_arch(device);
  if (p.hq > limits(arch).max_grid_yz) throw Error("q", "more than 65535 heads are not supported on CUDA");
  const BackwardFamily& family = choose(backward_families(), p, arch, core::tuning().cuda_backward.get());

  BwdParams prm{};
  prm.p = p;
  prm.accum_tiled = family.launch.accum_tiled(p);
  prm.rows_total = prm.accum_tiled ? accum_rows_tiled(p) : accum_rows(p);
  prm.accum_ld = head_dim_bucket(p.d, p.dv);
  prm.vec = all_rows_aligned(p) ? 1 : 0;
  prm.num_slices = family.launch.slices(prm, arch);
  const long long slice_floats = p.hq * prm.rows_total * prm.accum_ld;

  // Scratch: D (hq * rows_total floats), then the dQ accumulator, 256-byte aligned, then the dQ tiles'
  // turn counters (deterministic mode of a single-slice kernel), zeroed with the accumulator.
  const size_t dsum_bytes = align_256((size_t)(p.hq * prm.rows_total) * sizeof(float));
  const size_t accum_bytes = (size_t)(prm.num_slices * slice_floats) * sizeof(float);  // accum_ld % 32 == 0
  // Rounded up to whole 16-byte words: the dot kernel zeroes both in 16-byte stores.
  const size_t count_bytes = align_16((size_t)family.launch.dq_tile_counts(prm) * sizeof(int));
  jit::AsyncScratch ws(std::max<size_t>(dsum_bytes + accum_bytes + count_bytes, 256), p.stream);
  char* scratch = ws.bytes();
  prm.dsum = reinterpret_cast<float*>(scratch);
  prm.dq_accum = reinterpret_cast<float*>(scratch + dsum_bytes);
  prm.dq_tile_count = count_bytes ? reinterpret_cast<int*>(scratch + dsum_bytes + accum_bytes) : nullptr;
  prm.zero_words = (long long)((accum_bytes + count_bytes) / 16);
  const unsigned aux_x = (unsigned)((p.sq + kBwdAuxRows - 1) / kBwdAuxRows);
  // The dot kernel zeroes the accumulator and counters (BwdParams::zero_words): one launch fewer than a
  // memset before it (H200, GPT-2 at 8 x 1024: the memsets took about 6 us of each layer's backward).
  if (aux_x == 0 && prm.zero_words > 0)
    jit::memset_async(prm.dq_accum, 0, accum_bytes + count_bytes, p.stream);
  if (aux_x > 0) {
    const jit::Kernel& dot = cached_kernel(backward_dot_spec, device, 0, arch, p.in_type);
    launch_batch_chunks(dot, prm, aux_x, (unsigned)p.hq, (unsigned)kBwdAuxThreads, 0, arch);
  }
  family.launch.main(prm, arch);
  if (aux_x > 0) {
    const jit::Kernel& convert = cached_kernel(backward_convert_spec, device, 0, arch, p.in_type);
    launch_batch_chunks(convert, prm, aux_x, (unsigned)p.hq, (unsigned)kBwdAuxThreads, 0, arch);
  }
  ws.free();
}

}  // namespace flashport::cuda
