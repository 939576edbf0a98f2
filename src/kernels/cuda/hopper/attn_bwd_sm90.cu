// Hopper (sm_90a) FlashAttention backward main kernel: one CTA per (128-key block, kv head, sequence)
// keeps dK and dV of its keys in registers and walks every (query head of its GQA group, query block)
// that can see them. A producer warpgroup streams Q and dO tiles by TMA and LSE / D by one warp into
// a ring guarded by mbarriers; two consumer warpgroups (64 keys each) run the five GEMMs per step with
// wgmma in the transposed orientation, so that P^T and dS^T come out of S^T = K Q^T and dP^T = V dO^T
// already in the register layout of the A operand of dV += P^T dO and dK += dS^T Q. dS^T also goes to
// shared memory for dQ = dS K, whose fp32 partials two producer warps add to the accumulator in global
// memory.
// Shape from -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_STAGES (tile_for in bwd_sm90_config.h).
#include "core/problem.h"
#include "cuda/bwd_seq.cuh"
#include "cuda/common/common.cuh"
#include "cuda/hopper/bwd_sm90_config.h"
#include "cuda/hopper/sm90.cuh"
#include "cuda/hopper/wgmma.cuh"

#if !defined(FP_DTYPE) || !defined(FP_HEADDIM) || !defined(FP_BLOCK_M) || !defined(FP_STAGES)
#error "attn_bwd_sm90 needs -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_STAGES"
#endif

