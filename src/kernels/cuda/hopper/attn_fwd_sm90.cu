// Hopper (sm_90a) FlashAttention forward: a producer warpgroup streams Q once and K/V tiles through a
// TMA + mbarrier ring; two consumer warpgroups (three at BLOCK_M 192; 64 query rows each) compute
// S = Q K^T and O += P V with wgmma and the online softmax in registers, overlapping one tile's softmax
// with the next tile's GEMMs (intra-warpgroup) and, with two consumers, with the other warpgroup's
// GEMMs (ping-pong). Shape from -D FP_DTYPE,
// FP_HEADDIM, FP_BLOCK_M, FP_BLOCK_N, FP_STAGES (tile_for in cuda/hopper/fwd_sm90_config.h);
// FP_PERSISTENT=1 makes every CTA loop over query blocks (grid = SM count). FP_FP8=1: e4m3 inputs,
// V^T in shared memory, P as e4m3 registers (softmax_sm90.cuh), O written from registers.
#include "core/problem.h"
#include "cuda/common/common.cuh"
#include "cuda/hopper/fwd_sm90_config.h"
#include "cuda/hopper/sm90.cuh"
#include "cuda/hopper/softmax_sm90.cuh"
#include "cuda/hopper/wgmma.cuh"

#ifndef FP_PERSISTENT
#define FP_PERSISTENT 0
#endif
// Timing-only ablations (FLASHPORT_JIT_DEFINES=FP_FWD_ABLATE=n, bit flags; out and LSE are then left
// unwritten): 1 the consumers only wait for each K/V stage and release it (the load pipeline's own rate),
// 2 the paged gather's copies read nothing (zero-fill only: its issue and shared-memory cost alone).
#ifndef FP_FWD_ABLATE
#define FP_FWD_ABLATE 0
#endif

namespace flashport::cuda::hopper {

constexpr int kAblate = FP_FWD_ABLATE;
static_assert((kAblate & 1) == 0 || FP_PERSISTENT == 0, "the loads-only ablation runs one block per CTA");

/// Persistent CTAs: one per SM, each taking one query block per round of the schedule (tile_block,
/// round_tile); the K/V ring, the Q buffer and the ping-pong turn carry over from one block to the
/// next, so the next block's first loads overlap this one's last GEMMs and no CTA launch or tail wave
/// separates them.
constexpr bool kPersistent = FP_PERSISTENT != 0;
/// FP_PERSISTENT=2: O is staged in its own buffer where it fits, so the consumers release Q as soon
/// as their last Q K^T is done and the next block's Q loads during the last P V and the epilogue.
constexpr bool kSeparateO =
    FP_PERSISTENT == 2 && separate_o_fits(FP_HEADDIM, Tile{FP_BLOCK_M, FP_BLOCK_N, FP_STAGES});

/// The O staging buffer of kSeparateO (an empty base otherwise: no bytes).
template <bool kOn>
struct OStaging {
  u8 o[kChunks][kTileM][kChunkRowBytes];  // (BLOCK_M, HEAD_DIM), the layout of q
  FP_DEV u8* o_staging(u8*) { return &o[0][0][0]; }
};
template <>
struct OStaging<false> {
  FP_DEV u8* o_staging(u8* q) { return q; }
};

// ---------------------------------------------------------------------------------------------
// Shared memory. Every tile is stored as 64-column chunks of rows x 128 bytes in the 128B-swizzle
// layout TMA writes; each chunk starts 1024-byte aligned (block_m, block_n multiples of 8), so
// wgmma descriptors need no base offset.

/// The gather's record of one key tile: each key row's K and V offsets from the kv head's base in 16-byte
/// units (kGatherNone: zero-fill, a row past the keys or a page past the pool), stored by gather_index so
/// that the rows one producer thread copies lie side by side (two 16-byte shared loads per operand). Their
/// writer computes them once per row; the copy loop does one 32-bit multiply-add per row.
template <int kRows>
struct alignas(16) GatherTile {  // read as uint4
  u32 k[kRows], v[kRows];
};
/// The gather's tiles of kGatherSlots key tiles where gather_fits (an empty base otherwise); key tile n's
/// in slot n % kGatherSlots.
template <bool kOn>
struct GatherRows {
  GatherTile<kBlockN> gather[kGatherSlots];
  FP_DEV GatherTile<kBlockN>* gather_slot(int n) { return &gather[n % kGatherSlots]; }
};
template <>
struct GatherRows<false> {
  FP_DEV GatherTile<kBlockN>* gather_slot(int) { return nullptr; }
};

struct alignas(1024) SharedStorage
    : OStaging<kSeparateO>,
      GatherRows<gather_fits(kHeadDim, Tile{kTileM, kBlockN, kStages}, kSeparateO, kElemBytes)> {
  u8 q[kChunks][kTileM][kRowBytes];            // (BLOCK_M, HEAD_DIM); rows of consumer c at 64c; O staging
  u8 k[kStages][kChunks][kBlockN][kRowBytes];  // (BLOCK_N, HEAD_DIM) per stage
  u8 v[kStages][kVChunks][kVRows]
      [kChunkRowBytes];                        // (BLOCK_N, HEAD_DIM) per stage; FP8: V^T (HEAD_DIM, BLOCK_N)
  u64 bar_q;                                   // Q landed (one phase per query block)
  u64 bar_q_empty;                             // persistent: 8 consumer warps done with Q (and O staging)
  int m_blocks, tiles, rounds;                 // persistent schedule: query blocks per head, in all;
  int section, section_tiles, section_rounds;  // rounds; pairs, tiles and rounds per section
  u64 bar_k_full[kStages], bar_k_empty[kStages];  // full: TMA bytes landed; empty: 8 consumer warps done
  u64 bar_v_full[kStages], bar_v_empty[kStages];
};
static_assert(sizeof(SharedStorage) + 1024 ==
                  smem_bytes(kHeadDim, Tile{kTileM, kBlockN, kStages}, kSeparateO, kElemBytes),
              "host and kernel disagree on the shared-memory size");
static_assert(smem_bytes(kHeadDim, Tile{kTileM, kBlockN, kStages}, kSeparateO, kElemBytes) <= kSmemLimit,
              "over 227 KB");
static_assert(!kFp8 || FP_PERSISTENT != 2, "the FP8 kernel stages no O: persistent mode 1 only");
/// Whether Q is released right after the block's last Q K^T (so the next block's Q loads during the last
/// P V and the epilogue): O staged apart (kSeparateO), or not staged at all (FP8, which stores O from
/// registers). Otherwise the release follows the epilogue, which stages O in Q's rows.
constexpr bool kReleaseQEarly = kSeparateO || (kFp8 && kPersistent);

// Two consumers take turns issuing their GEMMs (ping-pong), so one's softmax overlaps the other's
// GEMMs. Three (BLOCK_M 192) issue freely: the warp schedulers interleave them (FA3 does the same).
constexpr bool kPingPong = kConsumers == 2;
// Named barriers: ping-pong turn of consumer c (both consumers, 256 threads) and the epilogue of
// consumer c (its 128 threads). Id 0 is __syncthreads.
constexpr u32 kBarTurn = 1;                        // + c
constexpr u32 kBarEpilogue = 1 + (u32)kConsumers;  // + c
constexpr int kConsumerWarps = 4 * kConsumers;     // arrivals that release a K or V stage

// Register budgets after reallocation: 128 x 24 + 256 x 240 = 64512 <= 65536 with two consumers
// (the kernel starts with 168 per thread: __launch_bounds__(384, 1)), 128 x 24 + 384 x 160 = 64512
// with three (starting at 128: __launch_bounds__(512, 1)), so the pool covers the increase.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register file");

FP_DEV u32 bar_addr(const u64& bar) {
  return smem_addr(&bar);
}

// ---------------------------------------------------------------------------------------------
// Producer: one thread issues every TMA load.

/// Position in the K/V stage ring; carried from one query block to the next by persistent CTAs.
struct Ring {
  int stage;
  u32 phase;
};

/// Q of the block on bar_q. Persistent CTAs first wait until all 8 consumer warps released the
/// previous block's Q (the empty-barrier parity rule of the ring, with q_count blocks loaded so far).
FP_DEV void load_q(const FwdSm90Params& prm, SharedStorage& s, const Block& blk, const TmaDesc& tma_q,
                   u32 q_count) {
  if (kPersistent) sm90::mbar_wait(bar_addr(s.bar_q_empty), (q_count & 1) ^ 1);
  const u32 bar_q = bar_addr(s.bar_q);
  sm90::mbar_arrive_expect_tx(bar_q, kChunks * kTileM * kRowBytes);
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch)
    sm90::tma_load_chunk(smem_addr(&s.q[ch][0][0]), tma_q, prm.dims_q, bar_q, kChunkCols * ch, (int)blk.h,
                         blk.q_row, blk.q_batch);
}

