// FlashAttention-2 forward for sm_80+ (mma.sync m16n8k16): one CTA per (query block, head, batch
// [x split]), K/V streamed through shared memory with cp.async, online softmax in registers.
#include "cuda/attn_fwd.cuh"
#include "cuda/index_report.cuh"

namespace flashport::cuda::fwd {

/// Writes this warp's finished rows: O = acc_o * fac[r] to p.o (or the fp32 split workspace), and the
/// LSE. Block rows `row0 + ...` map to (query, head) through `rows`; only rows below `packed_len` exist.
/// `query`/`head`: this lane's two rows (g, g + 8) as ScoreCtx holds them, so the i64 division of
/// RowMap::query is not kept live from the prologue to here (at twelve decode warps it spilled).
/// `s_o` is this warp's 16 rows of s_q: only this warp ever read them, and every cp.async has landed
/// (the caller waited and synchronised), so they can stage the output for 16-byte stores.
FP_DEV void store_output(const FwdParams& prm, float (&acc_o)[kDTiles][4], const float (&fac)[2],
                         const float (&lse)[2], u16* s_o, i64 b, const attn::RowMap& rows,
                         const int (&query)[2], const int (&head)[2], int row0, i64 packed_len, int split) {
  const AttnProblem& p = prm.p;
  const int lane = lane_id(), g = lane >> 2, t4 = lane & 3;
  if (prm.num_splits > 1) {
    // Partial results: fp32 (split, b, h, i, c) and (split, b, h, i); dense queries only.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int local = row0 + g + 8 * r;
      if (rows.m0 + local >= packed_len) continue;
      const i64 base = ((split * p.batch + b) * p.hq + head[r]) * p.sq + query[r];
      float* o = prm.o_partial + base * p.dv;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 8 + 2 * t4;
        if (col < p.dv) o[col] = acc_o[dt][2 * r] * fac[r], o[col + 1] = acc_o[dt][2 * r + 1] * fac[r];
      }
      if (t4 == 0) prm.lse_partial[base] = lse[r];
    }
    return;
  }
  if (p.lse && t4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int local = row0 + g + 8 * r;
      if (rows.m0 + local < packed_len) p.lse[lse_offset(p, b, head[r], query[r])] = lse[r];
    }
  }
  if (p.out_type != Elem::kElemType) {  // other output dtypes (fp8 inputs): element stores
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int local = row0 + g + 8 * r;
      if (rows.m0 + local >= packed_len) continue;
      const i64 off = q_offset(p, p.o, b, query[r], head[r]);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 8 + 2 * t4;
        if (col >= p.dv) continue;
        store_as(p.o.ptr, p.out_type, off + col, acc_o[dt][2 * r] * fac[r]);
        store_as(p.o.ptr, p.out_type, off + col + 1, acc_o[dt][2 * r + 1] * fac[r]);
      }
    }
    return;
  }
  // Stage (16, kHeadDim) in smem: lane (g, t4) writes 4 bytes at row g (+8), column dt * 8 + 2 t4;
  // the kPitch row stride (16 or 80 bytes mod 128) puts the 32 lanes on 32 distinct banks.
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const u32 v = Elem::pack(acc_o[dt][2 * r] * fac[r], acc_o[dt][2 * r + 1] * fac[r]);
      *reinterpret_cast<u32*>(s_o + (g + 8 * r) * kPitch + dt * 8 + 2 * t4) = v;
    }
  }
  __syncwarp();
  const bool vec = prm.vec & kVecO;
  u16* g_o = static_cast<u16*>(p.o.ptr);
