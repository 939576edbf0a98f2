// FlashAttention-2 backward main kernel for sm_80+ (mma.sync m16n8k16): one CTA per (key block,
// kv head, batch) keeps dK, dV of its keys in registers, walks the query blocks of every query head of
// its GQA group that can see the block, and adds dQ partials to an fp32 accumulator.
#include "attn/bwd_stages.h"
#include "cuda/bwd_params.cuh"
#include "cuda/bwd_seq.cuh"
#include "cuda/bwd_warp.cuh"

#if !defined(FP_DTYPE) || !defined(FP_HEADDIM) || !defined(BWD_BLOCK_M) || !defined(BWD_BLOCK_N) || \
    !defined(BWD_WARPS)
#error "attn_bwd needs -D FP_DTYPE, FP_HEADDIM, BWD_BLOCK_M, BWD_BLOCK_N, BWD_WARPS"
#endif

namespace flashport::cuda::bwd {

using Elem = FP_DTYPE;
constexpr int kHD = FP_HEADDIM;   // bucket: d and dv are <= kHD, multiples of 8 (zero-filled beyond)
constexpr int kBM = BWD_BLOCK_M;  // query rows per step
constexpr int kBN = BWD_BLOCK_N;  // key rows per CTA
constexpr int kWarps = BWD_WARPS;
constexpr int kThreads = 32 * kWarps;
constexpr int kPitch = kHD + 8;   // Q, dO, K, V smem row pitch (elements); +16 bytes: conflict-free ldmatrix
constexpr int kPitchS = kBN + 8;  // P, dS smem row pitch; also makes the C-fragment stores conflict-free
constexpr int kChunks = kHD / 8;  // 16-byte chunks per Q/K/V/dO row
static_assert(kHD % 32 == 0 && kHD <= 256 && kBM % 16 == 0 && kBN % 16 == 0, "bad tile");

// Shared memory, byte offsets. s_q, s_do: (kBM, kPitch); s_k, s_v: (kBN, kPitch); s_p, s_ds:
// (kBM, kPitchS). Every region and row start is 16-byte aligned (pitches are multiples of 8 elements).
#ifdef BWD_QDO_STAGES
constexpr int kStages = BWD_QDO_STAGES;  // 2: the Q/dO tiles of step s + 1 load during step s
#else
constexpr int kStages = 1;
#endif
static_assert(kStages == 1 || kStages == 2, "BWD_QDO_STAGES is 1 or 2");
constexpr u32 kOffQ = 0;                          // buffer x: + x * kStageBytes
constexpr u32 kOffDO = kOffQ + kBM * kPitch * 2;  // buffer x: + x * kStageBytes
constexpr u32 kStageBytes = 2 * kBM * kPitch * 2;
constexpr u32 kOffK = kOffQ + kStages * kStageBytes;
constexpr u32 kOffV = kOffK + kBN * kPitch * 2;
constexpr u32 kOffP = kOffV + kBN * kPitch * 2;
constexpr u32 kOffDS = kOffP + kBM * kPitchS * 2;
constexpr u32 kSmemBytes = kOffDS + kBM * kPitchS * 2;
static_assert(kSmemBytes == (u32)bwd_smem_bytes(kBM, kBN, kHD, kStages),
              "host and kernel disagree on shared memory");

// Warp grids of the three stages. A and B: whole m16 x n16 warp tiles with the smallest perimeter
// (fewest fragment loads per mma). C: 16-row warp tiles where possible, done in column chunks.
constexpr WarpGrid kGridS = warp_grid(kBM, kBN, kWarps);       // stage A: S, dP -> P, dS  (kBM, kBN)
constexpr WarpGrid kGridKV = warp_grid(kBN, kHD, kWarps);      // stage B: dV, dK          (kBN, kHD)
constexpr WarpGrid kGridQ = warp_grid_tall(kBM, kHD, kWarps);  // stage C: dQ              (kBM, kHD)
static_assert(kGridS.rows > 0 && kGridKV.rows > 0 && kGridQ.rows > 0, "no warp grid fits the tile");
constexpr int kMtS = kBM / kGridS.rows / 16, kNtS = kBN / kGridS.cols / 8;
constexpr int kMtKV = kBN / kGridKV.rows / 16, kNtKV = kHD / kGridKV.cols / 8;
constexpr int kMtQ = kBM / kGridQ.rows / 16, kNtQ = kHD / kGridQ.cols / 8;
constexpr int kChunkQ = kNtQ < 4 ? kNtQ : 4;  // n8 tiles of dQ per stage-C pass

// Fragment pipelining of the warp GEMMs (warp_mma_pipe / warp_mma_dual): 0 none; 1 stages A and C
// load k-step s + 1 before the mma of step s; 2 as 1 with S and dP in one loop; 3 as 2 and stage B too.
#ifdef BWD_PIPE
constexpr int kPipe = BWD_PIPE;
#else
constexpr int kPipe = 0;
#endif

// 1: softcap, ALiBi and dropout handled (read from the problem); 0: the launcher guarantees none of
// them, and the score transform compiles without their code (fewer instructions and a loop body that
// fits the instruction caches better).
#ifdef BWD_GENERAL
constexpr bool kGeneral = BWD_GENERAL != 0;
#else
constexpr bool kGeneral = true;
#endif

#ifdef BWD_MIN_BLOCKS
constexpr int kMinBlocks = BWD_MIN_BLOCKS;  // CTAs per SM the register allocation must allow
#else
constexpr int kMinBlocks = 1;
#endif

constexpr float kInf = __builtin_bit_cast(float, 0x7f800000u);

FP_DEV int min_int(int a, int b) {
  return a < b ? a : b;
}
FP_DEV int max_int(int a, int b) {
  return a > b ? a : b;
}
FP_DEV int clamp_int(i64 v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : (int)v;
}
FP_DEV int round16(int n) {
  return (n + 15) & ~15;
}

/// What a CTA's threads share over one key block. Kept small: every field is a register across the
/// whole main loop, next to dK and dV.
struct Cta {
  int b, hk, n0;  // batch entry, kv head, first key of the block
  Seq seq;
  u32 smem;  // shared address of the carve-up above
  int lane, warp;
};

/// Copies a (kRows, kHD) tile: row r < valid_rows from g + g_row0 + r * row_stride, channels < ncols;
/// the rest zero-filled (padding rows/channels must be 0, never stale: they enter the mma sums).
/// vec: cp.async (the caller commits and waits); else synchronous 2-byte loads.
template <int kRows>
FP_DEV void load_tile(u32 s_tile, const u16* g, i64 g_row0, i64 row_stride, int valid_rows, i64 ncols,
                      bool vec) {
  constexpr int kTotal = kRows * kChunks;
#pragma unroll
  for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
    const int c = it * kThreads + (int)threadIdx.x;
    if (kTotal % kThreads != 0 && c >= kTotal) break;
    const int r = c / kChunks, ch = c % kChunks;
    const bool pred = r < valid_rows && ch * 8 < ncols;
    const u16* src = pred ? g + g_row0 + r * row_stride + ch * 8 : g;
    const u32 dst = s_tile + (u32)(r * kPitch + ch * 8) * 2u;
    if (vec) {
      cp_async_16(dst, src, pred);
    } else {
      U32x4 v{0, 0, 0, 0};
      if (pred) {
        v.x = (u32)src[0] | (u32)src[1] << 16, v.y = (u32)src[2] | (u32)src[3] << 16;
        v.z = (u32)src[4] | (u32)src[5] << 16, v.w = (u32)src[6] | (u32)src[7] << 16;
      }
      st_shared_16(dst, v);
    }
  }
}

