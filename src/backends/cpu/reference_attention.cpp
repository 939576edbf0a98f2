// The CPU reference attention (SPEC.md literally, fp64) and the same-precision baseline: forward and
// backward.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/elem.hpp"
#include "backends/cpu/reference.hpp"

namespace flashport::cpu::ref {
namespace {

/// Widening load in the working precision: fp64 for the reference, fp32 for the baseline.
template <class T>
T load(const void* base, int type, long long off) {
  if constexpr (sizeof(T) == sizeof(double)) {
    return load_f64(base, type, off);
  } else {
    return load_f32(base, type, off);
  }
}

/// The keys and values of one (sequence, kv head), widened once: k (n, d), v (n, dv).
template <class T>
struct KvSlab {
  long long n = 0;
  std::vector<T> k, v;

  void load_from(const AttnProblem& p, long long b, long long hk) {
    n = seqlen_k(p, b);
    k.assign((size_t)(n * p.d), T(0));
    v.assign((size_t)(n * p.dv), T(0));
    for (long long j = 0; j < n; ++j) {
      const long long k_off = k_offset(p, p.k, b, j, hk), v_off = k_offset(p, p.v, b, j, hk);
      for (long long c = 0; c < p.d; ++c) k[(size_t)(j * p.d + c)] = load<T>(p.k.ptr, p.in_type, k_off + c);
      for (long long c = 0; c < p.dv; ++c) v[(size_t)(j * p.dv + c)] = load<T>(p.v.ptr, p.in_type, v_off + c);
    }
  }
};

/// Constants of one (sequence, query head): lengths and the score/output factors (fp8 descales folded in).
template <class T>
struct Head {
  long long b, h, hk, sq, sk;
  T scale, slope, v_scale;
};

template <class T>
Head<T> head_of(const AttnProblem& p, long long b, long long h) {
  const long long hk = kv_head(p, h);
  return {b,
          h,
          hk,
          seqlen_q(p, b),
          seqlen_k(p, b),
          T(p.scale) * T(descale(p, 0, b, hk)) * T(descale(p, 1, b, hk)),
          T(alibi_slope(p, b, h)),
          T(descale(p, 2, b, hk))};
}

/// Query row i of head h, widened: (width,).
template <class T>
void load_query_row(const AttnProblem& p, const Operand& t, int type, long long width, long long b,
                    long long i, long long h, std::vector<T>& row) {
  const long long off = q_offset(p, t, b, i, h);
  row.resize((size_t)width);
  for (long long c = 0; c < width; ++c) row[(size_t)c] = load<T>(t.ptr, type, off + c);
}

/// Raw dot products q . k_j for the visible keys [kr.lo, kr.hi) into dot[j - kr.lo].
template <class T>
void row_dots(const AttnProblem& p, const KvSlab<T>& slab, const std::vector<T>& q, sem::KeyRange kr,
              T* dot) {
  for (long long j = kr.lo; j < kr.hi; ++j) {
    const T* k_row = &slab.k[(size_t)(j * p.d)];
    T acc = T(0);
    for (long long c = 0; c < p.d; ++c) acc += q[(size_t)c] * k_row[c];
    dot[j - kr.lo] = acc;
  }
}

/// Softmax in place over n >= 1 finite scores; returns the natural-log LSE.
template <class T>
T softmax_inplace(T* s, long long n) {
  const T m = *std::max_element(s, s + n);
  T sum = T(0);
  for (long long j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  for (long long j = 0; j < n; ++j) s[j] /= sum;
  return m + std::log(sum);
}

/// Dropout factor Z_ij = M_ij / (1 - p) of key j for query i of head (b, h); 1 without dropout.
template <class T>
T dropout_factor(const AttnProblem& p, long long b, long long h, long long i, long long j) {
  if (p.dropout_p <= 0.0f) return T(1);
  if (!sem::dropout_keep(p.seed, p.offset, p.dropout_threshold, i, j, b, p.hq, h)) return T(0);
  return T(1) / (T(1) - T(p.dropout_p));
}

/// Debug probabilities of one row: P, negated where dropped; zero elsewhere (buffer pre-zeroed).
void write_dmask_row(const AttnProblem& p, long long b, long long h, long long i, sem::KeyRange kr,
                     const double* prob) {
  float* row = p.s_dmask + ((b * p.hq + h) * p.sq + i) * p.sk;
  for (long long j = kr.lo; j < kr.hi; ++j) {
    const float v = (float)prob[j - kr.lo];
    row[j] = dropout_factor<double>(p, b, h, i, j) == 0.0 ? -v : v;
  }
}

/// Scratch of one thread's forward rows, sized for the longest key range.
template <class T>
struct RowScratch {
  std::vector<T> q, s, acc;
  std::vector<double> prob;
  RowScratch(long long n_keys, long long dv)
      : s((size_t)n_keys + 1), acc((size_t)dv), prob((size_t)n_keys + 1) {}
};

/// Forward of query row i of head hd over its (sequence, kv head) slab. `round` is the baseline's
/// rounding of scores and P to the input dtype; for fp8 inputs (docs/SPEC.md, "where the contract is
/// silent") scores to bf16 and P to the input dtype relative to 2^8 times the row's largest, as an fp8
/// P V consumes it.
template <class T>
void forward_row(const AttnProblem& p, const KvSlab<T>& slab, const Head<T>& hd, long long i, bool round,
                 RowScratch<T>& sc) {
  const long long b = hd.b, h = hd.h;
  const sem::KeyRange kr = sem::visible_keys(i, hd.sq, hd.sk, p.window_left, p.window_right);
  const long long n = kr.hi - kr.lo;
  std::fill(sc.acc.begin(), sc.acc.end(), T(0));
  T lse = T(sem::kNegInf);
  const bool fp8 = round && is_fp8_elem(p.in_type);
  if (n > 0) {
    T* s = sc.s.data();
    load_query_row<T>(p, p.q, p.in_type, p.d, b, i, h, sc.q);
    row_dots<T>(p, slab, sc.q, kr, s);
    for (long long j = kr.lo; j < kr.hi; ++j) {
      const T x = score<T>(p, s[j - kr.lo], hd.scale, hd.slope, i, j, hd.sq, hd.sk);
      s[j - kr.lo] = round ? T(round_to(fp8 ? kBF16 : p.in_type, x)) : x;
    }
    lse = softmax_inplace<T>(s, n);
    // fp8: P * p_up is 256 at the row's largest probability (1 / sum of the exponentials, by construction).
    const T p_up = fp8 ? T(256) / *std::max_element(s, s + n) : T(1);
    for (long long j = kr.lo; j < kr.hi; ++j) {
      const T pj = round ? T(round_to(p.in_type, s[j - kr.lo] * p_up)) / p_up : s[j - kr.lo];
      sc.prob[(size_t)(j - kr.lo)] = (double)pj;
      const T pz = pj * dropout_factor<T>(p, b, h, i, j);
      if (pz == T(0)) continue;
      const T* v_row = &slab.v[(size_t)(j * p.dv)];
      for (long long c = 0; c < p.dv; ++c) sc.acc[(size_t)c] += pz * v_row[c];
    }
    if (p.s_dmask) write_dmask_row(p, b, h, i, kr, sc.prob.data());
  }
  const long long o_off = q_offset(p, p.o, b, i, h);
  for (long long c = 0; c < p.dv; ++c)
    store(p.o.ptr, p.out_type, o_off + c, (double)(sc.acc[(size_t)c] * hd.v_scale));
  if (p.lse) p.lse[lse_offset(p, b, h, i)] = (float)lse;
}

/// Rows are independent, so they run in parallel over the (query head, row) pairs of each slab; the
/// result does not depend on the thread count.
template <class T>
void forward_all(const AttnProblem& p, bool round) {
  if (p.s_dmask) std::memset(p.s_dmask, 0, sizeof(float) * (size_t)(p.batch * p.hq * p.sq * p.sk));
  const long long group = gqa_group(p);
  KvSlab<T> slab;
  for (long long b = 0; b < p.batch; ++b) {
    const long long sq = seqlen_q(p, b), rows = group * sq;
    if (rows == 0) continue;
    for (long long hk = 0; hk < p.hk; ++hk) {
      slab.load_from(p, b, hk);
      const long long work = rows * (slab.n + 1) * (p.d + p.dv);
#pragma omp parallel if (work > (1 << 16))
      {
        RowScratch<T> scratch(slab.n, p.dv);
#pragma omp for schedule(dynamic, 4)
        for (long long r = 0; r < rows; ++r)
          forward_row<T>(p, slab, head_of<T>(p, b, group_head(hk, group, r / sq)), r % sq, round, scratch);
      }
    }
  }
}

/// Backward over the query heads of kv head hk in sequence b: dQ rows of those heads, and dK/dV of
/// the kv head summed over them (one task owns them, so the result is deterministic).
void backward_kv_head(const AttnProblem& p, long long b, long long hk) {
  KvSlab<double> slab;
  slab.load_from(p, b, hk);
  const long long n_keys = slab.n;
  const sem::Range heads = group_heads(p, hk);
  std::vector<double> dk((size_t)(n_keys * p.d), 0.0), dv((size_t)(n_keys * p.dv), 0.0);
  std::vector<double> q, dout, dq((size_t)p.d), dot((size_t)n_keys + 1), prob((size_t)n_keys + 1),
      z((size_t)n_keys + 1), ds((size_t)n_keys + 1);
  const double cap = p.softcap;
  for (long long h = heads.lo; h < heads.hi; ++h) {
    const Head<double> hd = head_of<double>(p, b, h);
    for (long long i = 0; i < hd.sq; ++i) {
      const sem::KeyRange kr = sem::visible_keys(i, hd.sq, hd.sk, p.window_left, p.window_right);
      const long long n = kr.hi - kr.lo;
      std::fill(dq.begin(), dq.end(), 0.0);
      if (n > 0) {
        load_query_row<double>(p, p.q, p.in_type, p.d, b, i, h, q);
        load_query_row<double>(p, p.dout, p.out_type, p.dv, b, i, h, dout);
        row_dots<double>(p, slab, q, kr, dot.data());
        for (long long jj = 0; jj < n; ++jj)
          prob[(size_t)jj] =
              score<double>(p, dot[(size_t)jj], hd.scale, hd.slope, i, kr.lo + jj, hd.sq, hd.sk);
        softmax_inplace<double>(prob.data(), n);
        // dP_j = Z_j dO . (v_scale V_j); D = sum_j P_j dP_j; dS_j = P_j (dP_j - D) through the softcap.
        double d_row = 0.0;
        for (long long jj = 0; jj < n; ++jj) {
          const long long j = kr.lo + jj;
          z[(size_t)jj] = dropout_factor<double>(p, b, h, i, j);
          const double* v_row = &slab.v[(size_t)(j * p.dv)];
          double dp = 0.0;
          for (long long c = 0; c < p.dv; ++c) dp += dout[(size_t)c] * v_row[c];
          ds[(size_t)jj] = z[(size_t)jj] * hd.v_scale * dp;
          d_row += prob[(size_t)jj] * ds[(size_t)jj];
        }
        for (long long jj = 0; jj < n; ++jj) {
          const long long j = kr.lo + jj;
          const double capped = sem::softcap(hd.scale * dot[(size_t)jj], cap);
          const double g =
              prob[(size_t)jj] * (ds[(size_t)jj] - d_row) * sem::softcap_grad(capped, cap) * hd.scale;
          const double* k_row = &slab.k[(size_t)(j * p.d)];
          double* dk_row = &dk[(size_t)(j * p.d)];
          for (long long c = 0; c < p.d; ++c) {
            dq[(size_t)c] += g * k_row[c];
            dk_row[c] += g * q[(size_t)c];
          }
          const double pz = prob[(size_t)jj] * z[(size_t)jj] * hd.v_scale;
          double* dv_row = &dv[(size_t)(j * p.dv)];
          for (long long c = 0; c < p.dv; ++c) dv_row[c] += pz * dout[(size_t)c];
        }
      }
      const long long dq_off = q_offset(p, p.grad_q, b, i, h);
      for (long long c = 0; c < p.d; ++c) store(p.grad_q.ptr, grad_type(p), dq_off + c, dq[(size_t)c]);
    }
  }
  for (long long j = 0; j < key_rows(p, b); ++j) {
    const bool used = j < n_keys;
    const long long dk_off = k_offset(p, p.grad_k, b, j, hk), dv_off = k_offset(p, p.grad_v, b, j, hk);
    for (long long c = 0; c < p.d; ++c)
      store(p.grad_k.ptr, grad_type(p), dk_off + c, used ? dk[(size_t)(j * p.d + c)] : 0.0);
    for (long long c = 0; c < p.dv; ++c)
      store(p.grad_v.ptr, grad_type(p), dv_off + c, used ? dv[(size_t)(j * p.dv + c)] : 0.0);
  }
}

}  // namespace

void forward(const AttnProblem& p, bool baseline) {
  if (baseline) {
    forward_all<float>(p, true);
  } else {
    forward_all<double>(p, false);
  }
}

void backward(const AttnProblem& p) {
  const long long tasks = p.batch * p.hk;
#pragma omp parallel for schedule(dynamic, 1)
  for (long long t = 0; t < tasks; ++t) backward_kv_head(p, t / p.hk, t % p.hk);
}

}  // namespace flashport::cpu::ref
