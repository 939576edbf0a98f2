// Hopper (sm_90a) FlashAttention backward main kernel: one CTA per (128-key block, kv head, sequence)
// keeps dK and dV of its keys in registers and walks every (query head of its GQA group, query block)
// that can see them. A producer warpgroup streams Q and dO tiles by TMA and LSE / D by one warp into
// a ring guarded by mbarriers; two consumer warpgroups (64 keys each) run the five GEMMs per step with
// wgmma in the transposed orientation, so that P^T and dS^T come out of S^T = K Q^T and dP^T = V dO^T
// already in the register layout of the A operand of dV += P^T dO and dK += dS^T Q. dS^T also goes to
// shared memory for dQ = dS K, whose fp32 tiles the consumers stage in shared memory and one producer
// thread adds to the accumulator in global memory with bulk reduce-adds (FP_DQ_MODE 1, d 64 and 128;
// mode 0 and d 96: two producer warps' vector reductions).
// Shape from -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_STAGES (tile_for in bwd_sm90_config.h).
#include "cuda/hopper/bwd_sm90_common.cuh"

namespace flashport::cuda::hopper_bwd {

constexpr int kDsChunkBytes = kBlockN * kChunkRowBytes;  // 64 queries of dS^T for all keys
// dQ (kBlockM queries x kPadD) = dS K is split between the consumers as two 64 x 64 tiles: at kPadD 128 by
// columns (each over all 128 keys: the consumers first wait for each other's half of dS^T), at kPadD 64
// by keys (each over its own 64 keys, no wait; the dQ warps add the two partial tiles), or with 128
// queries per step (d 64, Tile::block_m 128) by query rows (each 64 queries over all 128 keys, after
// the same wait): one tile per 64 queries, half the reduce-add traffic of the key split.
constexpr bool kDqSplitQueries = kBlockM == 128;
constexpr bool kDqSplitKeys = kPadD == 64 && !kDqSplitQueries;
// The host's hopper_bwd::tiled_accumulator: d 64 and 128 unless kRowMajorDq (d 96 is row-major always).
constexpr bool kTiledDq = kHeadDim == kPadD && !kRowMajorDq;
static_assert(!kRowMajorDq || kHeadDim == kPadD, "d 96's accumulator is row-major without FP_BWD_DQ_ROWS");
constexpr int kDqKeys = kDqSplitKeys ? 64 : kBlockN;  // K of one consumer's dQ GEMM
static_assert((kBlockM == 64 && (kPadD == 64 || kPadD == 128)) || (kBlockM == 128 && kPadD == 64),
              "tile_for's shapes and block_m 128 at d 64 only");
#ifndef FP_DQ_MODE
#define FP_DQ_MODE 0
#endif
#ifndef FP_BWD_PIPE
#define FP_BWD_PIPE 0
#endif
constexpr Tile kTile{kBlockM, kStages, FP_DQ_MODE, FP_BWD_PIPE};
constexpr bool kPipe = FP_BWD_PIPE != 0;  // Tile::pipe: the next step's S^T / dP^T issued ahead
static_assert(!kPipe || (pipe_fits(kHeadDim, FP_BWD_GENERAL) && kDqSplitKeys),
              "the pipelined loop's registers fit at d 64 without softcap or dropout");
// FP_BWD_ORDER 1 (the host's order_of, FLASHPORT_HOPPER_BWD_ORDER): the serial loop's GEMMs in overlapping
// groups. S^T and dP^T are two commit groups, P^T's exponentials run while dP^T's GEMM does (kGradsSplit);
// then dV, dQ (after both dS^T halves) and dK are three, and the step's dQ tile is staged while dK's GEMM
// runs. Same GEMMs and elementwise operations as order 0, in another order: the same bits.
#ifndef FP_BWD_ORDER
#define FP_BWD_ORDER 0
#endif
constexpr bool kOrdered = FP_BWD_ORDER != 0;
static_assert(!kOrdered || !kPipe, "the overlapping order is one of the serial loop");
// Timing-only ablations (FLASHPORT_JIT_DEFINES=FP_BWD_ABLATE=n, bit flags; the gradients are then wrong):
// 1 no dQ reduce-adds to global memory (bulk mode), 2 no dQ GEMM and no dQ staging stores, 4 no elementwise
// stage (P^T = S^T, dS^T = dP^T), 8 no dS^T stores to shared memory (with 2: no dQ work at all).
#ifndef FP_BWD_ABLATE
#define FP_BWD_ABLATE 0
#endif
constexpr int kAblate = FP_BWD_ABLATE;
constexpr bool kDqBulk = FP_DQ_MODE != 0;  // bulk reduce-adds from one producer thread (Tile::dq_mode)
constexpr int kDqBuffers = dq_buffers(kTile);
static_assert(!kDqBulk || (kTiledDq && bulk_dq_fits(kHeadDim)),
              "bulk dQ reductions need the tiled accumulator (the staged tile's order)");
static_assert(!kDqSplitQueries || (kDqBulk && !kPipe && kTiledDq),
              "128 queries per step: bulk dQ into the tiled accumulator, the serial loop");

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
  // The step's dQ tiles in fragment order: [buffer][consumer][register pair][thread].
  float dq[kDqBuffers][2][16][128][2];
  float lse2[kStages][kBlockM];  // LSE * log2(e); +inf for rows without keys or past the end
  float dsum[kStages][kBlockM];  // D; 0 past the end
  u64 bar_kv;                    // K and V landed
  u64 bar_full[kStages];         // Q, dO bytes landed and 32 LSE/D lanes arrived
  u64 bar_empty[kStages];        // 256 consumer threads done with the stage
  u64 bar_dq_full[kDqBuffers];   // 256 consumer threads stored the step's dQ
  u64 bar_dq_empty[kDqBuffers];  // the 64 dQ threads (bulk: the bulk copy) read it
};
static_assert(sizeof(SharedStorage) + 1024 == smem_bytes(kHeadDim, kTile),
              "host and kernel disagree on the shared-memory size");
