// What the CDNA backward kernels and their host side share: head-dim buckets, the tile table, the LDS
// budget, the fp32 workspaces (D = rowsum(dO * O), the dQ accumulator) and the kernel parameters.
// Plain constexpr C++ (the HIP backend, the build's variant list and the model tests include it
// without a GPU compiler).
#pragma once

#include "core/problem.h"

namespace flashport::amd {

/// The head-dim bucket a backward compiles for: max(d, dv) rounded up to a multiple of 32; 0 above 256
/// (the forward's rule, attn_fwd_config.hpp). Channels past d / dv are zero-filled in LDS and
/// registers, so they add exact zeros.
constexpr int bwd_head_dim_bucket(long long d, long long dv) {
  const long long m = d > dv ? d : dv;
  return m <= 0 || m > 256 ? 0 : (int)((m + 31) / 32 * 32);
}
inline constexpr int kBwdBuckets[] = {32, 64, 96, 128, 160, 192, 224, 256};

/// One block of the main kernel: `waves` waves, each owning 16 keys of the block's key tile (block_n =
/// 16 waves), visiting the queries in tiles of block_m = block_n rows (so in the dQ stage each wave
/// owns 16 of the tile's queries). 4 waves up to d 128; 2 above, where Q, dO (block_m rows each) and
/// K^T (bucket rows) would pass CDNA's 64 KiB of LDS per workgroup.
struct BwdTile {
  int waves, block_m, block_n;
};
constexpr BwdTile bwd_tile(int bucket) {
  return bucket <= 128 ? BwdTile{4, 64, 64} : BwdTile{2, 32, 32};
}
/// LDS row pitch of the Q and dO tiles (2-byte elements): the forward's 8-byte pad (bank spread).
constexpr int bwd_pitch(int bucket) {
  return bucket + 4;
}
/// Pitch of the K^T tile (one row per channel, one column per key) and of the dS tile (one row per
/// query, one column per key).
constexpr int bwd_key_pitch(int bucket) {
  return bwd_tile(bucket).block_n + 4;
}
/// LDS bytes: K^T (for the whole block), Q, dO and dS of one query tile, and the tile's LSE and D
/// rows (fp32). Before the query loop the Q space also stages the V tile (block_n = block_m rows).
constexpr int bwd_lds_bytes(int bucket) {
  const BwdTile t = bwd_tile(bucket);
  return 2 * (bucket * bwd_key_pitch(bucket) + 2 * t.block_m * bwd_pitch(bucket) +
              t.block_m * bwd_key_pitch(bucket)) +
         2 * 4 * t.block_m;
}
static_assert(bwd_lds_bytes(128) <= 65536 && bwd_lds_bytes(256) <= 65536, "CDNA LDS per workgroup");

/// Lanes per block of the D-preprocessing and dQ-convert kernels: 64 rows x 4 lanes.
inline constexpr int kBwdRowThreads = 256;
inline constexpr int kBwdRowsPerBlock = kBwdRowThreads / 4;

/// Bits of BwdParams::vec: the operand's rows are 16-byte aligned (pointer and strides multiples of 8
/// elements), so 16-byte loads and 8-byte stores may be used on it.
enum BwdVecFlags : int {
  kBwdVecQ = 1,
  kBwdVecK = 2,
  kBwdVecV = 4,
  kBwdVecO = 8,
  kBwdVecDo = 16,
  kBwdVecDq = 32,
  kBwdVecDk = 64,
  kBwdVecDv = 128
};

/// The query rows the fp32 workspaces hold: total_q for varlen, batch * sq dense.
FP_HD long long bwd_rows(const AttnProblem& p) {
  return p.cu_seqlens_q ? p.total_q : p.batch * p.sq;
}
/// Offset of (b, query i, head h, channel 0) in slice 0 of the dQ accumulator: fp32, (slices, rows, hq,
/// d) contiguous.
FP_HD long long bwd_dq_accum_offset(const AttnProblem& p, long long b, long long i, long long h) {
  const long long row = p.cu_seqlens_q ? (long long)p.cu_seqlens_q[b] + i : b * p.sq + i;
  return (row * p.hq + h) * p.d;
}
/// fp32 elements of the workspaces: one slice of the dQ accumulator, and D (laid out like the LSE:
/// lse_offset). The accumulator holds BwdParams::num_slices slices.
FP_HD long long bwd_dq_slice_elems(const AttnProblem& p) {
  return bwd_rows(p) * p.hq * p.d;
}
FP_HD long long bwd_d_elems(const AttnProblem& p) {
  return bwd_rows(p) * p.hq;
}

/// Arguments of the three kernels (one struct, so a launch passes the same block to each):
///   attn_bwd_dot_do_o:  grid (ceil(max sq / 64), hq, batch), 256 lanes. D = rowsum(dO * O), dQ acc = 0.
///   attn_bwd:           grid (x, hk, batch), 64 * waves lanes; block x takes the key tiles x, x + grid
///                       x, ... in order. dK, dV; dQ acc +=. x = ceil(sk / block_n) (one tile each) with
///                       atomics into one slice; deterministic (p.deterministic): x = num_slices, block x
///                       adds into slice x alone with plain read-modify-writes, each element by the lane
///                       that owns it in every tile, so the order of the adds is fixed.
///   attn_bwd_convert_dq grid as attn_bwd_dot_do_o. dQ = scale * (sum of the slices in slice order).
/// `p` carries dout/grad_* and the LSE; `d_rows` and `dq_accum` are workspaces of bwd_d_elems and
/// num_slices * bwd_dq_slice_elems floats.
struct BwdParams {
  AttnProblem p;
  float* d_rows;
  float* dq_accum;
  int num_slices;  // >= 1; > 1 only in deterministic mode (bwd_num_slices)
  int vec;         // BwdVecFlags
};

/// Key tiles of the main kernel for a problem (the grid x of the non-deterministic launch).
constexpr long long bwd_key_tiles(const AttnProblem& p, int bucket) {
  return (p.sk + bwd_tile(bucket).block_n - 1) / bwd_tile(bucket).block_n;
}
/// dQ slices: 1 unless deterministic; then at most `max_slices` (the launcher's choice: enough blocks
/// to fill the GPU with slices x hk x batch, against slices x the accumulator's size in memory).
constexpr int bwd_num_slices(const AttnProblem& p, int bucket, int max_slices) {
  const long long tiles = bwd_key_tiles(p, bucket);
  return !p.deterministic || tiles <= 1 ? 1 : (int)(tiles < max_slices ? tiles : max_slices);
}

/// The BwdVecFlags of a problem (host side).
inline int bwd_vec_flags(const AttnProblem& p) {
  auto aligned = [](const Operand& o) {
    return (unsigned long long)o.ptr % 16 == 0 && o.row_stride % 8 == 0 && o.head_stride % 8 == 0 &&
           o.batch_stride % 8 == 0;
  };
  return (aligned(p.q) ? kBwdVecQ : 0) | (aligned(p.k) ? kBwdVecK : 0) | (aligned(p.v) ? kBwdVecV : 0) |
         (aligned(p.o) ? kBwdVecO : 0) | (aligned(p.dout) ? kBwdVecDo : 0) |
         (aligned(p.grad_q) ? kBwdVecDq : 0) | (aligned(p.grad_k) ? kBwdVecDk : 0) |
         (aligned(p.grad_v) ? kBwdVecDv : 0);
}

}  // namespace flashport::amd