#pragma unroll
  for (int c = lane; c < 16 * kChunks; c += 32) {
    const int row = c / kChunks, ch = c % kChunks;
    const int local = row0 + row;
    if (rows.m0 + local >= packed_len || ch * 8 >= p.dv) continue;
    const U32x4 v = ld_shared_16(smem_addr(s_o + row * kPitch + ch * 8));
    u16* dst = g_o + q_offset(p, p.o, b, rows.query(local), rows.head(local)) + ch * 8;
    if (vec) {
      st_global_16(dst, v);
    } else {
      const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[2 * e] = (u16)(w[e] & 0xffffu), dst[2 * e + 1] = (u16)(w[e] >> 16);
    }
  }
}

#if FP_CLUSTER
/// The split merge of a cluster launch (kCluster): CTA rank s of the cluster streamed split s and left
/// its CTA-wide (m, l, O) in slot 0 of its merge scratch `s_merge` (item i of lane l at float 32 i + l:
/// m[2], l[2], O[kDTiles][4], in fragment order). Every CTA finishes some head-dim tiles of the rows from
/// all ranks' slots, read over distributed shared memory: tile dt belongs to rank dt % C and, within it,
/// to warp dt / C (each warp at most kDTiles / (C kWarps) + 1 tiles); rank 0's warp 0 owns tile 0 and
/// writes the LSE. Each owner folds the row states as the CTA merge does (2^(m_s - common base)) and
/// stores O / l (with the output scale) in the output dtype; nothing goes through global scratch. The
/// second cluster barrier keeps every CTA's shared memory alive until all peers have read it.
FP_DEV void cluster_finish(const FwdParams& prm, const float* s_merge, i64 b, i64 hk,
                           const attn::RowMap& rows, const int (&query)[2], const int (&head)[2],
                           i64 packed_len) {
  constexpr int kMaxRanks = 8;  // the portable cluster size: fwd_geometry launches at most this many splits
  const AttnProblem& p = prm.p;
  const int warp = warp_id(), lane = lane_id(), g = lane >> 2, t4 = lane & 3;
  const int ranks = (int)sm90::cluster_size(), rank = (int)sm90::cluster_rank();
  sm90::cluster_sync();  // every rank's slot 0 is written (release / acquire at cluster scope)
  const int dt0 = rank + ranks * warp;
  if (dt0 < kDTiles) {  // warp-uniform: this warp owns tiles dt0, dt0 + ranks * kWarps, ...
    const u32 mine = smem_addr(s_merge + lane);
    u32 slot[kMaxRanks];
    float m_s[kMaxRanks][2], l_s[kMaxRanks][2];
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      if (s >= ranks) break;
      slot[s] = sm90::peer_addr(mine, (u32)s);
#pragma unroll
      for (int r = 0; r < 2; ++r)
        m_s[s][r] = sm90::ld_cluster_f32(slot[s] + 4 * 32 * r),
        l_s[s][r] = sm90::ld_cluster_f32(slot[s] + 4 * 32 * (2 + r));
    }
    attn::RowState<Rows::kRows> st;
    float scale[kMaxRanks][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = kNegInf;
#pragma unroll
      for (int s = 0; s < kMaxRanks; ++s)
        if (s < ranks) mx = fmaxf(mx, m_s[s][r]);
      const float ref = sem::softmax_base(mx);  // every split empty: 2^(-inf - 0) = 0, no NaN
      float l = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxRanks; ++s)
        if (s < ranks) scale[s][r] = fast_exp2(m_s[s][r] - ref), l += l_s[s][r] * scale[s][r];
      st.m[r] = mx, st.l[r] = l;
    }
    float fac[2], lse[2];  // finish_rows sums l over the row's four lanes: the whole warp is here
    attn::finish_rows<Rows>(st, attn::output_scale(p, b, hk, p.dropout_p > 0.0f), fac, lse);
    bool row_in[2];
    i64 o_off[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_in[r] = rows.m0 + g + 8 * r < packed_len;
      o_off[r] = row_in[r] ? q_offset(p, p.o, b, query[r], head[r]) : 0;
    }
    for (int dt = dt0; dt < kDTiles; dt += ranks * kWarps) {
      // Every rank's values are requested before the first is used: the loads are in order, so a use
      // between them would wait one cluster round trip per rank.
      float o_s[kMaxRanks][4];
#pragma unroll
      for (int s = 0; s < kMaxRanks; ++s) {
        if (s >= ranks) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) o_s[s][e] = sm90::ld_cluster_f32(slot[s] + 4 * 32 * (4 + 4 * dt + e));
      }
      float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int s = 0; s < kMaxRanks; ++s) {
        if (s >= ranks) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] += o_s[s][e] * scale[s][e >> 1];
      }
      const int col = dt * 8 + 2 * t4;
      if (col >= p.dv) continue;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (row_in[r]) {
          store_as(p.o.ptr, p.out_type, o_off[r] + col, o[2 * r] * fac[r]);
          store_as(p.o.ptr, p.out_type, o_off[r] + col + 1, o[2 * r + 1] * fac[r]);
        }
    }
    if (dt0 == 0 && p.lse && t4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (row_in[r]) p.lse[lse_offset(p, b, head[r], query[r])] = lse[r];
    }
  }
  sm90::cluster_sync();  // no CTA leaves (its shared memory with it) before every peer has read it
}
#endif

}  // namespace flashport::cuda::fwd

