// The Hopper forward launcher: which problems the sm_90a kernel takes, its TMA tensor maps (tma_map.hpp),
// its kernel specs, and the launch.
#include "backends/cuda/hopper_fwd.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/tma_map.hpp"
#include "flashport/error.hpp"
#include "kernels/cuda/hopper/fwd_sm90_config.h"

namespace flashport::cuda::hopper {
namespace {

constexpr const char* kSource = "cuda/hopper/attn_fwd_sm90.cu";
constexpr const char* kEntry = "flashport_attn_fwd_sm90";
constexpr int kHeadDims[] = {64, 96, 128, 192, 256};
constexpr long long kMaxGridYZ = 65535;

constexpr bool tile_table_fits() {
  for (int d : kHeadDims) {
    const Tile t = tile_for(d);
    if (t.block_m != kBlockM || t.block_n % 16 != 0 || t.block_n > 256 || t.stages < 2) return false;
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
};

/// Whether the kernel of `shape` stages O in a buffer of its own (FP_PERSISTENT=2 where it fits).
bool separate_o(int d, const Shape& shape) {
  return shape.persistent == 2 && separate_o_fits(d, shape.tile);
}

constexpr bool shape_fits(int d, Shape s) {
  const Tile t = s.tile;
  return t.block_m == kBlockM && t.block_n >= 16 && t.block_n <= 256 && t.block_n % 16 == 0 &&
         t.stages >= 2 && t.stages <= 8 && smem_bytes(d, t) <= kSmemLimit && s.exp_emu >= 0 && s.exp_emu <= 8;
}

/// Timing alternatives, compiled by variants() so CI checks them for spills (ptxas, CUDA 13: none
/// spill, consumer peaks <= R235 of 240). Selected only through FLASHPORT_HOPPER_TILE.
struct Alternative {
  int d;
  Shape shape;
};
constexpr Alternative kAlternatives[] = {
    {64, {{kBlockM, 128, 2}, 0}},  {64, {{kBlockM, 128, 3}, 0}},  {64, {{kBlockM, 128, 2}, 2}},
    {64, {{kBlockM, 128, 2}, 3}},  {64, {{kBlockM, 192, 2}, 2}},  {128, {{kBlockM, 176, 2}, 0}},
    {128, {{kBlockM, 128, 3}, 0}}, {128, {{kBlockM, 128, 2}, 1}},
};

constexpr bool alternatives_fit() {
  for (const Alternative& a : kAlternatives)
    if (!shape_fits(a.d, a.shape)) return false;
  return true;
}
static_assert(alternatives_fit(), "a Hopper timing alternative breaks the kernel's limits");

/// FLASHPORT_HOPPER_TILE="d:block_n:stages[:exp_emu][,...]" (e.g. "64:192:2,128:176:2:0") replaces
/// the shape of the named head dims; parsed once; malformed entries or shapes over the kernel's
/// limits are ignored (the table's shape stays). For timing variants in one process.
Shape shape_for(int d) {
  static const std::array<Shape, 5> shapes = [] {
    std::array<Shape, 5> r{};
    for (int i = 0; i < 5; ++i) r[i] = {tile_for(kHeadDims[i]), 0};
    const char* env = std::getenv("FLASHPORT_HOPPER_TILE");
    for (const char* s = env; s && *s;) {
      int hd = 0, bn = 0, st = 0, emu = 0;
      const int got = std::sscanf(s, "%d:%d:%d:%d", &hd, &bn, &st, &emu);
      if (got >= 3) {
        const Shape shape{{kBlockM, bn, st}, got >= 4 ? emu : 0};
        for (int i = 0; i < 5; ++i)
          if (kHeadDims[i] == hd && shape_fits(hd, shape)) r[i] = shape;
      }
      const char* comma = std::strchr(s, ',');
      s = comma ? comma + 1 : nullptr;
    }
    return r;
  }();
  for (int i = 0; i < 5; ++i)
    if (kHeadDims[i] == d) return shapes[i];
  return {tile_for(d), 0};
}

/// FLASHPORT_HOPPER_PERSISTENT=1|2 (read once) selects the persistent kernel (2: with O staged apart
/// from Q where it fits, d <= 128) for every head dim but 256, whose persistent build spills 8 bytes
/// (a per-block counter, outside the key loop). 0 otherwise.
int persistent_for(int d) {
  static const int mode = [] {
    const char* env = std::getenv("FLASHPORT_HOPPER_PERSISTENT");
    return env && (env[0] == '1' || env[0] == '2') && env[1] == 0 ? env[0] - '0' : 0;
  }();
  return d == 256 ? 0 : mode;
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
  return spec;
}

struct Plans {
  MapPlan q, k, v;
};

/// Tensor-map plans of q, k, v for `p` (varlen: one batch of total rows; coordinates start at
/// cu_seqlens[b]). Sets `error` on the first failure.
Plans plan_maps(const AttnProblem& p, std::string& error) {
  const Tile tile = shape_for((int)p.d).tile;
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  const long long q_rows = varlen_q ? p.total_q : p.sq;
  const long long k_rows = varlen_k ? p.total_k : p.sk;
  Plans plans;
  plans.q = plan_map("q", p.q, p.d, p.hq, q_rows, varlen_q ? 1 : p.batch, tile.block_m);
  plans.k = plan_map("k", p.k, p.d, p.hk, k_rows, varlen_k ? 1 : p.batch, tile.block_n);
  plans.v = plan_map("v", p.v, p.dv, p.hk, k_rows, varlen_k ? 1 : p.batch, tile.block_n);
  for (const MapPlan* m : {&plans.q, &plans.k, &plans.v}) {
    if (error.empty() && !m->error.empty()) error = m->error;
  }
  return plans;
}

}  // namespace

std::string unsupported(const AttnProblem& p, int arch) {
  if (arch != 90) return "the Hopper kernel needs compute capability 9.0, got " + std::to_string(arch);
  if (p.in_type != kF16 && p.in_type != kBF16) return "the Hopper kernel takes fp16/bf16 inputs";
  if (p.out_type != p.in_type) return "the Hopper kernel writes out in the input dtype";
  if (p.d != p.dv) return "the Hopper kernel needs d == dv";
  if (!supported_head_dim(p.d)) return "the Hopper kernel takes head dims 64, 96, 128, 192, 256";
  if (p.dropout_p > 0.0f) return "dropout runs on the portable kernel";
  if (p.block_table) return "paged K/V runs on the portable kernel";
  if (p.leftpad_k || p.kv_batch_idx) return "kv-cache layouts run on the portable kernel";
  if (p.s_dmask) return "s_dmask is produced by the CPU reference only";
  if (!(p.scale > 0.0f)) return "the Hopper kernel needs a positive softmax scale";
  if (p.hq > kMaxGridYZ || p.batch > kMaxGridYZ) return "more than 65535 heads or sequences";
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr)) return "varlen needs cu_seqlens_q and _k";
  if (!aligned16(p.q.ptr) || !aligned16(p.k.ptr) || !aligned16(p.v.ptr) || !aligned16(p.o.ptr))
    return "the Hopper kernel needs 16-byte aligned q, k, v, out";
  if (p.o.row_stride % 8 != 0 || p.o.head_stride % 8 != 0 || p.o.batch_stride % 8 != 0)
    return "the Hopper kernel needs out strides in multiples of 8 elements";
  std::string error;
  plan_maps(p, error);
  return error;
}

