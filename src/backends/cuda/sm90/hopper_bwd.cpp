// The Hopper backward main-kernel launcher: which problems the sm_90a kernel takes, its four TMA tensor
// maps, its kernel specs, and the launch (see hopper_bwd.hpp).
#include "backends/cuda/sm90/hopper_bwd.hpp"

#include <algorithm>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/operand_align.hpp"
#include "backends/cuda/sm90/tma_map.hpp"
#include "backends/cuda/variants.hpp"
#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "kernels/cuda/hopper/bwd_sm90_config.h"

namespace flashport::cuda::hopper_bwd {
namespace {

// Narrow (d <= 128): 128 keys per CTA, 64 per consumer; wide (d 192, 256): 64 keys shared by both consumers.
constexpr const char* kNarrowSource = "cuda/hopper/attn_bwd_sm90.cu";
constexpr const char* kNarrowEntry = "flashport_attn_bwd_sm90";
constexpr const char* kWideSource = "cuda/hopper/attn_bwd_sm90_wide.cu";
constexpr const char* kWideEntry = "flashport_attn_bwd_sm90_wide";
constexpr int kHeadDims[] = {64, 96, 128, 192, 256};

constexpr bool tile_table_fits() {
  for (int d : kHeadDims)
    for (const Tile t : {tile_for(d), tile_64_queries(d)}) {
      if ((t.block_m != 64 && t.block_m != 128) || t.stages < 1) return false;
      if (smem_bytes(d, t) > kSmemLimit) return false;
      if (bulk_dq_fits(d) && smem_bytes(d, Tile{t.block_m, t.stages, 1, t.pipe}) > kSmemLimit) return false;
      if (t.pipe && !pipe_fits(d, 0)) return false;
      // 128 queries per step: bulk dQ into the tiled accumulator, the serial loop (attn_bwd_sm90.cu)
      if (t.block_m == 128 && (d != 64 || t.dq_mode != 1 || t.pipe)) return false;
    }
  return true;
}
static_assert(tile_table_fits(), "a tile of the Hopper backward table breaks the kernel's limits");

/// tile_for(d) for score transform `general`, with a dQ mode (FLASHPORT_HOPPER_BWD_DQ), a loop setting
/// (FLASHPORT_HOPPER_BWD_PIPE, -1: the table's), queries per step (FLASHPORT_HOPPER_BWD_BLOCK_M, 0: the
/// table's), determinism and a row-major dQ accumulator (vector reductions only). 128 queries per step
/// need bulk dQ, no determinism and no dropout; the loop knob and block_m 64 ask for tile_64_queries,
/// whose dQ mode and loop the knobs then set.
Tile launch_tile(int d, int general, int dq_mode, int pipe, int block_m = 0, bool deterministic = false,
                 bool row_major_dq = false) {
  if (row_major_dq) dq_mode = 0;
  Tile t = tile_for(d);
  if (t.block_m == 128 && (dq_mode != 1 || deterministic || pipe >= 0 || block_m == 64 || general == 3))
    t = tile_64_queries(d);
  if (t.block_m == 128) return t;
  // The wide kernel's deterministic turns are taken by its consumers: those runs keep their reductions.
  t.dq_mode = bulk_dq_fits(d) && !(wide_kernel(d) && deterministic) ? dq_mode : 0;
  if (pipe >= 0 && pipe_fits(d, 0)) {  // the knob: loop and stages
    t.pipe = pipe == 1 || pipe == 2;
    t.stages = pipe >= 2 ? 3 : 2;
  }
  if (!pipe_fits(d, general)) t.pipe = 0;  // softcap, dropout: the serial loop on the same stages
  return t;
}

/// The score stage `p` needs (FP_BWD_GENERAL): 3 dropout, 2 softcap, 1 ALiBi, 0 none.
int score_stage(const AttnProblem& p) {
  return p.dropout_p > 0.0f ? 3 : p.softcap != 0.0f ? 2 : p.alibi != nullptr ? 1 : 0;
}

/// The tiled dQ accumulator pads every sequence to whole 64-row tiles: up to 63 rows more per sequence
/// (dense) or 64 (varlen). A batch of many short sequences would multiply its size (10k one-token
/// sequences: 64x), so past the row-major size or 256 MB of padding, whichever is larger, the accumulator
/// is row-major (FP_BWD_DQ_ROWS: the same kernels with vector reductions of 8 rows x 32 bytes), unless
/// FLASHPORT_HOPPER_BWD_DQ_ROWS says otherwise. d 96's is row-major always (tiled_accumulator).
bool row_major_dq(const AttnProblem& p) {
  if (p.d % 64 != 0) return false;
  const int knob = core::tuning().hopper_bwd_dq_rows.get();
  if (knob >= 0) return knob == 1;
  const long long rows = accum_rows(p);
  const long long row_bytes = p.hq * p.d * (long long)sizeof(float);
  const long long extra = (accum_rows_tiled(p) - rows) * row_bytes;
  return extra > std::max(rows * row_bytes, 256LL << 20);
}

/// The tile `p` launches with under this process's knobs (launch_tile).
Tile tile_of(const AttnProblem& p) {
  return launch_tile((int)p.d, score_stage(p), core::tuning().hopper_bwd_dq.get(),
                     core::tuning().hopper_bwd_pipe.get(), core::tuning().hopper_bwd_block_m.get(),
                     p.deterministic, row_major_dq(p));
}

/// make_spec's opt-in defines, bit flags of its `extras`: each adds its define only when set, so that the
/// default specs (and their SASS) stay those of before the option existed.
constexpr int kExtraOrder = 1;   // FP_BWD_ORDER 1 (FLASHPORT_HOPPER_BWD_ORDER, order_of)
constexpr int kExtraDqRows = 2;  // FP_BWD_DQ_ROWS 1 (row_major_dq)

/// `general`: the score stage's transforms (FP_BWD_GENERAL): 0 none, 1 ALiBi, 2 softcap (and ALiBi), 3
/// dropout (alone). `extras`: kExtraOrder, kExtraDqRows.
jit::KernelSpec make_spec(int elem_type, int d, int dq_mode, int general, int stages, int pipe, int block_m,
                          int extras) {
  const bool wide = wide_kernel(d);
  jit::KernelSpec spec{wide ? kWideSource : kNarrowSource,
                       wide ? kWideEntry : kNarrowEntry,
                       {{"FP_DTYPE", elem_type == kBF16 ? "bf16" : "f16"},
                        {"FP_HEADDIM", std::to_string(d)},
                        {"FP_BLOCK_M", std::to_string(block_m)},
                        {"FP_STAGES", std::to_string(stages)},
                        {"FP_DQ_MODE", std::to_string(dq_mode)},
                        {"FP_BWD_GENERAL", std::to_string(general)},
                        {"FP_BWD_PIPE", std::to_string(pipe)}},
                       90};
  if (extras & kExtraOrder) spec.defines.push_back({"FP_BWD_ORDER", "1"});
  if (extras & kExtraDqRows) spec.defines.push_back({"FP_BWD_DQ_ROWS", "1"});
  return spec;
}

/// The serial loop's GEMM order (FLASHPORT_HOPPER_BWD_ORDER, make_spec's kExtraOrder bit) where tile `t`
/// of head dim d with score stage `general` has one: the narrow kernel's serial loop, except softcap on 128
/// queries per step and at d 96 (their dQ tile, live beside dK's GEMM, spilled 8 bytes).
int order_of(int d, const Tile& t, int general, int knob) {
  const bool spills = general == 2 && (t.block_m == 128 || d == 96);
  return !wide_kernel(d) && !t.pipe && !spills ? knob : 0;
}

struct Plans {
  hopper::MapPlan q, k, v, dout;
};

/// Tensor-map plans (varlen: one batch of total rows; coordinates start at cu_seqlens[b]). Sets
/// `error` on the first failure.
Plans plan_maps(const AttnProblem& p, std::string& error, const Tile& tile) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const long long q_rows = varlen ? p.total_q : p.sq, k_rows = varlen ? p.total_k : p.sk;
  const long long batch = varlen ? 1 : p.batch;
  const int block_n = block_n_for((int)p.d);
  Plans plans;
  plans.q = hopper::plan_map("q", p.q, p.d, p.hq, q_rows, batch, tile.block_m);
  plans.dout = hopper::plan_map("dout", p.dout, p.dv, p.hq, q_rows, batch, tile.block_m);
  plans.k = hopper::plan_map("k", p.k, p.d, p.hk, k_rows, batch, block_n);
  plans.v = hopper::plan_map("v", p.v, p.dv, p.hk, k_rows, batch, block_n);
  for (const hopper::MapPlan* m : {&plans.q, &plans.k, &plans.v, &plans.dout})
    if (error.empty() && !m->error.empty()) error = m->error;
  return plans;
}

}  // namespace

