// Stages of the sm_80+ forward kernel (attn_fwd.cu): tile loads, QK^T, score transform, online
// softmax, dropout, PV and the epilogue. Compile-time shape from -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_N,
// FP_WARPS, FP_STAGES (see src/backends/cuda/tiles.hpp for the table that picks them). -D FP_FP8=1
// (with FP_DTYPE=bf16): the fp8 variant, whose tile loads dequantise fp8 rows to bf16 (fp8_decode.cuh).
#pragma once

#include "attn/fwd_stages.h"
#include "cuda/attn_fwd_params.cuh"
#include "cuda/common/common.cuh"

#ifndef FP_FP8
#define FP_FP8 0
#endif
#ifndef FP_DECODE
#define FP_DECODE 0
#endif
#ifndef FP_MIN_BLOCKS
#define FP_MIN_BLOCKS 1
#endif
#ifndef FP_BULK
#define FP_BULK 0
#endif
#if FP_FP8
#include "cuda/fp8_decode.cuh"
#endif
#ifndef FP_CLUSTER
#define FP_CLUSTER 0
#endif
#if FP_BULK || FP_CLUSTER
#include "cuda/hopper/sm90.cuh"
#endif

#if !defined(FP_DTYPE) || !defined(FP_HEADDIM) || !defined(FP_BLOCK_N) || !defined(FP_WARPS) || \
    !defined(FP_STAGES)
#error "attn_fwd needs -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_N, FP_WARPS, FP_STAGES"
#endif

