// Per-ISA building blocks of the CPU fast path: vector math (exp2, tanh), the register-blocked fp32
// GEMM micro-kernel and row conversion. Written as plain loops that GCC vectorises for the target
// the including translation unit selected.
//
// Textual include, no include guard on purpose: each fast_isa_*.cpp includes fast_common.hpp, sets
// its `#pragma GCC target`, opens its own namespace, defines FAST_W (floats per vector), FAST_MR
// (micro-tile rows) and FAST_NV (micro-tile vectors), then includes this file, fast_forward.hpp and
// fast_backward.hpp. Keeping each ISA's copy in its own namespace keeps the One Definition Rule.

#define FAST_INLINE inline __attribute__((always_inline))
#define FAST_PRAGMA(x) _Pragma(#x)
#define FAST_UNROLL(n) FAST_PRAGMA(GCC unroll n)
// FAST_KUNROLL (optional, per ISA): how often the micro-kernel's reduction loop is unrolled.
#ifdef FAST_KUNROLL
#define FAST_UNROLL_REDUCTION FAST_UNROLL(FAST_KUNROLL)
#else
#define FAST_UNROLL_REDUCTION
#endif

inline constexpr int W = FAST_W;    // floats per vector register
inline constexpr int MR = FAST_MR;  // micro-tile rows: one broadcast each per reduction step
inline constexpr int NV = FAST_NV;  // micro-tile width in vectors: MR * NV accumulators
static_assert(kBlockQ % W == 0 && kMaxVec % W == 0, "tiles must be whole vectors");

using sem::kLn2;
using sem::kNegInf;

/// std::log2 as the log2 sem::softmax_lse takes.
inline float row_log2(float x) {
  return std::log2(x);
}

