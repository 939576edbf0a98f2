// The HIP backend (AMD CDNA GPUs through libamdhip64, code objects built by cmake/hip_kernels.cmake),
// registered in src/backends/registry.cpp when the library is built with FLASHPORT_HIP=ON.
#pragma once

#include "core/backend.hpp"

namespace flashport::amd {

/// The HIP backend, or null when no HIP runtime or AMD GPU is usable (amd::runtime_unavailable()).
const core::Backend* backend();

}  // namespace flashport::amd
