// The fast backward of one key block: FlashAttention-2's backward with P recomputed from the LSE.
// The block owns its dK/dV rows; dQ contributions go into the calling thread's fp32 accumulator.
//
// Textual include after fast_simd.hpp (see there): compiled once per ISA.

/// dS = P * (dP - D) (times d softcap / dx), in place over dP (keys x kBlockQ). With dropout, `z`
/// holds the dropout factors on entry (dP of the dropped P is the upstream dP times z) and the
/// dropped probabilities P * z on exit (what dV needs).
template <bool kDropout, bool kSoftcap>
inline void score_grads(const float* p_t, float* dp_t, float* z, const float* th, const float* delta,
                        int nk) {
  for (int j = 0; j < nk; ++j) {
    const long long o = (long long)j * kBlockQ;
    for (int r = 0; r < kBlockQ; ++r) {
      const float prob = p_t[o + r];
      const float dprob = kDropout ? dp_t[o + r] * z[o + r] : dp_t[o + r];
      float ds = prob * (dprob - delta[r]);
      if constexpr (kSoftcap) ds *= 1.0f - th[o + r] * th[o + r];
      dp_t[o + r] = ds;
      if constexpr (kDropout) z[o + r] = prob * z[o + r];
    }
  }
}

/// Loads query rows [i0, i0 + nq) of head h: Q both row-major (for dK) and transposed and scaled (for
/// S^T), dO both ways, and the rows' LSE (log2 units; +inf for rows that saw no key, so P = 0) and D.
struct QueryTileBuffers {
  float *q_rows, *q_t, *do_rows, *do_t, *lse2, *delta, *row;
};
inline void load_query_tile(const AttnProblem& p, const BackwardShared& shared, long long b, long long h,
                            long long i0, int nq, const ScoreParams& sp, const QueryTileBuffers& t) {
  const int d = (int)p.d, dv = (int)p.dv;
  const int d_pad = (int)pad_to(d, W), dv_pad = (int)pad_to(dv, W);
  for (int r = 0; r < kBlockQ; ++r) {
    float* q_r = t.q_rows + (long long)r * d_pad;
    float* do_r = t.do_rows + (long long)r * dv_pad;
    if (r < nq) {
      const long long i = i0 + r;
      load_row(p.q.ptr, p.in_type, q_offset(p, p.q, b, i, h), d, d_pad, 1.0f, q_r);
      load_row(p.dout.ptr, p.out_type, q_offset(p, p.dout, b, i, h), dv, dv_pad, 1.0f, do_r);
      const float lse = p.lse[lse_offset(p, b, h, i)];
      t.lse2[r] = lse == kNegInf ? -kNegInf : lse * sem::kLog2e;
      t.delta[r] = shared.delta[query_row(p, b, i) * p.hq + h];
    } else {
      std::fill(q_r, q_r + d_pad, 0.0f);
      std::fill(do_r, do_r + dv_pad, 0.0f);
      t.lse2[r] = -kNegInf;
      t.delta[r] = 0.0f;
    }
    for (int c = 0; c < d; ++c) t.q_t[c * kBlockQ + r] = sp.q_scale * q_r[c];
    for (int c = 0; c < dv; ++c) t.do_t[c * kBlockQ + r] = do_r[c];
  }
}

