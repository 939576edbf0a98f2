// The fp32 backward main kernel (attn_bwd_f32.cu: exact fp32 on the CUDA cores): specs and launch. The
// portable backward family hands it fp32 calls; D and the dQ conversion around it are backward.cpp's
// (attn_bwd_aux.cu with FP_DTYPE f32).
#pragma once

#include <vector>

#include "jit/jit.hpp"
#include "kernels/cuda/bwd_params.cuh"

namespace flashport::cuda {

/// The kernel for head-dim bucket `bucket` (kCoarseHeadDimBuckets: 64, 128, 256).
jit::KernelSpec backward_f32_spec(int arch, int bucket);
/// One per coarse bucket.
std::vector<jit::KernelSpec> backward_f32_variants(int arch);
/// Key rows per CTA for prm's bucket (the deterministic slice count needs it).
int backward_f32_block_n(const BwdParams& prm);
/// Runs it on prm.p.stream as launch_backward_main does the 16-bit kernel (same contract).
void launch_backward_f32(BwdParams& prm, int arch);

}  // namespace flashport::cuda
