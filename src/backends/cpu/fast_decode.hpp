// The fast decode kernel: a few query tokens per sequence (decoding, speculative decoding) against a long
// K/V cache. The query tile's rows are the GQA group's query heads (times the few query positions) of
// one kv head, so each K/V row is read from memory, and widened to fp32, once for the whole group
// instead of once per query head in a 64-row tile that is mostly padding. Items of few rows (one token
// of a GQA group) carry several kv heads and take each panel of keys head by head, so the panel's
// cache rows (a token's kv heads lie side by side) are read in memory order. The kernel reads paged
// caches page by page (runs of rows within a page), never gathering the cache. (Software prefetching
// of the next panel was measured on the 2-core dev machine, ahead by a panel or by 8-32 rows: no gain
// over the hardware's.)
//
// Scores are kept transposed (keys x ld columns, ld = the item's rows padded to whole vectors) like
// fast_forward.hpp's, so the softmax statistics are vectors across the rows. O = alpha * O + P V is the
// shared GEMM micro-kernel (a P element broadcast against a vector of V channels); S^T = K Q^T is too
// for items of more than W / 2 rows (a K element broadcast against a vector of rows), while smaller
// ones take dot_scores (below), which wastes no lanes on padding rows. fp32 caches are read in place
// where a panel is one run of rows; bf16 caches of those small items too (dot_scores_bf16, pv_bf16:
// widened in registers), other bf16 and f16 panels are widened once into fp32 rows.
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

/// The column max of fast_forward.hpp's online softmax for a score tile of `ld` columns (nk x ld); the
/// update itself is fast_forward.hpp's online_softmax_rows.
inline void decode_column_max(const float* s, int nk, int ld, const float* m, float* m_new) {
  for (int r = 0; r < ld; ++r) m_new[r] = m[r];
  for (int j = 0; j < nk; ++j) {
    const float* s_j = s + j * ld;
    for (int r = 0; r < ld; ++r) m_new[r] = s_j[r] > m_new[r] ? s_j[r] : m_new[r];
  }
}

/// Scores of few rows without wasted lanes. S^T = K Q^T on the GEMM micro-kernel broadcasts one K
/// element against a vector of the item's rows: with 4 rows (GQA 4:1, one token) 12 of AVX-512's 16
/// lanes multiply padding, and the broadcasts make it load-bound (7 loads per 6 FMAs). Here lanes run
/// along the channels instead: each of W accumulators holds one (key, row) dot product's partial sums
/// (W / R keys x R rows, R a power of two <= W / 2), and one transposing reduction (fold_lanes) turns
/// the W accumulators into one vector of W scores.
///
/// One fold level: z's lanes [b * 2H, b * 2H + H) = x's block b (2H lanes) folded in half, the next H
/// lanes the same of y. log2(W) levels reduce W vectors to one; kFoldOrder is its lane -> input order.
template <int H>
struct FoldMasks {
  typedef int ivec_t __attribute__((vector_size(W * sizeof(int))));
  ivec_t first, second;
  FoldMasks() {
    for (int l = 0; l < W; ++l) {
      const int block = l / (2 * H) * (2 * H), pos = l % (2 * H);
      const int src = pos < H ? block + pos : W + block + pos - H;  // lane of x, or W + lane of y
      first[l] = src;
      second[l] = src + H;
    }
  }
};
/// Lane l of the result is lane mask[l] of the concatenation (x, y): GCC's two-vector __builtin_shuffle.
/// clang (only the fuzzing build uses it) has no variable-mask form; it gets the lane loop.
template <class Mask>
FAST_INLINE vec_t shuffle2(vec_t x, vec_t y, const Mask& mask) {
#if defined(__clang__)
  vec_t r;
  for (int l = 0; l < W; ++l) r[l] = mask[l] < W ? x[mask[l]] : y[mask[l] - W];
  return r;
#else
  return __builtin_shuffle(x, y, mask);
#endif
}
template <int H, int N>
FAST_INLINE void fold_lanes(vec_t* v) {
  static const FoldMasks<H> m;
  for (int i = 0; i < N / 2; ++i)
    v[i] = shuffle2(v[2 * i], v[2 * i + 1], m.first) + shuffle2(v[2 * i], v[2 * i + 1], m.second);
  if constexpr (H > 1) fold_lanes<H / 2, N / 2>(v);
}
/// Lane l of the folded vector sums input vector kFoldOrder[l]: each level interleaves the blocks of
/// its pair (x.b0, y.b0, x.b1, y.b1, ...), which makes the order a bit reversal.
inline constexpr std::array<int, W> kFoldOrder = [] {
  std::array<int, W> order{};
  for (int l = 0; l < W; ++l) {
    int rev = 0;
    for (int bit = 1, out = W / 2; bit < W; bit <<= 1, out >>= 1) rev |= (l & bit) ? out : 0;
    order[l] = rev;
  }
  return order;
}();