std::string unsupported(const AttnProblem& p, int arch) {
  if (arch != 90) return "the Hopper backward needs compute capability 9.0, got " + std::to_string(arch);
  if (p.in_type != kF16 && p.in_type != kBF16) return "the Hopper backward takes fp16/bf16 inputs";
  if (p.out_type != p.in_type) return "the Hopper backward needs out and dout in the input dtype";
  if (p.d != p.dv) return "the Hopper backward needs d == dv";
  if (std::find(std::begin(kHeadDims), std::end(kHeadDims), p.d) == std::end(kHeadDims))
    return "the Hopper backward takes head dims 64, 96, 128, 192, 256";
  if (p.dropout_p > 0.0f) {
    if (p.softcap != 0.0f || p.alibi != nullptr)
      return "dropout with softcap or ALiBi runs on the portable backward (the Hopper consumers spilled)";
    if (!dropout_fits((int)p.d, tile_of(p).dq_mode))
      return "dropout at this head dim and dQ mode runs on the portable backward (hopper_bwd::dropout_fits)";
  }
  if (p.block_table || p.kv_batch_idx || p.leftpad_k)
    return "paged and kv-cache layouts have no backward here";
  if (!(p.scale > 0.0f)) return "the Hopper backward needs a positive softmax scale";
  if (p.hk > limits(arch).max_grid_yz) return "more than 65535 kv heads";
  if (p.sq >= (1LL << 30) || p.sk >= (1LL << 30)) return "sequence lengths must be below 2^30";
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr)) return "varlen needs cu_seqlens_q and _k";
  for (const Operand* t : {&p.q, &p.k, &p.v, &p.dout, &p.grad_k, &p.grad_v})
    if (!rows_aligned(*t)) return "the Hopper backward needs 16-byte aligned rows of q, k, v, dout, dk, dv";
  std::string error;
  plan_maps(p, error, tile_of(p));  // the launch's boxes (the errors do not depend on them today)
  return error;
}

