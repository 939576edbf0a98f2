// The CUDA backward's orchestration: D = rowsum(dO * O), scratch, the chosen family's main kernel, and the
// fp32 dQ accumulator converted to dq.
#pragma once

#include <vector>

#include "core/problem.h"
#include "jit/jit.hpp"

namespace flashport::cuda {

jit::KernelSpec backward_dot_spec(int arch, int elem_type);      // D = rowsum(dO * O)
jit::KernelSpec backward_convert_spec(int arch, int elem_type);  // fp32 dQ accumulator -> dq
jit::KernelSpec fp8_scale_spec(int arch);  // fp8 backward: dequantise q, k, v; descale the gradients

/// The D, dQ-convert and fp8_scale kernels of `arch` (every main kernel comes from the backward family
/// table).
std::vector<jit::KernelSpec> backward_aux_variants(int arch);

/// Computes p.grad_q, p.grad_k, p.grad_v from p.dout, q, k, v, o and lse on p.stream: D, the main kernel
/// of the first family of backward_families() that takes `p`, then dq. Scratch (fp32 D and dQ
/// accumulator) is stream-ordered; never synchronises. p.deterministic: bitwise-reproducible results at
/// the cost of ~ceil(SMs / (batch * hk)) copies of the fp32 dQ accumulator and a grid of about one wave
/// (see BwdParams). Expects CudaBackend::unsupported to have accepted `p` (fp16/bf16/fp32, out dtype = input
/// dtype, head dims multiples of 8 and <= 256, no paged / kv-cache layout, sm_80+). fp8 inputs: q, k, v
/// dequantised into stream-ordered scratch of the output dtype, the backward of that problem (any family,
/// the fp32 kernels for fp32 out), then each gradient times its (sequence, kv head) descale in place
/// (SPEC "Backward", fp8: gradients with respect to the fp8 values); no fp8 tensor-core backward yet.
void launch_backward(const AttnProblem& p);

}  // namespace flashport::cuda
