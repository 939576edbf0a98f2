// The fast forward of one query tile: FlashAttention-2's online softmax over key tiles, scores kept
// transposed (keys x queries) so every softmax statistic is a vector across the tile's queries.
//
// Textual include after fast_simd.hpp (see there): compiled once per ISA.

/// Online-softmax update of the running max `m` and sum `l` (log2 units) with a tile of scores
/// (nk x ld, ld <= kMaxRows), which it turns into probabilities. `m_new` holds the tile's column max
/// merged with `m` on entry. `alpha` receives the factor the accumulated output rows must be rescaled
/// by. Rows with no visible key so far keep m = -inf, l = 0 and get alpha = 0 and P = 0 (the max used
/// for the exponent is 0 there, so no inf - inf). The decode kernel (fast_decode.hpp) calls it with its
/// own row count.
template <int kMaxRows>
inline void online_softmax_rows(float* s, int nk, int ld, const float* m_new, float* m, float* l,
                                float* alpha) {
  float m_use[kMaxRows], sum[kMaxRows];
  for (int r = 0; r < ld; ++r) {
    m_use[r] = sem::softmax_base(m_new[r]);
    alpha[r] = exp2_neg(m[r] - m_use[r]);
    m[r] = m_new[r];
    sum[r] = 0.0f;
  }
  for (int j = 0; j < nk; ++j) {
    float* s_j = s + j * ld;
    for (int r = 0; r < ld; ++r) {
      const float e = exp2_neg(s_j[r] - m_use[r]);
      s_j[r] = e;
      sum[r] += e;
    }
  }
  for (int r = 0; r < ld; ++r) l[r] = madd(l[r], alpha[r], sum[r]);
}
/// The query tile's update (kBlockQ columns, a compile-time count after inlining).
inline void online_softmax(float* s, int nk, const float* m_new, float* m, float* l, float* alpha) {
  online_softmax_rows<kBlockQ>(s, nk, kBlockQ, m_new, m, l, alpha);
}

/// max(m, column max of the scores): the new running max of a tile that needed masking or a transform.
inline void column_max(const float* s, int nk, const float* m, float* m_new) {
  for (int r = 0; r < kBlockQ; ++r) m_new[r] = m[r];
  for (int j = 0; j < nk; ++j) {
    const float* s_j = s + j * kBlockQ;
    for (int r = 0; r < kBlockQ; ++r) m_new[r] = s_j[r] > m_new[r] ? s_j[r] : m_new[r];
  }
}

/// Widens K's keys [j0, j1) of kv head hk of sequence b to fp32 rows (through the block table when paged),
/// zero-padded to whole vectors: key j0 + n at k + n * k_ld.
inline void pack_k_rows(const AttnProblem& p, long long b, long long hk, long long j0, long long j1, float* k,
                        long long k_ld) {
  const int d = (int)p.d, d_pad = (int)pad_to(d, W);
  for (long long j = j0; j < j1; ++j)
    load_row(p.k.ptr, p.in_type, k_offset(p, p.k, b, j, hk), d, d_pad, 1.0f, k + (j - j0) * k_ld);
}

/// pack_k_rows, and V's rows the same way at v + n * v_ld.
inline void pack_kv_rows(const AttnProblem& p, long long b, long long hk, long long j0, long long j1,
                         float* k, long long k_ld, float* v, long long v_ld) {
  pack_k_rows(p, b, hk, j0, j1, k, k_ld);
  const int dv = (int)p.dv, dv_pad = (int)pad_to(dv, W);
  for (long long j = j0; j < j1; ++j)
    load_row(p.v.ptr, p.in_type, k_offset(p, p.v, b, j, hk), dv, dv_pad, 1.0f, v + (j - j0) * v_ld);
}

/// pack_k_rows, and V into column panels for P V's B operand: channel c of key j at
/// v + (c / kPanelW) * v_panel + (j - j0) * kPanelW + c % kPanelW, zero-padded to pad_to(dv, kPanelW)
/// channels. A micro-tile then reads its keys' V as one contiguous block instead of rows 4 * v_ld bytes
/// apart (AVX2 P V in the forward's context 83 -> 91 GFLOPS, AVX-512 125 -> 134, single-thread
/// micro-benchmark at d 128 over 2-4k keys).
inline void pack_kv_panels(const AttnProblem& p, long long b, long long hk, long long j0, long long j1,
                           float* k, long long k_ld, float* v, long long v_panel) {
  pack_k_rows(p, b, hk, j0, j1, k, k_ld);
  const int dv = (int)p.dv;
  for (long long j = j0; j < j1; ++j) {
    const long long v_row = k_offset(p, p.v, b, j, hk);
    for (int c0 = 0; c0 < dv; c0 += kPanelW) {
      load_row(p.v.ptr, p.in_type, v_row + c0, std::min(kPanelW, dv - c0), kPanelW, 1.0f,
               v + (c0 / kPanelW) * v_panel + (j - j0) * kPanelW);
    }
  }
}

/// The fp32 group layout: sk K rows of pad_to(d, kMaxVec) floats, then V as column panels of sk rows.
inline long long packed_floats(const AttnProblem& p, long long sk) {
  return sk * (pad_to(p.d, kMaxVec) + pad_to(p.dv, kPanelW));
}
inline void pack_kv(const AttnProblem& p, long long b, long long hk, long long j0, long long j1, long long sk,
                    float* group) {
  const long long k_ld = pad_to(p.d, kMaxVec);
  pack_kv_panels(p, b, hk, j0, j1, group + j0 * k_ld, k_ld, group + sk * k_ld + j0 * kPanelW, sk * kPanelW);
}

