// Publishing an index fault from a kernel (core/index_rules.h's FaultRecord protocol): index_check.cu,
// and the decode variant of attn_fwd.cu, which checks its own sequence rules where no block table is
// involved (one launch fewer per decode step).
#pragma once

#include "core/index_rules.h"
#include "cuda/common/types.cuh"

namespace flashport::cuda {

/// Publishes `f` unless another fault was published first: the claim elects one writer, whose fields
/// are visible to the host before `kind` (the host reads `kind` first).
FP_DEV void report_fault(FaultRecord* record, int call, const IndexFault& f) {
  if (atomicCAS(&record->claim, 0, 1) != 0) return;
  record->call = call;
  record->batch = f.batch, record->entry = f.entry, record->value = f.value, record->bound = f.bound;
  __threadfence_system();
  record->kind = f.kind;
}

/// Sequence b's scalar rules (sequence_fault), reported when one is broken. One thread per sequence.
FP_DEV void report_sequence_fault(FaultRecord* record, int call, const AttnProblem& p, long long b) {
  const IndexFault f = sequence_fault(p, b, call == kCallKvCache);
  if (f.kind != kFaultNone) report_fault(record, call, f);
}

}  // namespace flashport::cuda
