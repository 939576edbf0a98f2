// The CPU reference (SPEC.md literally, fp64 accumulation) and the same-precision baseline.
#pragma once

#include "core/backend.hpp"

namespace flashport::cpu::ref {

/// Forward in fp64. `baseline` instead rounds scores and P to the input dtype (SPEC's accuracy rule).
void forward(const AttnProblem& p, bool baseline);
/// Analytic gradients in fp64 (dropout mask regenerated from the Philox stream).
void backward(const AttnProblem& p);
/// Writes k_new / v_new (k rotated when rotary is on) into the cache at cache_seqlens[b] + t.
void append_kv(const core::KvCacheProblem& p);
void merge_states(const core::MergeProblem& p);

}  // namespace flashport::cpu::ref