/// The block-table entry (pool page) holding key `token` of the block's sequence.
FP_DEV int table_page(const AttnProblem& p, const Block& blk, int token) {
  return p.block_table[(i64)blk.b * p.block_table_stride + token / (int)p.page_size];
}

/// Page-table entries a paged tile load reads before issuing their boxes: the producer thread runs on
/// kProducerRegs registers, so a tile of many small pages is read in batches of this many round trips.
constexpr int kPageBatch = 4;

/// Key tile n of K (or of 16-bit V) into the kChunks chunks at shared address `dst`, one box per chunk at
/// the tile's rows. A paged cache (block_table: its map's rows are a page's tokens, its batches the pool's
/// pages) takes one box per page the tile spans: the tile lies in one page when pages hold a multiple of
/// BLOCK_N tokens, else BLOCK_N / page_size boxes of a page each (rows a multiple of 8, the swizzle atom:
/// hopper::unsupported), their table entries read kPageBatch at a time; `big_page` is the tile's page
/// when it lies in one (read a tile ahead by produce). Pages past the sequence's keys load page -1: TMA
/// zero fill, whose bytes still count on the barrier. Paged problems run one CTA per block (hopper_fwd.cpp,
/// persistent_for): persistent builds leave the paged path out (its live values made their 24-register
/// producer spill).
FP_DEV void load_kv_tile(const AttnProblem& p, u32 dst, const TmaDesc& tma, const TmaDims& dims, u32 bar,
                         const Block& blk, int n, int big_page) {
  if (kPersistent || p.block_table == nullptr) {
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch)
      sm90::tma_load_chunk(dst + ch * kKVChunkBytes, tma, dims, bar, kChunkCols * ch, blk.hk,
                           blk.k_row + n * kBlockN, blk.k_batch);
    return;
  }
  const int page_size = (int)p.page_size;     // the host keeps paged tiles within int
  if (page_size >= kBlockN && kChunks < 4) {  // the tile's page from produce's `big_pages` read
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch)
      sm90::tma_load_chunk(dst + ch * kKVChunkBytes, tma, dims, bar, kChunkCols * ch, blk.hk,
                           n * kBlockN % page_size, big_page);
    return;
  }
  const int box = page_size < kBlockN ? page_size : kBlockN;
  const int token0 = n * kBlockN;
  for (int r0 = 0; r0 < kBlockN; r0 += kPageBatch * box) {
    int page[kPageBatch];
#pragma unroll
    for (int i = 0; i < kPageBatch; ++i) {
      const int token = token0 + r0 + i * box;
      page[i] = r0 + i * box < kBlockN && token < blk.sk ? table_page(p, blk, token) : -1;
    }
#pragma unroll
    for (int i = 0; i < kPageBatch; ++i) {
      const int r = r0 + i * box;
      if (r >= kBlockN) break;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch)
        sm90::tma_load_chunk(dst + ch * kKVChunkBytes + r * kRowBytes, tma, dims, bar, kChunkCols * ch,
                             blk.hk, (token0 + r) % page_size, page[i]);
    }
  }
}