using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::fwd;

/// Grid: x = query blocks (reversed, so the costliest causal blocks start first), y = query heads (kv
/// heads when packing GQA), z = batch * num_splits. Block: kThreads. Dynamic smem: kSmemBytes.
extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    attn_fwd(const __grid_constant__ FwdParams prm) {
  order_after_prior_grids();
  const AttnProblem& p = prm.p;
  u16* s_q = dynamic_smem<u16>();                 // (kBlockM, kPitch)
  u16* s_k = s_q + kSmemQ;                        // kKvRings x kStages x (kBlockN, kPitch)
  u16* s_v = s_k + kKvRings * kStages * kSmemKV;  // kKvRings x kStages x (kBlockN, kPitch)

  // A cluster launch (kCluster) puts the splits on x: one query block (decode), batch on z.
  const i64 m_block = kCluster ? 0 : (i64)gridDim.x - 1 - block_x();
  const i64 b = prm.batch_offset + (kCluster ? block_z() : block_z() / prm.num_splits);
  const int split = kCluster ? (int)block_x() : (int)(block_z() % prm.num_splits);
  const i64 group = prm.pack_gqa;
  const i64 hk = group > 1 ? block_y() : kv_head(p, block_y());
  const attn::RowMap rows = attn::row_map(m_block, block_y(), group, kBlockM);
  const attn::FwdBlock blk = attn::fwd_block(p, b, rows, kBlockM);
  const i64 packed_len = blk.packed_len;
  if (rows.m0 >= packed_len) return;  // whole CTA: no barrier has been reached yet

  // Key tiles this CTA visits (its split's share, the AMD rule too).
  const sem::Tiles<i64> mine = attn::block_tiles(p, blk, kBlockN, split, prm.num_splits);
  const i64 tile_begin = mine.begin, tile_end = mine.end;
  const int n_tiles = (int)(tile_end - tile_begin);

  const int warp = warp_id(), lane = lane_id();
  const int warp_row0 = kDecode ? 0 : 16 * warp;  // this warp's first block row
  const int lane_rows[2] = {warp_row0 + (lane >> 2), warp_row0 + (lane >> 2) + 8};
  const ScoreCtx ctx = attn::score_rows(p, blk, b, hk, rows, lane_rows);

  // Tile loaders (every thread takes a share of the 16-byte chunks; rows outside the sequence and
  // columns beyond d / dv are zero-filled so padded rows and columns contribute exact zeros).
  const bool vec_q = prm.vec & kVecQ, vec_k = prm.vec & kVecK, vec_v = prm.vec & kVecV;
  const TileDecode dec = tile_decode(p);  // fp8: the format's decode; else empty
  auto load_q = [&] {
    load_tile<kBlockM>(
        s_q, p.q.ptr, p.d, vec_q,
        [&](int r) {
          return rows.m0 + r < packed_len ? q_offset(p, p.q, b, rows.query(r), rows.head(r)) : (i64)-1;
        },
        dec);
  };
  // Key rows through the shared addressing helper; without a block table it is affine in the key
  // index, so one base per operand (instead of a full k_offset per row) keeps the loaders light.
  const bool paged = p.block_table != nullptr;
  const i64 k_base = paged || blk.len_k == 0 ? 0 : k_offset(p, p.k, b, 0, hk);
  const i64 v_base = paged || blk.len_k == 0 ? 0 : k_offset(p, p.v, b, 0, hk);
  auto kv_offset = [&](const Operand& t, i64 base, i64 j) {  // base < 0: a cache row out of range
    return paged ? k_offset(p, t, b, j, hk) : base < 0 ? (i64)-1 : base + j * t.row_stride;
  };
  auto load_k = [&](int t) {  // tile index t relative to tile_begin, into buffer t % kStages
    const i64 j0 = (tile_begin + t) * kBlockN;
    load_tile<kBlockN>(
        s_k + (t % kStages) * kSmemKV, p.k.ptr, p.d, vec_k,
        [&](int r) { return j0 + r < blk.len_k ? kv_offset(p.k, k_base, j0 + r) : (i64)-1; }, dec);
  };
  auto load_v = [&](int t) {
    const i64 j0 = (tile_begin + t) * kBlockN;
    load_tile<kBlockN>(
        s_v + (t % kStages) * kSmemKV, p.v.ptr, p.dv, vec_v,
        [&](int r) { return j0 + r < blk.len_k ? kv_offset(p.v, v_base, j0 + r) : (i64)-1; }, dec);
  };

  // ldmatrix row addresses of this lane (see common/mma.cuh for the fragment layouts):
  //  Q (A operand, x4): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) of the warp's 16 rows.
  //  K (B operand, x4): keys 0-7 / 8-15 of an n16 pair x k-halves: {b0, b1} of n-tile 2np, 2np+1.
  //  V (B operand, x4.trans): keys 0-7 / 8-15 x channels 0-7 / 8-15: {b0, b1} of two n8 tiles.
  //  The decode variant reads K/V from this warp's own ring.
  u16* const s_k_ring = s_k + (kDecode ? warp * kStages * kSmemKV : 0);
  u16* const s_v_ring = s_v + (kDecode ? warp * kStages * kSmemKV : 0);
  const u32 q_lane = smem_addr(s_q + (warp_row0 + (lane & 15)) * kPitch + (lane >> 4) * 8);
  const u32 k_lane0 =
      smem_addr(s_k_ring + ((lane & 7) + ((lane >> 4) << 3)) * kPitch + ((lane >> 3) & 1) * 8);
  const u32 v_lane0 =
      smem_addr(s_v_ring + ((lane & 7) + (((lane >> 3) & 1) << 3)) * kPitch + (lane >> 4) * 8);

  float acc_o[kDTiles][4];  // (16, kHeadDim) per warp
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) acc_o[dt][0] = acc_o[dt][1] = acc_o[dt][2] = acc_o[dt][3] = 0.0f;
  attn::RowState<Rows::kRows> st = attn::row_state_init<Rows::kRows>();
  float acc_s[kNTiles][4];  // (16, kBlockN) per warp

  const sem::KeyRange unmasked = attn::unmasked_keys(p, blk);
  if constexpr (kDecode) {
    // This warp's key tiles are k = 0, 1, ... -> tile warp + k * kWarps, in ring buffer k % kStages;
    // lanes copy them alone, so only __syncwarp orders the ring. cp.async groups: [Q] (the whole
    // CTA's), then per warp [K0] [V0] [K1] [V1] ...
    const int my_tiles = n_tiles > warp ? (n_tiles - warp + kWarps - 1) / kWarps : 0;
    auto j0_of = [&](int k) { return (tile_begin + warp + (i64)k * kWarps) * kBlockN; };
    // Lane r addresses key row j0 + r once (a paged cache's table read among them, all 32 at once) and
    // the copy loop takes each row's offset by shuffle, instead of a dependent table read per chunk.
    static_assert(!kDecode || kBlockN <= 32, "at most one key row per lane");
    // ... and no lane may leave load_tile's loop early: the shuffles in its row_offset need all 32.
    static_assert(!kDecode || kBlockN * kChunks % 32 == 0, "whole warp passes over a ring tile");
    // Tiles whose 16 rows are affine in the key index (dense caches; pages holding whole tiles, no left
    // pad) take the unrolled copy; the rest (small pages, rows not 16-byte aligned, fp8) the generic one.
    // Up to 16 copies per lane and tile (d <= 128): more, unrolled, spill (d 224's 28 at 255 registers).
    constexpr bool kAffineCopy = !kFp8 && kBlockN * kChunks / 32 <= 16;
    const bool affine =
        kAffineCopy && vec_k && vec_v && (!paged || (p.page_size % kBlockN == 0 && !p.leftpad_k));
    // A paged cache's page of each of this warp's next 32 tiles, one per lane, read in one go (a table
    // read per tile before its copies could be issued put a dependent load in every tile's path).
    int lane_page = -1, page_k0 = -32;
    auto page_of = [&](int k) {  // warp-uniform k, increasing: the window moves in steps of 32 tiles
      if (k >= page_k0 + 32) {
        page_k0 = k;
        const int mine = k + lane;
        lane_page =
            mine < my_tiles ? p.block_table[b * p.block_table_stride + j0_of(mine) / p.page_size] : -1;
      }
      return (int)shfl_i64(lane_page, k - page_k0);
    };
    auto load_ring = [&](u16* ring, const Operand& t, i64 base, i64 ncols, bool vec, int k, int page) {
      if (kAffineCopy && affine) {
        const i64 j0 = j0_of(k), left = blk.len_k - j0;
        const i64 off0 =
            !paged ? kv_offset(t, base, j0) : page_row_offset(p, t, page, j0, hk);  // no left pad
        load_tile_affine<kBlockN>(ring + (k % kStages) * kSmemKV, static_cast<const u16*>(t.ptr), off0,
                                  t.row_stride, left < kBlockN ? (int)left : kBlockN, (int)ncols, lane);
        return;
      }
      const i64 j = j0_of(k) + lane;
      const i64 my_off = j < blk.len_k ? kv_offset(t, base, j) : (i64)-1;
      load_tile<kBlockN, 32>(
          ring + (k % kStages) * kSmemKV, t.ptr, ncols, vec, [&](int r) { return shfl_i64(my_off, r); }, dec,
          lane);
    };
#if FP_BULK
    // Bulk rows where the copy is affine (the same tiles load_tile_affine takes): this warp's barriers
    // are K's then V's per stage, after the rings. Lane r copies K row r of a tile, lane 16 + r V row r.
    const bool bulk = affine;
    const u32 bars = smem_addr(s_v + kKvRings * kStages * kSmemKV) + warp * 2 * kStages * 8;
    const bool lane_v = lane >= 16;
    const int lane_row = lane & 15;
    const Operand& lane_op = lane_v ? p.v : p.k;
    const i64 lane_base = lane_v ? v_base : k_base;
    const int lane_cols = (int)(lane_v ? p.dv : p.d);
    u16* const lane_ring = lane_v ? s_v_ring : s_k_ring;
    auto zero_row = [&](u16* row, int c0, int c1) {  // columns [c0, c1), multiples of 8
      for (int c = c0; c < c1; c += 8) st_shared_16(smem_addr(row + c), U32x4{0, 0, 0, 0});
    };
    if (bulk) {
      if (lane == 0)
        for (int i = 0; i < 2 * kStages; ++i) sm90::mbar_init(bars + 8 * i, 1);
      // A bulk copy writes a row's d (or dv) columns; the rest must be exact zeros (Q's are), once.
      for (int s = 0; s < kStages; ++s)
        zero_row(lane_ring + s * kSmemKV + lane_row * kPitch, lane_cols, kHeadDim);
      sm90::fence_barrier_init();
      sm90::fence_proxy_async();  // the zeros, before any bulk copy into these buffers
      __syncwarp();
    }
    // Tile k's rows into buffer k % kStages. The barrier is armed (its rows' bytes) before any of its
    // copies is issued; rows past the keys (the last tile) or of a table entry outside the pool are
    // zero-filled as load_tile_affine does, by the lane that would copy them.
    auto load_pair_bulk = [&](int k) {
      if (k >= my_tiles) return;
      const int page = paged ? page_of(k) : -1, buf = k % kStages;
      const i64 j0 = j0_of(k), left = blk.len_k - j0;
      const i64 off0 = !paged ? kv_offset(lane_op, lane_base, j0) : page_row_offset(p, lane_op, page, j0, hk);
      const int n_rows = off0 < 0 ? 0 : left < kBlockN ? (int)left : kBlockN;
      const u32 bar = bars + ((lane_v ? kStages : 0) + buf) * 8;
      u16* const row = lane_ring + buf * kSmemKV + lane_row * kPitch;
      if (lane_row == 0) sm90::mbar_arrive_expect_tx(bar, (u32)(n_rows * lane_cols * 2));
      __syncwarp();
      if (lane_row < n_rows) {
        sm90::bulk_load(smem_addr(row),
                        static_cast<const u16*>(lane_op.ptr) + off0 + lane_row * lane_op.row_stride,
                        (u32)(lane_cols * 2), bar);
      } else {
        zero_row(row, 0, lane_cols);
        sm90::fence_proxy_async();  // before a later bulk copy into this row (a table entry out of the pool)
      }
    };
    auto wait_bulk = [&](int k, bool v) {
      sm90::mbar_wait(bars + ((v ? kStages : 0) + k % kStages) * 8, (k / kStages) & 1);
    };
#else
    constexpr bool bulk = false;
    auto load_pair_bulk = [](int) {};
    auto wait_bulk = [](int, bool) {};
#endif
    auto load_pair = [&](int k) {
      if (bulk) return load_pair_bulk(k);
      const int page = kAffineCopy && affine && paged && k < my_tiles ? page_of(k) : -1;
      if (k < my_tiles) load_ring(s_k_ring, p.k, k_base, p.d, vec_k, k, page);
      cp_async_commit();
      if (k < my_tiles) load_ring(s_v_ring, p.v, v_base, p.dv, vec_v, k, page);
      cp_async_commit();
    };
    load_q();
    cp_async_commit();
    for (int k = 0; k + 1 < kStages; ++k) load_pair(k);
    // Sequence b's index rules and block-table entries, checked here instead of by an index_check.cu
    // launch before this kernel (one launch fewer per decode step), by the last warp (the fewest tiles) of
    // each of the sequence's CTAs of head 0 while the copies above are in flight. The kernel clamps every
    // index either way.
    if (prm.fault_record && block_y() == 0 && m_block == 0 && warp == kWarps - 1)
      report_decode_faults(prm.fault_record, prm.fault_call, p, b, split, prm.num_splits, lane);
    if (bulk)
      cp_async_wait_all();  // Q is the only cp.async group
    else
      cp_async_wait<2 * (kStages - 1)>();  // this thread's share of Q has landed,
    __syncthreads();                       // and everyone's
    for (int k = 0; k < my_tiles; ++k) {
      const int buf = k % kStages;
      const i64 j0 = j0_of(k);
      // The next pair is issued before waiting for this one, so kStages pairs are in flight during
      // the wait (a streaming warp's bytes in flight are what its bandwidth is made of).
      __syncwarp();                // every lane is done with buffer (k - 1) % kStages (PV(k - 1)),
      load_pair(k + kStages - 1);  // which takes pair k + kStages - 1
      if (bulk)
        wait_bulk(k, false);
      else
        cp_async_wait<2 * kStages - 1>();  // K(k) has landed (after it: V(k), pairs k + 1 .. k + kStages - 1)
      __syncwarp();
      compute_qk(acc_s, q_lane, k_lane0 + buf * kSmemKV * 2, p.d);
      attn::transform_scores<Rows, kBlockN>(acc_s, p, ctx, j0, !sem::contains(unmasked, j0, j0 + kBlockN));
      attn::online_softmax<Rows>(acc_s, acc_o, st);
      if (!kFp8 && p.dropout_p > 0.0f) apply_dropout(acc_s, p, ctx, j0, b);
      if (bulk)
        wait_bulk(k, true);
      else
        cp_async_wait<2 * kStages - 2>();  // V(k) has landed
      __syncwarp();
      compute_pv(acc_o, acc_s, v_lane0 + buf * kSmemKV * 2, p.dv);
    }
    // Merge: every warp leaves (m, l, O) in the K/V memory (fragment order, lane-minor: no bank
    // conflicts); then all warps fold them at once, rescaled to the rows' common max, each taking every
    // kWarps-th head-dim tile of O (the row sums l go to the last warp) into warp 0's slot, which warp 0
    // reads back to finish alone. Warp 0 folding the others one by one took kWarps - 1 dependent rounds
    // of 4 kDTiles + 4 values at the end of every CTA (a few % of a short decode call).
    constexpr int kItems = 4 + 4 * kDTiles;  // m[2], l[2], O[kDTiles][4]
    constexpr int kMergeFloats = kItems * 32;
    static_assert(!kDecode || kMergeFloats * kWarps * 4 <= 2 * kKvRings * kStages * kSmemKV * 2,
                  "merge scratch");
    float* s_merge = reinterpret_cast<float*>(s_k);
    cp_async_wait_all();
    __syncthreads();  // every ring has been read for the last time
    {
      float* mine = s_merge + warp * kMergeFloats + lane;
#pragma unroll
      for (int r = 0; r < 2; ++r) mine[32 * r] = st.m[r], mine[32 * (2 + r)] = st.l[r];
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[32 * (4 + 4 * dt + e)] = acc_o[dt][e];
    }
    __syncthreads();
    float scale[kWarps][2];  // 2^(m_w - common base) of this lane's two rows, per warp w
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = kNegInf;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_merge[w * kMergeFloats + 32 * r + lane]);
      st.m[r] = mx;
      const float ref = sem::softmax_base(mx);  // every warp empty: 2^(-inf - 0) = 0, no NaN
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        scale[w][r] = fast_exp2(s_merge[w * kMergeFloats + 32 * r + lane] - ref);
    }
    auto fold = [&](int item, int r) {  // item's value over all warps, into warp 0's slot
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += s_merge[w * kMergeFloats + 32 * item + lane] * scale[w][r];
      s_merge[32 * item + lane] = sum;  // only this warp reads or writes `item` here
    };
    for (int dt = warp; dt < kDTiles; dt += kWarps)
