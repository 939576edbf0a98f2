// The Hopper forward's compile-time shape, its per-CTA work (query block, head, sequence, key-tile
// range), the score transform and mask, and the online softmax on wgmma accumulator fragments.
#pragma once

#include "core/problem.h"
#include "cuda/common/common.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/hopper/fwd_sm90_config.h"

#if !defined(FP_DTYPE) || !defined(FP_HEADDIM) || !defined(FP_BLOCK_M) || !defined(FP_BLOCK_N) || \
    !defined(FP_STAGES)
#error "attn_fwd_sm90 needs -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_BLOCK_N, FP_STAGES"
#endif

namespace flashport::cuda::hopper {

#ifndef FP_FP8
#define FP_FP8 0
#endif
/// FP_FP8=1: e4m3 Q, K, V (FP_DTYPE=e4m3) with fp32 descales per (sequence, kv head), output in
/// FP_OUT_DTYPE (bf16 / f16). wgmma reads fp8 operands K-major only: V arrives transposed (V^T, keys
/// contiguous, written by the launcher's fp8_v_transpose pass), and P enters P V as e4m3 registers.
constexpr bool kFp8 = FP_FP8 != 0;
#ifndef FP_OUT_DTYPE
#define FP_OUT_DTYPE FP_DTYPE
#endif
using Elem = FP_DTYPE;
using OutElem = FP_OUT_DTYPE;  // the output's element type (Elem except in the FP8 kernel)
constexpr int kElemBytes = kFp8 ? 1 : 2;
constexpr int kHeadDim = FP_HEADDIM;  // d == dv, one of 64, 96, 128, 192, 256 (FP8: 128, 256)
constexpr int kBlockN = FP_BLOCK_N;   // keys per tile (the N of S = Q K^T)
constexpr int kStages = FP_STAGES;    // K/V ring depth
constexpr int kChunks = head_dim_chunks(kHeadDim, kElemBytes);    // 128-byte chunks of a Q or K row
constexpr int kRowBytes = chunk_row_bytes(kHeadDim, kElemBytes);  // Q / K chunk row: 128, or 64 (fp8 d 64)
constexpr int kChunkCols = kRowBytes / kElemBytes;                // elements per chunk row
// Columns of the O accumulator = N of the P V wgmma: whole 64-column chunks. At d = 96 the second V
// chunk's columns 96..127 are TMA zero fill, so O gains 32 zero columns that are never stored;
// this keeps the MN-major (transposed) B operand made of whole 128B-swizzle atoms (64 columns).
// FP8: V^T's rows are the head dim, so N = d.
constexpr int kPvN = kFp8 ? kHeadDim : kChunks * 64;
constexpr int kKVChunkBytes = kBlockN * kRowBytes;     // one chunk of a K tile (and of V, 16-bit)
constexpr int kKVTileBytes = kChunks * kKVChunkBytes;  // TMA bytes of a K tile (OOB fill included)
// V in shared memory: 16-bit, like K (block_n rows of the head dim's chunks); FP8, V^T: kHeadDim rows
// of block_n keys, in chunks of 128 keys.
constexpr int kVChunks = kFp8 ? head_dim_chunks(kBlockN, 1) : kChunks;
constexpr int kVRows = kFp8 ? kHeadDim : kBlockN;
constexpr int kVChunkBytes = kVRows * kChunkRowBytes;
constexpr int kVTileBytes = kVChunks * kVChunkBytes;
// Registers of P as the A operand of P V: two 16-bit or four e4m3 probabilities each.
constexpr int kPRegs = kFp8 ? kBlockN / 8 : kBlockN / 4;
// FP8 key tiles are one 128-key V^T box: 128 x 256 at d 64 compiled but failed the GPU suite's accuracy
// checks (H100, 2026-12-06; P V over two V^T chunks is not right) and ran 5-12% slower.
static_assert(!kFp8 || ((kHeadDim == 64 || kHeadDim % 128 == 0) && kBlockN == 128),
              "the FP8 kernel takes d 64 or a multiple of 128 (whole 64- or 128-byte rows), 128-key tiles");
constexpr int kTileM = FP_BLOCK_M;                 // query rows per CTA, 64 per consumer warpgroup
constexpr int kConsumers = consumers_for(kTileM);  // consumer warpgroups
constexpr int kCtaThreads = threads_for(kTileM);   // the producer warpgroup and the consumers
static_assert(block_m_fits(kHeadDim, Tile{kTileM, kBlockN, kStages}),
              "BLOCK_M 128 (two consumer warpgroups), or 192 (three) at d <= 64 with BLOCK_N <= 128");
static_assert(kHeadDim % 16 == 0 && kHeadDim >= 16 && kPvN <= 256, "wgmma K steps of 16, N = kPvN <= 256");
static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256, "wgmma N = BLOCK_N, K steps of 16");
static_assert(kStages >= 2, "the intra-warpgroup overlap holds K(n) and V(n+1) at once");

