// The Hopper (sm_90a) forward launcher: support check, TMA tensor maps, tile choice and launch of
// src/kernels/cuda/hopper/attn_fwd_sm90.cu (warp-specialised TMA + wgmma kernel).
#pragma once

#include <string>
#include <vector>

#include "core/problem.h"
#include "jit/jit.hpp"

namespace flashport::cuda::hopper {

/// Empty when the Hopper kernel covers `p` on a GPU of compute capability `arch` (major * 10 +
/// minor); otherwise why not (the portable sm80+ kernel then runs). Covers fp16/bf16 with out of
/// the same dtype, d == dv in {64, 96, 128, 192, 256}, dense or varlen (cu_seqlens, seqused_k),
/// causal / window / softcap / ALiBi / GQA, softmax scale > 0, 16-byte aligned rows. Not: dropout,
/// paged or kv-cache K/V (block table, cache batch index, left pad), fp8, s_dmask.
std::string unsupported(const AttnProblem& p, int arch);

/// Runs the forward of `p` on p.stream without synchronising. Throws Error when unsupported(p, 90)
/// is not empty or a tensor map cannot be encoded.
void forward(const AttnProblem& p);

/// Every Hopper forward kernel (element type x head dim) for `arch`; empty unless arch == 90.
std::vector<jit::KernelSpec> variants(int arch);

/// True for the Hopper forward kernel (register-resident accumulators: it must not spill).
bool is_main_kernel(const jit::KernelSpec& spec);

}  // namespace flashport::cuda::hopper