namespace flashport::cuda::hopper_bwd {

using Elem = FP_DTYPE;
constexpr int kHeadDim = FP_HEADDIM;  // d == dv
constexpr int kBlockM = FP_BLOCK_M;   // queries per step: N of S^T, K of dV / dK
constexpr int kStages = FP_STAGES;    // Q / dO / LSE / D ring depth
constexpr int kChunks = head_dim_chunks(kHeadDim);
constexpr int kPadD = kChunks * 64;  // N of dV / dK: whole 128B-swizzle atoms (d 96: 32 zero columns)
constexpr int kKVChunkBytes = kBlockN * kChunkRowBytes;  // one 64-column chunk of K or V
constexpr int kQChunkBytes = kBlockM * kChunkRowBytes;   // one 64-column chunk of Q or dO
constexpr int kDsChunkBytes = kBlockN * kChunkRowBytes;  // 64 queries of dS^T for all keys
constexpr int kQTileBytes = kChunks * kQChunkBytes;
// dQ (64 queries x kPadD) = dS K is split between the consumers as two 64 x 64 tiles: at kPadD 128 by
// columns (each over all 128 keys: the consumers first wait for each other's half of dS^T), at kPadD 64
// by keys (each over its own 64 keys, no wait; the dQ warps add the two partial tiles).
constexpr bool kDqSplitKeys = kPadD == 64;
constexpr int kDqKeys = kDqSplitKeys ? 64 : kBlockN;  // K of one consumer's dQ GEMM
static_assert(kBlockM == 64 && (kPadD == 64 || kPadD == 128), "tile_for's shapes only");
static_assert(kStages >= 1, "at least one Q / dO buffer");

/// What every thread of the CTA knows about its work: the sequence, kv head, keys [n0, n0 + kBlockN)
/// and the (query head, query block) steps, head-major: step t is head hk * group + t / n_m, query
/// block m_begin + t % n_m.
struct Work {
  int b, hk, n0, group, m_begin, n_m, steps;
  bwd::Seq seq;
};

// ---------------------------------------------------------------------------------------------
// Shared memory. Every tile is stored as 64-column chunks of rows x 128 bytes in the 128B-swizzle
// layout TMA writes, each chunk 1024-byte aligned. dS^T: rows = keys, 64-query chunks (M-contiguous
// for the dQ GEMM's A operand), written by the consumers in the same swizzle.

struct alignas(1024) SharedStorage {
  u16 k[kChunks][kBlockN][64];
  u16 v[kChunks][kBlockN][64];
  u16 q[kStages][kChunks][kBlockM][64];
  u16 dout[kStages][kChunks][kBlockM][64];
  u16 ds[2][kBlockM / 64][kBlockN][64];  // double buffer: one barrier per step orders reuse
  float dq[2][16][128][2];       // dQ tiles of the step in fragment order: [consumer][register pair][thread]
  float lse2[kStages][kBlockM];  // LSE * log2(e); +inf for rows without keys or past the end
  float dsum[kStages][kBlockM];  // D; 0 past the end
  u64 bar_kv;                    // K and V landed
  u64 bar_full[kStages];         // Q, dO bytes landed and 32 LSE/D lanes arrived
  u64 bar_empty[kStages];        // 256 consumer threads done with the stage
  u64 bar_dq_full;               // 256 consumer threads stored the step's dQ
  u64 bar_dq_empty;              // the 64 dQ threads read it
};
static_assert(sizeof(SharedStorage) + 1024 == smem_bytes(kHeadDim, Tile{kBlockM, kStages}),
              "host and kernel disagree on the shared-memory size");
static_assert(smem_bytes(kHeadDim, Tile{kBlockM, kStages}) <= kSmemLimit, "over 227 KB");

constexpr u32 kBarDs = 1;              // named barrier: both consumers' dS^T stored (256 threads)
constexpr int kConsumerThreads = 256;  // arrivals that release a stage
constexpr u32 kFullArrivals = 33;      // the TMA thread's arrive.expect_tx + the LSE/D warp's 32 lanes
constexpr int kDqThreads = 64;         // warps 2 and 3 of the producer warpgroup add dQ to global memory
// 128 x 40 + 256 x 232 = 64512 <= 65536 registers; the dQ warps need more than a TMA-only 24.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;

FP_DEV u32 bar_addr(const u64& bar) {
  return smem_addr(&bar);
}

FP_DEV int min_int(int a, int b) {
  return a < b ? a : b;
}

FP_DEV Work make_work(const BwdParams& prm) {
  const AttnProblem& p = prm.p;
  Work w;
  w.b = (int)blockIdx.z + prm.batch_offset;
  w.hk = (int)blockIdx.y;
  w.n0 = (int)blockIdx.x * kBlockN;
  w.group = (int)(p.hq / p.hk);
  w.seq = bwd::sequence(p, w.b);
  w.m_begin = w.n_m = 0;
  const int len_q = w.seq.len_q, len_k = w.seq.len_k;
  if (w.n0 < len_k && len_q > 0) {
    // Queries that see a key of [n0, n1): i + shift - wl <= j <= i + shift + wr for some j there.
    const i64 n1 = min_int(w.n0 + kBlockN, len_k), shift = (i64)len_k - len_q;
    const i64 i_lo = p.window_right < 0 ? 0 : w.n0 - p.window_right - shift;
    const i64 i_hi = p.window_left < 0 ? len_q : n1 + p.window_left - shift;
    const int lo = (int)clamp_i64(i_lo, 0, len_q), hi = (int)clamp_i64(i_hi, 0, len_q);
    if (hi > lo) w.m_begin = lo / kBlockM, w.n_m = (hi + kBlockM - 1) / kBlockM - w.m_begin;
  }
  w.steps = w.group * w.n_m;
  return w;
}

FP_DEV int step_head(const Work& w, int t) {
  return w.hk * w.group + t / w.n_m;
}
FP_DEV int step_m0(const Work& w, int t) {
  return (w.m_begin + t % w.n_m) * kBlockM;
}

// ---------------------------------------------------------------------------------------------
// Producer.

/// One thread: K and V once, then Q and dO of every step through the ring. A stage is reused once all
/// 256 consumer threads released it (the empty-barrier wait uses the opposite parity, so the first pass
/// over the ring does not block).
FP_DEV void produce_tiles(const BwdSm90Params& prm, SharedStorage& s, const Work& w, const TmaDesc& tma_q,
                          const TmaDesc& tma_k, const TmaDesc& tma_v, const TmaDesc& tma_do) {
  const AttnProblem& p = prm.bwd.p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int k_row = (varlen ? w.seq.k_start : 0) + w.n0, k_batch = varlen ? 0 : w.b;
  const u32 bar_kv = bar_addr(s.bar_kv);
  sm90::mbar_arrive_expect_tx(bar_kv, 2 * kChunks * kKVChunkBytes);
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    sm90::tma_load_chunk(smem_addr(&s.k[ch][0][0]), tma_k, prm.dims_k, bar_kv, 64 * ch, w.hk, k_row, k_batch);
    sm90::tma_load_chunk(smem_addr(&s.v[ch][0][0]), tma_v, prm.dims_v, bar_kv, 64 * ch, w.hk, k_row, k_batch);
  }
  const int q_batch = varlen ? 0 : w.b;
  for (int t = 0; t < w.steps; ++t) {
    const int stage = t % kStages;
    const u32 phase = (u32)(t / kStages) & 1u;
    const int h = step_head(w, t), q_row = (varlen ? w.seq.q_start : 0) + step_m0(w, t);
    sm90::mbar_wait(bar_addr(s.bar_empty[stage]), phase ^ 1u);
    const u32 full = bar_addr(s.bar_full[stage]);
    sm90::mbar_arrive_expect_tx(full, 2 * kQTileBytes);
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      sm90::tma_load_chunk(smem_addr(&s.q[stage][ch][0][0]), tma_q, prm.dims_q, full, 64 * ch, h, q_row,
                           q_batch);
      sm90::tma_load_chunk(smem_addr(&s.dout[stage][ch][0][0]), tma_do, prm.dims_do, full, 64 * ch, h, q_row,
                           q_batch);
    }
  }
}