bool takes_dropout(int d) {
  const bool rows = d % 64 == 0 && core::tuning().hopper_bwd_dq_rows.get() == 1;
  return dropout_fits(d, launch_tile(d, 3, core::tuning().hopper_bwd_dq.get(), -1, 0, false, rows).dq_mode);
}

long long dq_tile_counts(const BwdParams& prm) {
  return prm.p.deterministic ? prm.p.hq * accum_rows_tiled(prm.p) / 64 : 0;
}

int tiled_accumulator(const AttnProblem& p) {
  if (p.d % 64 != 0 || row_major_dq(p)) return 0;
  return wide_kernel((int)p.d) ? 128 : 64;
}

void launch_main(BwdParams& prm, int arch) {
  const AttnProblem& p = prm.p;
  const bool rows = row_major_dq(p);  // for the layout check and the spec (tile_of asks the same)
  if (prm.accum_tiled != tiled_accumulator(p) || ((prm.accum_tiled || rows) && prm.accum_ld != p.d))
    throw Error("q", "internal: the Hopper backward got a dQ accumulator of the wrong layout");
  const int d = (int)p.d;
  const int general = score_stage(p);
  const Tile tile = tile_of(p);
  if (general == 3 && !dropout_fits(d, tile.dq_mode))
    throw Error("dropout_p", "internal: the Hopper backward got dropout where it does not run");
  const int smem = smem_bytes(d, tile);
  std::string error;
  const Plans plans = plan_maps(p, error, tile);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const long long q_rows = varlen ? p.total_q : p.sq, k_rows = varlen ? p.total_k : p.sk;
  const int block_n = block_n_for(d);
  // FLASHPORT_HOPPER_BWD_PAIR: d 192 / 256 in clusters of two (key blocks 2i, 2i + 1) that share their dQ
  // reductions; a grid of whole pairs (a CTA past the keys returns at once, and its peer then works
  // alone). Deterministic runs keep one CTA each: their dQ tiles take key blocks in a fixed order.
  const unsigned cluster = wide_kernel(d) && !p.deterministic && core::tuning().hopper_bwd_pair.get() ? 2 : 1;
  const long long key_blocks = (p.sk + block_n - 1) / block_n;
  if (key_blocks <= 0 || p.batch <= 0) return;
  const long long grid_x = (key_blocks + cluster - 1) / cluster * cluster;
  // Key blocks outside kv heads (BwdParams::keys_outer) where a mask makes their work differ: each batch
  // entry's longest CTAs first, its short ones last, the grid's tail among them. Where the grid is a few
  // waves that tail is much of the run (2 x 4096 x 12 heads, d 64, causal: 768 CTAs, 1.12x; 8 x 1024 x 12:
  // 1.05x; H100); over many waves it is not, and a batch entry's heads in flight at once (rather than a
  // few key blocks' worth) cost L2 hits (16 x 1024 x 32: 0.98x; every head's key block 0 first, at 1k-16k
  // tokens: 0.51-0.99x). So: at most kKeysOuterWaves waves, and a batch entry's Q, dO and fp32 dQ (8 bytes
  // per query row and column) within kKeysOuterL2Bytes, unless FLASHPORT_HOPPER_BWD_KEYS_OUTER=2. Not in
  // deterministic runs (their turn order dispatches each head's blocks together, from the last), cluster
  // pairs (along x), or past grid y's limit.
  constexpr long long kKeysOuterL2Bytes = 32ll << 20;
  constexpr long long kKeysOuterWaves = 8;
  const int keys_outer_knob = core::tuning().hopper_bwd_keys_outer.get();
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  const bool short_grid = (long long)p.hq * p.sq * p.d * 8 <= kKeysOuterL2Bytes &&
                          key_blocks * p.hk * p.batch <= kKeysOuterWaves * jit::device_sm_count(p.device);
  const bool keys_outer = keys_outer_knob > 0 && (short_grid || keys_outer_knob == 2) && masked &&
                          !p.deterministic && cluster == 1 && key_blocks <= limits(arch).max_grid_yz &&
                          keys_outer_fits(tile.block_m, general);

  BwdSm90Params kp{};
  kp.bwd = prm;
  kp.bwd.keys_outer = keys_outer ? 1 : 0;
  kp.dims_q = plans.q.pos, kp.dims_k = plans.k.pos, kp.dims_v = plans.v.pos, kp.dims_do = plans.dout.pos;
  TmaDesc tma_q = hopper::encode("q", plans.q, p.in_type, p.q.ptr, q_rows);
  TmaDesc tma_k = hopper::encode("k", plans.k, p.in_type, p.k.ptr, k_rows);
  TmaDesc tma_v = hopper::encode("v", plans.v, p.in_type, p.v.ptr, k_rows);
  TmaDesc tma_do = hopper::encode("dout", plans.dout, p.in_type, p.dout.ptr, q_rows);

  const int device = p.device;
  const int extras = rows ? kExtraDqRows : order_of(d, tile, general, core::tuning().hopper_bwd_order.get());
  const jit::Kernel& kernel = cached_kernel(make_spec, device, smem, p.in_type, d, tile.dq_mode, general,
                                            tile.stages, tile.pipe, tile.block_m, extras);
  void* args[] = {&kp, &tma_q, &tma_k, &tma_v, &tma_do};
  for_batch_chunks(p.batch, arch, [&](long long b0, long long nb) {
    kp.bwd.batch_offset = (int)b0;
    if (keys_outer)
      jit::launch(kernel, (unsigned)p.hk, (unsigned)grid_x, (unsigned)nb, kThreads, smem, p.stream, args);
    else
      jit::launch(kernel, (unsigned)grid_x, (unsigned)p.hk, (unsigned)nb, kThreads, smem, p.stream, args,
                  cluster);
  });
}

