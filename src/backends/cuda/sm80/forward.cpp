// Launchers of the CUDA forward-side kernels (see forward.hpp).
#include "backends/cuda/sm80/forward.hpp"

#include <algorithm>
#include <span>
#include <string>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/index_check.hpp"
#include "backends/cuda/operand_align.hpp"
#include "backends/cuda/sm80/forward_f32.hpp"
#include "backends/cuda/sm80/tiles.hpp"
#include "backends/cuda/variants.hpp"
#include "core/split_plan.h"
#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "flashport/tensor.hpp"
#include "jit/jit.hpp"
#include "kernels/cuda/attn_fwd_params.cuh"
#include "kernels/cuda/kvcache_params.cuh"

namespace flashport::cuda {
namespace {

using core::heuristic_splits;  // FlashAttention-2's rule, shared with the HIP launcher
using core::kMaxSplits;        // split_combine.cu's shared-memory weight table

// Forward-side launches overlap their predecessors (jit::LaunchOrder): a decode call's index check, attention
// and split combine then pay one launch gap, not three (H200, batch 1: +10-21% K/V bytes per second at 1k
// context, +9% at 8k; docs/PERF.md).
constexpr jit::LaunchOrder kOverlap = jit::LaunchOrder::overlap_prior;
constexpr int kAuxRowsPerBlock = 4;  // kv_append / rotate_q / merge / combine: one warp per row
constexpr unsigned kAuxThreads = 32 * kAuxRowsPerBlock;

int device_of(const void* ptr, const char* arg) {
  const int device = jit::pointer_device(ptr);
  if (device < 0) throw Error(arg, "is not a CUDA device pointer");
  return device;
}

int vec_flags(const AttnProblem& p) {
  return (rows_aligned(p.q) ? kVecQ : 0) | (rows_aligned(p.k) ? kVecK : 0) | (rows_aligned(p.v) ? kVecV : 0) |
         (rows_aligned(p.o) ? kVecO : 0);
}

void launch_aux(jit::KernelSpec (*spec)(int), int device, long long rows, void* stream, void* params) {
  if (rows <= 0) return;
  const jit::Kernel& kernel = cached_kernel(spec, device, 0, jit::device_arch(device));
  void* args[] = {params};
  const long long blocks = (rows + kAuxRowsPerBlock - 1) / kAuxRowsPerBlock;
  jit::launch(kernel, (unsigned)blocks, 1, 1, kAuxThreads, 0, stream, args, 1, kOverlap);
}

/// How a forward call is launched: tile, GQA packing, grid and split count.
struct FwdGeometry {
  int arch, bucket;
  FwdTile tile;
  int pack_gqa;        // 1, or hq / hk (see RowMap in attn_fwd.cuh)
  long long m_blocks;  // grid x
  long long heads;     // grid y: query heads, or kv heads when packing
  int splits;
  int decode_mode;  // FLASHPORT_DECODE's shape choice for the decode variant (decode_tile), 0: default
};

/// Where decode_cluster_spec exists (forward_variants lists it): sm_90+, the 2-byte types, the twelve-warp
/// buckets, and 2..8 splits (the portable cluster size; more keep the scratch and split_combine: clusters
/// of 16, a non-portable size, ran 20-22% slower at batch 1 x 4k-8k on the H100, docs/PERF.md).
bool decode_cluster_fits(int arch, int in_type, int bucket, int splits) {
  return arch >= 90 && (in_type == kF16 || in_type == kBF16) && bucket <= 128 && splits >= 2 && splits <= 8;
}

}  // namespace

bool decode_sized(const AttnProblem& p) {
  const long long group = gqa_group(p);
  return (group > 1 ? p.sq * group : p.sq) <= 16;
}

namespace {

FwdGeometry fwd_geometry(const AttnProblem& p, int num_splits, int device) {
  FwdGeometry g{};
  g.arch = jit::device_arch(device);
  g.bucket = is_fp8_elem(p.in_type) ? coarse_head_dim_bucket(p.d, p.dv) : head_dim_bucket(p.d, p.dv);
  // Decode-like calls whose rows (GQA heads packed in) fit one 16-row fragment take the decode
  // variant: its warps split the keys instead of the rows, where the row-split kernel would leave all
  // but one warp idle and stream K/V at a fraction of the copy rate.
  const int decode_mode = core::tuning().decode_variant.get();  // 0 off, 1 default, 2..9 shapes
  const bool decode = decode_sized(p) && decode_mode > 0;
  g.decode_mode = decode_mode >= 2 ? decode_mode : 0;
  g.tile = decode ? decode_tile(g.arch, g.bucket, g.decode_mode) : fwd_tile(g.arch, g.bucket);
  const long long bm = g.tile.block_m;
  g.pack_gqa = (int)gqa_pack(p, bm);  // see core/problem.h
  g.m_blocks = (p.sq * g.pack_gqa + bm - 1) / bm;
  g.heads = g.pack_gqa > 1 ? p.hk : p.hq;
  // Unsplit grids that give every SM two six-warp CTAs at once take that shape (mode 6) over one
  // twelve-warp CTA: a CTA's prologue and merge then overlap the other's streaming, which pays where each
  // CTA runs only a few rounds. H100, 32/8 heads, d 128, GB/s (two rounds each): b 128 x 1k 2,576 against
  // 2,481-2,494 dense, 2,514-2,519 against 2,374-2,378 paged16; b 128 x 8k 2,956 against 2,949-2,956;
  // b 8 x 32k (split) 2,810-2,818 against 2,842-2,846, so split grids keep twelve warps.
  if (decode && g.decode_mode == 0) {
    const FwdTile pair = decode_tile(g.arch, g.bucket, 6);
    const long long pair_slots =
        (long long)jit::device_sm_count(device) * decode_ctas_per_sm(g.arch, pair, g.bucket);
    if (pair.min_blocks > 1 && g.m_blocks * g.heads * p.batch >= pair_slots) g.tile = pair, g.decode_mode = 6;
  }
  g.splits = 1;
  if (num_splits == 1 || p.cu_seqlens_q || p.sq <= 0 || p.sk <= 0) return g;
  const long long key_tiles = (p.sk + g.tile.block_n - 1) / g.tile.block_n;
  // The decode variant: a split's unit of work is a round of one tile per warp, and CTAs small enough
  // to share an SM (shared memory and registers) count as that many slots per SM.
  const int slots =
      jit::device_sm_count(device) * (decode ? decode_ctas_per_sm(g.arch, g.tile, g.bucket) : 1);
  const long long rounds = decode ? (key_tiles + g.tile.warps - 1) / g.tile.warps : key_tiles;
  const long long ctas = g.m_blocks * g.heads * p.batch;
  // The decode variant takes the most splits that keep the grid in one wave of slots: every CTA streams
  // its share at once, and fewer tiles per CTA shorten its serial load chain. FlashAttention-2's rule (the
  // smallest count within 85% of the best wave efficiency) counts work in rounds of one tile per warp and
  // left SMs idle: H200, one token, 32/8 heads, d 128, batch 1, attention kernel alone (torch.profiler):
  // 15 splits (the rule) 42.5 us at 32k and 143.5 us at 128k; 16 (one wave of 128 CTAs) 39.5 and 135.3;
  // 24 and 32 (a second, partial wave) 51.1 / 45.5 and 165.3 / 139.6. With this rule, in a later run: 39.2
  // and 135.1 us (15 forced: 41.8 and 143.4).
  const long long one_wave = decode && key_tiles >= 4 && ctas < slots ? std::min(slots / ctas, rounds) : 0;
  long long splits = num_splits > 1 ? num_splits
                     : one_wave > 0 ? one_wave
                                    : heuristic_splits(ctas, slots, rounds);
  splits = std::min<long long>({splits, (long long)kMaxSplits, key_tiles});
  if (p.batch * splits > limits(g.arch).max_grid_yz) splits = 1;
  // Where the one-wave rule asks for more splits than a cluster holds but each would stream only a few
  // rounds, eight splits merged in a cluster beat the rule's 9-16 through scratch and split_combine: H100,
  // one token, 32/8 heads, d 128, GB/s, rule / 8 clustered (two rounds): 1 x 2k 443 / 480-504, 4k 707-710
  // / 784-800, 8k 1050 / 1071-1078 (43 rounds); 16k 1434 / 1434-1438, 32k 1915 / 1780-1787, where the
  // rule's extra SMs win. Only where the eight splits keep as many CTAs streaming as measured (8 kv heads).
  const bool cluster_on =
      decode && g.decode_mode == 0 && core::tuning().decode_cluster.get() && g.m_blocks == 1;
  if (num_splits == 0 && cluster_on && splits > 8 && rounds <= 48 && ctas * 8 >= 64 &&
      decode_cluster_fits(g.arch, p.in_type, g.bucket, 8))
    splits = 8;
  g.splits = (int)std::max<long long>(splits, 1);
  // Split grids merged in a cluster skip the scratch and the split_combine launch: H100, one token, 32/8
  // heads, d 128, per call 18.3-18.5 -> 15.9-16.0 us at batch 1 x 1k (6 splits), 33.2-33.5 -> 30.5-30.6 at
  // 8 x 1k (2 splits); calls of one split or more than 8 are unchanged (docs/PERF.md).
  g.tile.cluster = cluster_on && decode_cluster_fits(g.arch, p.in_type, g.bucket, g.splits);
  return g;
}

}  // namespace

std::vector<jit::KernelSpec> forward_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int type : {kF16, kBF16})
    for (int bucket : kHeadDimBuckets) specs.push_back(forward_spec(arch, type, bucket));
  for (int bucket : kCoarseHeadDimBuckets) specs.push_back(forward_spec(arch, kE4M3, bucket));
  for (int type : {kF16, kBF16})
    for (int bucket : kHeadDimBuckets) specs.push_back(decode_spec(arch, type, bucket, 0));
  for (int bucket : kCoarseHeadDimBuckets) specs.push_back(decode_spec(arch, kE4M3, bucket, 0));
  // The default's two-CTA shape (mode 6, fwd_geometry) where it exists, for every type it may meet.
  for (int type : {kF16, kBF16, kE4M3})
    for (int bucket : is_fp8_elem(type) ? std::span<const int>(kCoarseHeadDimBuckets)
                                        : std::span<const int>(kHeadDimBuckets))
      if (decode_tile(arch, bucket, 6).min_blocks > 1) specs.push_back(decode_spec(arch, type, bucket, 6));
  // FLASHPORT_DECODE=4's four-warp shape (the default before) and 5's eight-warp one, where they differ
  // from the default (d <= 128): compiled by CI's variant check like the rest, so choosing one cannot meet
  // a kernel that does not build. The timing shapes 7-9 (three CTAs per SM, bulk row copies): bf16 only,
  // the 2-byte types sharing every line of them.
  // A mode whose shape equals an earlier one's (bulk modes off sm_90) adds nothing.
  const auto is_new = [&](int bucket, int mode) {
    for (int m : {0, 4, 5, 6, 7, 8})
      if (m < mode && decode_tile(arch, bucket, m) == decode_tile(arch, bucket, mode)) return false;
    return true;
  };
  for (int mode : {4, 5, 7, 8, 9})
    for (int type : {kF16, kBF16})
      for (int bucket : kHeadDimBuckets)
        if ((mode <= 5 || type == kBF16) && is_new(bucket, mode))
          specs.push_back(decode_spec(arch, type, bucket, mode));
  for (int type : {kF16, kBF16})
    for (int bucket : kHeadDimBuckets)
      if (decode_cluster_fits(arch, type, bucket, 2))
        specs.push_back(decode_cluster_spec(arch, type, bucket));
  for (jit::KernelSpec& spec : forward_f32_variants(arch)) specs.push_back(std::move(spec));
  return specs;
}

