// HIP entry points of the CDNA backward: one code object per (dtype, head-dim bucket) holding the three
// kernels, compiled with -D FP_ELEM=bf16|f16 -D FP_HEADDIM=<bucket> for gfx90a (hipcc) and gfx942
// (clang-19); see cmake/hip_kernels.cmake. The bodies are attn_bwd.hpp, the source the CPU model runs.
// A launch runs attn_bwd_dot_do_o, attn_bwd, attn_bwd_convert_dq in order on one stream (grids:
// BwdParams in attn_bwd_config.hpp).
#include <hip/hip_runtime.h>  // threadIdx, __syncthreads, __shfl_xor, atomicAdd, __forceinline__

#include "hip/attn_bwd.hpp"

#if !defined(FP_ELEM) || !defined(FP_HEADDIM)
#error "attn_bwd.hip needs -D FP_ELEM=bf16|f16 and -D FP_HEADDIM=<bucket>"
#endif

using Backward = flashport::amd::bwd::Kernel<flashport::wave::FP_ELEM, FP_HEADDIM>;
using Rows = flashport::amd::bwd::RowKernel<flashport::wave::FP_ELEM>;

extern "C" __global__ void __launch_bounds__(Rows::kThreads)
    attn_bwd_dot_do_o(flashport::amd::BwdParams prm) {
  Rows::dot_do_o(prm);
}

extern "C" __global__ void __launch_bounds__(Backward::kThreads) attn_bwd(flashport::amd::BwdParams prm) {
  __shared__ __attribute__((aligned(16))) unsigned char lds[Backward::kLdsBytes];
  Backward::run(prm, lds);
}

extern "C" __global__ void __launch_bounds__(Rows::kThreads)
    attn_bwd_convert_dq(flashport::amd::BwdParams prm) {
  Rows::convert_dq(prm);
}