void forward(const AttnProblem& p) {
  if (const std::string why = unsupported(p, 90); !why.empty()) throw Error("q", why);
  if (p.batch <= 0 || p.hq <= 0 || p.sq <= 0) return;
  const int d = (int)p.d;
  Shape shape = shape_for(d);
  const Tile tile = shape.tile;
  const long long m_blocks = (p.sq + tile.block_m - 1) / tile.block_m;
  const long long blocks = m_blocks * p.hq * p.batch;
  shape.persistent = blocks < (1LL << 30) ? persistent_for(d) : 0;  // the kernel counts blocks in int
  const int smem = smem_bytes(d, tile, separate_o(d, shape));
  std::string error;
  const Plans plans = plan_maps(p, error);
  const long long q_rows = p.cu_seqlens_q ? p.total_q : p.sq;
  const long long k_rows = p.cu_seqlens_k ? p.total_k : p.sk;
  FwdSm90Params prm{};
  prm.p = p;
  prm.dims_q = plans.q.pos;
  prm.dims_k = plans.k.pos;
  prm.dims_v = plans.v.pos;
  TmaDesc tma_q = encode("q", plans.q, p.in_type, p.q.ptr, q_rows);
  TmaDesc tma_k = encode("k", plans.k, p.in_type, p.k.ptr, k_rows);
  TmaDesc tma_v = encode("v", plans.v, p.in_type, p.v.ptr, k_rows);

  const int device = jit::pointer_device(p.q.ptr);
  if (device < 0) throw Error("q", "is not a CUDA device pointer");
  const jit::Kernel& kernel = jit::get(make_spec(p.in_type, d, shape), device, smem);
  void* args[] = {&prm, &tma_q, &tma_k, &tma_v};
  if (shape.persistent) {
    const long long ctas = std::min<long long>(blocks, jit::device_sm_count(device));
    jit::launch(kernel, (unsigned)ctas, 1, 1, kThreads, smem, p.stream, args);
  } else {
    jit::launch(kernel, (unsigned)m_blocks, (unsigned)p.hq, (unsigned)p.batch, kThreads, smem, p.stream,
                args);
  }
}

std::vector<jit::KernelSpec> variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  if (arch != 90) return specs;
  for (int elem_type : {(int)kF16, (int)kBF16}) {
    for (int d : kHeadDims) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0}));
    for (int d : kHeadDims)
      if (d != 256) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0, 1}));
    for (int d : kHeadDims)
      if (separate_o_fits(d, tile_for(d))) specs.push_back(make_spec(elem_type, d, {tile_for(d), 0, 2}));
    for (const Alternative& a : kAlternatives) specs.push_back(make_spec(elem_type, a.d, a.shape));
  }
  return specs;
}

bool is_main_kernel(const jit::KernelSpec& spec) {
  return spec.source == kSource && spec.entry == kEntry;
}

}  // namespace flashport::cuda::hopper