static_assert(smem_bytes(kHeadDim, kTile) <= kSmemLimit, "over 227 KB");

constexpr u32 kBarDs = 1;       // named barrier: both consumers' dS^T stored (256 threads)
constexpr int kDqThreads = 64;  // warps 2 and 3 of the producer warpgroup add dQ to global memory
constexpr u32 kBarDqDrain = 2;  // named barrier of the 64 drain threads (deterministic mode)
// 128 x 40 + 256 x 232 = 64512 <= 65536 registers; the dQ warps need more than a TMA-only 24. With 128
// queries per step (bulk dQ: one producer thread drains) 128 x 24 + 256 x 240: the consumers spilled
// 40 bytes under 232.
static_assert(!kDropout || (dropout_fits(kHeadDim, FP_DQ_MODE) && !kDqSplitQueries),
              "dropout where the consumers' registers fit it (dropout_fits), on 64 queries per step");
// 128 queries per step and dropout at d 128 (bulk dQ: no drain warps) take 240 registers per consumer.
constexpr bool kWideConsumers = kDqSplitQueries || (kDropout && kDqBulk);
constexpr int kProducerRegs = kWideConsumers ? 24 : 40;
constexpr int kConsumerRegs = kWideConsumers ? 240 : 232;

/// Thread 64 (bulk mode), after step t's copy is committed: the previous step's staging buffer is free
/// once its copy has read it (this step's may still be read); a single buffer once this step's copy has.
FP_DEV void release_dq_buffer(SharedStorage& s, int t) {
  if (kDqBuffers == 1) {
    sm90::bulk_wait_read<0>();
    sm90::mbar_arrive(bar_addr(s.bar_dq_empty[0]));
  } else if (t > 0) {
    sm90::bulk_wait_read<1>();
    sm90::mbar_arrive(bar_addr(s.bar_dq_empty[(t - 1) % kDqBuffers]));
  }
}

