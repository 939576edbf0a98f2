// Runs the CDNA forward kernel (kernels/hip/attn_fwd.hpp) on the CPU wave64 model for a validated
// problem, as the HIP backend would launch it on a GPU: same parameters, grid, block and LDS size; with
// split-KV, attn_fwd_split into poisoned fp32 workspaces and then split_combine (split_combine.hpp).
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "hip/split_combine.hpp"

namespace flashport::test::hipmodel {

/// Kernel K (attn_fwd, or attn_fwd_split when prm.num_splits > 1) over the grid FwdParams states.
template <class K>
void launch_kernel(const amd::FwdParams& prm) {
  const amd::FwdGrid g =
      amd::fwd_grid(prm.p, K::kBlockM, prm.pack_gqa, prm.num_splits > 1 ? prm.num_splits : 1);
  if (g.x == 0 || g.y == 0 || g.z == 0) return;
  wave::model::launch({g.x, g.y, g.z}, K::kThreads, K::kLdsBytes,
                      [&](unsigned char* lds) { K::run(prm, lds); });
}

/// The forward entry of one code object: the variant of prm.p (dropout) in the bucket, split or not by
/// prm.num_splits.
template <class Elem, int kBucket, bool kDropout = false, bool kFp8 = false>
void launch_bucket(const amd::FwdParams& prm) {
  if constexpr (!kDropout && amd::fwd_has_dropout_variant(kBucket)) {
    if (prm.p.dropout_p > 0.0f) return launch_bucket<Elem, kBucket, true>(prm);
  }
  if (!kDropout && prm.p.dropout_p > 0.0f)  // as the HIP backend would refuse it: no code object
    throw std::runtime_error("no dropout variant for head-dim bucket " + std::to_string(kBucket));
  if (prm.num_splits > 1) return launch_kernel<amd::fwd::Kernel<Elem, kBucket, kDropout, kFp8, true>>(prm);
  launch_kernel<amd::fwd::Kernel<Elem, kBucket, kDropout, kFp8>>(prm);
}

/// split_combine over the grid fwd_combine_grid states.
inline void launch_combine(const amd::FwdParams& prm) {
  const amd::FwdGrid g = amd::fwd_combine_grid(prm.p);
  if (g.x == 0 || g.y == 0 || g.z == 0) return;
  wave::model::launch({g.x, g.y, g.z}, amd::kCombineThreads, 0,
                      [&](unsigned char*) { amd::combine::run(prm); });
}

template <class Elem>
void launch_elem(const amd::FwdParams& prm, int bucket) {
  switch (bucket) {
    case 32:
      return launch_bucket<Elem, 32>(prm);
    case 64:
      return launch_bucket<Elem, 64>(prm);
    case 96:
      return launch_bucket<Elem, 96>(prm);
    case 128:
      return launch_bucket<Elem, 128>(prm);
    case 160:
      return launch_bucket<Elem, 160>(prm);
    case 256:
      return launch_bucket<Elem, 256>(prm);
    default:
      throw std::runtime_error("no model instantiation for head-dim bucket " + std::to_string(bucket));
  }
}

/// The fp8 variants: the buckets of kFwdFp8Buckets, as the build compiles them.
inline void launch_fp8(const amd::FwdParams& prm, int bucket) {
  if (prm.p.dropout_p > 0.0f) throw std::runtime_error("no fp8 dropout variant");
  switch (bucket) {
    case 64:
      return launch_bucket<wave::bf16, 64, false, true>(prm);
    case 128:
      return launch_bucket<wave::bf16, 128, false, true>(prm);
    case 256:
      return launch_bucket<wave::bf16, 256, false, true>(prm);
    default:
      throw std::runtime_error("no fp8 variant for head-dim bucket " + std::to_string(bucket));
  }
}

/// The forward entry prm asks for, by element type and bucket.
inline void launch_forward(const amd::FwdParams& prm, int bucket) {
  const AttnProblem& p = prm.p;
  if (is_fp8_elem(p.in_type))
    launch_fp8(prm, bucket);
  else if (p.in_type == kBF16)
    launch_elem<wave::bf16>(prm, bucket);
  else if (p.in_type == kF16)
    launch_elem<wave::f16>(prm, bucket);
  else
    throw std::runtime_error("the CDNA forward takes fp16, bf16 and fp8");
}

/// The forward of `p` (fp16, bf16 or fp8, d and dv multiples of 8) on the model; `vec` false forces the
/// element-wise load/store path; `pack_gqa` 0 takes the backend's rule (gqa_pack in core/problem.h), 1 or
/// hq / hk forces it; `num_splits` > 1 runs split-KV with that many splits exactly as given (the backend
/// would cap it at the key tiles: here a kernel meets more splits than tiles), then the combine.
inline void forward(const AttnProblem& p, bool vec = true, int pack_gqa = 0, int num_splits = 1) {
  const int bucket = amd::fwd_head_dim_bucket(p.d, p.dv);
  const int rule = bucket > 0 ? (int)gqa_pack(p, amd::fwd_tile(bucket).block_m) : 1;
  amd::FwdParams prm{p, vec ? amd::fwd_vec_flags(p) : 0, pack_gqa > 0 ? pack_gqa : rule, nullptr, nullptr, 1};
  if (num_splits <= 1) return launch_forward(prm, bucket);
  if (p.cu_seqlens_q) throw std::runtime_error("varlen queries are never split");
  const long long rows = num_splits * amd::fwd_split_rows(p);
  std::vector<float> o_ws((size_t)(rows * p.dv), NAN), lse_ws((size_t)rows, NAN);  // unwritten reads fail
  prm.o_partial = o_ws.data(), prm.lse_partial = lse_ws.data(), prm.num_splits = num_splits;
  launch_forward(prm, bucket);
  launch_combine(prm);
}

}  // namespace flashport::test::hipmodel
