// HIP entry point of the CDNA merge_states (merge_states.hpp): one code object per arch for every
// element type and head dim (the type is read from the parameters); see cmake/hip_kernels.cmake.
#include <hip/hip_runtime.h>  // threadIdx, blockIdx, __forceinline__

#include "hip/merge_states.hpp"

extern "C" __global__ void __launch_bounds__(flashport::amd::kMergeThreads)
    merge_states(flashport::amd::MergeParams mp) {
  flashport::amd::merge::run(mp);
}
