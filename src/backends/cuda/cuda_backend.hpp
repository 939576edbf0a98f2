// The CUDA backend (NVRTC-compiled sm_80+ kernels), registered in src/backends/registry.cpp.
#pragma once

#include "core/backend.hpp"

namespace flashport::cuda {

/// The CUDA backend, or null when no driver / GPU is usable (jit::driver_available() is false).
const core::Backend* backend();

}  // namespace flashport::cuda
