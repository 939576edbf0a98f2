// HIP entry point of the CDNA forward: one code object per (dtype, head-dim bucket), compiled with
// -D FP_ELEM=bf16|f16 -D FP_HEADDIM=<bucket> (and -D FP_DROPOUT=1 for the dropout variants, -D FP_FP8=1
// with FP_ELEM=bf16 for the fp8 ones) for gfx90a (hipcc) and gfx942 (clang-19); see
// cmake/hip_kernels.cmake. The kernel body is attn_fwd.hpp, the same source the CPU model runs. The entry
// is attn_fwd (the whole key range), or with -D FP_SPLIT=1 attn_fwd_split (split-KV: FwdParams::num_splits
// > 1, fp32 partials that split_combine.hip merges), in an object of its own: beside attn_fwd in one
// object it would reschedule attn_fwd's code.
#include <hip/hip_runtime.h>  // threadIdx, __syncthreads, __shfl_xor, __forceinline__

#include "hip/attn_fwd.hpp"

#if !defined(FP_ELEM) || !defined(FP_HEADDIM)
#error "attn_fwd.hip needs -D FP_ELEM=bf16|f16 and -D FP_HEADDIM=<bucket>"
#endif

#if !defined(FP_DROPOUT)
#define FP_DROPOUT 0
#endif
#if !defined(FP_FP8)
#define FP_FP8 0
#endif
#if !defined(FP_SPLIT)
#define FP_SPLIT 0
#endif

using Forward = flashport::amd::fwd::Kernel<flashport::wave::FP_ELEM, FP_HEADDIM, FP_DROPOUT != 0,
                                            FP_FP8 != 0, FP_SPLIT != 0>;

// The entry's name says which variant an object holds (the backend asks for it by name).
#if FP_SPLIT
#define FP_FWD_ENTRY attn_fwd_split
#else
#define FP_FWD_ENTRY attn_fwd
#endif

extern "C" __global__ void __launch_bounds__(Forward::kThreads) FP_FWD_ENTRY(flashport::amd::FwdParams prm) {
  __shared__ __attribute__((aligned(16))) unsigned char lds[Forward::kLdsBytes];
  Forward::run(prm, lds);
}

#if FP_FP8
// Names the variant in the code object's symbol table, so a loader stand-in can tell that an fp8 call
// loaded an fp8 object (tests/hip/backend/fake_hip_runtime.cpp); nothing reads it on a GPU.
extern "C" __device__ const int attn_fwd_fp8_inputs = 1;
#endif