/// S^T[j][r] (row stride ld) = q_r . k_j for panel keys [0, nk) and rows [0, R): q rows (R x q_ld) and
/// K rows (k_ld apart) zero-padded to whole vectors of channels, d_pad of them. Reads K rows up to the
/// next multiple of W / R keys (kDecodeKeys is one).
template <int R>
__attribute__((optimize("fp-contract=fast"))) void dot_scores(float* s, int ld, int nk, const float* k_rows,
                                                              long long k_ld, const float* q, int q_ld,
                                                              int d_pad) {
  constexpr int NK = W / R;
  for (int j0 = 0; j0 < nk; j0 += NK) {
    vec_t acc[W] = {};  // acc[k * R + r]: key j0 + k, row r
    for (int c = 0; c < d_pad; c += W) {
      vec_t kv[NK], qv[R];
#pragma GCC unroll 16
      for (int k = 0; k < NK; ++k) kv[k] = vload(k_rows + (long long)(j0 + k) * k_ld + c);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) qv[r] = vload(q + (long long)r * q_ld + c);
#pragma GCC unroll 16
      for (int k = 0; k < NK; ++k) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[k * R + r] += kv[k] * qv[r];
      }
    }
    fold_lanes<W / 2, W>(acc);
    for (int l = 0; l < W; ++l) {
      const int k = kFoldOrder[l] / R, r = kFoldOrder[l] % R;
      if (j0 + k < nk) s[(j0 + k) * ld + r] = acc[0][l];
    }
  }
}
using DotScoresFn = void (*)(float*, int, int, const float*, long long, const float*, int, int);
/// dot_scores for R = 1, 2, 4, ... W / 2, indexed by log2(R).
template <size_t... I>
constexpr std::array<DotScoresFn, sizeof...(I)> make_dot_scores(std::index_sequence<I...>) {
  return {&dot_scores<(1 << I)>...};
}
inline constexpr std::array<DotScoresFn, std::bit_width((unsigned)W) - 1> kDotScores =
    make_dot_scores(std::make_index_sequence<std::bit_width((unsigned)W) - 1>{});

// bf16 caches read in place: a vector of W 32-bit lanes holds 2W bf16 channels, and the shift trick
// widens it in registers (lane l's low half, channel 2l, is `x << 16`; its high half, channel 2l + 1,
// `x & 0xffff0000`), so no panel is widened into memory. Channels are then visited as blocks of 2W,
// each split into its W even and W odd channels: Q rows and the O accumulators are kept in that order
// (bf16_lane), K and V rows as stored. The products and the fp32 sums are those of widened rows.
typedef uint32_t uvec_t __attribute__((vector_size(W * sizeof(uint32_t))));
FAST_INLINE void widen_bf16(const uint16_t* src, vec_t& even, vec_t& odd) {
  uvec_t u;
  std::memcpy(&u, src, sizeof u);
  even = (vec_t)(u << 16);
  odd = (vec_t)(u & 0xffff0000u);
}
/// Where channel c lives in a row kept in the even/odd block order.
inline int bf16_lane(int c) {
  const int pos = c % (2 * W);
  return c - pos + (pos % 2) * W + pos / 2;
}