/// V of key tile n into `stage`: 16-bit, kChunks boxes of the V map like K; FP8, kVChunks boxes of 128 keys
/// x HEAD_DIM rows of the V^T map (slots, head dim, kv head, slab: fp8_v_transpose's layout, the sequence's
/// keys from `vt_start`, its fp8_vt_start slot).
FP_DEV void load_v(const FwdSm90Params& prm, SharedStorage& s, const Block& blk, const TmaDesc& tma_v,
                   int stage, int n, u32 v_full, int vt_start, int big_page) {
  if constexpr (kFp8) {
#pragma unroll
    for (int ch = 0; ch < kVChunks; ++ch)
      sm90::tma_load_4d(smem_addr(&s.v[stage][ch][0][0]), tma_v, v_full,
                        vt_start + n * kBlockN + kChunkCols * ch, 0, (int)blk.hk, blk.k_batch);
  } else {
    load_kv_tile(prm.p, smem_addr(&s.v[stage][0][0][0]), tma_v, prm.dims_v, v_full, blk, n, big_page);
  }
}

/// Q, then K and V of every key tile from n_max - 1 down to n_min through the stage ring.
/// Stage s is reused once all 8 consumer warps released it: the empty-barrier wait uses the
/// opposite parity of the consumers' full-barrier wait, so the first pass does not block.
FP_DEV void produce(const FwdSm90Params& prm, SharedStorage& s, const Block& blk, const TmaDesc& tma_q,
                    const TmaDesc& tma_k, const TmaDesc& tma_v, Ring& ring, u32& q_count) {
  // Persistent: the first K goes out before the wait for Q's release, which comes only after the
  // previous block's epilogue.
  if (!kPersistent) load_q(prm, s, blk, tma_q, q_count);
  int stage = ring.stage;
  u32 phase = ring.phase;
  const int vt_start = kFp8 ? (int)fp8_vt_start(prm.p, blk.b) : 0;  // read once per block
  // Pages of whole tiles: the next tile's page is read while this one's boxes fly (the read would
  // otherwise stand between a freed stage and its load). At d 256 (four chunks) the producer spilled.
  const bool big_pages =
      !kPersistent && kChunks < 4 && prm.p.block_table != nullptr && prm.p.page_size >= kBlockN;
  const auto tile_page = [&](int n) { return table_page(prm.p, blk, n * kBlockN); };
  int next_page = big_pages ? tile_page(blk.n_max - 1) : -1;
  for (int n = blk.n_max - 1; n >= blk.n_min; --n) {
    const u32 k_full = bar_addr(s.bar_k_full[stage]), v_full = bar_addr(s.bar_v_full[stage]);
    const int page = next_page;
    sm90::mbar_wait(bar_addr(s.bar_k_empty[stage]), phase ^ 1);
    sm90::mbar_arrive_expect_tx(k_full, kKVTileBytes);
    load_kv_tile(prm.p, smem_addr(&s.k[stage][0][0][0]), tma_k, prm.dims_k, k_full, blk, n, page);
    if (big_pages && n > blk.n_min) next_page = tile_page(n - 1);
    if (kPersistent && n == blk.n_max - 1) load_q(prm, s, blk, tma_q, q_count);
    sm90::mbar_wait(bar_addr(s.bar_v_empty[stage]), phase ^ 1);
    sm90::mbar_arrive_expect_tx(v_full, kVTileBytes);
    load_v(prm, s, blk, tma_v, stage, n, v_full, vt_start, page);
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  ring = {stage, phase};
  ++q_count;
}

/// Builds that carry produce_gather: 16-bit tiles of d <= 128 where its rows fit (gather_fits), no score
/// transform, non-persistent (paged problems run one CTA per block). At d 192 / 256, and beside ALiBi /
/// softcap / dropout, the gather's code made the kernel spill (the producer on its 24 registers); those keep
/// one TMA box per page. Whether a call gathers is the host's decision (FwdSm90Params::gather).
constexpr bool kGatherBuild = kTransform == 0 && !kPersistent &&
                              gather_fits(kHeadDim, Tile{kTileM, kBlockN, kStages}, kSeparateO, kElemBytes);
FP_DEV bool paged_gather(const FwdSm90Params& prm) {
  return kGatherBuild && prm.gather != 0;
}

#if !FP_PERSISTENT

/// The gather's thread layout: 8 consecutive threads per 128-byte chunk row (a warp reads four whole
/// rows, every 32-byte sector once), each thread a row's 16-byte unit in every chunk (one row record, kChunks
/// copies); kGatherRows rows per pass of the warpgroup, kGatherPasses passes.
constexpr int kGatherUnits = kRowBytes / 16;
constexpr int kGatherRows = 128 / kGatherUnits;
constexpr int kGatherPasses = kBlockN / kGatherRows;
static_assert(!kGatherBuild || (kBlockN % kGatherRows == 0 && kGatherRows % 8 == 0 && kGatherPasses % 4 == 0),
              "the gather's passes (whole 16-byte record loads)");
/// Named barrier of the producer warpgroup (after the consumers' turn and epilogue barriers).
constexpr u32 kBarGather = 1 + 2 * (u32)kConsumers;

/// Where key row t's record sits in a GatherTile: pass-major per thread row (row0 = t % kGatherRows).
FP_DEV constexpr int gather_index(int t) {
  return (t % kGatherRows) * kGatherPasses + t / kGatherRows;
}

/// The table entry of key row t of tile n (thread t of the producer warpgroup; -1 past the tile or the keys).
FP_DEV int gather_page(const AttnProblem& p, const Block& blk, int n, int t) {
  const int token = n * kBlockN + t;
  return t < kBlockN && token < blk.sk ? table_page(p, blk, token) : -1;
}

/// Key row t of tile n's record from its table entry `page` (read a tile earlier), into the slot.
FP_DEV void gather_rows(SharedStorage& s, const AttnProblem& p, int n, int t, int page) {
  if constexpr (kGatherBuild) {
    if (t < kBlockN) {
      // 32-bit products: every term is non-negative and their sum below 2^32 (the host's gather_reaches); the
      // strides are whole 16-byte units (the Hopper kernels' rows_aligned).
      constexpr int kUnit = 16 / kElemBytes;
      const u32 row = (u32)((n * kBlockN + t) % (int)p.page_size);
      const bool ok = page >= 0 && page < p.kv_rows;
      const auto units = [&](const Operand& op) {
        return ok ? (u32)page * (u32)(op.batch_stride / kUnit) + row * (u32)(op.row_stride / kUnit)
                  : kGatherNone;
      };
      // t's place from a volatile %tid.x read: hoisted out of the tile loop, it spilled (d 64, 192 rows).
      const int at = gather_index(sm90::tid_x_volatile());
      GatherTile<kBlockN>& g = *s.gather_slot(n);
      g.k[at] = units(p.k);
      g.v[at] = units(p.v);
    }
  }
}

/// Key tile n of one operand into the stage at `dst` (TMA's 128B-swizzle layout: 16-byte unit u of a chunk
/// row r at u ^ (r % 8)) from its record `units` (GatherTile::k or ::v), then this thread's arrival on
/// `full` once its copies land; kGatherNone rows and columns past the head dim (d == dv == FP_HEADDIM
/// here) are zero-filled. The thread's records come four at a time in one 16-byte load, so four rows'
/// copies wait on one shared load.
FP_DEV void gather_tile(u32 dst, u32 full, const Operand& op, int hk, const u32* units) {
  const int t = sm90::tid_x_volatile(), unit = t % kGatherUnits, row0 = t / kGatherUnits;
  const u8* base = static_cast<const u8*>(op.ptr) + (i64)hk * op.head_stride * kElemBytes + unit * 16;
  dst += row0 * kRowBytes + ((unit ^ (row0 & 7)) << 4);  // row0 + i * kGatherRows: the same swizzle
  const uint4* records = reinterpret_cast<const uint4*>(units + gather_index(row0));
#pragma unroll
  for (int i4 = 0; i4 < kGatherPasses / 4; ++i4) {
    const uint4 r4 = records[i4];
    const u32 rec[4] = {r4.x, r4.y, r4.z, r4.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * i4 + j;
      const bool none = (kAblate & 2) != 0 || rec[j] == kGatherNone;
      const u8* src = base + (u64)(none ? 0u : rec[j]) * 16;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const bool zero = none || c * kChunkCols + unit * 8 >= kHeadDim;  // d 96's padding
        cp_async_16_or_zero(dst + i * kGatherRows * kRowBytes + c * kKVChunkBytes, src + c * kRowBytes, zero);
      }
    }
  }
  sm90::mbar_arrive_cp_async(full);
}

