// The attention semantics of SPEC.md written once, for the CPU reference, the CPU fast path and every
// GPU kernel. Self-contained: no standard or toolkit header under NVRTC/hipRTC, so the JIT can embed it.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FP_HD __host__ __device__ __forceinline__
#else
#define FP_HD inline
#endif

#if !defined(__CUDACC_RTC__) && !defined(__HIPCC_RTC__)
#include <cmath>
#endif

namespace flashport::sem {

using u32 = unsigned int;
using u64 = unsigned long long;
using i64 = long long;

inline constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = exp2(x * kLog2e)
inline constexpr float kLn2 = 0.6931471805599453f;    // ln(2): log(x) = log2(x) * kLn2
inline constexpr float kNegInf = -__builtin_bit_cast(float, 0x7f800000u);  // NVRTC lacks __builtin_huge_valf

// ---------------------------------------------------------------------------------------------
// Scores: scale, softcap, ALiBi, mask (SPEC steps 1-4). Positions are 0-based within a sequence.

/// Softcap (step 2); `cap <= 0` means off. Templated so the reference runs it in double.
template <class T>
FP_HD T softcap(T s, T cap) {
  return cap > T(0) ? cap * tanh(s / cap) : s;
}

/// d softcap(s) / ds expressed through the capped value t = cap * tanh(s / cap).
template <class T>
FP_HD T softcap_grad(T capped, T cap) {
  if (cap <= T(0)) return T(1);
  const T th = capped / cap;
  return T(1) - th * th;
}

/// Query i's diagonal key: queries align to the bottom-right corner when sq != sk.
FP_HD i64 diagonal(i64 i, i64 sq, i64 sk) {
  return i + sk - sq;
}

/// The ALiBi distance |diag - j| of key j from a query's diagonal key (step 3). Templated on the index
/// type: tiled paths pass tile-relative positions in 32 bits (|diag - j| < 2^30: the host bounds
/// sequence lengths).
template <class I>
FP_HD I alibi_distance(I diag, I j) {
  I dist = diag - j;
  if (dist < 0) dist = -dist;
  return dist;
}

/// ALiBi bias (step 3): -slope * |i + sk - sq - j|. Tiled paths subtract slope * alibi_distance.
template <class T>
FP_HD T alibi_bias(T slope, i64 i, i64 j, i64 sq, i64 sk) {
  return -slope * T(alibi_distance(diagonal(i, sq, sk), j));
}

/// A half-open range [lo, hi) of positions (keys, queries or tiles); empty when lo >= hi.
struct Range {
  i64 lo, hi;
};
using KeyRange = Range;

/// The visible key range of one query row (step 4), as a half-open [lo, hi) clamped to [0, sk).
/// `wl`/`wr` < 0 mean unbounded. Empty when lo >= hi.
FP_HD KeyRange visible_keys(i64 i, i64 sq, i64 sk, i64 wl, i64 wr) {
  const i64 r = diagonal(i, sq, sk);
  i64 lo = wl < 0 ? 0 : r - wl;
  i64 hi = wr < 0 ? sk : r + wr + 1;
  if (lo < 0) lo = 0;
  if (hi > sk) hi = sk;
  return {lo, hi};
}
FP_HD bool is_visible(i64 i, i64 j, i64 sq, i64 sk, i64 wl, i64 wr) {
  const KeyRange kr = visible_keys(i, sq, sk, wl, wr);
  return j >= kr.lo && j < kr.hi;
}

// Tile ranges: the loops of the tiled paths visit only the tiles these name. Each is exact (not a
// superset) with respect to is_visible; tests/cpu/test_tile_ranges.cpp checks that by brute force.

/// The keys seen by some query of rows [i0, i1) (i0 < i1): the union of their visible_keys. One range:
/// lo and hi are non-decreasing in the row and step by at most one, so non-empty row ranges overlap or
/// touch, and an empty first or last row has the union's bound (0 or sk). Empty when no row sees a key.
FP_HD KeyRange tile_keys(i64 i0, i64 i1, i64 sq, i64 sk, i64 wl, i64 wr) {
  const KeyRange first = visible_keys(i0, sq, sk, wl, wr);
  const KeyRange last = visible_keys(i1 - 1, sq, sk, wl, wr);
  return {first.lo, last.hi > first.lo ? last.hi : first.lo};
}

/// The keys seen by every query of rows [i0, i1) (i0 < i1): the intersection of their visible_keys,
/// where a key tile needs no per-element mask. lo and hi are non-decreasing in the row, so the last row
/// bounds lo and the first bounds hi; empty (lo >= hi) when the rows share no key. hi <= sk, so a tile
/// reaching past the keys never counts as inside.
FP_HD KeyRange keys_seen_by_all(i64 i0, i64 i1, i64 sq, i64 sk, i64 wl, i64 wr) {
  return {visible_keys(i1 - 1, sq, sk, wl, wr).lo, visible_keys(i0, sq, sk, wl, wr).hi};
}

/// Whether [lo, hi) lies inside range r (written lo-bound first, as the kernels test it).
template <class I>
FP_HD bool contains(Range r, I lo, I hi) {
  return r.lo <= lo && hi <= r.hi;
}

/// The queries that see some key of [j0, j1) (0 <= j0 < j1 <= sk), clamped to [0, sq]: visible_keys
/// inverted, query i sees key j iff diagonal(i) - wl <= j <= diagonal(i) + wr.
FP_HD Range seeing_queries(i64 j0, i64 j1, i64 sq, i64 sk, i64 wl, i64 wr) {
  const i64 shift = sk - sq;
  i64 lo = wr < 0 ? 0 : j0 - wr - shift;
  i64 hi = wl < 0 ? sq : j1 + wl - shift;
  lo = lo < 0 ? 0 : lo > sq ? sq : lo;
  hi = hi < 0 ? 0 : hi > sq ? sq : hi;
  return {lo, hi};
}

/// The tiles of `tile` positions that hold some position of [lo, hi) (lo >= 0): [lo / tile,
/// ceil(hi / tile)), empty at lo / tile when [lo, hi) is. Templated on the index type so 32-bit kernel
/// code stays 32-bit.
template <class I>
struct Tiles {
  I begin, end;
};
template <class I>
FP_HD Tiles<I> covering_tiles(I lo, I hi, I tile) {
  const I begin = lo / tile;
  return {begin, hi > lo ? (hi + tile - 1) / tile : begin};
}

// ---------------------------------------------------------------------------------------------
// Dropout (step 6): Philox4x32-10, Random123's constants.

struct Philox4 {
  u32 x[4];
};

FP_HD void mulhilo32(u32 a, u32 b, u32& hi, u32& lo) {
  const u64 p = (u64)a * (u64)b;
  hi = (u32)(p >> 32);
  lo = (u32)p;
}

/// Philox4x32 with 10 rounds over counter `c` and key (k0, k1).
FP_HD Philox4 philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
#if !defined(__CUDACC__) && !defined(__HIPCC__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10  // unrolled, the CPU fast path's loop over a tile's rows vectorises (AVX-512)
#endif
  for (int round = 0; round < 10; ++round) {
    u32 hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c0, hi0, lo0);
    mulhilo32(0xCD9E8D57u, c2, hi1, lo1);
    const u32 n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// Keep iff word >= floor(p * 2^32) (integer compare): the threshold for a dropout probability.
FP_HD u32 dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : (u32)t;
}

