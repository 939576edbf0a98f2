// The CUDA kernel specs: one builder per kernel family, shared by the launchers and all_variants.
#pragma once

#include <type_traits>
#include <vector>

#include "jit/jit.hpp"

namespace flashport::cuda {

/// The forward kernel for ElemType `elem_type` and head-dim bucket `bucket` on `arch`; the tile comes
/// from fwd_tile (tiles.hpp). kF16 / kBF16: that dtype. An fp8 type (kE4M3, kE4M3FNUZ, kE5M2): the fp8
/// variant (FP_DTYPE=bf16, FP_FP8=1), the same spec for all three (the format is read at run time).
jit::KernelSpec forward_spec(int arch, int elem_type, int bucket);
/// Its decode variant (FP_DECODE=1, the tile of decode_tile for `mode`, FLASHPORT_DECODE's shape
/// choice; 0: the default): calls whose query rows, GQA heads packed in, fit one 16-row fragment.
jit::KernelSpec decode_spec(int arch, int elem_type, int bucket, int mode);
/// The default decode shape with its splits merged in a thread-block cluster (FP_CLUSTER, sm_90+; 2-byte
/// types, buckets up to 128: decode_cluster_fits in sm80/forward.cpp).
jit::KernelSpec decode_cluster_spec(int arch, int elem_type, int bucket);
/// The split-KV combine kernel (element type is a runtime value).
jit::KernelSpec split_combine_spec(int arch);
/// kv-cache append and q rotation kernels (runtime element type).
jit::KernelSpec kv_append_spec(int arch);
jit::KernelSpec rotate_q_spec(int arch);
/// merge_states (runtime element type).
jit::KernelSpec merge_states_spec(int arch);
/// The device-side index check (index_check.cu).
jit::KernelSpec index_check_spec(int arch);

/// Every spec the dispatcher can pick on `arch`: every family's of both tables (family.hpp), and the
/// kernels around them (split-KV combine, kv-cache, merge, backward D and dQ convert).
std::vector<jit::KernelSpec> all_variants(int arch);
/// The attention kernels whose performance depends on staying in registers (they must not spill).
bool is_main_kernel(const jit::KernelSpec& spec);

/// `builder(args...)` loaded on `device` for `smem` bytes of dynamic shared memory. The spec (strings)
/// is built on the first call with these arguments only; later calls are a table lookup by integers
/// (jit::get_cached). Every input of the spec must be among `args`, or fixed for the process (the
/// environment overrides that the builders read once).
template <class... Args>
const jit::Kernel& cached_kernel(jit::KernelSpec (*builder)(Args...), int device, int smem,
                                 std::type_identity_t<Args>... args) {
  static_assert(sizeof...(Args) <= 8, "jit::SpecKey holds 8 integers");
  const jit::SpecKey key{reinterpret_cast<const void*>(builder), {static_cast<int>(args)...}};
  return jit::get_cached(key, device, smem, [&] { return builder(args...); });
}

/// The head-dim buckets the forward kernel is compiled for.
inline constexpr int kHeadDimBuckets[] = {32, 64, 96, 128, 160, 192, 224, 256};

/// The head-dim buckets of the fp8 forward variant and the fp32 kernel: three, to keep the variant count
/// modest. A call takes the smallest that holds max(d, dv) (coarse_head_dim_bucket): the kernels
/// zero-fill columns beyond d / dv, so a larger bucket is exact, only slower.
inline constexpr int kCoarseHeadDimBuckets[] = {64, 128, 256};
constexpr int coarse_head_dim_bucket(long long d, long long dv) {
  const long long m = d > dv ? d : dv;
  return m <= 64 ? 64 : m <= 128 ? 128 : 256;
}

}  // namespace flashport::cuda
