// The CDNA backward kernels (FlashAttention-2's backward), written once over the wave layer:
// attn_bwd.hip compiles them for gfx90a / gfx94x, tests/hip compiles them with g++ against the CPU
// wave64 model. Every semantic rule comes from core/problem.h and core/semantics.h.
//
// Three kernels (BwdParams in attn_bwd_config.hpp states their grids):
//   RowKernel::dot_do_o    D = rowsum(dO * O) per (query, head) in fp32, and the dQ accumulator zeroed;
//   Kernel::run            per (key tile, kv head, batch): dK and dV of the tile's keys held in registers
//                          over every query tile that sees them and every query head of the kv head's
//                          group (GQA sums inside the block: no dK/dV workspace, no atomics there),
//                          dQ += dS K added to the fp32 accumulator with atomics, or in deterministic
//                          mode to the block's own slice of it in a fixed order;
//   RowKernel::convert_dq  dQ = scale * accumulator (its slices summed in order), in the input dtype.
//
// Fragment plan of Kernel (wave/mfma_layout.hpp; lane l, quad = l / 16, col = l % 16). Wave w owns the
// 16 keys j0 + 16 w + col; a query tile of kBlockM rows is visited in 16-row subtiles u. An MFMA
// contracts over k, which sits at position 4 quad + e of both operands, so every operand must hand a
// lane 4 consecutive elements along the contracted dimension:
//   S  = Q K^T   (contract channels):  A = Q[16u + col][ch 4quad + e]     row-major LDS, ds_read_b64
//                                      B = K[key col][ch 4quad + e]        registers (r_k), once per block
//   dP = dO V^T  (contract channels):  A = dO[16u + col][ch 4quad + e]    row-major LDS
//                                      B = V[key col][ch 4quad + e]        registers (r_v)
// Both C layouts are [query 16u + 4 quad + r][key col]: S and dP line up register for register, so
// P = exp2(s - lse) and dS = P (dP - D) are elementwise, and each lane's key is fixed (one mask range).
//   dV^T += dO^T P  (contract queries): A = dO[16u + 4quad + e][ch col]   4 two-byte LDS reads
//                                       B = P[16u + 4quad + e][key col]   = the C layout above, as is
//   dK^T += Q^T dS  (contract queries): A = Q[16u + 4quad + e][ch col],   B = dS, likewise
// so P and dS never leave registers for dK/dV, whose C layout gives lane l dK[key col][ch 4quad + r]
// (4 consecutive channels: one 8-byte store). dQ contracts over keys, which dS's registers hold one per
// lane, so dS goes through LDS (as in FA2):
//   dQ = dS K  (contract keys):  A = dS[query col][key 4quad + e]   s_ds row-major, ds_read_b64
//                                B = K[key 4quad + e][ch col]       s_kt (K stored transposed)
// with wave w taking the tile's queries 16 w + ..., C = dQ[query 4quad + r][ch col] added atomically.
// Cost of this first version: the transposed reads of Q and dO (A of dV^T, dK^T) are 4 ds_read_u16
// each; transposed LDS copies (or ds_read_u16_d16_hi packing) are the next step for speed.
#pragma once

#include "attn/bwd_stages.h"
#include "core/problem.h"
#include "hip/attn_bwd_config.hpp"
#include "wave/wave.hpp"

namespace flashport::amd::bwd {

using namespace flashport::wave;

/// Key rows sequence b occupies in dK/dV (those the backward writes; rows past seqlen_k get 0):
/// key_rows with the varlen bounds checked against total_k as guarded_lengths does, and at most sk.
FP_DEV i64 stored_key_rows(const AttnProblem& p, i64 b) {
  i64 n = p.sk;
  if (p.cu_seqlens_k) {
    const i64 s0 = p.cu_seqlens_k[b], s1 = p.cu_seqlens_k[b + 1];
    n = (s0 < 0 || s1 < s0 || s1 > p.total_k) ? 0 : s1 - s0;
  }
  return n < p.sk ? n : p.sk;
}

/// 8 elements from global memory: one 16-byte load when the row is aligned, else 8 2-byte loads.
FP_DEV u16x8 load8(const u16* src, bool vec) {
  if (vec) return *reinterpret_cast<const u16x8*>(src);
  u16x8 v;
  for (int e = 0; e < 8; ++e) v[e] = src[e];
  return v;
}

/// D = rowsum(dO * O) and the dQ accumulator's zeroing; dQ's conversion. 4 lanes per query row (each
/// an interleaved quarter of the 8-channel chunks), 64 rows per block of one (head, sequence).
template <class Elem>
struct RowKernel {
  static constexpr int kThreads = kBwdRowThreads;
  static constexpr int kRows = kBwdRowsPerBlock;

