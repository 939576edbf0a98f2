// SPEC's dropout mask for one mma.sync m16n8 C tile, the layout wgmma's accumulators share per warp: the
// portable backward (attn_bwd.cu) and the Hopper forward (hopper/softmax_sm90.cuh) draw it the same way.
#pragma once

#include "core/problem.h"
#include "core/semantics.h"
#include "cuda/common/math.cuh"
#include "cuda/common/types.cuh"

namespace flashport::cuda {

/// Keep bits (bit e for accumulator element e) of one m16n8 C tile: rows r (e = 0, 1) and r + 8
/// (e = 2, 3), keys j, j + 1 with j = (tile's first key) + 2 * (lane % 4), tile's first key a multiple
/// of 8. Keys 4q..4q+3 of a row share one Philox call (SPEC: word j % 4 belongs to key j); the lanes
/// t = 2u and 2u + 1 of a quad hold keys 4q..4q+1 and 4q+2..4q+3 of both rows, so the even lane draws
/// row r, the odd lane row r + 8, and they swap the half the other needs: one call per 4 elements.
/// Every lane of the warp must call this (shuffle).
FP_DEV unsigned dropout_keep4(const AttnProblem& p, i64 b, i64 h, i64 row_r, i64 key_j, int lane) {
  const bool odd = (lane & 1) != 0;
  const sem::Philox4 w = sem::dropout_words(p.seed, p.offset, odd ? row_r + 8 : row_r, key_j, b, p.hq, h);
  // Even lane: row r, words 0, 1 (own) and row r + 8, words 0, 1 (partner's).
  // Odd lane:  row r, words 2, 3 (partner's) and row r + 8, words 2, 3 (own).
  const u32 give0 = odd ? w.x[0] : w.x[2], give1 = odd ? w.x[1] : w.x[3];
  const u32 got0 = shfl_xor(give0, 1), got1 = shfl_xor(give1, 1);
  const u32 w0 = odd ? got0 : w.x[0], w1 = odd ? got1 : w.x[1];
  const u32 w2 = odd ? w.x[2] : got0, w3 = odd ? w.x[3] : got1;
  const u32 t = p.dropout_threshold;
  return (unsigned)(w0 >= t) | (unsigned)(w1 >= t) << 1 | (unsigned)(w2 >= t) << 2 | (unsigned)(w3 >= t) << 3;
}

}  // namespace flashport::cuda