namespace flashport::cuda::fwd {

using Elem = FP_DTYPE;
constexpr int kHeadDim = FP_HEADDIM;  // bucket: the real d and dv are <= kHeadDim, multiples of 8
constexpr int kWarps = FP_WARPS;
/// FP_DECODE=1: the decode variant. Every warp holds the same 16 block rows (a few queries, or the
/// packed GQA heads of one query) and takes its own key tiles (w, w + kWarps, ...) through its own
/// cp.async ring, so a block with one row fragment keeps all warps streaming K/V; the warps' partial
/// softmax states merge once at the end. Otherwise warp w owns rows [16w, 16w + 16) and all warps
/// share every key tile.
constexpr bool kDecode = FP_DECODE;
constexpr int kBlockM = kDecode ? 16 : 16 * kWarps;
constexpr int kKvRings = kDecode ? kWarps : 1;  // K/V buffer sets: one per warp, or one shared
constexpr int kBlockN = FP_BLOCK_N;
constexpr int kStages = FP_STAGES;  // 1: single K/V buffers, loads interleaved with compute (FA2)
constexpr int kThreads = 32 * kWarps;
constexpr int kMinBlocks = FP_MIN_BLOCKS;  // CTAs per SM the register cap leaves room for
/// FP_BULK=1 (decode, sm_90+): a ring tile's 16 K rows and 16 V rows are one cp.async.bulk each (lane r
/// copies K row r, lane 16 + r V row r) onto per-warp, per-stage mbarriers, where the 16-byte cp.async
/// copies took kChunks / 2 instructions per lane and operand; the shared layout (kPitch rows) is the same.
constexpr bool kBulk = FP_BULK;
/// FP_CLUSTER=1 (decode, sm_90+; FLASHPORT_DECODE_CLUSTER): the splits of one (sequence, kv head) are the
/// CTAs of one thread-block cluster along grid x (grid: splits, kv heads or heads, batch) and merge their
/// softmax states over distributed shared memory (cluster_finish in attn_fwd.cu), where split grids
/// otherwise write fp32 partials to global scratch for a split_combine launch.
constexpr bool kCluster = FP_CLUSTER;
constexpr int kPitch = kHeadDim + 8;   // smem row pitch in elements: the 16-byte pad puts the 8 rows of
                                       // every ldmatrix 8x8 matrix in distinct bank groups
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
constexpr int kNTiles = kBlockN / 8;   // n8 tiles of S per warp: S fragment is (16, kBlockN)
constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per warp: O fragment is (16, kHeadDim)
static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head-dim buckets are multiples of 32");
static_assert(kBlockN % 16 == 0 && kStages >= 1 && kWarps >= 1, "bad tile");
static_assert(!kDecode || kStages >= 2, "the decode variant's per-warp ring is double-buffered at least");
static_assert(!kBulk || (kDecode && kBlockN == 16), "bulk copies: one K and one V row per lane");
static_assert(!kCluster || kDecode, "the cluster merge is the decode variant's");
/// fp8 inputs (e4m3fn, e4m3fnuz or e5m2: p.in_type), dequantised to bf16 in load_tile (exact), so the
/// mma path is the bf16 one; the output goes out in p.out_type (bf16, f16 or f32). No dropout: the host
/// refuses fp8 with dropout, so the variant leaves the Philox code out.
constexpr bool kFp8 = FP_FP8;
static_assert(!kFp8 || Elem::kElemType == 3, "the fp8 variant runs the bf16 mma path");

#if FP_FP8
using TileDecode = Fp8Decode;  // the format's decode constants, from p.in_type
FP_DEV TileDecode tile_decode(const AttnProblem& p) {
  return fp8_decode(p.in_type);
}
#else
struct TileDecode {};  // 2-byte inputs are copied as they are
FP_DEV TileDecode tile_decode(const AttnProblem&) {
  return {};
}
#endif

// Shared memory (elements of 2 bytes): s_q (kBlockM, kPitch), then s_k and s_v, each kKvRings x kStages
// buffers of (kBlockN, kPitch); the bulk variant's mbarriers after them (8 bytes per warp, stage and
// operand). Total (kBlockM + 2 kKvRings kStages kBlockN) * kPitch * 2 bytes (+ the barriers); the host
// computes the same figure in tiles.hpp (fwd_smem_bytes) and passes it as the dynamic size.
constexpr int kSmemQ = kBlockM * kPitch;
constexpr int kSmemKV = kBlockN * kPitch;
constexpr int kSmemBars = kBulk ? 8 * 2 * kWarps * kStages : 0;
constexpr int kSmemBytes = (kSmemQ + 2 * kKvRings * kStages * kSmemKV) * 2 + kSmemBars;

/// Copies rows [0, kRows) of a (rows, kHeadDim) tile into s_tile (pitch kPitch). `row_offset(r)` is
/// the element offset of row r in `g_base`, negative for rows to zero-fill; columns >= ncols are
/// zero-filled. `vec`: rows are 16-byte aligned (cp.async); else synchronous 2-byte loads. The fp8
/// variant: rows of 1-byte codes (offsets are in elements, so in bytes), 8-byte loads when `vec` (the
/// host's 16-byte base and 8-element strides make every 8-code chunk 8-byte aligned) else byte loads,
/// decoded with `dec` and stored synchronously (cp.async cannot convert).
/// `kLoaders` threads share the copy, `loader` (0 .. kLoaders - 1) being this one: the whole CTA, or one
/// warp's lanes for the decode variant's per-warp rings.
template <int kRows, int kLoaders = kThreads, class RowOffset>
FP_DEV void load_tile(u16* s_tile, const void* g_base, i64 ncols, bool vec, RowOffset row_offset,
                      const TileDecode& dec, int loader = (int)threadIdx.x) {
  constexpr int kTotal = kRows * kChunks;
  const u16* g = static_cast<const u16*>(g_base);
  // Rolled on purpose: unrolled, ptxas hoists every chunk's row/column/predicate out of the tile loop
  // and keeps them live next to the accumulators (spills at d >= 224).
#pragma unroll 1
  for (int it = 0; it < (kTotal + kLoaders - 1) / kLoaders; ++it) {
    const int c = it * kLoaders + loader;
    if (kTotal % kLoaders != 0 && c >= kTotal) break;
    const int r = c / kChunks, ch = c % kChunks;
    // row_offset is called by every loader thread alike (the decode rings' shuffles it in need them all).
    const i64 off = row_offset(r);
    const bool pred = off >= 0 && ch * 8 < ncols;
#if FP_FP8
    U32x4 v{0, 0, 0, 0};
    if (pred) {
      const u8* src = static_cast<const u8*>(g_base) + off + ch * 8;
      u32 lo, hi;
      if (vec) {
        const u64 w = *reinterpret_cast<const u64*>(src);
        lo = (u32)w, hi = (u32)(w >> 32);
      } else {
        lo = (u32)src[0] | (u32)src[1] << 8 | (u32)src[2] << 16 | (u32)src[3] << 24;
        hi = (u32)src[4] | (u32)src[5] << 8 | (u32)src[6] << 16 | (u32)src[7] << 24;
      }
      v.x = fp8x2_to_bf16x2(lo, dec), v.y = fp8x2_to_bf16x2(lo >> 16, dec);
      v.z = fp8x2_to_bf16x2(hi, dec), v.w = fp8x2_to_bf16x2(hi >> 16, dec);
    }
    st_shared_16(smem_addr(s_tile + r * kPitch + ch * 8), v);
    (void)g;
#else
    const u16* src = pred ? g + off + ch * 8 : g;
    u16* dst = s_tile + r * kPitch + ch * 8;
    if (vec) {
      cp_async_16(smem_addr(dst), src, pred);
    } else {
      U32x4 v{0, 0, 0, 0};
      if (pred) {
        v.x = (u32)src[0] | (u32)src[1] << 16, v.y = (u32)src[2] | (u32)src[3] << 16;
        v.z = (u32)src[4] | (u32)src[5] << 16, v.w = (u32)src[6] | (u32)src[7] << 16;
      }
      st_shared_16(smem_addr(dst), v);
    }
#endif
  }
}

/// The decode rings' copy of a tile whose rows are affine in the key index (a dense cache, or pages that
/// hold whole tiles): row r at g + off0 + r * row_stride; rows >= n_rows, columns >= ncols and the whole
/// tile when off0 < 0 (a cache row or page outside the pool) are zero-filled. One warp copies (`lane`),
/// unrolled: per 16-byte copy an address bump and a compare, where load_tile's generic loop spent about
/// 36 instructions (a shuffled row offset, 64-bit bounds checks, parameter loads), which made the decode
/// kernel issue-bound (ncu at b 8 x 32k: 968 instructions per 16-key tile, 576 of them in the copies).
template <int kRows>
FP_DEV void load_tile_affine(u16* s_tile, const u16* g, i64 off0, i64 row_stride, int n_rows, int ncols,
                             int lane) {
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % 32 == 0, "whole warp passes over the tile");
  if (off0 < 0) n_rows = 0;
#pragma unroll
  for (int it = 0; it < kTotal / 32; ++it) {
    const int c = it * 32 + lane, r = c / kChunks, ch = c % kChunks;
    const bool pred = r < n_rows && ch * 8 < ncols;
    cp_async_16(smem_addr(s_tile + r * kPitch + ch * 8), pred ? g + off0 + r * row_stride + ch * 8 : g, pred);
  }
}