  static FP_DEV float value(u16 bits) {
    return Elem::kElemType == kBF16 ? num::bf16_to_f32(bits) : num::f16_to_f32(bits);
  }

  static FP_DEV void dot_do_o(const BwdParams& prm) {
    const AttnProblem& p = prm.p;
    const i64 b = block_z(), h = block_y(), m0 = (i64)block_x() * kRows;
    const SeqLens seq = guarded_lengths(p, b);
    if (m0 >= seq.q) return;  // the whole block, before the wave collective
    const int part = thread_id() & 3;
    const i64 i = m0 + thread_id() / 4;
    float acc = 0.0f;
    if (i < seq.q) {
      const u16* g_o = static_cast<const u16*>(p.o.ptr) + q_offset(p, p.o, b, i, h);
      const u16* g_do = static_cast<const u16*>(p.dout.ptr) + q_offset(p, p.dout, b, i, h);
      for (int c = 8 * part; c < p.dv; c += 32) {
        const u16x8 o = load8(g_o + c, prm.vec & kBwdVecO), d_o = load8(g_do + c, prm.vec & kBwdVecDo);
        for (int e = 0; e < 8; ++e) acc += value(o[e]) * value(d_o[e]);
      }
    }
    acc = sum_over<1, 2>(acc);  // the row's 4 lanes are adjacent
    if (i >= seq.q) return;
    if (part == 0) prm.d_rows[lse_offset(p, b, h, i)] = acc;
    const i64 slice = bwd_dq_slice_elems(p);
    float* dq = prm.dq_accum + bwd_dq_accum_offset(p, b, i, h);
    for (int s = 0; s < prm.num_slices; ++s)
      for (int c = part; c < p.d; c += 4) dq[s * slice + c] = 0.0f;
  }

  static FP_DEV void convert_dq(const BwdParams& prm) {
    const AttnProblem& p = prm.p;
    const i64 b = block_z(), h = block_y(), m0 = (i64)block_x() * kRows;
    const SeqLens seq = guarded_lengths(p, b);
    const i64 i = m0 + thread_id() / 4;
    if (i >= seq.q) return;
    const i64 slice = bwd_dq_slice_elems(p);
    const float* acc = prm.dq_accum + bwd_dq_accum_offset(p, b, i, h);
    u16* g_dq = static_cast<u16*>(p.grad_q.ptr) + q_offset(p, p.grad_q, b, i, h);
    for (int c = 8 * (thread_id() & 3); c < p.d; c += 32) {
      float sum[8];
      for (int e = 0; e < 8; ++e) sum[e] = acc[c + e];
      for (int s = 1; s < prm.num_slices; ++s)  // slice order: the deterministic sum
        for (int e = 0; e < 8; ++e) sum[e] += acc[s * slice + c + e];
      u16x8 v;
      for (int e = 0; e < 8; ++e) v[e] = Elem::from_float(sum[e] * p.scale);
      if (prm.vec & kBwdVecDq) {
        *reinterpret_cast<u16x8*>(g_dq + c) = v;
      } else {
        for (int e = 0; e < 8; ++e) g_dq[c + e] = v[e];
      }
    }
  }
};

/// Sequence lengths and positions inside the main loop are 32-bit (the host bounds sequence lengths
/// below 2^31, as for the CUDA backward's Seq): 64-bit scalars there spilled scalar registers.
struct Lens32 {
  int q, k;
};
struct Range32 {
  int lo, hi;
};

/// One query head of the block's group: what the score transform needs (the lane's key is fixed), and
/// the head's row 0 in Q, dO, the LSE, D and the dQ accumulator, so a query row is base + i * stride
/// (every offset rule of problem.h is linear in the row; fewer live scalars than re-deriving each).
struct HeadCtx {
  int h;
  float scale, scale_log2, slope;
  bool plain;  // no softcap, no ALiBi
  const u16 *q, *dout;
  const float *lse, *d_rows;
  float* dq;
  i64 q_stride, dout_stride, dq_stride;
};

template <class Elem, int kHeadDim>
struct Kernel {
  static constexpr BwdTile kTile = bwd_tile(kHeadDim);
  static constexpr int kWaves = kTile.waves;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kThreads = kWaves * kWaveSize;
  static constexpr int kPitch = bwd_pitch(kHeadDim);
  static constexpr int kKeyPitch = bwd_key_pitch(kHeadDim);
  static constexpr int kSteps = kHeadDim / 16;    // 16-channel steps
  static constexpr int kSubtiles = kBlockM / 16;  // 16-query subtiles of a query tile
  static constexpr int kKeyTiles = kBlockN / 16;  // 16-key k-steps of dQ = dS K
  static constexpr int kChunks = kHeadDim / 8;    // 8-element (16-byte) chunks per global row
  static constexpr int kLdsBytes = bwd_lds_bytes(kHeadDim);
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256 && kBlockN == 16 * kWaves && kBlockM == kBlockN);