/// Runs key block `blk` over every query that sees it (all query heads of its kv head).
inline void backward_block(const AttnProblem& p, const BackwardShared& shared, const KeyBlock& blk,
                           float* scratch, float* dq_acc) {
  const long long b = blk.b, hk = blk.hk, j0 = blk.j0;
  const long long sq = seqlen_q(p, b), sk = seqlen_k(p, b);
  const int nk = (int)std::min<long long>(kBlockK, sk - j0);
  const int d = (int)p.d, dv = (int)p.dv;
  const int d_pad = (int)pad_to(d, W), dv_pad = (int)pad_to(dv, W);
  const long long tile = (long long)kBlockK * kBlockQ;

  Bump mem{scratch};
  float* k_blk = mem.take((long long)kBlockK * d_pad);    // (kBlockK, d_pad)
  float* v_blk = mem.take((long long)kBlockK * dv_pad);   // (kBlockK, dv_pad)
  float* dk_acc = mem.take((long long)kBlockK * d_pad);   // (kBlockK, d_pad)
  float* dv_acc = mem.take((long long)kBlockK * dv_pad);  // (kBlockK, dv_pad)
  QueryTileBuffers qt;
  qt.q_rows = mem.take((long long)kBlockQ * d_pad);    // (kBlockQ, d_pad)
  qt.q_t = mem.take((long long)d_pad * kBlockQ);       // (d_pad, kBlockQ)
  qt.do_rows = mem.take((long long)kBlockQ * dv_pad);  // (kBlockQ, dv_pad)
  qt.do_t = mem.take((long long)dv_pad * kBlockQ);     // (dv_pad, kBlockQ)
  float* p_t = mem.take(tile);                         // (kBlockK, kBlockQ): S^T, then P^T
  float* dp_t = mem.take(tile);                        // dP^T, then dS^T
  float* th_t = mem.take(tile);                        // tanh of the softcapped scores
  float* z_t = mem.take(tile);                         // dropout factors, then the dropped P^T
  qt.row = mem.take(std::max(d_pad, dv_pad));
  qt.lse2 = mem.take(kBlockQ);
  qt.delta = mem.take(kBlockQ);
  int* lo = mem.take_int(kBlockQ);
  int* hi = mem.take_int(kBlockQ);

  for (int j = 0; j < kBlockK; ++j) {
    float* k_j = k_blk + (long long)j * d_pad;
    float* v_j = v_blk + (long long)j * dv_pad;
    if (j < nk) {
      load_row(p.k.ptr, p.in_type, k_offset(p, p.k, b, j0 + j, hk), d, d_pad, 1.0f, k_j);
      load_row(p.v.ptr, p.in_type, k_offset(p, p.v, b, j0 + j, hk), dv, dv_pad, 1.0f, v_j);
    } else {
      std::fill(k_j, k_j + d_pad, 0.0f);
      std::fill(v_j, v_j + dv_pad, 0.0f);
    }
  }
  std::fill(dk_acc, dk_acc + (long long)kBlockK * d_pad, 0.0f);
  std::fill(dv_acc, dv_acc + (long long)kBlockK * dv_pad, 0.0f);

  // Queries that see at least one key of the block: i + sk - sq + wr >= j0 and i + sk - sq - wl < j1.
  const long long off = sk - sq, j1 = j0 + nk;
  const long long i_lo = p.window_right < 0 ? 0 : std::max(0LL, j0 - off - p.window_right);
  const long long i_hi = p.window_left < 0 ? sq : std::min(sq, j1 - off + p.window_left);
  const bool softcap = p.softcap > 0.0f, dropout = p.dropout_p > 0.0f;
  const long long group = p.hq / p.hk;

  for (long long h = hk * group; h < (hk + 1) * group; ++h) {
    const ScoreParams sp = score_params(p, b, h);
    for (long long i0 = i_lo; i0 < i_hi; i0 += kBlockQ) {
      const int nq = (int)std::min<long long>(kBlockQ, i_hi - i0);
      load_query_tile(p, shared, b, h, i0, nq, sp, qt);
      row_ranges(p, i0, nq, sq, sk, lo, hi);

      // Recompute P^T = exp2(t - lse2) from S^T = K Q^T.
      gemm(p_t, kBlockQ, nk, kBlockQ / W, k_blk, d_pad, 1, qt.q_t, kBlockQ, d, nullptr, Store::overwrite);
      if (sp.transform)
        transform_scores(sp, p_t, softcap ? th_t : nullptr, nk, j0, sem::diagonal(i0, sq, sk));
      if (!tile_fully_visible(lo, hi, nq, j0, nk)) mask_scores(p_t, nk, j0, lo, hi);
      for (int j = 0; j < nk; ++j) {
        float* p_j = p_t + (long long)j * kBlockQ;
        for (int r = 0; r < kBlockQ; ++r) p_j[r] = exp2_neg(p_j[r] - qt.lse2[r]);
      }

      // dP^T = V dO^T, then dS^T in place; z_t becomes the dropped P^T.
      gemm(dp_t, kBlockQ, nk, kBlockQ / W, v_blk, dv_pad, 1, qt.do_t, kBlockQ, dv, nullptr, Store::overwrite);
      if (dropout) {
        std::fill(z_t, z_t + tile, 1.0f);
        dropout_scale(p, b, h, i0, nq, j0, nk, z_t);
      }
      if (dropout && softcap) score_grads<true, true>(p_t, dp_t, z_t, th_t, qt.delta, nk);
      if (dropout && !softcap) score_grads<true, false>(p_t, dp_t, z_t, th_t, qt.delta, nk);
      if (!dropout && softcap) score_grads<false, true>(p_t, dp_t, z_t, th_t, qt.delta, nk);
      if (!dropout && !softcap) score_grads<false, false>(p_t, dp_t, z_t, th_t, qt.delta, nk);

      // dV += P_dropped^T dO, dK += dS^T Q (A(r = key, k = query)); dQ += dS K (A(r = query, k = key)).
      const float* p_used = dropout ? z_t : p_t;
      gemm(dv_acc, dv_pad, nk, dv_pad / W, p_used, kBlockQ, 1, qt.do_rows, dv_pad, nq, nullptr,
           Store::accumulate);
      gemm(dk_acc, d_pad, nk, d_pad / W, dp_t, kBlockQ, 1, qt.q_rows, d_pad, nq, nullptr, Store::accumulate);
      float* dq_rows = dq_acc + (query_row(p, b, i0) * p.hq + h) * shared.dq_ld;
      gemm(dq_rows, p.hq * shared.dq_ld, nq, d_pad / W, dp_t, 1, kBlockQ, k_blk, d_pad, nk, nullptr,
           Store::accumulate);
    }
  }

  // dK carries the softmax scale (dS is the gradient of the scaled score).
  for (int j = 0; j < nk; ++j) {
    store_row(p.grad_k.ptr, p.in_type, k_offset(p, p.grad_k, b, j0 + j, hk), d, p.scale,
              dk_acc + (long long)j * d_pad);
    store_row(p.grad_v.ptr, p.in_type, k_offset(p, p.grad_v, b, j0 + j, hk), dv, 1.0f,
              dv_acc + (long long)j * dv_pad);
  }
}
