// Kernel arguments and shared-memory size of the CUDA backward kernels; shared by the host launcher
// (src/backends/cuda/backward.cpp) and the NVRTC-compiled kernels (attn_bwd*.cu).
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

/// Arguments of the three backward kernels (dot_do_o, main, dq_convert).
///
/// Scratch, fp32, allocated stream-ordered by the host:
/// - `dsum`: D_i = rowsum(dO_i * O_i), laid out like the LSE (lse_offset).
/// - `dq_accum`: (num_slices, hq, rows_total, accum_ld), row index `(varlen ? cu_seqlens_q[b] : b * sq)
///   + i`. Zeroed before the main kernel (by dot_do_o: `zero_words`). Non-deterministic mode: one slice,
///   CTAs add with atomics.
///   Deterministic mode: the main kernel runs `num_slices` CTAs per (kv head, batch); CTA x owns slice x
///   alone and visits key blocks x, x + num_slices, ... in order, adding without atomics; dq_convert
///   sums the slices in slice order. Either way dQ = scale * sum(slices).
///   `accum_tiled` = w > 0 (the Hopper kernels at d 64, 128, 192, 256; one slice): rows are grouped in 64-row
///   tiles of accum_ld == d columns stored in their register-fragment order for column blocks of width w
///   (bwd::accum_tile_offset), so a warp's vector reduction covers whole 128-byte lines; each sequence's
///   tiles start at bwd::accum_row0's padded row. Row-major (accum_tiled 0): d 96, the portable kernels,
///   and the Hopper kernels' FP_BWD_DQ_ROWS variants (batches of many short sequences, row_major_dq).
struct BwdParams {
  AttnProblem p;
  float* dsum;
  float* dq_accum;
  long long rows_total;  // batch * sq (dense) or total_q (varlen); tiled: accum_rows_tiled
  long long accum_ld;    // row pitch of dq_accum in floats (the head-dim bucket); == d when tiled
  int accum_tiled;       // 0: row-major; w: 64-row tiles in fragment order (see above), rows_total padded
  int num_slices;        // >= 1; > 1 only in deterministic mode
  int vec;               // 1: every operand row is 16-byte aligned (cp.async, 16-byte accesses)
  int batch_offset;      // batch entry of grid z = 0 (launches are chunked: grid z <= 65535)
  // Deterministic mode of a single-slice kernel (the Hopper ones), else null: per 64-query dQ tile of
  // the tiled row numbering (row (h * accum_rows_tiled + bwd::accum_row0(tiled) + m0) / 64), how many
  // key blocks have added theirs. Zeroed with dq_accum; each key block waits for its turn (the count
  // of key blocks before it that see the tile), so the additions happen in key-block order.
  int* dq_tile_count;
  // 16-byte words from dq_accum on (the accumulator, then the tile counters) that dot_do_o zeroes, each
  // of its CTAs an equal share: the main kernel's memset, without its own launch.
  long long zero_words;
  // The Hopper kernels' grid: 0 (key block, kv head, batch), 1 (kv head, key block, batch). CTAs start
  // in grid order, x fastest, so with 1 each batch entry starts all its heads' key block 0 (under a
  // causal mask the longest) first and ends on short blocks, the grid's tail among them.
  int keys_outer;
};

/// Grid of the two aux kernels (attn_bwd_aux.cu: D before the main kernel, the dQ convert after it):
/// (ceil(sq / kBwdAuxRows), hq, batch) CTAs of kBwdAuxThreads. 64 rows per CTA with four passes' loads
/// issued first measured no faster (H100, 2026-12-07: D 18.0 -> 20.1 us, convert 14.9 -> 14.3 us at
/// GPT-2's 8 x 1024 x 12, d 64): at 16 rows both already run at 85-95% of the copy rate.
constexpr int kBwdAuxRows = 16;
constexpr int kBwdAuxThreads = 128;

/// `rows` rounded up to whole 64-row tiles of a tiled dQ accumulator.
FP_HD constexpr long long round_up_tile(long long rows) {
  return (rows + 63) / 64 * 64;
}

/// Rows per head of a row-major dQ accumulator: batch * sq (dense) or total_q (varlen).
FP_HD constexpr long long accum_rows(const AttnProblem& p) {
  return p.cu_seqlens_q ? p.total_q : p.batch * p.sq;
}

/// Rows per head of a tiled dQ accumulator: each sequence's rows padded to whole 64-row tiles (varlen:
/// sequence b starts at row (cu_seqlens_q[b] + 64 b) rounded down to 64, which never overlaps b - 1).
FP_HD constexpr long long accum_rows_tiled(const AttnProblem& p) {
  return p.cu_seqlens_q ? p.total_q + 64 * p.batch : p.batch * round_up_tile(p.sq);
}

/// Dynamic shared memory of the main kernel, bytes: `stages` (1 or 2) buffers of Q and dO tiles
/// (block_m rows), K and V tiles (block_n rows), each row padded by 8 elements; then P and dS tiles
/// (block_m, block_n + 8). 16-bit elements throughout. attn_bwd.cu static_asserts that its carve-up
/// matches.
FP_HD constexpr int bwd_smem_bytes(int block_m, int block_n, int head_bucket, int stages) {
  return (2 * stages * block_m + 2 * block_n) * (head_bucket + 8) * 2 + 2 * block_m * (block_n + 8) * 2;
}

/// The fp32 backward's tile (attn_bwd_f32.cu) per head-dim bucket (64, 128, 256): query rows per step,
/// key rows per CTA. Sized so its shared memory fits the 99 KB of every sm_80+ part; 256 threads in a
/// 16 x 16 grid over each product, so every extent is a multiple of 16.
struct BwdF32Tile {
  int block_m, block_n;
};
FP_HD constexpr BwdF32Tile bwd_f32_tile(int bucket) {
  return bucket <= 64 ? BwdF32Tile{64, 32} : bucket <= 128 ? BwdF32Tile{32, 32} : BwdF32Tile{16, 16};
}

/// Dynamic shared memory of the fp32 backward, bytes: Q and dO (block_m rows), K and V (block_n rows) of
/// bucket + 4 floats, then P and dS (block_m rows of block_n + 1 floats).
FP_HD constexpr int bwd_f32_smem_bytes(int bucket) {
  const BwdF32Tile t = bwd_f32_tile(bucket);
  return ((2 * t.block_m + 2 * t.block_n) * (bucket + 4) + 2 * t.block_m * (t.block_n + 1)) * 4;
}

}  // namespace flashport::cuda
