// Kernel arguments of merge_states.cu (NVRTC-safe mirror of core::MergeProblem).
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

/// Two partial attention states (b, s, h, d) of ElemType `type` with fp32 (b, h, s) LSEs, merged
/// into `out` (which may alias a or b) and optionally `lse` (which may alias lse_a or lse_b).
struct MergeParams {
  long long batch, seqlen, heads, d;
  int type;
  Operand a, b, out;
  const float* lse_a;
  const float* lse_b;
  float* lse;
};

}  // namespace flashport::cuda
