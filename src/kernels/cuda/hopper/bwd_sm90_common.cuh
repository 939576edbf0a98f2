// What the two Hopper (sm_90a) backward main kernels share: the shape constants from the -D macros,
// the work of one CTA (its keys and the (query head, query block) steps that see them), the producer
// warps (TMA of K / V once and of the Q / dO ring; LSE and D by one warp), the score -> gradient
// elementwise stage, and the dK / dV epilogue. attn_bwd_sm90.cu (d <= 128: 128 keys per CTA, each
// consumer warpgroup owns 64) and attn_bwd_sm90_wide.cu (d 256: 64 keys per CTA shared by both
// consumers, which split the queries of S^T / dP^T and the columns of dV / dK / dQ) add their shared
// storage and consumers. Functions touching shared memory take the kernel's storage type S, which
// names the tiles and barriers the same way in both.
#pragma once

#include "attn/bwd_stages.h"
#include "core/problem.h"
#include "cuda/bwd_seq.cuh"
#include "cuda/common/common.cuh"
#include "cuda/hopper/bwd_sm90_config.h"
#include "cuda/hopper/sm90.cuh"
#include "cuda/hopper/wgmma.cuh"

#if !defined(FP_DTYPE) || !defined(FP_HEADDIM) || !defined(FP_BLOCK_M) || !defined(FP_STAGES)
#error "the Hopper backward needs -D FP_DTYPE, FP_HEADDIM, FP_BLOCK_M, FP_STAGES"
#endif

