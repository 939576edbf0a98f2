// The fast decode kernel: a few query tokens per sequence (decoding, speculative decoding) against a long
// K/V cache. The query tile's rows are the GQA group's query heads (times the few query positions) of
// one kv head, so each K/V row is read from memory, and widened to fp32, once for the whole group
// instead of once per query head in a 64-row tile that is mostly padding. The kernel widens each panel
// of keys once into cache-resident fp32 rows and reads paged caches page by page (runs of rows within
// a page), never gathering the cache. (Software prefetching of the next panel was measured on the
// 2-core dev machine, ahead by a panel or by 8-32 rows: no gain over the hardware's.)
//
// Scores are kept transposed (keys x ld columns, ld = the item's rows padded to whole vectors) like
// fast_forward.hpp's, so the softmax statistics are vectors across the rows and both products are the
// shared GEMM micro-kernel: S^T = K Q^T (a K element broadcast against a vector of rows) and
// O = alpha * O + P V (a P element broadcast against a vector of V channels).
//
// Textual include after fast_simd.hpp (see there): compiled once per ISA.

/// The rows of a decode item: row r is query position r / group of query head r % group of the kv
/// head's group (the group's heads of one query position are adjacent, so a query position's rows
/// share their visible key range).
struct DecodeRow {
  long long i, h;
};
inline DecodeRow decode_row(const AttnProblem& p, long long hk, long long r) {
  const long long group = gqa_group(p);
  return {r / group, group_head(hk, group, r % group)};
}

/// Keys [j, j_end) of kv head hk of sequence b: the element offset of key j in `t` (-1 when its page
/// or cache row is out of range) and how many keys from j on lie `row_stride` apart. One run covers
/// the rest of a dense, varlen or batch-indexed cache; a paged cache's runs end at page boundaries.
struct KeyRun {
  long long offset, n;
};
inline KeyRun key_run(const AttnProblem& p, const Operand& t, long long b, long long hk, long long j,
                      long long j_end) {
  const long long offset = k_offset(p, t, b, j, hk);
  if (!p.block_table) return {offset, j_end - j};
  const long long token = p.leftpad_k ? j + p.leftpad_k[b] : j;  // k_offset's token
  return {offset, std::min(j_end - j, p.page_size - token % p.page_size)};
}

/// Widens keys [j0, j1) of one operand (K or V, n channels) to fp32 rows dst + (j - j0) * ld, zero-
/// padded to n_pad; keys whose page or cache row is out of range read as zeros.
inline void widen_keys(const AttnProblem& p, const Operand& t, long long b, long long hk, long long j0,
                       long long j1, int n, int n_pad, float* dst, long long ld) {
  for (long long j = j0; j < j1;) {
    const KeyRun run = key_run(p, t, b, hk, j, j1);
    for (long long r = 0; r < run.n; ++r) {
      float* row = dst + (j - j0 + r) * ld;
      if (run.offset < 0) {
        std::fill(row, row + n_pad, 0.0f);
      } else {
        load_row(t.ptr, p.in_type, run.offset + r * t.row_stride, n, n_pad, 1.0f, row);
      }
    }
    j += run.n;
  }
}

