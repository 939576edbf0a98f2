// The CDNA index check: core/index_rules.h's rules over every sequence of a call, run on the device
// before the call's kernels, the first fault published to the device's FaultRecord for the host
// (index_rules.h says why and how). kernels/cuda/index_check.cu's structure over the wave layer: one
// wave per sequence, its block-table entries in chunks along grid y. Read-only on the call's tensors.
#pragma once

#include "hip/index_check_config.hpp"
#include "wave/wave.hpp"

namespace flashport::amd {

static_assert(kIndexThreads == kIndexWaves * wave::kWaveSize, "index_check_config.hpp assumes wave64");

namespace index {

using namespace flashport::wave;

/// Publishes `f` unless another fault was published first: the claim elects one writer, whose fields
/// reach the host before `kind` (the host reads `kind` first).
FP_DEV void report(FaultRecord* record, int call, const IndexFault& f) {
  if (!claim_flag(&record->claim)) return;
  record->call = call;
  record->batch = f.batch, record->entry = f.entry, record->value = f.value, record->bound = f.bound;
  fence_system();
  record->kind = f.kind;
}

/// Wave w of block x checks sequence x * kIndexWaves + w: its scalar rules (reported by the grid-y 0
/// wave only), then, when they hold (so its token count is bounded), its block-table entries from chunk
/// block_y() on, grid-y chunks apart, reporting the lowest bad column of the first chunk that has one.
/// Each lane loads kIndexColumnsPerLane columns of a chunk, independent and coalesced.
FP_DEV void run(const IndexCheckParams& ip) {
  const AttnProblem& p = ip.p;
  const i64 b = (i64)block_x() * kIndexWaves + wave_id();
  if (b >= p.batch) return;  // the whole wave: no collective below is left short
  const int lane = lane_id();
  const IndexFault f = sequence_fault(p, b, ip.call == kCallKvCache);
  if (f.kind != kFaultNone) {
    if (lane == 0 && block_y() == 0) report(ip.record, ip.call, f);
    return;  // wave-uniform: f depends on b only
  }
  if (!p.block_table) return;
  const i64 columns = block_table_columns(p, b);
  for (i64 c0 = (i64)block_y() * kIndexColumnsPerWave; c0 < columns;
       c0 += (i64)grid_y() * kIndexColumnsPerWave) {
    int first_bad = kIndexColumnsPerWave;  // this lane's lowest bad column, as an offset in the chunk
    for (int k = kIndexColumnsPerLane - 1; k >= 0; --k) {
      const int offset = kWaveSize * k + lane;
      if (c0 + offset < columns && block_table_fault(p, b, c0 + offset).kind != kFaultNone)
        first_bad = offset;
    }
    // The wave's minimum (offsets <= 256 are exact in fp32).
    first_bad = (int)-max_over<32, 16, 8, 4, 2, 1>(-(float)first_bad);
    if (first_bad < kIndexColumnsPerWave) {
      if (lane == (first_bad & (kWaveSize - 1)))
        report(ip.record, ip.call, block_table_fault(p, b, c0 + first_bad));
      return;
    }
  }
}

}  // namespace index
}  // namespace flashport::amd
