// Runs the CDNA forward kernel (kernels/hip/attn_fwd.hpp) on the CPU wave64 model for a validated
// problem, as the HIP backend would launch it on a GPU: same parameters, grid, block and LDS size.
#pragma once

#include <stdexcept>
#include <string>

#include "hip/attn_fwd.hpp"

namespace flashport::test::hipmodel {

template <class Elem, int kBucket, bool kDropout = false, bool kFp8 = false>
void launch_bucket(const amd::FwdParams& prm) {
  if constexpr (!kDropout && amd::fwd_has_dropout_variant(kBucket)) {
    if (prm.p.dropout_p > 0.0f) return launch_bucket<Elem, kBucket, true>(prm);
  }
  if (!kDropout && prm.p.dropout_p > 0.0f)  // as the HIP backend would refuse it: no code object
    throw std::runtime_error("no dropout variant for head-dim bucket " + std::to_string(kBucket));
  using K = amd::fwd::Kernel<Elem, kBucket, kDropout, kFp8>;
  const AttnProblem& p = prm.p;
  const long long group = prm.pack_gqa;  // the grid of FwdParams' comment, for the packing it asks
  const wave::model::Dim3 grid{(unsigned)((p.sq * group + K::kBlockM - 1) / K::kBlockM),
                               (unsigned)(group > 1 ? p.hk : p.hq), (unsigned)p.batch};
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  wave::model::launch(grid, K::kThreads, K::kLdsBytes, [&](unsigned char* lds) { K::run(prm, lds); });
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

/// The forward of `p` (fp16, bf16 or fp8, d and dv multiples of 8) on the model; `vec` false forces the
/// element-wise load/store path; `pack_gqa` 0 takes the backend's rule (gqa_pack in core/problem.h), 1 or
/// hq / hk forces it.
inline void forward(const AttnProblem& p, bool vec = true, int pack_gqa = 0) {
  const int bucket = amd::fwd_head_dim_bucket(p.d, p.dv);
  const int rule = bucket > 0 ? (int)gqa_pack(p, amd::fwd_tile(bucket).block_m) : 1;
  const amd::FwdParams prm{p, vec ? amd::fwd_vec_flags(p) : 0, pack_gqa > 0 ? pack_gqa : rule};
  if (is_fp8_elem(p.in_type))
    launch_fp8(prm, bucket);
  else if (p.in_type == kBF16)
    launch_elem<wave::bf16>(prm, bucket);
  else if (p.in_type == kF16)
    launch_elem<wave::f16>(prm, bucket);
  else
    throw std::runtime_error("the CDNA forward takes fp16, bf16 and fp8");
}

}  // namespace flashport::test::hipmodel
