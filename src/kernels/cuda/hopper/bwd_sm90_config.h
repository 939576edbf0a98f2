// The Hopper backward main kernel's contract with its host launcher: tile table, shared-memory size and
// the kernel parameter block. Plain C++ (no standard or toolkit header): compiled by g++ and by NVRTC.
#pragma once

#include "cuda/bwd_params.cuh"
#include "cuda/hopper/sm90_config.h"

namespace flashport::cuda::hopper_bwd {

using hopper::head_dim_chunks;
using hopper::kChunkRowBytes;
using hopper::kSmemLimit;
using hopper::TmaDesc;
using hopper::TmaDims;

/// Threads per CTA: warpgroup 0 produces (one thread issues TMA, one warp stages LSE and D; in the
/// narrow kernel two warps add dQ to global memory), warpgroups 1 and 2 consume.
inline constexpr int kThreads = 384;

/// Head dims above 128 run the wide kernel (attn_bwd_sm90_wide.cu), the others the narrow one
/// (attn_bwd_sm90.cu).
FP_HD constexpr bool wide_kernel(int d) {
  return d > 128;
}

/// 64-column chunks of a Q / K / V / dO row in shared memory: whole 128-byte swizzle atoms, d 96 padded
/// to 128; the wide kernel's always 4 (256 columns, two column halves of 128 for its consumers), so d 192
/// runs it on 64 zero columns: its fourth chunk is a TMA box wholly past the row, which TMA fills with zeros.
FP_HD constexpr int bwd_chunks(int d) {
  return wide_kernel(d) ? 4 : head_dim_chunks(d);
}

/// Keys per CTA. Narrow (d <= 128): 128, 64 per consumer warpgroup (the M of one wgmma). Wide (d 192, 256):
/// 64, shared by both consumers: dK + dV of 64 keys x 256 columns are 128 registers per thread when the
/// consumers split the columns, 256 if one consumer owned a key's whole row.
FP_HD constexpr int block_n_for(int d) {
  return wide_kernel(d) ? 64 : 128;
}

/// One backward tile: query rows per step (the N of S^T = K Q^T), Q/dO/LSE/D ring depth, and how the
/// narrow kernel's per-step dQ tiles reach the fp32 accumulator (`FP_DQ_MODE`):
///   0  producer warps 2-3 add them with `red.global.add.v2.f32` (the only mode for a row-major
///      accumulator: d 96; the wide kernel's consumers reduce their own; deterministic runs of the wide
///      kernel);
///   1  one producer thread adds the staged tile with bulk reduce-adds (`cp.reduce.async.bulk`): one
///      instruction per 16-32 KB instead of 64-128 warp reductions, L2 taking whole lines; the staging
///      tile double-buffered, so the consumers do not wait for the copy to read the previous step's.
///      The wide kernel (d 256) stages in the step's freed Q / dO stage instead, and its producer warps
///      2-3 add it (1.02-1.06x its consumers' own reductions on an H100, docs/BWD_NOTES.md part 10).
///      d 128 backward +13-21%, d 64 -1 to +3% (docs/BWD_NOTES.md, part 4); one buffer measured 1-3% below
///      two at d 64 and the same at d 128.
///
/// `pipe` (`FP_BWD_PIPE`, d 64 only): a consumer issues the next step's S^T and dP^T before this step's
/// dV / dK / dQ, so its elementwise stage runs while those three GEMMs do (serial otherwise: GEMMs,
/// elementwise, GEMMs). The registers fit at d 64 only (S^T + dP^T of the next step beside dQ and the
/// packed P^T / dS^T in flight: 192). The ring needs a third stage: step t - 1's stage is released just
/// before step t + 1's scores are issued, which on two stages is the stage they wait for.
struct Tile {
  int block_m, stages;
  int dq_mode = 0;
  int pipe = 0;
};

/// Whether head dim d's kernel with score transform `general` (FP_BWD_GENERAL) can take pipe 1: the
/// key-split dQ of the narrow kernel at d 64, without softcap or dropout (softcap's tanh values spilled
/// 48-88 bytes).
FP_HD constexpr bool pipe_fits(int d, int general) {
  return d == 64 && general < 2;
}

/// Whether a kernel of block_m queries per step with score transform `general` reads its grid with key
/// blocks outside kv heads where BwdParams::keys_outer asks: not softcap on 128 queries per step, where
/// ptxas spilled 84 bytes with the choice compiled in (the register budget there is the tightest).
FP_HD constexpr bool keys_outer_fits(int block_m, int general) {
  return !(block_m == 128 && general == 2);
}

/// Whether dropout (FP_BWD_GENERAL 3, without softcap and ALiBi) runs on the Hopper kernels at head dim d
/// with dQ mode dq_mode: d 64 (64 queries per step), d 128 with bulk dQ (its producers then need 24
/// registers, the consumers take 240) and d 256. The others spilled 4-8 bytes (d 96, d 128 with vector
/// reductions: 232 registers per consumer), and so did dropout beside softcap or ALiBi and 128 queries
/// per step (28-370 bytes): the portable backward takes them.
FP_HD constexpr bool dropout_fits(int d, int dq_mode) {
  return d == 64 || wide_kernel(d) || (d == 128 && dq_mode == 1);
}

/// Whether head dim d's kernel can take dq_mode 1: a tiled accumulator (the staged tile's order is the
/// accumulator's; hopper_bwd::tiled_accumulator gives d 64, 128, 192 and 256 that layout). The wide kernel
/// stages in the step's freed Q / dO stage and its producer warps 2-3 add (attn_bwd_sm90_wide.cu): at
/// d 256 only, where each consumer's staged half is a whole 32 KB of the accumulator's tile.
FP_HD constexpr bool bulk_dq_fits(int d) {
  return wide_kernel(d) ? d == 256 : d % 64 == 0;
}

/// Staging buffers for the step's dQ tiles (narrow kernel): two for bulk reduce-adds of 64-query steps,
/// one at 128 queries per step (two would exceed 227 KB).
FP_HD constexpr int dq_buffers(Tile t) {
  return t.dq_mode == 1 && t.block_m == 64 ? 2 : 1;
}

/// Per head dim (d == dv). Registers per consumer thread (setmaxnreg 232 narrow, 240 wide or 128 queries
/// per step, with room for addresses):
///   d    queries  dK+dV   S+dP   dQ   dQ split between the consumers
///   64   128      64      128    32   by query rows (each 64 queries over all 128 keys)
///   96   64       128     64     32   by columns (each 64 of the padded 128, all 128 keys)
///   128  64       128     64     32   by columns
///   192  64       128     32     64   as 256, on 64 zero columns (bwd_chunks)
///   256  64       128     32     64   by columns (each 128; S^T and dP^T split by queries, 32 each)
/// d 64 takes FA3's shape (docs/BWD_NOTES.md part 7): 128 queries per step, dQ split by query rows (one
/// tile per 64 queries: half the reduce-add traffic of a key split), bulk dQ, the serial loop on two
/// stages, one dQ staging buffer (two exceed 227 KB); H100, bf16, 16k tokens: 1.03-1.13x the 64-query
/// pipelined loop at 1k-16k. Shared memory: K, V 32 KB, Q / dO 64 KB, dS^T 64 KB, dQ staging 32 KB.
/// d 192 runs the wide kernel padded to 256 columns (a column split at 96 would not be whole swizzle
/// atoms): a third more GEMM work than its FLOPs, and the zero columns' dQ never reduced.
FP_HD constexpr Tile tile_for(int d) {
  switch (d) {
    case 64:
      return {128, 2, 1, 0};
    case 96:
    case 128:
    case 192:
    case 256:
      return {64, 2};
    default:
      return {0, 0};
  }
}

/// The tile where 128 queries per step cannot run: deterministic mode (its turns count 64-query tiles)
/// and the vector-reduction dQ path (FP_DQ_MODE 0). At d 64: 64 queries per step, dQ split by keys (each
/// consumer its own 64 keys, all 64 columns; partial tiles summed), the pipelined loop on three stages
/// (0.97-1.06x the serial loop on two; with softcap, where the pipelined loop does not fit, the serial
/// one on the same three stages). 128 queries with the key split (dQ 64 registers) spilled.
FP_HD constexpr Tile tile_64_queries(int d) {
  return d == 64 ? Tile{64, 3, 0, 1} : tile_for(d);
}

/// Bytes of the kernel's SharedStorage (the kernels static_assert equality) plus 1 KB for aligning its
/// base to the 1024-byte swizzle period: K and V (block_n rows), stages x (Q, dO) (block_m rows), each
/// row d/64 chunks of 128 bytes; stages x (LSE, D) (block_m floats); then
///   narrow: two dS^T buffers (block_n keys x block_m queries, 2 bytes), dq_buffers x the step's dQ (two
///           64 x 64 fp32 tiles), 1 + 2 x dq_buffers + 2 x stages mbarriers;
///   wide:   two P^T and two dS^T buffers (64 keys x 64 queries), 3 + 4 x stages mbarriers (the ring's,
///           a pair's two and the drain's two per stage);
/// padded to 1024.
FP_HD constexpr int smem_bytes(int d, Tile t) {
  const int block_n = block_n_for(d);
  const bool wide = wide_kernel(d);
  const int chunk_rows = block_n * 2 + t.stages * t.block_m * 2;
  const int tiles =
      bwd_chunks(d) * kChunkRowBytes * chunk_rows + (wide ? 4 * 64 * 64 * 2 : 2 * block_n * t.block_m * 2);
  const int rest = (wide ? 0 : dq_buffers(t) * 2 * 64 * 64 * 4) + t.stages * t.block_m * 4 * 2 +
                   8 * (wide ? 3 + 4 * t.stages : 1 + 2 * dq_buffers(t) + 2 * t.stages);
  return (tiles + rest + 1023) / 1024 * 1024 + 1024;
}

/// Kernel parameters besides the four tensor maps (q, k, v, dout).
struct BwdSm90Params {
  BwdParams bwd;
  TmaDims dims_q, dims_k, dims_v, dims_do;
};

}  // namespace flashport::cuda::hopper_bwd
