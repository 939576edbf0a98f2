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

/// Packs query rows [i0, i0 + kBlockQ) of head h of sequence b (QueryTileLayout); rows past the
/// sequence are zero with LSE +inf, so they contribute nothing.
inline void pack_query_tile(const AttnProblem& p, long long b, long long h, long long i0, float* dst) {
  const QueryTileLayout t = query_tile_layout(p.d, p.dv);
  const int d = (int)p.d, dv = (int)p.dv;
  const int nq = (int)std::min<long long>(kBlockQ, seqlen_q(p, b) - i0);
  const float q_scale = score_params(p, b, h).q_scale;
  float *q_rows = dst + t.q_rows, *q_t = dst + t.q_t, *do_rows = dst + t.do_rows, *do_t = dst + t.do_t;
  float* o_row = do_t;  // one O row at a time, until dO^T is written
  for (int r = 0; r < kBlockQ; ++r) {
    float* q_r = q_rows + r * t.q_ld;
    float* do_r = do_rows + r * t.do_ld;
    if (r >= nq) {
      std::fill(q_r, q_r + t.q_ld, 0.0f);
      std::fill(do_r, do_r + t.do_ld, 0.0f);
      dst[t.lse2 + r] = -kNegInf;
      dst[t.delta + r] = 0.0f;
      continue;
    }
    const long long i = i0 + r;
    load_row(p.q.ptr, p.in_type, q_offset(p, p.q, b, i, h), d, (int)t.q_ld, 1.0f, q_r);
    load_row(p.dout.ptr, p.out_type, q_offset(p, p.dout, b, i, h), dv, (int)t.do_ld, 1.0f, do_r);
    load_row(p.o.ptr, p.out_type, q_offset(p, p.o, b, i, h), dv, dv, 1.0f, o_row);
    float delta = 0.0f;
    for (int c = 0; c < dv; ++c) delta = madd(do_r[c], o_row[c], delta);
    const float lse = p.lse[lse_offset(p, b, h, i)];
    dst[t.lse2 + r] = lse == kNegInf ? -kNegInf : lse * sem::kLog2e;
    dst[t.delta + r] = delta;
  }
  for (int c = 0; c < d; ++c) {
    for (int r = 0; r < kBlockQ; ++r) q_t[c * kBlockQ + r] = q_scale * q_rows[r * t.q_ld + c];
  }
  for (int c = 0; c < dv; ++c) {
    for (int r = 0; r < kBlockQ; ++r) do_t[c * kBlockQ + r] = do_rows[r * t.do_ld + c];
  }
}