#ifndef FP_EXP_EMU
#define FP_EXP_EMU 0
#endif
/// Of every 8 column blocks (8 score columns each) of a tile, how many take exp2 on the FMA pipe
/// (exp2_fma) instead of the SFU (MUFU.EX2, 16 per clock per SM: at d = 64 the exponentials take as
/// long as the two GEMMs, so moving a share of them to the idle FMA pipe shortens the softmax).
constexpr int kExpEmu = FP_EXP_EMU;
static_assert(kExpEmu >= 0 && kExpEmu <= 8, "FP_EXP_EMU counts eighths of the columns");

/// Exponent growth allowed before O is rescaled: P = exp2(score * to_log2 - m) with the running
/// maximum m updated only when a row's new maximum exceeds it by more than this, so P <= 2^8 = 256
/// (exact in bf16/f16 up to their usual relative rounding), row sums <= 256 * sk and |O| <= 256 * sk *
/// max|V| stay far inside fp32, and O/l and the LSE are unchanged (both carry the same stale m).
/// FP8: P is rounded to e4m3 (3 mantissa bits, subnormal below 2^-6) for P V, so probabilities are
/// taken relative to 2^kPHeadroom times the running maximum (up to 256, e4m3's maximum is 448) and
/// the maximum is kept exact (slack 0): a row's small probabilities then keep e4m3's normal range
/// down to 2^-14 of the largest instead of 2^-6. The row sums and the LSE carry the same factor.
constexpr float kPHeadroom = kFp8 ? 8.0f : 0.0f;
constexpr float kRescaleSlack = kFp8 ? 0.0f : 8.0f;

#ifndef FP_FWD_TRANSFORM
#define FP_FWD_TRANSFORM 0
#endif
/// The score transform compiled in (the host picks it per call): 0 none (softcap and ALiBi off), 1 ALiBi,
/// 2 softcap, with ALiBi when slopes are given (a slope of 0 otherwise), 3 dropout (without softcap and
/// ALiBi: the plain scores, then drop_probs). ALiBi costs one add and one multiply per score, softcap two
/// more SFU operations, dropout one Philox call per 4 probabilities; the plain kernel carries none of it.
constexpr int kTransform = FP_FWD_TRANSFORM;
constexpr bool kAlibi = kTransform == 1 || kTransform == 2;
constexpr bool kSoftcap = kTransform == 2;
constexpr bool kDropout = kTransform == 3;
static_assert(kTransform >= 0 && kTransform <= 3, "FP_FWD_TRANSFORM is 0, 1, 2 or 3");
static_assert(!kFp8 || !kDropout, "the FP8 kernel has no dropout (the portable one has)");

/// Factor from the scores prepare_scores leaves to the log2 domain of the softmax.
FP_DEV float scores_to_log2(const AttnProblem& p) {
  return kAlibi ? 1.0f : p.scale * sem::kLog2e;
}

