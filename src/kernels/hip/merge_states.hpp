// The CDNA merge of two partial attention states by their log-sum-exp (SPEC "merge_states"), written
// over the wave layer: kernels/cuda/merge_states.cu's structure (one wave per row, lanes over channels)
// and core/problem.h's merge_row (fp64 weights and LSE; both LSEs read before the merged one is written,
// since out / lse may alias the inputs). Memory-bound; the element type (f64, f32,
// f16, bf16) is read at run time, so one code object per arch serves every call (merge_states.hip).
#pragma once

#include "hip/merge_states_config.hpp"
#include "wave/wave.hpp"

namespace flashport::amd {

static_assert(kMergeThreads == kMergeWaves * wave::kWaveSize, "merge_states_config.hpp assumes wave64");

namespace merge {

using namespace flashport::wave;

/// Element `off` of `base` (ElemType `type`) widened to fp64, and the store back (f16 / bf16 through
/// fp32 with round to nearest even, as the CPU backend's store).
FP_DEV double load_f64(const void* base, int type, i64 off) {
  if (type == kF64) return static_cast<const double*>(base)[off];
  if (type == kF32) return static_cast<const float*>(base)[off];
  const u16 v = static_cast<const u16*>(base)[off];
  return type == kBF16 ? num::bf16_to_f32(v) : num::f16_to_f32(v);
}
FP_DEV void store_f64(void* base, int type, i64 off, double x) {
  if (type == kF64)
    static_cast<double*>(base)[off] = x;
  else if (type == kF32)
    static_cast<float*>(base)[off] = (float)x;
  else
    static_cast<u16*>(base)[off] = type == kBF16 ? num::f32_to_bf16((float)x) : num::f32_to_f16((float)x);
}

/// Row r = (b * heads + h) * seqlen + s of the LSEs (their (b, h, s) layout) is wave
/// block_x() * kMergeWaves + wave_id(); lanes walk its d channels. Each output element is read (as a
/// or b) and written by the same lane, so aliasing out with a or b is safe without a barrier.
FP_DEV void run(const MergeParams& mp) {
  const i64 row = (i64)block_x() * kMergeWaves + wave_id();
  if (row >= mp.batch * mp.heads * mp.seqlen) return;
  const MergeRow r = merge_row(mp, row);  // reads both LSEs: lane 0 may overwrite them below
  for (i64 c = lane_id(); c < mp.d; c += kWaveSize) {
    double merged = 0.0;
    if (r.w_a > 0.0) merged += r.w_a * load_f64(mp.a.ptr, mp.type, r.a_off + c);
    if (r.w_b > 0.0) merged += r.w_b * load_f64(mp.b.ptr, mp.type, r.b_off + c);
    store_f64(mp.out.ptr, mp.type, r.o_off + c, r.w_sum > 0.0 ? merged / r.w_sum : 0.0);
  }
  // Lane 0 may overwrite lse_a / lse_b (aliases): every lane of the wave has read them once all reach
  // this collective (the GPU runs the wave in lockstep anyway; the model's lanes switch only here).
  (void)wave_all(true);
  if (mp.lse && lane_id() == 0) mp.lse[row] = r.lse;
}

}  // namespace merge
}  // namespace flashport::amd
