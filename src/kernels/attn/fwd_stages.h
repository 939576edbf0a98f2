// The forward's stages that do not depend on where a vendor's matrix instruction puts its elements,
// written once for the CUDA portable kernel (kernels/cuda/attn_fwd.cu[h]: mma.sync m16n8k16, warps of 32)
// and the CDNA kernel (kernels/hip/attn_fwd.hpp: MFMA 16x16x16 over the wave layer, waves of 64): which
// (query, head) a block row is, the block's key tiles (split-KV included), each row's score context,
// the score transform and mask, the online softmax and the finalize. The products, the tile loads and
// the stores stay with each vendor.
//
// A kernel hands its score layout in as a `Rows` policy, defined next to its products:
//   kRows                    query rows one lane holds (mma.sync's C layout: 2; CDNA's S^T: 1)
//   map_s(s, f)              each score element x of the lane becomes f(r, key, x): r in [0, kRows) is
//                            the element's row, key its column relative to the tile's first key
//   map_o(o, f)              each output accumulator element x becomes f(r, x)
//   row_max(v), row_sum(v)   v reduced over the lanes that share the lane's rows
//   exp2(x), log2(x)         the vendor's fp32 2^x and log2 (2^-inf = 0, log2(0) = -inf)
//   all_lanes(v)             whether v holds on every lane of the warp / wave
// The elements are passed by value (CDNA's fragments are vector types, whose elements bind to no
// reference); the compilers inline the visitors back into straight-line code.
//
// Self-contained like core/ (no standard or toolkit header under NVRTC): embedded in the CUDA JIT as
// "attn/fwd_stages.h", compiled by hipcc / clang for CDNA and by g++ for the CPU models.
#pragma once

#include "attn/stage.h"
#include "core/problem.h"
#include "core/split_plan.h"

