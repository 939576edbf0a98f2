// The Hopper forward launcher: which problems the sm_90a kernel takes, its TMA tensor maps (tma_map.hpp),
// its kernel specs, and the launch.
#include "backends/cuda/sm90/hopper_fwd.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/autotune.hpp"
#include "backends/cuda/sm80/forward.hpp"
#include "backends/cuda/sm90/tma_map.hpp"
#include "backends/cuda/variants.hpp"
#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "kernels/cuda/hopper/fwd_sm90_config.h"

namespace flashport::cuda::hopper {
namespace {

constexpr const char* kSource = "cuda/hopper/attn_fwd_sm90.cu";
constexpr const char* kEntry = "flashport_attn_fwd_sm90";
constexpr int kHeadDims[] = {64, 96, 128, 192, 256};
constexpr int kFp8HeadDims[] = {64, 128, 256};  // fp8_tile_for's

constexpr bool tile_table_fits() {
  for (int d : kHeadDims) {
    const Tile t = tile_for(d);
    if (!block_m_fits(d, t) || t.block_n % 16 != 0 || t.block_n > 256 || t.stages < 2) return false;
    if (smem_bytes(d, t) > kSmemLimit) return false;
  }
  return true;
}
static_assert(tile_table_fits(), "a tile of the Hopper table breaks the kernel's limits");

bool supported_head_dim(long long d) {
  return std::find(std::begin(kHeadDims), std::end(kHeadDims), d) != std::end(kHeadDims);
}

/// A kernel shape: the tile plus how many eighths of the exponentials run on the FMA pipe
/// (FP_EXP_EMU, softmax_sm90.cuh; 0 = all on the SFU).
struct Shape {
  Tile tile;
  int exp_emu;
  int persistent = 0;  // FP_PERSISTENT: 1 or 2 = grid of SM count, CTAs loop over query blocks
  int transform = 0;   // FP_FWD_TRANSFORM (transform_for): 0 plain, 1 ALiBi, 2 softcap, 3 dropout
};

constexpr int kDropoutTransform = 3;

/// The score transform `p` needs (softmax_sm90.cuh, kTransform): plain problems run a kernel without
/// the softcap / ALiBi / dropout code in their loop.
int transform_for(const AttnProblem& p) {
  return p.dropout_p > 0.0f ? kDropoutTransform : p.softcap > 0.0f ? 2 : p.alibi != nullptr ? 1 : 0;
}

/// Dropout's tile whatever the table, autotuning or FLASHPORT_HOPPER_TILE chose (128 x 128 blocks on two
/// stages, no exp emulation), and its persistent mode given the launch rule's: mode 2 at d 64 only. The
/// other dropout variants spilled 4-580 bytes (192-row blocks, d 128 persistent, d 192 and 256: those
/// head dims run dropout on the portable kernel).
constexpr Tile kDropoutTile{kBlockM, 128, 2};
int dropout_persistent(int d, int persistent) {
  return d == 64 && persistent ? 2 : 0;
}

/// Whether the kernel of `shape` stages O in a buffer of its own (FP_PERSISTENT=2 where it fits).
bool separate_o(int d, const Shape& shape) {
  return shape.persistent == 2 && separate_o_fits(d, shape.tile);
}

constexpr bool shape_fits(int d, Shape s) {
  const Tile t = s.tile;
  return block_m_fits(d, t) && t.block_n >= 16 && t.block_n <= 256 && t.block_n % 16 == 0 && t.stages >= 2 &&
         t.stages <= 8 && smem_bytes(d, t) <= kSmemLimit && s.exp_emu >= 0 && s.exp_emu <= 8;
}

/// Timing alternatives, compiled by variants() so CI checks them for spills (ptxas, CUDA 13: none
/// spill, consumer peaks <= R235 of 240). Selected through FLASHPORT_HOPPER_TILE or by autotuning.
struct Alternative {
  int d;
  Shape shape;
};
constexpr Alternative kAlternatives[] = {
    {64, {{kBlockM, 128, 2}, 0}},  {64, {{kBlockM, 128, 3}, 0}},  {64, {{kBlockM, 128, 2}, 2}},
    {64, {{kBlockM, 128, 2}, 3}},  {64, {{kBlockM, 192, 2}, 2}},  {128, {{kBlockM, 176, 2}, 0}},
    {128, {{kBlockM, 128, 3}, 0}}, {128, {{kBlockM, 128, 2}, 1}}, {64, {{kBlockMTall, 128, 2}, 0}},
    {256, {{kBlockM, 80, 2}, 0}},  // FA3's d 256 tile, the rule's past 2k keys non-causal (rule_shape)
};

constexpr bool alternatives_fit() {
  for (const Alternative& a : kAlternatives)
    if (!shape_fits(a.d, a.shape)) return false;
  return true;
}
static_assert(alternatives_fit(), "a Hopper timing alternative breaks the kernel's limits");

/// The shape per head dim before autotuning: the table's, or FLASHPORT_HOPPER_TILE's.
struct ShapeTable {
  std::array<Shape, 5> shapes;
  std::array<bool, 5> from_env;  // FLASHPORT_HOPPER_TILE set it (autotuning then leaves it alone)
};

/// FLASHPORT_HOPPER_TILE="d:block_n:stages[:exp_emu[:block_m]][,...]" (e.g. "64:128:2:0:192,128:176:2")
/// replaces the shape of the named head dims (for timing variants in one process); a head dim the kernel does
/// not take or a shape over its limits is an Error naming the variable.
const ShapeTable& shape_table() {
  static const ShapeTable table = [] {
    ShapeTable r{};
    for (int i = 0; i < 5; ++i) r.shapes[i] = {tile_for(kHeadDims[i]), 0};
    for (const core::HopperTileSetting& e : core::tuning().hopper_tile.get()) {
      const Shape shape{{e.block_m ? e.block_m : kBlockM, e.block_n, e.stages}, e.exp_emu};
      const auto* slot = std::find(std::begin(kHeadDims), std::end(kHeadDims), e.d);
      const std::string entry = std::to_string(e.d) + ":" + std::to_string(e.block_n) + ":" +
                                std::to_string(e.stages) + ":" + std::to_string(e.exp_emu) + ":" +
                                std::to_string(shape.tile.block_m);
      if (slot == std::end(kHeadDims))
        throw Error("FLASHPORT_HOPPER_TILE", "head dim " + std::to_string(e.d) +
                                                 " is not one of the Hopper kernel's 64, 96, 128, 192, 256");
      if (!shape_fits(e.d, shape))
        throw Error("FLASHPORT_HOPPER_TILE",
                    "shape " + entry +
                        " breaks the Hopper kernel's limits (block_n a multiple of 16 up to "
                        "256, 2..8 stages within shared memory, exp_emu 0..8, block_m 128, or 192 at "
                        "d 64 with block_n <= 128)");
      const size_t i = slot - std::begin(kHeadDims);
      r.shapes[i] = shape, r.from_env[i] = true;
    }
    return r;
  }();
  return table;
}

Shape shape_for(int d) {
  for (int i = 0; i < 5; ++i)
    if (kHeadDims[i] == d) return shape_table().shapes[i];
  return {tile_for(d), 0};
}

bool shape_from_env(int d) {
  for (int i = 0; i < 5; ++i)
    if (kHeadDims[i] == d) return shape_table().from_env[i];
  return false;
}

/// The launch rule measured on the H200 (bf16, batch x seqlen = 16k, heads x d = 2048; docs/HOPPER_NOTES.md,
/// "Launch rule by sequence length"): at d 64, short keys (up to kTallKeys) favour 128 x 128 blocks and
/// longer ones 192 x 128 (kTallKeys); query blocks of equal work favour the persistent grid with O
/// staged apart (mode 2: the next block's Q load and the epilogue overlap; +4 to +34% non-causal up to
/// 2k at d 64, +1 to +19% at d 128 up to 8k). Causal blocks differ in work: the persistent schedule
/// deals them heaviest first within sections of heads whose K/V fit L2 (attn_fwd_sm90.cu, tile_block
/// and round_tile), which measured (2026-12-04, same grid, against one CTA per block) +3 to +17% at
/// d 64 and +5 to +12% at d 128 from 512 to 8k queries, even at 16k; so every dense causal problem at
/// d 64 and 128 takes mode 2. Windowed and varlen problems keep one CTA per block.

/// Keys above which d 64 runs 192 x 128 blocks (three consumer warpgroups): measured on the H200
/// (2026-12-03, bf16, d 64; sweep_hopper_fwd.py, us, against the 128-row tile the rule ran before):
/// 2 x 4k causal 132.7 vs 172.2, 2 x 4k 215.6 vs 271.5, 8 x 2k causal (16 heads) 219.8 vs 240.0,
/// 16k causal 2330 vs 2559, 16k 4355 vs 5003; at 8 x 1k causal the 128 x 128 persistent tile stays
/// ahead (58.1 vs 61.9).
constexpr long long kTallKeys = 1024;

/// d 256's rule, for 16-bit calls without a score transform, measured on an H100 (2026-12-06, one call,
/// bf16, batch x seqlen 16k, heads x d 2048, two rounds; docs/HOPPER_NOTES.md, "d 256 launch rule"): up
/// to kD256PersistentKeys keys non-causal, and kD256PersistentCausalKeys causal, the persistent grid on the
/// table's 64-key tile (mode 1: O's staging buffer does not fit; +3-5% at 1k-4k non-causal, +4-8% causal,
/// and -5% causal at 16k); longer non-causal calls one CTA per block on FA3's 128 x 80 tile (+4% at 4k,
/// +7% at 16k; causal it measured -2% to +2%). Softcap / ALiBi keep the table's tile on one CTA per block
/// (their persistent and 80-key d 256 builds were never measured), as do fp8 and paged calls.
constexpr long long kD256PersistentKeys = 2048;
constexpr long long kD256PersistentCausalKeys = 4096;
bool d256_rule_applies(const AttnProblem& p) {
  return p.d == 256 && p.in_type != kE4M3 && p.softcap == 0.0f && p.alibi == nullptr && p.dropout_p == 0.0f &&
         !p.block_table;
}

/// FLASHPORT_HOPPER_PERSISTENT=0|1|2 forces the persistent mode (2 runs as 1 where O's staging buffer
/// does not fit: d 192, 256); unset, the launch rule above.
int persistent_for(const AttnProblem& p) {
  const int d = (int)p.d;
  // Persistent builds have no paged loads (load_kv_tile) and read no kv-cache indices (make_block).
  if (p.block_table || p.leftpad_k || p.kv_batch_idx) return 0;
  if (const int forced = core::tuning().hopper_persistent.get(); forced >= 0) return forced;
  const bool dense = !p.cu_seqlens_q && !p.seqused_k;  // paged and kv-cache index problems returned above
  const bool equal_blocks = dense && p.window_left < 0 && p.window_right < 0;
  const bool causal_blocks = dense && p.window_left < 0 && p.window_right == 0;
  if (d == 256)
    return d256_rule_applies(p) && ((equal_blocks && p.sk <= kD256PersistentKeys) ||
                                    (causal_blocks && p.sk <= kD256PersistentCausalKeys))
               ? 1
               : 0;
  return (equal_blocks || causal_blocks) && (d == 128 || d == 64) ? 2 : 0;
}

/// The rule's tile for `p` when neither FLASHPORT_HOPPER_TILE nor autotuning chose one.
Shape rule_shape(const AttnProblem& p) {
  if (p.d == 64) return p.sk > kTallKeys ? Shape{{kBlockMTall, 128, 2}, 0} : Shape{{kBlockM, 128, 2}, 0};
  if (d256_rule_applies(p) && p.window_left < 0 && p.window_right < 0 && p.sk > kD256PersistentKeys)
    return {{kBlockM, 80, 2}, 0};
  return {tile_for((int)p.d), 0};
}

jit::KernelSpec make_spec(int elem_type, int d, Shape shape) {
  const Tile t = shape.tile;
  jit::KernelSpec spec;
  spec.source = kSource;
  spec.entry = kEntry;
  spec.arch = 90;
  spec.defines = {{"FP_DTYPE", elem_type == kBF16 ? "bf16" : "f16"},
                  {"FP_HEADDIM", std::to_string(d)},
                  {"FP_BLOCK_M", std::to_string(t.block_m)},
                  {"FP_BLOCK_N", std::to_string(t.block_n)},
                  {"FP_STAGES", std::to_string(t.stages)}};
  if (shape.exp_emu > 0) spec.defines.push_back({"FP_EXP_EMU", std::to_string(shape.exp_emu)});
  if (shape.persistent) spec.defines.push_back({"FP_PERSISTENT", std::to_string(shape.persistent)});
  if (shape.transform) spec.defines.push_back({"FP_FWD_TRANSFORM", std::to_string(shape.transform)});
  return spec;
}

struct Plans {
  MapPlan q, k, v;
};

/// The K/V maps' rows, batches and box rows for a tile of `tile`.block_n keys.
struct KvRows {
  long long rows, batches;
  int box;
};
KvRows kv_rows(const AttnProblem& p, const Tile& tile) {
  if (p.block_table) return {p.page_size, p.kv_rows, (int)std::min<long long>(p.page_size, tile.block_n)};
  if (p.cu_seqlens_k) return {p.total_k, 1, tile.block_n};
  return {p.sk, p.kv_batch_idx ? p.kv_rows : p.batch, tile.block_n};  // cache_batch_idx: the cache's rows
}

/// Tensor-map plans of q, k, v for `p` (varlen: one batch of total rows; coordinates start at
/// cu_seqlens[b]) whose K/V boxes are `tile`.block_n rows: the tile of the kernel that loads them.
/// Sets `error` on the first failure (which does not depend on the tile).
/// FP8 (e4m3): one-byte q and k; no v plan (the kernel reads fp8_v_transpose's V^T, whose map is
/// fp8_vt_map's).
Plans plan_maps(const AttnProblem& p, const Tile& tile, std::string& error) {
  const bool varlen_q = p.cu_seqlens_q != nullptr;
  const long long q_rows = varlen_q ? p.total_q : p.sq;
  const bool fp8 = p.in_type == kE4M3;
  const int bytes = fp8 ? 1 : 2;
  // K/V rows and batches: dense (sk, batch; a kv cache under cache_batch_idx: its kv_rows rows), varlen
  // (total_k, 1), or a paged pool (page_size tokens, kv_rows pages) whose boxes are a page's rows when pages
  // are shorter than the tile (load_kv_tile).
  const KvRows kv = kv_rows(p, tile);
  Plans plans;
  plans.q = plan_map("q", p.q, p.d, p.hq, q_rows, varlen_q ? 1 : p.batch, tile.block_m, bytes);
  plans.k = plan_map("k", p.k, p.d, p.hk, kv.rows, kv.batches, kv.box, bytes);
  if (!fp8) plans.v = plan_map("v", p.v, p.dv, p.hk, kv.rows, kv.batches, kv.box);
  for (const MapPlan* m : {&plans.q, &plans.k, &plans.v}) {
    if (error.empty() && !m->error.empty()) error = m->error;
  }
  return plans;
}

/// One kernel launch for `p`, prepared: kernel, parameters and tensor maps (encoded once, so timed
/// repeats measure the kernel rather than the host).
struct Launch {
  const jit::Kernel* kernel = nullptr;
  FwdSm90Params prm{};
  TmaDesc tma_q{}, tma_k{}, tma_v{};
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  int smem = 0;
};

/// What every launch of `p` with `tile` shares, the kernel and grid aside: shared memory, threads, the
/// parameter block and the q / k (and, 16-bit, v) tensor maps, whose boxes are this tile's.
Launch launch_base(const AttnProblem& p, const Tile& tile, bool separate) {
  const int elem_bytes = p.in_type == kE4M3 ? 1 : 2;
  Launch l;
  l.smem = smem_bytes((int)p.d, tile, separate, elem_bytes);
  l.threads = (unsigned)threads_for(tile.block_m);
  std::string error;
  const Plans plans = plan_maps(p, tile, error);  // boxes of this tile: the kernel's TMA loads assume them
  const long long q_rows = p.cu_seqlens_q ? p.total_q : p.sq;
  const long long k_rows = kv_rows(p, tile).rows;
  l.prm.p = p;
  l.prm.gather = 0;
  l.prm.dims_q = plans.q.pos;
  l.prm.dims_k = plans.k.pos;
  l.tma_q = encode("q", plans.q, p.in_type, p.q.ptr, q_rows);
  l.tma_k = encode("k", plans.k, p.in_type, p.k.ptr, k_rows);
  if (elem_bytes == 2) {  // fp8 reads V^T through fp8_vt_map instead
    l.prm.dims_v = plans.v.pos;
    l.tma_v = encode("v", plans.v, p.in_type, p.v.ptr, k_rows);
  }
  return l;
}

/// The grid: one CTA per query block, or with `persistent` one per SM (at most one per block) and the
/// causal schedule's section size (K/V of one byte per element for fp8, else two).
void place_grid(Launch& l, const AttnProblem& p, const Tile& tile, bool persistent, int device) {
  const long long m_blocks = (p.sq + tile.block_m - 1) / tile.block_m;
  if (persistent) {
    l.grid[0] = (unsigned)std::min<long long>(m_blocks * p.hq * p.batch, jit::device_sm_count(device));
    l.prm.section = causal_section(p.sk, p.d, p.dv, p.hq / p.hk, p.hq * p.batch, l.grid[0], m_blocks,
                                   p.in_type == kE4M3 ? 1 : 2);
  } else {
    l.grid[0] = (unsigned)m_blocks, l.grid[1] = (unsigned)p.hq, l.grid[2] = (unsigned)p.batch;
  }
}

/// The 16-bit shape `p` launches with from the tile and exp_emu of `chosen`: its score transform, dropout's
/// tile, the persistent mode.
Shape launch_shape(const AttnProblem& p, Shape chosen) {
  Shape shape = chosen;
  shape.transform = transform_for(p);
  const bool dropout = shape.transform == kDropoutTransform;
  if (dropout) shape.tile = kDropoutTile, shape.exp_emu = 0;
  const long long blocks = (p.sq + shape.tile.block_m - 1) / shape.tile.block_m * p.hq * p.batch;
  shape.persistent = blocks < (1LL << 30) ? persistent_for(p) : 0;  // the kernel counts blocks in int
  if (dropout) shape.persistent = dropout_persistent((int)p.d, shape.persistent);
  return shape;
}

/// Whether `p`'s paged K/V load through the producer warpgroup's cp.async gather (attn_fwd_sm90.cu,
/// produce_gather) in the kernel of `shape`: a build that carries it (no score transform, not persistent,
/// its rows fit: gather_fits), pages shorter than the key tile and than FLASHPORT_HOPPER_PAGED_GATHER, and
/// a pool its 32-bit records reach. Any page size then runs; the TMA boxes take multiples of 8 only.
bool gather_pages(const AttnProblem& p, const Shape& shape) {
  const auto reaches = [&](const Operand& op) {
    return gather_reaches(p.kv_rows, p.page_size, op.batch_stride, op.row_stride, 2);
  };
  return p.block_table && p.in_type != kE4M3 && shape.transform == 0 && shape.persistent == 0 &&
         gather_fits((int)p.d, shape.tile) && p.page_size < shape.tile.block_n &&
         p.page_size < core::tuning().hopper_paged_gather.get() && reaches(p.k) && reaches(p.v);
}

/// The launch of `p` with the tile and exp_emu of `chosen` (its persistent mode is decided here) on
/// GPU `device`: compiles or loads the kernel on first use.
Launch prepare(const AttnProblem& p, Shape chosen, int device) {
  const int d = (int)p.d;
  const Shape shape = launch_shape(p, chosen);
  const Tile tile = shape.tile;
  Launch l = launch_base(p, tile, separate_o(d, shape));
  l.prm.gather = gather_pages(p, shape) ? 1 : 0;
  const jit::SpecKey key{reinterpret_cast<const void*>(&make_spec),
                         {p.in_type, d, tile.block_m, tile.block_n, tile.stages, shape.exp_emu,
                          shape.persistent, shape.transform}};
  l.kernel = &jit::get_cached(key, device, l.smem, [&] { return make_spec(p.in_type, d, shape); });
  place_grid(l, p, tile, shape.persistent != 0, device);
  return l;
}

void run(Launch& l, void* stream) {
  void* args[] = {&l.prm, &l.tma_q, &l.tma_k, &l.tma_v};
  jit::launch(*l.kernel, l.grid[0], l.grid[1], l.grid[2], l.threads, l.smem, stream, args, 1,
              jit::LaunchOrder::overlap_prior);
}

// --- FP8 (e4m3 q, k, v; bf16 / fp16 out) -------------------------------------------------------------

/// The FP8 kernel's launch shape for `p`: fp8_tile_for's tile, at d 64 with more than kTallKeys keys 192
/// query rows (three consumer warpgroups), as the 16-bit rule: the exponentials limit d 64 more in fp8,
/// whose GEMMs take half the time (H200, 2026-12-06: +15-28% at 2k-4k, docs/HOPPER_NOTES.md).
/// FLASHPORT_HOPPER_FP8_TILE ("d:block_n:stages[:exp_emu[:block_m]]", block_m 0 or absent: the rule's)
/// replaces it per head dim for A/B timing: block_n 128 (one 128-key V^T box; softmax_sm90.cuh), 2..4
/// stages within shared memory, exp_emu 0..8; an entry outside those is an Error naming the variable.
Shape fp8_shape(const AttnProblem& p) {
  const int d = (int)p.d;
  Shape s{fp8_tile_for(d), 0};
  if (d == 64 && p.sk > kTallKeys) s.tile.block_m = kBlockMTall;
  for (const core::HopperTileSetting& e : core::tuning().hopper_fp8_tile.get()) {
    if (e.d != d) continue;
    const Tile t{e.block_m ? e.block_m : s.tile.block_m, e.block_n, e.stages};
    if (t.block_n != 128 || t.stages < 2 || t.stages > 4 || e.exp_emu < 0 || e.exp_emu > 8 ||
        !block_m_fits(d, t) || smem_bytes(d, t, false, 1) > kSmemLimit)
      throw Error("FLASHPORT_HOPPER_FP8_TILE",
                  "entry " + std::to_string(e.d) + ":" + std::to_string(e.block_n) + ":" +
                      std::to_string(e.stages) + ":" + std::to_string(e.exp_emu) + ":" +
                      std::to_string(t.block_m) +
                      " breaks the fp8 kernel's limits (block_n 128, 2..4 stages within shared memory, "
                      "exp_emu 0..8, block_m 128, or 192 at d 64)");
    s = {t, e.exp_emu};
  }
  return s;
}

/// The FP8 kernel writing ElemType `out_type` at head dim d with a block_m x block_n tile of `stages` K/V
/// stages and `exp_emu` eighths of the exponentials on the FMA pipe; `persistent` 1: one CTA per SM looping
/// over query blocks (FP_PERSISTENT=1; with no O staging, Q is released early as mode 2's); `transform`
/// 1 ALiBi, 2 softcap (transform_for; never dropout).
jit::KernelSpec make_fp8_spec(int out_type, int d, int persistent, int block_m, int block_n, int stages,
                              int exp_emu, int transform) {
  const Tile t{block_m, block_n, stages};
  jit::KernelSpec spec;
  spec.source = kSource;
  spec.entry = kEntry;
  spec.arch = 90;
  spec.defines = {{"FP_DTYPE", "e4m3"},
                  {"FP_OUT_DTYPE", out_type == kBF16 ? "bf16" : "f16"},
                  {"FP_FP8", "1"},
                  {"FP_HEADDIM", std::to_string(d)},
                  {"FP_BLOCK_M", std::to_string(t.block_m)},
                  {"FP_BLOCK_N", std::to_string(t.block_n)},
                  {"FP_STAGES", std::to_string(t.stages)}};
  if (persistent) spec.defines.push_back({"FP_PERSISTENT", "1"});
  if (exp_emu > 0) spec.defines.push_back({"FP_EXP_EMU", std::to_string(exp_emu)});
  if (transform) spec.defines.push_back({"FP_FWD_TRANSFORM", std::to_string(transform)});
  return spec;
}

/// The map of fp8_v_transpose's V^T (keys, dv, hk, slabs: batch dense, 1 varlen; keys a multiple of
/// kFp8VtKeys): boxes of 128 keys x all dv rows, the kernel's V^T tile.
TmaDesc fp8_vt_map(const AttnProblem& p, unsigned char* vt, long long keys) {
  MapPlan m{};
  m.dims[0] = (cuuint64_t)keys, m.dims[1] = (cuuint64_t)p.dv, m.dims[2] = (cuuint64_t)p.hk;
  m.dims[3] = (cuuint64_t)(p.cu_seqlens_k ? 1 : p.batch);
  m.strides[0] = (cuuint64_t)keys, m.strides[1] = (cuuint64_t)(keys * p.dv);
  m.strides[2] = (cuuint64_t)(keys * p.dv * p.hk);
  m.box[0] = kFp8VtKeys, m.box[1] = (cuuint32_t)p.dv, m.box[2] = m.box[3] = 1;
  return encode("v", m, kE4M3, vt, keys);
}

/// V^T into stream-ordered scratch, then the FP8 forward over it; the scratch is freed behind both.
void launch_fp8(const AttnProblem& p, int device) {
  const int d = (int)p.d;
  const Shape shape = fp8_shape(p);
  const Tile tile = shape.tile;
  Launch l = launch_base(p, tile, false);
  // The 16-bit kernel's launch rule (persistent_for: dense, no window, d 64 / 128), in mode 1 (fp8 has no
  // persistent d 256 build, nor a persistent softcap / ALiBi build: its variants()).
  const long long blocks = (p.sq + tile.block_m - 1) / tile.block_m * p.hq * p.batch;
  const int transform = transform_for(p);
  const int persistent = blocks < (1LL << 30) && d <= 128 && !transform && persistent_for(p) ? 1 : 0;
  l.kernel = &cached_kernel(make_fp8_spec, device, l.smem, p.out_type, d, persistent, tile.block_m,
                            tile.block_n, tile.stages, shape.exp_emu, transform);
  place_grid(l, p, tile, persistent != 0, device);
  const long long keys = fp8_vt_keys(p), slabs = p.cu_seqlens_k ? 1 : p.batch;
  const size_t vt_bytes = p.sk > 0 ? (size_t)(slabs * p.hk * p.dv * keys) : 0;
  if (vt_bytes == 0) {  // no keys: every block stores O = 0, LSE = -inf without reading V
    run(l, p.stream);
    return;
  }
  jit::AsyncScratch ws(vt_bytes, p.stream);
  auto* vt = reinterpret_cast<unsigned char*>(ws.bytes());
  Fp8VtParams vp{p, vt, keys};
  void* args[] = {&vp};
  const jit::Kernel& transpose = cached_kernel(fp8_transpose_spec, device, 0, 90);
  const long long key_blocks = (p.sk + kFp8VtKeys - 1) / kFp8VtKeys;  // per sequence, at most
  jit::launch(transpose, (unsigned)key_blocks, (unsigned)p.hk, (unsigned)p.batch, 256, 0, p.stream, args, 1,
              jit::LaunchOrder::overlap_prior);
  l.tma_v = fp8_vt_map(p, vt, keys);
  run(l, p.stream);
  ws.free();
}

// --- autotuning (FLASHPORT_AUTOTUNE=1) -----------------------------------------------------------

/// "128x176x2" (block_m x block_n x stages), with "/emu<n>" when exponentials run on the FMA pipe.
std::string shape_text(const Shape& s) {
  std::string text = std::to_string(s.tile.block_m) + "x" + std::to_string(s.tile.block_n) + "x" +
                     std::to_string(s.tile.stages);
  return s.exp_emu ? text + "/emu" + std::to_string(s.exp_emu) : text;
}

/// The store's value "block_n:stages:exp_emu" (":block_m" added when it is not 128) and back;
/// nullopt for text that is not three or four integers or a shape over the kernel's limits for `d`.
std::string shape_value(const Shape& s) {
  const std::string value =
      std::to_string(s.tile.block_n) + ":" + std::to_string(s.tile.stages) + ":" + std::to_string(s.exp_emu);
  return s.tile.block_m == kBlockM ? value : value + ":" + std::to_string(s.tile.block_m);
}
std::optional<Shape> parse_shape_value(int d, const std::string& value) {
  std::vector<int> v;
  if (!core::parse_ints(value, ':', v) || v.size() < 3 || v.size() > 4) return std::nullopt;
  const Shape shape{{v.size() == 4 ? v[3] : kBlockM, v[0], v[1]}, v[2]};
  return shape_fits(d, shape) ? std::optional<Shape>(shape) : std::nullopt;
}

/// Problems share a tuned shape per (head dim, dtype, causal, persistent mode). "Causal" is
/// window_right == 0 (causal and left-windowed causal: the kernel skips the key tiles above the
/// diagonal, so its best tile differs); every other mask tunes with the non-causal bucket.
std::string tune_key(const AttnProblem& p) {
  std::string key = "hopper_fwd d=" + std::to_string(p.d) + " causal=" + (p.window_right == 0 ? "1" : "0") +
                    " dtype=" + (p.in_type == kBF16 ? "bf16" : "f16");
  if (const int mode = persistent_for(p)) key += " persistent=" + std::to_string(mode);
  return key;
}

/// The table's shape first, then the timing alternatives of the same head dim.
std::vector<Shape> candidates(int d) {
  std::vector<Shape> shapes = {{tile_for(d), 0}};
  for (const Alternative& a : kAlternatives) {
    const bool seen = std::any_of(shapes.begin(), shapes.end(), [&](const Shape& s) {
      return std::tie(s.tile.block_m, s.tile.block_n, s.tile.stages, s.exp_emu) ==
             std::tie(a.shape.tile.block_m, a.shape.tile.block_n, a.shape.tile.stages, a.shape.exp_emu);
    });
    if (a.d == d && !seen) shapes.push_back(a.shape);
  }
  return shapes;
}

/// Times every candidate on `p` itself (2 warm-up + 5 timed launches each, synchronising) and
/// returns the fastest, leaving the output of the last launch in p.o / p.lse. A candidate that
/// fails to compile or time (e.g. on a stream capturing a CUDA graph) is skipped; nullopt when none
/// could be timed.
std::optional<Shape> time_candidates(const AttnProblem& p, int device, const std::string& label) {
  std::optional<Shape> best;
  float best_ms = 0.0f;
  std::string summary;
  for (const Shape& shape : candidates((int)p.d)) {
    const std::string name = shape_text(shape);
    try {
      Launch l = prepare(p, shape, device);
      const auto launch_once = [&] { run(l, p.stream); };
      const float ms = jit::time_ms(device, p.stream, launch_once, 2, 5);
      std::fprintf(stderr, "flashport: autotune %s: %s %.3f ms\n", label.c_str(), name.c_str(), ms);
      char entry[96];
      std::snprintf(entry, sizeof entry, "%s%s %.3f ms", summary.empty() ? "" : ", ", name.c_str(), ms);
      summary += entry;
      if (!best || ms < best_ms) best = shape, best_ms = ms;
    } catch (const Error& e) {
      std::fprintf(stderr, "flashport: autotune %s: %s skipped (%s)\n", label.c_str(), name.c_str(),
                   e.what());
    }
  }
  const std::string winner = best ? shape_text(*best) : "none timed, the table's shape stays (not stored)";
  std::fprintf(stderr, "flashport: autotune %s: %s -> %s\n", label.c_str(), summary.c_str(), winner.c_str());
  return best;
}

/// The tuned shape of `p`'s bucket from the store, else timed now and stored.
Shape tuned_shape(const AttnProblem& p, int device) {
  const int d = (int)p.d;
  const std::string key = tune_key(p);
  if (const auto value = autotune::lookup(device, key)) {
    if (const auto shape = parse_shape_value(d, *value)) return *shape;
    std::fprintf(stderr, "flashport: autotune entry '%s %s' is not a valid shape; tuning again\n",
                 key.c_str(), value->c_str());
  }
  const std::string label = "hopper_fwd d=" + std::to_string(d) +
                            " causal=" + (p.window_right == 0 ? "1" : "0") + " " +
                            (p.in_type == kBF16 ? "bf16" : "f16");
  const std::optional<Shape> best = time_candidates(p, device, label);
  if (!best) return {tile_for(d), 0};
  autotune::store(device, key, shape_value(*best));
  return *best;
}

/// The shape forward() launches for `p`: FLASHPORT_HOPPER_TILE's, the launch rule's, or with
/// FLASHPORT_AUTOTUNE=1 the tuned one, resolved once per (device, bucket) in this process.
Shape chosen_shape(const AttnProblem& p, int device) {
  const int d = (int)p.d;
  if (shape_from_env(d)) return shape_for(d);
  if (!autotune::enabled() || p.block_table)
    return rule_shape(p);   // paged: the key tile unsupported() checked
  static std::mutex mutex;  // held while tuning, too: concurrent timings would disturb each other
  static std::map<std::pair<int, std::string>, Shape> resolved;
  std::lock_guard lock(mutex);
  const auto slot = std::make_pair(device, tune_key(p));
  auto it = resolved.find(slot);
  if (it == resolved.end()) {
    Shape shape = shape_for(d);
    try {
      shape = tuned_shape(p, device);
    } catch (const Error& e) {  // tuning is an optimisation: the table's shape still runs
      std::fprintf(stderr, "flashport: autotune %s failed (%s); using the table's shape\n",
                   slot.second.c_str(), e.what());
    }
    it = resolved.emplace(slot, shape).first;
  }
  return it->second;
}

/// Why a paged problem's pages do not suit the kernel it launches ("" if they do): pages the cp.async gather
/// loads (gather_pages), or a multiple of 8 tokens dividing, or a multiple of, its key tile (TMA boxes).
/// The 16-bit shape is launch_shape's over chosen_shape's, which never autotunes a paged problem (so
/// `p.device` is not touched).
std::string unsupported_pages(const AttnProblem& p) {
  if (p.page_size > (1LL << 30)) return "pages of at most 2^30 tokens";  // the kernel counts them in int
  bool gathered = false;
  long long block_n = 0;
  if (p.in_type == kE4M3) {
    block_n = fp8_shape(p).tile.block_n;
  } else {
    const Shape shape = launch_shape(p, chosen_shape(p, p.device));
    block_n = shape.tile.block_n, gathered = gather_pages(p, shape);
  }
  if (gathered || (p.page_size % 8 == 0 && (p.page_size % block_n == 0 || block_n % p.page_size == 0)))
    return "";
  return "the Hopper kernel takes pages its cp.async gather loads (d <= 128, no softcap / ALiBi / "
         "dropout: any size below the key tile) or of a multiple of 8 tokens that divide, or are a "
         "multiple of, its " +
         std::to_string(block_n) + "-key tile (others run on the portable kernel)";
}

}  // namespace

jit::KernelSpec fp8_transpose_spec(int arch) {
  return {"cuda/hopper/fp8_v_transpose.cu", "flashport_fp8_v_transpose", {}, arch};
}

std::string unsupported(const AttnProblem& p, int arch) {
  if (arch != 90) return "the Hopper kernel needs compute capability 9.0, got " + std::to_string(arch);
  if (p.in_type == kE4M3) {
    if (p.out_type != kBF16 && p.out_type != kF16)
      return "the Hopper fp8 kernel writes bf16 or fp16 out (fp32 out runs on the portable kernel)";
    if (p.d != p.dv || fp8_tile_for((int)p.d).block_n == 0)
      return "the Hopper fp8 kernel takes d == dv in {64, 128, 256} (others run on the portable kernel)";
    if (p.dropout_p > 0.0f) return "fp8 with dropout runs on the portable kernel";
  } else {
    if (is_fp8_elem(p.in_type)) return "e5m2 and e4m3fnuz inputs run on the portable kernel's fp8 variant";
    if (p.in_type != kF16 && p.in_type != kBF16) return "the Hopper kernel takes fp16/bf16 inputs";
    if (p.out_type != p.in_type) return "the Hopper kernel writes out in the input dtype";
    if (p.d != p.dv) return "the Hopper kernel needs d == dv";
    if (!supported_head_dim(p.d)) return "the Hopper kernel takes head dims 64, 96, 128, 192, 256";
  }
  if (p.dropout_p > 0.0f && (p.softcap > 0.0f || p.alibi != nullptr))
    return "dropout with softcap or ALiBi runs on the portable kernel";
  if (p.dropout_p > 0.0f && p.d > 128) return "dropout above head dim 128 runs on the portable kernel";
  if (p.in_type == kE4M3 && (p.leftpad_k || p.kv_batch_idx))
    return "fp8 with cache_leftpad or cache_batch_idx runs on the portable kernel";
  if (p.block_table) {
    if (p.leftpad_k) return "cache_leftpad over a paged cache runs on the portable kernel";
    if (p.in_type == kE4M3 && p.cu_seqlens_k)
      return "fp8 over a paged varlen cache runs on the portable kernel";
    if (std::string why = unsupported_pages(p); !why.empty()) return why;
  }
  if (p.s_dmask) return "s_dmask is produced by the CPU reference only";
  if (!(p.scale > 0.0f)) return "the Hopper kernel needs a positive softmax scale";
  if (p.hq > limits(arch).max_grid_yz || p.batch > limits(arch).max_grid_yz)
    return "more than 65535 heads or sequences";
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr)) return "varlen needs cu_seqlens_q and _k";
  if (!aligned16(p.q.ptr) || !aligned16(p.k.ptr) || !aligned16(p.v.ptr) || !aligned16(p.o.ptr))
    return "the Hopper kernel needs 16-byte aligned q, k, v, out";
  if (p.o.row_stride % 8 != 0 || p.o.head_stride % 8 != 0 || p.o.batch_stride % 8 != 0)
    return "the Hopper kernel needs out strides in multiples of 8 elements";
  std::string error;
  plan_maps(p, p.in_type == kE4M3 ? fp8_shape(p).tile : shape_for((int)p.d).tile, error);  // tile-free errors
  return error;
}

