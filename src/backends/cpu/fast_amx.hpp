// The bf16 forward on AMX: S^T = K Q^T and O^T += V^T P^T as bf16 tile dot products with fp32
// accumulation; between them an fp32 online softmax on AVX-512 that reads the score tile twice (column
// max, then exp + row sums + bf16 packing of P in one sweep). P enters the second product rounded to
// one bf16, as flash-attn on GPUs and torch's CPU SDPA do: the scores stay fp32, so the rounding of P
// is the only one before the output's, which SPEC's baseline (scores and P rounded) also has.
//
// Textual include in fast_isa_amx.cpp after fast_simd.hpp and fast_forward.hpp (see fast_simd.hpp).
// AMX needs intrinsics: tile registers have no portable spelling.

/// Every tile register here is 16 rows x 64 bytes: 16 x 16 fp32 accumulators, or 16 rows of 32 bf16
/// operands (B operands hold 16 columns of bf16 pairs: the "VNNI" layout, pair k of column n in the
/// 32-bit word [k][n]). Tiles 0-3 accumulate a 32 x 32 block, 4-5 hold A, 6-7 hold B.
inline constexpr int kTileRows = 16;
inline constexpr int kTileBf16 = 32;
/// Keys per step: a 128 x 64 fp32 score tile (32 KiB) stays in L1 between the product and the softmax.
inline constexpr int kAmxKeys = 2 * kBlockK;
/// The running max a row's P is taken against is raised only when a tile's max exceeds it by more
/// than this (log2 units), so P <= 2^8 (exact in bf16's range) and O^T is rarely rescaled: after the
/// first key tiles a row's max almost never grows that much, where the exact max moves on most tiles.
inline constexpr float kRescaleSlack = 8.0f;

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

inline void amx_configure() {
  // GCC's _tile_loadconfig names only the first 8 bytes as its memory operand, so stores into a
  // local config may be dropped as dead (SIGILL at the first tile instruction when not inlined):
  // the config lives in static storage instead.
  static constexpr TileConfig kConfig = [] {
    TileConfig cfg{};
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
      cfg.rows[t] = kTileRows;
      cfg.colsb[t] = 64;
    }
    return cfg;
  }();
  _tile_loadconfig(&kConfig);
}

/// In-place transpose of a 16 x 16 block of 32-bit words (r[i] = row i), in four shuffle stages.
FAST_INLINE void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + k]: word k of each 128-bit lane, rows i..i+3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8) {  // lanes (0, 2) and (1, 3) of rows h..h+3 and h+4..h+7
    for (int k = 0; k < 4; ++k) {
      t[h + k] = _mm512_shuffle_i32x4(r[h + k], r[h + 4 + k], 0x88);
      t[h + 4 + k] = _mm512_shuffle_i32x4(r[h + k], r[h + 4 + k], 0xdd);
    }
  }
  for (int k = 0; k < 8; ++k) {  // t[k]: columns (k, k + 8) of rows 0-7; t[8 + k] of rows 8-15
    r[k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);
    r[k + 8] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);
  }
}

/// The AMX group layout, in bf16 elements: K rows [sk_pad][d32], then V^T in blocks of 32 keys,
/// [sk_pad / 32][dv32][32], so that a V^T tile (16 channels x 32 keys) is 1 KiB of contiguous rows.
/// Key steps start on whole blocks; keys past sk are zero.
struct AmxLayout {
  long long d32, dv32, sk_pad;
};
inline AmxLayout amx_layout(const AttnProblem& p, long long sk) {
  return {pad_to(p.d, kTileBf16), pad_to(p.dv, kTileBf16), pad_to(sk, kTileBf16)};
}
inline long long amx_packed_floats(const AttnProblem& p, long long sk) {
  const AmxLayout t = amx_layout(p, sk);
  return (t.sk_pad * (t.d32 + t.dv32) + 1) / 2;
}

