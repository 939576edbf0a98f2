// Publishing an index fault from a kernel (core/index_rules.h's FaultRecord protocol): index_check.cu,
// and the decode variant of attn_fwd.cu, which checks its own sequence's rules and block-table entries
// (one launch fewer per decode step).
#pragma once

#include "core/index_rules.h"
#include "cuda/common/math.cuh"
#include "cuda/common/types.cuh"
#include "cuda/index_check_params.cuh"

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

/// Block-table columns [c0, min(c0 + kIndexCheckColumnsPerWarp, c_end)) of sequence b (block_table_fault),
/// by the 32 lanes of one warp (`lane`): reports the chunk's lowest bad column and returns true if there is
/// one. Each lane takes eight columns 32 apart, loaded independently and coalesced across the warp, so a
/// chunk costs one load round trip. Call only where sequence_fault(p, b) found nothing (the column count is
/// then bounded).
FP_DEV bool report_block_table_chunk(FaultRecord* record, int call, const AttnProblem& p, long long b,
                                     long long c0, long long c_end, int lane) {
  constexpr int kPerLane = kIndexCheckColumnsPerWarp / 32;
  u32 first_bad = kIndexCheckColumnsPerWarp;  // offset in the chunk of this lane's lowest bad column
#pragma unroll
  for (int k = kPerLane - 1; k >= 0; --k) {
    const int offset = 32 * k + lane;
    if (c0 + offset < c_end && block_table_fault(p, b, c0 + offset).kind != kFaultNone)
      first_bad = (u32)offset;
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const u32 other = shfl_xor(first_bad, m);
    first_bad = other < first_bad ? other : first_bad;
  }
  if (first_bad == (u32)kIndexCheckColumnsPerWarp) return false;
  if (lane == 0) report_fault(record, call, block_table_fault(p, b, c0 + first_bad));
  return true;
}

/// A decode kernel's own index check (instead of an index_check.cu launch before it), by one warp of each
/// CTA of sequence b's first head: the sequence's scalar rules, reported by split 0, and then (when they
/// hold) its block-table columns, split between the num_splits CTAs of the sequence in equal ranges.
FP_DEV void report_decode_faults(FaultRecord* record, int call, const AttnProblem& p, long long b, int split,
                                 int num_splits, int lane) {
  const IndexFault f = sequence_fault(p, b, call == kCallKvCache);
  if (f.kind != kFaultNone) {
    if (split == 0 && lane == 0) report_fault(record, call, f);
    return;
  }
  if (!p.block_table) return;
  const long long columns = block_table_columns(p, b), share = (columns + num_splits - 1) / num_splits;
  const long long end = columns < (split + 1) * share ? columns : (split + 1) * share;
  for (long long c0 = split * share; c0 < end; c0 += kIndexCheckColumnsPerWarp)
    if (report_block_table_chunk(record, call, p, b, c0, end, lane)) return;
}

}  // namespace flashport::cuda