namespace flashport::cuda::hopper_bwd {

using Elem = FP_DTYPE;
constexpr int kHeadDim = FP_HEADDIM;            // d == dv
constexpr int kBlockM = FP_BLOCK_M;             // queries per step: N of S^T = K Q^T, K of dV / dK
constexpr int kStages = FP_STAGES;              // Q / dO / LSE / D ring depth
constexpr int kBlockN = block_n_for(kHeadDim);  // keys per CTA
constexpr int kChunks = bwd_chunks(kHeadDim);
constexpr int kPadD = kChunks * 64;  // N of dV / dK: whole 128B-swizzle atoms (d 96, 192: zero columns)
constexpr int kKVChunkBytes = kBlockN * kChunkRowBytes;  // one 64-column chunk of K or V
constexpr int kQChunkBytes = kBlockM * kChunkRowBytes;   // one 64-column chunk of Q or dO
constexpr int kQTileBytes = kChunks * kQChunkBytes;
static_assert(kStages >= 1, "at least one Q / dO buffer");
#ifndef FP_BWD_GENERAL
#define FP_BWD_GENERAL 0
#endif
// The score stage's transforms: 0 none (the host launches it only when softcap and ALiBi are off, and
// their code is compiled out of the loop), 1 ALiBi, 2 softcap and ALiBi (a slope of 0 when ALiBi is off),
// 3 dropout (without softcap and ALiBi: with them the consumers spilled; the portable backward takes that
// combination). ALiBi alone pays one add and one multiply per element, softcap two more SFU operations,
// dropout one Philox call per 4 elements (drawn while the S^T / dP^T GEMMs run).
constexpr bool kAlibi = FP_BWD_GENERAL == 1 || FP_BWD_GENERAL == 2;
constexpr bool kSoftcap = FP_BWD_GENERAL == 2;
constexpr bool kDropout = FP_BWD_GENERAL == 3;
#ifndef FP_BWD_DQ_ROWS
#define FP_BWD_DQ_ROWS 0
#endif
// 1: the dQ accumulator is row-major (BwdParams::accum_tiled 0) at a head dim whose default is tiled
// (the host's hopper_bwd::tiled_accumulator: a batch of many sequences shorter than 64 queries, whose
// tiles would pad each to 64 rows). Its reductions cover 8 rows x 32 bytes per warp instruction, not 256
// contiguous bytes, and no bulk reduce-add can add them (dQ mode 0).
constexpr bool kRowMajorDq = FP_BWD_DQ_ROWS != 0;

constexpr int kConsumerThreads = 256;  // arrivals that release a stage
constexpr u32 kFullArrivals = 33;      // the TMA thread's arrive.expect_tx + the LSE/D warp's 32 lanes

/// What every thread of the CTA knows about its work: the sequence, kv head, keys [n0, n0 + kBlockN)
/// and the (query head, query block) steps, head-major: step t is head hk * group + t / n_m, query
/// block m_begin + t % n_m.
struct Work {
  int b, hk, n0, group, m_begin, n_m, steps;
  bwd::Seq seq;
};

FP_DEV u32 bar_addr(const u64& bar) {
  return smem_addr(&bar);
}

FP_DEV int min_int(int a, int b) {
  return a < b ? a : b;
}

/// The order in which a dQ tile takes its key blocks' additions in deterministic mode: from the last
/// key block down, except at d 96, whose drain warps (40 registers) spilled with the reversed dispatch
/// it needs (key_block) and keep key-block order.
constexpr bool kTurnsFromLast = kHeadDim != 96;

/// This CTA's grid coordinates (BwdParams::keys_outer, read where keys_outer_fits): key block index,
/// kv head, batch entry.
FP_DEV bool grid_keys_outer(const BwdParams& prm) {
  return keys_outer_fits(kBlockM, FP_BWD_GENERAL) && prm.keys_outer;
}
FP_DEV int grid_key_index(const BwdParams& prm) {
  return grid_keys_outer(prm) ? (int)blockIdx.y : (int)blockIdx.x;
}
FP_DEV int grid_kv_head(const BwdParams& prm) {
  return grid_keys_outer(prm) ? (int)blockIdx.x : (int)blockIdx.y;
}
FP_DEV int grid_batch(const BwdParams& prm) {
  return (int)blockIdx.z + prm.batch_offset;
}

/// This CTA's key block. With kTurnsFromLast, deterministic runs (always key blocks innermost) dispatch
/// the key blocks of a (kv head, sequence) from the last down: a CTA then waits (dq_turn) only on CTAs
/// dispatched before it.
FP_DEV int key_block(const BwdParams& prm) {
  return kTurnsFromLast && prm.dq_tile_count ? (int)gridDim.x - 1 - (int)blockIdx.x : grid_key_index(prm);
}

/// The query blocks [begin, end) that see a key of [n0, n0 + kBlockN) of sequence `seq` (empty: begin ==
/// end == 0).
FP_DEV sem::Tiles<int> seeing_query_blocks(const AttnProblem& p, const bwd::Seq& seq, int n0) {
  const int len_q = seq.len_q, len_k = seq.len_k;
  if (n0 < len_k && len_q > 0) {
    const i64 n1 = min_int(n0 + kBlockN, len_k);
    const sem::Range qs = sem::seeing_queries(n0, n1, len_q, len_k, p.window_left, p.window_right);
    const int lo = (int)qs.lo, hi = (int)qs.hi;
    if (hi > lo) return sem::covering_tiles(lo, hi, kBlockM);
  }
  return {0, 0};
}

FP_DEV Work make_work(const BwdParams& prm) {
  const AttnProblem& p = prm.p;
  Work w;
  w.b = grid_batch(prm);
  w.hk = grid_kv_head(prm);
  w.n0 = key_block(prm) * kBlockN;
  w.group = (int)gqa_group(p);
  w.seq = bwd::sequence(p, w.b);
  const sem::Tiles<int> blocks = seeing_query_blocks(p, w.seq, w.n0);
  w.m_begin = blocks.begin, w.n_m = blocks.end - blocks.begin;
  w.steps = w.group * w.n_m;
  return w;
}

FP_DEV int step_head(const Work& w, int t) {
  return group_head(w.hk, w.group, t / w.n_m);
}
FP_DEV int step_m0(const Work& w, int t) {
  return (w.m_begin + t % w.n_m) * kBlockM;
}

/// False when no key row of this CTA's block exists (nothing to write): the whole CTA returns before
/// any barrier.
FP_DEV bool block_has_keys(const BwdParams& prm) {
  return key_block(prm) * kBlockN < bwd::sequence(prm.p, grid_batch(prm)).rows_k;
}

/// The dynamic shared memory as S, its base rounded up to the 1024-byte swizzle period (the host adds
/// 1 KB for this).
template <class S>
FP_DEV S& aligned_storage(unsigned char* smem_raw) {
  const u32 misalign = smem_addr(smem_raw) & 1023u;
  return *reinterpret_cast<S*>(smem_raw + ((1024u - misalign) & 1023u));
}

// ---------------------------------------------------------------------------------------------
// Producer.

/// One thread: K and V once, then Q and dO of every step through the ring. A stage is reused once all
/// 256 consumer threads released it (the empty-barrier wait uses the opposite parity, so the first pass
/// over the ring does not block).
template <class S>
FP_DEV void produce_tiles(const BwdSm90Params& prm, S& s, const Work& w, const TmaDesc& tma_q,
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
template <class S>
FP_DEV void produce_rows(const BwdSm90Params& prm, S& s, const Work& w, int lane) {
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

/// The ring's mbarriers: K/V landed (one arrival plus bytes), each stage full (TMA thread + LSE/D lanes)
/// and empty (every consumer thread).
template <class S>
FP_DEV void init_ring_barriers(S& s) {
  sm90::mbar_init(bar_addr(s.bar_kv), 1);
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    sm90::mbar_init(bar_addr(s.bar_full[st]), kFullArrivals);
    sm90::mbar_init(bar_addr(s.bar_empty[st]), kConsumerThreads);
  }
}

/// The whole kernel after its parameters: the role split of the 384 threads. Each kernel file supplies,
/// for its storage type S (found by argument-dependent lookup): init_more_barriers(s), sync_peers(prm, s)
/// (every thread, once the barriers are initialised: the cluster's CTAs meet there when they exchange
/// data), produce_more(prm, s, w, d) for producer warps 2 and 3 (d = threadIdx.x - 64, 0..63; lanes 1-31
/// of warp 0 beside the TMA thread stay idle), and consume(prm, s, w, c, tid) for consumer warpgroup c.
/// Each role computes its Work after the split: nothing computed before setmaxnreg stays live across it
/// (that code is register-allocated for the producer's small budget).
template <class S, int kProducerRegs, int kConsumerRegs>
FP_DEV void run_roles(const BwdSm90Params& prm, const TmaDesc& tma_q, const TmaDesc& tma_k,
                      const TmaDesc& tma_v, const TmaDesc& tma_do) {
  if (!block_has_keys(prm.bwd)) return;
  S& s = aligned_storage<S>(dynamic_smem<unsigned char>());
  const int warpgroup = __shfl_sync(kFullMask, (int)threadIdx.x / 128, 0);
  if (threadIdx.x == 0) {
    init_ring_barriers(s);
    init_more_barriers(s);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  sync_peers(prm, s);
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
      produce_more(prm, s, w, (int)threadIdx.x - 64);
    }
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    consume(prm, s, make_work(prm.bwd), warpgroup - 1, (int)threadIdx.x - 128 * warpgroup);
  }
}

// Shared and global accesses in inline PTX (sm90.cuh).
using sm90::ld_shared_f32x2;
using sm90::ld_shared_f32x4;
using sm90::red_add_f32x2_if;
using sm90::st_shared_f32x2;
using sm90::st_shared_f32x4;
using sm90::st_shared_u32;

// ---------------------------------------------------------------------------------------------
// Deterministic mode (BwdParams::dq_tile_count): every dQ tile takes its key blocks' additions in a fixed
// order, from the highest key block down (kTurnsFromLast) or up. A CTA waits for its turn on the tile's
// counter, adds, waits for its additions to be performed, and passes the turn on. It waits only on key
// blocks of the same (kv head, sequence) that the hardware dispatched earlier (key_block), so it cannot
// deadlock. Each CTA walks its query blocks upwards from its first, and under a causal mask that first
// one is the diagonal, where the highest key block seeing a tile starts: from the last down, every turn
// comes about when its CTA arrives. In key-block order every CTA of a causal problem waits for key block
// 0 to walk up to its diagonal (0.47-0.61x FA3's deterministic backward at d 128 causal, H200).

/// Window sizes at or past this are unbounded: the host bounds sequence lengths by 2^30, so |j - i| < 2^30.
constexpr int kFarWindow = 1 << 30;

/// Row of query m0 of (sequence seq of batch entry b, query head h) in the tiled dQ accumulator's
/// numbering (a multiple of 64 for m0 % 64 == 0): its tile at dq_accum + row * d, its counter at row / 64.
FP_DEV i64 dq_tile_row(const AttnProblem& p, const bwd::Seq& seq, int b, int h, int m0) {
  return (i64)h * accum_rows_tiled(p) + bwd::accum_row0(p, seq, b, true) + m0;
}

/// The turn counter of dQ tile (query head h, query block m0) of this CTA's sequence.
FP_DEV int* dq_tile_counter(const BwdParams& prm, const Work& w, int h, int m0) {
  return prm.dq_tile_count + dq_tile_row(prm.p, w.seq, w.b, h, m0) / 64;
}

/// This CTA's turn at query block m0: how many key blocks add to that block before this one. The key
/// blocks that see it are contiguous, from the one holding the first key its first query row sees to the
/// one holding the last key its last row sees (visible ranges move up with the row; the ends of the
/// sequence without a window on that side): the blocks make_work's seeing_query_blocks gives (checked
/// against it by brute force over lengths, windows and both block shapes when this was written). Closed
/// form rather than a bisection over that rule: the drain warps that call it at d 96 have 40 registers.
FP_DEV int dq_turn(const AttnProblem& p, const Work& w, int m0) {
  // Opaque copies: computed per call, not hoisted out of the caller's step loop and kept live there.
  int len_q = w.seq.len_q, len_k = w.seq.len_k;
  asm volatile("" : "+r"(len_q), "+r"(len_k));
  const int own = w.n0 / kBlockN;
  if (kTurnsFromLast) {
    int last = (len_k + kBlockN - 1) / kBlockN - 1;
    if (p.window_right >= 0) {
      const i64 right = p.window_right < kFarWindow ? p.window_right : kFarWindow;
      const int last_q = min_int(m0 + kBlockM, len_q) - 1;
      last = min_int(last, (int)(((i64)last_q + right + (len_k - len_q)) / kBlockN));  // >= own
    }
    return last - own;
  }
  int first = 0;
  if (p.window_left >= 0) {
    const i64 left = p.window_left < kFarWindow ? p.window_left : kFarWindow;
    const i64 lo = (i64)m0 + (len_k - len_q) - left;
    first = lo > 0 ? (int)(lo / kBlockN) : 0;
  }
  return own - first;
}

/// Spins until `counter` reaches `turn` (acquire: the earlier blocks' additions are then visible).
FP_DEV void wait_dq_turn(const int* counter, int turn) {
  while (sm90::ld_acquire_gpu_s32(counter) < turn) {
  }
}

/// Passes the turn on (release: after this thread's, and by cumulativity its barrier partners',
/// additions).
FP_DEV void pass_dq_turn(int* counter) {
  sm90::red_release_gpu_inc(counter);
}

// ---------------------------------------------------------------------------------------------
// Scores. Fragment element e = 4j + 2h + x of a (64 keys x kN) accumulator is key row
// 16 * warp + g + 8h of the 64 at key0, query column q_off + 8j + 2 * (lane % 4) + x of the step.

/// Dropout keep bits of a thread's (64 keys x kN queries) fragment, drawn once per Philox call (SPEC: the
/// call of (query i, keys 4q..4q+3) gives word j % 4 to key j). Lane 16u + 4r + t holds key rows g and
/// g + 8 (g = 4u + r: key groups 4 warp + u and + 2, word r of each) and query columns 8j + 2t + {0, 1}:
/// the four lanes r = 0..3 of one (u, t) need the same calls, so lane r draws those of the columns
/// j = r (mod 4), kN / 8 calls, and the lanes swap their bits: word j / 8, bit 4 (4 ((j / 4) % 2) + 2h + x)
/// + j % 4 is element (j, h, x)'s keep bit (one register per 64 columns). The consumers draw while the
/// step's S^T / dP^T GEMMs run (after them, beside the elementwise stage, ptxas spilled 4-380 bytes).
template <int kN>
struct KeepBits {
  static constexpr int kWords = kN / 64 > 0 ? kN / 64 : 1;  // a lane's draws: 8 calls per word
  u32 w[kWords];