std::vector<jit::KernelSpec> variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  if (arch != 90) return specs;
  const auto add = [&](const jit::KernelSpec& spec) {
    for (const jit::KernelSpec& seen : specs)
      if (seen.key() == spec.key()) return;
    specs.push_back(spec);
  };
  for (int elem_type : {(int)kF16, (int)kBF16})
    for (int d : kHeadDims)
      for (int dq_knob : {0, 1})  // FLASHPORT_HOPPER_BWD_DQ's values
        for (int general : {0, 1, 2, 3}) {
          // The table's tile per score transform, and deterministic mode's where it differs
          // (FLASHPORT_HOPPER_BWD_PIPE's other loops are not listed).
          for (const bool deterministic : {false, true}) {
            const Tile t = launch_tile(d, general, dq_knob, -1, 0, deterministic);
            if (general == 3 && !dropout_fits(d, t.dq_mode)) continue;
            for (int order_knob : {0, 1})  // FLASHPORT_HOPPER_BWD_ORDER's values
              add(make_spec(elem_type, d, t.dq_mode, general, t.stages, t.pipe, t.block_m,
                            order_of(d, t, general, order_knob)));
          }
          // A row-major dQ accumulator (row_major_dq: batches of many short sequences), dQ mode 0; the
          // order knob does not apply to them.
          const Tile t = launch_tile(d, general, dq_knob, -1, 0, false, true);
          if (d % 64 == 0 && (general != 3 || dropout_fits(d, t.dq_mode)))
            add(make_spec(elem_type, d, t.dq_mode, general, t.stages, t.pipe, t.block_m, kExtraDqRows));
        }
  return specs;
}

bool is_main_kernel(const jit::KernelSpec& spec) {
  return (spec.source == kNarrowSource && spec.entry == kNarrowEntry) ||
         (spec.source == kWideSource && spec.entry == kWideEntry);
}

}  // namespace flashport::cuda::hopper_bwd
