// The tile table of the portable (sm_80+, mma.sync) forward kernel: (BLOCK_M, BLOCK_N, warps, stages) per
// (arch, head dim).
#pragma once

#include "backends/cuda/arch.hpp"

namespace flashport::cuda {

/// One forward kernel shape. block_m = 16 * warps (each warp owns 16 query rows). stages = number of
/// K and V shared-memory buffers (1: loads interleaved with compute in single buffers, as FA2).
/// decode: the FP_DECODE variant (attn_fwd.cuh): block_m = 16 rows shared by all warps, each warp with
/// its own `stages` K/V buffers of block_n keys. min_blocks: the CTAs per SM the kernel is compiled for
/// (its __launch_bounds__, so the register cap leaves room for them). bulk (decode, sm_90+): K/V rows
/// copied by one cp.async.bulk per row onto per-warp mbarriers instead of 16-byte cp.async chunks.
struct FwdTile {
  int block_m, block_n, warps, stages;
  bool decode = false;
  int min_blocks = 1;
  bool bulk = false;
  /// Decode split grids merged inside a thread-block cluster (FP_CLUSTER, sm_90+; fwd_geometry decides).
  bool cluster = false;
  bool operator==(const FwdTile&) const = default;
};

/// The head-dim bucket a problem compiles for: max(d, dv) rounded up to a multiple of 32 (<= 256).
constexpr int head_dim_bucket(long long d, long long dv) {
  const long long m = d > dv ? d : dv;
  return (int)((m + 31) / 32 * 32);
}

/// Shared memory of one forward CTA: Q (block_m rows) plus stages x (K, V) (block_n rows each), rows of
/// (bucket + 8) 2-byte elements (the pad staggers ldmatrix rows across banks). Must equal kSmemBytes
/// in src/kernels/cuda/attn_fwd.cuh.
/// The bulk decode variant adds its mbarriers after the rings: one per (warp, stage, K or V).
constexpr int fwd_smem_bytes(const FwdTile& t, int bucket) {
  return (t.block_m + 2 * (t.decode ? t.warps : 1) * t.stages * t.block_n) * (bucket + 8) * 2 +
         (t.bulk ? 8 * 2 * t.warps * t.stages : 0);
}

/// Register budget: 8-warp CTAs, <= 255 registers per thread; ptxas (NVRTC, sm_80 and sm_90a) reports
/// about 155 at d32, 170-180 at d64, 220 at d128, 236-244 at d160..d256, no spills. Per thread the
/// accumulators take bucket/2 (O) + block_n/2 (S) registers; block_n shrinks as the head dim grows so
/// the rest (addresses, softmax state, fragments in flight) fits beside them. Each row past d96 has a
/// double-buffered tile and a single-buffered one: the first where it fits the arch's shared memory
/// (163 KB on sm_80/87, 227 KB on sm_90/100), else the second (99 KB on sm_86/89/120).
constexpr FwdTile fwd_tile(int arch, int bucket) {
  const auto pick = [&](FwdTile big, FwdTile small) {
    return fwd_smem_bytes(big, bucket) <= limits(arch).smem_per_block ? big : small;
  };
  if (bucket <= 64) return {128, 64, 8, 2};  // 31 KB (d32) / 55 KB (d64): two CTAs per SM fit
  if (bucket <= 96) return {128, 64, 8, 2};  // 80 KB; O 48 + S 32 registers
  if (bucket <= 128)                         // O 64 + S 32 registers
    return pick({128, 64, 8, 2},             // 104 KB
                {128, 64, 8, 1});            // 70 KB
  if (bucket <= 160)
    return pick({128, 64, 8, 2},   // 129 KB; O 80 + S 32 registers
                {128, 64, 8, 1});  // 86 KB
  if (bucket <= 224)               // O 96..112 + S 16 registers (block_n 64: 255 at d192)
    return pick({128, 32, 8, 2},   // 102 KB (d192) / 119 KB (d224)
                {128, 32, 8, 1});  // 77 KB / 89 KB
  return pick({128, 32, 8, 2},     // 135 KB; O 128 + S 16 registers
              {64, 32, 4, 1});     // 68 KB: 128 query rows would need 101 KB
}

/// How many decode CTAs of `t` one SM holds at once, for the split heuristic's slot count: by shared memory
/// and by registers, counting the most a thread may take under the kernel's __launch_bounds__(threads,
/// min_blocks) (65536 / (threads * min_blocks) rounded down to 8, at most 255; ptxas reports 120-168 at
/// twelve warps, so one CTA).
constexpr int decode_ctas_per_sm(int arch, const FwdTile& t, int bucket) {
  const int threads = 32 * t.warps;
  const int per_sm = 65536 / (threads * t.min_blocks);
  const int reg_cap = (per_sm / 8 * 8) < 255 ? per_sm / 8 * 8 : 255;
  // An SM's shared memory is the block opt-in limit plus 1 KB, and every resident block reserves 1 KB.
  const int by_regs = 65536 / (threads * reg_cap),
            by_smem = (limits(arch).smem_per_block + 1024) / (fwd_smem_bytes(t, bucket) + 1024);
  const int n = by_regs < by_smem ? by_regs : by_smem;
  return n > 1 ? n : 1;
}

/// The decode variant's shape for `mode` (FLASHPORT_DECODE). 0 or 1, the default: sixteen rows and the
/// most warps of 16-key tiles that fit, two K/V buffers per warp: twelve (208 KB at d 128 on sm_90), else
/// eight (143 KB at d 128), up to d 128; past it, or where neither fits, the four-warp shape of mode 4.
/// The decode plateau is per-warp issue, not bytes in flight: on the H200 (docs/PERF.md, "Decode") four
/// warps of 32-key tiles read 2.15 TB/s dense, eight warps 3.2 TB/s, eight with three stages (the bytes in
/// flight of twelve) 3.2 TB/s, twelve 3.8 TB/s. 2 or 3: four warps of 32-key tiles with that stage count;
/// 4: four warps (two past d 128) of 32-key tiles, the deepest of 3 and 2 stages that fits (the shape
/// before, 213 KB at d 128); 5: eight warps of 16-key tiles. The twelve-warp kernel is capped at 168
/// registers (384 threads), which d 128 reaches without spilling.
/// The same twelve warps per SM as several CTAs, so one CTA's prologue and merge overlap another's
/// streaming (short contexts at large batch run a few rounds per CTA): 6, two CTAs of six warps; 7, three
/// of four (fwd_geometry takes mode 6 by default where the unsplit grid fills two per SM). 8: the twelve-
/// warp shape with bulk row copies (sm_90+, `FwdTile::bulk`); 9: mode 6 with them.
constexpr FwdTile decode_tile(int arch, int bucket, int mode = 0) {
  const auto fits = [&](const FwdTile& t) {
    const int per_sm = limits(arch).smem_per_block + 1024;  // every resident CTA reserves 1 KB
    return t.min_blocks * (fwd_smem_bytes(t, bucket) + 1024) <= per_sm;
  };
  const bool bulk = (mode == 8 || mode == 9) && arch >= 90;
  if (bucket <= 128 && (mode == 6 || mode == 7 || mode == 9)) {
    const FwdTile t{16, 16, mode == 7 ? 4 : 6, 2, true, mode == 7 ? 3 : 2, bulk};
    if (fits(t)) return t;
  }
  if (bucket <= 128 && (mode < 2 || mode >= 5)) {
    for (int warps : {mode == 5 ? 8 : 12, 8}) {
      const FwdTile t{16, 16, warps, 2, true, 1, bulk};
      if (fits(t)) return t;
    }
  }
  const int stages = mode == 2 || mode == 3 ? mode : 0;
  for (int warps : {bucket <= 128 ? 4 : 2, 2, 1})
    for (int s : {3, 2}) {
      const FwdTile t{16, 32, warps, s, true};
      if ((stages == 0 || stages == s) && fits(t)) return t;
    }
  return {16, 32, 1, 2, true};
}

}  // namespace flashport::cuda