const char* declines(const AttnProblem& p, int) {
  if (p.in_type == kE4M3 && !core::tuning().hopper_fp8.get())
    return "FLASHPORT_HOPPER_FP8=0 keeps e4m3 on the portable kernel";
  if (decode_sized(p))
    return "decode-sized rows (<= 16 per kv head): the portable decode variant splits the keys";
  const long long tiles = p.batch * p.hq * ((p.sq + kBlockM - 1) / kBlockM);
  if (tiles * 2 >= jit::device_sm_count(p.device)) return nullptr;
  return "too few 128-row query tiles to fill the GPU (the portable kernel splits the keys)";
}

void launch(const AttnProblem& p, int) {
  if (p.batch <= 0 || p.hq <= 0 || p.sq <= 0) return;
  const int device = p.device;  // checked against q's pointer by CudaBackend::unsupported
  if (p.in_type == kE4M3) return launch_fp8(p, device);
  Launch l = prepare(p, chosen_shape(p, device), device);
  run(l, p.stream);
}

void forward(const AttnProblem& p) {
  if (const std::string why = unsupported(p, 90); !why.empty()) throw Error("q", why);
  launch(p, 90);
}

TunedShape autotune_shape(const AttnProblem& p) {
  if (const std::string why = unsupported(p, 90); !why.empty()) throw Error("q", why);
  if (p.batch <= 0 || p.hq <= 0 || p.sq <= 0) throw Error("q", "autotuning needs a non-empty problem");
  if (p.in_type == kE4M3)
    throw Error("q", "the Hopper fp8 kernel has one shape per head dim: nothing to tune");
  const int device = p.device;  // checked against q's pointer by CudaBackend::unsupported
  const Shape shape = tuned_shape(p, device);
  Launch l = prepare(p, shape, device);
  run(l, p.stream);
  return {shape.tile.block_n, shape.tile.stages, shape.exp_emu, shape.tile.block_m};
}