bool is_main_forward_kernel(const jit::KernelSpec& spec) {
  return spec.entry == "attn_fwd" || spec.entry == "attn_fwd_f32";
}

int forward_num_splits(const AttnProblem& p, int num_splits) {
  return p.in_type == kF32 ? 1 : fwd_geometry(p, num_splits, p.device).splits;
}

void launch_forward(const AttnProblem& p, int num_splits, int check_call) {
  const bool runs = p.in_type != kF32 && p.batch > 0 && p.hq > 0 && p.sq > 0;
  const int device = p.device;
  const FwdGeometry geo = runs ? fwd_geometry(p, num_splits, device) : FwdGeometry{};
  // The decode variant checks its sequences' rules and block-table entries itself (report_decode_faults);
  // anything else gets index_check.cu first.
  FaultRecord* const in_kernel = check_call >= 0 && geo.tile.decode ? in_kernel_fault_record(p) : nullptr;
  if (check_call >= 0 && !in_kernel) check_indices_async(p, static_cast<IndexCallKind>(check_call));
  if (p.in_type == kF32) return launch_forward_f32(p);  // CUDA cores, exact fp32; never split
  if (!runs) return;
  if (p.hq > limits(geo.arch).max_grid_yz)
    throw Error("q", "more than 65535 heads are not supported on CUDA");
  const int smem = fwd_smem_bytes(geo.tile, geo.bucket);
  // Every fp8 format shares one variant (the decode is picked from p.in_type in the kernel): one key.
  const int elem = is_fp8_elem(p.in_type) ? (int)kE4M3 : p.in_type;
  const jit::Kernel& kernel =
      geo.tile.cluster ? cached_kernel(decode_cluster_spec, device, smem, geo.arch, elem, geo.bucket)
      : geo.tile.decode
          ? cached_kernel(decode_spec, device, smem, geo.arch, elem, geo.bucket, geo.decode_mode)
          : cached_kernel(forward_spec, device, smem, geo.arch, elem, geo.bucket);

  FwdParams prm{};
  prm.p = p;
  prm.vec = vec_flags(p);
  prm.num_splits = geo.splits;
  prm.pack_gqa = geo.pack_gqa;
  prm.fault_record = in_kernel, prm.fault_call = check_call;
  const unsigned threads = 32u * (unsigned)geo.tile.warps;
  const unsigned gx = (unsigned)geo.m_blocks, gy = (unsigned)geo.heads;
  void* args[] = {&prm};
  if (prm.num_splits == 1) {
    for_batch_chunks(p.batch, geo.arch, [&](long long b0, long long nb) {
      prm.batch_offset = b0;
      jit::launch(kernel, gx, gy, (unsigned)nb, threads, smem, p.stream, args, 1, kOverlap);
    });
    return;
  }
  if (geo.tile.cluster) {  // splits on grid x, one cluster each, merged in the kernel (cluster_finish)
    prm.batch_offset = 0;
    jit::launch(kernel, (unsigned)prm.num_splits, gy, (unsigned)p.batch, threads, smem, p.stream, args,
                (unsigned)prm.num_splits, kOverlap);
    return;
  }
  // Split-KV: fp32 partials in stream-ordered scratch, merged by split_combine on the same stream.
  const long long rows = p.batch * p.hq * p.sq;
  const size_t o_bytes = (size_t)(prm.num_splits * rows * p.dv) * sizeof(float);
  const size_t lse_bytes = (size_t)(prm.num_splits * rows) * sizeof(float);
  jit::AsyncScratch ws(o_bytes + lse_bytes, p.stream);
  prm.o_partial = reinterpret_cast<float*>(ws.bytes());
  prm.lse_partial = reinterpret_cast<float*>(ws.bytes() + o_bytes);
  prm.batch_offset = 0;
  jit::launch(kernel, gx, gy, (unsigned)(p.batch * prm.num_splits), threads, smem, p.stream, args, 1,
              kOverlap);
  launch_aux(split_combine_spec, device, rows, p.stream, &prm);
  ws.free();
}

