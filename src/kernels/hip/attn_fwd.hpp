// The CDNA forward kernel (FlashAttention-2: online softmax over key tiles), written once over the wave
// layer: attn_fwd.hip compiles it for gfx90a / gfx94x, tests/hip compiles it with g++ against the CPU
// wave64 model. Every semantic rule comes from core/problem.h and core/semantics.h, and the stages that
// do not depend on the fragment layout from attn/fwd_stages.h, which the CUDA portable forward runs too.
//
// Fragment plan (wave/mfma_layout.hpp; lane l, quad = l / 16, row = l % 16 of the wave's 16 queries):
// both products are taken transposed, S^T = K Q^T and O^T = V^T P^T, so that each lane owns one query
// row. The C layout of S^T gives lane l S[row][16t + 4 quad + r] in register r, which is exactly the B
// layout of P^T in O^T = V^T P^T (P never leaves registers), and O^T's C layout gives lane l
// O[row][16c + 4 quad + r]. Row max and sum are per lane and reduce over the 4 lanes of a row (xor 16,
// 32); no score crosses lanes otherwise.
//   Q (B of S^T):   Q[row][16kk + 4 quad + e]      registers, loaded once through LDS
//   K (A of S^T):   K[16t + row][16kk + 4 quad + e] 8 contiguous LDS bytes (ds_read_b64)
//   V^T (A of O^T): V[16t + 4 quad + e][16c + row]  V is stored transposed so these are 8 contiguous bytes
#pragma once

#include "attn/fwd_stages.h"
#include "hip/attn_fwd_config.hpp"
#include "hip/fp8_decode.hpp"
#include "wave/wave.hpp"

namespace flashport::amd::fwd {

using namespace flashport::wave;

/// Four fp32 results to channels col .. col + 3 of the p.o row at element offset `off`, in p.out_type
/// (bf16, f16 or f32; uniform): one 16-byte (f32) or 8-byte store when `vec` (the row is aligned: kVecO),
/// else element stores. The fp8 forward's epilogue and split_combine.
FP_DEV void store4_as(const AttnProblem& p, i64 off, i64 col, f32x4 o, bool vec) {
  if (p.out_type == kF32) {
    float* g = static_cast<float*>(p.o.ptr) + off + col;
    if (vec) {
      *reinterpret_cast<f32x4*>(g) = o;
    } else {
      for (int r = 0; r < 4; ++r) g[r] = o[r];
    }
    return;
  }
  u16x4 v;
  for (int r = 0; r < 4; ++r) v[r] = p.out_type == kF16 ? f16_bits(o[r]) : num::f32_to_bf16(o[r]);
  u16* g = static_cast<u16*>(p.o.ptr) + off + col;
  if (vec) {
    *reinterpret_cast<u16x4*>(g) = v;
  } else {
    for (int r = 0; r < 4; ++r) g[r] = v[r];
  }
}

/// `kDropout`: the variant with SPEC's dropout stage (a separate instantiation, so the variants without
/// it compile to exactly the code they had; the HIP entry picks it with -D FP_DROPOUT=1).
/// `kFp8`: fp8 inputs (e4m3fn, e4m3fnuz or e5m2, p.in_type), dequantised to bf16 while staging tiles
/// into LDS (fp8_decode.hpp: exact), so Elem is bf16; the output in p.out_type (bf16, f16 or f32).
/// Also a separate instantiation (-D FP_FP8=1), for the same reason as kDropout.
/// `kSplit`: split-KV (attn_fwd_split, FwdParams::num_splits > 1): grid z is batch x splits, the block
/// visits its split's share of its key tiles and writes fp32 partials (store_partial) for split_combine.
/// Compiled into objects of its own (-D FP_SPLIT=1), so attn_fwd's code is what it was.
template <class Elem, int kHeadDim, bool kDropout = false, bool kFp8 = false, bool kSplit = false>
struct Kernel {
  static constexpr FwdTile kTile = fwd_tile(kHeadDim);
  static constexpr int kWaves = kTile.waves;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kThreads = kWaves * kWaveSize;
  static constexpr int kPitch = fwd_pitch(kHeadDim);
  static constexpr int kVtPitch = fwd_vt_pitch(kHeadDim);
  static constexpr int kSteps = kHeadDim / 16;    // 16-channel steps: k-steps of S^T, m-tiles of O^T
  static constexpr int kKeyTiles = kBlockN / 16;  // 16-key tiles of S^T in one key tile
  static constexpr int kChunks = kHeadDim / 8;    // 8-element chunks per global row (16 bytes; fp8 8)
  static constexpr int kLdsBytes = fwd_lds_bytes(kHeadDim);
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256 && kBlockM == 16 * kWaves && kBlockN % 16 == 0);
  // apply_dropout: a lane's 4 registers of a 16-key tile are keys j0 + 16t + 4 quad + r, and j0 is a
  // multiple of kBlockN, so they are the 4 keys of one Philox call in word order.
  static_assert(kBlockN % 4 == 0);
  static_assert(!kFp8 || (Elem::kElemType == 3 && !kDropout), "fp8: the bf16 MFMA path, no dropout variant");