/// One warp: LSE (as LSE * log2 e, +inf where the row sees no key or lies past the sequence, so that
/// P = exp2(x - inf) = 0) and D of every step's query block into the ring, one arrival per lane.
FP_DEV void produce_rows(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int lane) {
  const AttnProblem& p = prm.bwd.p;
  constexpr float kInf = __builtin_bit_cast(float, 0x7f800000u);
  for (int t = 0; t < w.steps; ++t) {
    const int stage = t % kStages;
    const u32 phase = (u32)(t / kStages) & 1u;
    const int h = step_head(w, t), m0 = step_m0(w, t);
    const i64 row0 = bwd::lse_row0(p, w.seq, w.b, h);
    sm90::mbar_wait(bar_addr(s.bar_empty[stage]), phase ^ 1u);
#pragma unroll
    for (int r = lane; r < kBlockM; r += 32) {
      const int i = m0 + r;
      const bool in = i < w.seq.len_q;
      const float lse = in ? p.lse[row0 + i] : -kInf;
      s.lse2[stage][r] = lse == -kInf ? kInf : lse * sem::kLog2e;
      s.dsum[stage][r] = in ? prm.bwd.dsum[row0 + i] : 0.0f;
    }
    sm90::mbar_arrive(bar_addr(s.bar_full[stage]));
  }
}

/// Two floats at an 8-byte aligned shared address.
FP_DEV Float2 ld_shared_f32x2(u32 s_addr) {
  Float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(s_addr) : "memory");
  return v;
}

/// Adds v to g[0..1] when `pred` (predicated inside the asm: no branch around it).
FP_DEV void red_add_f32x2_if(bool pred, float* g, Float2 v) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::
          "l"(g),
      "f"(v.x), "f"(v.y), "r"((int)pred)
      : "memory");
}

