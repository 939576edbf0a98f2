// Sequence geometry of the backward kernels: per-sequence lengths with device-resident indices
// guarded, and the row offsets of the operands, the LSE/D scratch and the dQ accumulator.
#pragma once

#include "core/problem.h"
#include "cuda/bwd_params.cuh"
#include "cuda/common/index.cuh"

namespace flashport::cuda::bwd {

/// One sequence as the backward kernels see it, in 32-bit token counts (backward_unsupported rejects
/// lengths >= 2^31; cu_seqlens are int32 anyway). A bad device-resident index (cu_seqlens out of order
/// or past total_q / total_k) empties the sequence instead of addressing outside a tensor. Paged and kv-cache
/// layouts never reach these kernels (backward_unsupported rejects them).
struct Seq {
  int len_q, len_k;  // queries; keys used (seqused_k)
  int rows_k;        // key rows in memory: dK/dV rows [len_k, rows_k) are written as zeros
  int q_start;       // first row of the sequence in q/o/dout/dq and in the LSE/D/dq_accum rows
  int k_start;       // first row of the sequence in k/v/dk/dv (varlen), else 0
};

FP_DEV Seq sequence(const AttnProblem& p, int b) {
  Seq s{(int)p.sq, (int)p.sk, (int)p.sk, 0, 0};
  if (p.cu_seqlens_q) {
    const int s0 = p.cu_seqlens_q[b], s1 = p.cu_seqlens_q[b + 1];
    const bool bad = s0 < 0 || s1 < s0 || s1 > p.total_q;
    s.len_q = bad ? 0 : (s1 - s0 < p.sq ? s1 - s0 : (int)p.sq);  // p.sq (max_seqlen_q) sizes the grids
    s.q_start = bad ? 0 : s0;
  }
  if (p.cu_seqlens_k) {
    const int s0 = p.cu_seqlens_k[b], s1 = p.cu_seqlens_k[b + 1];
    const bool bad = s0 < 0 || s1 < s0 || s1 > p.total_k;  // dK/dV rows are written: stay in the tensor
    s.rows_k = bad ? 0 : (s1 - s0 < p.sk ? s1 - s0 : (int)p.sk);
    s.k_start = bad ? 0 : s0;
  }
  s.len_k = s.rows_k;
  if (p.seqused_k) s.len_k = (int)clamp_i64((i64)p.seqused_k[b] + p.seqused_k_add, 0, s.rows_k);
  return s;
}

/// The query blocks (of block_m rows) holding a query that sees some key of [n0, n0 + block_n): the
/// tiles a backward CTA for that key block visits. Empty (begin == end) when none does.
FP_DEV sem::Tiles<int> seeing_query_blocks(const AttnProblem& p, const Seq& s, int n0, int block_n,
                                           int block_m) {
  if (n0 >= s.len_k || s.len_q <= 0) return {0, 0};
  const int n1 = n0 + block_n < s.len_k ? n0 + block_n : s.len_k;
  const sem::Range qs = sem::seeing_queries(n0, n1, s.len_q, s.len_k, p.window_left, p.window_right);
  if (qs.hi <= qs.lo) return {0, 0};
  return sem::covering_tiles((int)qs.lo, (int)qs.hi, block_m);
}

/// Element offset of row `row` (within the sequence starting at `start`) of head `h` in operand `t`:
/// q_offset / k_offset for the layouts the backward accepts, without re-reading cu_seqlens.
FP_DEV i64 row_offset(const Operand& t, bool varlen, int b, int start, int row, int h) {
  return (varlen ? 0 : (i64)b * t.batch_stride) + ((i64)start + row) * t.row_stride + (i64)h * t.head_stride;
}

/// Index of (b, h, query 0) in the LSE and in the D scratch (lse_offset with the guarded start);
/// query i is at + i.
FP_DEV i64 lse_row0(const AttnProblem& p, const Seq& s, int b, int h) {
  return p.cu_seqlens_q ? (i64)h * p.total_q + s.q_start : ((i64)b * p.hq + h) * p.sq;
}

/// Row of (b, query 0) in one head of the dQ accumulator (rows_total rows per head); query i is at + i.
/// Tiled (BwdParams::accum_tiled): a multiple of 64, padded as accum_rows_tiled says.
FP_DEV i64 accum_row0(const AttnProblem& p, const Seq& s, int b, bool tiled = false) {
  if (tiled) return p.cu_seqlens_q ? ((i64)s.q_start + 64 * b) / 64 * 64 : (i64)b * round_up_tile(p.sq);
  return p.cu_seqlens_q ? (i64)s.q_start : (i64)b * p.sq;
}

/// Offset of (row r < 64, column col < ld) inside a tiled accumulator's 64 x ld tile, for column blocks
/// of width w (BwdParams::accum_tiled): the Hopper kernels' wgmma fragment order [c = col / w][q][tid][x],
/// where block column col % w = 8j + 2t + x, row r = 16 * warp + g + 8h, q = 2j + h and tid = 32 * warp
/// + 4g + t. A warp's register pair q is then 256 contiguous bytes, and eight columns from a multiple of 8
/// are 8 consecutive floats.
FP_HD int accum_tile_offset(int r, int col, int w) {
  const int c = col / w, cc = col % w, j = cc >> 3, t = (cc >> 1) & 3, x = col & 1;
  const int q = 2 * j + ((r >> 3) & 1), tid = 32 * (r >> 4) + 4 * (r & 7) + t;
  return ((c * (w / 4) + q) * 128 + tid) * 2 + x;
}

}  // namespace flashport::cuda::bwd
