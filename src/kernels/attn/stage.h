// FP_STAGE: how the shared stages (fwd_stages.h, bwd_stages.h) are declared. They are device code under
// NVRTC and HIP, and plain inline functions when g++ compiles the kernels against the CPU models.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FP_STAGE __device__ __forceinline__
#else
#define FP_STAGE inline
#endif
