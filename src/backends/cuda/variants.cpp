// The CUDA kernel specs (see variants.hpp): launchers and the prebuild/CI variant list use these.
#include "backends/cuda/variants.hpp"

#include <string>

#include "backends/cuda/backward.hpp"
#include "backends/cuda/family.hpp"
#include "backends/cuda/sm80/tiles.hpp"
#include "backends/cuda/sm90/hopper_fwd.hpp"
#include "core/problem.h"

namespace flashport::cuda {

namespace {

/// The attn_fwd spec of tile `t` (row-split or decode variant).
jit::KernelSpec forward_spec_for(int arch, int elem_type, int bucket, const FwdTile& t) {
  const bool fp8 = is_fp8_elem(elem_type);
  jit::KernelSpec spec{"cuda/attn_fwd.cu",
                       "attn_fwd",
                       {{"FP_DTYPE", elem_type == kBF16 || fp8 ? "bf16" : "f16"},
                        {"FP_HEADDIM", std::to_string(bucket)},
                        {"FP_BLOCK_N", std::to_string(t.block_n)},
                        {"FP_WARPS", std::to_string(t.warps)},
                        {"FP_STAGES", std::to_string(t.stages)}},
                       arch};
  // Only the fp8 variant carries the flag: the 2-byte variants keep their exact spec (and SASS).
  if (fp8) spec.defines.push_back({"FP_FP8", "1"});
  if (t.decode) spec.defines.push_back({"FP_DECODE", "1"});
  if (t.min_blocks > 1) spec.defines.push_back({"FP_MIN_BLOCKS", std::to_string(t.min_blocks)});
  if (t.bulk) spec.defines.push_back({"FP_BULK", "1"});
  if (t.cluster) spec.defines.push_back({"FP_CLUSTER", "1"});
  return spec;
}

}  // namespace

jit::KernelSpec forward_spec(int arch, int elem_type, int bucket) {
  return forward_spec_for(arch, elem_type, bucket, fwd_tile(arch, bucket));
}

jit::KernelSpec decode_spec(int arch, int elem_type, int bucket, int mode) {
  return forward_spec_for(arch, elem_type, bucket, decode_tile(arch, bucket, mode));
}

jit::KernelSpec decode_cluster_spec(int arch, int elem_type, int bucket) {
  FwdTile t = decode_tile(arch, bucket, 0);
  t.cluster = true;
  return forward_spec_for(arch, elem_type, bucket, t);
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

jit::KernelSpec index_check_spec(int arch) {
  return {"cuda/index_check.cu", "index_check", {}, arch};
}

std::vector<jit::KernelSpec> all_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  const auto append = [&](std::vector<jit::KernelSpec> more) {
    for (auto& spec : more) specs.push_back(std::move(spec));
  };
  for (const ForwardFamily& f : forward_families()) append(f.variants(arch));
  append({split_combine_spec(arch), kv_append_spec(arch), rotate_q_spec(arch), merge_states_spec(arch),
          index_check_spec(arch)});
  if (arch == 90) specs.push_back(hopper::fp8_transpose_spec(arch));
  append(backward_aux_variants(arch));
  for (const BackwardFamily& f : backward_families()) append(f.variants(arch));
  return specs;
}

bool is_main_kernel(const jit::KernelSpec& spec) {
  for (const ForwardFamily& f : forward_families())
    if (f.is_main_kernel(spec)) return true;
  for (const BackwardFamily& f : backward_families())
    if (f.is_main_kernel(spec)) return true;
  return false;
}

}  // namespace flashport::cuda