// ---------------------------------------------------------------------------------------------
// Work of one CTA.

struct Block {
  int b, h, hk;                        // sequence, query head, kv head
  int m0;                              // first query row of the block (within the sequence)
  int sq, sk;                          // this sequence's lengths (< 2^31: the host checks the bounds)
  int n_min, n_max;                    // key tiles [n_min, n_max) intersect some row's visible keys
  int q_row, q_batch, k_row, k_batch;  // TMA coordinates of query row m0 and of key 0 (dense / varlen)
};

/// Fills `blk` for query block `mb` of head h of sequence b. False when the block lies past its
/// sequence's end. Lengths from device memory go through problem.h's guarded_lengths (a sequence whose
/// indices would address outside q/o/lse or k/v is empty: O and LSE rows are stored directly, so a
/// negative or past-the-end cu_seqlens_q must never become a row) and the host's bound p.sq.
/// kCacheIndex: cache_leftpad and cache_batch_idx are read (one CTA per block: the host keeps kv-cache
/// calls with them off the persistent grid, whose d 256 build spilled 40 bytes with them).
template <bool kCacheIndex>
FP_DEV bool make_block(const AttnProblem& p, Block& blk, int mb, int h, int b) {
  blk.b = b;
  blk.h = h;
  blk.m0 = mb * kTileM;
  const SeqLens lens = guarded_lengths(p, blk.b);
  blk.sq = (int)clamp_i64(lens.q, 0, p.sq);
  blk.sk = (int)lens.k;  // within [0, p.sk]
  if (blk.m0 >= blk.sq) return false;
  blk.hk = (int)kv_head(p, blk.h);
  blk.q_row = (p.cu_seqlens_q ? p.cu_seqlens_q[blk.b] : 0) + blk.m0;
  blk.q_batch = p.cu_seqlens_q ? 0 : blk.b;
  // Key 0 is token leftpad_k[b] of the sequence's rows (kv cache; a pad guarded_lengths found invalid left
  // no keys, so none is loaded), in the cache row cache_batch_idx picks (dense caches, as k_offset: an index
  // outside the rows reads TMA's zero fill, where k_offset's -1 reads zeros). Paged caches address keys
  // through the block table instead (load_kv_tile; the host keeps left pads off them).
  const bool pad = kCacheIndex && p.leftpad_k && blk.sk > 0;
  blk.k_row = (p.cu_seqlens_k ? p.cu_seqlens_k[blk.b] : 0) + (pad ? p.leftpad_k[blk.b] : 0);
  blk.k_batch = p.cu_seqlens_k ? 0 : kCacheIndex && p.kv_batch_idx ? p.kv_batch_idx[blk.b] : blk.b;
  // Key tiles that hold a key some row of the block sees (empty: n_max <= n_min).
  const int m1 = blk.m0 + kTileM < blk.sq ? blk.m0 + kTileM : blk.sq;
  const sem::KeyRange keys = sem::tile_keys(blk.m0, m1, blk.sq, blk.sk, p.window_left, p.window_right);
  if (keys.hi <= keys.lo) {
    blk.n_min = blk.n_max = 0;
  } else {
    const sem::Tiles<i64> tiles = sem::covering_tiles<i64>(keys.lo, keys.hi, kBlockN);
    blk.n_min = (int)tiles.begin;
    blk.n_max = (int)tiles.end;
  }
  return true;
}

/// Query row (within the sequence) of a consumer thread's half h: rows g and g + 8 of its warp's 16.
/// Recomputed where needed rather than kept live across the main loop (registers are short at d = 256).
FP_DEV int thread_row(const Block& blk, int h) {
  const int tid = (int)threadIdx.x - 128;  // consumer threads from 0: warpgroup c owns rows 64c..64c+63
  return blk.m0 + 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2) + 8 * h;
}