/// Issues the loads of K and V rows [n0, n0 + kBN).
FP_DEV void load_k_v(const BwdParams& prm, const Cta& c) {
  const AttnProblem& p = prm.p;
  const bool varlen = p.cu_seqlens_k != nullptr;
  const int rows = c.seq.len_k - c.n0;
  load_tile<kBN>(c.smem + kOffK, static_cast<const u16*>(p.k.ptr),
                 row_offset(p.k, varlen, c.b, c.seq.k_start, c.n0, c.hk), p.k.row_stride, rows, p.d, prm.vec);
  load_tile<kBN>(c.smem + kOffV, static_cast<const u16*>(p.v.ptr),
                 row_offset(p.v, varlen, c.b, c.seq.k_start, c.n0, c.hk), p.v.row_stride, rows, p.dv,
                 prm.vec);
}

/// Issues the loads of Q and dO rows [m0, m0 + kBM) of query head h into buffer `buf`.
FP_DEV void load_q_do(const BwdParams& prm, const Cta& c, int h, int m0, int buf) {
  const AttnProblem& p = prm.p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int rows = c.seq.len_q - m0;
  const u32 at = c.smem + (u32)buf * kStageBytes;
  load_tile<kBM>(at + kOffQ, static_cast<const u16*>(p.q.ptr),
                 row_offset(p.q, varlen, c.b, c.seq.q_start, m0, h), p.q.row_stride, rows, p.d, prm.vec);
  load_tile<kBM>(at + kOffDO, static_cast<const u16*>(p.dout.ptr),
                 row_offset(p.dout, varlen, c.b, c.seq.q_start, m0, h), p.dout.row_stride, rows, p.dv,
                 prm.vec);
}

