// The Hopper forward kernel's contract with its host launcher: tile table, shared-memory budget and the
// kernel parameter block. Plain C++ (no standard or toolkit header): compiled by g++ and by NVRTC.
#pragma once

#include "core/problem.h"
#include "cuda/hopper/sm90_config.h"

namespace flashport::cuda::hopper {

/// Query rows per CTA: 64 per consumer warpgroup (the M of one wgmma), two consumers.
inline constexpr int kBlockM = 128;
/// The taller block of d 64: three consumer warpgroups of 160 registers (FA3's d 64 shape). At d 64 the
/// exponentials take as long as the two GEMMs (HOPPER_NOTES.md), and a third warpgroup gives the
/// schedulers another softmax to run while the tensor pipe works, where two leave it waiting.
inline constexpr int kBlockMTall = 192;

/// Consumer warpgroups of a block_m-row tile, and the CTA's threads: warpgroup 0 produces (TMA), the
/// others consume (wgmma + softmax).
FP_HD constexpr int consumers_for(int block_m) {
  return block_m / 64;
}
FP_HD constexpr int threads_for(int block_m) {
  return 128 * (1 + consumers_for(block_m));
}

/// One forward tile shape. Only these and the element type / head dim specialise the kernel.
struct Tile {
  int block_m, block_n, stages;
};

/// Whether the kernel builds `t`'s block_m at head dim d: 128 everywhere; 192 at d <= 64 with block_n
/// <= 128, where O (32), S (64) and P (32) fit the 160 registers a consumer of four warpgroups gets.
FP_HD constexpr bool block_m_fits(int d, Tile t) {
  return t.block_m == kBlockM || (t.block_m == kBlockMTall && d <= 64 && t.block_n <= 128);
}

/// Paged K/V gather (attn_fwd_sm90.cu, produce_gather): kGatherSlots key tiles' K and V row offsets (8 bytes
/// a row), written a tile ahead, read by every producer thread; kept by 16-bit tiles of d <= 128 and at most
/// 128 keys whose storage leaves room for them (the three-stage d 128 tile does not).
inline constexpr int kGatherSlots = 3;
FP_HD constexpr int gather_bytes(Tile t) {
  return kGatherSlots * t.block_n * 8;
}
/// The gather's records are 32-bit counts of 16-byte units from a kv head's base, kGatherNone marking a
/// zero-filled row: whether a pool's last row (`kv_rows` pages of `page_size` rows, strides in elements of
/// `elem_bytes`) lies below kGatherNone of them.
inline constexpr unsigned kGatherNone = 0xffffffffu;
FP_HD constexpr bool gather_reaches(long long kv_rows, long long page_size, long long batch_stride,
                                    long long row_stride, int elem_bytes) {
  return ((kv_rows - 1) * batch_stride + (page_size - 1) * row_stride) * elem_bytes / 16 <
         (long long)kGatherNone;
}

/// Bytes of the kernel's SharedStorage (attn_fwd_sm90.cu static_asserts equality) plus the 1 KB the
/// kernel may skip to align its base to the 1024-byte period of the 128B swizzle:
/// Q (block_m rows) + stages x (K, V) (block_n rows each), each row d/64 chunks of 128 bytes, then
/// 2 + 4 x stages mbarriers of 8 bytes and 24 bytes of schedule (six ints), the paged gather's
/// rows where gather_fits, the struct padded to 1024.
/// `separate_o`: persistent kernels with FP_PERSISTENT=2 stage O in a buffer of its own (block_m rows)
/// so that Q can be reloaded while the last P V and the epilogue run.
/// `elem_bytes` 1 (the FP8 kernel): Q and K rows of d bytes, V stored transposed (d rows of block_n
/// one-byte keys, fp8_tile_for). `extra`: the gather's rows, where smem_bytes keeps them.
FP_HD constexpr int smem_bytes_for(int d, Tile t, bool separate_o, int elem_bytes, int extra) {
  const int row_bytes = head_dim_chunks(d, elem_bytes) * chunk_row_bytes(d, elem_bytes);  // one Q or K row
  const int v_tile =
      elem_bytes == 1 ? d * head_dim_chunks(t.block_n, 1) * kChunkRowBytes : row_bytes * t.block_n;
  const int tiles =
      row_bytes * (separate_o ? 2 : 1) * t.block_m + t.stages * (row_bytes * t.block_n + v_tile);
  const int barriers = 8 * (5 + 4 * t.stages);
  return (tiles + barriers + extra + 1023) / 1024 * 1024 + 1024;
}

FP_HD constexpr bool gather_fits(int d, Tile t, bool separate_o = false, int elem_bytes = 2) {
  return elem_bytes == 2 && d <= 128 && t.block_n <= 128 &&
         smem_bytes_for(d, t, separate_o, elem_bytes, gather_bytes(t)) <= kSmemLimit;
}

FP_HD constexpr int smem_bytes(int d, Tile t, bool separate_o = false, int elem_bytes = 2) {
  return smem_bytes_for(d, t, separate_o, elem_bytes,
                        gather_fits(d, t, separate_o, elem_bytes) ? gather_bytes(t) : 0);
}

/// Whether the separate O staging buffer fits next to the tile (d <= 128 at the table's tiles).
FP_HD constexpr bool separate_o_fits(int d, Tile t) {
  return smem_bytes(d, t, true) <= kSmemLimit;
}

/// The tile table: one row per supported head dim. Registers per consumer thread are about
/// d/2 (O) + block_n/2 (S) + block_n/4 (P as bf16 pairs) + ~30 (addresses, row state), under the
/// 240 that setmaxnreg grants; shared memory must stay <= 227 KB.
///   d   tile        tiles: Q + stages x (K + V)  smem_bytes   registers (O + S + P)
///   64  128 x 192   16K + 2 x 48K  = 112K       ~116K        32 + 96 + 48 = 176
///   96  128 x 128   32K + 2 x 64K  = 160K       165888        64 + 64 + 32 = 160 (O padded to 128)
///   128 128 x 128   32K + 2 x 64K  = 160K       165888        64 + 64 + 32 = 160
///   192 128 x 112   48K + 2 x 84K  = 216K       223232        96 + 56 + 28 = 180
///   256 128 x 64    64K + 2 x 64K  = 192K       198656       128 + 32 + 16 = 176
/// d = 256 takes block_n 64: at 80 (FA3's choice, 231424 bytes) ptxas spills ~20 bytes in the main
/// loop (peak R233 of 240). Block_n 128 at d <= 128 keeps the first version spill-free with margin;
/// FA3 runs 128 x 176 at d = 128 (non-causal), a tuning step to measure. Returns {0, 0, 0} for
/// other head dims.
FP_HD constexpr Tile tile_for(int d) {
  switch (d) {
    case 64:  // 128 x 192: measured on the H200 (16k: 446 vs 432 TFLOPS non-causal, 437 vs 429 causal)
      return {kBlockM, 192, 2};
    case 96:
      return {kBlockM, 128, 2};
    case 128:
      return {kBlockM, 128, 2};
    case 192:
      return {kBlockM, 112, 2};
    case 256:
      return {kBlockM, 64, 2};
    default:
      return {0, 0, 0};
  }
}

/// The FP8 (e4m3) kernel's tile per head dim, {0, 0, 0} where it has none. wgmma takes fp8 operands
/// K-major only, so V enters shared memory transposed (V^T: d rows of block_n keys, written by the
/// launcher's transpose pass) and P is the register A operand as e4m3 (four per register): per
/// consumer thread O d/2 + S block_n/2 + P block_n/8 registers. d 128: 64 + 64 + 16, shared memory
/// 16K (Q) + 2 x (16K K + 16K V^T) = 80K. d 256 adds 64 registers of O (O + S + P = 208 of 240) and
/// 160K. Q and K rows are whole 128-byte chunks, at d 64 one 64-byte row in the 64-byte swizzle.
FP_HD constexpr Tile fp8_tile_for(int d) {
  return d == 64 || d == 128 || d == 256 ? Tile{kBlockM, 128, 2} : Tile{0, 0, 0};
}

/// The key (within its 32-key step) that slot `slot` of the FP8 kernel's V^T holds: the order of
/// convert_p's registers (softmax_sm90.cuh), where the thread holding keys 2t, 2t + 1, 8 + 2t, 9 + 2t of
/// a 16-key half places them in A's columns 4t..4t + 3. A bijection of [0, 32).
FP_HD constexpr int fp8_key_of_slot(int slot) {
  return (slot & 16) + 2 * ((slot >> 2) & 3) + (slot & 1) + ((slot & 2) ? 8 : 0);
}

/// Keys per CTA of the V^T pass (one 128-byte row segment per head-dim column) and the pass's parameters:
/// vt is (batches, hk, dv, keys) one-byte elements, slots past a sequence's guarded length zero up to its
/// next multiple of kFp8VtKeys (the forward's masked probabilities multiply them: no NaN may hide there).
/// Dense: one slab per sequence (batches = batch, keys = sk rounded up). Varlen: one slab (batches 1) of
/// fp8_vt_keys slots, sequence b from fp8_vt_start(b), so the scratch follows total_k, not batch x max.
inline constexpr int kFp8VtKeys = 128;
struct Fp8VtParams {
  AttnProblem p;
  unsigned char* vt;
  long long keys;
};

/// Sequence b's first V^T slot: 0 (dense), or for varlen kFp8VtKeys * (cu_seqlens_k[b] / kFp8VtKeys + b):
/// a multiple of kFp8VtKeys at or after the previous sequence's rounded-up end (floor((c + L) / K) + 1 >=
/// floor(c / K) + ceil(L / K)). Read only for sequences whose guarded length is positive (0 <= cu[b] <=
/// total_k).
FP_HD long long fp8_vt_start(const AttnProblem& p, long long b) {
  return p.cu_seqlens_k ? kFp8VtKeys * ((long long)p.cu_seqlens_k[b] / kFp8VtKeys + b) : 0;
}

/// Slots per V^T row: dense sk rounded up; varlen the last start's bound plus the longest sequence.
FP_HD long long fp8_vt_keys(const AttnProblem& p) {
  const long long rounded_sk = (p.sk + kFp8VtKeys - 1) / kFp8VtKeys * kFp8VtKeys;
  return p.cu_seqlens_k ? kFp8VtKeys * (p.total_k / kFp8VtKeys + p.batch) + rounded_sk : rounded_sk;
}

/// Kernel parameters besides the three tensor maps.
/// K/V bytes one section of the causal persistent schedule may keep in L2 (of the H200's 50 MB; FA3's
/// scheduler takes the same budget for its head swizzle).
inline constexpr long long kL2SectionBytes = 32ll << 20;

/// (sequence, head) pairs per section of the causal persistent schedule: the query heads of as many kv
/// heads as keep K and V (sk keys of d + dv columns of elem_bytes: 2, the FP8 kernel's 1) within
/// kL2SectionBytes, at least one kv head's, and at least as many as give each of the `ctas` persistent CTAs a
/// block (a section of fewer blocks than CTAs leaves the others idle through it: 4-8 MB budgets ran d 64/128
/// causal at 0.37-0.90x of 32 MB from 2k); whole GQA groups (`group` query heads per kv head); at most all
/// `pairs`, at least 1.
FP_HD constexpr int causal_section(long long sk, long long d, long long dv, long long group, long long pairs,
                                   long long ctas, long long m_blocks, long long elem_bytes = 2) {
  const long long kv_head_bytes = sk * (d + dv) * elem_bytes;
  const long long kv_heads = kv_head_bytes > 0 ? kL2SectionBytes / kv_head_bytes : 1;
  const long long fit = (kv_heads > 1 ? kv_heads : 1) * group;
  const long long per_round = m_blocks > 0 ? (ctas + m_blocks - 1) / m_blocks : 1;
  const long long round = (per_round + group - 1) / group * group;
  const long long heads = fit > round ? fit : round;
  return (int)(heads < pairs ? heads : pairs > 1 ? pairs : 1);
}

/// Query block and (sequence, head) pair (sequence * hq + head) of tile `t` of the causal persistent
/// schedule: pairs in sections of `section`, the last one possibly shorter; within a section the
/// blocks by key count, largest first (block m_blocks - 1 of every pair of the section, then
/// m_blocks - 2, ...). A bijection from [0, m_blocks * pairs) (tests/jit/test_hopper_schedule.cpp).
struct CausalTile {
  int m_block, pair;
};
FP_HD constexpr CausalTile causal_tile(int t, int m_blocks, int pairs, int section) {
  const int first = t / (section * m_blocks) * section;  // the section's first pair
  const int heads = pairs - first < section ? pairs - first : section;
  const int i = t - first * m_blocks;
  const int step = i / heads;
  return {m_blocks - 1 - step, first + (i - step * heads)};
}

struct FwdSm90Params {
  AttnProblem p;
  TmaDims dims_q, dims_k, dims_v;
  int section;  // causal_section() of the problem: pairs per section of the causal persistent schedule
  int gather;  // 1: paged K/V through the producer warpgroup's cp.async gather (hopper_fwd.cpp, gather_pages)
};

}  // namespace flashport::cuda::hopper
