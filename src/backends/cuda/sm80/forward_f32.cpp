// The fp32 forward's launcher (see forward_f32.hpp).
#include "backends/cuda/sm80/forward_f32.hpp"

#include <string>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/operand_align.hpp"
#include "backends/cuda/variants.hpp"
#include "flashport/error.hpp"
#include "kernels/cuda/attn_fwd_params.cuh"

namespace flashport::cuda {
namespace {

/// The kernel's compile-time shape (attn_fwd_f32.cu): 128 threads, key tiles of 32 rows of the bucket's
/// width, K and V in fp32.
constexpr int kF32Threads = 128;
constexpr int kF32BlockN = 32;
constexpr int f32_rows(int bucket) {
  return kF32Threads / (bucket <= 128 ? 4 : 8);
}
constexpr int f32_smem_bytes(int bucket) {
  return 2 * kF32BlockN * bucket * 4;
}

}  // namespace

jit::KernelSpec forward_f32_spec(int arch, int bucket) {
  return {"cuda/attn_fwd_f32.cu", "attn_fwd_f32", {{"FP_HEADDIM", std::to_string(bucket)}}, arch};
}

std::vector<jit::KernelSpec> forward_f32_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int bucket : kCoarseHeadDimBuckets) specs.push_back(forward_f32_spec(arch, bucket));
  return specs;
}

void launch_forward_f32(const AttnProblem& p) {
  if (p.batch <= 0 || p.hq <= 0 || p.sq <= 0) return;
  const int device = p.device;
  const int arch = jit::device_arch(device);
  if (p.hq > limits(arch).max_grid_yz) throw Error("q", "more than 65535 heads are not supported on CUDA");
  const int bucket = coarse_head_dim_bucket(p.d, p.dv), smem = f32_smem_bytes(bucket);
  const jit::Kernel& kernel = cached_kernel(forward_f32_spec, device, smem, arch, bucket);
  FwdParams prm{};
  prm.p = p;
  prm.num_splits = 1;
  prm.pack_gqa = 1;
  prm.vec = (rows_aligned(p.k, 4) ? kVecK : 0) | (rows_aligned(p.v, 4) ? kVecV : 0);
  const long long rows = f32_rows(bucket);
  const unsigned gx = (unsigned)((p.sq + rows - 1) / rows), gy = (unsigned)p.hq;
  void* args[] = {&prm};
  for_batch_chunks(p.batch, arch, [&](long long b0, long long nb) {
    prm.batch_offset = b0;
    jit::launch(kernel, gx, gy, (unsigned)nb, kF32Threads, smem, p.stream, args, 1,
                jit::LaunchOrder::overlap_prior);
  });
}

}  // namespace flashport::cuda