/// a * b + c, fused where the target has FMA (the build is ISO C++, which forbids contraction).
FAST_INLINE float madd(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

/// 2^x for x <= ~0 (softmax arguments), within ~1.3 ulp of fp32; -inf and x < -125 give exactly 0.
/// Round-to-nearest split x = n + f, f in [-0.5, 0.5], degree-6 Chebyshev fit of 2^f (max error
/// 1.2 ulp measured over the interval), then n is added to the exponent bits.
FAST_INLINE float exp2_neg(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = x < -125.0f ? -125.0f : x;
  const float shifted = xc + kRound;
  const float n = shifted - kRound;
  const float f = xc - n;
  float poly = 1.546973654e-4f;
  poly = madd(poly, f, 1.340043731e-3f);
  poly = madd(poly, f, 9.618025273e-3f);
  poly = madd(poly, f, 5.550327152e-2f);
  poly = madd(poly, f, 2.402265072e-1f);
  poly = madd(poly, f, 6.931471825e-1f);
  poly = madd(poly, f, 1.0f);
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = std::bit_cast<float>(std::bit_cast<int32_t>(poly) + (n_int << 23));
  return x < -125.0f ? 0.0f : r;
}

/// tanh(x) within ~2 ulp: an odd polynomial below |x| = 0.55 (where 1 - e^-2|x| would cancel), the
/// exponential form above it; saturates to +-1.
FAST_INLINE float tanh_fast(float x) {
  const float ax = std::fabs(x);
  const float u = ax * ax;
  float poly = -6.238847971e-3f;  // tanh(x) / x as a polynomial in x^2, fitted on [0, 0.55]
  poly = madd(poly, u, 2.104217745e-2f);
  poly = madd(poly, u, -5.384337530e-2f);
  poly = madd(poly, u, 1.333246827e-1f);
  poly = madd(poly, u, -3.333331048e-1f);
  poly = madd(poly, u, 1.0f);
  const float small = ax * poly;
  const float e = exp2_neg(-2.0f * sem::kLog2e * ax);
  const float large = (1.0f - e) / (1.0f + e);
  const float t = ax < 0.55f ? small : large;
  return x < 0.0f ? -t : t;
}

// ---------------------------------------------------------------------------------------------
// GEMM micro-kernel: C[r][v] (op)= sum_k A(r, k) * B[k][v], A(r, k) = a[r * a_rs + k * a_ks]
// (broadcast), B rows contiguous (vector loads). Every matmul of both passes is this one shape.

enum class Store : int {
  overwrite,      // C = AB
  accumulate,     // C += AB
  rescale,        // C = C * aux[r] + AB (online softmax)
  overwrite_max,  // C = AB, and aux[column] = max(aux[column], max over rows of C)
};

/// A W-float vector in GCC's portable vector extension: one zmm/ymm/xmm register per value.
typedef float vec_t __attribute__((vector_size(W * sizeof(float))));
FAST_INLINE vec_t vload(const float* p) {
  vec_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
FAST_INLINE void vstore(float* p, vec_t v) {
  std::memcpy(p, &v, sizeof v);
}

/// One register tile of R rows x V vectors; the R * V accumulators stay in registers across the k
/// loop (one broadcast and V FMAs per row and step). Written with vector types: plain scalar loops
/// make GCC vectorise the k loop or split the last row into partial vectors and spill. fp-contract
/// fuses the multiply-add (the ISO build turns contraction off).
template <int R, int V>
__attribute__((optimize("fp-contract=fast"))) void gemm_tile(float* __restrict c, long long ldc,
                                                             const float* __restrict a, long long a_rs,
                                                             long long a_ks, const float* __restrict b,
                                                             long long ldb, int kdim, float* __restrict aux,
                                                             Store mode) {
  vec_t acc[R][V] = {};
  FAST_UNROLL_REDUCTION
  for (int k = 0; k < kdim; ++k) {
    const float* b_k = b + k * ldb;
    const float* a_k = a + k * a_ks;
    vec_t b_v[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) b_v[v] = vload(b_k + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vec_t a_rk = a_k[r * a_rs] - vec_t{};  // broadcast (x - 0 folds away, x + 0 does not)
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] += a_rk * b_v[v];
    }
  }
  if (mode == Store::overwrite_max) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      vec_t mx = vload(aux + v * W);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) mx = acc[r][v] > mx ? acc[r][v] : mx;
      vstore(aux + v * W, mx);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float s = mode == Store::rescale ? aux[r] : 1.0f;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      float* c_rv = c + r * ldc + v * W;
      const bool plain = mode == Store::overwrite || mode == Store::overwrite_max;
      vstore(c_rv, plain ? acc[r][v] : vload(c_rv) * s + acc[r][v]);
    }
  }
}

using GemmTileFn = void (*)(float*, long long, const float*, long long, long long, const float*, long long,
                            int, float*, Store);

template <size_t... I>
constexpr std::array<GemmTileFn, sizeof...(I)> make_gemm_tiles(std::index_sequence<I...>) {
  return {&gemm_tile<(int)(I / NV) + 1, (int)(I % NV) + 1>...};
}
/// Tile kernels for every (rows, vectors) remainder, indexed [(rows - 1) * NV + vectors - 1].
inline constexpr std::array<GemmTileFn, MR* NV> kGemmTiles =
    make_gemm_tiles(std::make_index_sequence<MR * NV>{});

/// Columns of one micro-tile's B panel: a B operand stored as panels of kPanelW columns (each kdim rows
/// of kPanelW floats, contiguous) streams through a tile as one block instead of kdim strided rows.
inline constexpr int kPanelW = NV * W;
static_assert(kPanelW <= kMaxPanel, "V panels are padded to kMaxPanel columns");