/// S = Q K^T for this warp's 16 rows: acc_s (16, kBlockN) in the mma C layout. `q_lane`/`k_lane` are
/// this lane's ldmatrix row addresses (see attn_fwd.cu); k-steps wholly beyond `d` are skipped
/// (zero-filled columns add nothing).
FP_DEV void compute_qk(float (&acc_s)[kNTiles][4], u32 q_lane, u32 k_lane, i64 d) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc_s[nt][0] = acc_s[nt][1] = acc_s[nt][2] = acc_s[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    if (kk * 16 >= d) break;
    u32 a[4];
    ldmatrix_x4(a, q_lane + kk * 32);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      u32 bk[4];
      ldmatrix_x4(bk, k_lane + (np * 16 * kPitch + kk * 16) * 2);
      const u32 b0[2] = {bk[0], bk[1]}, b1[2] = {bk[2], bk[3]};
      mma<Elem>(acc_s[2 * np], a, b0);
      mma<Elem>(acc_s[2 * np + 1], a, b1);
    }
  }
}

/// O += P V for this warp's 16 rows; P (acc_s, already exponentiated) is rounded to Elem in registers
/// and reused as the A operand (the C layout of two n8 tiles is the A layout of one k16 step).
FP_DEV void compute_pv(float (&acc_o)[kDTiles][4], const float (&acc_s)[kNTiles][4], u32 v_lane, i64 dv) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const u32 a[4] = {Elem::pack(acc_s[2 * kk][0], acc_s[2 * kk][1]),
                      Elem::pack(acc_s[2 * kk][2], acc_s[2 * kk][3]),
                      Elem::pack(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]),
                      Elem::pack(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kHeadDim / 16; ++dp) {
      if (dp * 16 >= dv) break;
      u32 bv[4];
      ldmatrix_x4_trans(bv, v_lane + (kk * 16 * kPitch + dp * 16) * 2);
      const u32 b0[2] = {bv[0], bv[1]}, b1[2] = {bv[2], bv[3]};
      mma<Elem>(acc_o[2 * dp], a, b0);
      mma<Elem>(acc_o[2 * dp + 1], a, b1);
    }
  }
}