/// Stage A: S = Q K^T and dP = dO V^T for this warp's (kMtS*16, kNtS*8) tile, then per element
/// P = exp2(score * log2e - LSE * log2e) (0 where masked or the row has LSE -inf), dropout factor
/// Z = keep / (1 - p), dS = P (dP Z - D) times d softcap; P Z and dS go to s_p, s_ds as Elem.
FP_DEV void stage_scores(const BwdParams& prm, const Cta& c, int h, int m0, int buf) {
  const AttnProblem& p = prm.p;
  const int g = c.lane >> 2, t4 = c.lane & 3;
  const int wm0 = (c.warp / kGridS.cols) * (kBM / kGridS.rows);
  const int wn0 = (c.warp % kGridS.cols) * (kBN / kGridS.cols);
  const int len_q = c.seq.len_q, len_k = c.seq.len_k;

  // LSE and D first: the global loads overlap the mma loop below.
  const i64 lse0 = lse_row0(p, c.seq, c.b, h);  // + i: LSE and D of query i (both LSE-shaped)
  float lse2[kMtS][2], dsum[kMtS][2];
#pragma unroll
  for (int mt = 0; mt < kMtS; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + wm0 + 16 * mt + g + 8 * r;
      const bool in = i < len_q;
      const float lse = in ? p.lse[lse0 + i] : -kInf;
      // A row with LSE -inf has no visible key: 2^(x - inf) = 0 gives P = 0 without a NaN.
      lse2[mt][r] = lse == -kInf ? kInf : lse * kLog2e;
      dsum[mt][r] = in ? prm.dsum[lse0 + i] : 0.0f;
    }
  }
  // No per-element mask when every row sees every key of the block (visible ranges grow with i).
  const bool full = c.n0 + kBN <= len_k && sem::contains(sem::keys_seen_by_all(m0, m0 + kBM, len_q, len_k,
                                                                               p.window_left, p.window_right),
                                                         c.n0, c.n0 + kBN);

  float acc_s[kMtS][kNtS][4], acc_dp[kMtS][kNtS][4];
  zero(acc_s);
  zero(acc_dp);
  {
    const u32 a_off = lane_offset<Store::kRowsM, true, kPitch>(wm0, c.lane) + (u32)buf * kStageBytes;
    const u32 b_off = lane_offset<Store::kRowsN, false, kPitch>(wn0, c.lane);
    if constexpr (kPipe >= 2) {
      warp_mma_dual<Elem, kMtS, kNtS, kHD, Store::kRowsM, kPitch, Store::kRowsN, kPitch>(
          acc_s, c.smem + kOffQ + a_off, c.smem + kOffK + b_off, acc_dp, c.smem + kOffDO + a_off,
          c.smem + kOffV + b_off, round16(max_int((int)p.d, (int)p.dv)));
    } else if constexpr (kPipe == 1) {
      warp_mma_pipe<Elem, kMtS, kNtS, kHD, Store::kRowsM, kPitch, Store::kRowsN, kPitch>(
          acc_s, c.smem + kOffQ + a_off, c.smem + kOffK + b_off, round16((int)p.d));
      warp_mma_pipe<Elem, kMtS, kNtS, kHD, Store::kRowsM, kPitch, Store::kRowsN, kPitch>(
          acc_dp, c.smem + kOffDO + a_off, c.smem + kOffV + b_off, round16((int)p.dv));
    } else {
      warp_mma<Elem, kMtS, kNtS, kHD, Store::kRowsM, kPitch, Store::kRowsN, kPitch>(
          acc_s, c.smem + kOffQ + a_off, c.smem + kOffK + b_off, round16((int)p.d));
      warp_mma<Elem, kMtS, kNtS, kHD, Store::kRowsM, kPitch, Store::kRowsN, kPitch>(
          acc_dp, c.smem + kOffDO + a_off, c.smem + kOffV + b_off, round16((int)p.dv));
    }
  }

  const float cap = kGeneral ? p.softcap : 0.0f, slope = kGeneral ? alibi_slope(p, c.b, h) : 0.0f;
  const bool dropout = kGeneral && p.dropout_p > 0.0f, alibi = kGeneral && p.alibi != nullptr;
  const float rp = dropout ? sem::dropout_keep_scale(p.dropout_p) : 1.0f;
