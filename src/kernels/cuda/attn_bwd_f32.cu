// The fp32 backward main kernel (fp32 inputs and gradients on CUDA, sm80+): exact fp32 arithmetic on
// the CUDA cores, the counterpart of attn_fwd_f32.cu. FlashAttention-2's loop as attn_bwd.cu runs it:
// one CTA per (key block, kv head, batch) keeps dK and dV of its keys in registers, walks the query
// blocks of every query head of its GQA group that see the block, and adds dQ partials to the shared
// fp32 accumulator; D before it and the dQ conversion after it are attn_bwd_aux.cu's (FP_DTYPE f32).
// The score transform, masks, dropout and the gradient of softcap are core/'s policies.
//
// Every product is a 16 x 16 thread grid over its output tile (256 threads). Two shapes:
// - "NT", S = Q K^T and dP = dO V^T: both operands read along the reduction in 16-byte loads; thread
//   (ty, tx) owns rows ty + 16 a and columns tx + 16 b. Eight consecutive rows of K/V start at distinct
//   bank quads (row pitch kHD + 4 floats), so a quarter-warp's loads never conflict; Q/dO rows are
//   shared by 16 lanes (broadcast).
// - "NN", dV = P^T dO, dK = dS^T Q, dQ = dS K: the second operand row-major, read as float4 along its
//   columns (thread owns columns 4 tx + 64 v .. + 3), the first read one scalar per row.
//
// Compile-time head-dim bucket -D FP_HEADDIM (64, 128, 256; d and dv <= it, multiples of 8 per the
// host); tiles from bwd_f32_tile (bwd_params.cuh), shared with the launcher.
#include "attn/bwd_stages.h"
#include "cuda/bwd_params.cuh"
#include "cuda/bwd_seq.cuh"
#include "cuda/common/common.cuh"

#ifndef FP_HEADDIM
#error "attn_bwd_f32 needs -D FP_HEADDIM"
#endif

namespace flashport::cuda::bwd32 {

using bwd::Seq;
constexpr int kHD = FP_HEADDIM;
constexpr int kBM = bwd_f32_tile(kHD).block_m;  // query rows per step
constexpr int kBN = bwd_f32_tile(kHD).block_n;  // key rows per CTA
constexpr int kThreads = 256;
constexpr int kGrid = 16;                // threads per side of the 16 x 16 grid
constexpr int kPitch = kHD + 4;          // Q, dO, K, V rows (floats): see the bank note above
constexpr int kPitchS = kBN + 1;         // P, dS rows: the NN products' two rows per warp differ in bank
constexpr int kVec = kHD / (4 * kGrid);  // NN: float4 column groups per thread
constexpr int kRowsS = kBM / kGrid, kColsS = kBN / kGrid;  // NT: S/dP elements per thread
constexpr int kRowsKV = kBN / kGrid;                       // NN: dK/dV rows per thread
constexpr int kRowsQ = kBM / kGrid;                        // NN: dQ rows per thread
static_assert(kHD % (4 * kGrid) == 0 && kBM % kGrid == 0 && kBN % kGrid == 0, "bad tile");
static_assert(kGrid * kGrid == kThreads, "one thread per grid cell");

// Shared memory, in floats.
constexpr int kOffQ = 0, kOffDO = kOffQ + kBM * kPitch, kOffK = kOffDO + kBM * kPitch;
constexpr int kOffV = kOffK + kBN * kPitch, kOffP = kOffV + kBN * kPitch, kOffDS = kOffP + kBM * kPitchS;
static_assert((kOffDS + kBM * kPitchS) * 4 == bwd_f32_smem_bytes(kHD), "host and kernel disagree on smem");

struct float4_ {
  float x, y, z, w;
};

FP_DEV float4_ lds4(const float* s) {
  return *reinterpret_cast<const float4_*>(s);
}
FP_DEV float dot4(const float4_& a, const float4_& b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
FP_DEV void axpy4(float4_& acc, float a, const float4_& x) {
  acc.x = fmaf(a, x.x, acc.x), acc.y = fmaf(a, x.y, acc.y);
  acc.z = fmaf(a, x.z, acc.z), acc.w = fmaf(a, x.w, acc.w);
}
FP_DEV int min_int(int a, int b) {
  return a < b ? a : b;
}

/// Adds v to g[0..3] in global memory: fire-and-forget atomics, or (`plain`: the calling thread owns
/// the elements, deterministic mode) a read-modify-write.
FP_DEV void add4(float* g, const float4_& v, bool plain) {
#ifndef __CUDA_ARCH__  // kernel emulator: blocks run one at a time
  plain = true;
#endif
  if (plain) {
    g[0] += v.x, g[1] += v.y, g[2] += v.z, g[3] += v.w;
    return;
  }
#ifdef __CUDA_ARCH__
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(g), "f"(v.x) : "memory");
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(g + 1), "f"(v.y) : "memory");
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(g + 2), "f"(v.z) : "memory");
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(g + 3), "f"(v.w) : "memory");
#endif
}