/// Thread 64 (bulk mode): every step's staged dQ tile added to its accumulator tile by bulk reduce-adds.
/// The staging order is the accumulator's tile order (see drain_dq), so a step is one contiguous copy:
/// 32 KB at d 128 (the consumers' column halves side by side), or at d 64 the two consumers' 16 KB
/// partial tiles (split by keys) each added to the same 64 x 64 tile. Rows past the sequence hold zeros
/// (P = 0 there) and land in the sequence's own padding rows of the tiled accumulator. Deterministic mode
/// adds each tile in its turn and waits for the additions to be performed before passing the turn on.
FP_DEV void bulk_drain_dq(const BwdSm90Params& prm, SharedStorage& s, const Work& w) {
  const AttnProblem& p = prm.bwd.p;
  constexpr u32 kTileBytes = sizeof(s.dq[0]);
  const i64 row0 = bwd::accum_row0(p, w.seq, w.b, true);
  // 128 queries per step: never deterministic (the turns count 64-query tiles; the host takes 64).
  const bool deterministic = !kDqSplitQueries && prm.bwd.dq_tile_count != nullptr;
  for (int t = 0; t < w.steps; ++t) {
    const int buf = t % kDqBuffers;
    sm90::mbar_wait(bar_addr(s.bar_dq_full[buf]), (u32)(t / kDqBuffers) & 1u);
    const int h = step_head(w, t), m0 = step_m0(w, t);
    float* g_tile = prm.bwd.dq_accum + ((i64)h * prm.bwd.rows_total + row0 + m0) * kHeadDim;
    const u32 s_tile = smem_addr(&s.dq[buf][0][0][0][0]);
    int* counter = deterministic ? dq_tile_counter(prm.bwd, w, h, m0) : nullptr;
    if (deterministic) {
      wait_dq_turn(counter, dq_turn(p, w, m0));
      sm90::fence_proxy_async_global();
    }
    if (kAblate & 1) {
    } else if (kDqSplitQueries) {
      // Rows m0 + 64.. all past the sequence hold zeros: their tile may lie past its padded rows.
      sm90::bulk_reduce_add_f32(g_tile, s_tile, m0 + 64 < w.seq.len_q ? kTileBytes : kTileBytes / 2);
    } else if (kDqSplitKeys) {
      sm90::bulk_reduce_add_f32(g_tile, s_tile, kTileBytes / 2);
      if (deterministic) {  // two operations on one tile: ordered only by waiting for the first
        sm90::bulk_commit();
        sm90::bulk_wait_all();
      }
      sm90::bulk_reduce_add_f32(g_tile, s_tile + kTileBytes / 2, kTileBytes / 2);
    } else {
      sm90::bulk_reduce_add_f32(g_tile, s_tile, kTileBytes);
    }
    sm90::bulk_commit();
    if (deterministic) {
      sm90::bulk_wait_all();
      sm90::fence_proxy_async_global();
      pass_dq_turn(counter);
    }
    release_dq_buffer(s, t);
  }
  sm90::bulk_wait_all();
}

/// Warps 2 and 3 (thread `wt` of 64): every step's dQ tiles from s.dq, added to the fp32 accumulator with
/// vector reductions. Keeping the reductions off the consumers keeps their proxy fence (before each dS^T
/// is read by wgmma) from waiting for outstanding global reductions.
///
/// s.dq[c][q][tid] holds register pair q of consumer c's thread tid: accumulator row 16 (tid / 32) +
/// (tid % 32) / 4 + 8 (q % 2), columns 64c (split by columns) + 8 (q / 2) + 2 (tid % 4) + {0, 1}. Slot k
/// of this thread is flat index 64k + wt = (c, q, tid) with c = k / 32, q = k / 2 % 16, tid = wt + 64 (k %
/// 2): rows differ from the thread's first by 32 (k % 2) + 8 (k / 2 % 2), columns by 64c + 8 (k / 4 % 8), all
/// compile-time once unrolled. At d 64 and 128 the accumulator is tiled in this same order
/// (BwdParams::accum_tiled = 64): slot k goes to float pair 64k + wt of the step's tile, so a warp's
/// reduction covers 256 contiguous bytes. At d 96 (row-major, padded columns skipped) it covers 8 rows x
/// 32 bytes, which L2 takes as 8 line reductions. Deterministic mode: thread 0 waits for the tile's
/// turn, and passes it on once every drain thread's reductions are performed.
FP_DEV void drain_dq(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int wt) {
  const AttnProblem& p = prm.bwd.p;
  // kRowMajorDq: the pitch is d (the host checks), so the four row pointers below are one base plus
  // immediate offsets (with the run-time pitch d 64's drain spilled 4-8 bytes); d 96 keeps accum_ld.
  const i64 ld = kRowMajorDq ? kHeadDim : prm.bwd.accum_ld;
  const int lane = wt & 31;
  const int row0 = 16 * (wt >> 5) + (lane >> 2), col0 = 2 * (lane & 3);
  const u32 s_slot0 = smem_addr(&s.dq[0][0][0][0][0]) + 8u * (u32)wt;
  const bool deterministic = prm.bwd.dq_tile_count != nullptr;
  constexpr int kSlots = kDqSplitKeys ? 32 : 64;  // by keys: slot k + 32 (consumer 1) is added to slot k
  constexpr int kBatch = kDqSplitKeys ? 4 : 8;    // loads in flight within the 40 registers
  for (int t = 0; t < w.steps; ++t) {
    const int h = step_head(w, t), m0 = step_m0(w, t);
    float* g_row0 =
        prm.bwd.dq_accum +
        (kTiledDq ? ((i64)h * prm.bwd.rows_total + bwd::accum_row0(p, w.seq, w.b, true) + m0) * ld + 2 * wt
                  : ((i64)h * prm.bwd.rows_total + bwd::accum_row0(p, w.seq, w.b) + m0 + row0) * ld + col0);
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
    sm90::mbar_wait(bar_addr(s.bar_dq_full[0]), (u32)t & 1u);
    int* counter = deterministic ? dq_tile_counter(prm.bwd, w, h, m0) : nullptr;
    if (deterministic) {
      if (wt == 0) wait_dq_turn(counter, dq_turn(p, w, m0));
      sm90::named_bar_sync(kBarDqDrain, kDqThreads);
    }
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
        if (kTiledDq)
          red_add_f32x2_if(row_in[k & 3], g_row0 + 128 * k, v[k - k0]);
        else
          red_add_f32x2_if(row_in[k & 3] && col + col0 < kHeadDim, g_rows[k & 3] + col, v[k - k0]);
      }
    }
    if (deterministic) {  // every drain thread's reductions performed, then the turn passes on
      __threadfence();
      sm90::named_bar_sync(kBarDqDrain, kDqThreads);
      if (wt == 0) pass_dq_turn(counter);
    }
    sm90::mbar_arrive(bar_addr(s.bar_dq_empty[0]));
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