#pragma unroll
  for (int mt = 0; mt < kMtS; ++mt) {
    // Rows g, g + 8 of this m tile: visible keys [lo, hi) and the diagonal i + sk - sq, block-relative.
    int lo[2], hi[2], diag[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + wm0 + 16 * mt + g + 8 * r;
      const sem::KeyRange kr = sem::visible_keys(i, len_q, len_k, p.window_left, p.window_right);
      lo[r] = clamp_int(kr.lo - c.n0, 0, kBN);
      hi[r] = clamp_int(kr.hi - c.n0, 0, kBN);
      diag[r] = clamp_int(sem::diagonal(i, len_q, len_k) - c.n0, -(1 << 30), 1 << 30);
    }
#pragma unroll
    for (int nt = 0; nt < kNtS; ++nt) {
      const int j0 = wn0 + 8 * nt + 2 * t4;  // block-relative key of elements 0 and 2
      const unsigned keep =
          dropout ? dropout_keep4(p, c.b, h, m0 + wm0 + 16 * mt + g, c.n0 + j0, c.lane) : 0xFu;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = j0 + (e & 1);
        const float capped = sem::softcap(acc_s[mt][nt][e] * p.scale, cap);
        float score = capped;
        if (alibi) score -= slope * (float)sem::alibi_distance(diag[r], j);
        const bool visible = full || (j >= lo[r] && j < hi[r]);
        const float prob = visible ? fast_exp2(score * kLog2e - lse2[mt][r]) : 0.0f;
        attn::prob_grad(prob, (keep >> e) & 1u, rp, acc_dp[mt][nt][e], dsum[mt][r], cap, capped,
                        acc_s[mt][nt][e], acc_dp[mt][nt][e]);
      }
      const int row = wm0 + 16 * mt + g;
      const u32 at0 = (u32)(row * kPitchS + j0) * 2u, at8 = (u32)((row + 8) * kPitchS + j0) * 2u;
      st_shared_u32(c.smem + kOffP + at0, Elem::pack(acc_s[mt][nt][0], acc_s[mt][nt][1]));
      st_shared_u32(c.smem + kOffP + at8, Elem::pack(acc_s[mt][nt][2], acc_s[mt][nt][3]));
      st_shared_u32(c.smem + kOffDS + at0, Elem::pack(acc_dp[mt][nt][0], acc_dp[mt][nt][1]));
      st_shared_u32(c.smem + kOffDS + at8, Elem::pack(acc_dp[mt][nt][2], acc_dp[mt][nt][3]));
    }
  }
}