/// Copies rows [0, valid) of an operand (row r at element off0 + r * row_stride of g, channels < ncols)
/// into a tile of kRows rows of kPitch floats; other rows and channels are zeros (they enter the sums).
/// `vec`: rows 16-byte aligned.
template <int kRows>
FP_DEV void load_rows(float* s, const float* g, i64 off0, i64 row_stride, int valid, i64 ncols, bool vec) {
  constexpr int kChunks = kHD / 4;
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    float4_ v{0.0f, 0.0f, 0.0f, 0.0f};
    if (r < valid && ch * 4 < ncols) {  // ncols is a multiple of 8: whole chunks
      const float* src = g + off0 + r * row_stride + ch * 4;
      v = vec ? *reinterpret_cast<const float4_*>(src) : float4_{src[0], src[1], src[2], src[3]};
    }
    *reinterpret_cast<float4_*>(s + r * kPitch + ch * 4) = v;
  }
}

/// What the CTA's threads share over one key block.
struct Cta {
  int b, hk, n0;
  Seq seq;
  int tx, ty;  // this thread's cell of the 16 x 16 grid
};

/// S = Q K^T and dP = dO V^T for this thread's cells, then per element P = exp2(score log2e - LSE
/// log2e) (0 where masked), Z = keep / (1 - p), dS = P (dP Z - D) times d softcap; P Z into s_p, dS
/// into s_ds. Rows past the sequence and keys no row sees get 0.
FP_DEV void stage_scores(const BwdParams& prm, const Cta& c, float* smem, int h, int m0) {
  const AttnProblem& p = prm.p;
  const int len_q = c.seq.len_q, len_k = c.seq.len_k;
  float s[kRowsS][kColsS] = {}, dp[kRowsS][kColsS] = {};
  const int k_end = (int)(p.d > p.dv ? p.d : p.dv);  // channels past d (dv) are zeros in the tiles
#pragma unroll 1
  for (int k = 0; k < k_end; k += 4) {
    float4_ q[kRowsS], dout[kRowsS];
#pragma unroll
    for (int a = 0; a < kRowsS; ++a) {
      q[a] = lds4(smem + kOffQ + (c.ty + kGrid * a) * kPitch + k);
      dout[a] = lds4(smem + kOffDO + (c.ty + kGrid * a) * kPitch + k);
    }
#pragma unroll
    for (int e = 0; e < kColsS; ++e) {
      const float4_ kk = lds4(smem + kOffK + (c.tx + kGrid * e) * kPitch + k);
      const float4_ vv = lds4(smem + kOffV + (c.tx + kGrid * e) * kPitch + k);
#pragma unroll
      for (int a = 0; a < kRowsS; ++a)
        s[a][e] = dot4(q[a], kk, s[a][e]), dp[a][e] = dot4(dout[a], vv, dp[a][e]);
    }
  }

  const i64 row0 = bwd::lse_row0(p, c.seq, c.b, h);  // LSE and D of query i at row0 + i
  const float cap = p.softcap, slope = alibi_slope(p, c.b, h);
  const bool dropout = p.dropout_p > 0.0f;
  const float rp = sem::dropout_keep_scale(p.dropout_p);
  // Keep bits first, in a rolled loop: one Philox body, not one per element inlined beside the tiles.
  static_assert(kRowsS * kColsS <= 32, "keep bits in one word");
  unsigned keep = ~0u;
  if (dropout) {
#pragma unroll 1
    for (int n = 0; n < kRowsS * kColsS; ++n) {
      const int i = m0 + c.ty + kGrid * (n / kColsS), j = c.n0 + c.tx + kGrid * (n % kColsS);
      if (!sem::dropout_keep(p.seed, p.offset, p.dropout_threshold, i, j, c.b, p.hq, h)) keep &= ~(1u << n);
    }
  }
#pragma unroll
  for (int a = 0; a < kRowsS; ++a) {
    const int r = c.ty + kGrid * a, i = m0 + r;
    const bool in = i < len_q;
    const float lse = in ? p.lse[row0 + i] : sem::kNegInf;
    // A row with LSE -inf has no visible key: 2^(x - inf) = 0 gives P = 0 without a NaN.
    const float lse2 = lse == sem::kNegInf ? -sem::kNegInf : lse * kLog2e;
    const float dsum = in ? prm.dsum[row0 + i] : 0.0f;
    const sem::KeyRange kr = sem::visible_keys(i, len_q, len_k, p.window_left, p.window_right);
#pragma unroll
    for (int e = 0; e < kColsS; ++e) {
      const int col = c.tx + kGrid * e, j = c.n0 + col;
      const bool visible = in && j >= kr.lo && j < kr.hi;
      const float capped = sem::softcap(s[a][e] * p.scale, cap);
      const float score = p.alibi ? capped + sem::alibi_bias(slope, (i64)i, (i64)j, len_q, len_k) : capped;
      const float prob = visible ? exp2f(score * kLog2e - lse2) : 0.0f;
      attn::prob_grad(prob, (keep >> (a * kColsS + e)) & 1u, rp, dp[a][e], dsum, cap, capped,
                      smem[kOffP + r * kPitchS + col], smem[kOffDS + r * kPitchS + col]);
    }
  }
}