/// The visible keys [lo, hi) of a consumer thread's two rows (32-bit: every register counts).
struct ThreadRows {
  int lo[2], hi[2];
};

FP_DEV ThreadRows thread_rows(const AttnProblem& p, const Block& blk) {
  ThreadRows r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const sem::KeyRange keys =
        sem::visible_keys(thread_row(blk, h), blk.sq, blk.sk, p.window_left, p.window_right);
    r.lo[h] = (int)keys.lo;
    r.hi[h] = (int)keys.hi;
  }
  return r;
}

/// A key tile [j0, j0 + BLOCK_N) needs no mask for consumer c's 64 rows iff lo_max <= j0 and
/// j0 + BLOCK_N <= hi_min: it lies inside the keys all of them see (sem::keys_seen_by_all), held in
/// 32 bits here.
struct MaskBounds {
  int lo_max, hi_min;
};

FP_DEV MaskBounds mask_bounds(const AttnProblem& p, const Block& blk) {
  const int first = blk.m0 + 64 * (((int)threadIdx.x - 128) >> 7), last = first + 63;
  const sem::KeyRange all =
      sem::keys_seen_by_all(first, last + 1, blk.sq, blk.sk, p.window_left, p.window_right);
  return {(int)all.lo, (int)all.hi};
}

// ---------------------------------------------------------------------------------------------
// Scores. Fragment element e = 4j + 2h + x is row thread_row(h), column 8j + 2 (lane % 4) + x of the tile.

/// SPEC steps 1-4 on the raw dots of key tile n. Plain kernels leave the dots as they are (the caller
/// converts with scale * log2 e); transform kernels (kTransform) turn them into log2-domain scores
/// (the caller converts with 1): softcap as cap tanh(scale s / cap) with fast_tanh (the Hopper backward
/// recomputes P with the same instruction, so the LSE it reads matches), ALiBi as -slope |i + sk - sq - j|
/// with the distance in fp32 from one base per row (exact below 2^24 tokens); `slope2` is the slope times
/// log2 e, loaded once per block by the caller. FP8: the dots are of the quantised values, so `qk_descale`
/// (q's descale times k's, SPEC "FP8") joins the scale before the transform. Then -inf outside each row's
/// visible keys when the tile is not entirely visible. Row ranges are recomputed per tile (a few integer
/// operations) rather than held across the loop.
FP_DEV void prepare_scores(float (&r_s)[kBlockN / 2], const AttnProblem& p, const Block& blk, int n,
                           float slope2, float qk_descale) {
  const int j0 = n * kBlockN, col0 = 2 * (threadIdx.x & 3);
  if constexpr (kAlibi) {
    float cap2 = kSoftcap ? p.softcap * sem::kLog2e : 0.0f;
    float arg_scale = kSoftcap ? p.scale / p.softcap : p.scale * sem::kLog2e;
    if constexpr (kFp8) arg_scale *= qk_descale;
    // Computed per tile rather than hoisted out of the key loop and kept live beside O, S and P. Added
    // while chasing spills at d 128 persistent and d 256, which turned out to come from the slope's
    // per-tile load (now the caller's, once per block); not re-measured without it.
    asm volatile("" : "+f"(cap2), "+f"(arg_scale));
    float diag[2];  // i + sk - sq - (j0 + col0) per row: the distance base of element column 0
#pragma unroll
    for (int h = 0; h < 2; ++h) diag[h] = (float)(thread_row(blk, h) + blk.sk - blk.sq - j0 - col0);
#pragma unroll
    for (int e = 0; e < kBlockN / 2; ++e) {
      float v = r_s[e] * arg_scale;
      if constexpr (kSoftcap) v = cap2 * fast_tanh(v);
      if constexpr (kAlibi) v -= slope2 * fabsf(diag[(e >> 1) & 1] - (float)(8 * (e / 4) + (e & 1)));
      r_s[e] = v;
    }
  }
  const MaskBounds bounds = mask_bounds(p, blk);
  if (bounds.lo_max <= j0 && j0 + kBlockN <= bounds.hi_min) return;
  const ThreadRows rows = thread_rows(p, blk);
  int lo[2], hi[2];  // visible columns [lo, hi) of the tile per row, shifted by this thread's column
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lo[h] = rows.lo[h] - j0 - col0;
    hi[h] = rows.hi[h] - j0 - col0;
  }