/// One consumer warpgroup's view of the CTA: its descriptors and shared addresses, and the stages of a
/// step as named functions, so that the serial and the pipelined loops below order the same stages.
struct Consumer {
  const BwdSm90Params& prm;
  SharedStorage& s;
  const Work& w;
  int c, tid, key0;
  u64 desc_k_rows, desc_v_rows, desc_k_dq;
  u32 ds_off, s_dq;

  FP_DEV Consumer(const BwdSm90Params& prm_, SharedStorage& s_, const Work& w_, int c_, int tid_)
      : prm(prm_), s(s_), w(w_), c(c_), tid(tid_), key0(w_.n0 + 64 * c_) {
    desc_k_rows = sm90::smem_desc(smem_addr(&s.k[0][0][0]) + 64 * c * kChunkRowBytes, 16, 1024);
    desc_v_rows = sm90::smem_desc(smem_addr(&s.v[0][0][0]) + 64 * c * kChunkRowBytes, 16, 1024);
    // dQ operands: dS^T rows (keys) 64c.. (by keys) or all, K columns (d) 64c.. (by columns) or all.
    // By queries: dS^T chunk c (queries 64c..), all keys and columns of K.
    ds_off = kDqSplitKeys ? c * 64 * kChunkRowBytes : kDqSplitQueries ? c * kDsChunkBytes : 0;
    desc_k_dq = sm90::smem_desc(smem_addr(&s.k[0][0][0]) + (kDqSplitKeys      ? c * 64 * kChunkRowBytes
                                                            : kDqSplitQueries ? 0
                                                                              : c * kKVChunkBytes),
                                kKVChunkBytes, 1024);
    s_dq = smem_addr(&s.dq[0][c][0][tid][0]);  // register pair q at + q * 1024 bytes
  }
  FP_DEV u32 s_q(int t) const { return smem_addr(&s.q[t % kStages][0][0][0]); }
  FP_DEV u32 s_do(int t) const { return smem_addr(&s.dout[t % kStages][0][0][0]); }