namespace flashport::attn {

using sem::i64;

/// Which (query, head) a block row is. Without GQA packing a block holds queries m0 .. m0 + block_m of
/// one head; packing (`group` = hq / hk) interleaves the query heads of one kv head: packed row pr =
/// i * group + g is query i of head kv_head * group + g, so decode-like calls fill the block's rows and
/// read each kv head's K/V once.
struct RowMap {
  i64 m0;         // first packed row of the block
  i64 group;      // 1, or hq / hk when packing
  i64 head_base;  // query head of packed row g = 0
  FP_HD i64 query(i64 r) const { return (m0 + r) / group; }
  FP_HD i64 head(i64 r) const { return head_base + (m0 + r) % group; }
};

/// The block for grid position (m_block, y): y is the query head, or the kv head when packing.
FP_HD RowMap row_map(i64 m_block, i64 y, i64 group, i64 block_m) {
  return {m_block * block_m, group, group > 1 ? group_head(y, group, (i64)0) : y};
}

/// A block's sequence and rows: lengths with device-resident indices guarded (problem.h's
/// guarded_lengths: an index that would address outside its tensor gives an empty sequence, nothing is
/// read out of bounds), the packed row count, and its first and last query. A block with m0 >=
/// packed_len has no row; the kernel leaves before anything else.
struct FwdBlock {
  i64 len_q, len_k;
  i64 packed_len;   // len_q * group: rows at or past it are padding, never stored
  i64 first, last;  // the block's first and last query
};
FP_HD FwdBlock fwd_block(const AttnProblem& p, i64 b, const RowMap& rows, i64 block_m) {
  const SeqLens seq = guarded_lengths(p, b);
  const i64 packed_len = seq.q * rows.group;
  const i64 end = rows.m0 + block_m < packed_len ? rows.m0 + block_m : packed_len;
  return {seq.q, seq.k, packed_len, rows.m0 / rows.group, (end - 1) / rows.group};
}

/// The key tiles (of `block_n` keys) the block visits: the union of its rows' visible ranges, and of
/// those split `split` of `splits` (core::split_tiles, the rule of every GPU forward's split-KV).
FP_HD sem::Tiles<i64> block_tiles(const AttnProblem& p, const FwdBlock& blk, i64 block_n, i64 split,
                                  i64 splits) {
  const sem::KeyRange keys =
      sem::tile_keys(blk.first, blk.last + 1, blk.len_q, blk.len_k, p.window_left, p.window_right);
  const sem::Tiles<i64> tiles = sem::covering_tiles<i64>(keys.lo, keys.hi, block_n);
  return splits > 1 ? core::split_tiles<i64>(tiles, split, splits) : tiles;
}

/// Keys every row of the block sees: tiles inside this range need no mask.
FP_HD sem::KeyRange unmasked_keys(const AttnProblem& p, const FwdBlock& blk) {
  return sem::keys_seen_by_all(blk.first, blk.last + 1, blk.len_q, blk.len_k, p.window_left, p.window_right);
}

/// What the score transform of one lane needs for its kRows rows. Positions within a sequence are
/// 32-bit (validation rejects lengths >= 2^31; cu_seqlens are int32): the state stays small in
/// registers next to the accumulators. Memory offsets stay 64-bit.
template <int kRows>
struct ScoreRows {
  float scale;       // softmax scale (times the fp8 descales of q and k)
  float scale_log2;  // scale * log2(e): the whole transform when `plain`
  bool plain;        // no softcap, no ALiBi
  int len_q, len_k;
  int row[kRows];                    // query positions of the rows (within the sequence)
  int head[kRows];                   // their query heads (differ when packing GQA)
  float slope[kRows];                // their ALiBi slopes
  int key_lo[kRows], key_hi[kRows];  // their visible key ranges, clamped to [0, len_k]
};

/// The score context of block rows `local[r]` (relative to rows.m0) of batch entry / sequence b.
template <int kRows>
FP_HD ScoreRows<kRows> score_rows(const AttnProblem& p, const FwdBlock& blk, i64 b, i64 hk,
                                  const RowMap& rows, const int (&local)[kRows]) {
  ScoreRows<kRows> c;
  c.scale = p.scale * descale(p, 0, b, hk) * descale(p, 1, b, hk);
  c.scale_log2 = c.scale * sem::kLog2e;
  c.plain = p.softcap <= 0.0f && !p.alibi;
  c.len_q = (int)blk.len_q, c.len_k = (int)blk.len_k;
  for (int r = 0; r < kRows; ++r) {
    c.row[r] = (int)rows.query(local[r]);
    c.head[r] = (int)rows.head(local[r]);
    c.slope[r] = alibi_slope(p, b, c.head[r]);
    const sem::KeyRange kr = sem::visible_keys(c.row[r], blk.len_q, blk.len_k, p.window_left, p.window_right);
    c.key_lo[r] = (int)(kr.lo < 0 ? 0 : kr.lo > blk.len_k ? blk.len_k : kr.lo);
    c.key_hi[r] = (int)(kr.hi < 0 ? 0 : kr.hi > blk.len_k ? blk.len_k : kr.hi);
  }
  return c;
}

/// Scores of the tile at key j0 in log2 units (SPEC steps 1-4): raw dots -> scale, softcap, ALiBi
/// (core's `score`), times log2(e); keys outside a row's visible range -> -inf when `masked` (tiles that
/// straddle some row's range; a tile reaching past len_k is always masked).
template <class Rows, int kBlockN, class S>
FP_STAGE void transform_scores(S& s, const AttnProblem& p, const ScoreRows<Rows::kRows>& c, i64 j0,
                               bool masked) {
  if (c.plain) {
    Rows::map_s(s, [&](int, int, float x) { return x * c.scale_log2; });
  } else {
    Rows::map_s(s, [&](int r, int key, float x) {
      return score<float>(p, x, c.scale, c.slope[r], c.row[r], j0 + key, c.len_q, c.len_k) * sem::kLog2e;
    });
  }
  if (!masked) return;
  // Visible range of each row relative to the tile, clamped to [0, kBlockN]: 32-bit compares below.
  int lo[Rows::kRows], hi[Rows::kRows];
  for (int r = 0; r < Rows::kRows; ++r) {
    const i64 l = c.key_lo[r] - j0, h = c.key_hi[r] - j0;
    lo[r] = l < 0 ? 0 : l > kBlockN ? kBlockN : (int)l;
    hi[r] = h < 0 ? 0 : h > kBlockN ? kBlockN : (int)h;
  }
  Rows::map_s(s, [&](int r, int key, float x) { return key < lo[r] || key >= hi[r] ? sem::kNegInf : x; });
}

/// Running softmax state of a lane's rows, log2 domain: the max m and this lane's share of the row sum
/// l (reduced over the row's lanes only at the end: every lane of a row rescales by the same factor).
template <int kRows>
struct RowState {
  float m[kRows], l[kRows];
};
template <int kRows>
FP_HD RowState<kRows> row_state_init() {
  RowState<kRows> st;
  for (int r = 0; r < kRows; ++r) st.m[r] = sem::kNegInf, st.l[r] = 0.0f;
  return st;
}

/// Online softmax over one tile: each row's new max, O and l rescaled, P = 2^(s - m) in place. A row
/// whose max is still -inf takes 0 as its reference (sem::softmax_base), so 2^(-inf - 0) = 0 and no NaN
/// appears; fully masked rows end with l = 0. Rescaling O by exactly 1 changes nothing, so it is skipped
/// when no row of the warp / wave has a new max (most tiles of a long row).
template <class Rows, class S, class O>
FP_STAGE void online_softmax(S& s, O& o, RowState<Rows::kRows>& st) {
  constexpr int kRows = Rows::kRows;
  float mx[kRows], ref[kRows], alpha[kRows];
  for (int r = 0; r < kRows; ++r) mx[r] = sem::kNegInf;
  Rows::map_s(s, [&](int r, int, float x) {
    mx[r] = fmaxf(mx[r], x);
    return x;
  });
  bool unit = true;
  for (int r = 0; r < kRows; ++r) {
    mx[r] = fmaxf(st.m[r], Rows::row_max(mx[r]));
    ref[r] = sem::softmax_base(mx[r]);
    alpha[r] = Rows::exp2(st.m[r] - ref[r]);  // 0 while the old max is -inf
    st.m[r] = mx[r];
    st.l[r] *= alpha[r];
    unit = unit & (alpha[r] == 1.0f);
  }
  if (!Rows::all_lanes(unit)) Rows::map_o(o, [&](int r, float x) { return x * alpha[r]; });
  Rows::map_s(s, [&](int r, int, float x) {
    const float pe = Rows::exp2(x - ref[r]);
    st.l[r] += pe;
    return pe;
  });
}

/// The factor the finished output rows are multiplied by beside 1 / l: dropout's 1 / (1 - p) and the
/// fp8 descale of v.
FP_HD float output_scale(const AttnProblem& p, i64 b, i64 hk, bool dropout) {
  return (dropout ? sem::dropout_keep_scale(p.dropout_p) : 1.0f) * descale(p, 2, b, hk);
}

/// Finalize (after the last tile, every lane of the row taking part: row_sum is a collective): O =
/// acc * fac[r] and LSE = ln(2^m * l) of each row. A row with no visible key has l = 0: O = 0 (its
/// accumulator is 0) and LSE = -inf (sem::softmax_norm / softmax_lse).
template <class Rows>
FP_STAGE void finish_rows(const RowState<Rows::kRows>& st, float out_scale, float (&fac)[Rows::kRows],
                          float (&lse)[Rows::kRows]) {
  for (int r = 0; r < Rows::kRows; ++r) {
    const float l = Rows::row_sum(st.l[r]);
    fac[r] = out_scale * sem::softmax_norm(l);
    lse[r] = sem::softmax_lse(st.m[r], l, [](float x) { return Rows::log2(x); });
  }
}

}  // namespace flashport::attn