#pragma unroll
  for (int e = 0; e < kBlockN / 2; ++e) {
    const int col = 8 * (e / 4) + (e & 1), h = (e >> 1) & 1;
    if (col < lo[h] || col >= hi[h]) r_s[e] = sem::kNegInf;
  }
}

/// SPEC step 6 on key tile n's probabilities (after online_softmax summed them: the LSE and the row sums
/// are taken before dropout): dropped ones become 0, kept ones stay unscaled (store_output applies
/// 1 / (1 - p) with the normalisation). Each warp's 16 rows x 8 keys per j are an m16n8 C tile, so the
/// portable backward's dropout_keep4 draws them: one Philox call per 4 elements, in SPEC's counters
/// (query row within the sequence, key within the sequence, sequence, query head).
FP_DEV void drop_probs(float (&r_s)[kBlockN / 2], const AttnProblem& p, const Block& blk, int n) {
  const int lane = (int)threadIdx.x & 31;
  int row0 = thread_row(blk, 0), key0 = n * kBlockN + 2 * (lane & 3);
  // All keep bits first (4 per 8 keys), one call after the other: ptxas interleaved the calls with each
  // other and with the stores of P and spilled.
  u32 keep[(kBlockN / 8 + 7) / 8] = {};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    asm volatile("" : "+r"(row0), "+r"(key0) : "r"(keep[j / 8]));
    keep[j / 8] |= dropout_keep4(p, blk.b, blk.h, row0, key0 + 8 * j, lane) << (4 * (j % 8));
  }
  sm90::pin_registers(keep);
#pragma unroll
  for (int e = 0; e < kBlockN / 2; ++e)
    if (!((keep[e / 32] >> (e % 32)) & 1u)) r_s[e] = 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Online softmax (log2 domain).

/// Per thread: running maximum m (of score * to_log2; -inf before any visible key) and this
/// thread's partial sum l of its rows (the 4 threads of a quad share a row; summed at the end).
struct RowState {
  float m[2], l[2];
};

FP_DEV RowState row_state_init() {
  return {{sem::kNegInf, sem::kNegInf}, {0.0f, 0.0f}};
}

/// 2^x with FMA-pipe instructions only: x = j + f with j = round(x) (the 1.5 * 2^23 shifter leaves j
/// in the low mantissa bits of t), 2^f for f in [-0.5, 0.5] by a quartic (relative error 2.9e-6,
/// mean 3e-7: a cubic's 1e-4 would show in the LSE, which the tests hold to ~1e-5), then j added to
/// the exponent field by one integer multiply-add (t's bits * 2^23 = j << 23 modulo 2^32). x is
/// clamped to -127 first: -inf (masked) and anything at or below -127 give exactly +0 (j = -127,
/// f = 0, 2^f = 1.0 whose exponent field 127 drops to 0), so rows without visible keys keep l = 0;
/// between -127 and -126 a tiny inexact denormal instead of ex2.ftz's 0.
FP_DEV float exp2_fma(float x) {
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23
  x = fmaxf(x, -127.0f);
  const float t = __fadd_rn(x, kShifter);
  const float f = __fsub_rn(x, __fsub_rn(t, kShifter));
  float poly = fmaf(0.0095828176f, f, 0.055906352f);
  poly = fmaf(poly, f, 0.24024099f);
  poly = fmaf(poly, f, 0.69312418f);
  poly = fmaf(poly, f, 1.0f);
  return __uint_as_float(__float_as_uint(t) * (1u << 23) + __float_as_uint(poly));
}

