// Hopper (sm_90a) FlashAttention backward main kernel for d 256 (and d 192 on 64 zero columns,
// bwd_chunks): one CTA per (64-key block, kv head, sequence). dK and dV of 64 keys x 256 columns are 256
// fp32 registers per thread of one warpgroup, so both consumer warpgroups hold the same 64 keys and split the
// work of a step instead:
//   S^T = K Q^T, dP^T = V dO^T   by queries: consumer c computes query columns 32c .. 32c + 31, all keys;
//   P^T, dS^T                    to shared memory (each its 32 columns), then one barrier of both;
//   dV += P^T dO, dK += dS^T Q   by columns: consumer c owns columns 128c .. 128c + 127 (A from shared);
//   dQ = dS K                    by columns, added to the fp32 accumulator in global memory by the
//                                consumer itself, or staged in the step's Q / dO stage once both
//                                consumers' GEMMs are done (no other shared memory is left for it).
// With FLASHPORT_HOPPER_BWD_PAIR=1 (off by default: measured slower) it runs in clusters of two (key
// blocks 2i and 2i + 1) whose CTAs halve those additions: on the steps both take, CTA r adds column half r
// of both dQ tiles, the other half arriving from the peer CTA through distributed shared memory (see
// "dQ of a key-block pair" below). At d 256 producer warps add the step's dQ instead, by bulk reduce-adds
// from the step's freed Q / dO stage (kDrain below; the consumers' own reductions with
// FLASHPORT_HOPPER_BWD_DQ=0, at d 192 and in deterministic runs).
// No GEMM is computed twice; the price is the S^T / dP^T wgmmas at N = 32 and A operands read from
// shared memory. The producer warpgroup (TMA thread, LSE / D warp) is bwd_sm90_common.cuh's, as for the
// narrow kernel.
// Shape from -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_STAGES (tile_for in bwd_sm90_config.h).
#include "cuda/hopper/bwd_sm90_common.cuh"

