// The per-arch limits (backends/cuda/arch.hpp) and every tile table against them, host only: each forward
// and backward tile of every (arch, head-dim bucket, dtype) fits its arch's shared memory.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/sm80/backward.hpp"
#include "backends/cuda/sm80/tiles.hpp"
#include "backends/cuda/sm90/hopper_bwd.hpp"
#include "backends/cuda/variants.hpp"
#include "kernels/cuda/bwd_params.cuh"
#include "kernels/cuda/hopper/bwd_sm90_config.h"
#include "kernels/cuda/hopper/fwd_sm90_config.h"

namespace flashport::cuda {
namespace {

constexpr int kArchs[] = {80, 86, 87, 89, 90, 100, 120};

TEST(ArchLimits, Table) {
  EXPECT_EQ(limits(80).smem_per_block, 163 * 1024);
  EXPECT_EQ(limits(87).smem_per_block, 163 * 1024);
  for (int arch : {86, 89, 120, 121}) EXPECT_EQ(limits(arch).smem_per_block, 99 * 1024) << arch;
  for (int arch : {90, 100, 103}) EXPECT_EQ(limits(arch).smem_per_block, 227 * 1024) << arch;
  // The Hopper kernels' own bound is sm_90's.
  EXPECT_EQ(limits(90).smem_per_block, hopper::kSmemLimit);
  for (int arch : kArchs) EXPECT_EQ(limits(arch).max_grid_yz, 65535) << arch;
}

TEST(ArchLimits, PortableTilesFit) {
  for (int arch : kArchs)
    for (int bucket : kHeadDimBuckets)
      for (int type : {kF16, kBF16}) {  // 2-byte elements either way: the sizes match
        const std::string where =
            "sm_" + std::to_string(arch) + " d" + std::to_string(bucket) + (type == kBF16 ? " bf16" : " f16");
        EXPECT_LE(fwd_smem_bytes(fwd_tile(arch, bucket), bucket), limits(arch).smem_per_block) << where;
        const BwdTile b = backward_tile(arch, bucket);
        // The stages the launcher picks: 2 only where they fit, so 1 must.
        EXPECT_LE(bwd_smem_bytes(b.block_m, b.block_n, bucket, 1), limits(arch).smem_per_block) << where;
      }
}

TEST(ArchLimits, DecodeShapesFitAndCountTheirCtasPerSm) {
  for (int arch : kArchs)
    for (int bucket : kHeadDimBuckets)
      for (int mode = 0; mode <= 9; ++mode) {
        const FwdTile t = decode_tile(arch, bucket, mode);
        const std::string where =
            "sm_" + std::to_string(arch) + " d" + std::to_string(bucket) + " mode " + std::to_string(mode);
        EXPECT_TRUE(t.decode) << where;
        EXPECT_LE(fwd_smem_bytes(t, bucket), limits(arch).smem_per_block) << where;
        const int ctas = decode_ctas_per_sm(arch, t, bucket);
        EXPECT_GE(ctas, 1) << where;
        // An SM holds the opt-in limit + 1 KB, of which every resident CTA reserves 1 KB.
        EXPECT_LE(ctas * (fwd_smem_bytes(t, bucket) + 1024), limits(arch).smem_per_block + 1024) << where;
        EXPECT_LE(ctas * 32 * t.warps * 128, 65536) << where << ": at least 128 registers per thread";
        EXPECT_GE(ctas, t.min_blocks) << where << ": the CTAs per SM it is compiled for are resident";
        EXPECT_TRUE(!t.bulk || (arch >= 90 && t.block_n == 16))
            << where << ": bulk rows need sm_90, 16-key tiles";
      }
  // The default on sm_90: twelve warps up to d 128 (one CTA per SM, by registers at d <= 96), two past it.
  for (int bucket : {32, 64, 96, 128}) {
    EXPECT_EQ(decode_tile(90, bucket).warps, 12) << bucket;
    EXPECT_EQ(decode_ctas_per_sm(90, decode_tile(90, bucket), bucket), 1) << bucket;
  }
  EXPECT_EQ(decode_tile(80, 128).warps, 8);  // twelve do not fit sm_80's 163 KB at d 128
  EXPECT_EQ(decode_tile(90, 256).warps, 2);
  EXPECT_EQ(decode_tile(90, 128, 4).warps, 4);
  EXPECT_EQ(decode_ctas_per_sm(90, decode_tile(90, 64, 4), 64), 2);  // four warps: 255 registers allow two
  // The twelve warps per SM as two CTAs of six (mode 6) or three of four (7), with bulk rows (8, 9) on sm_90.
  EXPECT_EQ(decode_tile(90, 128, 6).warps, 6);
  EXPECT_EQ(decode_ctas_per_sm(90, decode_tile(90, 128, 6), 128), 2);
  EXPECT_EQ(decode_ctas_per_sm(90, decode_tile(90, 128, 7), 128), 3);
  EXPECT_TRUE(decode_tile(90, 128, 8).bulk && decode_tile(90, 128, 9).bulk);
  EXPECT_EQ(decode_tile(90, 128, 8).warps, 12);
  EXPECT_FALSE(decode_tile(80, 128, 8).bulk);
  EXPECT_EQ(fwd_smem_bytes(decode_tile(90, 128, 8), 128),
            fwd_smem_bytes(decode_tile(90, 128), 128) + 8 * 2 * 12 * 2);
}

TEST(ArchLimits, Sm120GetsSmallForwardTiles) {
  // sm_120 has 99 KB per block: the 129 KB (d160) and 135 KB (d256) double-buffered tiles are not its.
  EXPECT_EQ(fwd_tile(120, 160).stages, 1);
  EXPECT_EQ(fwd_tile(120, 256).block_m, 64);
  EXPECT_EQ(fwd_tile(90, 256).stages, 2);
}

TEST(ArchLimits, HopperTilesFit) {
  for (int d : {64, 96, 128, 192, 256})
    EXPECT_LE(hopper::smem_bytes(d, hopper::tile_for(d)), limits(90).smem_per_block) << d;
  for (int d : {64, 96, 128, 256})
    EXPECT_LE(hopper_bwd::smem_bytes(d, hopper_bwd::tile_for(d)), limits(90).smem_per_block) << d;
}

/// The paged gather's row slots (attn_fwd_sm90.cu, produce_gather) ride along wherever they fit: the 16-bit
/// tiles of d <= 128 that paged prefill launches (128 x 128 on two stages, d 64's 192-row tile), never
/// the fp8 kernel, d 192 / 256 or a tile they would push past the limit (d 128 on three stages, 224 KB of
/// K/V alone). Where they ride, they add their bytes and the total still fits.
TEST(ArchLimits, HopperGatherRowsWhereTheyFit) {
  using hopper::Tile;
  const int limit = limits(90).smem_per_block;
  for (const auto& [d, t] : {std::pair{64, Tile{128, 128, 2}},
                             {64, Tile{192, 128, 2}},
                             {96, Tile{128, 128, 2}},
                             {128, Tile{128, 128, 2}},
                             {64, Tile{128, 128, 3}}}) {
    SCOPED_TRACE(testing::Message() << "d " << d << " tile " << t.block_m << "x" << t.block_n << "x"
                                    << t.stages);
    EXPECT_TRUE(hopper::gather_fits(d, t));
    EXPECT_GE(hopper::smem_bytes(d, t) - hopper::smem_bytes_for(d, t, false, 2, 0),
              hopper::gather_bytes(t) - 1023);
    EXPECT_LE(hopper::smem_bytes(d, t), limit);
  }
  EXPECT_FALSE(hopper::gather_fits(128, Tile{128, 128, 3}));  // over the limit with them
  EXPECT_LE(hopper::smem_bytes(128, Tile{128, 128, 3}), limit);
  EXPECT_FALSE(hopper::gather_fits(192, hopper::tile_for(192)));
  EXPECT_FALSE(hopper::gather_fits(256, hopper::tile_for(256)));
  EXPECT_FALSE(hopper::gather_fits(64, hopper::tile_for(64)));  // 192-key tiles: more rows than threads
  EXPECT_FALSE(hopper::gather_fits(128, Tile{128, 128, 2}, false, 1));  // fp8
}

/// The value of define `name` in `spec`, "(unset)" without it.
std::string define(const jit::KernelSpec& spec, const std::string& name) {
  for (const auto& [k, v] : spec.defines)
    if (k == name) return v;
  return "(unset)";
}

/// The Hopper backward's compiled variants: at d 64 128 queries per step (bulk dQ, serial, two stages)
/// where they run, else (vector-reduction dQ, deterministic mode) 64 on the pipelined loop on three
/// stages (softcap: the serial loop on them); the other head dims 64 queries, serial on two.
TEST(ArchLimits, HopperBwdTileWhereItFits) {
  int pipelined = 0, wide_steps = 0, dropout = 0, ordered = 0, row_major = 0;
  for (const jit::KernelSpec& spec : hopper_bwd::variants(90)) {
    const bool d64 = define(spec, "FP_HEADDIM") == "64";
    // softcap (2) and dropout (3): the serial loop
    const bool serial_stage = define(spec, "FP_BWD_GENERAL") == "2" || define(spec, "FP_BWD_GENERAL") == "3";
    const bool m128 = define(spec, "FP_BLOCK_M") == "128";
    EXPECT_TRUE(!m128 || (d64 && define(spec, "FP_DQ_MODE") == "1")) << spec.key();
    EXPECT_EQ(define(spec, "FP_BWD_PIPE"), d64 && !m128 && !serial_stage ? "1" : "0") << spec.key();
    if (define(spec, "FP_BWD_GENERAL") == "3") {
      ++dropout;
      EXPECT_FALSE(m128) << spec.key();
      EXPECT_TRUE(hopper_bwd::dropout_fits(std::stoi(define(spec, "FP_HEADDIM")),
                                           std::stoi(define(spec, "FP_DQ_MODE"))))
          << spec.key();
    }
    EXPECT_EQ(define(spec, "FP_STAGES"), d64 && !m128 ? "3" : "2") << spec.key();
    pipelined += define(spec, "FP_BWD_PIPE") == "1";
    wide_steps += m128;
    // A row-major dQ accumulator (batches of many short sequences): vector reductions, no order knob
    if (define(spec, "FP_BWD_DQ_ROWS") != "(unset)") {
      ++row_major;
      EXPECT_EQ(define(spec, "FP_BWD_DQ_ROWS"), "1") << spec.key();
      EXPECT_EQ(define(spec, "FP_DQ_MODE"), "0") << spec.key();
      EXPECT_EQ(define(spec, "FP_BWD_ORDER"), "(unset)") << spec.key();
      EXPECT_NE(define(spec, "FP_HEADDIM"), "96") << spec.key();
    }
    // FLASHPORT_HOPPER_BWD_ORDER=1: a second copy of every serial-loop variant of the narrow kernel
    if (define(spec, "FP_BWD_ORDER") != "(unset)") {
      ++ordered;
      EXPECT_EQ(define(spec, "FP_BWD_ORDER"), "1") << spec.key();
      EXPECT_EQ(define(spec, "FP_BWD_PIPE"), "0") << spec.key();
      EXPECT_LE(std::stoi(define(spec, "FP_HEADDIM")), 128) << spec.key();
    }
  }
  // {f16, bf16} x {dQ mode 0, deterministic bulk dQ, row-major dQ} x score stage {plain, ALiBi}
  EXPECT_EQ(pipelined, 12);
  EXPECT_EQ(wide_steps, 10);  // {f16, bf16} x score stage {plain, ALiBi, softcap}, all but softcap x order 1
  EXPECT_EQ(dropout, 24);     // {f16, bf16} x (d 64 and 256 x dQ modes {0, 1}, d 128 bulk dQ, d 192), d 64
                              // and 128's also in order 1, d 64, 192, 256 with a row-major dQ
  EXPECT_EQ(row_major, 30);   // {f16, bf16} x d {64, 128, 192, 256} x 4 score stages, but dropout at d 128
  // {f16, bf16} x (d 64: 128 queries x {plain, ALiBi}, 64 queries serial x {softcap, dropout} x
  // dQ modes {0, 1}; d 96 x {plain, ALiBi}; d 128 x {plain, ALiBi, softcap} x dQ modes {0, 1},
  // and dropout on bulk dQ)
  EXPECT_EQ(ordered, 2 * (2 + 4 + 2 + 7));
  // The table's d 64 tile is the 128-query one; deterministic mode and dQ mode 0 take 64 queries.
  EXPECT_EQ(hopper_bwd::tile_for(64).block_m, 128);
  EXPECT_EQ(hopper_bwd::tile_64_queries(64).block_m, 64);
  EXPECT_EQ(hopper_bwd::tile_64_queries(128).block_m, hopper_bwd::tile_for(128).block_m);
}

/// The narrow Hopper backward's timing-only ablations (FP_BWD_ABLATE, set through FLASHPORT_JIT_DEFINES;
/// docs/BWD_NOTES.md part 7) still compile at d 64 for both query tiles, all of them at once, without
/// spilling.
TEST(ArchLimits, HopperBwdAblationsCompile) {
  int compiled = 0;
  for (jit::KernelSpec spec : hopper_bwd::variants(90)) {
    if (define(spec, "FP_HEADDIM") != "64" || define(spec, "FP_BWD_GENERAL") != "0" ||
        define(spec, "FP_DQ_MODE") != "1" || define(spec, "FP_DTYPE") != "bf16")
      continue;
    spec.defines.push_back({"FP_BWD_ABLATE", "15"});
    const jit::CompileResult r = jit::compile(spec);
    EXPECT_EQ(r.spill_bytes, 0) << spec.key();
    ++compiled;
  }
  EXPECT_EQ(compiled, 3);  // 128 queries per step in both orders, deterministic mode's 64 (pipelined)
}

/// Every 128-query variant (d 64's table tile) compiles for every element type and score stage without
/// spilling (scores_to_grads pins its key index there).
TEST(ArchLimits, HopperBwd128QueriesCompile) {
  int compiled = 0;
  for (const jit::KernelSpec& spec : hopper_bwd::variants(90)) {
    if (define(spec, "FP_BLOCK_M") != "128") continue;
    const jit::CompileResult r = jit::compile(spec);
    EXPECT_EQ(r.spill_bytes, 0) << spec.key();
    ++compiled;
  }
  EXPECT_EQ(compiled, 10);  // {f16, bf16} x score stage {plain, ALiBi, softcap}, plain and ALiBi in order 1
}

}  // namespace
}  // namespace flashport::cuda