  /// Waits for step t's stage, then issues S^T = K Q^T and dP^T = V dO^T (one commit group; two with
  /// `split`, S^T's first).
  template <bool split = false>
  FP_DEV void issue_scores(int t, float (&r_s)[kBlockM / 2], float (&r_dp)[kBlockM / 2]) {
    sm90::mbar_wait(bar_addr(s.bar_full[t % kStages]), (u32)(t / kStages) & 1u);
    sm90::wgmma_fence();
    gemm_keys_by_queries(r_s, desc_k_rows, sm90::smem_desc(s_q(t), 16, 1024));
    if constexpr (split) sm90::wgmma_commit();
    gemm_keys_by_queries(r_dp, desc_v_rows, sm90::smem_desc(s_do(t), 16, 1024));
    sm90::wgmma_commit();
  }

  /// Step t's dropout keep bits (FP_BWD_GENERAL >= 3), drawn while its S^T / dP^T GEMMs run.
  FP_DEV void draw_keep(int t, KeepBits<kBlockM>& keep) {
    if constexpr (kDropout) keep.draw(prm.bwd.p, w, step_head(w, t), step_m0(w, t), key0, tid);
  }

  /// P^T and dS^T of step t from its S^T and dP^T (fp32, in place), or one part of that (GradsPart).
  template <int part = kGradsWhole>
  FP_DEV void grads(int t, float (&r_s)[kBlockM / 2], float (&r_dp)[kBlockM / 2],
                    const KeepBits<kBlockM>& keep = {}) {
    if (!(kAblate & 4))
      scores_to_grads<kBlockM, part>(r_s, r_dp, prm.bwd.p, s, w, step_head(w, t), t % kStages, step_m0(w, t),
                                     0, key0, tid, keep);
  }

  /// P^T and dS^T packed as register A operands; dS^T also to shared memory for dQ. Stored before the
  /// dK wgmma is issued: its A registers may not be read until it completes.
  FP_DEV void pack(int t, const float (&r_s)[kBlockM / 2], const float (&r_dp)[kBlockM / 2],
                   u32 (&r_p)[kBlockM / 4], u32 (&r_ds)[kBlockM / 4]) {
    pack_operand<kBlockM>(r_s, r_p);
    pack_operand<kBlockM>(r_dp, r_ds);
    if (kAblate & 8) return;
    store_key_rows<kBlockM, kDsChunkBytes>(smem_addr(&s.ds[t & 1][0][0][0]), r_ds, 64 * c, 0, tid);
    sm90::fence_proxy_async();
  }

  /// dV += P^T dO, dK += dS^T Q, dQ = dS K (at d 128 after both consumers stored their dS^T halves): dV and
  /// dK one commit group, dQ another. `ordered` (kOrdered): dV, dQ, dK one group each, so that dQ can be
  /// staged while dK runs (wgmma_wait<1>).
  template <bool ordered = false>
  FP_DEV void issue_accumulate(int t, const u32 (&r_p)[kBlockM / 4], const u32 (&r_ds)[kBlockM / 4],
                               float (&r_dk)[kPadD / 2], float (&r_dv)[kPadD / 2], float (&r_dq)[32]) {
    const u64 desc_q = sm90::smem_desc(s_q(t), kQChunkBytes, 1024);
    sm90::wgmma_fence();
    gemm_accumulate_kv(r_dv, r_p, sm90::smem_desc(s_do(t), kQChunkBytes, 1024));
    if constexpr (!ordered) gemm_accumulate_kv(r_dk, r_ds, desc_q);
    sm90::wgmma_commit();
    if (!kDqSplitKeys) sm90::named_bar_sync(kBarDs, 256);  // both halves of dS^T are in shared memory
    if (!(kAblate & 2))
      gemm_dq(r_dq, sm90::smem_desc(smem_addr(&s.ds[t & 1][0][0][0]) + ds_off, kDsChunkBytes, 1024),
              desc_k_dq);
    sm90::wgmma_commit();
    if constexpr (ordered) {
      gemm_accumulate_kv(r_dk, r_ds, desc_q);
      sm90::wgmma_commit();
    }
  }

  /// After step t's accumulating GEMMs completed: release its stage, hand its dQ tile to the drain.
  FP_DEV void finish(int t, const float (&r_dq)[32]) {
    release(s.bar_empty[t % kStages]);
    stage_dq(t, r_dq);
  }

  /// Until dQ staging buffer dq_buf has been read by the drain after its use dq_use - 1 (step t's buffer:
  /// t % kDqBuffers, use t / kDqBuffers).
  FP_DEV void wait_dq_buffer(int dq_buf, int dq_use) {
    if (dq_use > 0) sm90::mbar_wait(bar_addr(s.bar_dq_empty[dq_buf]), (u32)(dq_use - 1) & 1u);
  }