/// dot_scores on bf16 K rows (k_ld elements apart) and Q rows in the even/odd order; d a multiple of
/// 2W.
template <int R>
__attribute__((optimize("fp-contract=fast"))) void dot_scores_bf16(float* s, int ld, int nk,
                                                                   const uint16_t* k_rows, long long k_ld,
                                                                   const float* q, int q_ld, int d) {
  constexpr int NK = W / R;
  for (int j0 = 0; j0 < nk; j0 += NK) {
    vec_t acc[W] = {};  // acc[k * R + r]: key j0 + k, row r
    for (int c = 0; c < d; c += 2 * W) {
      vec_t ke[NK], ko[NK];
#pragma GCC unroll 16
      for (int k = 0; k < NK; ++k) widen_bf16(k_rows + (long long)(j0 + k) * k_ld + c, ke[k], ko[k]);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const vec_t qe = vload(q + (long long)r * q_ld + c), qo = vload(q + (long long)r * q_ld + c + W);
#pragma GCC unroll 16
        for (int k = 0; k < NK; ++k) {
          acc[k * R + r] += ke[k] * qe;
          acc[k * R + r] += ko[k] * qo;
        }
      }
    }
    fold_lanes<W / 2, W>(acc);
    for (int l = 0; l < W; ++l) {
      const int k = kFoldOrder[l] / R, r = kFoldOrder[l] % R;
      if (j0 + k < nk) s[(j0 + k) * ld + r] = acc[0][l];
    }
  }
}

/// O rows (o_ld apart, even/odd order) += P V over channels [c0, c0 + 2W * CB) for keys [0, nk):
/// P^T[j][r] = p[j * ld + r], bf16 V rows v_ld elements apart. The R x 2CB accumulators stay in
/// registers across the keys.
template <int R, int CB>
__attribute__((optimize("fp-contract=fast"))) void pv_bf16(float* o, int o_ld, const float* p, int ld, int nk,
                                                           const uint16_t* v_rows, long long v_ld, int c0) {
  vec_t acc[R][2 * CB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < 2 * CB; ++v) acc[r][v] = vload(o + (long long)r * o_ld + c0 + v * W);
  }
  for (int j = 0; j < nk; ++j) {
    vec_t vv[2 * CB];
#pragma GCC unroll 16
    for (int cb = 0; cb < CB; ++cb)
      widen_bf16(v_rows + j * v_ld + c0 + cb * 2 * W, vv[2 * cb], vv[2 * cb + 1]);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vec_t p_r = p[j * ld + r] - vec_t{};  // broadcast
#pragma GCC unroll 16
      for (int v = 0; v < 2 * CB; ++v) acc[r][v] += p_r * vv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < 2 * CB; ++v) vstore(o + (long long)r * o_ld + c0 + v * W, acc[r][v]);
  }
}
/// pv_bf16 over all dv channels (a multiple of 2W) in keys of 16 (their V rows stay in L1 while each
/// chunk of channels passes over them): R * 2CB accumulators, about half the register file.
template <int R>
void pv_bf16_rows(float* o, int o_ld, const float* p, int ld, int nk, const uint16_t* v_rows, long long v_ld,
                  int dv) {
  constexpr int CB = std::min(4, std::max(1, (W >= 16 ? 8 : 4) / R)), kKeys = 16;
  for (int j0 = 0; j0 < nk; j0 += kKeys) {
    const int n = std::min(kKeys, nk - j0);
    const float* p_j = p + j0 * ld;
    const uint16_t* v_j = v_rows + j0 * v_ld;
    int c0 = 0;
    for (; c0 + 2 * W * CB <= dv; c0 += 2 * W * CB) pv_bf16<R, CB>(o, o_ld, p_j, ld, n, v_j, v_ld, c0);
    for (; c0 < dv; c0 += 2 * W) pv_bf16<R, 1>(o, o_ld, p_j, ld, n, v_j, v_ld, c0);
  }
}
using DotScoresBf16Fn = void (*)(float*, int, int, const uint16_t*, long long, const float*, int, int);
using PvBf16Fn = void (*)(float*, int, const float*, int, int, const uint16_t*, long long, int);
template <size_t... I>
constexpr std::array<DotScoresBf16Fn, sizeof...(I)> make_dot_scores_bf16(std::index_sequence<I...>) {
  return {&dot_scores_bf16<(1 << I)>...};
}
template <size_t... I>
constexpr std::array<PvBf16Fn, sizeof...(I)> make_pv_bf16(std::index_sequence<I...>) {
  return {&pv_bf16_rows<(1 << I)>...};
}
/// Indexed by log2(R), R = 1 ... W / 2 as kDotScores.
inline constexpr std::array<DotScoresBf16Fn, std::bit_width((unsigned)W) - 1> kDotScoresBf16 =
    make_dot_scores_bf16(std::make_index_sequence<std::bit_width((unsigned)W) - 1>{});
