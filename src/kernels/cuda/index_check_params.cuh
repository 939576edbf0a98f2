// Kernel arguments of index_check.cu (NVRTC-safe; the host launcher in backends/cuda/index_check.cpp).
#pragma once

#include "core/index_rules.h"

namespace flashport::cuda {

/// Block-table entries one warp checks per grid-y chunk (the launcher's grid y is the chunk count).
constexpr int kIndexCheckColumnsPerWarp = 256;

/// core/index_rules.h's, shared with the CDNA check.
using IndexCheckParams = flashport::IndexCheckParams;

}  // namespace flashport::cuda