  /// Step t's dQ tile to the drain once the buffer's previous use was read (fragment order: consecutive
  /// threads, consecutive 8 bytes).
  FP_DEV void stage_dq(int t, const float (&r_dq)[32]) {
    const int dq_buf = t % kDqBuffers, dq_use = t / kDqBuffers;
    // wait_dq_buffer's body, written out: the call changed order 0's SASS (register allocation only)
    if (dq_use > 0) sm90::mbar_wait(bar_addr(s.bar_dq_empty[dq_buf]), (u32)(dq_use - 1) & 1u);
    u32 s_dq_base = s_dq;
    if constexpr (kDropout) {  // recomputed per step: kept across the loop it spilled (d 96, 128)
      int t_dq = tid;
      asm volatile("" : "+r"(t_dq));
      s_dq_base = smem_addr(&s.dq[0][c][0][t_dq][0]);
    }
    const u32 s_dq_buf = s_dq_base + dq_buf * (u32)sizeof(s.dq[0]);
#pragma unroll
    for (int q = 0; q < 16; ++q)
      if (!(kAblate & 2)) st_shared_f32x2(s_dq_buf + q * 128 * 8, r_dq[2 * q], r_dq[2 * q + 1]);
    if (kDqBulk) sm90::fence_proxy_async();  // the bulk copy reads through the async proxy
    sm90::mbar_arrive(bar_addr(s.bar_dq_full[dq_buf]));
  }
};

/// Pins every register a step's accumulating GEMMs read or write, after their wait: ptxas may then not
/// touch them while the GEMMs run.
FP_DEV void pin_accumulate(float (&r_dk)[kPadD / 2], float (&r_dv)[kPadD / 2], float (&r_dq)[32],
                           u32 (&r_p)[kBlockM / 4], u32 (&r_ds)[kBlockM / 4]) {
  sm90::pin_registers(r_dq);
  sm90::pin_registers(r_dk);
  sm90::pin_registers(r_dv);
  sm90::pin_registers(r_p);
  sm90::pin_registers(r_ds);
}