/// Warps 2 and 3 (thread `wt` of 64): every step's dQ tiles from s.dq, added to the fp32 accumulator with
/// vector reductions. Keeping the reductions off the consumers keeps their proxy fence (before each dS^T
/// is read by wgmma) from waiting for outstanding global reductions.
///
/// s.dq[c][q][tid] holds register pair q of consumer c's thread tid: accumulator row 16 (tid / 32) +
/// (tid % 32) / 4 + 8 (q % 2), columns 64c (split by columns) + 8 (q / 2) + 2 (tid % 4) + {0, 1}. Slot k
/// of this thread is flat index 64k + wt = (c, q, tid) with c = k / 32, q = k / 2 % 16, tid = wt + 64 (k %
/// 2): rows differ from the thread's first by 32 (k % 2) + 8 (k / 2 % 2), columns by 64c + 8 (k / 4 % 8), all
/// compile-time once unrolled; a warp's request is one consumer warp's fragment, 8 rows x 32 bytes.
FP_DEV void drain_dq(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int wt) {
  const AttnProblem& p = prm.bwd.p;
  const i64 ld = prm.bwd.accum_ld;
  const int lane = wt & 31;
  const int row0 = 16 * (wt >> 5) + (lane >> 2), col0 = 2 * (lane & 3);
  const u32 s_slot0 = smem_addr(&s.dq[0][0][0][0]) + 8u * (u32)wt;
  constexpr int kSlots = kDqSplitKeys ? 32 : 64;  // by keys: slot k + 32 (consumer 1) is added to slot k
  constexpr int kBatch = kDqSplitKeys ? 4 : 8;    // loads in flight within the 40 registers
  for (int t = 0; t < w.steps; ++t) {
    const int h = step_head(w, t), m0 = step_m0(w, t);
    float* g_row0 = prm.bwd.dq_accum +
                    ((i64)h * prm.bwd.rows_total + bwd::accum_row0(p, w.seq, w.b) + m0 + row0) * ld + col0;
    const int rows_left = w.seq.len_q - m0 - row0;  // row offsets r < rows_left are inside the sequence
    // Slot k's row offset depends on k % 4 only: four row pointers and their bounds, then batches of 8
    // shared loads followed by 8 predicated reductions (the asm order keeps the loads ahead).
    float* g_rows[4];
    bool row_in[4];
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = 32 * (rr & 1) + 8 * (rr >> 1);
      g_rows[rr] = g_row0 + r * ld;
      row_in[rr] = r < rows_left;
    }
    sm90::mbar_wait(bar_addr(s.bar_dq_full), (u32)t & 1u);
#pragma unroll
    for (int k0 = 0; k0 < kSlots; k0 += kBatch) {
      Float2 v[kBatch];
#pragma unroll
      for (int k = k0; k < k0 + kBatch; ++k) {
        v[k - k0] = ld_shared_f32x2(s_slot0 + 512u * k);
        if (kDqSplitKeys) {
          const Float2 v1 = ld_shared_f32x2(s_slot0 + 512u * (k + 32));
          v[k - k0].x += v1.x, v[k - k0].y += v1.y;
        }
      }
#pragma unroll
      for (int k = k0; k < k0 + kBatch; ++k) {
        const int col = 64 * (k >> 5) + 8 * ((k >> 2) & 7);
        if (kHeadDim % 64 != 0 && col >= kHeadDim)
          continue;  // d 96: padding columns (compile-time for t4 = 0)
        red_add_f32x2_if(row_in[k & 3] && col + col0 < kHeadDim, g_rows[k & 3] + col, v[k - k0]);
      }
    }
    sm90::mbar_arrive(bar_addr(s.bar_dq_empty));
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer GEMMs (descriptors: sm90.cuh). Consumer c owns keys n0 + 64c .. + 63: the rows 64c.. of K
// and V as K-major A operands. Q and dO serve as K-major B (S^T, dP^T: k steps along d) and as
// MN-major B (dV, dK: k steps of 16 queries = 2048 bytes, N = d across chunks by LBO).

/// acc (64 keys x kBlockM queries) = rows of `a` (K or V) times `b`^T (Q or dO), K = d.
FP_DEV void gemm_keys_by_queries(float (&acc)[kBlockM / 2], u64 desc_a, u64 desc_b) {
  sm90::gemm_ss_kmajor<kBlockM, kHeadDim, kKVChunkBytes, kQChunkBytes>(acc, desc_a, desc_b);
}

/// acc (64 keys x kPadD) += a (registers: P^T or dS^T, 64 keys x kBlockM queries) times b (dO or Q).
FP_DEV void gemm_accumulate_kv(float (&acc)[kPadD / 2], const u32 (&a)[kBlockM / 4], u64 desc_b) {
  sm90::gemm_rs_mn<kPadD, kBlockM>(acc, a, desc_b);
}

/// acc (64 queries x 64 columns of dQ) = dS (MN-major from dS^T) times K (MN-major), K = kBlockN keys.
FP_DEV void gemm_dq(float (&acc)[32], u64 desc_ds, u64 desc_k) {
#pragma unroll
  for (int kk = 0; kk < kDqKeys / 16; ++kk)
    sm90::Wgmma<64>::ss_mn(acc, sm90::desc_advance(desc_ds, kk * 16 * kChunkRowBytes),
                           sm90::desc_advance(desc_k, kk * 16 * kChunkRowBytes), kk == 0 ? 0u : 1u);
}

// ---------------------------------------------------------------------------------------------
// Scores. Fragment element e = 4j + 2h + x of a (64 keys x kBlockM) accumulator is key row
// 16 * warp + g + 8h of the consumer's 64, query column 8j + 2 * (lane % 4) + x of the step.

/// P^T = exp2(S^T * scale * log2 e - LSE * log2 e), 0 outside each query's visible keys, in r_s;
/// dS^T = P^T (dP^T - D) in r_dp. LSE / D of a column pair come from one 8-byte shared load (the 4 lanes
/// of a quad read different pairs, the 8 quads the same: broadcast). Visibility in 32 bits: key j is
/// visible to query i iff shift - wl <= j - i <= shift + wr and j < len_k (SPEC's window around the
/// bottom-right diagonal; sem::visible_keys), queries past the sequence get P = 0 from their LSE. The mask
/// is applied to every tile, branch-free: a branch around it (for tiles every query sees whole) makes
/// ptxas serialise all wgmmas of the loop (C7512, "insufficient register resources").
FP_DEV void scores_to_grads(float (&r_s)[kBlockM / 2], float (&r_dp)[kBlockM / 2], const AttnProblem& p,
                            const SharedStorage& s, const Work& w, int stage, int m0, int key0, int tid) {
  const int lane = tid & 31, t4 = lane & 3;
  const int len_q = w.seq.len_q, len_k = w.seq.len_k;
  const float scale_log2 = p.scale * sem::kLog2e;
  constexpr int kFar = 1 << 30;  // |j - i| < 2^30: the host bounds sequence lengths by 2^30
  const int shift = len_k - len_q;
  const int lo_off = p.window_left < 0 || p.window_left >= kFar ? -kFar : shift - (int)p.window_left;
  const int hi_off = p.window_right < 0 || p.window_right >= kFar ? kFar : shift + (int)p.window_right;
  const int key = key0 + 16 * (tid >> 5) + (lane >> 2);  // key of the h = 0 elements (h = 1: + 8)
  // visible iff 0 <= diff - lo_off <= hi_off - lo_off (unsigned: one compare), diff = key - query;
  // rel0 is that offset for element (j = 0, h = 0, x = 0). Pinned here: otherwise ptxas computes the
  // per-element offsets ahead of the wgmma wait and keeps them live beside S and dP (spills at d 64).
  int rel0 = key - (m0 + 2 * t4) - lo_off;
  u32 span = (u32)(hi_off - lo_off);
  asm volatile("" : "+r"(rel0), "+r"(span));
  const bool key_in[2] = {key < len_k, key + 8 < len_k};
#pragma unroll
  for (int j = 0; j < kBlockM / 8; ++j) {
    const u32 col_addr = 4u * (8 * j + 2 * t4);
    const Float2 lse2 = ld_shared_f32x2(smem_addr(&s.lse2[stage][0]) + col_addr);
    const Float2 dsum = ld_shared_f32x2(smem_addr(&s.dsum[stage][0]) + col_addr);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int e = 4 * j + 2 * h + x;
        float arg = fmaf(r_s[e], scale_log2, -(x ? lse2.y : lse2.x));
        const u32 rel = (u32)(rel0 + 8 * h - 8 * j - x);
        if (!(key_in[h] && rel <= span)) arg = sem::kNegInf;
        const float prob = fast_exp2(arg);  // 2^-inf = 0
        r_dp[e] = prob * (r_dp[e] - (x ? dsum.y : dsum.x));
        r_s[e] = prob;
      }
    }
  }
}

