// Kernel arguments of index_check.cu (NVRTC-safe; the host launcher in backends/cuda/index_check.cpp).
#pragma once

#include "core/index_rules.h"

namespace flashport::cuda {

/// Block-table entries one warp checks per grid-y chunk (the launcher's grid y is the chunk count).
constexpr int kIndexCheckColumnsPerWarp = 256;

/// The call's problem (only its index tensors and bounds are read), where to report, and which call
/// it is (IndexCallKind: picks the rules for seqused_k vs cache_seqlens).
struct IndexCheckParams {
  AttnProblem p;
  FaultRecord* record;  // mapped host memory, one per device
  int call;
};

}  // namespace flashport::cuda