namespace flashport::cuda::hopper_bwd {

#ifndef FP_DQ_MODE
#define FP_DQ_MODE 0
#endif
// How a step's dQ halves reach the fp32 accumulator (Tile::dq_mode): 0 each consumer's vector reductions
// (add_dq); 1 staged in the step's Q / dO stage once both consumers' GEMMs are done, and added by
// producer warps 2-3 with bulk reduce-adds (drain_dq), so the consumers never issue a reduction.
// Deterministic runs and d 192 take 0 (the host's launch_tile, bulk_dq_fits).
constexpr bool kDrain = FP_DQ_MODE == 1;
static_assert(!kDrain || !kRowMajorDq, "the drain's bulk reduce-adds add tiles in the tiled order");

constexpr int kQHalf = kBlockM / 2;                  // queries of one consumer's S^T / dP^T (wgmma N)
constexpr int kColsHalf = kPadD / 2;                 // columns of one consumer's dV / dK / dQ (wgmma N)
constexpr int kPdsChunkBytes = 64 * kChunkRowBytes;  // P^T or dS^T: 64 keys x 64 queries
static_assert(kBlockN == 64 && kBlockM == 64 && kPadD == 256, "tile_for's wide shape only");

// ---------------------------------------------------------------------------------------------
// Shared memory (226 KB of the 227): tiles as 64-column chunks of rows x 128 bytes in TMA's 128B swizzle,
// each chunk 1024-byte aligned. P^T and dS^T: rows = keys, one 64-query chunk (K-major A of dV / dK,
// M-contiguous A of dQ), written by the consumers in the same swizzle.

struct alignas(1024) SharedStorage {
  u16 k[kChunks][kBlockN][64];
  u16 v[kChunks][kBlockN][64];
  u16 q[kStages][kChunks][kBlockM][64];
  u16 dout[kStages][kChunks][kBlockM][64];
  u16 p[2][kBlockN][64];         // P^T; double buffer: one barrier per step orders reuse
  u16 ds[2][kBlockN][64];        // dS^T
  float lse2[kStages][kBlockM];  // LSE * log2(e); +inf for rows without keys or past the end
  float dsum[kStages][kBlockM];  // D; 0 past the end
  u64 bar_kv;                    // K and V landed
  u64 bar_full[kStages];         // Q, dO bytes landed and 32 LSE/D lanes arrived
  u64 bar_empty[kStages];        // 256 consumer threads done with the stage
  u64 bar_peer_free[2];          // the peer CTA's 8 consumer warps done with their stage (pair steps)
  u64 bar_dq_in[kStages];        // the peer's dQ half landed in the dO stage (kDrain: per stage)
  u64 bar_staged[kStages];       // kDrain: 256 consumer threads staged the step's dQ
};
static_assert(sizeof(SharedStorage) + 1024 == smem_bytes(kHeadDim, Tile{kBlockM, kStages}),
              "host and kernel disagree on the shared-memory size");
static_assert(smem_bytes(kHeadDim, Tile{kBlockM, kStages}) <= kSmemLimit, "over 227 KB");

constexpr u32 kBarPds = 1;  // named barrier: both consumers' halves of P^T and dS^T stored (256 threads)
constexpr u32 kBarDqTurn =
    2;  // named barrier: the dQ tile's turn taken / both consumers added (deterministic)
constexpr u32 kBarStageDone = 3;  // kDrain: both consumers' GEMMs of the step done (256 threads)
constexpr u32 kBarDrain = 4;      // kDrain: the drain warps' sums stored (64 threads)
// dK + dV + dQ are 192 registers per consumer thread. setmaxnreg.inc takes registers only from those
// this CTA's setmaxnreg.dec released (the launch gives 168 per thread): 24 / 240 is an exact trade,
// (168 - 24) x 128 = (240 - 168) x 256. The drain warps need 32 (24 spilled), and 32 / 240 would leave
// the consumers 1024 registers short, waiting forever (the first drain build hung so on an H100); its
// consumers issue no reductions and fit 232: (168 - 32) x 128 >= (232 - 168) x 256.
constexpr int kProducerRegs = kDrain ? 32 : 24;
constexpr int kConsumerRegs = kDrain ? 232 : 240;

/// Adds consumer c's dQ tile of the step (64 queries x columns 128c..) to the tiled fp32 accumulator
/// (BwdParams::accum_tiled = 128): register pair e = 4j + 2h of every thread goes to its fragment-order
/// slot (bwd::accum_tile_offset), so one warp's vector reduction covers 256 contiguous bytes, two whole
/// 128-byte lines. Row-major rows would make it 8 rows x 32 bytes, and L2 takes a reduction per line
/// touched: the H200 ran this kernel at 289 TFLOPS (d 256, 16k) with row-major and 361 with contiguous
/// addresses. Rows past the sequence are skipped (their dQ is 0), and so are d 192's zero columns (the
/// accumulator's tiles are 64 x d: consumer 1's block holds its first 64 columns only). kRowMajorDq: pair e
/// goes to row 16 warp + lane / 4 + 8h, column 128c + 8j + 2 (lane % 4) of a row-major accumulator.
FP_DEV void add_dq(const BwdSm90Params& prm, const Work& w, const float (&r_dq)[kColsHalf / 2], int h_q,
                   int m0, int c, int tid) {
  const AttnProblem& p = prm.bwd.p;
  const int lane = tid & 31, warp = tid >> 5;
  const int row = 16 * warp + (lane >> 2);
  constexpr i64 ld = kHeadDim;  // row-major too (the host checks accum_ld == d)
  float* tile = prm.bwd.dq_accum +
                ((i64)h_q * prm.bwd.rows_total + bwd::accum_row0(p, w.seq, w.b, !kRowMajorDq) + m0) * ld;
  // Tiled: pair q = 2j + h at + 2 * 128 * q; row-major: pair (j, h) at + 8 ld h + 8 j.
  float* g = kRowMajorDq ? tile + row * ld + kColsHalf * c + 2 * (lane & 3)
                         : tile + 2 * (c * (kColsHalf / 4) * 128 + tid);
  const int rows_left = w.seq.len_q - m0 - row;
#pragma unroll
  for (int j = 0; j < kColsHalf / 8; ++j) {
    const bool cols_in = kHeadDim == kPadD || kColsHalf * c + 8 * j < kHeadDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * j + 2 * h;
      float* at = kRowMajorDq ? g + 8 * h * ld + 8 * j : g + 256 * (2 * j + h);
      red_add_f32x2_if(cols_in && 8 * h < rows_left, at, Float2{r_dq[e], r_dq[e + 1]});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dQ of a key-block pair. A cluster of two CTAs holds key blocks 2i (rank 0) and 2i + 1 (rank 1) of one
// (kv head, sequence). On a step both take (same query head and block), CTA r adds column half r of the
// two CTAs' dQ tiles to global memory: its consumer r (the owner) receives the peer's half r from the
// peer's consumer r (the sender) and adds it to its own before add_dq, so the L2 sees half the reduction
// traffic. Built on the reading that the L2's reduction rate bounds this kernel (it and FA3's d 256
// backward both ran at about 2.3 TB/s of dQ reductions); the exchange, on the consumers' critical path,
// cost more than it saved: 0.82-0.91x of the unpaired kernel on an H100 (docs/BWD_NOTES.md part 9).
// The peer's half (64 queries x 128 columns fp32, 32 KB) lands in the owner CTA's dO stage of the step,
// free once all 8 consumer warps of that CTA finished the step's GEMMs:
//   every consumer warp:  arrive on the peer's bar_peer_free   ("my stage is free")
//   owner thread 0:       before that, arrive.expect_tx(32 KB) on its own bar_dq_in
//   sender:               wait on its bar_peer_free, st.async its 64 floats into the peer's stage,
//                         completing bytes on the peer's bar_dq_in
//   owner:                wait on bar_dq_in, add the peer's half, release the stage, add_dq
// Element group i (4 floats) of consumer thread tid sits at byte 2048 i + 16 tid: the owner's thread
// reads what the sender's thread of the same index wrote. Both barriers complete once per shared step,
// in the same order in both CTAs (parity from the shared-step index). Every remote write or arrival is
// one its target CTA waits for, so neither CTA exits while the other still writes to it. Deterministic
// runs are not paired (the host launches them without clusters).

constexpr u32 kDqHalfBytes = kBlockM * kColsHalf * 4;  // one consumer's dQ tile
static_assert(kDqHalfBytes == sizeof(SharedStorage::dout[0]), "the peer's dQ half fills one dO stage");

struct PeerPlan {
  bool on;                   // a cluster of two whose CTAs share a step
  u32 rank;                  // this CTA's rank: the column half it adds for both
  int lo, n;                 // the shared query blocks [lo, lo + n)
  int peer_begin, peer_n_m;  // the peer's query blocks (make_work's m_begin, n_m)
};

/// The consumers call it per step with `opaque`: kept live across the step loop, the plan's six values
/// made the dropout build spill.
FP_DEV PeerPlan peer_plan(const BwdParams& prm, const Work& w, bool opaque = false) {
  PeerPlan pp{};
  if (prm.dq_tile_count != nullptr || sm90::cluster_size() != 2) return pp;
  pp.rank = sm90::cluster_rank();
  bwd::Seq seq = w.seq;
  int n0 = w.n0;
  if (opaque) asm volatile("" : "+r"(seq.len_q), "+r"(seq.len_k), "+r"(n0));
  const sem::Tiles<int> peer = seeing_query_blocks(prm.p, seq, n0 + (pp.rank == 0 ? kBlockN : -kBlockN));
  pp.peer_begin = peer.begin, pp.peer_n_m = peer.end - peer.begin;
  pp.lo = w.m_begin > peer.begin ? w.m_begin : peer.begin;
  pp.n = min_int(w.m_begin + w.n_m, peer.end) - pp.lo;
  pp.on = w.n_m > 0 && pp.peer_n_m > 0 && pp.n > 0;
  return pp;
}

/// The two CTAs of a pair that shares steps meet once their barriers are initialised (both compute the
/// same plan: it depends on the two key blocks only).
FP_DEV void sync_peers(const BwdSm90Params& prm, SharedStorage&) {
  if (peer_plan(prm.bwd, make_work(prm.bwd)).on) sm90::cluster_sync();
}

/// This warp is done with the step's Q / dO stage (shared step k): one arrival on the peer's
/// bar_peer_free[k % 2]. Two barriers, used by alternate shared steps: without the owner's wait (kDrain) a
/// CTA may signal step k + 1 before its peer waited for step k, never step k + 2 (its drain releases
/// stages in step order, after taking the peer's half of step k).
FP_DEV void signal_stage_free(SharedStorage& s, const PeerPlan& pp, int k, int tid) {
  __syncwarp();
  if ((tid & 31) == 0)
    sm90::mbar_arrive_peer(sm90::peer_addr(bar_addr(s.bar_peer_free[k & 1]), pp.rank ^ 1u));
}

/// Sender: waits until the peer's 8 warps freed their stage for shared step k.
FP_DEV void wait_peer_free(SharedStorage& s, int k) {
  sm90::mbar_wait_cluster(bar_addr(s.bar_peer_free[k & 1]), (u32)(k >> 1) & 1u);
}

/// Owner: adds the peer's half (element group i at shared address s_peer + 2048 i) to r_dq.
FP_DEV void take_peer_dq(u32 s_peer, float (&r_dq)[kColsHalf / 2]) {
#pragma unroll
  for (int i = 0; i < kColsHalf / 8; ++i) {
    float v[4];
    ld_shared_f32x4(s_peer + 2048u * i, v);
#pragma unroll
    for (int x = 0; x < 4; ++x) r_dq[4 * i + x] += v[x];
  }
}

/// Sender: once the peer's 8 warps freed their stage `peer_stage` (shared step k), writes r_dq into it,
/// completing bytes on the peer's bar_dq_in[bar_index]: element group i at 2048 i + 16 tid, or with
/// kDrain the accumulator's order (pair q at 1024 q + 8 tid, what the bulk copy adds as it lies).
FP_DEV void send_dq(SharedStorage& s, const PeerPlan& pp, int k, int peer_stage, int bar_index,
                    const float (&r_dq)[kColsHalf / 2], int tid) {
  wait_peer_free(s, k);
  const u32 peer = pp.rank ^ 1u;
  const u32 bar = sm90::peer_addr(bar_addr(s.bar_dq_in[bar_index]), peer);
  const u32 dst = sm90::peer_addr(smem_addr(&s.dout[peer_stage][0][0][0]), peer);
  if constexpr (kDrain) {
#pragma unroll
    for (int q = 0; q < kColsHalf / 4; ++q)
      sm90::st_async_8(dst + 1024u * q + 8u * tid, r_dq[2 * q], r_dq[2 * q + 1], bar);
  } else {
#pragma unroll
    for (int i = 0; i < kColsHalf / 8; ++i)
      sm90::st_async_16(dst + 2048u * i + 16u * tid, r_dq[4 * i], r_dq[4 * i + 1], r_dq[4 * i + 2],
                        r_dq[4 * i + 3], bar);
  }
}

/// kDrain, every step: the step's dQ halves into its stage, in the accumulator's order (pair q of thread
/// tid at 1024 q + 8 tid): consumer 0's (or a shared step's owner's) into the Q stage, consumer 1's into
/// the dO stage, a shared step's sender's into the peer's dO stage; then each thread's arrival on
/// bar_staged. In a pair, bar_dq_in[stage] completes once per step: the peer's bytes on shared steps
/// (armed by the owner before it signals the peer), a plain arrival otherwise, and the drain waits for
/// every phase (an arrival nobody waits for is what compute-sanitizer's synccheck reports as a missing
/// wait); unpaired CTAs leave it alone.
FP_DEV void stage_dq(SharedStorage& s, const PeerPlan& pp, bool shared, int k, int stage, int peer_stage,
                     const float (&r_dq)[kColsHalf / 2], int c, int tid) {
  const bool owner = shared && c == (int)pp.rank;
  if (tid == 0 && owner) sm90::mbar_arrive_expect_tx(bar_addr(s.bar_dq_in[stage]), kDqHalfBytes);
  if (tid == 0 && pp.on && !shared && c == 0) sm90::mbar_arrive(bar_addr(s.bar_dq_in[stage]));
  if (shared) signal_stage_free(s, pp, k, tid);
  sm90::named_bar_sync(kBarStageDone, 256);  // both consumers' GEMMs done: the stage's Q and dO are dead
  if (shared && !owner) {
    send_dq(s, pp, k, peer_stage, peer_stage, r_dq, tid);
  } else {
    const u32 dst =
        (c == 0 || owner ? smem_addr(&s.q[stage][0][0][0]) : smem_addr(&s.dout[stage][0][0][0])) + 8u * tid;
#pragma unroll
    for (int q = 0; q < kColsHalf / 4; ++q) st_shared_f32x2(dst + 1024u * q, r_dq[2 * q], r_dq[2 * q + 1]);
    sm90::fence_proxy_async();  // the bulk copy reads it through the async proxy
  }
  sm90::mbar_arrive(bar_addr(s.bar_staged[stage]));
}

/// kDrain, producer warps 2-3 (d = 0..63): per step, once staged (and on a shared step the peer's half
/// landed), the sum of the two halves into the Q stage, then thread 0's bulk reduce-adds into the tiled
/// accumulator (rows past the sequence add zeros to its padding rows, which dq_convert never reads) and
/// the stage's release for all 256 consumer threads once the copies have read it.
FP_DEV void drain_dq(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int d) {
  const AttnProblem& p = prm.bwd.p;
  for (int t = 0; t < w.steps; ++t) {
    const PeerPlan pp = peer_plan(prm.bwd, w, true);  // per step: 32 registers hold little across it
    const int stage = t % kStages, m0 = step_m0(w, t), mb = m0 / kBlockM;
    const u32 parity = (u32)(t / kStages) & 1u;
    const bool shared = pp.on && mb >= pp.lo && mb < pp.lo + pp.n;
    const u32 s_q = smem_addr(&s.q[stage][0][0][0]), s_do = smem_addr(&s.dout[stage][0][0][0]);
    sm90::mbar_wait(bar_addr(s.bar_staged[stage]), parity);
    if (pp.on) sm90::mbar_wait_cluster(bar_addr(s.bar_dq_in[stage]), parity);
    if (shared) {
#pragma unroll 2
      for (u32 off = 16u * d; off < kDqHalfBytes; off += 16u * 64) {
        float a[4], b[4];
        ld_shared_f32x4(s_q + off, a);
        ld_shared_f32x4(s_do + off, b);
        st_shared_f32x4(s_q + off, a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]);
      }
      sm90::fence_proxy_async();
      sm90::named_bar_sync(kBarDrain, 64);
    }
    if (d == 0) {
      float* tile =
          prm.bwd.dq_accum +
          ((i64)step_head(w, t) * prm.bwd.rows_total + bwd::accum_row0(p, w.seq, w.b, true) + m0) * kHeadDim;
      constexpr int kHalfFloats = kDqHalfBytes / 4;
      if (shared) {
        sm90::bulk_reduce_add_f32(tile + pp.rank * kHalfFloats, s_q, kDqHalfBytes);
      } else {
        sm90::bulk_reduce_add_f32(tile, s_q, kDqHalfBytes);
        sm90::bulk_reduce_add_f32(tile + kHalfFloats, s_do, kDqHalfBytes);
      }
      sm90::bulk_commit();
      sm90::bulk_wait_read<0>();
      sm90::mbar_arrive_count(bar_addr(s.bar_empty[stage]), kConsumerThreads);
    }
  }
  if (d == 0) sm90::bulk_wait_all();
}

/// Consumer warpgroup c (0 or 1), see the file comment. Per step: S^T and dP^T for its 32 queries (one
/// wgmma batch), P^T and dS^T into shared memory, a barrier of both consumers, dV, dK and dQ for its 128
/// columns (one batch), release of the stage, dQ reductions (deterministic mode: in the tile's turn).
FP_DEV void consume(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int c, int tid) {
  const AttnProblem& p = prm.bwd.p;
  const bool deterministic = prm.bwd.dq_tile_count != nullptr;
  float r_dk[kColsHalf / 2], r_dv[kColsHalf / 2];
#pragma unroll
  for (int e = 0; e < kColsHalf / 2; ++e) r_dk[e] = r_dv[e] = 0.0f;

  if (w.steps > 0) {
    const u64 desc_k = sm90::smem_desc(smem_addr(&s.k[0][0][0]), 16, 1024);
    const u64 desc_v = sm90::smem_desc(smem_addr(&s.v[0][0][0]), 16, 1024);
    // dQ's B: K's columns 128c.. as MN-major (N across two chunks by LBO, k step of 16 keys = 16 rows).
    const u64 desc_k_dq = sm90::smem_desc(smem_addr(&s.k[2 * c][0][0]), kKVChunkBytes, 1024);
    const u32 q_rows = kQHalf * c * kChunkRowBytes;  // this consumer's 32 query rows of a Q / dO chunk
    const u32 col_chunks = (kColsHalf / 64) * c * kQChunkBytes;  // its columns' first chunk of Q / dO
    sm90::mbar_wait(bar_addr(s.bar_kv), 0);

    float r_dq[kColsHalf / 2];
    for (int t = 0; t < w.steps; ++t) {
      const int stage = t % kStages, buf = t & 1;
      const u32 phase = (u32)(t / kStages) & 1u;
      const int m0 = step_m0(w, t);
      const u32 s_q = smem_addr(&s.q[stage][0][0][0]), s_do = smem_addr(&s.dout[stage][0][0][0]);
      const u32 s_p = smem_addr(&s.p[buf][0][0]), s_ds = smem_addr(&s.ds[buf][0][0]);
      float r_s[kQHalf / 2], r_dp[kQHalf / 2];
      u32 r_p[kQHalf / 4], r_ds[kQHalf / 4];

      sm90::mbar_wait(bar_addr(s.bar_full[stage]), phase);
      sm90::wgmma_fence();
      sm90::gemm_ss_kmajor<kQHalf, kPadD, kKVChunkBytes, kQChunkBytes>(
          r_s, desc_k, sm90::smem_desc(s_q + q_rows, 16, 1024));
      sm90::gemm_ss_kmajor<kQHalf, kPadD, kKVChunkBytes, kQChunkBytes>(
          r_dp, desc_v, sm90::smem_desc(s_do + q_rows, 16, 1024));
      sm90::wgmma_commit();
      KeepBits<kQHalf> keep;  // dropout: drawn while the GEMMs run
      if constexpr (kDropout) keep.draw(p, w, step_head(w, t), m0 + kQHalf * c, w.n0, tid);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(r_s);
      sm90::pin_registers(r_dp);

      scores_to_grads<kQHalf>(r_s, r_dp, p, s, w, step_head(w, t), stage, m0, kQHalf * c, w.n0, tid, keep);
      pack_operand<kQHalf>(r_s, r_p);
      pack_operand<kQHalf>(r_dp, r_ds);
      store_key_rows<kQHalf, kPdsChunkBytes>(s_p, r_p, 0, kQHalf * c, tid);
      store_key_rows<kQHalf, kPdsChunkBytes>(s_ds, r_ds, 0, kQHalf * c, tid);
      sm90::fence_proxy_async();
      sm90::named_bar_sync(kBarPds, 256);  // both halves of P^T and dS^T are in shared memory

      sm90::wgmma_fence();
      sm90::gemm_ss_kmn<kColsHalf, kBlockM>(r_dv, sm90::smem_desc(s_p, 16, 1024),
                                            sm90::smem_desc(s_do + col_chunks, kQChunkBytes, 1024));
      sm90::gemm_ss_kmn<kColsHalf, kBlockM>(r_dk, sm90::smem_desc(s_ds, 16, 1024),
                                            sm90::smem_desc(s_q + col_chunks, kQChunkBytes, 1024));
      const u64 desc_ds_mn = sm90::smem_desc(s_ds, kPdsChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        sm90::Wgmma<kColsHalf>::ss_mn(r_dq, sm90::desc_advance(desc_ds_mn, kk * 16 * kChunkRowBytes),
                                      sm90::desc_advance(desc_k_dq, kk * 16 * kChunkRowBytes),
                                      kk == 0 ? 0u : 1u);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::pin_registers(r_dq);
      sm90::pin_registers(r_dk);
      sm90::pin_registers(r_dv);
      const int h = step_head(w, t), mb = m0 / kBlockM;
      const PeerPlan pp = peer_plan(prm.bwd, w, true);
      const bool shared = pp.on && mb >= pp.lo && mb < pp.lo + pp.n;  // a step the peer takes too
      const int g = t / w.n_m, k = g * pp.n + mb - pp.lo;             // k: the shared step's index
      const int peer_stage = (g * pp.peer_n_m + mb - pp.peer_begin) % kStages;
      if constexpr (kDrain) {
        stage_dq(s, pp, shared, k, stage, peer_stage, r_dq, c, tid);
        continue;
      }
      if (shared) {
        if (c == (int)pp.rank) {
          if (tid == 0) sm90::mbar_arrive_expect_tx(bar_addr(s.bar_dq_in[0]), kDqHalfBytes);
          signal_stage_free(s, pp, k, tid);
          sm90::mbar_wait_cluster(bar_addr(s.bar_dq_in[0]), (u32)k & 1u);
          take_peer_dq(smem_addr(&s.dout[stage][0][0][0]) + 16u * tid, r_dq);
          release(s.bar_empty[stage]);
          add_dq(prm, w, r_dq, h, m0, c, tid);
        } else {
          signal_stage_free(s, pp, k, tid);
          release(s.bar_empty[stage]);
          send_dq(s, pp, k, peer_stage, 0, r_dq, tid);
        }
        continue;
      }
      release(s.bar_empty[stage]);
      if (deterministic) {  // thread 0 of consumer 0 waits for the tile's turn
        if (c == 0 && tid == 0) wait_dq_turn(dq_tile_counter(prm.bwd, w, h, m0), dq_turn(p, w, m0));
        sm90::named_bar_sync(kBarDqTurn, 256);
      }
      add_dq(prm, w, r_dq, h, m0, c, tid);
      if (deterministic) {  // both consumers' reductions performed, then the turn passes on
        __threadfence();
        sm90::named_bar_sync(kBarDqTurn, 256);
        if (c == 0 && tid == 0) pass_dq_turn(dq_tile_counter(prm.bwd, w, h, m0));
      }
    }
  }
  // The sequence's rows read again here: kept from before the step loop, the dropout build spilled them.
  Work w_end = w;
  asm volatile("" : "+r"(w_end.b));
  w_end.seq = bwd::sequence(p, w_end.b);
  store_dk_dv<kColsHalf>(p, w_end, r_dk, r_dv, 0, kColsHalf * c, tid);
}

/// The pair's and the drain's barriers.
FP_DEV void init_more_barriers(SharedStorage& s) {
  for (int i = 0; i < 2; ++i) sm90::mbar_init(bar_addr(s.bar_peer_free[i]), 8);
  for (int st = 0; st < kStages; ++st) {
    sm90::mbar_init(bar_addr(s.bar_dq_in[st]), 1);
    sm90::mbar_init(bar_addr(s.bar_staged[st]), kConsumerThreads);
  }
}

/// Producer warps 2 and 3: the drain (kDrain), else idle.
FP_DEV void produce_more(const BwdSm90Params& prm, SharedStorage& s, const Work& w, int d) {
  if constexpr (kDrain) drain_dq(prm, s, w, d);
}

}  // namespace flashport::cuda::hopper_bwd

FLASHPORT_BWD_SM90_KERNEL(flashport_attn_bwd_sm90_wide)