/// fp32 fragment -> register A operand: pair (e, e + 1) becomes register e / 2, low half first.
FP_DEV void pack_operand(const float (&f)[kBlockM / 2], u32 (&r)[kBlockM / 4]) {
#pragma unroll
  for (int q = 0; q < kBlockM / 4; ++q) r[q] = Elem::pack(f[2 * q], f[2 * q + 1]);
}

FP_DEV void st_shared_u32(u32 s_addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(s_addr), "r"(v) : "memory");
}
FP_DEV void st_shared_f32x2(u32 s_addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(s_addr), "f"(x), "f"(y) : "memory");
}

/// dS^T (packed) into buffer `buf`: key row 64c + 16 * warp + g + 8h, query pair 8j + 2t in chunk j / 8,
/// 16-byte unit j % 8 swizzled by the row (conflict-free: the 8 rows g land in 8 different units).
FP_DEV void store_ds(SharedStorage& s, const u32 (&r_ds)[kBlockM / 4], int buf, int c, int tid) {
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const u32 base = smem_addr(&s.ds[buf][0][0][0]);
#pragma unroll
  for (int j = 0; j < kBlockM / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 64 * c + 16 * (tid >> 5) + g + 8 * h;  // row % 8 == g
      const u32 addr = base + (j / 8) * kDsChunkBytes + row * kChunkRowBytes + (((j % 8) ^ g) << 4) + 4 * t4;
      st_shared_u32(addr, r_ds[2 * j + h]);
    }
  }
}