  /// The score layout for the shared stages (attn/fwd_stages.h): S^T's C layout, in which lane l holds
  /// one query row (l % 16 of the wave's 16) and register r of 16-key tile t is key 16t + 4 quad + r;
  /// O^T's register r of channel tile c is channel 16c + 4 quad + r. A row's lanes differ in bits 4, 5.
  struct Rows {
    static constexpr int kRows = 1;
    template <class F>
    static FP_DEV void map_s(f32x4 (&s)[kKeyTiles], F&& f) {
      const int quad = lane_id() >> 4;
      for (int t = 0; t < kKeyTiles; ++t)
        for (int r = 0; r < 4; ++r) s[t][r] = f(0, 16 * t + 4 * quad + r, s[t][r]);
    }
    template <class F>
    static FP_DEV void map_o(f32x4 (&o)[kSteps], F&& f) {
      for (int c = 0; c < kSteps; ++c)
        for (int r = 0; r < 4; ++r) o[c][r] = f(0, o[c][r]);
    }
    static FP_DEV float row_max(float v) { return max_over<16, 32>(v); }
    static FP_DEV float row_sum(float v) { return sum_over<16, 32>(v); }
    static FP_DEV float exp2(float x) { return wave::exp2(x); }
    static FP_DEV float log2(float x) { return wave::log2(x); }
    static FP_DEV bool all_lanes(bool v) { return wave_all(v); }
  };

  /// 8 elements from global memory: one 16-byte load when the row is aligned, else 8 2-byte loads.
  static FP_DEV u16x8 load8(const u16* src, bool vec) {
    if (vec) return *reinterpret_cast<const u16x8*>(src);
    u16x8 v;
    for (int e = 0; e < 8; ++e) v[e] = src[e];
    return v;
  }

  /// 8 fp8 codes as bf16: one 8-byte load when the row is aligned, else 8 byte loads.
  static FP_DEV u16x8 load8_fp8(const unsigned char* src, bool vec, const Fp8Decode& f8) {
    u16x8 v;
    if (vec) {
      const u64 w = *reinterpret_cast<const u64*>(src);
      for (int e = 0; e < 8; ++e) v[e] = fp8_to_bf16((u32)(w >> (8 * e)) & 0xffu, f8);
    } else {
      for (int e = 0; e < 8; ++e) v[e] = fp8_to_bf16(src[e], f8);
    }
    return v;
  }

