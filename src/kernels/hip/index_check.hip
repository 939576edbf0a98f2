// HIP entry point of the CDNA index check (index_check.hpp): one code object per arch; see
// cmake/hip_kernels.cmake.
#include <hip/hip_runtime.h>  // threadIdx, blockIdx, __forceinline__

#include "hip/index_check.hpp"

extern "C" __global__ void __launch_bounds__(flashport::amd::kIndexThreads)
    index_check(flashport::amd::IndexCheckParams ip) {
  flashport::amd::index::run(ip);
}