/// dK (times the softmax scale) and dV of this consumer's keys < rows_k, columns < d.
FP_DEV void store_dk_dv(const AttnProblem& p, const Work& w, const float (&r_dk)[kPadD / 2],
                        const float (&r_dv)[kPadD / 2], int c, int tid) {
  const bool varlen = p.cu_seqlens_k != nullptr;
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  u16* g_dk = static_cast<u16*>(p.grad_k.ptr);
  u16* g_dv = static_cast<u16*>(p.grad_v.ptr);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = w.n0 + 64 * c + 16 * (tid >> 5) + g + 8 * h;
    if (key >= w.seq.rows_k) continue;
    const i64 dk_row = bwd::row_offset(p.grad_k, varlen, w.b, w.seq.k_start, key, w.hk);
    const i64 dv_row = bwd::row_offset(p.grad_v, varlen, w.b, w.seq.k_start, key, w.hk);
#pragma unroll
    for (int j = 0; j < kPadD / 8; ++j) {
      const int col = 8 * j + 2 * t4;
      if (col >= kHeadDim) continue;
      const int e = 4 * j + 2 * h;
      *reinterpret_cast<u32*>(g_dk + dk_row + col) = Elem::pack(r_dk[e] * p.scale, r_dk[e + 1] * p.scale);
      *reinterpret_cast<u32*>(g_dv + dv_row + col) = Elem::pack(r_dv[e], r_dv[e + 1]);
    }
  }
}