/// Consumer warpgroup c (0 or 1): every step's S^T and dP^T, P^T and dS^T, dV, dK and its dQ share.
/// Serial: per step GEMMs, elementwise, GEMMs. Pipelined (kPipe): step t + 1's S^T / dP^T are issued
/// ahead of step t's dV / dK / dQ, so step t + 1's elementwise stage runs while they do.
FP_DEV void consume(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int c, int tid) {
  float r_dk[kPadD / 2], r_dv[kPadD / 2];
#pragma unroll
  for (int e = 0; e < kPadD / 2; ++e) r_dk[e] = r_dv[e] = 0.0f;

  if (w.steps > 0) {
    Consumer cs(prm, s, w, c, tid);
    float r_s[kBlockM / 2], r_dp[kBlockM / 2], r_dq[32];
    u32 r_p[kBlockM / 4], r_ds[kBlockM / 4];
    sm90::mbar_wait(bar_addr(s.bar_kv), 0);
    if constexpr (kPipe) {
      cs.issue_scores(0, r_s, r_dp);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(r_s);
      sm90::pin_registers(r_dp);
      // Step t's elementwise stage (while step t - 1's dV / dK / dQ run), then step t - 1's hand-off.
      auto grads_then_finish_previous = [&](int t) {
        cs.grads(t, r_s, r_dp);
        if (t > 0) {
          sm90::wgmma_wait<0>();
          pin_accumulate(r_dk, r_dv, r_dq, r_p, r_ds);
          cs.finish(t - 1, r_dq);
        }
        cs.pack(t, r_s, r_dp, r_p, r_ds);
      };
      // The last step is peeled: issuing the next scores under a branch makes ptxas serialise the
      // loop's wgmmas (C7514).
      for (int t = 0; t + 1 < w.steps; ++t) {
        grads_then_finish_previous(t);
        cs.issue_scores(t + 1, r_s, r_dp);
        cs.issue_accumulate(t, r_p, r_ds, r_dk, r_dv, r_dq);
        sm90::wgmma_wait<2>();  // the oldest group: step t + 1's scores
        sm90::pin_registers(r_s);
        sm90::pin_registers(r_dp);
      }
      const int last = w.steps - 1;
      grads_then_finish_previous(last);
      cs.issue_accumulate(last, r_p, r_ds, r_dk, r_dv, r_dq);
      sm90::wgmma_wait<0>();
      pin_accumulate(r_dk, r_dv, r_dq, r_p, r_ds);
      cs.finish(last, r_dq);
    } else if constexpr (kOrdered) {
      for (int t = 0; t < w.steps; ++t) {
        cs.issue_scores<kGradsSplit>(t, r_s, r_dp);
        KeepBits<kBlockM> keep;
        cs.draw_keep(t, keep);
        if constexpr (kGradsSplit) {  // P^T while dP^T's GEMM runs
          sm90::wgmma_wait<1>();
          sm90::pin_registers(r_s);
          cs.grads<kGradsProbs>(t, r_s, r_dp);
          // ptxas puts a wgmma wait at the top of its basic block, so the wait for dP^T needs a block
          // boundary after every P^T element: a branch on all of them (P^T >= 0, so always taken unless
          // all NaN), around a wait the step makes anyway (stage_dq repeats it, at no cost once complete).
          float low = r_s[0];
#pragma unroll
          for (int e = 1; e < kBlockM / 2; ++e) low = fminf(low, r_s[e]);
          if (low >= 0.0f) cs.wait_dq_buffer(t % kDqBuffers, t / kDqBuffers);
          sm90::wgmma_wait<0>();
          sm90::pin_registers(r_dp);
          cs.grads<kGradsFromProbs>(t, r_s, r_dp);
          cs.pack(t, r_s, r_dp, r_p, r_ds);
        } else {
          sm90::wgmma_wait<0>();
          sm90::pin_registers(r_s);
          sm90::pin_registers(r_dp);
          cs.grads(t, r_s, r_dp, keep);
          cs.pack(t, r_s, r_dp, r_p, r_ds);
        }
        cs.issue_accumulate<true>(t, r_p, r_ds, r_dk, r_dv, r_dq);
        sm90::wgmma_wait<1>();  // dV and dQ; dK may still run
        sm90::pin_registers(r_dq);
        sm90::pin_registers(r_dv);
        sm90::pin_registers(r_p);
        cs.stage_dq(t, r_dq);
        sm90::wgmma_wait<0>();
        pin_accumulate(r_dk, r_dv, r_dq, r_p, r_ds);
        release(s.bar_empty[t % kStages]);
      }
    } else {
      for (int t = 0; t < w.steps; ++t) {
        cs.issue_scores(t, r_s, r_dp);
        KeepBits<kBlockM> keep;
        cs.draw_keep(t, keep);
        sm90::wgmma_wait<0>();
        sm90::pin_registers(r_s);
        sm90::pin_registers(r_dp);
        cs.grads(t, r_s, r_dp, keep);
        cs.pack(t, r_s, r_dp, r_p, r_ds);
        cs.issue_accumulate(t, r_p, r_ds, r_dk, r_dv, r_dq);
        sm90::wgmma_wait<0>();
        pin_accumulate(r_dk, r_dv, r_dq, r_p, r_ds);
        cs.finish(t, r_dq);
      }
    }
  }
  store_dk_dv<kPadD>(prm.bwd.p, w, r_dk, r_dv, 64 * c, 0, tid);
}

/// The dQ hand-off: consumers stored the step's tiles (256 arrivals), the drain warps read them (64).
FP_DEV void init_more_barriers(SharedStorage& s) {
  for (int b = 0; b < kDqBuffers; ++b) {
    sm90::mbar_init(bar_addr(s.bar_dq_full[b]), 256);
    sm90::mbar_init(bar_addr(s.bar_dq_empty[b]), kDqBulk ? 1 : kDqThreads);
  }
}

/// One CTA per cluster: nothing to meet.
FP_DEV void sync_peers(const BwdSm90Params&, SharedStorage&) {}

/// Producer warps 2 and 3 drain dQ (bulk mode: thread 64 alone).
FP_DEV void produce_more(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int d) {
  if (kDqBulk) {
    if (d == 0) bulk_drain_dq(prm, s, w);
  } else {
    drain_dq(prm, s, w, d);
  }
}

}  // namespace flashport::cuda::hopper_bwd

FLASHPORT_BWD_SM90_KERNEL(flashport_attn_bwd_sm90)