/// The online-softmax steps of fast_forward.hpp for a score tile of `ld` columns (nk x ld).
inline void decode_column_max(const float* s, int nk, int ld, const float* m, float* m_new) {
  for (int r = 0; r < ld; ++r) m_new[r] = m[r];
  for (int j = 0; j < nk; ++j) {
    const float* s_j = s + j * ld;
    for (int r = 0; r < ld; ++r) m_new[r] = s_j[r] > m_new[r] ? s_j[r] : m_new[r];
  }
}
inline void decode_online_softmax(float* s, int nk, int ld, const float* m_new, float* m, float* l,
                                  float* alpha) {
  float m_use[kDecodeRows], sum[kDecodeRows];
  for (int r = 0; r < ld; ++r) {
    m_use[r] = m_new[r] == kNegInf ? 0.0f : m_new[r];  // rows with no visible key yet: P = 0, no inf - inf
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

/// Decode item `blk` (DecodeBlock in fast_common.hpp): its rows over keys [j0, j1). Writes O and the
/// LSE, or with `blk.partial` the split's normalised O and LSE for the merge.
inline void decode_block(const AttnProblem& p, const DecodeBlock& blk, float* scratch) {
  const long long b = blk.b, hk = blk.hk, sq = seqlen_q(p, b), sk = seqlen_k(p, b);
  const int rows = (int)blk.rows, ld = (int)pad_to(rows, W);
  const int d = (int)p.d, dv = (int)p.dv, d_pad = (int)pad_to(d, W), dv_pad = (int)pad_to(dv, W);
  // q_scale and the softcap are the same for every head; the ALiBi slope is per row.
  const ScoreParams sp = score_params(p, b, decode_row(p, hk, blk.row0).h);

  Bump mem{scratch};
  float* q_t = mem.take((long long)d_pad * ld);              // (d_pad, ld): q_scale * Q^T
  float* k_pan = mem.take((long long)kDecodeKeys * d_pad);   // (kDecodeKeys, d_pad)
  float* v_pan = mem.take((long long)kDecodeKeys * dv_pad);  // (kDecodeKeys, dv_pad)
  float* s_tile = mem.take((long long)kDecodeKeys * ld);     // (kDecodeKeys, ld): S^T, then P^T
  float* o_acc = mem.take((long long)kDecodeRows * dv_pad);  // (rows, dv_pad): unnormalised O
  float* row_buf = mem.take(std::max(d_pad, dv_pad));
  float* m = mem.take(kDecodeRows);
  float* l = mem.take(kDecodeRows);
  float* alpha = mem.take(kDecodeRows);
  float* m_new = mem.take(kDecodeRows);
  float* slope = mem.take(kDecodeRows);  // ALiBi slope * log2(e) per row
  int* lo = mem.take_int(kDecodeRows);
  int* hi = mem.take_int(kDecodeRows);
  int* diag = mem.take_int(kDecodeRows);

  // Q^T, the rows' visible key ranges (sem::visible_keys), diagonals and slopes. Padding columns
  // have zero Q and see every key, so they never need a mask; their results are dropped.
  std::fill(q_t, q_t + (long long)d_pad * ld, 0.0f);
  for (int r = 0; r < ld; ++r) {
    lo[r] = 0, hi[r] = (int)sk, diag[r] = 0, slope[r] = 0.0f;
    if (r >= rows) continue;
    const DecodeRow row = decode_row(p, hk, blk.row0 + r);
    load_row(p.q.ptr, p.in_type, q_offset(p, p.q, b, row.i, row.h), d, d, sp.q_scale, row_buf);
    for (int c = 0; c < d; ++c) q_t[(long long)c * ld + r] = row_buf[c];
    const sem::KeyRange kr = sem::visible_keys(row.i, sq, sk, p.window_left, p.window_right);
    lo[r] = (int)kr.lo, hi[r] = (int)kr.hi;
    diag[r] = (int)sem::diagonal(row.i, sq, sk);
    slope[r] = alibi_slope(p, b, row.h) * sem::kLog2e;
  }
  std::fill(m, m + ld, kNegInf);
  std::fill(l, l + ld, 0.0f);
  std::fill(o_acc, o_acc + (long long)rows * dv_pad, 0.0f);

  for (long long j0 = blk.j0; j0 < blk.j1; j0 += kDecodeKeys) {
    const int nk = (int)std::min<long long>(kDecodeKeys, blk.j1 - j0);
    // The panel's K and V rows, widened once for every row of the item.
    widen_keys(p, p.k, b, hk, j0, j0 + nk, d, d_pad, k_pan, d_pad);
    widen_keys(p, p.v, b, hk, j0, j0 + nk, dv, dv_pad, v_pan, dv_pad);
    // S^T = K Q^T. A panel every row sees whole with no score transform takes its column max in the
    // micro-kernel's epilogue; the others after the transform and the mask.
    bool visible = true;
    for (int r = 0; r < rows; ++r) visible = visible && lo[r] <= j0 && hi[r] >= j0 + nk;
    const bool plain = visible && !sp.transform;
    std::copy(m, m + ld, m_new);
    gemm(s_tile, ld, nk, ld / W, k_pan, d_pad, 1, q_t, ld, d, m_new,
         plain ? Store::overwrite_max : Store::overwrite);
    if (!plain) {
      for (int j = 0; j < nk; ++j) {
        float* s_j = s_tile + j * ld;
        const int key = (int)(j0 + j);
        if (sp.cap_log2 > 0.0f) {
          for (int r = 0; r < ld; ++r) s_j[r] = sp.cap_log2 * tanh_fast(s_j[r]);
        }
        if (p.alibi) {
          for (int r = 0; r < ld; ++r) s_j[r] -= slope[r] * (float)sem::alibi_distance(diag[r], key);
        }
        if (!visible) {
          for (int r = 0; r < ld; ++r) s_j[r] = (key >= lo[r] && key < hi[r]) ? s_j[r] : kNegInf;
        }
      }
      decode_column_max(s_tile, nk, ld, m, m_new);
    }
    decode_online_softmax(s_tile, nk, ld, m_new, m, l, alpha);
    // O = alpha * O + P V; A(r = row, k = key) = P^T[key][row].
    gemm(o_acc, dv_pad, rows, dv_pad / W, s_tile, 1, ld, v_pan, dv_pad, nk, alpha, Store::rescale);
  }

  // Finalise: O / l and LSE = ln(2) * (m + log2 l); rows that saw no key get 0 and -inf. A split
  // writes the same into its partial state, which the merge combines with sem::lse_weight.
  for (int r = 0; r < rows; ++r) {
    const float inv_l = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const float lse = l[r] > 0.0f ? kLn2 * (m[r] + std::log2(l[r])) : kNegInf;
    const float* o_r = o_acc + (long long)r * dv_pad;
    if (blk.partial) {
      for (int c = 0; c < dv; ++c) blk.partial[(long long)r * dv + c] = o_r[c] * inv_l;
      blk.partial[blk.rows * dv + r] = lse;
      continue;
    }
    const DecodeRow row = decode_row(p, hk, blk.row0 + r);
    store_row(p.o.ptr, p.out_type, q_offset(p, p.o, b, row.i, row.h), dv, inv_l, o_r);
    if (p.lse) p.lse[lse_offset(p, b, row.h, row.i)] = lse;
  }
}
