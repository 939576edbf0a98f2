// Split-KV combine of the CDNA forward, written over the wave layer: merges the fp32 partial outputs and
// LSEs that attn_fwd_split wrote (FwdParams' workspaces) into O and the LSE, by the rule of
// kernels/cuda/split_combine.cu. split_combine.hip compiles it for gfx90a / gfx94x; tests/hip runs it on
// the CPU wave64 model.
#pragma once

#include "hip/attn_fwd.hpp"

namespace flashport::amd::combine {

using namespace flashport::wave;

/// Grid fwd_combine_grid(p), kCombineThreads lanes: wave w of block x merges query i = x * kCombineWaves
/// + w of head y, sequence z (dense queries: varlen is never split), 4 channels per lane.
/// O = sum_s w_s O_s / sum_s w_s with w_s = exp(lse_s - max lse) (sem::lse_weight: a split that saw no
/// key has lse -inf, weight 0, and its O never enters the sum); every split empty (a fully masked row):
/// O = 0, LSE = -inf. Every lane walks all splits itself (their LSEs are the same addresses for the whole
/// wave), so no lane waits on another and the weights add in split order.
FP_DEV void run(const FwdParams& prm) {
  const AttnProblem& p = prm.p;
  const i64 b = block_z(), h = block_y(), i = (i64)block_x() * kCombineWaves + wave_id();
  if (i >= p.sq) return;  // the whole wave; nothing below synchronises
  const i64 stride = fwd_split_rows(p), row = fwd_partial_row(p, 0, b, h, i);
  const int splits = prm.num_splits;
  auto lse_of = [&](int s) { return prm.lse_partial[s * stride + row]; };

  float m = sem::kNegInf;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, lse_of(s));
  float wsum = 0.0f;
  for (int s = 0; s < splits; ++s) wsum += sem::lse_weight(lse_of(s), m);
  const float inv = sem::softmax_norm(wsum);

  const i64 o_off = q_offset(p, p.o, b, i, h);
  for (i64 col = 4 * lane_id(); col < p.dv; col += 4 * kWaveSize) {  // dv is a multiple of 8 (<= 256)
    f32x4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < splits; ++s) {
      const float w = sem::lse_weight(lse_of(s), m);
      if (w > 0.0f)
        acc += w * *reinterpret_cast<const f32x4*>(prm.o_partial + (s * stride + row) * p.dv + col);
    }
    fwd::store4_as(p, o_off, col, acc * inv, prm.vec & kVecO);
  }
  if (p.lse && lane_id() == 0)
    p.lse[lse_offset(p, b, h, i)] = wsum > 0.0f ? m + wave::log(wsum) : sem::kNegInf;
}

}  // namespace flashport::amd::combine