/// One column chunk of stage C: kNt n8 tiles of this warp's dQ = dS K from column col0, added to the
/// fp32 accumulator rows `base` (query 0) + i * accum_ld.
template <int kNt>
FP_DEV void dq_chunk(const BwdParams& prm, const Cta& c, float* base, int m0, int wm0, int col0, int k_end) {
  const AttnProblem& p = prm.p;
  float acc[kMtQ][kNt][4];
  zero(acc);
  const u32 a_lane = c.smem + kOffDS + lane_offset<Store::kRowsM, true, kPitchS>(wm0, c.lane);
  const u32 b_lane = c.smem + kOffK + lane_offset<Store::kRowsK, false, kPitch>(col0, c.lane);
  if constexpr (kPipe >= 1)
    warp_mma_pipe<Elem, kMtQ, kNt, kBN, Store::kRowsM, kPitchS, Store::kRowsK, kPitch>(acc, a_lane, b_lane,
                                                                                       k_end);
  else
    warp_mma<Elem, kMtQ, kNt, kBN, Store::kRowsM, kPitchS, Store::kRowsK, kPitch>(acc, a_lane, b_lane, k_end);
  const int g = c.lane >> 2, t4 = c.lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMtQ; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + wm0 + 16 * mt + g + 8 * r;
      if (i >= c.seq.len_q) continue;
      float* row = base + (i64)i * prm.accum_ld;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int col = col0 + 8 * nt + 2 * t4;
        if (col >= p.d) continue;
        const float x = acc[mt][nt][2 * r], y = acc[mt][nt][2 * r + 1];
        if (p.deterministic) {
          row[col] += x;
          row[col + 1] += y;
        } else {
          red_add_f32x2(row + col, x, y);
        }
      }
    }
  }
}

/// Stage C: this warp's dQ tile = dS K (unscaled), added to the fp32 accumulator: plain
/// read-modify-write by the one thread that owns the element in deterministic mode (the CTA owns its
/// slice, and the same thread handles the element in every key block, so the order is fixed), else
/// atomics (order arbitrary). Column chunks of kChunkQ n8 tiles, not unrolled, keep its accumulators
/// few while dK and dV occupy the registers.
FP_DEV void stage_dq(const BwdParams& prm, const Cta& c, int h, int m0) {
  const AttnProblem& p = prm.p;
  const int wm0 = (c.warp / kGridQ.cols) * (kBM / kGridQ.rows);
  const int wd0 = (c.warp % kGridQ.cols) * (kHD / kGridQ.cols);
  const int k_end = round16(min_int(kBN, c.seq.len_k - c.n0));
  const i64 slice = p.deterministic ? (i64)blockIdx.x : 0;
  float* base =
      prm.dq_accum + ((slice * p.hq + h) * prm.rows_total + accum_row0(p, c.seq, c.b)) * prm.accum_ld;
#pragma unroll 1
  for (int nt = 0; nt + kChunkQ <= kNtQ; nt += kChunkQ) {
    if (wd0 + 8 * nt >= p.d) return;  // columns past d would only add zeros
    dq_chunk<kChunkQ>(prm, c, base, m0, wm0, wd0 + 8 * nt, k_end);
  }
  if constexpr (kNtQ % kChunkQ != 0) {
    constexpr int kRest = kNtQ % kChunkQ, kNt0 = kNtQ - kRest;
    if (wd0 + 8 * kNt0 < p.d) dq_chunk<kRest>(prm, c, base, m0, wm0, wd0 + 8 * kNt0, k_end);
  }
}