/// Every consumer thread arrives on a stage's empty barrier once this warp's wgmmas reading it completed:
/// each thread's own shared reads of the stage (LSE, D) are then ordered before the producer's next writes
/// by its own release (one arrival per warp after a warp sync is equivalent, but compute-sanitizer's
/// racecheck does not see that ordering and reports the LSE/D writes as races).
FP_DEV void release(const u64& bar, int) {
  sm90::mbar_arrive(bar_addr(bar));
}

/// Consumer warpgroup c (0 or 1). Per step: S^T and dP^T (one wgmma batch), P^T and dS^T in registers,
/// dS^T to shared memory, dV and dK (register A operands), a barrier of both consumers, dQ for its
/// 64 x 64 share, release of the stage, dQ atomics.
FP_DEV void consume(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int c, int tid) {
  const AttnProblem& p = prm.bwd.p;
  const int lane = tid & 31;
  const int key0 = w.n0 + 64 * c;
  float r_dk[kPadD / 2], r_dv[kPadD / 2];
#pragma unroll
  for (int e = 0; e < kPadD / 2; ++e) r_dk[e] = r_dv[e] = 0.0f;

  if (w.steps > 0) {
    const u64 desc_k_rows = sm90::smem_desc(smem_addr(&s.k[0][0][0]) + 64 * c * kChunkRowBytes, 16, 1024);
    const u64 desc_v_rows = sm90::smem_desc(smem_addr(&s.v[0][0][0]) + 64 * c * kChunkRowBytes, 16, 1024);
    // dQ operands: dS rows (queries) 64c.. or all; K columns (d) 64c.. or all.
    // dQ operands: dS^T rows (keys) 64c.. (by keys) or all, K columns (d) 64c.. (by columns) or all.
    const u32 ds_off = kDqSplitKeys ? c * 64 * kChunkRowBytes : 0;
    const u64 desc_k_dq = sm90::smem_desc(
        smem_addr(&s.k[0][0][0]) + (kDqSplitKeys ? c * 64 * kChunkRowBytes : c * kKVChunkBytes),
        kKVChunkBytes, 1024);
    const u32 s_dq = smem_addr(&s.dq[c][0][tid][0]);  // register pair q at + q * 1024 bytes
    sm90::mbar_wait(bar_addr(s.bar_kv), 0);

    for (int t = 0; t < w.steps; ++t) {
      const int stage = t % kStages, buf = t & 1;
      const u32 phase = (u32)(t / kStages) & 1u;
      const int m0 = step_m0(w, t);
      const u32 s_q = smem_addr(&s.q[stage][0][0][0]), s_do = smem_addr(&s.dout[stage][0][0][0]);
      float r_s[kBlockM / 2], r_dp[kBlockM / 2];
      u32 r_p[kBlockM / 4], r_ds[kBlockM / 4];
      float r_dq[32];

      sm90::mbar_wait(bar_addr(s.bar_full[stage]), phase);
      sm90::wgmma_fence();
      gemm_keys_by_queries(r_s, desc_k_rows, sm90::smem_desc(s_q, 16, 1024));
      gemm_keys_by_queries(r_dp, desc_v_rows, sm90::smem_desc(s_do, 16, 1024));
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::pin_registers(r_s);
      sm90::pin_registers(r_dp);

      scores_to_grads(r_s, r_dp, p, s, w, stage, m0, key0, tid);
      pack_operand(r_s, r_p);
      pack_operand(r_dp, r_ds);
      // Stored before the dK wgmma is issued: its A registers may not be read until it completes.
      store_ds(s, r_ds, buf, c, tid);
      sm90::fence_proxy_async();

      sm90::wgmma_fence();
      gemm_accumulate_kv(r_dv, r_p, sm90::smem_desc(s_do, kQChunkBytes, 1024));
      gemm_accumulate_kv(r_dk, r_ds, sm90::smem_desc(s_q, kQChunkBytes, 1024));
      sm90::wgmma_commit();
      if (!kDqSplitKeys) sm90::named_bar_sync(kBarDs, 256);  // both halves of dS^T are in shared memory
      gemm_dq(r_dq, sm90::smem_desc(smem_addr(&s.ds[buf][0][0][0]) + ds_off, kDsChunkBytes, 1024), desc_k_dq);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::pin_registers(r_dq);
      sm90::pin_registers(r_dk);
      sm90::pin_registers(r_dv);
      sm90::pin_registers(r_p);
      sm90::pin_registers(r_ds);
      release(s.bar_empty[stage], lane);
      // dQ to the drain warps: wait until they read the previous step's, then store in fragment order
      // (consecutive threads, consecutive 8 bytes: conflict-free).
      if (t > 0) sm90::mbar_wait(bar_addr(s.bar_dq_empty), (u32)(t - 1) & 1u);
#pragma unroll
      for (int q = 0; q < 16; ++q) st_shared_f32x2(s_dq + q * 128 * 8, r_dq[2 * q], r_dq[2 * q + 1]);
      sm90::mbar_arrive(bar_addr(s.bar_dq_full));
    }
  }
  store_dk_dv(p, w, r_dk, r_dv, c, tid);
}