  FP_DEV bool kept(int j, int h, int x) const {
    return (w[j / 8] >> (4 * (4 * ((j / 4) % 2) + 2 * h + x) + j % 4)) & 1u;
  }

  /// Every lane must call it (shuffles). q0: the fragment's first query column, key0: its first key row.
  FP_DEV void draw(const AttnProblem& p, const Work& wk, int h_step, int q0, int key0, int tid) {
    const int lane = tid & 31, r = (lane >> 2) & 3;
    const u32 query0 = (u32)(q0 + 2 * (lane & 3) + 8 * r);
    const u32 key_group = (u32)(key0 + 16 * (tid >> 5) + 4 * (lane >> 4));
    const u32 head_row = (u32)((i64)wk.b * p.hq + h_step);
    u32 own[kWords] = {};
#pragma unroll
    for (int c = 0; c < kN / 8; ++c) {  // call c: column group jj = c / 4, h = c / 2 % 2, x = c % 2
      const int jj = c / 4, h = (c / 2) % 2, x = c % 2;
      const sem::Philox4 words = sem::philox4x32_10((key_group + 8 * h) >> 2, query0 + 32 * jj + x, head_row,
                                                    p.offset, (u32)p.seed, (u32)(p.seed >> 32));
#pragma unroll
      for (int k = 0; k < 4; ++k) own[c / 8] |= (u32)(words.x[k] >= p.dropout_threshold) << (4 * (c % 8) + k);
    }
    // Lane src's bit 4c + r is this lane's bit of call c there; packed as bit 4c + src.
#pragma unroll
    for (int m = 0; m < kWords; ++m) {
      w[m] = 0;
#pragma unroll
      for (int src = 0; src < 4; ++src)
        w[m] |= ((__shfl_sync(kFullMask, own[m], (lane & 0x13) | (src << 2)) >> r) & 0x11111111u) << src;
    }
    sm90::pin_registers(w);  // drawn here, ahead of the caller's wgmma wait (ptxas sank it below)
  }
};

/// P^T = exp2(S^T * scale * log2 e - LSE * log2 e), 0 outside each query's visible keys, in r_s;
/// dS^T = P^T (dP^T - D) in r_dp. With ALiBi / softcap (FP_BWD_GENERAL) the score is SPEC's
/// cap tanh(scale S^T / cap) - slope |i + shift - j| and dS^T takes softcap's derivative 1 - tanh^2 through
/// attn::prob_grad; tanh from fast_tanh (tanh.approx, as in the Hopper forward; 2^-11 relative of the
/// portable forward's tanhf), the ALiBi distance in fp32 from one converted base per thread (exact below
/// 2^24 tokens). LSE / D of a column pair come from one 8-byte shared load (the 4 lanes of a quad read
/// different pairs, the 8 quads the same: broadcast). Visibility in 32 bits: key j is visible to query i iff
/// shift - wl <= j - i <= shift + wr and j < len_k (SPEC's window around the bottom-right diagonal;
/// sem::visible_keys), queries past the sequence get P = 0 from their LSE. The mask is applied to every
/// tile, branch-free: a branch around it (for tiles every query sees whole) makes ptxas serialise all
/// wgmmas of the loop (C7512, "insufficient register resources"). Dropout (FP_BWD_GENERAL 3): P^T z and
/// dS^T = P^T (z dP^T - D) with z = 1 / (1 - p) where kept, 0 where dropped (attn::prob_grad).
/// kPart (kGradsWhole: both at once) splits the stage where P^T needs no more than S^T (kGradsSplit: no
/// softcap, no dropout; callers split nowhere else): kGradsProbs computes P^T into r_s alone, while dP^T's
/// GEMM may still run; kGradsFromProbs then dS^T from it. Same operations per element as kGradsWhole, so
/// the same bits.
enum GradsPart { kGradsWhole, kGradsProbs, kGradsFromProbs };
constexpr bool kGradsSplit = !kSoftcap && !kDropout;

template <int kN, int kPart = kGradsWhole, class S>
FP_DEV void scores_to_grads(float (&r_s)[kN / 2], float (&r_dp)[kN / 2], const AttnProblem& p, const S& s,
                            const Work& w, int h_step, int stage, int m0, int q_off, int key0, int tid,
                            const KeepBits<kN>& keep) {
  if constexpr (kPart == kGradsFromProbs) {  // dS^T = P^T (dP^T - D)
    const int t4 = tid & 3;
    const u32 s_dsum = smem_addr(&s.dsum[stage][0]) + 4u * q_off;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const Float2 dsum = ld_shared_f32x2(s_dsum + 4u * (8 * j + 2 * t4));
#pragma unroll
      for (int e = 4 * j; e < 4 * j + 4; ++e) r_dp[e] = r_s[e] * (r_dp[e] - (e % 2 ? dsum.y : dsum.x));
    }
    return;
  }
  const int lane = tid & 31, t4 = lane & 3;
  const int len_q = w.seq.len_q, len_k = w.seq.len_k;
  const float scale_log2 = p.scale * sem::kLog2e;
  const int shift = len_k - len_q;
  const int lo_off =
      p.window_left < 0 || p.window_left >= kFarWindow ? -kFarWindow : shift - (int)p.window_left;
  const int hi_off =
      p.window_right < 0 || p.window_right >= kFarWindow ? kFarWindow : shift + (int)p.window_right;
  int key = key0 + 16 * (tid >> 5) + (lane >> 2);  // key of the h = 0 elements (h = 1: + 8)
  // 128 queries per step: ptxas hoisted key + 8 and key - 2 t4 out of the step loop and spilled them.
  if constexpr (kN == 128 && !kSoftcap) asm volatile("" : "+r"(key));
  // visible iff 0 <= diff - lo_off <= hi_off - lo_off (unsigned: one compare), diff = key - query;
  // rel0 is that offset for element (j = 0, h = 0, x = 0). Pinned here: otherwise ptxas computes the
  // per-element offsets ahead of the wgmma wait and keeps them live beside S and dP (spills at d 64).
  int rel0 = key - (m0 + q_off + 2 * t4) - lo_off;
  u32 span = (u32)(hi_off - lo_off);
  asm volatile("" : "+r"(rel0), "+r"(span));
  const bool key_in[2] = {key < len_k, key + 8 < len_k};
  // ALiBi: the step head's slope (0: off) and diag(query of j = 0, x = 0) - key(h = 0) as a float.
  // Softcap: tanh's argument is S^T * tanh_scale.
  const float slope = kAlibi ? alibi_slope(p, w.b, h_step) : 0.0f;
  const float diag_minus_key = kAlibi ? (float)(m0 + q_off + 2 * t4 + shift - key) : 0.0f;
  const float cap = kSoftcap ? p.softcap : 0.0f;
  const float tanh_scale = kSoftcap ? p.scale / cap : 0.0f;
  const float keep_scale = kDropout ? sem::dropout_keep_scale(p.dropout_p) : 1.0f;
  const u32 s_lse2 = smem_addr(&s.lse2[stage][0]) + 4u * q_off,
            s_dsum = smem_addr(&s.dsum[stage][0]) + 4u * q_off;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const u32 col_addr = 4u * (8 * j + 2 * t4);
    const Float2 lse2 = ld_shared_f32x2(s_lse2 + col_addr);
    const Float2 dsum = kPart == kGradsWhole ? ld_shared_f32x2(s_dsum + col_addr) : Float2{};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int e = 4 * j + 2 * h + x;
        float arg, th = 0.0f;  // th: tanh(scale S^T / cap)
        if constexpr (kAlibi) {
          float score = r_s[e] * p.scale;
          if constexpr (kSoftcap) {
            th = fast_tanh(r_s[e] * tanh_scale);
            score = cap * th;
          }
          score -= slope * fabsf(diag_minus_key + (float)(8 * j + x - 8 * h));  // sem::alibi_distance
          arg = fmaf(score, sem::kLog2e, -(x ? lse2.y : lse2.x));
        } else {
          arg = fmaf(r_s[e], scale_log2, -(x ? lse2.y : lse2.x));
        }
        const u32 rel = (u32)(rel0 + 8 * h - 8 * j - x);
        if (!(key_in[h] && rel <= span)) arg = sem::kNegInf;
        const float prob = fast_exp2(arg);  // 2^-inf = 0
        if constexpr (kDropout) {
          attn::prob_grad(prob, keep.kept(j, h, x), keep_scale, r_dp[e], x ? dsum.y : dsum.x, 0.0f, 0.0f,
                          r_s[e], r_dp[e]);
        } else if constexpr (kSoftcap) {  // capped / cap = th: cap 1 and capped th give the factor 1 - th^2
          attn::prob_grad(prob, true, 1.0f, r_dp[e], x ? dsum.y : dsum.x, 1.0f, th, r_s[e], r_dp[e]);
        } else {
          if constexpr (kPart == kGradsWhole) r_dp[e] = prob * (r_dp[e] - (x ? dsum.y : dsum.x));
          r_s[e] = prob;
        }
      }
    }
  }
}