  /// Every lane of the block takes a share of the 8-element chunks of rows [0, kRows) of a (rows,
  /// kHeadDim) tile and hands each to `put(r, col, v)`. `row_offset(r)` is the element offset of row r
  /// in `g_base`, negative for rows to zero-fill (outside the sequence, or a page outside the pool);
  /// columns >= ncols are zero-filled, so padded rows and columns add exact zeros to both products.
  /// `f8`: the fp8 decode (kFp8 only; the tile then holds bf16).
  template <int kRows, class RowOffset, class Put>
  static FP_DEV void load_tile(const void* g_base, i64 ncols, bool vec, RowOffset row_offset, Put put,
                               const Fp8Decode& f8) {
    const u16* g = static_cast<const u16*>(g_base);
    for (int c = thread_id(); c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const i64 off = col < ncols ? row_offset(r) : -1;
      u16x8 v = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (kFp8) {
        if (off >= 0) v = load8_fp8(static_cast<const unsigned char*>(g_base) + off + col, vec, f8);
      } else {
        if (off >= 0) v = load8(g + off + col, vec);
      }
      put(r, col, v);
    }
  }
  /// `put` for row-major LDS tiles (Q, K): two 8-byte stores (kPitch keeps rows 8-byte aligned).
  static FP_DEV auto rows_into(u16* s_tile) {
    return [=](int r, int col, u16x8 v) {
      u16x4* dst = reinterpret_cast<u16x4*>(s_tile + r * kPitch + col);
      dst[0] = u16x4{v[0], v[1], v[2], v[3]};
      dst[1] = u16x4{v[4], v[5], v[6], v[7]};
    };
  }
  /// `put` for the transposed V tile: channel col + e of key r goes to row col + e, column r.
  static FP_DEV auto transposed_into(u16* s_vt) {
    return [=](int r, int col, u16x8 v) {
      for (int e = 0; e < 8; ++e) s_vt[(col + e) * kVtPitch + r] = v[e];
    };
  }

