// What the CDNA index check (index_check.hpp) and its host side share: the kernel parameters and the
// block shape. Plain C++ (the HIP backend includes it without a GPU compiler).
#pragma once

#include "core/index_rules.h"

namespace flashport::amd {

/// Kernel arguments: core/index_rules.h's IndexCheckParams, shared with the CUDA check.
using IndexCheckParams = flashport::IndexCheckParams;

/// One wave per sequence (and block-table column chunk): grid x = ceil(batch / kIndexWaves), grid y = the
/// chunks of kIndexColumnsPerWave block-table entries (1 without a block table).
inline constexpr int kIndexWaves = 4;
inline constexpr int kIndexThreads = kIndexWaves * 64;  // CDNA waves are 64 lanes
inline constexpr int kIndexColumnsPerLane = 4;
inline constexpr int kIndexColumnsPerWave = 64 * kIndexColumnsPerLane;

}  // namespace flashport::amd