/// fp32 fragment -> register A operand: pair (e, e + 1) becomes register e / 2, low half first.
template <int kN>
FP_DEV void pack_operand(const float (&f)[kN / 2], u32 (&r)[kN / 4]) {
#pragma unroll
  for (int q = 0; q < kN / 4; ++q) r[q] = Elem::pack(f[2 * q], f[2 * q + 1]);
}

/// Packed (64 keys x kN queries) fragment into a 128B-swizzled [key][64 queries] chunk at `base`, query
/// columns from q_off: key row key_off + 16 * warp + g + 8h, query pair q_off + 8j + 2t, 16-byte unit
/// (q_off / 8 + j) % 8 of chunk (q_off / 8 + j) / 8 swizzled by the row (conflict-free: the 8 rows g land
/// in 8 different units).
template <int kN, int kChunkBytes>
FP_DEV void store_key_rows(u32 base, const u32 (&r)[kN / 4], int key_off, int q_off, int tid) {
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = key_off + 16 * (tid >> 5) + g + 8 * h;  // row % 8 == g
      const int unit = q_off / 8 + j;
      const u32 addr =
          base + (unit / 8) * kChunkBytes + row * kChunkRowBytes + (((unit % 8) ^ g) << 4) + 4 * t4;
      st_shared_u32(addr, r[2 * j + h]);
    }
  }
}