/// produce() for pages smaller than a key tile, on the whole producer warpgroup (cp.async, whole rows per
/// warp): the full barriers count the warpgroup's 128 arrivals in this mode, each made by the hardware
/// once that thread's copies landed, so the producer, like the TMA one, waits only for free stages. K(n)
/// goes out before V(n + 1): the consumers release V(n + 1)'s stage (V(n + 3)) only once K(n + 1) is full,
/// and K(n)'s once S(n + 2) ran. Iteration n also writes tile n - 1's rows from table entries read an
/// iteration earlier (the sync below never waits for a table read), then the warpgroup syncs; a slot's
/// last reader (V(m), iteration m - 1) thus passed two barriers before its rewrite for tile m - 3
/// (iteration m - 2): three slots. The consumers fence the async proxy after their full waits (wgmma
/// reads what cp.async wrote). One TMA box per page from one thread held pages of 16 at 0.28-0.31x FA3; this
/// gather runs pages of 8-64 at 0.89-0.93x (H100, docs/PERF.md), since its copy loop lost the per-copy
/// shared load and 64-bit products (0.53-0.57x with them).
FP_DEV void produce_gather(const FwdSm90Params& prm, SharedStorage& s, const Block& blk, const TmaDesc& tma_q,
                           int t) {
  if constexpr (kGatherBuild) {
    const AttnProblem& p = prm.p;
    u32 q_count = 0;
    if (t == 0) load_q(prm, s, blk, tma_q, q_count);
    if (blk.n_max <= blk.n_min) return;
    const int top = blk.n_max - 1;
    const auto stage = [&](int n) { return (top - n) % kStages; };
    const auto parity = [&](int n) { return (u32)((top - n) / kStages) & 1u; };
    const auto gather_v = [&](int n) {
      sm90::mbar_wait(bar_addr(s.bar_v_empty[stage(n)]), parity(n) ^ 1);
      gather_tile(smem_addr(&s.v[stage(n)][0][0][0]), bar_addr(s.bar_v_full[stage(n)]), p.v, blk.hk,
                  s.gather_slot(n)->v);
    };
    gather_rows(s, p, top, t, gather_page(p, blk, top, t));
    int next_page = top > blk.n_min ? gather_page(p, blk, top - 1, t) : -1;  // tile top - 1's
    sm90::named_bar_sync(kBarGather, 128);
    for (int n = top; n >= blk.n_min; --n) {
      sm90::mbar_wait(bar_addr(s.bar_k_empty[stage(n)]), parity(n) ^ 1);
      gather_tile(smem_addr(&s.k[stage(n)][0][0][0]), bar_addr(s.bar_k_full[stage(n)]), p.k, blk.hk,
                  s.gather_slot(n)->k);
      if (n > blk.n_min) gather_rows(s, p, n - 1, t, next_page);
      if (n - 1 > blk.n_min) next_page = gather_page(p, blk, n - 2, t);  // stored next iteration
      if (n + 1 <= top) gather_v(n + 1);
      sm90::named_bar_sync(kBarGather, 128);
    }
    gather_v(blk.n_min);
    cp_async_wait_all();  // no thread leaves copies in flight
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// Consumer GEMMs. Descriptors: see sm90.cuh. Q/K are K-major (k step: +32 bytes inside a chunk,
// next chunk after 4 steps); V is the MN-major B of P V (k step of 16 keys: +2048 bytes; the N
// extent crosses chunks through LBO = one chunk).

/// S = Q K^T for this warpgroup's 64 rows: HEAD_DIM / 16 wgmmas (FP8: / 32), the first overwriting S.
FP_DEV void gemm_qk(float (&r_s)[kBlockN / 2], u64 desc_q, u64 desc_k) {
#if FP_FP8
  sm90::gemm_ss_kmajor_fp8<kBlockN, kHeadDim, kTileM * kRowBytes, kKVChunkBytes>(r_s, desc_q, desc_k);
#else
  sm90::gemm_ss_kmajor<kBlockN, kHeadDim, kTileM * kChunkRowBytes, kKVChunkBytes>(r_s, desc_q, desc_k);
#endif
}

/// O += P V: BLOCK_N / 16 wgmmas with P (bf16/f16 pairs in registers) as the A operand; FP8: BLOCK_N / 32
/// with e4m3 P and V^T as the K-major B.
FP_DEV void gemm_pv(float (&r_o)[kPvN / 2], const u32 (&r_p)[kPRegs], u64 desc_v) {
#if FP_FP8
  sm90::gemm_rs_kmajor_fp8<kPvN, kBlockN, kVChunkBytes>(r_o, r_p, desc_v);
#else
  sm90::gemm_rs_mn<kPvN, kBlockN>(r_o, r_p, desc_v);
#endif
}

/// One arrival per warp on a stage's empty barrier, after this warp's wgmmas reading it completed.
FP_DEV void release(const u64& bar, int lane) {
  if (lane == 0) sm90::mbar_arrive(bar_addr(bar));
}

// ---------------------------------------------------------------------------------------------
// Epilogue.

using sm90::st_shared_u32;

/// Normalises O, writes the LSE, stages this warpgroup's 64 rows of O in its own rows of s.q (its
/// QK^T wgmmas have all completed; the other consumer never reads them), or of s.o with kSeparateO
/// (after a barrier: a warp may still be reading the previous block's rows) in the same swizzled layout
/// (conflict-free: the 8 rows g of a store land in 8 different 16-byte units), then copies rows
/// inside the sequence to global memory with 16-byte stores. Rows past the sequence are never written.
/// FP8: O (twice Q's bytes) has no staging room; each thread stores its pairs straight from registers
/// (four lanes fill a row's 16 bytes of every 8 columns), scaled by v's descale.
FP_DEV void store_output(const AttnProblem& p, const Block& blk, SharedStorage& s, float (&r_o)[kPvN / 2],
                         const RowState& st, int c, int tid) {
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  float inv[2], lse[2];
  finalize_rows(st, inv, lse);
  if constexpr (kDropout) {  // kept probabilities scaled by 1 / (1 - p) (SPEC step 6)
#pragma unroll
    for (int h = 0; h < 2; ++h) inv[h] *= sem::dropout_keep_scale(p.dropout_p);
  }
  if (p.lse && t4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = thread_row(blk, h);
      if (i < blk.sq) p.lse[lse_offset(p, blk.b, blk.h, i)] = lse[h];
    }
  }
  if constexpr (kFp8) {
    const float v_scale = descale(p, 2, blk.b, blk.hk);
    u32* g_o = static_cast<u32*>(p.o.ptr);  // pairs: o's strides are even (the host checks multiples of 8)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = thread_row(blk, h);
      if (i >= blk.sq) continue;
      const i64 row = q_offset(p, p.o, blk.b, i, blk.h) / 2 + t4;
      const float f = inv[h] * v_scale;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        g_o[row + 4 * j] = OutElem::pack(r_o[4 * j + 2 * h] * f, r_o[4 * j + 2 * h + 1] * f);
    }
    return;
  }
  if (kSeparateO) sm90::named_bar_sync(kBarEpilogue + c, 128);
  const u32 s_q = smem_addr(s.o_staging(&s.q[0][0][0]));
  static_assert(sizeof(typename OutElem::Storage) == 2, "16-bit output staged in Q's layout");
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 64 * c + 16 * warp + g + 8 * h;  // row % 8 == g
      const u32 addr =
          s_q + (j / 8) * kTileM * kChunkRowBytes + row * kChunkRowBytes + (((j % 8) ^ g) << 4) + 4 * t4;
      st_shared_u32(addr, OutElem::pack(r_o[4 * j + 2 * h] * inv[h], r_o[4 * j + 2 * h + 1] * inv[h]));
    }
  }
  sm90::named_bar_sync(kBarEpilogue + c, 128);
  constexpr int kUnits = kHeadDim / 8;  // 16-byte units per row
  u16* g_o = static_cast<u16*>(p.o.ptr);
