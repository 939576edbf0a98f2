// Declarations shared by the CPU fast path's dispatcher (fast_dispatch.cpp) and its per-ISA kernels.
// Everything here is compiled for the baseline target; the per-ISA translation units include this
// header before their target pragma so no inline function below is ever built with a wider ISA.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "backends/cpu/elem.hpp"
#include "core/numeric.h"
#include "core/problem.h"

namespace flashport::cpu::fast {

/// Query rows per tile. A multiple of every ISA's vector width (16 floats for AVX-512) and of the
/// micro-kernel rows, so a tile's score columns are whole vectors.
inline constexpr int kBlockQ = 64;
/// Keys per tile. 64 keys x 128 channels of fp32 K and V (64 KiB) stay in the 2 MiB L2 while the
/// query tile streams over them.
inline constexpr int kBlockK = 64;
/// Widest vector (floats) any ISA uses: buffers are padded and aligned to it.
inline constexpr int kMaxVec = 16;
/// Widest GEMM micro-tile (floats) any ISA uses: the forward's V panels are padded to it.
inline constexpr int kMaxPanel = 64;

inline constexpr long long pad_to(long long n, long long m) {
  return (n + m - 1) / m * m;
}

/// A forward work item: query rows [i0, i0 + kBlockQ) of head h of sequence b.
struct QueryBlock {
  long long b, h, i0;
};

/// Decode (fast_decode.hpp): calls with at most kDecodeMaxQueries queries per sequence and no dropout
/// run one item per (sequence, kv head, rows chunk, key split) instead of 64-row query tiles of one head.
/// An item's rows are the query positions x the GQA group's query heads of its kv head, at most
/// kDecodeRows of them (a score tile's width, as wide as a query tile); it reads keys in panels of
/// kDecodeKeys rows, each widened to fp32 once for all its rows.
inline constexpr long long kDecodeMaxQueries = 16;
inline constexpr int kDecodeRows = kBlockQ;
inline constexpr int kDecodeKeys = kBlockK;

/// A decode work item: rows [row0, row0 + rows) of kv heads [hk, hk + heads) of sequence b (row r:
/// query position r / group of query head group_head(hk, group, r % group)) over keys [j0, j1), their
/// visible span or one split of it. `partial` null: the item writes O and LSE. Else the split's state
/// per head, merged later: the normalised O rows (rows x dv) then the rows' LSEs (natural log), rows *
/// (dv + 1) floats a head. Several heads go through each panel of keys head by head, so a dense
/// cache's rows (all kv heads of a token) are read in memory order.
struct DecodeBlock {
  long long b, hk, heads, row0, rows, j0, j1;
  float* partial;
};

/// Kv heads per decode item: items of at most kDecodeHeadRows rows take up to kDecodeMaxHeads
/// heads, the others one.
inline constexpr long long kDecodeHeadRows = 8;
inline constexpr long long kDecodeMaxHeads = 8;
/// Keys per panel of a several-head item: 16 keys of 8 heads of d = 128 are 32 KiB of bf16 K rows
/// (64 KiB fp32), read in one sweep; 64-key panels (128-256 KiB) measured 1.2-1.5x slower.
inline constexpr int kDecodeHeadKeys = 16;
inline long long decode_heads(long long rows, long long hk) {
  return rows <= kDecodeHeadRows ? std::min(hk, kDecodeMaxHeads) : 1;
}

/// A backward work item: keys [j0, j0 + kBlockK) of kv head hk of sequence b. It owns those rows of
/// dK/dV and adds its dQ contributions into the calling thread's fp32 dQ accumulator. Its (sequence,
/// kv head)'s packed query tiles start `tiles` floats into BackwardShared::tiles.
struct KeyBlock {
  long long b, hk, j0, tiles;
};

/// Layout of one packed backward query tile (kBlockQ rows of one head), offsets in floats: Q rows,
/// q_scale * Q^T, dO rows, dO^T, the LSE in log2 units (+inf for rows that saw no key, so P = 0)
/// and D = rowsum(dO * O). Row widths are padded to kMaxVec (zeros), so every ISA reads whole vectors.
struct QueryTileLayout {
  long long q_ld, do_ld;                              // row strides of q_rows / do_rows
  long long q_rows, q_t, do_rows, do_t, lse2, delta;  // (kBlockQ, q_ld) (d, kBlockQ) ... (kBlockQ,)
  long long floats;                                   // size of one tile
};
inline QueryTileLayout query_tile_layout(long long d, long long dv) {
  QueryTileLayout t{};
  t.q_ld = pad_to(d, kMaxVec);
  t.do_ld = pad_to(dv, kMaxVec);
  t.q_rows = 0;
  t.q_t = t.q_rows + kBlockQ * t.q_ld;
  t.do_rows = t.q_t + t.q_ld * kBlockQ;
  t.do_t = t.do_rows + kBlockQ * t.do_ld;
  t.lse2 = t.do_t + t.do_ld * kBlockQ;
  t.delta = t.lse2 + kBlockQ;
  t.floats = t.delta + kBlockQ;
  return t;
}

/// Per-call data the backward items share.
struct BackwardShared {
  const float* tiles;  // packed query tiles: [(sequence, kv head) group][head in group][tile]
  long long rows;      // flattened query rows (see query_row)
  long long dq_ld;     // dQ accumulator: fp32 at [(h * rows + row) * dq_ld + c]
};

/// Row of (sequence b, query i) in the flattened query index space: cu_seqlens_q[b] + i for varlen,
/// b * sq + i for dense. Indexes D and the dQ accumulators.
inline long long query_row(const AttnProblem& p, long long b, long long i) {
  return p.cu_seqlens_q ? (long long)p.cu_seqlens_q[b] + i : b * p.sq + i;
}

/// The score transform of one (sequence, head) in the log2 domain the kernels work in:
/// t = log2(e) * score. Q is pre-multiplied by `q_scale`, so the raw dot product x = q_scale * q.k.
struct ScoreParams {
  float q_scale;     // scale * log2(e) when no transform; scale / softcap with softcap
  float cap_log2;    // softcap * log2(e); 0 when off: t = cap_log2 * tanh(x)
  float slope_log2;  // ALiBi slope * log2(e); bias -slope_log2 * |diag - j|
  bool transform;    // softcap or ALiBi present: run the transform stage
};

inline ScoreParams score_params(const AttnProblem& p, long long b, long long h) {
  ScoreParams s{};
  const bool cap = p.softcap > 0.0f;
  s.q_scale = cap ? p.scale / p.softcap : p.scale * sem::kLog2e;
  s.cap_log2 = cap ? p.softcap * sem::kLog2e : 0.0f;
  s.slope_log2 = alibi_slope(p, b, h) * sem::kLog2e;
  s.transform = cap || p.alibi;
  return s;
}

/// Floats of scratch one thread needs for either kernel (a generous bound shared by every ISA).
inline long long scratch_floats(long long d, long long dv) {
  const long long dp = pad_to(d, kMaxVec), dvp = pad_to(dv, kMaxVec);
  const long long q = kBlockQ, k = kBlockK;
  const long long fwd = 2 * dp * q + k * dp + k * pad_to(dv, kMaxPanel) + k * q + q * dvp;
  const long long bwd = 2 * k * dp + 2 * k * dvp + 4 * k * q;
  const long long d32 = pad_to(d, 32), dv32 = pad_to(dv, 32);  // the AMX bf16 forward (fast_amx.hpp)
  const long long amx = d32 * q + 2 * k * q + 2 * k * q + dv32 * q + 2 * k * d32 + 2 * dv32 * k + dv32;
  // Decode items of several heads (<= 8 rows, score columns <= kMaxVec): per head Q, O and 8 row
  // arrays; shared panels.
  const long long head = kMaxVec * dp + kDecodeHeadRows * dvp + 8 * kMaxVec;
  const long long dec = kDecodeMaxHeads * head + k * dp + k * dvp + k * kMaxVec + dp + dvp;
  return std::max({fwd, bwd, amx, dec}) + 16 * q + 32 * kMaxVec;
}

/// Largest shared K/V pack the forward allocates; longer sequences pack per tile instead.
inline constexpr long long kMaxPackedBytes = 256LL << 20;
/// Groups (sequence, kv head) whose packed K/V fit kGroupInCacheBytes (a core's L2 on the Xeon measured;
/// 1 MiB measured 1-4% slower there at d 128, s 2048) and number at least kGroupsPerThread per thread
/// (so whole groups balance) are run one group per thread at a time, packed into that thread's buffer
/// (fast_dispatch.cpp).
inline constexpr long long kGroupInCacheBytes = 2LL << 20;
inline constexpr long long kGroupsPerThread = 4;

/// One ISA's kernels. `scratch` holds scratch_floats() floats, aligned to 64 bytes.
///
/// The forward packs the K/V of each (sequence, kv head) once into a "group" region that every query
/// tile of that group reads; the layout is the kernel's own (fp32 K rows and V column panels, or bf16
/// tiles for AMX).
struct Kernels {
  const char* isa;
  /// Floats a group of sk keys takes packed.
  long long (*packed_floats)(const AttnProblem& p, long long sk);
  /// Packs keys [j0, j1) of kv head hk of sequence b (a group of sk keys) into its region `group`.
  void (*pack_kv)(const AttnProblem& p, long long b, long long hk, long long j0, long long j1, long long sk,
                  float* group);
  /// Query tile `blk`; `group` is its (b, kv head)'s packed region, or null to pack tile by tile.
  void (*forward_block)(const AttnProblem& p, const QueryBlock& blk, const float* group, float* scratch);
  /// Decode item `blk` (fast_decode.hpp).
  void (*decode_block)(const AttnProblem& p, const DecodeBlock& blk, float* scratch);
  /// Packs query rows [i0, i0 + kBlockQ) of head h of sequence b (QueryTileLayout) into `dst`.
  void (*pack_query_tile)(const AttnProblem& p, long long b, long long h, long long i0, float* dst);
  /// Key block `blk`: writes its dK/dV rows, adds dQ into `dq_acc` (BackwardShared::dq_ld layout).
  void (*backward_block)(const AttnProblem& p, const BackwardShared& shared, const KeyBlock& blk,
                         float* scratch, float* dq_acc);
};

/// The kernel tables; null when the ISA was not compiled into this build (non-x86 hosts).
/// kernels_amx() is the AVX-512 table with an AMX-BF16 forward, for bf16 inputs.
const Kernels* kernels_amx();
const Kernels* kernels_avx512();
const Kernels* kernels_avx2();
const Kernels& kernels_base();

}  // namespace flashport::cpu::fast
