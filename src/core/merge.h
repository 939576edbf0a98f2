// merge_states' per-channel rule, written once for the CPU, CUDA and CDNA merges (they add only how rows
// and channels are spread over threads). Self-contained like problem.h: GPU kernels include it.
#pragma once

#include "numeric.h"
#include "problem.h"

namespace flashport {

/// Element `off` of a merge operand (ElemType kF64, kF32, kF16 or kBF16) in fp64, and the store back
/// (f16 / bf16 through fp32 with round to nearest even, as every backend's store). Written once for the
/// CPU, CUDA and CDNA merges: merge_states is memory-bound, so the software conversions cost nothing there.
FP_HD double merge_load(const void* base, int type, long long off) {
  if (type == kF64) return static_cast<const double*>(base)[off];
  if (type == kF32) return static_cast<const float*>(base)[off];
  const unsigned short v = static_cast<const unsigned short*>(base)[off];
  return type == kBF16 ? num::bf16_to_f32(v) : num::f16_to_f32(v);
}
FP_HD void merge_store(void* base, int type, long long off, double x) {
  if (type == kF64)
    static_cast<double*>(base)[off] = x;
  else if (type == kF32)
    static_cast<float*>(base)[off] = (float)x;
  else
    static_cast<unsigned short*>(base)[off] =
        type == kBF16 ? num::f32_to_bf16((float)x) : num::f32_to_f16((float)x);
}

/// Channels c0, c0 + step, ... below d of merged row r: out = (w_a a + w_b b) / w_sum in fp64, 0 where
/// neither state weighs anything; a state of weight 0 is never read. Each channel is read (as a or b)
/// and written by the same caller, so out may alias a or b.
FP_HD void merge_channels(const MergeParams& mp, const MergeRow& r, long long c0, long long step) {
  for (long long c = c0; c < mp.d; c += step) {
    double merged = 0.0;
    if (r.w_a > 0.0) merged += r.w_a * merge_load(mp.a.ptr, mp.type, r.a_off + c);
    if (r.w_b > 0.0) merged += r.w_b * merge_load(mp.b.ptr, mp.type, r.b_off + c);
    merge_store(mp.out.ptr, mp.type, r.o_off + c, r.w_sum > 0.0 ? merged / r.w_sum : 0.0);
  }
}

}  // namespace flashport