/// Packs keys [j0, j1) (j0 a multiple of 32): K row j to k + (j - j0) * d32, V into the blocked V^T
/// starting at block `vt` (the block of j0); the last block's keys past j1 and channels past d / dv
/// are zero. V^T: each pair of keys becomes 32-bit words (key 2t low, 2t + 1 high) for 16 channels,
/// and a 16 x 16 word transpose turns 16 such pairs into 16 channel rows of 32 keys.
inline void amx_pack_rows(const AttnProblem& p, long long b, long long hk, long long j0, long long j1,
                          uint16_t* k, long long d32, uint16_t* vt, long long dv32) {
  const uint16_t* k_src = static_cast<const uint16_t*>(p.k.ptr);
  const uint16_t* v_src = static_cast<const uint16_t*>(p.v.ptr);
  for (long long jb = j0; jb < j1; jb += kTileBf16) {
    const int n = (int)std::min<long long>(kTileBf16, j1 - jb);
    for (int jj = 0; jj < kTileBf16; ++jj) {
      uint16_t* k_dst = k + (jb - j0 + jj) * d32;
      if (jj < n) {
        const uint16_t* k_row = k_src + k_offset(p, p.k, b, jb + jj, hk);
        std::memcpy(k_dst, k_row, (size_t)p.d * 2);
        std::fill(k_dst + p.d, k_dst + d32, (uint16_t)0);
      } else {
        std::fill(k_dst, k_dst + d32, (uint16_t)0);
      }
    }
    const uint16_t* v_rows[kTileBf16];
    for (int jj = 0; jj < n; ++jj) v_rows[jj] = v_src + k_offset(p, p.v, b, jb + jj, hk);
    uint16_t* block = vt + (jb - j0) / kTileBf16 * dv32 * kTileBf16;
    for (long long c0 = 0; c0 < dv32; c0 += 16) {
      const int width = (int)std::clamp<long long>(p.dv - c0, 0, 16);
      const __mmask16 lanes = (__mmask16)((1u << width) - 1u);
      __m512i w[16];
      for (int t = 0; t < 16; ++t) {
        const __m256i even =
            2 * t < n ? _mm256_maskz_loadu_epi16(lanes, v_rows[2 * t] + c0) : _mm256_setzero_si256();
        const __m256i odd =
            2 * t + 1 < n ? _mm256_maskz_loadu_epi16(lanes, v_rows[2 * t + 1] + c0) : _mm256_setzero_si256();
        w[t] =
            _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
      }
      transpose16(w);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(block + (c0 + c) * kTileBf16, w[c]);
    }
  }
}

inline void amx_pack_kv(const AttnProblem& p, long long b, long long hk, long long j0, long long j1,
                        long long sk, float* group) {
  const AmxLayout t = amx_layout(p, sk);
  uint16_t* k = reinterpret_cast<uint16_t*>(group);
  uint16_t* vt = k + t.sk_pad * t.d32;
  amx_pack_rows(p, b, hk, j0, j1, k + j0 * t.d32, t.d32, vt + j0 * t.dv32, t.dv32);
}