/// dK (times the softmax scale) and dV of 64 keys from key_off in the block (< rows_k), fragment columns
/// col0 + 8j + 2t (< d).
template <int kCols>
FP_DEV void store_dk_dv(const AttnProblem& p, const Work& w, const float (&r_dk)[kCols / 2],
                        const float (&r_dv)[kCols / 2], int key_off, int col0, int tid) {
  const bool varlen = p.cu_seqlens_k != nullptr;
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  u16* g_dk = static_cast<u16*>(p.grad_k.ptr);
  u16* g_dv = static_cast<u16*>(p.grad_v.ptr);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = w.n0 + key_off + 16 * (tid >> 5) + g + 8 * h;
    if (key >= w.seq.rows_k) continue;
    const i64 dk_row = bwd::row_offset(p.grad_k, varlen, w.b, w.seq.k_start, key, w.hk);
    const i64 dv_row = bwd::row_offset(p.grad_v, varlen, w.b, w.seq.k_start, key, w.hk);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const int col = col0 + 8 * j + 2 * t4;
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
FP_DEV void release(const u64& bar) {
  sm90::mbar_arrive(bar_addr(bar));
}

}  // namespace flashport::cuda::hopper_bwd

/// Defines the kernel `name`: grid (key blocks of kBlockN, hk, batch chunk from prm.bwd.batch_offset),
/// kThreads threads, smem_bytes(d, tile) of dynamic shared memory; run_roles over the including file's
/// SharedStorage, kProducerRegs and kConsumerRegs.
#define FLASHPORT_BWD_SM90_KERNEL(name)                                                       \
  extern "C" __global__ void __launch_bounds__(flashport::cuda::hopper_bwd::kThreads, 1)      \
      name(const __grid_constant__ flashport::cuda::hopper_bwd::BwdSm90Params prm,            \
           const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_q,                    \
           const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_k,                    \
           const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_v,                    \
           const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_do) {                 \
    using namespace flashport::cuda::hopper_bwd;                                              \
    flashport::cuda::order_after_prior_grids();                                               \
    run_roles<SharedStorage, kProducerRegs, kConsumerRegs>(prm, tma_q, tma_k, tma_v, tma_do); \
  }
