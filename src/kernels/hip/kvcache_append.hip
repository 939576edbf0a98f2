// HIP entry points of the CDNA KV-cache update (kvcache_append.hpp): kv_append and rotate_q, one code
// object per arch for both dtypes (the element type is read at run time). Compiled by
// cmake/hip_kernels.cmake, whose check also fails the code object on a fused multiply-add.
#include <hip/hip_runtime.h>  // threadIdx, blockIdx, __forceinline__

// Before the kernel headers: the rotation x c + s x' s' must round each product and the sum on their
// own, as the CPU backend does (HIP contracts a * b + c into an FMA by default, which differs in the
// last bit). The pragma covers every function defined after it in this translation unit.
#pragma clang fp contract(off)

#include "hip/kvcache_append.hpp"

extern "C" __global__ void __launch_bounds__(flashport::amd::kKvThreads)
    kv_append(flashport::amd::KvAppendParams kp) {
  flashport::amd::kv::append(kp);
}

extern "C" __global__ void __launch_bounds__(flashport::amd::kKvThreads)
    rotate_q(flashport::amd::KvAppendParams kp) {
  flashport::amd::kv::rotate_q(kp);
}