/// Writes this warp's dK (times the softmax scale) and dV rows < rows_k, channels < d / dv.
FP_DEV void store_dk_dv(const BwdParams& prm, const Cta& c, const float (&acc_dk)[kMtKV][kNtKV][4],
                        const float (&acc_dv)[kMtKV][kNtKV][4], int wn0, int wd0) {
  const AttnProblem& p = prm.p;
  const bool varlen = p.cu_seqlens_k != nullptr;
  const int g = c.lane >> 2, t4 = c.lane & 3;
  u16* g_dk = static_cast<u16*>(p.grad_k.ptr);
  u16* g_dv = static_cast<u16*>(p.grad_v.ptr);
#pragma unroll
  for (int mt = 0; mt < kMtKV; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = c.n0 + wn0 + 16 * mt + g + 8 * r;
      if (j >= c.seq.rows_k) continue;
      const i64 dk_row = row_offset(p.grad_k, varlen, c.b, c.seq.k_start, j, c.hk);
      const i64 dv_row = row_offset(p.grad_v, varlen, c.b, c.seq.k_start, j, c.hk);
#pragma unroll
      for (int nt = 0; nt < kNtKV; ++nt) {
        const int col = wd0 + 8 * nt + 2 * t4;
        const u32 k2 = Elem::pack(acc_dk[mt][nt][2 * r] * p.scale, acc_dk[mt][nt][2 * r + 1] * p.scale);
        const u32 v2 = Elem::pack(acc_dv[mt][nt][2 * r], acc_dv[mt][nt][2 * r + 1]);
        if (prm.vec) {  // 16-byte aligned rows, even column: 4-byte stores
          if (col < p.d) *reinterpret_cast<u32*>(g_dk + dk_row + col) = k2;
          if (col < p.dv) *reinterpret_cast<u32*>(g_dv + dv_row + col) = v2;
        } else {
          if (col < p.d) g_dk[dk_row + col] = (u16)(k2 & 0xffffu), g_dk[dk_row + col + 1] = (u16)(k2 >> 16);
          if (col < p.dv) g_dv[dv_row + col] = (u16)(v2 & 0xffffu), g_dv[dv_row + col + 1] = (u16)(v2 >> 16);
        }
      }
    }
  }
}

}  // namespace flashport::cuda::bwd

using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::bwd;

