// Hopper (sm_90a) FlashAttention backward main kernel for d 256: one CTA per (64-key block, kv head,
// sequence). dK and dV of 64 keys x 256 columns are 256 fp32 registers per thread of one warpgroup, so
// both consumer warpgroups hold the same 64 keys and split the work of a step instead:
//   S^T = K Q^T, dP^T = V dO^T   by queries: consumer c computes query columns 32c .. 32c + 31, all keys;
//   P^T, dS^T                    to shared memory (each its 32 columns), then one barrier of both;
//   dV += P^T dO, dK += dS^T Q   by columns: consumer c owns columns 128c .. 128c + 127 (A from shared);
//   dQ = dS K                    by columns, added to the fp32 accumulator in global memory by the
//                                consumer itself (no shared memory is left for staging it).
// No GEMM is computed twice; the price is the S^T / dP^T wgmmas at N = 32 and A operands read from
// shared memory. The producer warpgroup (TMA thread, LSE / D warp) is bwd_sm90_common.cuh's, as for the
// narrow kernel.
// Shape from -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_STAGES (tile_for in bwd_sm90_config.h).
#include "cuda/hopper/bwd_sm90_common.cuh"

namespace flashport::cuda::hopper_bwd {

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
};
static_assert(sizeof(SharedStorage) + 1024 == smem_bytes(kHeadDim, Tile{kBlockM, kStages}),
              "host and kernel disagree on the shared-memory size");
static_assert(smem_bytes(kHeadDim, Tile{kBlockM, kStages}) <= kSmemLimit, "over 227 KB");

constexpr u32 kBarPds = 1;  // named barrier: both consumers' halves of P^T and dS^T stored (256 threads)
constexpr u32 kBarDqTurn =
    2;  // named barrier: the dQ tile's turn taken / both consumers added (deterministic)
// 128 x 24 + 256 x 240 = 64512 <= 65536 registers: dK + dV + dQ are 192 per consumer thread.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;

/// Adds consumer c's dQ tile of the step (64 queries x columns 128c..) to the tiled fp32 accumulator
/// (BwdParams::accum_tiled = 128): register pair e = 4j + 2h of every thread goes to its fragment-order
/// slot (bwd::accum_tile_offset), so one warp's vector reduction covers 256 contiguous bytes, two whole
/// 128-byte lines. Row-major rows would make it 8 rows x 32 bytes, and L2 takes a reduction per line
/// touched: the H200 ran this kernel at 289 TFLOPS (d 256, 16k) with row-major and 361 with contiguous
/// addresses. Rows past the sequence are skipped (their dQ is 0).
FP_DEV void add_dq(const BwdSm90Params& prm, const Work& w, const float (&r_dq)[kColsHalf / 2], int h_q,
                   int m0, int c, int tid) {
  const AttnProblem& p = prm.bwd.p;
  const int lane = tid & 31, warp = tid >> 5;
  float* tile =
      prm.bwd.dq_accum + ((i64)h_q * prm.bwd.rows_total + bwd::accum_row0(p, w.seq, w.b, true) + m0) * kPadD;
  float* g = tile + 2 * (c * (kColsHalf / 4) * 128 + tid);  // pair q = 2j + h at + 2 * 128 * q
  const int rows_left = w.seq.len_q - m0 - 16 * warp - (lane >> 2);
#pragma unroll
  for (int j = 0; j < kColsHalf / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * j + 2 * h;
      red_add_f32x2_if(8 * h < rows_left, g + 256 * (2 * j + h), Float2{r_dq[e], r_dq[e + 1]});
    }
  }
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
      release(s.bar_empty[stage]);
      const int h = step_head(w, t);
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
  store_dk_dv<kColsHalf>(p, w, r_dk, r_dv, 0, kColsHalf * c, tid);
}

/// Nothing besides the ring: no dQ hand-off, and producer warps 2 and 3 stay idle.
FP_DEV void init_more_barriers(SharedStorage&) {}
FP_DEV void produce_more(const BwdSm90Params&, SharedStorage&, const Work&) {}

}  // namespace flashport::cuda::hopper_bwd

FLASHPORT_BWD_SM90_KERNEL(flashport_attn_bwd_sm90_wide)
