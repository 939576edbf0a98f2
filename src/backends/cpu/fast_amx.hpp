// The bf16 forward on AMX: S^T = K Q^T and O^T += V^T P^T as bf16 tile dot products with fp32
// accumulation; between them the fp32 online softmax of fast_forward.hpp on AVX-512. P enters the
// second product as two bf16 terms (hi + lo, 16 significant bits): P rounded to one bf16, as
// flash-attn does on GPUs, flips output roundings often enough to break SPEC's accuracy rule against
// its (fp64-accumulating) baseline now and then.
//
// Textual include in fast_isa_amx.cpp after fast_simd.hpp and fast_forward.hpp (see fast_simd.hpp).
// AMX needs intrinsics: tile registers have no portable spelling.

/// Every tile register here is 16 rows x 64 bytes: 16 x 16 fp32 accumulators, or 16 rows of 32 bf16
/// operands (B operands hold 16 columns of bf16 pairs: the "VNNI" layout, pair k of column n in the
/// 32-bit word [k][n]). Tiles 0-3 accumulate a 32 x 32 block, 4-5 hold A, 6-7 hold B.
inline constexpr int kTileRows = 16;
inline constexpr int kTileBf16 = 32;
/// Keys per AMX tile: twice the fp32 path's, so each O^T accumulator tile, loaded and stored once per
/// key tile, takes four tile products instead of two.
inline constexpr int kAmxKeys = 2 * kBlockK;

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