#pragma unroll
      for (int e = 0; e < 4; ++e) fold(4 + 4 * dt + e, e >> 1);
    if (warp == kWarps - 1) fold(2, 0), fold(3, 1);
    __syncthreads();
#if FP_CLUSTER
    if (warp == 0) s_merge[lane] = st.m[0], s_merge[32 + lane] = st.m[1];  // slot 0 complete: (m, l, O)
    return cluster_finish(prm, s_merge, b, hk, rows, ctx.row, ctx.head, packed_len);  // every warp
#endif
    if (warp > 0) return;  // no barrier follows
#pragma unroll
    for (int r = 0; r < 2; ++r) st.l[r] = s_merge[32 * (2 + r) + lane];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[dt][e] = s_merge[32 * (4 + 4 * dt + e) + lane];
  } else {
    // Pipeline. cp.async groups, in commit order: [Q + K0] [V0] [K1] [V1] ... With kStages >= 2 the
    // prologue has pairs 0 .. kStages-2 in flight and iteration t prefetches pair t + kStages - 1 into
    // the buffer of pair t - 1 (free: everyone passed this iteration's first barrier). With kStages == 1
    // V(t) is issued after the first barrier (everyone finished PV(t-1)) and K(t+1) after the second
    // (everyone finished QK(t)). Empty groups are committed so the wait counts stay uniform.
    load_q();
    if (n_tiles > 0) load_k(0);
    cp_async_commit();
    if constexpr (kStages >= 2) {
      if (n_tiles > 0) load_v(0);
      cp_async_commit();
#pragma unroll
      for (int s = 1; s + 1 < kStages; ++s) {
        if (s < n_tiles) load_k(s);
        cp_async_commit();
        if (s < n_tiles) load_v(s);
        cp_async_commit();
      }
    }

    // Warps whose 16 rows are all padding (short or decode blocks) only help load K/V: warp-uniform skip.
    const bool warp_has_rows = rows.m0 + 16 * warp < packed_len;
    for (int t = 0; t < n_tiles; ++t) {
      const int buf = t % kStages;
      const i64 j0 = (tile_begin + t) * kBlockN;
      // K(t) has landed (pending groups after it: V(t) and the later pairs).
      if constexpr (kStages >= 2)
        cp_async_wait<2 * kStages - 3>();
      else
        cp_async_wait<0>();
      __syncthreads();
      if constexpr (kStages >= 2) {
        const int nxt = t + kStages - 1;
        if (nxt < n_tiles) load_k(nxt);
        cp_async_commit();
        if (nxt < n_tiles) load_v(nxt);
        cp_async_commit();
      } else {
        load_v(t);
        cp_async_commit();
      }

      if (warp_has_rows) {
        compute_qk(acc_s, q_lane, k_lane0 + buf * kSmemKV * 2, p.d);
        const bool masked = !sem::contains(unmasked, j0, j0 + kBlockN);
        attn::transform_scores<Rows, kBlockN>(acc_s, p, ctx, j0, masked);
        attn::online_softmax<Rows>(acc_s, acc_o, st);
        if (!kFp8 && p.dropout_p > 0.0f) apply_dropout(acc_s, p, ctx, j0, b);  // fp8: refused by the host
      }

      // V(t) has landed (pending after it: the pairs after t).
      if constexpr (kStages >= 2)
        cp_async_wait<2 * (kStages - 1)>();
      else
        cp_async_wait<0>();
      __syncthreads();
      if constexpr (kStages == 1) {
        if (t + 1 < n_tiles) load_k(t + 1);
        cp_async_commit();
      }
      if (warp_has_rows) compute_pv(acc_o, acc_s, v_lane0 + buf * kSmemKV * 2, p.dv);
    }
    cp_async_wait_all();
    __syncthreads();  // s_q is reused for the output below; no cp.async may still target it
  }

  // Finalize: O / l (times the dropout rescale and the fp8 V descale); LSE = ln(2^m * l).
  float fac[2], lse[2];
  attn::finish_rows<Rows>(st, attn::output_scale(p, b, hk, p.dropout_p > 0.0f), fac, lse);
  store_output(prm, acc_o, fac, lse, s_q + warp_row0 * kPitch, b, rows, ctx.row, ctx.head, warp_row0,
               packed_len, split);
}