/// Turns the scores of one tile into probabilities exp2(score * to_log2 - m) in place and updates
/// m and l. Returns whether this warp moved m (then O must be multiplied by alpha[h] per row);
/// the decision is warp-uniform so warps never diverge in the rescale. -inf rows stay NaN-free:
/// their exponent base is 0, so exp2(-inf) = 0.
FP_DEV bool online_softmax(float (&r_s)[kBlockN / 2], RowState& st, float to_log2, float (&alpha)[2]) {
  float tile_max[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = sem::kNegInf;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(r_s[4 * j + 2 * h], r_s[4 * j + 2 * h + 1]));
    tile_max[h] = quad_max(mx) * to_log2 - kPHeadroom;
  }
  const bool grow = tile_max[0] > st.m[0] + kRescaleSlack || tile_max[1] > st.m[1] + kRescaleSlack;
  const bool rescale = __any_sync(kFullMask, grow);
  alpha[0] = alpha[1] = 1.0f;
  if (rescale) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(st.m[h], tile_max[h]);
      alpha[h] = m_new == sem::kNegInf ? 1.0f : fast_exp2(st.m[h] - m_new);
      st.m[h] = m_new;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float base = sem::softmax_base(st.m[h]);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        float& v = r_s[4 * j + 2 * h + x];
        v = j % 8 < kExpEmu ? exp2_fma(fmaf(v, to_log2, -base)) : fast_exp2(fmaf(v, to_log2, -base));
        sum += v;
      }
    }
    st.l[h] = st.l[h] * alpha[h] + sum;
  }
  return rescale;
}

/// P (fp32 fragment) -> register A operand. 16-bit: pair (e, e + 1) becomes register e / 2, low half
/// first. FP8: a 32-key step's four registers need keys (g, 4t..4t+3), (g + 8, ..), (g, 16 + 4t..),
/// (g + 8, ..) where the thread holds keys 2t, 2t + 1 of every 8 (wgmma.cuh): rather than shuffling
/// bytes between lanes, register q of step kk takes the thread's own pairs of 8-key groups 4kk + 2(q / 2)
/// and 4kk + 2(q / 2) + 1 at row half q % 2, and fp8_v_transpose stores V^T's keys in the matching
/// order (its key_of_slot), so P V sums the same products.
template <class E>
FP_DEV void convert_p(const float (&r_s)[kBlockN / 2], u32 (&r_p)[kPRegs]) {
  if constexpr (kFp8) {
#pragma unroll
    for (int q = 0; q < kPRegs; ++q) {
      const int e = 16 * (q / 4) + 8 * ((q / 2) % 2) + 2 * (q % 2);  // first pair: group 4kk + 2(q/2 % 2)
      r_p[q] = E::pack4(r_s[e], r_s[e + 1], r_s[e + 4], r_s[e + 5]);
    }
  } else {
#pragma unroll
    for (int q = 0; q < kBlockN / 4; ++q) r_p[q] = E::pack(r_s[2 * q], r_s[2 * q + 1]);
  }
}

/// O rows times alpha (O has the accumulator layout of S with N = kPvN).
FP_DEV void rescale_o(float (&r_o)[kPvN / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int e = 0; e < kPvN / 2; ++e) r_o[e] *= alpha[(e >> 1) & 1];
}

/// Row totals: 1 / l (0 for a row without visible keys, whose O is 0) and the natural-log LSE
/// (m + log2 l) * ln 2 (-inf without visible keys).
FP_DEV void finalize_rows(const RowState& st, float (&inv)[2], float (&lse)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(st.l[h]);
    inv[h] = sem::softmax_norm(l);
    lse[h] = sem::softmax_lse(st.m[h], l, [](float x) { return fast_log2(x); });
  }
}

}  // namespace flashport::cuda::hopper