void launch_forward_kvcache(const core::KvCacheProblem& kp,
                            const std::function<void(const AttnProblem&)>& attend) {
  const AttnProblem& a = kp.attn;
  const int device = a.device;
  KvAppendParams prm = core::append_params(kp);
  if (kp.k_new.ptr && kp.s_new > 0)
    launch_aux(kv_append_spec, device, a.batch * kp.s_new * a.hk, a.stream, &prm);
  if (kp.rotary_dim <= 0 || !kp.cache_seqlens) {
    attend(a);
    return;
  }
  // q rotated at its cache positions into a dense (b, sq, hq, d) scratch that the attention reads.
  const long long q_rows = a.batch * a.sq * a.hq;
  if (q_rows <= 0) return;
  const size_t elem_bytes = (size_t)dtype_size(static_cast<DType>(a.in_type));
  jit::AsyncScratch q_rot((size_t)(q_rows * a.d) * elem_bytes, a.stream);
  prm.q_rot = q_rot.bytes();
  launch_aux(rotate_q_spec, device, q_rows, a.stream, &prm);
  AttnProblem rotated = a;
  rotated.q = {q_rot.bytes(), a.sq * a.hq * a.d, a.hq * a.d, a.d};
  attend(rotated);
  q_rot.free();
}

void launch_merge_states(const core::MergeProblem& mp) {
  const int device = device_of(mp.out.ptr, "out");
  MergeParams prm = core::merge_params(mp);
  launch_aux(merge_states_spec, device, mp.batch * mp.heads * mp.seqlen, mp.stream, &prm);
}

}  // namespace flashport::cuda
