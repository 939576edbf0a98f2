// The portable backward main kernel's tile table, specs and launch (see backward.hpp).
#include "backends/cuda/sm80/backward.hpp"

#include <algorithm>
#include <string>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/sm80/backward_f32.hpp"
#include "backends/cuda/sm80/tiles.hpp"
#include "backends/cuda/variants.hpp"
#include "core/tuning.hpp"

namespace flashport::cuda {
namespace {

// Deterministic mode: the dQ accumulator slices may take this much memory beyond the first one.
constexpr long long kDeterministicScratchBudget = 1LL << 30;

/// Fragment pipelining of the main kernel's warp GEMMs (attn_bwd.cu kPipe). The unpipelined loops
/// (0) wait for every ldmatrix before its mma: the SASS is LDSM x3, HMMA x4 per k-step with nothing
/// to hide the latency at 8 warps per SM. 2 = S and dP in one loop, k-step s + 1 loaded before the
/// mma of step s, stage C pipelined the same way; 1 = separate S and dP loops; 3 = stage B too
/// (spills at d128). The exceptions are the rows where ptxas -v (CUDA 13, f16 and bf16) reports
/// spills with 2: (64, 128) d96; (64, 64) d224/d256; on sm_8x without softcap/ALiBi/dropout code
/// (32, 128) d128 and (32, 32) d256 need 1 and (64, 64) d224/d256 need 0.
int backward_pipe(int arch, const BwdTile& t, int bucket, bool general) {
  const int forced = core::tuning().bwd_pipe.get();
  if (forced >= 0) return forced;
  const bool sm8x = arch < 90;
  if (bucket == 96 && t.block_m == 64 && t.block_n == 128) return 0;
  if (bucket >= 224 && t.block_m == 64 && t.block_n == 64 && t.warps == 8) return sm8x && !general ? 0 : 1;
  if (sm8x && !general && bucket == 128 && t.block_m == 32 && t.block_n == 128) return 1;
  if (sm8x && !general && bucket == 256 && t.block_m == 32 && t.block_n == 32) return 1;
  return 2;
}

/// Q/dO buffers: 2 (the next step's tiles load during this step) where they fit in shared memory.
/// FLASHPORT_BWD_STAGES=1 forces 1; a forced 2 that does not fit falls back to 1.
int backward_stages(int arch, const BwdTile& t, int bucket) {
  if (core::tuning().bwd_stages.get() == 1) return 1;
  return bwd_smem_bytes(t.block_m, t.block_n, bucket, 2) <= limits(arch).smem_per_block ? 2 : 1;
}

bool general_forced() {
  return core::tuning().bwd_general.get();
}

const char* type_define(int elem_type) {
  return elem_type == kBF16 ? "bf16" : "f16";
}

}  // namespace

// Registers: dK and dV stay in registers for the whole CTA, 2 * block_n * bucket / (32 * warps) per
// thread; stage A holds S and dP, 2 * block_m * block_n / (32 * warps). ptxas -v (CUDA 13, sm_80 and
// sm_90a, bf16/f16) with these rows: 185-233 registers at d32/d64, 252-255 at d96, 253-254 at d128
// (191-195 with the 99 KB row), 206-255 at d160..256, 186-248 for the 4-warp rows; no spills
// anywhere. Rejected: (64, 128) at d128 (80-232 bytes of spills: dK/dV 128 + S/dP 64 registers).
// Untuned: rows chosen for no spills and for bytes moved per mma, not by measurement. Past d64 each row
// has a tile for 163 KB (sm_80/87) or 227 KB (sm_90/100) of shared memory per block, taken where it fits
// single-buffered, and one for 99 KB (sm_86/89/120).
BwdTile backward_tile(int arch, int bucket) {
  const core::BwdTileSetting forced = core::tuning().bwd_tile.get();
  if (forced.warps) return {forced.block_m, forced.block_n, forced.warps};
  const auto pick = [&](BwdTile big, BwdTile small) {
    return bwd_smem_bytes(big.block_m, big.block_n, bucket, 1) <= limits(arch).smem_per_block ? big : small;
  };
  if (bucket <= 64) return {64, 128, 8};  // 64 KB (d32) / 88 KB (d64)
  if (bucket <= 96)
    return pick({64, 128, 8},  // 112 KB; 255 registers
                {64, 64, 8});  // 70 KB
  if (bucket <= 128)
    return pick({32, 128, 8},  // 102 KB; 254 registers: same smem traffic per mma as (64, 64), half the
                               // dQ atomics and Q/dO reloads
                {64, 64, 8});  // 86 KB; 191 registers
  return pick({64, 64, 8},     // 102 KB (d160) .. 150 KB (d256)
              {32, 32, 4});    // 47 KB (d160) .. 71 KB (d256): dK/dV 80..128 registers
}

jit::KernelSpec backward_main_spec(int arch, int elem_type, int bucket, bool general) {
  const BwdTile t = backward_tile(arch, bucket);
  general = general || general_forced();
  return {"cuda/attn_bwd.cu",
          "attn_bwd",
          {{"FP_DTYPE", type_define(elem_type)},
           {"FP_HEADDIM", std::to_string(bucket)},
           {"BWD_BLOCK_M", std::to_string(t.block_m)},
           {"BWD_BLOCK_N", std::to_string(t.block_n)},
           {"BWD_WARPS", std::to_string(t.warps)},
           {"BWD_PIPE", std::to_string(backward_pipe(arch, t, bucket, general))},
           {"BWD_GENERAL", general ? "1" : "0"},
           {"BWD_QDO_STAGES", std::to_string(backward_stages(arch, t, bucket))}},
          arch};
}

std::vector<jit::KernelSpec> backward_main_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int type : {kF16, kBF16}) {
    for (int bucket : kHeadDimBuckets) {
      specs.push_back(backward_main_spec(arch, type, bucket, false));
      if (!general_forced()) specs.push_back(backward_main_spec(arch, type, bucket, true));
    }
  }
  for (jit::KernelSpec& spec : backward_f32_variants(arch)) specs.push_back(std::move(spec));
  return specs;
}