/// Grid (x, hk, batch). Non-deterministic: x = key block. Deterministic: x = dq_accum slice, and the
/// CTA visits key blocks x, x + gridDim.x, ... Block kThreads, dynamic smem kSmemBytes.
///
/// Per (key block, query head, query block) step, barriers:
///   wait Q/dO; sync(1) -> stage A (reads s_q s_k s_do s_v, writes s_p s_ds) -> sync(2) -> stage B
///   (reads s_p s_do s_ds s_q) -> sync(3) -> prefetch the Q/dO of step + kStages into this step's
///   s_q/s_do buffer (free after 3) -> stage C (reads s_ds s_k). Sync(1) of the next step orders stage C's
///   s_ds reads before stage A rewrites it; the sync at the top of a key block orders the last stage C before
///   s_k is reloaded.
extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    attn_bwd(const __grid_constant__ BwdParams prm) {
  order_after_prior_grids();
  const AttnProblem& p = prm.p;
  Cta c;
  c.b = (int)blockIdx.z + prm.batch_offset;
  c.hk = (int)blockIdx.y;
  c.seq = sequence(p, c.b);
  c.smem = smem_addr(dynamic_smem<unsigned char>());
  c.lane = lane_id(), c.warp = warp_id();
  const int group = (int)gqa_group(p);
  const int len_q = c.seq.len_q, len_k = c.seq.len_k;
  const int wn0 = (c.warp / kGridKV.cols) * (kBN / kGridKV.rows);  // this warp's dK/dV tile
  const int wd0 = (c.warp % kGridKV.cols) * (kHD / kGridKV.cols);
  const u32 a_off_kv = lane_offset<Store::kRowsK, true, kPitchS>(wn0, c.lane);
  const u32 b_off_kv = lane_offset<Store::kRowsK, false, kPitch>(wd0, c.lane);

  for (int nb = (int)blockIdx.x; nb * kBN < c.seq.rows_k; nb += (int)gridDim.x) {
    c.n0 = nb * kBN;
    const sem::Tiles<int> q_blocks = seeing_query_blocks(p, c.seq, c.n0, kBN, kBM);
    const int m_begin = q_blocks.begin, n_m = q_blocks.end - q_blocks.begin;
    const int steps = group * n_m;  // (query head, query block) pairs, head-major

    __syncthreads();  // the previous key block's stage C is done with s_k, s_ds
    // Step t visits query head hk * group + t / n_m, query block m_begin + t % n_m; its Q/dO tiles
    // live in buffer t % kStages. Groups in flight at the top of step t: t's and (2 stages) t + 1's.
    if (steps > 0) {
      load_k_v(prm, c);
      load_q_do(prm, c, group_head(c.hk, group, 0), m_begin * kBM, 0);
      cp_async_commit();
      if (kStages == 2 && steps > 1) {
        load_q_do(prm, c, group_head(c.hk, group, 1 / n_m), (m_begin + 1 % n_m) * kBM, 1);
        cp_async_commit();
      }
    }

    float acc_dk[kMtKV][kNtKV][4], acc_dv[kMtKV][kNtKV][4];  // (kBN, kHD) over the CTA
    zero(acc_dk);
    zero(acc_dv);
    for (int step = 0; step < steps; ++step) {
      const int h = group_head(c.hk, group, step / n_m), m0 = (m_begin + step % n_m) * kBM;
      const int buf = kStages == 2 ? step & 1 : 0;
      const u32 qdo = (u32)buf * kStageBytes;
      if (kStages == 2 && step + 1 < steps)
        cp_async_wait<1>();  // this step's group; the next step's may stay in flight
      else
        cp_async_wait_all();
      __syncthreads();  // (1)
      stage_scores(prm, c, h, m0, buf);
      __syncthreads();  // (2)
      // Stage B: dV += (P Z)^T dO, dK += dS^T Q (query rows past len_q hold zeros in s_p / s_ds).
      const int m_end = round16(min_int(kBM, len_q - m0));
      if constexpr (kPipe >= 3) {
        if (wd0 < p.dv)
          warp_mma_pipe<Elem, kMtKV, kNtKV, kBM, Store::kRowsK, kPitchS, Store::kRowsK, kPitch>(
              acc_dv, c.smem + kOffP + a_off_kv, c.smem + qdo + kOffDO + b_off_kv, m_end);
        if (wd0 < p.d)
          warp_mma_pipe<Elem, kMtKV, kNtKV, kBM, Store::kRowsK, kPitchS, Store::kRowsK, kPitch>(
              acc_dk, c.smem + kOffDS + a_off_kv, c.smem + qdo + kOffQ + b_off_kv, m_end);
      } else {
        if (wd0 < p.dv)
          warp_mma<Elem, kMtKV, kNtKV, kBM, Store::kRowsK, kPitchS, Store::kRowsK, kPitch>(
              acc_dv, c.smem + kOffP + a_off_kv, c.smem + qdo + kOffDO + b_off_kv, m_end);
        if (wd0 < p.d)
          warp_mma<Elem, kMtKV, kNtKV, kBM, Store::kRowsK, kPitchS, Store::kRowsK, kPitch>(
              acc_dk, c.smem + kOffDS + a_off_kv, c.smem + qdo + kOffQ + b_off_kv, m_end);
      }
      __syncthreads();  // (3): buffer `buf` is free (stages A and B of this step were its last readers)
      const int next = step + kStages;
      if (next < steps) {
        load_q_do(prm, c, group_head(c.hk, group, next / n_m), (m_begin + next % n_m) * kBM, buf);
        cp_async_commit();
      }
      stage_dq(prm, c, h, m0);
    }
    store_dk_dv(prm, c, acc_dk, acc_dv, wn0, wd0);
  }
  cp_async_wait_all();
}