/// C (m rows x nvec vectors, row stride ldc) (op)= A (m x kdim, strides a_rs/a_ks) * B (kdim x nvec
/// vectors, row stride ldb). B's column group g (kPanelW columns) starts at b + g * b_panel: the default
/// is plain rows; panels (ldb = kPanelW) pass their size. B must be readable for whole vectors
/// (zero-padded past the data). `aux` is the per-row scale of Store::rescale or the per-column running
/// max of Store::overwrite_max.
inline void gemm(float* c, long long ldc, int m, int nvec, const float* a, long long a_rs, long long a_ks,
                 const float* b, long long ldb, int kdim, float* aux, Store mode,
                 long long b_panel = kPanelW) {
  for (int v0 = 0; v0 < nvec; v0 += NV) {
    const int nv = std::min(NV, nvec - v0);
    const float* b_group = b + (v0 / NV) * b_panel;
    for (int r0 = 0; r0 < m; r0 += MR) {
      const int mr = std::min(MR, m - r0);
      float* tile_aux = mode == Store::rescale         ? aux + r0
                        : mode == Store::overwrite_max ? aux + v0 * W
                                                       : nullptr;
      kGemmTiles[(mr - 1) * NV + nv - 1](c + r0 * ldc + v0 * W, ldc, a + r0 * a_rs, a_rs, a_ks, b_group, ldb,
                                         kdim, tile_aux, mode);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rows in and out of the storage types.

/// dst[0, n) = scale * src row (any input type) widened to fp32; dst[n, n_pad) = 0.
inline void load_row(const void* base, int type, long long off, int n, int n_pad, float scale, float* dst) {
  switch (type) {
    case kF32: {
      const float* src = static_cast<const float*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = src[c] * scale;
      break;
    }
    case kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = std::bit_cast<float>((uint32_t)src[c] << 16) * scale;
      break;
    }
    case kF16: {
#ifdef __F16C__
      const _Float16* src = static_cast<const _Float16*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = (float)src[c] * scale;
#else
      const uint16_t* src = static_cast<const uint16_t*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = num::f16_to_f32(src[c]) * scale;
#endif
      break;
    }
    default:
      for (int c = 0; c < n; ++c) dst[c] = load_f32(base, type, off + c) * scale;
  }
  for (int c = n; c < n_pad; ++c) dst[c] = 0.0f;
}

/// Stores scale * src[0, n) into a row of `type` (round to nearest even).
inline void store_row(void* base, int type, long long off, int n, float scale, const float* src) {
  switch (type) {
    case kF32: {
      float* dst = static_cast<float*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = src[c] * scale;
      return;
    }
    case kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = num::f32_to_bf16(src[c] * scale);
      return;
    }
#ifdef __F16C__
    case kF16: {
      _Float16* dst = static_cast<_Float16*>(base) + off;
      for (int c = 0; c < n; ++c) dst[c] = (_Float16)(src[c] * scale);
      return;
    }
#endif
    default:
      for (int c = 0; c < n; ++c) store(base, type, off + c, (double)(src[c] * scale));
  }
}

/// Carves 64-byte aligned buffers out of the thread's scratch.
struct Bump {
  float* cursor;
  float* take(long long n) {
    float* r = cursor;
    cursor += pad_to(n, kMaxVec);
    return r;
  }
  int* take_int(long long n) { return reinterpret_cast<int*>(take(n)); }
};

/// Visible key range [lo, hi) of each query row of a tile (clamped; empty rows have lo >= hi).
/// Rows past the sequence (tile padding) get the full range so they are never masked: their Q is
/// zero, their results are discarded.
inline void row_ranges(const AttnProblem& p, long long i0, int nq, long long sq, long long sk, int* lo,
                       int* hi) {
  for (int r = 0; r < kBlockQ; ++r) {
    if (r < nq) {
      const sem::KeyRange kr = sem::visible_keys(i0 + r, sq, sk, p.window_left, p.window_right);
      lo[r] = (int)kr.lo;
      hi[r] = (int)kr.hi;
    } else {
      lo[r] = 0;
      hi[r] = (int)sk;
    }
  }
}

/// Whether keys [j0, j0 + nk) are visible to every real row (no mask needed on this tile).
inline bool tile_fully_visible(const int* lo, const int* hi, int nq, long long j0, int nk) {
  for (int r = 0; r < nq; ++r) {
    if (lo[r] > j0 || hi[r] < j0 + nk) return false;
  }
  return true;
}

/// Scores (keys x kBlockQ, row j = key j0 + j): the transform stage (softcap, ALiBi) in log2 units.
/// With softcap, `tanh_out` (same shape, nullable) receives tanh(x) for the backward's gradient.
inline void transform_scores(const ScoreParams& sp, float* s, float* tanh_out, int nk, long long j0,
                             long long diag0) {
  for (int j = 0; j < nk; ++j) {
    float* s_j = s + j * kBlockQ;
    float* t_j = tanh_out ? tanh_out + j * kBlockQ : nullptr;
    const int rel = (int)(diag0 - (j0 + j));  // diag(row 0) - key: row r's distance is rel + r
    if (sp.cap_log2 > 0.0f) {
      for (int r = 0; r < kBlockQ; ++r) {
        const float th = tanh_fast(s_j[r]);
        if (t_j) t_j[r] = th;
        s_j[r] = sp.cap_log2 * th;
      }
    }
    if (sp.slope_log2 != 0.0f) {
      for (int r = 0; r < kBlockQ; ++r) s_j[r] -= sp.slope_log2 * (float)sem::alibi_distance(rel + r, 0);
    }
  }
}

/// Sets scores of keys outside each row's visible range to -inf.
inline void mask_scores(float* s, int nk, long long j0, const int* lo, const int* hi) {
  for (int j = 0; j < nk; ++j) {
    float* s_j = s + j * kBlockQ;
    const int key = (int)(j0 + j);
    for (int r = 0; r < kBlockQ; ++r) s_j[r] = (key >= lo[r] && key < hi[r]) ? s_j[r] : kNegInf;
  }
}

/// sem::philox4x32_10 for every query row of a tile at once: counter (group, i0 + r, head, offset). The
/// row loop is innermost after inlining, so the rounds vectorise across rows.
inline void philox_rows(uint32_t group, long long i0, uint32_t head, uint32_t offset, uint64_t seed,
                        uint32_t (*words)[kBlockQ]) {
  for (int r = 0; r < kBlockQ; ++r) {
    const sem::Philox4 w =
        sem::philox4x32_10(group, (uint32_t)(i0 + r), head, offset, (uint32_t)seed, (uint32_t)(seed >> 32));
    words[0][r] = w.x[0], words[1][r] = w.x[1], words[2][r] = w.x[2], words[3][r] = w.x[3];
  }
}

/// Multiplies each probability (keys x kBlockQ) by its dropout factor: 1/(1-p) when kept (or
/// `kept` when given: the bf16 path keeps P exact and scales O instead), else 0. One Philox call
/// covers four consecutive keys of a row (SPEC's counter layout); padding rows of the tile get factors
/// too, which nobody reads.
inline void dropout_scale(const AttnProblem& p, long long b, long long h, long long i0, long long j0, int nk,
                          float* s, float kept = 0.0f) {
  const float keep_scale = kept > 0.0f ? kept : sem::dropout_keep_scale(p.dropout_p);
  const uint32_t threshold = p.dropout_threshold, head = (uint32_t)(b * p.hq + h);
  uint32_t words[4][kBlockQ];
  for (long long g = j0 >> 2; g <= (j0 + nk - 1) >> 2; ++g) {
    philox_rows((uint32_t)g, i0, head, p.offset, p.seed, words);
    for (long long j = std::max(j0, 4 * g); j < std::min(j0 + nk, 4 * g + 4); ++j) {
      float* s_j = s + (j - j0) * kBlockQ;
      const uint32_t* w = words[j & 3];
      for (int r = 0; r < kBlockQ; ++r) s_j[r] *= w[r] >= threshold ? keep_scale : 0.0f;
    }
  }
}