#pragma unroll
  for (int it = 0; it < 64 * kUnits / 128; ++it) {
    const int idx = it * 128 + tid, row = 64 * c + idx / kUnits, u = idx % kUnits;
    const i64 i = blk.m0 + row;
    if (i >= blk.sq) continue;
    const U32x4 v = ld_shared_16(s_q + (u / 8) * kTileM * kChunkRowBytes + row * kChunkRowBytes +
                                 (((u % 8) ^ (row % 8)) << 4));
    st_global_16(g_o + q_offset(p, p.o, blk.b, i, blk.h) + 8 * u, v);
  }
}

/// A query block that sees no key at all: O = 0 and LSE = -inf for its rows (threads `thread` of
/// `threads`: the whole CTA, or the consumers of a persistent CTA).
FP_DEV void store_empty(const AttnProblem& p, const Block& blk, int thread, int threads) {
  constexpr int kUnits = kHeadDim / 8;
  const int rows = blk.sq - blk.m0 < kTileM ? blk.sq - blk.m0 : kTileM;
  u16* g_o = static_cast<u16*>(p.o.ptr);
  for (int idx = thread; idx < rows * kUnits; idx += threads) {
    const i64 i = blk.m0 + idx / kUnits;
    st_global_16(g_o + q_offset(p, p.o, blk.b, i, blk.h) + 8 * (idx % kUnits), U32x4{0, 0, 0, 0});
  }
  if (p.lse) {
    for (int r = thread; r < rows; r += threads)
      p.lse[lse_offset(p, blk.b, blk.h, blk.m0 + r)] = sem::kNegInf;
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer warpgroup c (0 .. kConsumers - 1): rows 64c..64c+63 of the query block.
//
// Per key tile n (after the first): wait K(n) and V(n+1); take the ping-pong turn; issue S(n) =
// Q K(n)^T, then O += P(n+1) V(n+1) (the previous tile; tiles run downwards); hand the turn to the
// other consumer; wait for S(n) only, release K(n), run the softmax of S(n) while P V still runs;
// wait for K(n-1) (a block boundary for ptxas, see below), then for P V; release V(n+1), pack P(n)
// and rescale O. The other consumer's softmax thus overlaps this one's GEMMs. Turn bookkeeping:
// consumer 1 grants consumer 0 the first turn; each tile after the first costs each consumer one
// sync on its own barrier and one arrival on the other's, so exactly one grant (consumer 1's last)
// is left pending after every block: a persistent CTA's next block uses it as its first grant, and
// one is left pending when the CTA exits. (The first grant is given before the first block.) Three
// consumers skip the turns (kPingPong).

FP_DEV void consume(const AttnProblem& p, SharedStorage& s, const Block& blk, int c, Ring& ring, u32& q_count,
                    bool gathered) {
  const int tid = sm90::tid_x_volatile() - 128 * (c + 1);
  const int lane = tid & 31;
  // FP8: q's and k's descales of this (sequence, kv head) scale every score (SPEC "FP8"): through
  // to_log2, or in transform kernels (whose scores leave prepare_scores in the log2 domain) before the
  // transform.
  const float q_descale = kFp8 ? descale(p, 0, blk.b, blk.hk) : 1.0f,
              k_descale = kFp8 ? descale(p, 1, blk.b, blk.hk) : 1.0f;
  const float qk_descale = q_descale * k_descale;
  const float to_log2 = kFp8 && !kAlibi ? scores_to_log2(p) * q_descale * k_descale : scores_to_log2(p);
  const float slope2 = kAlibi ? alibi_slope(p, blk.b, blk.h) * sem::kLog2e : 0.0f;  // ALiBi's, log2 units
  // `gathered`: K/V written by the producer's cp.async (generic proxy), read by wgmma (async proxy): fence
  // after the full waits.

  // Q, K: K-major, the next 8 rows one swizzle atom (8 rows) further.
  const u64 desc_q =
      sm90::smem_desc(smem_addr(&s.q[0][0][0]) + 64 * c * kRowBytes, 16, 8 * kRowBytes, kRowBytes);
  const u64 desc_k = sm90::smem_desc(smem_addr(&s.k[0][0][0][0]), 16, 8 * kRowBytes, kRowBytes);
  // V: 16-bit MN-major (LBO = one chunk); FP8 V^T K-major like K.
  const u64 desc_v = sm90::smem_desc(smem_addr(&s.v[0][0][0][0]), kFp8 ? 16 : kKVChunkBytes, 1024);

  float r_o[kPvN / 2];     // (64, kPvN) accumulator fragment: O, columns >= HEAD_DIM stay 0
  float r_s[kBlockN / 2];  // (64, BLOCK_N) scores, then probabilities in fp32
  u32 r_p[kPRegs];         // (64, BLOCK_N) probabilities as the register A operand
  float alpha[2];
#pragma unroll
  for (int e = 0; e < kPvN / 2; ++e) r_o[e] = 0.0f;
  RowState st = row_state_init();

  sm90::mbar_wait(bar_addr(s.bar_q), q_count & 1);

  int n = blk.n_max - 1, stage = ring.stage;
  u32 phase = ring.phase;
  if constexpr ((kAblate & 1) != 0) {  // loads only: every stage waited for and released, nothing computed
    for (; n >= blk.n_min; --n) {
      sm90::mbar_wait(bar_addr(s.bar_k_full[stage]), phase);
      release(s.bar_k_empty[stage], lane);
      sm90::mbar_wait(bar_addr(s.bar_v_full[stage]), phase);
      release(s.bar_v_empty[stage], lane);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    return;
  }
  sm90::mbar_wait(bar_addr(s.bar_k_full[stage]), phase);
  if (gathered) sm90::fence_proxy_async();
  sm90::wgmma_fence();
  gemm_qk(r_s, desc_q, sm90::desc_advance(desc_k, stage * kKVTileBytes));
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(r_s);
  release(s.bar_k_empty[stage], lane);
  prepare_scores(r_s, p, blk, n, slope2, qk_descale);
  online_softmax(r_s, st, to_log2, alpha);  // O is still 0: nothing to rescale
  if constexpr (kDropout) drop_probs(r_s, p, blk, n);
  convert_p<Elem>(r_s, r_p);

  for (--n; n >= blk.n_min; --n) {
    const int stage_v = stage;
    const u32 phase_v = phase;
    if (++stage == kStages) stage = 0, phase ^= 1;
    // V(n+1) was issued before K(n), so waiting for both first costs nothing and keeps the two
    // GEMM batches free of branches (ptxas would otherwise re-fence before the P V batch).
    sm90::mbar_wait(bar_addr(s.bar_k_full[stage]), phase);
    sm90::mbar_wait(bar_addr(s.bar_v_full[stage_v]), phase_v);
    if (gathered) sm90::fence_proxy_async();
    if (kPingPong) sm90::named_bar_sync(kBarTurn + c, 256);
    sm90::wgmma_fence();
    gemm_qk(r_s, desc_q, sm90::desc_advance(desc_k, stage * kKVTileBytes));
    sm90::wgmma_commit();
    gemm_pv(r_o, r_p, sm90::desc_advance(desc_v, stage_v * kVTileBytes));
    sm90::wgmma_commit();
    if (kPingPong) sm90::named_bar_arrive(kBarTurn + (1 - c), 256);
    sm90::wgmma_wait<1>();
    sm90::pin_registers(r_s);
    release(s.bar_k_empty[stage], lane);
    prepare_scores(r_s, p, blk, n, slope2, qk_descale);
    const bool rescale = online_softmax(r_s, st, to_log2, alpha);
    if constexpr (kDropout) drop_probs(r_s, p, blk, n);  // while P V runs
    sm90::pin_registers(r_s);
    // ptxas schedules WARPGROUP.DEPBAR (wgmma_wait) as early as its basic block allows, which
    // would put the whole softmax behind the P V GEMM. Waiting here for the next tile's K (needed
    // next anyway, normally landed long ago) is a loop, hence a block boundary the wait cannot
    // cross. The row-sum test is always true (l >= 0); it makes every exponential an input of the
    // branch, so ptxas cannot sink any of them below it either.
    if (n > blk.n_min && st.l[0] + st.l[1] >= 0.0f) {
      const int next = stage + 1 == kStages ? 0 : stage + 1;
      sm90::mbar_wait(bar_addr(s.bar_k_full[next]), next == 0 ? phase ^ 1 : phase);
    }
    sm90::wgmma_wait<0>();
    sm90::pin_registers(r_o);
    sm90::pin_registers(r_p);
    release(s.bar_v_empty[stage_v], lane);
    convert_p<Elem>(r_s, r_p);
    if (rescale) rescale_o(r_o, alpha);
  }

  // Every Q K^T of the block has completed: with O staged elsewhere, the next block's Q may load now.
  if (kReleaseQEarly) release(s.bar_q_empty, lane);
  sm90::mbar_wait(bar_addr(s.bar_v_full[stage]), phase);
  if (gathered) sm90::fence_proxy_async();
  sm90::wgmma_fence();
  gemm_pv(r_o, r_p, sm90::desc_advance(desc_v, stage * kVTileBytes));
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(r_o);
  release(s.bar_v_empty[stage], lane);
  store_output(p, blk, s, r_o, st, c, tid);
  if (++stage == kStages) stage = 0, phase ^= 1;
  ring = {stage, phase};
  ++q_count;
  if (kPersistent && !kReleaseQEarly) {
    // Release Q (and the O staging in it) to the producer's next TMA: order this thread's generic
    // shared-memory accesses before the async proxy's writes, then one arrival per warp.
    sm90::fence_proxy_async();
    __syncwarp();
    release(s.bar_q_empty, lane);
  }
}

/// Barrier counts: full barriers complete on the producer's one arrive.expect_tx plus the bytes (the
/// gather's: on the producer warpgroup's 128 arrivals, `full_count`); empty barriers on one arrival per
/// consumer warp; Q on one arrive.expect_tx plus its bytes.
FP_DEV void init_barriers(SharedStorage& s, u32 full_count) {
  sm90::mbar_init(bar_addr(s.bar_q), 1);
  sm90::mbar_init(bar_addr(s.bar_q_empty), kConsumerWarps);
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    sm90::mbar_init(bar_addr(s.bar_k_full[st]), full_count);
    sm90::mbar_init(bar_addr(s.bar_v_full[st]), full_count);
    sm90::mbar_init(bar_addr(s.bar_k_empty[st]), kConsumerWarps);
    sm90::mbar_init(bar_addr(s.bar_v_empty[st]), kConsumerWarps);
  }
  sm90::fence_barrier_init();
}

}  // namespace flashport::cuda::hopper

namespace flashport::cuda::hopper {

/// A shared int read at every use (ld.volatile): the persistent schedule's sizes are then not
/// kept in registers across the main loop (they would be spilled at d >= 192).
FP_DEV int ld_volatile_shared(const int& x) {
  return sm90::ld_volatile_shared_s32(smem_addr(&x));
}

/// Query block `t` of a persistent schedule. Causal (keys up to the diagonal, no left window):
/// causal_tile's order (sections of heads whose K/V fit L2, heaviest block first within each), so each
/// round of gridDim.x tiles is of near-equal work, CTAs running together share a section's K/V in L2
/// (one heaviest-first order over all heads lost 3-8% from 2k keys: every CTA streamed its own head
/// from DRAM) and the lightest blocks fill the tail. Otherwise (equal work per block) the non-persistent
/// grid's launch order: sequence, head, query block from the last, so CTAs running together share a head's
/// K/V in L2. False when the block lies past its sequence's end.
FP_DEV bool tile_block(const AttnProblem& p, const SharedStorage& s, int t, Block& blk) {
  const int m_blocks = ld_volatile_shared(s.m_blocks);
  const bool triangular = p.window_right == 0 && p.window_left < 0;
  int bh, mb;
  if (triangular) {
    const CausalTile c = causal_tile(t, m_blocks, (int)(p.hq * p.batch), ld_volatile_shared(s.section));
    mb = c.m_block, bh = c.pair;
  } else {
    bh = t / m_blocks;
    mb = m_blocks - 1 - (t - bh * m_blocks);
  }
  return make_block<false>(p, blk, mb, bh % (int)p.hq, bh / (int)p.hq);
}

/// This CTA's tile in round `r` of the persistent schedule, -1 if none. Sections (causal: causal_tile's;
/// otherwise one of every tile) take s.section_rounds rounds of gridDim.x tiles each, one section after
/// the other, dealt snake-wise within each (forward in even rounds, backward in odd ones, so the CTA
/// that took a round's heaviest block takes the next round's lightest). Rounds restart at every section:
/// counted over all tiles, a round straddling two sections held the light end of one and the heavy
/// start of the next, and the snake then paired heavy with heavy (d 128 causal 2k-16k ran 5-15% below
/// one CTA per block that way).
FP_DEV int round_tile(const SharedStorage& s, int r) {
  const int g = (int)gridDim.x, x = (int)blockIdx.x;
  const int per_section = ld_volatile_shared(s.section_rounds);
  const int section = r / per_section, local = r - section * per_section;
  const int start = section * ld_volatile_shared(s.section_tiles);
  const int t = start + local * g + ((local & 1) ? g - 1 - x : x);
  const int end = start + ld_volatile_shared(s.section_tiles);
  const int tiles = ld_volatile_shared(s.tiles);
  return t < (end < tiles ? end : tiles) ? t : -1;
}

/// Rounds of the persistent schedule (s.rounds: every section's but the last, then the last's).
FP_DEV int rounds(const SharedStorage& s) {
  return ld_volatile_shared(s.rounds);
}

}  // namespace flashport::cuda::hopper

/// Grid (query blocks, hq, batch), or (SM count) with FP_PERSISTENT; threads_for(BLOCK_M) threads,
/// smem_bytes(d, tile) of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(flashport::cuda::hopper::kCtaThreads, 1)
    flashport_attn_fwd_sm90(const __grid_constant__ flashport::cuda::hopper::FwdSm90Params prm,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_q,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_k,
                            const __grid_constant__ flashport::cuda::hopper::TmaDesc tma_v) {
  using namespace flashport::cuda;
  using namespace flashport::cuda::hopper;
  order_after_prior_grids();
  const flashport::AttnProblem& p = prm.p;
  Block blk;
#if !FP_PERSISTENT
  if (!make_block<true>(p, blk, (int)gridDim.x - 1 - (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z))
    return;  // query block past this sequence's end
  if (blk.n_max <= blk.n_min) {
    store_empty(p, blk, (int)threadIdx.x, kCtaThreads);
    return;
  }
#endif
  unsigned char* smem_raw = dynamic_smem<unsigned char>();
  const u32 misalign = smem_addr(smem_raw) & 1023u;
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - misalign) & 1023u));
  const int warpgroup = __shfl_sync(kFullMask, (int)threadIdx.x / 128, 0);
  if (threadIdx.x == 0) {
    init_barriers(s, paged_gather(prm) ? 128u : 1u);
    s.m_blocks = (int)ceil_div(p.sq, kTileM);
    s.tiles = (int)(ceil_div(p.sq, kTileM) * p.hq * p.batch);  // the host keeps it below 2^30
    const bool triangular = p.window_right == 0 && p.window_left < 0;
    s.section = prm.section;
    const int section_tiles = triangular ? prm.section * s.m_blocks : s.tiles;
    s.section_tiles = section_tiles > 0 ? section_tiles : 1;  // no tiles: no rounds, no division by 0
    s.section_rounds = (int)ceil_div(s.section_tiles, (int)gridDim.x);
    const int full = (s.tiles - 1) / s.section_tiles;  // sections before the last
    s.rounds = full * s.section_rounds + (int)ceil_div(s.tiles - full * s.section_tiles, (int)gridDim.x);
  }
  __syncthreads();
  Ring ring{0, 0u};
  u32 q_count = 0;
  if (warpgroup == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    // Decided after the split: a value kept across it is spilled (the pre-split budget is gone).
    const bool gather = paged_gather(prm);
#if !FP_PERSISTENT
    if constexpr (kGatherBuild) {
      if (gather) {
        if (threadIdx.x == 0) sm90::tma_prefetch_desc(tma_q);
        produce_gather(prm, s, blk, tma_q, (int)threadIdx.x);
      }
    }
#endif
    if (threadIdx.x == 0 && !gather) {
      sm90::tma_prefetch_desc(tma_q);
      sm90::tma_prefetch_desc(tma_k);
      sm90::tma_prefetch_desc(tma_v);
#if !FP_PERSISTENT
      produce(prm, s, blk, tma_q, tma_k, tma_v, ring, q_count);
#else
      for (int r = 0; r < rounds(s); ++r) {
        const int t = round_tile(s, r);
        if (t >= 0 && tile_block(p, s, t, blk) && blk.n_max > blk.n_min)
          produce(prm, s, blk, tma_q, tma_k, tma_v, ring, q_count);
      }
#endif
    }
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    if (kPingPong && warpgroup == 2) sm90::named_bar_arrive(kBarTurn + 0, 256);  // consumer 0 starts
#if !FP_PERSISTENT
    // The block again, after the register reallocation: kept from before it, its fields would be
    // allocated under the pre-split budget and spilled at BLOCK_M 192 (128 registers there).
    make_block<true>(p, blk, (int)gridDim.x - 1 - sm90::ctaid_x_volatile(), (int)blockIdx.y, (int)blockIdx.z);
    consume(p, s, blk, warpgroup - 1, ring, q_count, paged_gather(prm));
#else
    for (int r = 0; r < rounds(s); ++r) {
      const int t = round_tile(s, r);
      if (t < 0 || !tile_block(p, s, t, blk)) continue;
      if (blk.n_max <= blk.n_min) {
        store_empty(p, blk, sm90::tid_x_volatile() - 128, 128 * kConsumers);
        continue;
      }
      consume(p, s, blk, warpgroup - 1, ring, q_count, false);  // paged: one CTA per block
    }
#endif
  }
}