std::vector<jit::KernelSpec> variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  if (arch != 90) return specs;
  for (int elem_type : {(int)kF16, (int)kBF16}) {
    for (int d : kHeadDims) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0}));
    for (int d : kHeadDims) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0, 1}));
    for (int d : kHeadDims)
      if (separate_o_fits(d, tile_for(d))) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0, 2}));
    for (const Alternative& a : kAlternatives) specs.push_back(make_spec(elem_type, a.d, a.shape));
    specs.push_back(make_spec(elem_type, 64, {{kBlockM, 128, 2}, 0, 2}));  // the rule's short-key d 64 shape
    specs.push_back(make_spec(elem_type, 64, {{kBlockMTall, 128, 2}, 0, 2}));  // three consumers, persistent
    // Softcap / ALiBi kernels of the launch rule's shapes (rule_shape x persistent_for).
    for (int transform : {1, 2}) {
      for (int persistent : {0, 2}) {
        specs.push_back(make_spec(elem_type, 64, {{kBlockM, 128, 2}, 0, persistent, transform}));
        specs.push_back(make_spec(elem_type, 64, {{kBlockMTall, 128, 2}, 0, persistent, transform}));
        specs.push_back(make_spec(elem_type, 128, {tile_for(128), 0, persistent, transform}));
      }
      for (int d : {96, 192, 256}) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0, 0, transform}));
    }
    // Dropout (kDropoutTile): d 64 on both grids, 96 and 128 one CTA per block.
    for (int d : {64, 96, 128})
      for (int persistent : {0, 2})
        if (persistent == dropout_persistent(d, persistent))
          specs.push_back(make_spec(elem_type, d, {kDropoutTile, 0, persistent, kDropoutTransform}));
    for (int d : kFp8HeadDims)  // e4m3 in, this dtype out; persistent where the launch rule takes it
      for (int persistent : {0, 1})
        if (!persistent || d <= 128)
          specs.push_back(make_fp8_spec(elem_type, d, persistent, kBlockM, 128, 2, 0, 0));
    for (int persistent : {0, 1})  // d 64's long-key tile (fp8_tile)
      specs.push_back(make_fp8_spec(elem_type, 64, persistent, kBlockMTall, 128, 2, 0, 0));
    // e4m3 with ALiBi or softcap: one CTA per block, fp8_shape's tiles.
    for (int transform : {1, 2}) {
      for (int d : kFp8HeadDims)
        specs.push_back(make_fp8_spec(elem_type, d, 0, kBlockM, 128, 2, 0, transform));
      specs.push_back(make_fp8_spec(elem_type, 64, 0, kBlockMTall, 128, 2, 0, transform));
    }
  }
  return specs;
}

bool is_main_kernel(const jit::KernelSpec& spec) {
  return spec.source == kSource && spec.entry == kEntry;
}

}  // namespace flashport::cuda::hopper