/// dV += (P Z)^T dO and dK += dS^T Q over the step's query rows [0, m_end).
FP_DEV void stage_dk_dv(const Cta& c, const float* smem, int m_end, float4_ (&dk)[kRowsKV][kVec],
                        float4_ (&dv)[kRowsKV][kVec]) {
#pragma unroll 1
  for (int i = 0; i < m_end; ++i) {
    float4_ dout[kVec], q[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      dout[v] = lds4(smem + kOffDO + i * kPitch + 4 * c.tx + 4 * kGrid * v);
      q[v] = lds4(smem + kOffQ + i * kPitch + 4 * c.tx + 4 * kGrid * v);
    }
#pragma unroll
    for (int a = 0; a < kRowsKV; ++a) {
      const float pz = smem[kOffP + i * kPitchS + c.ty + kGrid * a];
      const float ds = smem[kOffDS + i * kPitchS + c.ty + kGrid * a];
#pragma unroll
      for (int v = 0; v < kVec; ++v) axpy4(dv[a][v], pz, dout[v]), axpy4(dk[a][v], ds, q[v]);
    }
  }
}

/// dQ (unscaled) of the step = dS K over the block's keys, added to the accumulator: atomics, or in
/// deterministic mode a plain add (the CTA owns its slice, and the same thread adds the element for every
/// key block it visits, in order).
FP_DEV void stage_dq(const BwdParams& prm, const Cta& c, const float* smem, int h, int m0) {
  const AttnProblem& p = prm.p;
  const int n_end = min_int(kBN, c.seq.len_k - c.n0);
  float4_ acc[kRowsQ][kVec] = {};
#pragma unroll 1
  for (int j = 0; j < n_end; ++j) {
    float4_ kk[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) kk[v] = lds4(smem + kOffK + j * kPitch + 4 * c.tx + 4 * kGrid * v);
#pragma unroll
    for (int a = 0; a < kRowsQ; ++a) {
      const float ds = smem[kOffDS + (c.ty + kGrid * a) * kPitchS + j];
#pragma unroll
      for (int v = 0; v < kVec; ++v) axpy4(acc[a][v], ds, kk[v]);
    }
  }
  const i64 slice = p.deterministic ? (i64)blockIdx.x : 0;
  float* base =
      prm.dq_accum + ((slice * p.hq + h) * prm.rows_total + bwd::accum_row0(p, c.seq, c.b)) * prm.accum_ld;
#pragma unroll
  for (int a = 0; a < kRowsQ; ++a) {
    const int i = m0 + c.ty + kGrid * a;
    if (i >= c.seq.len_q) continue;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int col = 4 * c.tx + 4 * kGrid * v;
      if (col < p.d) add4(base + (i64)i * prm.accum_ld + col, acc[a][v], p.deterministic);
    }
  }
}

