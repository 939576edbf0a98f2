// The CUDA kernel specs (see variants.hpp): launchers and the prebuild/CI variant list use these.
#include "backends/cuda/variants.hpp"

#include <string>

#include "backends/cuda/backward.hpp"
#include "backends/cuda/hopper_bwd.hpp"
#include "backends/cuda/hopper_fwd.hpp"
#include "backends/cuda/tiles.hpp"
#include "core/problem.h"

namespace flashport::cuda {

jit::KernelSpec forward_spec(int arch, int elem_type, int bucket) {
  const FwdTile t = fwd_tile(arch, bucket);
  return {"cuda/attn_fwd.cu",
          "attn_fwd",
          {{"FP_DTYPE", elem_type == kBF16 ? "bf16" : "f16"},
           {"FP_HEADDIM", std::to_string(bucket)},
           {"FP_BLOCK_N", std::to_string(t.block_n)},
           {"FP_WARPS", std::to_string(t.warps)},
           {"FP_STAGES", std::to_string(t.stages)}},
          arch};
}

jit::KernelSpec split_combine_spec(int arch) {
  return {"cuda/split_combine.cu", "split_combine", {}, arch};
}
jit::KernelSpec kv_append_spec(int arch) {
  return {"cuda/kvcache_append.cu", "kv_append", {}, arch};
}
jit::KernelSpec rotate_q_spec(int arch) {
  return {"cuda/kvcache_append.cu", "rotate_q", {}, arch};
}
jit::KernelSpec merge_states_spec(int arch) {
  return {"cuda/merge_states.cu", "merge_states", {}, arch};
}

std::vector<jit::KernelSpec> all_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int type : {kF16, kBF16})
    for (int bucket : kHeadDimBuckets) specs.push_back(forward_spec(arch, type, bucket));
  specs.push_back(split_combine_spec(arch));
  specs.push_back(kv_append_spec(arch));
  specs.push_back(rotate_q_spec(arch));
  specs.push_back(merge_states_spec(arch));
  for (auto& spec : backward_variants(arch)) specs.push_back(std::move(spec));
  for (auto& spec : hopper::variants(arch)) specs.push_back(std::move(spec));
  for (auto& spec : hopper_bwd::variants(arch)) specs.push_back(std::move(spec));
  return specs;
}

bool is_main_kernel(const jit::KernelSpec& spec) {
  return spec.entry == "attn_fwd" || is_main_backward_kernel(spec) || hopper::is_main_kernel(spec) ||
         hopper_bwd::is_main_kernel(spec);
}

}  // namespace flashport::cuda