bool is_main_backward_kernel(const jit::KernelSpec& spec) {
  return spec.entry == "attn_bwd" || spec.entry == "attn_bwd_f32";
}

int backward_slices(const BwdParams& prm, int arch) {
  const AttnProblem& p = prm.p;
  const int block_n =
      p.in_type == kF32 ? backward_f32_block_n(prm) : backward_tile(arch, (int)prm.accum_ld).block_n;
  const long long key_blocks = (p.sk + block_n - 1) / block_n;
  if (!p.deterministic || key_blocks <= 0) return 1;
  // One wave of CTAs, each owning a dQ slice; fewer slices if memory is short.
  const long long ctas = p.batch * p.hk, sms = jit::device_sm_count(p.device);
  long long slices = std::min((sms + ctas - 1) / ctas, key_blocks);
  const long long slice_bytes =
      std::max(1LL, p.hq * prm.rows_total * prm.accum_ld * (long long)sizeof(float));
  slices = std::max(1LL, std::min(slices, 1 + kDeterministicScratchBudget / slice_bytes));
  return (int)slices;
}

void launch_batch_chunks(const jit::Kernel& kernel, BwdParams& prm, unsigned grid_x, unsigned grid_y,
                         unsigned threads, int smem, int arch) {
  void* args[] = {&prm};
  for_batch_chunks(prm.p.batch, arch, [&](long long b0, long long nb) {
    prm.batch_offset = (int)b0;
    jit::launch(kernel, grid_x, grid_y, (unsigned)nb, threads, smem, prm.p.stream, args);
  });
}

void launch_backward_main(BwdParams& prm, int arch) {
  const AttnProblem& p = prm.p;
  if (p.in_type == kF32) return launch_backward_f32(prm, arch);  // CUDA cores, exact fp32
  const int bucket = (int)prm.accum_ld;
  const BwdTile tile = backward_tile(arch, bucket);
  const long long key_blocks = (p.sk + tile.block_n - 1) / tile.block_n;
  if (key_blocks <= 0) return;
  // Deterministic mode: one CTA per slice, visiting key blocks x, x + num_slices, ...
  const unsigned grid_x = (unsigned)(p.deterministic ? prm.num_slices : key_blocks);
  const int smem = bwd_smem_bytes(tile.block_m, tile.block_n, bucket, backward_stages(arch, tile, bucket));
  const bool general = p.softcap != 0.0f || p.alibi != nullptr || p.dropout_p > 0.0f;
  const jit::Kernel& main =
      cached_kernel(backward_main_spec, p.device, smem, arch, p.in_type, bucket, general);
  launch_batch_chunks(main, prm, grid_x, (unsigned)p.hk, 32u * (unsigned)tile.warps, smem, arch);
}

}  // namespace flashport::cuda