/// Runs key block `blk` over every query tile that sees it (all query heads of its kv head).
inline void backward_block(const AttnProblem& p, const BackwardShared& shared, const KeyBlock& blk,
                           float* scratch, float* dq_acc) {
  const long long b = blk.b, hk = blk.hk, j0 = blk.j0;
  const long long sq = seqlen_q(p, b), sk = seqlen_k(p, b);
  const int nk = (int)std::min<long long>(kBlockK, sk - j0);
  const int d = (int)p.d, dv = (int)p.dv;
  const int d_pad = (int)pad_to(d, W), dv_pad = (int)pad_to(dv, W);
  const long long tile = (long long)kBlockK * kBlockQ;
  const QueryTileLayout qt = query_tile_layout(p.d, p.dv);

  Bump mem{scratch};
  float* k_blk = mem.take((long long)kBlockK * d_pad);    // (kBlockK, d_pad)
  float* v_blk = mem.take((long long)kBlockK * dv_pad);   // (kBlockK, dv_pad)
  float* dk_acc = mem.take((long long)kBlockK * d_pad);   // (kBlockK, d_pad)
  float* dv_acc = mem.take((long long)kBlockK * dv_pad);  // (kBlockK, dv_pad)
  float* p_t = mem.take(tile);                            // (kBlockK, kBlockQ): S^T, then P^T
  float* dp_t = mem.take(tile);                           // dP^T, then dS^T
  float* th_t = mem.take(tile);                           // tanh of the softcapped scores
  float* z_t = mem.take(tile);                            // dropout factors, then the dropped P^T
  int* lo = mem.take_int(kBlockQ);
  int* hi = mem.take_int(kBlockQ);

  pack_kv_rows(p, b, hk, j0, j0 + nk, k_blk, d_pad, v_blk, dv_pad);
  std::fill(dk_acc, dk_acc + (long long)kBlockK * d_pad, 0.0f);
  std::fill(dv_acc, dv_acc + (long long)kBlockK * dv_pad, 0.0f);

  // Queries that see at least one key of the block.
  const sem::Range seen = sem::seeing_queries(j0, j0 + nk, sq, sk, p.window_left, p.window_right);
  const long long i_lo = seen.lo, i_hi = seen.hi;
  const bool softcap = p.softcap > 0.0f, dropout = p.dropout_p > 0.0f;
  const long long n_tiles = (sq + kBlockQ - 1) / kBlockQ;
  const sem::Range heads = group_heads(p, hk);

  for (long long h = heads.lo; h < heads.hi; ++h) {
    const ScoreParams sp = score_params(p, b, h);
    for (long long t = i_lo / kBlockQ; t * kBlockQ < i_hi; ++t) {
      const long long i0 = t * kBlockQ;
      const int nq = (int)std::min<long long>(kBlockQ, sq - i0);
      const float* q_tile = shared.tiles + blk.tiles + ((h - heads.lo) * n_tiles + t) * qt.floats;
      const float* lse2 = q_tile + qt.lse2;
      row_ranges(p, i0, nq, sq, sk, lo, hi);

      // Recompute P^T = exp2(t - lse2) from S^T = K Q^T.
      gemm(p_t, kBlockQ, nk, kBlockQ / W, k_blk, d_pad, 1, q_tile + qt.q_t, kBlockQ, d, nullptr,
           Store::overwrite);
      if (sp.transform)
        transform_scores(sp, p_t, softcap ? th_t : nullptr, nk, j0, sem::diagonal(i0, sq, sk));
      if (!tile_fully_visible(lo, hi, nq, j0, nk)) mask_scores(p_t, nk, j0, lo, hi);
      for (int j = 0; j < nk; ++j) {
        float* p_j = p_t + (long long)j * kBlockQ;
        for (int r = 0; r < kBlockQ; ++r) p_j[r] = exp2_neg(p_j[r] - lse2[r]);
      }

      // dP^T = V dO^T, then dS^T in place; z_t becomes the dropped P^T.
      gemm(dp_t, kBlockQ, nk, kBlockQ / W, v_blk, dv_pad, 1, q_tile + qt.do_t, kBlockQ, dv, nullptr,
           Store::overwrite);
      if (dropout) {
        std::fill(z_t, z_t + tile, 1.0f);
        dropout_scale(p, b, h, i0, j0, nk, z_t);
      }
      const float* delta = q_tile + qt.delta;
      if (dropout && softcap) score_grads<true, true>(p_t, dp_t, z_t, th_t, delta, nk);
      if (dropout && !softcap) score_grads<true, false>(p_t, dp_t, z_t, th_t, delta, nk);
      if (!dropout && softcap) score_grads<false, true>(p_t, dp_t, z_t, th_t, delta, nk);
      if (!dropout && !softcap) score_grads<false, false>(p_t, dp_t, z_t, th_t, delta, nk);

      // dV += P_dropped^T dO, dK += dS^T Q (A(r = key, k = query)); dQ += dS K (A(r = query, k = key)).
      const float* p_used = dropout ? z_t : p_t;
      gemm(dv_acc, dv_pad, nk, dv_pad / W, p_used, kBlockQ, 1, q_tile + qt.do_rows, qt.do_ld, nq, nullptr,
           Store::accumulate);
      gemm(dk_acc, d_pad, nk, d_pad / W, dp_t, kBlockQ, 1, q_tile + qt.q_rows, qt.q_ld, nq, nullptr,
           Store::accumulate);
      float* dq_rows = dq_acc + (h * shared.rows + query_row(p, b, i0)) * shared.dq_ld;
      gemm(dq_rows, shared.dq_ld, nq, d_pad / W, dp_t, 1, kBlockQ, k_blk, d_pad, nk, nullptr,
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