/// Writes dK (times the softmax scale) and dV rows < rows_k, channels < d / dv.
FP_DEV void store_dk_dv(const BwdParams& prm, const Cta& c, const float4_ (&dk)[kRowsKV][kVec],
                        const float4_ (&dv)[kRowsKV][kVec]) {
  const AttnProblem& p = prm.p;
  const bool varlen = p.cu_seqlens_k != nullptr;
  float* g_dk = static_cast<float*>(p.grad_k.ptr);
  float* g_dv = static_cast<float*>(p.grad_v.ptr);
  const float sc = p.scale;
#pragma unroll
  for (int a = 0; a < kRowsKV; ++a) {
    const int j = c.n0 + c.ty + kGrid * a;
    if (j >= c.seq.rows_k) continue;
    const i64 dk_row = bwd::row_offset(p.grad_k, varlen, c.b, c.seq.k_start, j, c.hk);
    const i64 dv_row = bwd::row_offset(p.grad_v, varlen, c.b, c.seq.k_start, j, c.hk);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int col = 4 * c.tx + 4 * kGrid * v;
      const float4_ k4{dk[a][v].x * sc, dk[a][v].y * sc, dk[a][v].z * sc, dk[a][v].w * sc};
      if (col < p.d) {
        float* g = g_dk + dk_row + col;
        if (prm.vec)
          *reinterpret_cast<float4_*>(g) = k4;
        else
          g[0] = k4.x, g[1] = k4.y, g[2] = k4.z, g[3] = k4.w;
      }
      if (col < p.dv) {
        float* g = g_dv + dv_row + col;
        if (prm.vec)
          *reinterpret_cast<float4_*>(g) = dv[a][v];
        else
          g[0] = dv[a][v].x, g[1] = dv[a][v].y, g[2] = dv[a][v].z, g[3] = dv[a][v].w;
      }
    }
  }
}

}  // namespace flashport::cuda::bwd32

using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::bwd32;

/// Grid (x, hk, batch). Non-deterministic: x = key block. Deterministic: x = dq_accum slice, and the
/// CTA visits key blocks x, x + gridDim.x, ... Block kThreads, dynamic smem bwd_f32_smem_bytes(kHD).
/// Per (key block, query head, query block) step: load Q, dO; sync; scores -> s_p, s_ds; sync; dK/dV
/// and dQ (both only read shared memory); the sync at the top of the next step orders those reads
/// before the tiles are overwritten.
extern "C" __global__ void __launch_bounds__(kThreads, 2)
    attn_bwd_f32(const __grid_constant__ BwdParams prm) {
  order_after_prior_grids();
  const AttnProblem& p = prm.p;
  float* smem = dynamic_smem<float>();
  Cta c;
  c.b = (int)blockIdx.z + prm.batch_offset;
  c.hk = (int)blockIdx.y;
  c.seq = bwd::sequence(p, c.b);
  c.tx = (int)threadIdx.x % kGrid, c.ty = (int)threadIdx.x / kGrid;
  const int group = (int)gqa_group(p), len_q = c.seq.len_q, len_k = c.seq.len_k;
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr, vec = prm.vec != 0;
  const float* g_q = static_cast<const float*>(p.q.ptr);
  const float* g_do = static_cast<const float*>(p.dout.ptr);

  for (int nb = (int)blockIdx.x; nb * kBN < c.seq.rows_k; nb += (int)gridDim.x) {
    c.n0 = nb * kBN;
    const sem::Tiles<int> q_blocks = bwd::seeing_query_blocks(p, c.seq, c.n0, kBN, kBM);
    const int m_begin = q_blocks.begin, n_m = q_blocks.end - q_blocks.begin;
    __syncthreads();  // the previous key block's last step is done with s_k, s_v
    const int rows_k = len_k - c.n0;
    load_rows<kBN>(smem + kOffK, static_cast<const float*>(p.k.ptr),
                   bwd::row_offset(p.k, varlen_k, c.b, c.seq.k_start, c.n0, c.hk), p.k.row_stride, rows_k,
                   p.d, vec);
    load_rows<kBN>(smem + kOffV, static_cast<const float*>(p.v.ptr),
                   bwd::row_offset(p.v, varlen_k, c.b, c.seq.k_start, c.n0, c.hk), p.v.row_stride, rows_k,
                   p.dv, vec);

    float4_ dk[kRowsKV][kVec] = {}, dv[kRowsKV][kVec] = {};
    for (int step = 0; step < group * n_m; ++step) {  // (query head, query block), head-major
      const int h = (int)group_head(c.hk, group, step / n_m), m0 = (m_begin + step % n_m) * kBM;
      __syncthreads();  // the previous step is done with s_q, s_do, s_p, s_ds
      load_rows<kBM>(smem + kOffQ, g_q, bwd::row_offset(p.q, varlen_q, c.b, c.seq.q_start, m0, h),
                     p.q.row_stride, len_q - m0, p.d, vec);
      load_rows<kBM>(smem + kOffDO, g_do, bwd::row_offset(p.dout, varlen_q, c.b, c.seq.q_start, m0, h),
                     p.dout.row_stride, len_q - m0, p.dv, vec);
      __syncthreads();
      stage_scores(prm, c, smem, h, m0);
      __syncthreads();
      stage_dk_dv(c, smem, min_int(kBM, len_q - m0), dk, dv);
      stage_dq(prm, c, smem, h, m0);
    }
    store_dk_dv(prm, c, dk, dv);
  }
}