/// S^T (keys x kBlockQ fp32, `blocks` blocks of 32 keys) = K rows (stride k_ld) x Q^T, Q given as bf16
/// pairs q_v[d32 / 2][kBlockQ]. Raw dot products: the softmax applies the score scale.
inline void amx_scores(const uint16_t* k_rows, long long k_ld, const uint32_t* q_v, long long d32, int blocks,
                       float* s) {
  const int s_stride = kBlockQ * 4, q_stride = kBlockQ * 4, k_stride = (int)(k_ld * 2);
  // Keys outer: a 32-key block's K tiles are read from L2 once and hit L1 for the second query
  // slice; Q (d32 x kBlockQ bf16, 16 KiB at d 128) stays in L1 across the blocks.
  for (int kb = 0; kb < blocks * kTileBf16; kb += 2 * kTileRows) {
    for (int qb = 0; qb < kBlockQ; qb += 2 * kTileRows) {
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

/// O^T (dv32 x kBlockQ fp32) += V^T (`blocks` blocked 32-key blocks from `vt`) x P^T, P given as bf16
/// pairs of keys [blocks * 16][kBlockQ].
inline void amx_accumulate_out(const uint16_t* vt, long long dv32, const uint32_t* p, int blocks,
                               float* o_t) {
  const int o_stride = kBlockQ * 4, p_stride = kBlockQ * 4, v_stride = kTileBf16 * 2;
  const long long v_block = dv32 * kTileBf16;
  // Channels outer: a 32-channel slice of V^T is read from L2 once and hits L1 for the second query
  // slice; P (16 KiB) stays in L1 across the slices.
  for (long long cb = 0; cb < dv32; cb += 2 * kTileRows) {
    for (int qb = 0; qb < kBlockQ; qb += 2 * kTileRows) {
      float* c = o_t + cb * kBlockQ + qb;
      _tile_loadd(0, c, o_stride);
      _tile_loadd(1, c + kTileRows, o_stride);
      _tile_loadd(2, c + kTileRows * kBlockQ, o_stride);
      _tile_loadd(3, c + kTileRows * kBlockQ + kTileRows, o_stride);
      for (int kc = 0; kc < blocks; ++kc) {
        const uint16_t* v = vt + kc * v_block + cb * kTileBf16;
        const uint32_t* p_k = p + kc * kTileRows * kBlockQ + qb;
        _tile_loadd(4, v, v_stride);
        _tile_loadd(5, v + kTileRows * kTileBf16, v_stride);
        _tile_loadd(6, p_k, p_stride);
        _tile_loadd(7, p_k + kTileRows, p_stride);
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

/// Query rows [i0, i0 + nq) of head h as bf16 pairs q_v[d32 / 2][kBlockQ] (padding zero): a query row
/// read as 32-bit words is one column of q_v, so 16 rows x 16 words transpose at once.
inline void amx_load_queries(const AttnProblem& p, long long b, long long h, long long i0, int nq,
                             long long d32, uint32_t* q_v) {
  const uint16_t* q_src = static_cast<const uint16_t*>(p.q.ptr);
  const uint16_t* rows[kBlockQ];
  for (int r = 0; r < nq; ++r) rows[r] = q_src + q_offset(p, p.q, b, i0 + r, h);
  for (int r0 = 0; r0 < kBlockQ; r0 += 16) {
    for (long long c0 = 0; c0 < d32; c0 += kTileBf16) {
      const int width = (int)std::clamp<long long>(p.d - c0, 0, kTileBf16);
      const __mmask32 lanes = (__mmask32)(width == 32 ? ~0u : (1u << width) - 1u);
      __m512i w[16];
      for (int r = 0; r < 16; ++r) {
        w[r] = r0 + r < nq ? _mm512_maskz_loadu_epi16(lanes, rows[r0 + r] + c0) : _mm512_setzero_si512();
      }
      transpose16(w);
      for (int t = 0; t < 16; ++t) _mm512_storeu_si512(q_v + (c0 / 2 + t) * kBlockQ + r0, w[t]);
    }
  }
}

/// 2^x for x <= ~8 (softmax arguments): the fast_simd.hpp exp2_neg polynomial, with VSCALEFPS adding
/// the integer part. x < -125 and -inf give exactly 0 through the zeroing mask, never through an
/// underflow: a denormal or underflowing result costs a microcode assist per element (masked scores
/// are -inf on every diagonal tile). NaN stays NaN (unordered compares keep the lane, MAXPS returns
/// its second operand when one is NaN).
FAST_INLINE __m512 exp2_vec(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);
  x = _mm512_max_ps(lowest, x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 poly = _mm512_set1_ps(1.546973654e-4f);
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.340043731e-3f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(9.618025273e-3f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(5.550327152e-2f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(2.402265072e-1f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(6.931471825e-1f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, poly, n);
}

inline constexpr int kVecs = kBlockQ / 16;  // zmm registers per score row

/// The online-softmax step of a score tile (nk x kBlockQ, row j = key j; raw dot products times
/// `scale` are the log2-domain scores, -inf where masked). Updates each query column's reference max
/// `m` (raised only past kRescaleSlack, see there), sum `l` and `alpha` (what O^T's column must be
/// multiplied by; 1 unless raised), and writes P as bf16 key pairs p[t][query] up to the next whole
/// 32-key block (zeros past nk), or, when `p` is null, P in fp32 back into `s`. Returns whether any
/// alpha differs from 1. A column with no visible key so far keeps m = -inf and l = 0, and its P is
/// 0 (its scores are -inf, taken against 0).
inline bool amx_softmax(float* s, int nk, float scale, float* m, float* l, float* alpha, uint32_t* p) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf), slack = _mm512_set1_ps(kRescaleSlack);
  const __m512 vscale = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
  __m512 mx[kVecs], m_use[kVecs], sum[kVecs];
  for (int v = 0; v < kVecs; ++v) mx[v] = neg_inf;
  for (int j = 0; j < nk; ++j) {
    for (int v = 0; v < kVecs; ++v) mx[v] = _mm512_max_ps(_mm512_loadu_ps(s + j * kBlockQ + 16 * v), mx[v]);
  }
  bool moved = false;
  for (int v = 0; v < kVecs; ++v) {
    const __m512 m_old = _mm512_loadu_ps(m + 16 * v), m_tile = _mm512_mul_ps(mx[v], vscale);
    // Raise where the tile's max passes the reference by the slack (or the reference is -inf);
    // alpha = 2^(old - new), 1 where the column had no key yet (its O and l are 0).
    const __mmask16 raise = _mm512_cmp_ps_mask(m_tile, _mm512_add_ps(m_old, slack), _CMP_GT_OQ);
    const __m512 m_new = _mm512_mask_blend_ps(raise, m_old, m_tile);
    const __mmask16 rescale = raise & _mm512_cmp_ps_mask(m_old, neg_inf, _CMP_NEQ_OQ);
    moved |= rescale != 0;
    _mm512_storeu_ps(alpha + 16 * v,
                     _mm512_mask_blend_ps(rescale, one, exp2_vec(_mm512_sub_ps(m_old, m_new))));
    _mm512_storeu_ps(m + 16 * v, m_new);
    m_use[v] =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), m_new, _mm512_setzero_ps());
    sum[v] = _mm512_setzero_ps();
  }
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  const int pairs = (int)pad_to(nk, kTileBf16) / 2;
  for (int t = 0; t < pairs; ++t) {
    float* even = s + (2 * t) * kBlockQ;
    float* odd = even + kBlockQ;
    const bool has_even = 2 * t < nk, has_odd = 2 * t + 1 < nk;
    for (int v = 0; v < kVecs; ++v) {
      __m512 e = _mm512_setzero_ps(), o = _mm512_setzero_ps();
      if (has_even) e = exp2_vec(_mm512_fmsub_ps(_mm512_loadu_ps(even + 16 * v), vscale, m_use[v]));
      if (has_odd) o = exp2_vec(_mm512_fmsub_ps(_mm512_loadu_ps(odd + 16 * v), vscale, m_use[v]));
      sum[v] = _mm512_add_ps(sum[v], _mm512_add_ps(e, o));
      if (p) {
        // VCVTNE2PS2BF16 rounds to nearest even (denormals to zero); one word permute pairs the keys.
        const __m512i pair = _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(o, e));
        _mm512_storeu_si512(p + t * kBlockQ + 16 * v, pair);
      } else {
        if (has_even) _mm512_storeu_ps(even + 16 * v, e);
        if (has_odd) _mm512_storeu_ps(odd + 16 * v, o);
      }
    }
  }
  for (int v = 0; v < kVecs; ++v) {
    const __m512 l_old = _mm512_loadu_ps(l + 16 * v), a = _mm512_loadu_ps(alpha + 16 * v);
    _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(l_old, a, sum[v]));
  }
  return moved;
}

/// P^T (fp32 keys x kBlockQ, from amx_softmax with a null `p`) as bf16 key pairs; zeros past nk up
/// to the next whole 32-key block.
inline void amx_pack_probs(const float* s, int nk, uint32_t* p) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  for (int t = 0; t < (int)pad_to(nk, kTileBf16) / 2; ++t) {
    for (int v = 0; v < kVecs; ++v) {
      const __m512 e = 2 * t < nk ? _mm512_loadu_ps(s + 2 * t * kBlockQ + 16 * v) : _mm512_setzero_ps();
      const __m512 o =
          2 * t + 1 < nk ? _mm512_loadu_ps(s + (2 * t + 1) * kBlockQ + 16 * v) : _mm512_setzero_ps();
      _mm512_storeu_si512(p + t * kBlockQ + 16 * v,
                          _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(o, e)));
    }
  }
}

/// Writes rows [0, nq) of O = (O^T)^T * inv_l[row] (bf16 or fp32 rows through 16 x 16 transposes;
/// other output types through store_row), `row` a dv32 staging row.
inline void amx_store_out(const AttnProblem& p, long long b, long long h, long long i0, int nq,
                          const float* o_t, long long dv32, const float* inv_l, float* row) {
  const int dv = (int)p.dv;
  if (p.out_type != kBF16 && p.out_type != kF32) {
    for (int r = 0; r < nq; ++r) {
      for (int c = 0; c < dv; ++c) row[c] = o_t[c * kBlockQ + r];
      store_row(p.o.ptr, p.out_type, q_offset(p, p.o, b, i0 + r, h), dv, inv_l[r], row);
    }
    return;
  }
  for (int r0 = 0; r0 < nq; r0 += 16) {
    for (int c0 = 0; c0 < dv; c0 += 16) {
      __m512i w[16];
      for (int c = 0; c < 16; ++c) w[c] = _mm512_loadu_si512(o_t + (long long)(c0 + c) * kBlockQ + r0);
      transpose16(w);
      const __mmask16 lanes = (__mmask16)(dv - c0 >= 16 ? 0xffffu : (1u << (dv - c0)) - 1u);
      for (int r = 0; r < std::min(16, nq - r0); ++r) {
        const __m512 x = _mm512_mul_ps(_mm512_castsi512_ps(w[r]), _mm512_set1_ps(inv_l[r0 + r]));
        const long long off = q_offset(p, p.o, b, i0 + r0 + r, h) + c0;
        if (p.out_type == kBF16) {
          _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p.o.ptr) + off, lanes,
                                   (__m256i)_mm512_cvtneps_pbh(x));
        } else {
          _mm512_mask_storeu_ps(static_cast<float*>(p.o.ptr) + off, lanes, x);
        }
      }
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

  Bump mem{scratch};
  uint32_t* q_v = reinterpret_cast<uint32_t*>(mem.take(lay.d32 / 2 * kBlockQ));   // (d32 / 2, kBlockQ)
  float* s_tile = mem.take((long long)kAmxKeys * kBlockQ);                        // (kAmxKeys, kBlockQ)
  uint32_t* p_v = reinterpret_cast<uint32_t*>(mem.take(kAmxKeys / 2 * kBlockQ));  // (kAmxKeys / 2, kBlockQ)
  float* o_t = mem.take(lay.dv32 * kBlockQ);                                      // (dv32, kBlockQ): O^T
  uint16_t* k_loc = reinterpret_cast<uint16_t*>(mem.take(kAmxKeys * lay.d32 / 2));
  uint16_t* vt_loc = reinterpret_cast<uint16_t*>(mem.take(lay.dv32 * kAmxKeys / 2));
  float* row = mem.take(lay.dv32);
  float* m = mem.take(kBlockQ);
  float* l = mem.take(kBlockQ);
  float* alpha = mem.take(kBlockQ);
  int* lo = mem.take_int(kBlockQ);
  int* hi = mem.take_int(kBlockQ);

  amx_load_queries(p, b, h, i0, nq, lay.d32, q_v);
  const int out_bytes = p.out_type == kF32 ? 4 : 2;
  for (int r = 0; r < nq; ++r) {  // the output rows, requested for writing now to arrive by the end
    const char* o_row = static_cast<const char*>(p.o.ptr) + q_offset(p, p.o, b, i0 + r, h) * out_bytes;
    for (int byte = 0; byte < dv * out_bytes; byte += 64) __builtin_prefetch(o_row + byte, 1, 3);
  }
  row_ranges(p, i0, nq, sq, sk, lo, hi);
  const sem::KeyRange span = sem::tile_keys(i0, i0 + nq, sq, sk, p.window_left, p.window_right);
  // Steps start on whole 32-key blocks (the packed V^T's unit); keys before span.lo are masked.
  const long long span_lo = span.lo / kTileBf16 * kTileBf16, span_hi = span.hi;  // no step when empty
  std::fill(m, m + kBlockQ, kNegInf);
  std::fill(l, l + kBlockQ, 0.0f);
  std::fill(o_t, o_t + lay.dv32 * kBlockQ, 0.0f);
  const long long diag0 = sem::diagonal(i0, sq, sk);
  const bool dropout = p.dropout_p > 0.0f;

  amx_configure();
  for (long long j0 = span_lo; j0 < span_hi; j0 += kAmxKeys) {
    const int nk = (int)std::min<long long>(kAmxKeys, span_hi - j0);
    const int blocks = (int)(pad_to(nk, kTileBf16) / kTileBf16);
    // K/V: the group's packed keys, or this step's packed now.
    const uint16_t* k_rows = k_loc;
    const uint16_t* vt = vt_loc;
    if (group) {
      k_rows = reinterpret_cast<const uint16_t*>(group) + j0 * lay.d32;
      vt = reinterpret_cast<const uint16_t*>(group) + lay.sk_pad * lay.d32 + j0 * lay.dv32;
    } else {
      amx_pack_rows(p, b, hk, j0, j0 + nk, k_loc, lay.d32, vt_loc, lay.dv32);
    }
    amx_scores(k_rows, lay.d32, q_v, lay.d32, blocks, s_tile);
    // Softcap and ALiBi need the scaled scores; masks work on raw ones (the scale is positive).
    float scale = sp.q_scale;
    if (sp.transform) {
      for (long long e = 0; e < (long long)nk * kBlockQ; ++e) s_tile[e] *= sp.q_scale;
      transform_scores(sp, s_tile, nullptr, nk, j0, diag0);
      scale = 1.0f;
    }
    if (!tile_fully_visible(lo, hi, nq, j0, nk)) mask_scores(s_tile, nk, j0, lo, hi);
    const bool moved = amx_softmax(s_tile, nk, scale, m, l, alpha, dropout ? nullptr : p_v);
    if (dropout) {  // 1/(1-p) is applied to O at the end: P stays as the softmax gave it
      dropout_scale(p, b, h, i0, j0, nk, s_tile, 1.0f);
      amx_pack_probs(s_tile, nk, p_v);
    }
    if (moved) {
      for (long long c = 0; c < dv; ++c) {
        float* o_c = o_t + c * kBlockQ;
        for (int r = 0; r < kBlockQ; ++r) o_c[r] *= alpha[r];
      }
    }
    amx_accumulate_out(vt, lay.dv32, p_v, blocks, o_t);
  }
  _tile_release();

  // Finalise: O / l (times the dropout's 1/(1-p)) and LSE = ln(2) * (m + log2 l), m the reference
  // max P was taken against; rows that saw no key get 0 and -inf.
  const float keep_scale = dropout ? sem::dropout_keep_scale(p.dropout_p) : 1.0f;
  float* inv_l = alpha;
  for (int r = 0; r < kBlockQ; ++r) inv_l[r] = keep_scale * sem::softmax_norm(l[r]);
  amx_store_out(p, b, h, i0, nq, o_t, lay.dv32, inv_l, row);
  if (p.lse) {
    for (int r = 0; r < nq; ++r) {
      p.lse[lse_offset(p, b, h, i0 + r)] = sem::softmax_lse(m[r], l[r], row_log2);
    }
  }
}