inline void amx_configure() {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kTileRows;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

/// The AMX group layout, in bf16 elements: K rows [sk_pad][d32], then V^T [dv32][sk_pad]. Channels
/// pad to whole operand rows, keys to a whole tile plus one more (a tile may start anywhere below sk).
struct AmxLayout {
  long long d32, dv32, sk_pad;
};
inline AmxLayout amx_layout(const AttnProblem& p, long long sk) {
  return {pad_to(p.d, kTileBf16), pad_to(p.dv, kTileBf16), pad_to(sk, kAmxKeys) + kAmxKeys};
}
inline long long amx_packed_floats(const AttnProblem& p, long long sk) {
  const AmxLayout t = amx_layout(p, sk);
  return (t.sk_pad * (t.d32 + t.dv32) + 1) / 2;
}

/// Copies keys [j0, j1) (bf16 bits): K row j to k + (j - j0) * k_ld, V row j to column j - j0 of vt
/// (row stride vt_ld); channels past d and dv are zero. V goes through a row-major staging block of
/// 32 keys so the transposed writes stay within 32-key runs of each V^T row.
inline void amx_pack_rows(const AttnProblem& p, long long b, long long hk, long long j0, long long j1,
                          uint16_t* k, long long k_ld, uint16_t* vt, long long vt_ld, long long dv32) {
  const uint16_t* k_src = static_cast<const uint16_t*>(p.k.ptr);
  const uint16_t* v_src = static_cast<const uint16_t*>(p.v.ptr);
  uint16_t stage[kTileBf16][256];  // (keys, channels); dv32 <= 256
  for (long long jb = j0; jb < j1; jb += kTileBf16) {
    const int n = (int)std::min<long long>(kTileBf16, j1 - jb);
    for (int jj = 0; jj < n; ++jj) {
      const long long j = jb + jj;
      const uint16_t* k_row = k_src + k_offset(p, p.k, b, j, hk);
      uint16_t* k_dst = k + (j - j0) * k_ld;
      std::copy(k_row, k_row + p.d, k_dst);
      std::fill(k_dst + p.d, k_dst + k_ld, (uint16_t)0);
      const uint16_t* v_row = v_src + k_offset(p, p.v, b, j, hk);
      std::copy(v_row, v_row + p.dv, stage[jj]);
      std::fill(stage[jj] + p.dv, stage[jj] + dv32, (uint16_t)0);
    }
    for (long long c = 0; c < dv32; ++c) {
      uint16_t* vt_c = vt + c * vt_ld + (jb - j0);
      for (int jj = 0; jj < n; ++jj) vt_c[jj] = stage[jj][c];
    }
  }
}

/// Zeroes keys [j0, j1) of a packed K/V^T pair, so tiles reading past the sequence see zeros.
inline void amx_zero_keys(uint16_t* k, long long k_ld, uint16_t* vt, long long vt_ld, long long dv32,
                          long long j0, long long j1) {
  std::fill(k + j0 * k_ld, k + j1 * k_ld, (uint16_t)0);
  for (long long c = 0; c < dv32; ++c) std::fill(vt + c * vt_ld + j0, vt + c * vt_ld + j1, (uint16_t)0);
}

inline void amx_pack_kv(const AttnProblem& p, long long b, long long hk, long long j0, long long j1,
                        long long sk, float* group) {
  const AmxLayout t = amx_layout(p, sk);
  uint16_t* k = reinterpret_cast<uint16_t*>(group);
  uint16_t* vt = k + t.sk_pad * t.d32;
  amx_pack_rows(p, b, hk, j0, j1, k + j0 * t.d32, t.d32, vt + j0, t.sk_pad, t.dv32);
  if (j1 == sk) amx_zero_keys(k, t.d32, vt, t.sk_pad, t.dv32, sk, t.sk_pad);
}

/// S^T (kAmxKeys x kBlockQ fp32) = K rows (kAmxKeys x d32 bf16, stride k_ld) x Q^T, Q given as bf16
/// pairs q_v[d32 / 2][kBlockQ]. Raw dot products: the caller applies the score scale.
inline void amx_scores(const uint16_t* k_rows, long long k_ld, const uint32_t* q_v, long long d32, float* s) {
  const int s_stride = kBlockQ * 4, q_stride = kBlockQ * 4, k_stride = (int)(k_ld * 2);
  for (int qb = 0; qb < kBlockQ; qb += 2 * kTileRows) {  // a 32-query slice of Q stays in L1
    for (int kb = 0; kb < kAmxKeys; kb += 2 * kTileRows) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (long long dc = 0; dc < d32; dc += kTileBf16) {
        _tile_loadd(4, k_rows + kb * k_ld + dc, k_stride);
        _tile_loadd(5, k_rows + (kb + kTileRows) * k_ld + dc, k_stride);
        _tile_loadd(6, q_v + (dc / 2) * kBlockQ + qb, q_stride);
        _tile_loadd(7, q_v + (dc / 2) * kBlockQ + qb + kTileRows, q_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* c = s + kb * kBlockQ + qb;
      _tile_stored(0, c, s_stride);
      _tile_stored(1, c + kTileRows, s_stride);
      _tile_stored(2, c + kTileRows * kBlockQ, s_stride);
      _tile_stored(3, c + kTileRows * kBlockQ + kTileRows, s_stride);
    }
  }
}

/// O^T (dv32 x kBlockQ fp32) += V^T (columns = the tile's keys, stride vt_ld) x (P_hi + P_lo)^T, each
/// P term given as bf16 pairs of keys [kAmxKeys / 2][kBlockQ].
inline void amx_accumulate_out(const uint16_t* vt, long long vt_ld, const uint32_t* p_hi,
                               const uint32_t* p_lo, long long dv32, float* o_t) {
  const int o_stride = kBlockQ * 4, p_stride = kBlockQ * 4, v_stride = (int)(vt_ld * 2);
  for (int qb = 0; qb < kBlockQ; qb += 2 * kTileRows) {  // a 32-query slice of P stays in L1
    for (long long cb = 0; cb < dv32; cb += 2 * kTileRows) {
      float* c = o_t + cb * kBlockQ + qb;
      _tile_loadd(0, c, o_stride);
      _tile_loadd(1, c + kTileRows, o_stride);
      _tile_loadd(2, c + kTileRows * kBlockQ, o_stride);
      _tile_loadd(3, c + kTileRows * kBlockQ + kTileRows, o_stride);
      for (int kc = 0; kc < kAmxKeys; kc += kTileBf16) {
        _tile_loadd(4, vt + cb * vt_ld + kc, v_stride);
        _tile_loadd(5, vt + (cb + kTileRows) * vt_ld + kc, v_stride);
        _tile_loadd(6, p_hi + (kc / 2) * kBlockQ + qb, p_stride);
        _tile_loadd(7, p_hi + (kc / 2) * kBlockQ + qb + kTileRows, p_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(6, p_lo + (kc / 2) * kBlockQ + qb, p_stride);
        _tile_loadd(7, p_lo + (kc / 2) * kBlockQ + qb + kTileRows, p_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, o_stride);
      _tile_stored(1, c + kTileRows, o_stride);
      _tile_stored(2, c + kTileRows * kBlockQ, o_stride);
      _tile_stored(3, c + kTileRows * kBlockQ + kTileRows, o_stride);
    }
  }
}

/// Query rows [i0, i0 + nq) of head h as bf16 pairs q_v[d32 / 2][kBlockQ]; padding is zero. The rows
/// are copied whole first (head-strided rows miss the caches; independent copies overlap the misses),
/// then paired from `stage` (kBlockQ x d32 bf16).
inline void amx_load_queries(const AttnProblem& p, long long b, long long h, long long i0, int nq,
                             long long d32, uint16_t* stage, uint32_t* q_v) {
  const uint16_t* q_src = static_cast<const uint16_t*>(p.q.ptr);
  for (int r = 0; r < nq; ++r) {
    const uint16_t* q_row = q_src + q_offset(p, p.q, b, i0 + r, h);
    std::copy(q_row, q_row + p.d, stage + r * d32);
    std::fill(stage + r * d32 + p.d, stage + (r + 1) * d32, (uint16_t)0);
  }
  std::fill(stage + nq * d32, stage + kBlockQ * d32, (uint16_t)0);
  for (long long t = 0; t < d32 / 2; ++t) {
    for (int r = 0; r < kBlockQ; ++r) {
      q_v[t * kBlockQ + r] = (uint32_t)stage[r * d32 + 2 * t] | (uint32_t)stage[r * d32 + 2 * t + 1] << 16;
    }
  }
}

/// Scales raw scores to x = q_scale * dot and, for a tile needing no mask, merges its column max.
inline void amx_scale_scores(float* s, int nk, float q_scale, float* m_new) {
  for (int j = 0; j < nk; ++j) {
    float* s_j = s + j * kBlockQ;
    for (int r = 0; r < kBlockQ; ++r) {
      const float x = s_j[r] * q_scale;
      s_j[r] = x;
      if (m_new) m_new[r] = x > m_new[r] ? x : m_new[r];
    }
  }
}

/// P^T (fp32 keys x kBlockQ) as two bf16 terms hi + lo, each in pairs of keys; keys past nk are zero.
/// VCVTNE2PS2BF16 rounds an even and an odd key row at once (to nearest even, like num::f32_to_bf16
/// except that denormals become zero), one word permute interleaves them into pairs; lo is the
/// rounding remainder (exact in fp32), rounded the same way.
inline void amx_pack_probs(const float* s, int nk, uint32_t* p_hi, uint32_t* p_lo) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  const __m512i high_half = _mm512_set1_epi32((int)0xffff0000u);
  for (int t = 0; t < kAmxKeys / 2; ++t) {
    const float* even = s + (2 * t) * kBlockQ;
    const float* odd = even + kBlockQ;
    const bool has_even = 2 * t < nk, has_odd = 2 * t + 1 < nk;
    for (int r = 0; r < kBlockQ; r += 16) {
      const __m512 e = has_even ? _mm512_loadu_ps(even + r) : _mm512_setzero_ps();
      const __m512 o = has_odd ? _mm512_loadu_ps(odd + r) : _mm512_setzero_ps();
      const __m512i hi = _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(o, e));
      // hi holds (e_hi, o_hi) per 32-bit word: widen each half back to fp32 for the remainders.
      const __m512 e_hi = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
      const __m512 o_hi = _mm512_castsi512_ps(_mm512_and_si512(hi, high_half));
      const __m512i lo = _mm512_permutexvar_epi16(
          order, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(o, o_hi), _mm512_sub_ps(e, e_hi)));
      _mm512_storeu_si512(p_hi + t * kBlockQ + r, hi);
      _mm512_storeu_si512(p_lo + t * kBlockQ + r, lo);
    }
  }
}

/// Query tile `blk` of a bf16 problem; same contract as forward_block.
inline void amx_forward_block(const AttnProblem& p, const QueryBlock& blk, const float* group,
                              float* scratch) {
  const long long b = blk.b, h = blk.h, i0 = blk.i0;
  const long long sq = seqlen_q(p, b), sk = seqlen_k(p, b), hk = kv_head(p, h);
  const int nq = (int)std::min<long long>(kBlockQ, sq - i0);
  const int dv = (int)p.dv;
  const ScoreParams sp = score_params(p, b, h);
  const AmxLayout lay = amx_layout(p, sk);
  constexpr long long kLocalKeys = 2 * kAmxKeys;  // a per-tile pack: one tile plus padding

  Bump mem{scratch};
  uint32_t* q_v = reinterpret_cast<uint32_t*>(mem.take(lay.d32 / 2 * kBlockQ));      // (d32 / 2, kBlockQ)
  uint16_t* q_stage = reinterpret_cast<uint16_t*>(mem.take(kBlockQ * lay.d32 / 2));  // (kBlockQ, d32)
  float* s_tile = mem.take((long long)kAmxKeys * kBlockQ);                           // (kAmxKeys, kBlockQ)
  uint32_t* p_hi = reinterpret_cast<uint32_t*>(mem.take(kAmxKeys / 2 * kBlockQ));  // (kAmxKeys / 2, kBlockQ)
  uint32_t* p_lo = reinterpret_cast<uint32_t*>(mem.take(kAmxKeys / 2 * kBlockQ));  // (kAmxKeys / 2, kBlockQ)
  float* o_t = mem.take(lay.dv32 * kBlockQ);                                       // (dv32, kBlockQ): O^T
  uint16_t* k_loc = reinterpret_cast<uint16_t*>(mem.take(kLocalKeys * lay.d32 / 2));
  uint16_t* vt_loc = reinterpret_cast<uint16_t*>(mem.take(lay.dv32 * kLocalKeys / 2));
  float* row = mem.take(lay.dv32);
  float* m = mem.take(kBlockQ);
  float* l = mem.take(kBlockQ);
  float* alpha = mem.take(kBlockQ);
  float* m_new = mem.take(kBlockQ);
  int* lo = mem.take_int(kBlockQ);
  int* hi = mem.take_int(kBlockQ);

  amx_load_queries(p, b, h, i0, nq, lay.d32, q_stage, q_v);
  const int out_bytes = p.out_type == kF32 ? 4 : 2;
  for (int r = 0; r < nq; ++r) {  // the output rows, requested for writing now to arrive by the end
    const char* o_row = static_cast<const char*>(p.o.ptr) + q_offset(p, p.o, b, i0 + r, h) * out_bytes;
    for (int byte = 0; byte < dv * out_bytes; byte += 64) __builtin_prefetch(o_row + byte, 1, 3);
  }
  row_ranges(p, i0, nq, sq, sk, lo, hi);
  const sem::KeyRange span = sem::tile_keys(i0, i0 + nq, sq, sk, p.window_left, p.window_right);
  const long long span_lo = span.lo, span_hi = span.hi;  // no tile when empty
  std::fill(m, m + kBlockQ, kNegInf);
  std::fill(l, l + kBlockQ, 0.0f);
  std::fill(o_t, o_t + lay.dv32 * kBlockQ, 0.0f);
  const long long diag0 = sem::diagonal(i0, sq, sk);

  amx_configure();
  for (long long j0 = span_lo; j0 < span_hi; j0 += kAmxKeys) {
    const int nk = (int)std::min<long long>(kAmxKeys, span_hi - j0);
    // Produce K/V: the group's packed tiles, or this tile packed now.
    const uint16_t* k_rows = k_loc;
    const uint16_t* vt = vt_loc;
    long long vt_ld = kLocalKeys;
    if (group) {
      k_rows = reinterpret_cast<const uint16_t*>(group) + j0 * lay.d32;
      vt = reinterpret_cast<const uint16_t*>(group) + lay.sk_pad * lay.d32 + j0;
      vt_ld = lay.sk_pad;
    } else {
      amx_pack_rows(p, b, hk, j0, j0 + nk, k_loc, lay.d32, vt_loc, kLocalKeys, lay.dv32);
      amx_zero_keys(k_loc, lay.d32, vt_loc, kLocalKeys, lay.dv32, nk, kLocalKeys);
    }
    // Scores, then the fp32 stages of the fp32 path.
    amx_scores(k_rows, lay.d32, q_v, lay.d32, s_tile);
    const bool plain = !sp.transform && tile_fully_visible(lo, hi, nq, j0, nk);
    std::copy(m, m + kBlockQ, m_new);
    amx_scale_scores(s_tile, nk, sp.q_scale, plain ? m_new : nullptr);
    if (!plain) {
      if (sp.transform) transform_scores(sp, s_tile, nullptr, nk, j0, diag0);
      if (!tile_fully_visible(lo, hi, nq, j0, nk)) mask_scores(s_tile, nk, j0, lo, hi);
      column_max(s_tile, nk, m, m_new);
    }
    online_softmax(s_tile, nk, m_new, m, l, alpha);
    if (p.dropout_p > 0.0f) dropout_scale(p, b, h, i0, j0, nk, s_tile, 1.0f);  // 1/(1-p) applied to O
    amx_pack_probs(s_tile, nk, p_hi, p_lo);
    // O^T = O^T * alpha (per query column) + V^T P^T; the rescale is skipped when no max moved.
    bool moved = false;
    for (int r = 0; r < kBlockQ; ++r) moved |= alpha[r] != 1.0f;
    if (moved) {
      for (long long c = 0; c < dv; ++c) {
        float* o_c = o_t + c * kBlockQ;
        for (int r = 0; r < kBlockQ; ++r) o_c[r] *= alpha[r];
      }
    }
    amx_accumulate_out(vt, vt_ld, p_hi, p_lo, lay.dv32, o_t);
  }
  _tile_release();

  // Finalise: O / l (times the dropout's 1/(1-p), kept out of the bf16 P) and LSE = ln(2) * (m +
  // log2 l); rows that saw no key get 0 and -inf.
  const float keep_scale = p.dropout_p > 0.0f ? (float)(1.0 / (1.0 - (double)p.dropout_p)) : 1.0f;
  float* o_rows = s_tile;  // (kBlockQ, dv) fits the score tile, free now, when dv <= kAmxKeys
  float* o_rows_big = dv <= kAmxKeys ? o_rows : nullptr;
  for (int c = 0; c < dv && o_rows_big; ++c) {
    for (int r = 0; r < kBlockQ; ++r) o_rows_big[r * dv + c] = o_t[c * kBlockQ + r];
  }
  for (int r = 0; r < nq; ++r) {
    const long long i = i0 + r;
    const float inv_l = l[r] > 0.0f ? keep_scale / l[r] : 0.0f;
    const float* o_r = o_rows_big ? o_rows_big + r * dv : row;
    if (!o_rows_big) {
      for (int c = 0; c < dv; ++c) row[c] = o_t[c * kBlockQ + r];
    }
    store_row(p.o.ptr, p.out_type, q_offset(p, p.o, b, i, h), dv, inv_l, o_r);
    if (p.lse) p.lse[lse_offset(p, b, h, i)] = l[r] > 0.0f ? kLn2 * (m[r] + std::log2(l[r])) : kNegInf;
  }
}