FP_DEV void init_barriers(SharedStorage& s) {
  sm90::mbar_init(bar_addr(s.bar_kv), 1);
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    sm90::mbar_init(bar_addr(s.bar_full[st]), kFullArrivals);
    sm90::mbar_init(bar_addr(s.bar_empty[st]), kConsumerThreads);
  }
  sm90::mbar_init(bar_addr(s.bar_dq_full), 256);
  sm90::mbar_init(bar_addr(s.bar_dq_empty), kDqThreads);
  sm90::fence_barrier_init();
}

}  // namespace flashport::cuda::hopper_bwd

/// Grid (key blocks of 128, hk, batch chunk from prm.bwd.batch_offset); 384 threads; smem_bytes(d, tile)
/// of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(flashport::cuda::hopper_bwd::kThreads, 1)
    flashport_attn_bwd_sm90(const __grid_constant__ flashport::cuda::hopper_bwd::BwdSm90Params prm,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_q,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_k,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_v,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_do) {
  using namespace flashport::cuda;
  using namespace flashport::cuda::hopper_bwd;
  // Each role computes its Work after the split: nothing computed here stays live across it (the code
  // before setmaxnreg is register-allocated for the producer's small budget).
  if ((int)blockIdx.x * kBlockN >= bwd::sequence(prm.bwd.p, (int)blockIdx.z + prm.bwd.batch_offset).rows_k)
    return;  // no key row of this block exists: nothing to write
  extern __shared__ unsigned char smem_raw[];
  const u32 misalign = smem_addr(smem_raw) & 1023u;
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - misalign) & 1023u));
  const int warpgroup = __shfl_sync(kFullMask, (int)threadIdx.x / 128, 0);
  if (threadIdx.x == 0) init_barriers(s);
  __syncthreads();
  if (warpgroup == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    const Work w = make_work(prm.bwd);
    if (w.steps == 0) return;
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_desc(tma_q);
      sm90::tma_prefetch_desc(tma_k);
      sm90::tma_prefetch_desc(tma_v);
      sm90::tma_prefetch_desc(tma_do);
      produce_tiles(prm, s, w, tma_q, tma_k, tma_v, tma_do);
    } else if (threadIdx.x / 32 == 1) {
      produce_rows(prm, s, w, (int)threadIdx.x & 31);
    } else if (threadIdx.x >= 64) {
      drain_dq(prm, s, w, (int)threadIdx.x - 64);
    }
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    consume(prm, s, make_work(prm.bwd), warpgroup - 1, (int)threadIdx.x - 128 * warpgroup);
  }
}
