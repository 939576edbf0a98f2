// The CUDA backward (FlashAttention-2 style, sm_80+ mma.sync): tile table, kernel specs and launcher.
#pragma once

#include <string>
#include <vector>

#include "core/problem.h"
#include "jit/jit.hpp"

namespace flashport::cuda {

/// Shape of the main backward kernel (attn_bwd.cu): query rows per inner step, key rows per CTA, warps.
struct BwdTile {
  int block_m, block_n, warps;
};

/// The tile table, per (arch, head-dim bucket); backward.cpp gives each row's reason. The environment
/// variable FLASHPORT_BWD_TILE="block_m,block_n,warps" overrides it (for tuning; a shape with no warp
/// split fails to compile with a static_assert naming it).
BwdTile backward_tile(int arch, int bucket);

/// The three backward kernels for ElemType `elem_type` (kF16 / kBF16) and head-dim bucket `bucket`.
/// `general`: the main kernel handles softcap, ALiBi and dropout (else it must not get them).
/// Environment knobs for comparing variants: FLASHPORT_BWD_PIPE=0..3 (fragment pipelining, see
/// attn_bwd.cu kPipe), FLASHPORT_BWD_GENERAL=1 (the general kernel for every call) and
/// FLASHPORT_BWD_STAGES=1|2 (Q/dO buffers; 2 only where it fits in shared memory).
jit::KernelSpec backward_main_spec(int arch, int elem_type, int bucket, bool general);
jit::KernelSpec backward_dot_spec(int arch, int elem_type);      // D = rowsum(dO * O)
jit::KernelSpec backward_convert_spec(int arch, int elem_type);  // fp32 dQ accumulator -> dq

/// Every backward kernel the launcher can pick on `arch` (prebuild and CI compile checks).
std::vector<jit::KernelSpec> backward_variants(int arch);

/// True for the main backward kernel (must not spill registers).
bool is_main_backward_kernel(const jit::KernelSpec& spec);

/// Computes p.grad_q, p.grad_k, p.grad_v from p.dout, q, k, v, o and lse on p.stream. Scratch (fp32 D
/// and dQ accumulator) is stream-ordered; never synchronises. p.deterministic: bitwise-reproducible
/// results at the cost of ~ceil(SMs / (batch * hk)) copies of the fp32 dQ accumulator and a grid of
/// about one wave (see BwdParams). Expects CudaBackend::unsupported to have accepted `p` (fp16/bf16,
/// out dtype = input dtype, head dims multiples of 8 and <= 256, no paged / kv-cache layout, sm_80+).
void launch_backward(const AttnProblem& p);

}  // namespace flashport::cuda