inline constexpr std::array<PvBf16Fn, std::bit_width((unsigned)W) - 1> kPvBf16 =
    make_pv_bf16(std::make_index_sequence<std::bit_width((unsigned)W) - 1>{});

/// Copies bf16 keys [j0, j1) of one operand (n channels) as stored into dst + (j - j0) * n, for panels
/// that are not one run; keys whose page or cache row is out of range read as zeros.
inline void copy_keys_bf16(const AttnProblem& p, const Operand& t, long long b, long long hk, long long j0,
                           long long j1, int n, uint16_t* dst) {
  for (long long j = j0; j < j1;) {
    const KeyRun run = key_run(p, t, b, hk, j, j1);
    for (long long r = 0; r < run.n; ++r) {
      uint16_t* row = dst + (j - j0 + r) * n;
      if (run.offset < 0) {
        std::fill(row, row + n, (uint16_t)0);
      } else {
        std::memcpy(row, static_cast<const uint16_t*>(t.ptr) + run.offset + r * t.row_stride,
                    n * sizeof *row);
      }
    }
    j += run.n;
  }
}

/// Decode item `blk` (DecodeBlock in fast_common.hpp): its rows over keys [j0, j1). Writes O and the
/// LSE, or with `blk.partial` the split's normalised O and LSE for the merge.
inline void decode_block(const AttnProblem& p, const DecodeBlock& blk, float* scratch) {
  const long long b = blk.b, sq = seqlen_q(p, b), sk = seqlen_k(p, b);
  const int rows = (int)blk.rows, ld = (int)pad_to(rows, W), heads = (int)blk.heads;
  const int d = (int)p.d, dv = (int)p.dv, d_pad = (int)pad_to(d, W), dv_pad = (int)pad_to(dv, W);
  // q_scale and the softcap are the same for every head; the ALiBi slope is per row.
  const ScoreParams sp = score_params(p, b, decode_row(p, blk.hk, blk.row0).h);

  Bump mem{scratch};
  // Few rows (a power of two <= W / 2 after padding) take dot_scores on Q rows; the others the GEMM
  // on Q^T.
  const int rows_pow2 = (int)std::bit_ceil((unsigned)rows);
  const bool dot = rows_pow2 <= W / 2;
  const int keys_per_dot = dot ? W / rows_pow2 : 1;
  // bf16 caches with whole 2W-channel blocks take dot_scores_bf16 and pv_bf16 on the stored rows.
  const bool bf16 = dot && p.in_type == kBF16 && d % (2 * W) == 0 && dv % (2 * W) == 0;
  const bool in_place = (p.in_type == kF32 && d == d_pad && dv == dv_pad) || bf16;
  // Per head (the item's kv heads hk + h, h < heads; decode_head_floats bounds their sum): Q, the O
  // accumulators, the softmax statistics and the rows' key ranges. The panels are shared.
  const long long q_n = dot ? (long long)rows_pow2 * d_pad : (long long)d_pad * ld;
  const long long o_n = (long long)std::max(rows, dot ? rows_pow2 : 0) * dv_pad;
  float* q_all = mem.take(heads * q_n);  // (d_pad, ld): q_scale * Q^T, or (rows_pow2, d_pad) Q
  float* o_all = mem.take(heads * o_n);  // (rows, dv_pad): unnormalised O
  float* m_all = mem.take(heads * ld);
  float* l_all = mem.take(heads * ld);
  float* slope_all = mem.take(heads * ld);  // ALiBi slope * log2(e) per row
  int* lo_all = mem.take_int(heads * ld);
  int* hi_all = mem.take_int(heads * ld);
  int* diag_all = mem.take_int(heads * ld);
  float* k_pan = mem.take((long long)kDecodeKeys * d_pad);   // (kDecodeKeys, d_pad)
  float* v_pan = mem.take((long long)kDecodeKeys * dv_pad);  // (kDecodeKeys, dv_pad)
  float* s_tile = mem.take((long long)kDecodeKeys * ld);     // (kDecodeKeys, ld): S^T, then P^T
  float* row_buf = mem.take(std::max(d_pad, dv_pad));
  float* alpha = mem.take(ld);
  float* m_new = mem.take(ld);
  struct Head {
    long long hk;
    float *q_t, *o_acc, *m, *l, *slope;
    int *lo, *hi, *diag;
  };
  const auto head = [&](int h) {
    return Head{blk.hk + h,         q_all + h * q_n, o_all + h * o_n, m_all + h * ld,   l_all + h * ld,
                slope_all + h * ld, lo_all + h * ld, hi_all + h * ld, diag_all + h * ld};
  };

  // Q^T, the rows' visible key ranges (sem::visible_keys), diagonals and slopes. Padding columns
  // have zero Q and see every key, so they never need a mask; their results are dropped.
  std::fill(q_all, q_all + heads * q_n, 0.0f);
  std::fill(m_all, m_all + heads * ld, kNegInf);
  std::fill(l_all, l_all + heads * ld, 0.0f);
  std::fill(o_all, o_all + heads * o_n, 0.0f);
  for (int h = 0; h < heads; ++h) {
    const auto [hk, q_t, o_acc, m, l, slope, lo, hi, diag] = head(h);
    for (int r = 0; r < ld; ++r) {
      lo[r] = 0, hi[r] = (int)sk, diag[r] = 0, slope[r] = 0.0f;
      if (r >= rows) continue;
      const DecodeRow row = decode_row(p, hk, blk.row0 + r);
      load_row(p.q.ptr, p.in_type, q_offset(p, p.q, b, row.i, row.h), d, d, sp.q_scale, row_buf);
      for (int c = 0; c < d; ++c) {
        q_t[dot ? (long long)r * d_pad + (bf16 ? bf16_lane(c) : c) : (long long)c * ld + r] = row_buf[c];
      }
      const sem::KeyRange kr = sem::visible_keys(row.i, sq, sk, p.window_left, p.window_right);
      lo[r] = (int)kr.lo, hi[r] = (int)kr.hi;
      diag[r] = (int)sem::diagonal(row.i, sq, sk);
      slope[r] = alibi_slope(p, b, row.h) * sem::kLog2e;
    }
  }
  // dot_scores writes columns [0, rows_pow2) only: the others stay finite (their results are dropped).
  std::fill(s_tile, s_tile + (long long)kDecodeKeys * ld, 0.0f);

  const int panel = heads > 1 ? kDecodeHeadKeys : kDecodeKeys;
  for (long long j0 = blk.j0; j0 < blk.j1; j0 += panel) {
    const int nk = (int)std::min<long long>(panel, blk.j1 - j0);
    for (int h = 0; h < heads; ++h) {
      const auto [hk, q_t, o_acc, m, l, slope, lo, hi, diag] = head(h);
      // The panel's K and V rows, widened once for every row of the item. fp32 rows that need no padding are
      // read where they lie when the panel is one run (dense caches, pages of >= kDecodeKeys tokens) and
      // whole groups of dot_scores' keys (it reads up to the next group's end); the others are widened
      // (copied) into the panel.
      const float* k_rows = k_pan;
      const float* v_rows = v_pan;
      const uint16_t* k_bf16 = reinterpret_cast<const uint16_t*>(k_pan);
      const uint16_t* v_bf16 = reinterpret_cast<const uint16_t*>(v_pan);
      long long k_ld = d_pad, v_ld = dv_pad;
      const KeyRun k_run = in_place ? key_run(p, p.k, b, hk, j0, j0 + nk) : KeyRun{-1, 0};
      const KeyRun v_run = in_place ? key_run(p, p.v, b, hk, j0, j0 + nk) : KeyRun{-1, 0};
      if (k_run.n == nk && k_run.offset >= 0 && v_run.offset >= 0 && nk % keys_per_dot == 0) {
        k_ld = p.k.row_stride, v_ld = p.v.row_stride;
        if (bf16) {
          k_bf16 = static_cast<const uint16_t*>(p.k.ptr) + k_run.offset;
          v_bf16 = static_cast<const uint16_t*>(p.v.ptr) + v_run.offset;
        } else {
          k_rows = static_cast<const float*>(p.k.ptr) + k_run.offset;
          v_rows = static_cast<const float*>(p.v.ptr) + v_run.offset;
        }
      } else if (bf16) {
        // Copied as stored (no widening); the keys up to dot_scores' next group read as zeros.
        uint16_t* k_dst = reinterpret_cast<uint16_t*>(k_pan);
        copy_keys_bf16(p, p.k, b, hk, j0, j0 + nk, d, k_dst);
        std::fill(k_dst + (long long)nk * d, k_dst + pad_to(nk, keys_per_dot) * d, (uint16_t)0);
        copy_keys_bf16(p, p.v, b, hk, j0, j0 + nk, dv, reinterpret_cast<uint16_t*>(v_pan));
        k_ld = d, v_ld = dv;
      } else {
        widen_keys(p, p.k, b, hk, j0, j0 + nk, d, d_pad, k_pan, d_pad);
        widen_keys(p, p.v, b, hk, j0, j0 + nk, dv, dv_pad, v_pan, dv_pad);
      }
      // S^T = K Q^T. A panel every row sees whole with no score transform takes its column max in the
      // micro-kernel's epilogue; the others after the transform and the mask.
      bool visible = true;
      for (int r = 0; r < rows; ++r) visible = visible && lo[r] <= j0 && hi[r] >= j0 + nk;
      const bool plain = visible && !sp.transform && !dot;
      std::copy(m, m + ld, m_new);
      if (bf16) {
        kDotScoresBf16[std::bit_width((unsigned)rows_pow2) - 1](s_tile, ld, nk, k_bf16, k_ld, q_t, d_pad, d);
      } else if (dot) {
        kDotScores[std::bit_width((unsigned)rows_pow2) - 1](s_tile, ld, nk, k_rows, k_ld, q_t, d_pad, d_pad);
      } else {
        gemm(s_tile, ld, nk, ld / W, k_rows, k_ld, 1, q_t, ld, d, m_new,
             plain ? Store::overwrite_max : Store::overwrite);
      }
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
      online_softmax_rows<kDecodeRows>(s_tile, nk, ld, m_new, m, l, alpha);
      // O = alpha * O + P V; A(r = row, k = key) = P^T[key][row].
      if (bf16) {
        for (int r = 0; r < rows_pow2; ++r) {
          float* o_r = o_acc + (long long)r * dv_pad;
          for (int c = 0; c < dv; ++c) o_r[c] *= alpha[r];
        }
        kPvBf16[std::bit_width((unsigned)rows_pow2) - 1](o_acc, dv_pad, s_tile, ld, nk, v_bf16, v_ld, dv);
        continue;
      }
      gemm(o_acc, dv_pad, rows, dv_pad / W, s_tile, 1, ld, v_rows, v_ld, nk, alpha, Store::rescale);
    }
  }

  // Finalise: O / l and LSE = ln(2) * (m + log2 l); rows that saw no key get 0 and -inf. A split
  // writes the same into its partial state, which the merge combines with sem::lse_weight.
  for (int h = 0; h < heads; ++h) {
    const auto [hk, q_t, o_acc, m, l, slope, lo, hi, diag] = head(h);
    float* partial = blk.partial ? blk.partial + h * blk.rows * (dv + 1) : nullptr;
    for (int r = 0; r < rows; ++r) {
      const float inv_l = sem::softmax_norm(l[r]);
      const float lse = sem::softmax_lse(m[r], l[r], row_log2);
      const float* o_r = o_acc + (long long)r * dv_pad;
      if (bf16) {  // back from the even/odd order
        for (int c = 0; c < dv; ++c) row_buf[c] = o_r[bf16_lane(c)];
        o_r = row_buf;
      }
      if (partial) {
        for (int c = 0; c < dv; ++c) partial[(long long)r * dv + c] = o_r[c] * inv_l;
        partial[blk.rows * dv + r] = lse;
        continue;
      }
      const DecodeRow row = decode_row(p, hk, blk.row0 + r);
      store_row(p.o.ptr, p.out_type, q_offset(p, p.o, b, row.i, row.h), dv, inv_l, o_r);
      if (p.lse) p.lse[lse_offset(p, b, row.h, row.i)] = lse;
    }
  }
}
