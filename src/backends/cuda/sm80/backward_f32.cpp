// The fp32 backward main kernel's launcher (see backward_f32.hpp).
#include "backends/cuda/sm80/backward_f32.hpp"

#include <string>

#include "backends/cuda/sm80/backward.hpp"
#include "backends/cuda/variants.hpp"

namespace flashport::cuda {
namespace {

constexpr unsigned kF32BwdThreads = 256;  // attn_bwd_f32.cu kThreads

int f32_bucket(const AttnProblem& p) {
  return coarse_head_dim_bucket(p.d, p.dv);
}

}  // namespace

jit::KernelSpec backward_f32_spec(int arch, int bucket) {
  return {"cuda/attn_bwd_f32.cu", "attn_bwd_f32", {{"FP_HEADDIM", std::to_string(bucket)}}, arch};
}

std::vector<jit::KernelSpec> backward_f32_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int bucket : kCoarseHeadDimBuckets) specs.push_back(backward_f32_spec(arch, bucket));
  return specs;
}

int backward_f32_block_n(const BwdParams& prm) {
  return bwd_f32_tile(f32_bucket(prm.p)).block_n;
}

void launch_backward_f32(BwdParams& prm, int arch) {
  const AttnProblem& p = prm.p;
  const int bucket = f32_bucket(p), block_n = bwd_f32_tile(bucket).block_n;
  const long long key_blocks = (p.sk + block_n - 1) / block_n;
  if (key_blocks <= 0) return;
  const unsigned grid_x = (unsigned)(p.deterministic ? prm.num_slices : key_blocks);
  const int smem = bwd_f32_smem_bytes(bucket);
  const jit::Kernel& kernel = cached_kernel(backward_f32_spec, p.device, smem, arch, bucket);
  launch_batch_chunks(kernel, prm, grid_x, (unsigned)p.hk, kF32BwdThreads, smem, arch);
}

}  // namespace flashport::cuda
