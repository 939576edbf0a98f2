// The fp32 forward's launcher (kernels/cuda/attn_fwd_f32.cu): fp32 inputs on CUDA, part of the portable
// family (sm80+), which hands it every fp32 call.
#pragma once

#include <vector>

#include "core/problem.h"
#include "jit/jit.hpp"

namespace flashport::cuda {

/// The fp32 kernel of head-dim bucket `bucket` (kF32HeadDimBuckets) on `arch`.
jit::KernelSpec forward_f32_spec(int arch, int bucket);
std::vector<jit::KernelSpec> forward_f32_variants(int arch);
/// One launch per chunk of sequences; no split-KV (num_splits is ignored) and no GQA packing.
void launch_forward_f32(const AttnProblem& p);

}  // namespace flashport::cuda