/// Dropout's factor on a kept probability, 1 / (1 - p) (SPEC step 6), in fp32 on every backend; 1 without
/// dropout (p <= 0).
FP_HD float dropout_keep_scale(float p) {
  return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
}

/// The four Philox words that hold keys 4*(j/4) .. 4*(j/4)+3 of row i of head (b_idx * hq + h).
FP_HD Philox4 dropout_words(u64 seed, u32 offset, i64 i, i64 j, i64 b_idx, i64 hq, i64 h) {
  return philox4x32_10((u32)(j >> 2), (u32)i, (u32)(b_idx * hq + h), offset, (u32)seed, (u32)(seed >> 32));
}

/// Word k (0..3) of a Philox output, by selects: an index into the array would put it in scratch
/// memory on AMD GPUs (the CDNA backward had 24 bytes of it per lane).
FP_HD u32 philox_word(const Philox4& w, int k) {
  return k == 0 ? w.x[0] : k == 1 ? w.x[1] : k == 2 ? w.x[2] : w.x[3];
}

/// Whether key j of query i survives dropout.
FP_HD bool dropout_keep(u64 seed, u32 offset, u32 threshold, i64 i, i64 j, i64 b_idx, i64 hq, i64 h) {
  const Philox4 w = dropout_words(seed, offset, i, j, b_idx, hq, h);
  return philox_word(w, (int)(j & 3)) >= threshold;
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding (KV-cache append). `cos`/`sin` rows are (rotary_dim / 2) long.

/// The partner channel of channel c (< rotary_dim) and the sign it enters with:
/// out[c] = x[c] * cos[k] + sign * x[partner] * sin[k], k the frequency index returned.
struct RotaryTap {
  int partner, freq;
  float sign;
};
FP_HD RotaryTap rotary_tap(int c, int rotary_dim, bool interleaved) {
  const int half = rotary_dim / 2;
  if (interleaved) return {c ^ 1, c >> 1, (c & 1) ? 1.0f : -1.0f};  // GPT-J pairs (0,1),(2,3)
  return c < half ? RotaryTap{c + half, c, -1.0f} : RotaryTap{c - half, c - half, 1.0f};  // NeoX halves
}

/// Channel c (< rotary_dim) of one row rotated: x[c] * cos[k] + sign * x[partner] * sin[k] in fp32, each
/// operation rounded on its own (no FMA contraction: the CPU and every kernel give the same bits).
/// `x(channel)`, `cos(k)` and `sin(k)` load fp32 values of the row and of the position's table rows.
template <class X, class Cos, class Sin>
FP_HD float rotary_channel(int c, int rotary_dim, bool interleaved, X&& x, Cos&& cos, Sin&& sin) {
  const RotaryTap tap = rotary_tap(c, rotary_dim, interleaved);
  const float cos_v = cos(tap.freq), sin_v = sin(tap.freq);
  const float xc = x(c), xp = x(tap.partner);
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(xc, cos_v), __fmul_rn(tap.sign * xp, sin_v));
#else
  return xc * cos_v + tap.sign * xp * sin_v;  // host builds are ISO C++: no contraction
#endif
}

