// HIP entry point of the CDNA split-KV combine (split_combine.hpp): one code object per arch for every
// dtype and head dim (the output type is read from p.out_type), launched after attn_fwd_split on the same
// stream with the same FwdParams; see cmake/hip_kernels.cmake.
#include <hip/hip_runtime.h>  // threadIdx, __forceinline__

#include "hip/split_combine.hpp"

extern "C" __global__ void __launch_bounds__(flashport::amd::kCombineThreads)
    split_combine(flashport::amd::FwdParams prm) {
  flashport::amd::combine::run(prm);
}