/// Runs query tile `blk` to completion: writes its output rows and (when requested) their LSE. K/V
/// come from `kv` (packed once per kv head) or, when null, are packed here tile by tile.
inline void forward_block(const AttnProblem& p, const QueryBlock& blk, const float* group, float* scratch) {
  const long long b = blk.b, h = blk.h, i0 = blk.i0;
  const long long sq = seqlen_q(p, b), sk = seqlen_k(p, b), hk = kv_head(p, h);
  const int nq = (int)std::min<long long>(kBlockQ, sq - i0);
  const int d = (int)p.d, dv = (int)p.dv;
  const int d_pad = (int)pad_to(d, W), dv_pad = (int)pad_to(dv, W);
  const ScoreParams sp = score_params(p, b, h);

  Bump mem{scratch};
  float* q_t = mem.take((long long)d_pad * kBlockQ);        // (d_pad, kBlockQ): q_scale * Q^T
  float* k_tile = mem.take((long long)kBlockK * d_pad);     // (kBlockK, d_pad) when packing per tile
  float* v_tile = mem.take(kBlockK * pad_to(dv, kPanelW));  // V panels of kBlockK rows
  float* s_tile = mem.take((long long)kBlockK * kBlockQ);   // (kBlockK, kBlockQ): S^T, then P^T
  float* o_acc = mem.take((long long)kBlockQ * dv_pad);     // (kBlockQ, dv_pad): unnormalised O
  float* q_rows = mem.take((long long)kBlockQ * d);         // (kBlockQ, d)
  float* m = mem.take(kBlockQ);
  float* l = mem.take(kBlockQ);
  float* alpha = mem.take(kBlockQ);
  float* m_new = mem.take(kBlockQ);
  int* lo = mem.take_int(kBlockQ);
  int* hi = mem.take_int(kBlockQ);

  // Load Q: all rows first (independent loads, so their cache misses overlap), then transposed so a
  // score column (one query) is a vector lane; padded rows are zero.
  for (int r = 0; r < nq; ++r) {
    load_row(p.q.ptr, p.in_type, q_offset(p, p.q, b, i0 + r, h), d, d, sp.q_scale, q_rows + (long long)r * d);
  }
  std::fill(q_rows + (long long)nq * d, q_rows + (long long)kBlockQ * d, 0.0f);
  for (int c = 0; c < d; ++c) {
    for (int r = 0; r < kBlockQ; ++r) q_t[c * kBlockQ + r] = q_rows[(long long)r * d + c];
  }

  // Key span of the tile: union of the rows' visible ranges.
  row_ranges(p, i0, nq, sq, sk, lo, hi);
  const sem::KeyRange span = sem::tile_keys(i0, i0 + nq, sq, sk, p.window_left, p.window_right);
  const long long span_lo = span.lo, span_hi = span.hi;  // no tile when empty

  std::fill(m, m + kBlockQ, kNegInf);
  std::fill(l, l + kBlockQ, 0.0f);
  std::fill(o_acc, o_acc + (long long)kBlockQ * dv_pad, 0.0f);
  const long long diag0 = sem::diagonal(i0, sq, sk);

  for (long long j0 = span_lo; j0 < span_hi; j0 += kBlockK) {
    const int nk = (int)std::min<long long>(kBlockK, span_hi - j0);
    // Produce K/V: the group's packed rows, or this tile widened now.
    const long long k_ld = group ? pad_to(d, kMaxVec) : d_pad, v_panel = (group ? sk : kBlockK) * kPanelW;
    const float* k_rows = group ? group + j0 * k_ld : k_tile;
    const float* v_panels = group ? group + sk * k_ld + j0 * kPanelW : v_tile;
    if (!group) pack_kv_panels(p, b, hk, j0, j0 + nk, k_tile, d_pad, v_tile, v_panel);
    // S^T = K Q^T (keys x queries). A tile with neither mask nor transform takes its column max in
    // the micro-kernel's epilogue; the others after masking.
    const bool plain = !sp.transform && tile_fully_visible(lo, hi, nq, j0, nk);
    std::copy(m, m + kBlockQ, m_new);
    gemm(s_tile, kBlockQ, nk, kBlockQ / W, k_rows, k_ld, 1, q_t, kBlockQ, d, m_new,
         plain ? Store::overwrite_max : Store::overwrite);
    if (!plain) {
      if (sp.transform) transform_scores(sp, s_tile, nullptr, nk, j0, diag0);
      if (!tile_fully_visible(lo, hi, nq, j0, nk)) mask_scores(s_tile, nk, j0, lo, hi);
      column_max(s_tile, nk, m, m_new);
    }
    online_softmax(s_tile, nk, m_new, m, l, alpha);
    if (p.dropout_p > 0.0f) dropout_scale(p, b, h, i0, j0, nk, s_tile);
    // O = alpha * O + P V; A(r = query, k = key) = P^T[key][query].
    gemm(o_acc, dv_pad, nq, dv_pad / W, s_tile, 1, kBlockQ, v_panels, kPanelW, nk, alpha, Store::rescale,
         v_panel);
  }

  // Finalise: O / l and LSE = ln(2) * (m + log2 l); rows that saw no key get 0 and -inf.
  for (int r = 0; r < nq; ++r) {
    const long long i = i0 + r;
    store_row(p.o.ptr, p.out_type, q_offset(p, p.o, b, i, h), dv, sem::softmax_norm(l[r]),
              o_acc + (long long)r * dv_pad);
    if (p.lse) p.lse[lse_offset(p, b, h, i)] = sem::softmax_lse(m[r], l[r], row_log2);
  }
}