  /// Every lane of the block takes a share of the 8-element chunks of rows [0, kRows) of a (rows,
  /// kHeadDim) tile and hands each to `put(r, col, v)`; `row_offset(r)` < 0 and columns >= ncols give
  /// zeros, so padded rows and channels add exact zeros to every product.
  template <int kRows, class RowOffset, class Put>
  static FP_DEV void load_tile(const void* g_base, i64 ncols, bool vec, RowOffset row_offset, Put put) {
    const u16* g = static_cast<const u16*>(g_base);
    for (int c = thread_id(); c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const i64 off = col < ncols ? row_offset(r) : -1;
      u16x8 v = {0, 0, 0, 0, 0, 0, 0, 0};
      if (off >= 0) v = load8(g + off + col, vec);
      put(r, col, v);
    }
  }
  /// `put` for row-major LDS tiles (Q, dO, the V staging): two 8-byte stores.
  static FP_DEV auto rows_into(u16* s_tile) {
    return [=](int r, int col, u16x8 v) {
      u16x4* dst = reinterpret_cast<u16x4*>(s_tile + r * kPitch + col);
      dst[0] = u16x4{v[0], v[1], v[2], v[3]};
      dst[1] = u16x4{v[4], v[5], v[6], v[7]};
    };
  }
  /// `put` for K^T: channel col + e of key r goes to row col + e, column r.
  static FP_DEV auto transposed_into(u16* s_kt) {
    return [=](int r, int col, u16x8 v) {
      for (int e = 0; e < 8; ++e) s_kt[(col + e) * kKeyPitch + r] = v[e];
    };
  }
  /// A operand of dV^T / dK^T: X[16u + 4quad + e][16c + col] of a row-major tile (4 two-byte reads).
  static FP_DEV u16x4 column_frag(const u16* s_tile, int u, int c, int lane) {
    const u16* src = s_tile + (16 * u + 4 * (lane >> 4)) * kPitch + 16 * c + (lane & 15);
    return u16x4{src[0], src[kPitch], src[2 * kPitch], src[3 * kPitch]};
  }

