// What the CDNA forward kernel and its host side share: head-dim buckets, the tile table, the LDS
// budget and the kernel parameters. Plain constexpr C++ (the HIP backend, the build's variant list
// and the model tests include it without a GPU compiler).
#pragma once

#include "core/problem.h"
#include "core/split_plan.h"

namespace flashport::amd {

/// The head-dim bucket a problem compiles for: max(d, dv) rounded up to a multiple of 32; 0 above 256.
/// Columns past d / dv are zero-filled in LDS, so they add exact zeros (the CUDA path's rule).
constexpr int fwd_head_dim_bucket(long long d, long long dv) {
  const long long m = d > dv ? d : dv;
  return m <= 0 || m > 256 ? 0 : (int)((m + 31) / 32 * 32);
}
inline constexpr int kFwdBuckets[] = {32, 64, 96, 128, 160, 192, 224, 256};
/// The buckets that also get a dropout variant (Kernel<..., kDropout = true>, -D FP_DROPOUT=1): the head
/// dims of models trained with dropout in practice, so the build adds 2 code objects per arch per bucket
/// (the no-dropout variants stay as they were: a runtime branch cost them up to 4 VGPRs and more SGPR
/// spills).
/// A dropout call at another head dim has no kernel: fwd_has_dropout_variant says so before launch.
inline constexpr int kFwdDropoutBuckets[] = {64, 128};
constexpr bool fwd_has_dropout_variant(int bucket) {
  for (int b : kFwdDropoutBuckets)
    if (b == bucket) return true;
  return false;
}

/// The buckets with an fp8 variant (Kernel<bf16, ..., kFp8 = true>, -D FP_FP8=1; one code object per
/// arch and bucket serves e4m3fn, e4m3fnuz and e5m2 and every output type): the head dims of the
/// models served in fp8 in practice (64, 128; 256 for Gemma-class models).
inline constexpr int kFwdFp8Buckets[] = {64, 128, 256};
constexpr bool fwd_has_fp8_variant(int bucket) {
  for (int b : kFwdFp8Buckets)
    if (b == bucket) return true;
  return false;
}

/// One block: `waves` waves of 16 query rows each, key tiles of `block_n` keys.
struct FwdTile {
  int waves, block_m, block_n;
};
/// 64-key tiles up to d 128; 32 above, where the K tile and the transposed V tile would pass CDNA's
/// 64 KiB of LDS per workgroup (d 256, 64 keys: 33 + 35 KiB). Registers per lane: O d/4, S block_n/4,
/// Q d/8 (d 256: 64 + 8 + 32 of 512), so no tile spills.
constexpr FwdTile fwd_tile(int bucket) {
  return bucket <= 128 ? FwdTile{4, 64, 64} : FwdTile{4, 64, 32};
}
/// LDS row pitch of Q and K tiles, in 2-byte elements: the 8-byte pad moves row r to bank 2r (mod 32)
/// for head dims that are multiples of 64, so the 16 rows one ds_read_b64 touches hit distinct banks.
constexpr int fwd_pitch(int bucket) {
  return bucket + 4;
}
/// Pitch of the transposed V tile (one row per channel, one column per key), same reasoning.
constexpr int fwd_vt_pitch(int bucket) {
  return fwd_tile(bucket).block_n + 4;
}
/// LDS bytes: Q staging (block_m rows) before the key loop, then K (block_n rows) + V^T (bucket rows)
/// in the same space.
constexpr int fwd_lds_bytes(int bucket) {
  const int q = fwd_tile(bucket).block_m * fwd_pitch(bucket);
  const int kv = fwd_tile(bucket).block_n * fwd_pitch(bucket) + bucket * fwd_vt_pitch(bucket);
  return 2 * (q > kv ? q : kv);
}
static_assert(fwd_lds_bytes(256) <= 65536 && fwd_lds_bytes(128) <= 65536, "CDNA LDS per workgroup");

/// Bits of FwdParams::vec: the operand's rows are 16-byte aligned (pointer and row/head/batch strides
/// multiples of 8 elements), so 16-byte global loads (8-byte stores for O; 16-byte for an f32 O) may
/// be used. FP8 inputs load 8 bytes per chunk, so their pointers need only 8-byte alignment.
enum VecFlags : int { kVecQ = 1, kVecK = 2, kVecV = 4, kVecO = 8 };

/// Kernel arguments, for attn_fwd, attn_fwd_split and split_combine. Grid of the forward: x = query
/// blocks of block_m rows (reversed in the kernel so the costliest causal blocks start first), y = query
/// heads (kv heads when packing GQA), z = batch x num_splits (sequence z / num_splits, split z %
/// num_splits). Block: waves * 64 lanes. attn_fwd runs the whole key range (num_splits 1); attn_fwd_split
/// (num_splits > 1, dense queries: varlen is never split) runs split z's share of each block's key tiles
/// (core::split_tiles, the CUDA kernel's rule) and writes its normalised O and LSE in fp32 to the
/// workspaces (fwd_partial_row), which split_combine (split_combine.hpp) merges into p.o and p.lse.
struct FwdParams {
  AttnProblem p;
  int vec;       // VecFlags
  int pack_gqa;  // 1, or hq / hk: block row r is query (m0 + r) / group of head kv_head * group + (m0 + r) %
                 // group
  float* o_partial;    // (num_splits, batch, hq, sq, dv) fp32; null without splits
  float* lse_partial;  // (num_splits, batch, hq, sq) fp32
  int num_splits;      // >= 1
};

/// Rows (batch, hq, sq) of one split in the workspaces, and the row of (split, sequence b, head h,
/// query i); O's row holds dv floats.
FP_HD long long fwd_split_rows(const AttnProblem& p) {
  return p.batch * p.hq * p.sq;
}
FP_HD long long fwd_partial_row(const AttnProblem& p, long long split, long long b, long long h,
                                long long i) {
  return ((split * p.batch + b) * p.hq + h) * p.sq + i;
}

/// The largest grid y and z a launch may use: HIP reports 65536 on CDNA, CUDA allows 65535; the lower
/// bound keeps one rule for both. The backend refuses larger head and batch counts (no batch chunking
/// here yet) and caps batch x splits by it.
inline constexpr long long kMaxGridYZ = 65535;

/// The launch grid of the forward for `p` (x, y, z as FwdParams says).
struct FwdGrid {
  unsigned x, y, z;
};
/// `pack`: FwdParams::pack_gqa (the backend's is gqa_pack, core/problem.h).
inline FwdGrid fwd_grid(const AttnProblem& p, int block_m, long long pack, int num_splits) {
  return {(unsigned)((p.sq * pack + block_m - 1) / block_m), (unsigned)(pack > 1 ? p.hk : p.hq),
          (unsigned)(p.batch * num_splits)};
}

/// The split count of the forward of `p`: 1 when `requested` is 1, for varlen queries (their rows have no
/// dense workspace index, as on CUDA) and empty problems; else `requested` (> 1) or core::heuristic_splits
/// over the unsplit grid's blocks (GQA packed by gqa_pack, as launched) and the device's `cu_count` (one
/// block per CU, as the CUDA launcher counts SMs), at most core::kMaxSplits, the key tiles and what keeps
/// batch x splits within kMaxGridYZ.
inline int fwd_num_splits(const AttnProblem& p, int requested, int cu_count) {
  if (requested == 1 || p.cu_seqlens_q || p.sq <= 0 || p.sk <= 0) return 1;
  const FwdTile tile = fwd_tile(fwd_head_dim_bucket(p.d, p.dv));
  const FwdGrid unsplit = fwd_grid(p, tile.block_m, gqa_pack(p, tile.block_m), 1);
  const long long key_tiles = (p.sk + tile.block_n - 1) / tile.block_n;
  const long long ctas = (long long)unsplit.x * unsplit.y * unsplit.z;
  const long long splits = requested > 1 ? requested : core::heuristic_splits(ctas, cu_count, key_tiles);
  const long long grid_z_cap = p.batch > 0 ? kMaxGridYZ / p.batch : 1;  // grid z is batch x splits
  return (int)std::max<long long>(1, std::min<long long>({splits, core::kMaxSplits, key_tiles, grid_z_cap}));
}

/// split_combine: one wave per output row, kCombineWaves rows (queries i of one head and sequence) per
/// block; grid (ceil(sq / kCombineWaves), hq, batch).
inline constexpr int kCombineWaves = 4;
inline constexpr int kCombineThreads = 64 * kCombineWaves;
inline FwdGrid fwd_combine_grid(const AttnProblem& p) {
  return {(unsigned)((p.sq + kCombineWaves - 1) / kCombineWaves), (unsigned)p.hq, (unsigned)p.batch};
}

/// The VecFlags of a problem (host side): an operand qualifies when its pointer is 16-byte aligned and
/// every stride is a multiple of 8 elements.
inline int fwd_vec_flags(const AttnProblem& p) {
  const unsigned long long in_align = is_fp8_elem(p.in_type) ? 8 : 16;
  auto aligned = [](const Operand& o, unsigned long long align) {
    return (unsigned long long)o.ptr % align == 0 && o.row_stride % 8 == 0 && o.head_stride % 8 == 0 &&
           o.batch_stride % 8 == 0;
  };
  return (aligned(p.q, in_align) ? kVecQ : 0) | (aligned(p.k, in_align) ? kVecK : 0) |
         (aligned(p.v, in_align) ? kVecV : 0) | (aligned(p.o, 16) ? kVecO : 0);
}

}  // namespace flashport::amd