// ---------------------------------------------------------------------------------------------
// The online softmax's row conventions, shared by every forward (CPU tiles and decode, CUDA portable
// and Hopper, CDNA). Scores enter in the log2 domain (times log2 e); a row keeps its running max m and
// sum l of 2^(s - m). A row that has seen no visible key has m = -inf and l = 0, and must end as O = 0,
// LSE = -inf (SPEC: fully masked rows give 0, not NaN).

/// The exponent base for a row's probabilities 2^(s - base): its running max, or 0 while that is
/// -inf, so masked scores give 2^(-inf - 0) = 0 and an old max of -inf rescales by 2^(-inf) = 0
/// instead of NaN from -inf - (-inf).
FP_HD float softmax_base(float m) {
  return m == kNegInf ? 0.0f : m;
}

/// The factor that normalises a finished row's output: 1 / l, or 0 for a row without visible keys.
FP_HD float softmax_norm(float l) {
  return l > 0.0f ? 1.0f / l : 0.0f;
}

/// A finished row's natural-log LSE, (m + log2 l) * ln 2, or -inf for a row without visible keys.
/// `log2` is the backend's log2 (a fast approximation where its accuracy suffices).
template <class Log2>
FP_HD float softmax_lse(float m, float l, Log2&& log2) {
  return l > 0.0f ? (m + log2(l)) * kLn2 : kNegInf;
}

// ---------------------------------------------------------------------------------------------
// Merging partial softmax states (split-KV, merge_states, the online softmax itself).

/// Weight of a partial state with log-sum-exp `lse` against the merged maximum `m`; -inf gives 0
/// without producing NaN even when m is -inf too.
template <class T>
FP_HD T lse_weight(T lse, T m) {
  return lse == T(kNegInf) ? T(0) : exp(lse - m);
}

}  // namespace flashport::sem
