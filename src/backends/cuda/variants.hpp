// The CUDA kernel specs: one builder per kernel family, shared by the launchers and all_variants.
#pragma once

#include <vector>

#include "jit/jit.hpp"

namespace flashport::cuda {

/// The forward kernel for ElemType `elem_type` (kF16 / kBF16) and head-dim bucket `bucket` on `arch`;
/// the tile comes from fwd_tile (tiles.hpp).
jit::KernelSpec forward_spec(int arch, int elem_type, int bucket);
/// The split-KV combine kernel (element type is a runtime value).
jit::KernelSpec split_combine_spec(int arch);
/// kv-cache append and q rotation kernels (runtime element type).
jit::KernelSpec kv_append_spec(int arch);
jit::KernelSpec rotate_q_spec(int arch);
/// merge_states (runtime element type).
jit::KernelSpec merge_states_spec(int arch);

/// Every spec the dispatcher can pick on `arch` (forward, combine, kv-cache, merge, backward).
std::vector<jit::KernelSpec> all_variants(int arch);
/// The attention kernels whose performance depends on staying in registers (they must not spill).
bool is_main_kernel(const jit::KernelSpec& spec);

/// The head-dim buckets the forward kernel is compiled for.
inline constexpr int kHeadDimBuckets[] = {32, 64, 96, 128, 160, 192, 224, 256};

}  // namespace flashport::cuda