  /// S^T = K Q^T for this wave's 16 queries over one key tile: acc_s[t] holds S[row][16t + 4 quad + r].
  /// k-steps wholly beyond d are skipped (their columns are zero).
  static FP_DEV void compute_st(f32x4 (&acc_s)[kKeyTiles], const u16* s_k, const u16x4 (&r_q)[kSteps], i64 d,
                                int lane) {
    const int quad = lane >> 4;
    for (int t = 0; t < kKeyTiles; ++t) {
      f32x4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int kk = 0; kk < kSteps; ++kk) {
        if (kk * 16 >= d) break;
        const u16x4 a =
            *reinterpret_cast<const u16x4*>(s_k + (16 * t + (lane & 15)) * kPitch + 16 * kk + 4 * quad);
        acc = mfma16(Elem{}, a, r_q[kk], acc);
      }
      acc_s[t] = acc;
    }
  }

  /// SPEC step 6 on this lane's P, after online_softmax added it to the row sum (the LSE is taken
  /// before dropout): dropped probabilities become 0; the 1 / (1 - p) rescale is folded into the
  /// finalize factor. One Philox call per 16-key tile gives the words of keys j .. j + 3 (j = j0 + 16t +
  /// 4 quad), word r for register r: the keep rule and the counter are core/semantics.h's, so the
  /// masks are the CPU backend's bit for bit. Row, head and batch index are the lane's own (b is the
  /// sequence index for varlen, i the position within it, as the SPEC's counter says).
  static FP_DEV void apply_dropout(f32x4 (&acc_s)[kKeyTiles], const AttnProblem& p, i64 b, i64 h, i64 row,
                                   i64 j0, int quad) {
    for (int t = 0; t < kKeyTiles; ++t) {
      const sem::Philox4 w = sem::dropout_words(p.seed, p.offset, row, j0 + 16 * t + 4 * quad, b, p.hq, h);
      for (int r = 0; r < 4; ++r)
        if (w.x[r] < p.dropout_threshold) acc_s[t][r] = 0.0f;
    }
  }

  /// O^T += V^T P^T: P (acc_s, exponentiated) rounded to Elem is the B operand as it stands in
  /// registers. Channel tiles wholly beyond dv are skipped.
  static FP_DEV void compute_ot(f32x4 (&acc_o)[kSteps], const f32x4 (&acc_s)[kKeyTiles], const u16* s_vt,
                                i64 dv, int lane) {
    const int quad = lane >> 4;
    u16x4 p_frag[kKeyTiles];
    for (int t = 0; t < kKeyTiles; ++t)
      for (int e = 0; e < 4; ++e) p_frag[t][e] = Elem::from_float(acc_s[t][e]);
    for (int c = 0; c < kSteps; ++c) {
      if (c * 16 >= dv) break;
      for (int t = 0; t < kKeyTiles; ++t) {
        const u16x4 a =
            *reinterpret_cast<const u16x4*>(s_vt + (16 * c + (lane & 15)) * kVtPitch + 16 * t + 4 * quad);
        acc_o[c] = mfma16(Elem{}, a, p_frag[t], acc_o[c]);
      }
    }
  }

  /// O = acc_o * fac and the LSE of this lane's row (query i of head h), in the output dtype.
  static FP_DEV void store_output(const AttnProblem& p, const f32x4 (&acc_o)[kSteps], float fac, float lse,
                                  i64 b, i64 h, i64 i, bool vec, int quad) {
    if (p.lse && quad == 0) p.lse[lse_offset(p, b, h, i)] = lse;
    if constexpr (kFp8) return store_output_as(p, acc_o, fac, q_offset(p, p.o, b, i, h), vec, quad);
    u16* g_o = static_cast<u16*>(p.o.ptr) + q_offset(p, p.o, b, i, h);
    for (int c = 0; c < kSteps; ++c) {
      const int col = 16 * c + 4 * quad;
      if (col >= p.dv) continue;  // dv is a multiple of 8: the 4 channels are all in or all out
      u16x4 v;
      for (int r = 0; r < 4; ++r) v[r] = Elem::from_float(acc_o[c][r] * fac);
      if (vec) {
        *reinterpret_cast<u16x4*>(g_o + col) = v;
      } else {
        for (int r = 0; r < 4; ++r) g_o[col + r] = v[r];
      }
    }
  }

  /// The fp8 variant's O in p.out_type (uniform): bf16, f16 or f32, the types validation accepts for
  /// fp8 inputs. `off`: the element offset of the row; f32 rows take 16-byte stores when `vec`.
  static FP_DEV void store_output_as(const AttnProblem& p, const f32x4 (&acc_o)[kSteps], float fac, i64 off,
                                     bool vec, int quad) {
    for (int c = 0; c < kSteps; ++c) {
      const int col = 16 * c + 4 * quad;
      if (col >= p.dv) continue;
      f32x4 o;
      for (int r = 0; r < 4; ++r) o[r] = acc_o[c][r] * fac;
      store4_as(p, off, col, o, vec);
    }
  }

  /// kSplit: this split's normalised O of the lane's row (query i of head h) and its LSE, in fp32, to
  /// the workspaces at fwd_partial_row. O rows are dv floats (dv a multiple of 8) from a 16-byte aligned
  /// base, so each lane's 4 channels are one 16-byte store.
  static FP_DEV void store_partial(const FwdParams& prm, const f32x4 (&acc_o)[kSteps], float fac, float lse,
                                   i64 split, i64 b, i64 h, i64 i, int quad) {
    const AttnProblem& p = prm.p;
    const i64 row = fwd_partial_row(p, split, b, h, i);
    if (quad == 0) prm.lse_partial[row] = lse;
    float* g_o = prm.o_partial + row * p.dv;
    for (int c = 0; c < kSteps; ++c) {
      const int col = 16 * c + 4 * quad;
      if (col >= p.dv) continue;
      f32x4 o;
      for (int r = 0; r < 4; ++r) o[r] = acc_o[c][r] * fac;
      *reinterpret_cast<f32x4*>(g_o + col) = o;
    }
  }

  static FP_DEV void run(const FwdParams& prm, unsigned char* lds) {
    const AttnProblem& p = prm.p;
    u16* s_q = reinterpret_cast<u16*>(lds);  // (kBlockM, kPitch), before the key loop only
    u16* s_k = s_q;                          // (kBlockN, kPitch), in the key loop
    u16* s_vt = s_q + kBlockN * kPitch;      // (kHeadDim, kVtPitch): V transposed, in the key loop

    // Block rows are packed rows m0 + r (attn::RowMap: with GQA packing grid y is the kv head and its
    // group's query heads interleave, so a decode block holds every head that reads this K/V).
    const i64 b = kSplit ? block_z() / (unsigned)prm.num_splits : block_z(), group = prm.pack_gqa;
    const i64 split = kSplit ? block_z() % (unsigned)prm.num_splits : 0;
    const i64 hk = group > 1 ? (i64)block_y() : kv_head(p, block_y());
    const attn::RowMap rows = attn::row_map((i64)grid_x() - 1 - block_x(), block_y(), group, kBlockM);
    const attn::FwdBlock blk = attn::fwd_block(p, b, rows, kBlockM);
    const i64 m0 = rows.m0, packed_len = blk.packed_len;
    if (m0 >= packed_len) return;  // the whole block, before any barrier
    const int lane = lane_id(), wave = wave_id(), quad = lane >> 4;
    const int row = 16 * wave + (lane & 15);  // this lane's block row

    // Key tiles of the block (kSplit: this split's share of them); tiles inside `unmasked` need no mask.
    const sem::Tiles<i64> tiles = attn::block_tiles(p, blk, kBlockN, split, kSplit ? prm.num_splits : 1);
    const sem::KeyRange unmasked = attn::unmasked_keys(p, blk);
    const int lane_rows[1] = {row};
    const attn::ScoreRows<1> ctx = attn::score_rows(p, blk, b, hk, rows, lane_rows);
    const i64 h = ctx.head[0];  // this lane's query head

    const Fp8Decode f8 = kFp8 ? fp8_decode(p.in_type) : Fp8Decode{};

    // Stage: Q through LDS into registers (B fragments of S^T), once.
    load_tile<kBlockM>(
        p.q.ptr, p.d, prm.vec & kVecQ,
        [&](int r) {
          return m0 + r < packed_len ? q_offset(p, p.q, b, rows.query(r), rows.head(r)) : (i64)-1;
        },
        rows_into(s_q), f8);
    block_sync();
    u16x4 r_q[kSteps];
    for (int kk = 0; kk < kSteps; ++kk)
      r_q[kk] = *reinterpret_cast<const u16x4*>(s_q + row * kPitch + 16 * kk + 4 * quad);
    block_sync();  // s_q's space becomes s_k / s_vt

    f32x4 acc_o[kSteps];  // O[row][16c + 4 quad + r]
    for (int c = 0; c < kSteps; ++c) acc_o[c] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
    attn::RowState<1> st = attn::row_state_init<1>();
    // Waves whose 16 rows are all padding only help load: a wave-uniform skip of the math.
    const bool wave_has_rows = m0 + 16 * wave < packed_len;

    for (i64 t = tiles.begin; t < tiles.end; ++t) {
      const i64 j0 = t * kBlockN;
      // Stage: K and V^T of keys [j0, j0 + kBlockN) into LDS (keys past len_k and pages outside the
      // pool are zero rows; the mask removes them from the softmax).
      auto key_row = [&](const Operand& op) {
        return [&, op](int r) { return j0 + r < blk.len_k ? k_offset(p, op, b, j0 + r, hk) : (i64)-1; };
      };
      load_tile<kBlockN>(p.k.ptr, p.d, prm.vec & kVecK, key_row(p.k), rows_into(s_k), f8);
      load_tile<kBlockN>(p.v.ptr, p.dv, prm.vec & kVecV, key_row(p.v), transposed_into(s_vt), f8);
      block_sync();
      if (wave_has_rows) {
        f32x4 acc_s[kKeyTiles];  // S[row][16t + 4 quad + r]
        compute_st(acc_s, s_k, r_q, p.d, lane);
        const bool masked = !sem::contains(unmasked, j0, j0 + kBlockN);
        attn::transform_scores<Rows, kBlockN>(acc_s, p, ctx, j0, masked);
        attn::online_softmax<Rows>(acc_s, acc_o, st);
        if constexpr (kDropout) apply_dropout(acc_s, p, b, h, ctx.row[0], j0, quad);
        compute_ot(acc_o, acc_s, s_vt, p.dv, lane);
      }
      block_sync();  // every wave is done with s_k / s_vt before the next tile overwrites them
    }

    // Finalize: O / l (times the dropout rescale 1 / (1 - p) and the fp8 V descale); LSE = ln(2^m * l).
    // A row with no visible key (kSplit: none in this split) has l = 0: O = 0 (acc_o is 0), LSE = -inf.
    float fac[1], lse[1];
    attn::finish_rows<Rows>(st, attn::output_scale(p, b, hk, kDropout), fac, lse);
    if (m0 + row >= packed_len) return;  // padding rows: past the last barrier and collective
    if constexpr (kSplit)
      store_partial(prm, acc_o, fac[0], lse[0], split, b, h, ctx.row[0], quad);
    else
      store_output(p, acc_o, fac[0], lse[0], b, h, ctx.row[0], prm.vec & kVecO, quad);
  }
};

}  // namespace flashport::amd::fwd
