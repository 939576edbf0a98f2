// The CDNA merge of two partial attention states by their log-sum-exp (SPEC "merge_states"), written
// over the wave layer: kernels/cuda/merge_states.cu's structure (one wave per row, lanes over channels)
// and core/problem.h's merge_row (fp64 weights and LSE; both LSEs read before the merged one is written,
// since out / lse may alias the inputs). Memory-bound; the element type (f64, f32,
// f16, bf16) is read at run time, so one code object per arch serves every call (merge_states.hip).
#pragma once

#include "core/merge.h"
#include "hip/merge_states_config.hpp"
#include "wave/wave.hpp"

namespace flashport::amd {

static_assert(kMergeThreads == kMergeWaves * wave::kWaveSize, "merge_states_config.hpp assumes wave64");

namespace merge {

using namespace flashport::wave;

/// Row r = (b * heads + h) * seqlen + s of the LSEs (their (b, h, s) layout) is wave
/// block_x() * kMergeWaves + wave_id(); lanes walk its d channels. Each output element is read (as a
/// or b) and written by the same lane, so aliasing out with a or b is safe without a barrier.
FP_DEV void run(const MergeParams& mp) {
  const i64 row = (i64)block_x() * kMergeWaves + wave_id();
  if (row >= mp.batch * mp.heads * mp.seqlen) return;
  const MergeRow r = merge_row(mp, row);  // reads both LSEs: lane 0 may overwrite them below
  merge_channels(mp, r, lane_id(), kWaveSize);
  // Lane 0 may overwrite lse_a / lse_b (aliases): every lane of the wave has read them once all reach
  // this collective (the GPU runs the wave in lockstep anyway; the model's lanes switch only here).
  (void)wave_all(true);
  if (mp.lse && lane_id() == 0) mp.lse[row] = r.lse;
}

}  // namespace merge
}  // namespace flashport::amd