/// The score layout of this kernel for the shared stages (attn/fwd_stages.h): mma.sync's C layout, in
/// which lane (g, t4) holds rows g and g + 8 of the warp's 16; element e of n-tile nt is row e / 2, key
/// nt * 8 + 2 t4 + e % 2 (S), channel dt * 8 + 2 t4 + e % 2 (O). A row's four lanes are a quad.
struct Rows {
  static constexpr int kRows = 2;
  template <class F>
  static FP_DEV void map_s(float (&s)[kNTiles][4], F&& f) {
    const int t4 = lane_id() & 3;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = f(e >> 1, nt * 8 + 2 * t4 + (e & 1), s[nt][e]);
  }
  template <class F>
  static FP_DEV void map_o(float (&o)[kDTiles][4], F&& f) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = f(e >> 1, o[dt][e]);
  }
  static FP_DEV float row_max(float v) {
    return quad_max(v);
  }
  static FP_DEV float row_sum(float v) {
    return quad_sum(v);
  }
  static FP_DEV float exp2(float x) {
    return fast_exp2(x);
  }
  static FP_DEV float log2(float x) {
    return log2f(x);
  }
  static FP_DEV bool all_lanes(bool v) {
    return warp_all(v);
  }
};
using ScoreCtx = attn::ScoreRows<Rows::kRows>;

/// Zeroes dropped probabilities (after they entered the row sum: the LSE is taken before dropout).
/// One Philox call per (row, key pair): keys j, j+1 (j even) share the words of j / 4. The Philox
/// loop stays rolled (its state would otherwise be replicated kNTiles times in registers); the keep
/// bits go through a 64-bit mask, bit 4 nt + e for element e of n-tile nt.
FP_DEV void apply_dropout(float (&acc_s)[kNTiles][4], const AttnProblem& p, const ScoreCtx& c, i64 j0,
                          i64 b) {
  static_assert(kNTiles * 4 <= 64, "keep mask holds 64 elements");
  const int t4 = lane_id() & 3;
  u64 keep = 0;
#pragma unroll 1
  for (int nt = 0; nt < kNTiles; ++nt) {
    const i64 j = j0 + nt * 8 + 2 * t4;  // even: j0 is a multiple of kBlockN
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const sem::Philox4 w = sem::dropout_words(p.seed, p.offset, c.row[r], j, b, p.hq, c.head[r]);
      const u32 w0 = (j & 2) ? w.x[2] : w.x[0], w1 = (j & 2) ? w.x[3] : w.x[1];  // words j % 4, (j+1) % 4
      const u64 bits = (u64)(w0 >= p.dropout_threshold) | (u64)(w1 >= p.dropout_threshold) << 1;
      keep |= bits << (4 * nt + 2 * r);
    }
  }
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!((keep >> (4 * nt + e)) & 1)) acc_s[nt][e] = 0.0f;
}

}  // namespace flashport::cuda::fwd