  /// One query tile (rows m0 + [0, kBlockM) of head hc.h, staged in s_q, s_do, s_lse, s_dd) for this
  /// wave's 16 keys: dV and dK accumulated, dS written to s_ds. `seen` is the lane key's query range
  /// (sem::seeing_queries: empty for keys past len_k), so masked pairs give P = dS = 0 exactly.
  static FP_DEV void key_stage(f32x4 (&acc_dk)[kSteps], f32x4 (&acc_dv)[kSteps], const u16x4 (&r_k)[kSteps],
                               const u16x4 (&r_v)[kSteps], const u16* s_q, const u16* s_do, u16* s_ds,
                               const float* s_lse, const float* s_dd, const AttnProblem& p, const HeadCtx& hc,
                               const Lens32& seq, i64 b, int m0, int j, Range32 seen, int wave, int lane) {
    const int quad = lane >> 4, col = lane & 15;
    const float keep_scale = sem::dropout_keep_scale(p.dropout_p);
    for (int u = 0; u < kSubtiles; ++u) {
      f32x4 s = {0.0f, 0.0f, 0.0f, 0.0f}, dp = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int kk = 0; kk < kSteps && 16 * kk < p.d; ++kk)
        s = mfma16(Elem{},
                   *reinterpret_cast<const u16x4*>(s_q + (16 * u + col) * kPitch + 16 * kk + 4 * quad),
                   r_k[kk], s);
      for (int c = 0; c < kSteps && 16 * c < p.dv; ++c)
        dp = mfma16(Elem{},
                    *reinterpret_cast<const u16x4*>(s_do + (16 * u + col) * kPitch + 16 * c + 4 * quad),
                    r_v[c], dp);
      // P and dS of rows 16u + 4quad + r (SPEC steps 1-6 through `score` and the dropout rule; the
      // reference's dS: P (Z dP - D) softcap'(s); the scale is applied to dK and dQ at the end).
      // Branch-free over the mask (computed everywhere, selected after): divergent branches here held
      // exec masks and Philox state in scalar registers and spilled them on gfx942.
      u16x4 p_frag, ds_frag;
      for (int r = 0; r < 4; ++r) {
        const int tr = 16 * u + 4 * quad + r;
        const int i = m0 + tr;
        const bool visible = i >= seen.lo && i < seen.hi;
        const float sc = hc.plain
                             ? s[r] * hc.scale_log2
                             : score<float>(p, s[r], hc.scale, hc.slope, i, j, seq.q, seq.k) * sem::kLog2e;
        const bool kept = p.dropout_p <= 0.0f ||
                          sem::dropout_keep(p.seed, p.offset, p.dropout_threshold, i, j, b, p.hq, hc.h);
        const float capped = p.softcap > 0.0f ? sem::softcap(hc.scale * s[r], p.softcap) : 0.0f;  // uniform
        float pz, ds;
        attn::prob_grad(visible ? wave::exp2(sc - s_lse[tr]) : 0.0f, kept, keep_scale, dp[r], s_dd[tr],
                        p.softcap, capped, pz, ds);
        p_frag[r] = Elem::from_float(pz);
        ds_frag[r] = Elem::from_float(ds);
        s_ds[tr * kKeyPitch + 16 * wave + col] = ds_frag[r];
      }
      for (int c = 0; c < kSteps && 16 * c < p.dv; ++c)
        acc_dv[c] = mfma16(Elem{}, column_frag(s_do, u, c, lane), p_frag, acc_dv[c]);
      for (int c = 0; c < kSteps && 16 * c < p.d; ++c)
        acc_dk[c] = mfma16(Elem{}, column_frag(s_q, u, c, lane), ds_frag, acc_dk[c]);
    }
  }

  /// dQ of this wave's 16 queries of the tile (rows m0 + 16 wave + ...) over the block's keys, added to
  /// the fp32 accumulator (hc.dq: the block's slice in deterministic mode, where element (i, ch) has
  /// one owner lane in every key tile, so a plain read-modify-write is race-free and ordered).
  static FP_DEV void dq_stage(const AttnProblem& p, const HeadCtx& hc, const u16* s_ds, const u16* s_kt,
                              const Lens32& seq, int m0, int wave, int lane) {
    const int quad = lane >> 4, col = lane & 15;
    u16x4 a_ds[kKeyTiles];
    for (int t = 0; t < kKeyTiles; ++t)
      a_ds[t] = *reinterpret_cast<const u16x4*>(s_ds + (16 * wave + col) * kKeyPitch + 16 * t + 4 * quad);
    for (int c = 0; c < kSteps && 16 * c < p.d; ++c) {
      f32x4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int t = 0; t < kKeyTiles; ++t)
        acc = mfma16(Elem{}, a_ds[t],
                     *reinterpret_cast<const u16x4*>(s_kt + (16 * c + col) * kKeyPitch + 16 * t + 4 * quad),
                     acc);
      if (16 * c + col >= p.d) continue;
      for (int r = 0; r < 4; ++r) {
        const int i = m0 + 16 * wave + 4 * quad + r;
        if (i >= seq.q) continue;
        float* dst = hc.dq + (i64)i * hc.dq_stride + 16 * c + col;
        if (p.deterministic)
          *dst += acc[r];
        else
          atomic_add_f32(dst, acc[r]);
      }
    }
  }

  /// dK (times the scale) and dV of this lane's key (rows g_dk, g_dv): 4 consecutive channels per
  /// 16-channel step.
  static FP_DEV void store_key_grads(const BwdParams& prm, const f32x4 (&acc_dk)[kSteps],
                                     const f32x4 (&acc_dv)[kSteps], u16* g_dk, u16* g_dv, bool used,
                                     int quad) {
    const AttnProblem& p = prm.p;
    auto store = [&](u16* g, const f32x4(&acc)[kSteps], i64 ncols, float fac, bool vec) {
      for (int c = 0; c < kSteps; ++c) {
        const int ch = 16 * c + 4 * quad;
        if (ch >= ncols) continue;  // ncols is a multiple of 8: the 4 channels are all in or all out
        u16x4 v;
        for (int r = 0; r < 4; ++r) v[r] = Elem::from_float(used ? acc[c][r] * fac : 0.0f);
        if (vec) {
          *reinterpret_cast<u16x4*>(g + ch) = v;
        } else {
          for (int r = 0; r < 4; ++r) g[ch + r] = v[r];
        }
      }
    };
    store(g_dk, acc_dk, p.d, p.scale, prm.vec & kBwdVecDk);
    store(g_dv, acc_dv, p.dv, 1.0f, prm.vec & kBwdVecDv);
  }

  static FP_DEV void run(const BwdParams& prm, unsigned char* lds) {
    const AttnProblem& p = prm.p;
    const i64 b = block_z(), hk = block_y();
    const SeqLens seq64 = guarded_lengths(p, b);
    const i64 rows_k = stored_key_rows(p, b);
    // Key tiles x, x + grid x, ...: one per block without determinism (grid x = key tiles), the slice's
    // tiles in order with it (grid x = num_slices). The bound is block-uniform: no barrier is skipped.
    const i64 slice = p.deterministic ? (i64)block_x() : 0;
    for (i64 nb = block_x(); nb * kBlockN < rows_k; nb += grid_x()) {
      key_tile(prm, lds, b, hk, nb * kBlockN, seq64, rows_k, prm.dq_accum + slice * bwd_dq_slice_elems(p));
      block_sync();  // the next tile rewrites every LDS buffer
    }
  }

  /// dK and dV of keys [j0, j0 + kBlockN) of (b, hk), and their share of dQ added to `dq_accum` (a slice).
  static FP_DEV void key_tile(const BwdParams& prm, unsigned char* lds, i64 b, i64 hk, i64 j0,
                              const SeqLens& seq64, i64 rows_k, float* dq_accum) {
    const AttnProblem& p = prm.p;
    u16* s_kt = reinterpret_cast<u16*>(lds);  // (kHeadDim, kKeyPitch): K^T, the whole block
    u16* s_q = s_kt + kHeadDim * kKeyPitch;   // (kBlockM, kPitch): Q of a query tile; V before the loop
    u16* s_do = s_q + kBlockM * kPitch;       // (kBlockM, kPitch): dO of a query tile
    u16* s_ds = s_do + kBlockM * kPitch;      // (kBlockM, kKeyPitch): dS of a query tile
    float* s_lse = reinterpret_cast<float*>(s_ds + kBlockM * kKeyPitch);  // LSE * log2(e) per tile row
    float* s_dd = s_lse + kBlockM;                                        // D per tile row

    const Lens32 seq{(int)seq64.q, (int)seq64.k};
    const int lane = lane_id(), wave = wave_id(), quad = lane >> 4;
    const i64 j = j0 + 16 * wave + (lane & 15);  // this lane's key
    const i64 wl = p.window_left, wr = p.window_right;

    f32x4 acc_dk[kSteps], acc_dv[kSteps];  // dK[j][16c + 4quad + r], dV likewise (unscaled)
    for (int c = 0; c < kSteps; ++c) acc_dk[c] = acc_dv[c] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};

    // The lane's dK/dV rows, addressed before the main loop: the key addressing's scalars (cu_seqlens_k,
    // strides) are then dead during it (live across it they spilled scalar registers on gfx942).
    u16* g_dk = nullptr;
    u16* g_dv = nullptr;
    if (j < rows_k) {
      g_dk = static_cast<u16*>(p.grad_k.ptr) + k_offset(p, p.grad_k, b, j, hk);
      g_dv = static_cast<u16*>(p.grad_v.ptr) + k_offset(p, p.grad_v, b, j, hk);
    }

    if (j0 < seq.k) {  // block-uniform: a tile wholly past len_k only writes zeros
      // The queries that see some key of the tile, and those that see this lane's key (exact ranges).
      const i64 j_end = j0 + kBlockN < seq.k ? j0 + kBlockN : seq.k;
      const sem::Range queries = sem::seeing_queries(j0, j_end, seq.q, seq.k, wl, wr);
      const sem::Tiles<int> tiles = sem::covering_tiles<int>((int)queries.lo, (int)queries.hi, kBlockM);
      const sem::Range seen64 =
          j < seq.k ? sem::seeing_queries(j, j + 1, seq.q, seq.k, wl, wr) : sem::Range{0, 0};
      const Range32 seen{(int)seen64.lo, (int)seen64.hi};

      // Stage: K^T (kept for dQ) and V (through s_q) into LDS; this wave's K and V B-fragments into
      // registers. Keys past len_k are zero rows.
      auto key_row = [&](const Operand& op) {
        return [&, op](int r) { return j0 + r < seq.k ? k_offset(p, op, b, j0 + r, hk) : (i64)-1; };
      };
      load_tile<kBlockN>(p.k.ptr, p.d, prm.vec & kBwdVecK, key_row(p.k), transposed_into(s_kt));
      load_tile<kBlockN>(p.v.ptr, p.dv, prm.vec & kBwdVecV, key_row(p.v), rows_into(s_q));
      block_sync();
      u16x4 r_k[kSteps], r_v[kSteps];
      const int key = 16 * wave + (lane & 15);
      for (int kk = 0; kk < kSteps; ++kk) {
        for (int e = 0; e < 4; ++e) r_k[kk][e] = s_kt[(16 * kk + 4 * quad + e) * kKeyPitch + key];
        r_v[kk] = *reinterpret_cast<const u16x4*>(s_q + key * kPitch + 16 * kk + 4 * quad);
      }
      block_sync();  // s_q holds Q tiles from here

      const bool wave_has_keys = j0 + 16 * wave < seq.k;  // wave-uniform skip of the key stage's math
      const int group = (int)gqa_group(p);
      for (int g = 0; g < group && tiles.begin < tiles.end; ++g) {
        HeadCtx hc;
        hc.h = group_head((int)hk, group, g);
        hc.scale = p.scale;
        hc.scale_log2 = p.scale * sem::kLog2e;
        hc.slope = alibi_slope(p, b, hc.h);
        hc.plain = p.softcap <= 0.0f && !p.alibi;
        hc.q = static_cast<const u16*>(p.q.ptr) + q_offset(p, p.q, b, 0, hc.h);
        hc.dout = static_cast<const u16*>(p.dout.ptr) + q_offset(p, p.dout, b, 0, hc.h);
        hc.lse = p.lse + lse_offset(p, b, hc.h, 0);
        hc.d_rows = prm.d_rows + lse_offset(p, b, hc.h, 0);
        hc.dq = dq_accum + bwd_dq_accum_offset(p, b, 0, hc.h);
        hc.q_stride = p.q.row_stride, hc.dout_stride = p.dout.row_stride;
        hc.dq_stride = bwd_dq_accum_offset(p, b, 1, hc.h) - bwd_dq_accum_offset(p, b, 0, hc.h);
        for (int t = tiles.begin; t < tiles.end; ++t) {
          const int m0 = t * kBlockM;
          // Stage: Q and dO rows (zero past len_q), LSE (log2 units) and D of the tile.
          auto query_row = [&](i64 stride) {
            return [&, stride](int r) { return m0 + r < seq.q ? (i64)(m0 + r) * stride : (i64)-1; };
          };
          load_tile<kBlockM>(hc.q, p.d, prm.vec & kBwdVecQ, query_row(hc.q_stride), rows_into(s_q));
          load_tile<kBlockM>(hc.dout, p.dv, prm.vec & kBwdVecDo, query_row(hc.dout_stride), rows_into(s_do));
          for (int r = thread_id(); r < kBlockM; r += kThreads) {
            const bool in = m0 + r < seq.q;
            s_lse[r] = in ? hc.lse[m0 + r] * sem::kLog2e : 0.0f;
            s_dd[r] = in ? hc.d_rows[m0 + r] : 0.0f;
          }
          block_sync();
          if (wave_has_keys) {
            key_stage(acc_dk, acc_dv, r_k, r_v, s_q, s_do, s_ds, s_lse, s_dd, p, hc, seq, b, m0, (int)j, seen,
                      wave, lane);
          } else {  // keys past len_k: dS = 0 for the dQ stage (s_ds starts as garbage)
            for (int u = 0; u < kSubtiles; ++u)
              for (int r = 0; r < 4; ++r) s_ds[(16 * u + 4 * quad + r) * kKeyPitch + key] = 0;
          }
          block_sync();
          if (m0 + 16 * wave < seq.q) dq_stage(p, hc, s_ds, s_kt, seq, m0, wave, lane);
          block_sync();  // s_q, s_do, s_ds are rewritten by the next tile
        }
      }
    }
    if (j < rows_k) store_key_grads(prm, acc_dk, acc_dv, g_dk, g_dv, j < seq.k, quad);
  }
};

}  // namespace flashport::amd::bwd
