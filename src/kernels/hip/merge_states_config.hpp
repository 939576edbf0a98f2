// What the CDNA merge_states kernel (merge_states.hpp) and its host side share: the kernel parameters
// and the block shape. Plain C++ (the HIP backend includes it without a GPU compiler).
#pragma once

#include "core/problem.h"

namespace flashport::amd {

/// Kernel arguments: core/problem.h's MergeParams, shared with the CUDA merge.
using MergeParams = flashport::MergeParams;

/// One wave per merged row (b, s, h); grid x = ceil(batch * heads * seqlen / kMergeWaves).
inline constexpr int kMergeWaves = 4;
inline constexpr int kMergeThreads = kMergeWaves * 64;  // CDNA waves are 64 lanes

}  // namespace flashport::amd
