// Launcher of the CUDA backward: D = rowsum(dO * O), the main kernel (Hopper's where it applies, else the
// FA2-style portable one), dQ conversion (see backward.hpp).
#include "backends/cuda/backward.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/hopper_bwd.hpp"
#include "backends/cuda/tiles.hpp"
#include "backends/cuda/variants.hpp"
#include "flashport/error.hpp"
#include "kernels/cuda/bwd_params.cuh"

namespace flashport::cuda {
namespace {

constexpr long long kMaxGridYZ = 65535;
constexpr int kAuxRows = 16;  // rows per CTA of the aux kernels (attn_bwd_aux.cu: 4 warps x 4 rows)
constexpr unsigned kAuxThreads = 128;
// Deterministic mode: the dQ accumulator slices may take this much memory beyond the first one.
constexpr long long kDeterministicScratchBudget = 1LL << 30;

const char* type_define(int elem_type) {
  return elem_type == kBF16 ? "bf16" : "f16";
}

/// 16-byte row alignment of an operand: base pointer and every stride in whole 8-element chunks.
bool rows_aligned(const Operand& t) {
  return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.batch_stride % 8 == 0 && t.row_stride % 8 == 0 &&
         t.head_stride % 8 == 0;
}

bool all_rows_aligned(const AttnProblem& p) {
  for (const Operand* t : {&p.q, &p.k, &p.v, &p.o, &p.dout, &p.grad_q, &p.grad_k, &p.grad_v})
    if (!rows_aligned(*t)) return false;
  return true;
}

/// FLASHPORT_BWD_TILE="block_m,block_n,warps", parsed once; {0, 0, 0} when unset or malformed.
BwdTile tile_override() {
  static const BwdTile t = [] {
    BwdTile r{0, 0, 0};
    const char* s = std::getenv("FLASHPORT_BWD_TILE");
    if (!s || std::sscanf(s, "%d,%d,%d", &r.block_m, &r.block_n, &r.warps) != 3) return BwdTile{0, 0, 0};
    const bool ok = r.block_m > 0 && r.block_m % 16 == 0 && r.block_n > 0 && r.block_n % 16 == 0 &&
                    (r.warps == 4 || r.warps == 8);
    return ok ? r : BwdTile{0, 0, 0};
  }();
  return t;
}

/// FLASHPORT_BWD_PIPE=0..3 (attn_bwd.cu kPipe), parsed once; -1 when unset or malformed.
int pipe_override() {
  static const int v = [] {
    const char* s = std::getenv("FLASHPORT_BWD_PIPE");
    return s && s[0] >= '0' && s[0] <= '3' && s[1] == 0 ? s[0] - '0' : -1;
  }();
  return v;
}

/// Fragment pipelining of the main kernel's warp GEMMs (attn_bwd.cu kPipe). The unpipelined loops
/// (0) wait for every ldmatrix before its mma: the SASS is LDSM x3, HMMA x4 per k-step with nothing
/// to hide the latency at 8 warps per SM. 2 = S and dP in one loop, k-step s + 1 loaded before the
/// mma of step s, stage C pipelined the same way; 1 = separate S and dP loops; 3 = stage B too
/// (spills at d128). The exceptions are the rows where ptxas -v (CUDA 13, f16 and bf16) reports
/// spills with 2: (64, 128) d96; (64, 64) d224/d256; on sm_8x without softcap/ALiBi/dropout code
/// (32, 128) d128 and (32, 32) d256 need 1 and (64, 64) d224/d256 need 0.
int backward_pipe(int arch, const BwdTile& t, int bucket, bool general) {
  const int forced = pipe_override();
  if (forced >= 0) return forced;
  const bool sm8x = arch < 90;
  if (bucket == 96 && t.block_m == 64 && t.block_n == 128) return 0;
  if (bucket >= 224 && t.block_m == 64 && t.block_n == 64 && t.warps == 8) return sm8x && !general ? 0 : 1;
  if (sm8x && !general && bucket == 128 && t.block_m == 32 && t.block_n == 128) return 1;
  if (sm8x && !general && bucket == 256 && t.block_m == 32 && t.block_n == 32) return 1;
  return 2;
}

/// FLASHPORT_BWD_STAGES=1|2 (Q/dO buffers, attn_bwd.cu kStages), parsed once; 0 when unset or malformed.
int stages_override() {
  static const int v = [] {
    const char* s = std::getenv("FLASHPORT_BWD_STAGES");
    return s && (s[0] == '1' || s[0] == '2') && s[1] == 0 ? s[0] - '0' : 0;
  }();
  return v;
}

/// Shared memory per block the launcher may ask for: 227 KB (sm_90/100), 163 KB (sm_80/87), else 99 KB.
int smem_limit(int arch) {
  if (arch == 90 || arch == 100 || arch == 103 || arch == 110) return 227 * 1024;
  if (arch == 80 || arch == 87) return 163 * 1024;
  return 99 * 1024;
}

/// Q/dO buffers: 2 (the next step's tiles load during this step) where they fit in shared memory.
/// A forced 2 that does not fit falls back to 1.
int backward_stages(int arch, const BwdTile& t, int bucket) {
  const int forced = stages_override();
  const bool fits = bwd_smem_bytes(t.block_m, t.block_n, bucket, 2) <= smem_limit(arch);
  if (forced == 1) return 1;
  return fits ? 2 : 1;
}

/// FLASHPORT_BWD_GENERAL=1: always the kernel with softcap / ALiBi / dropout code (for comparing).
bool general_forced() {
  static const bool v = [] {
    const char* s = std::getenv("FLASHPORT_BWD_GENERAL");
    return s && s[0] == '1';
  }();
  return v;
}

/// FLASHPORT_CUDA_BACKWARD=portable|hopper (read once) forces one main kernel where it applies; unset:
/// the Hopper kernel on sm_90 for every call it covers (hopper_bwd::unsupported), the portable one else.
bool use_hopper_backward(const AttnProblem& p, int arch) {
  static const std::string forced = [] {
    const char* s = std::getenv("FLASHPORT_CUDA_BACKWARD");
    return std::string(s ? s : "");
  }();
  return forced != "portable" && hopper_bwd::unsupported(p, arch).empty();
}

void launch_chunked(const jit::Kernel& kernel, BwdParams& prm, unsigned grid_x, unsigned grid_y,
                    unsigned threads, int smem, void* stream) {
  void* args[] = {&prm};
  for (long long b0 = 0; b0 < prm.p.batch; b0 += kMaxGridYZ) {
    prm.batch_offset = (int)b0;
    const long long nb = std::min(kMaxGridYZ, prm.p.batch - b0);
    jit::launch(kernel, grid_x, grid_y, (unsigned)nb, threads, smem, stream, args);
  }
}

}  // namespace

// Registers: dK and dV stay in registers for the whole CTA, 2 * block_n * bucket / (32 * warps) per
// thread; stage A holds S and dP, 2 * block_m * block_n / (32 * warps). ptxas -v (CUDA 13, sm_80 and
// sm_90a, bf16/f16) with these rows: 185-233 registers at d32/d64, 252-255 at d96, 253-254 at d128
// (191-195 with the 99 KB row), 206-255 at d160..256, 186-248 for the 4-warp rows; no spills
// anywhere. Rejected: (64, 128) at d128 (80-232 bytes of spills: dK/dV 128 + S/dP 64 registers).
// Untuned: rows chosen for no spills and for bytes moved per mma, not by measurement.
BwdTile backward_tile(int arch, int bucket) {
  const BwdTile forced = tile_override();
  if (forced.warps) return forced;
  // 163 KB (sm_80/87) or 227 KB (sm_90/100) per block; sm_86/89/120 have 99 KB.
  const bool big_smem = arch == 80 || arch == 87 || arch == 90 || arch == 100 || arch == 103 || arch == 110;
  if (bucket <= 64) return {64, 128, 8};  // 64 KB (d32) / 88 KB (d64)
  if (bucket <= 96)
    return big_smem ? BwdTile{64, 128, 8}  // 112 KB; 255 registers
                    : BwdTile{64, 64, 8};  // 70 KB
  if (bucket <= 128)
    return big_smem ? BwdTile{32, 128, 8}  // 102 KB; 254 registers: same smem traffic per mma as
                                           // (64, 64), half the dQ atomics and Q/dO reloads
                    : BwdTile{64, 64, 8};  // 86 KB; 191 registers
  if (big_smem) return {64, 64, 8};        // 102 KB (d160) .. 150 KB (d256)
  return {32, 32, 4};                      // 47 KB (d160) .. 71 KB (d256): dK/dV 80..128 registers
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

jit::KernelSpec backward_dot_spec(int arch, int elem_type) {
  return {"cuda/attn_bwd_aux.cu", "attn_bwd_dot_do_o", {{"FP_DTYPE", type_define(elem_type)}}, arch};
}

jit::KernelSpec backward_convert_spec(int arch, int elem_type) {
  return {"cuda/attn_bwd_aux.cu", "attn_bwd_dq_convert", {{"FP_DTYPE", type_define(elem_type)}}, arch};
}

std::vector<jit::KernelSpec> backward_variants(int arch) {
  std::vector<jit::KernelSpec> specs;
  for (int type : {kF16, kBF16}) {
    for (int bucket : kHeadDimBuckets) {
      specs.push_back(backward_main_spec(arch, type, bucket, false));
      if (!general_forced()) specs.push_back(backward_main_spec(arch, type, bucket, true));
    }
    specs.push_back(backward_dot_spec(arch, type));
    specs.push_back(backward_convert_spec(arch, type));
  }
  return specs;
}

bool is_main_backward_kernel(const jit::KernelSpec& spec) {
  return spec.entry == "attn_bwd";
}

void launch_backward(const AttnProblem& p) {
  if (p.batch <= 0 || p.hq <= 0) return;
  if (p.sq >= (1LL << 30) || p.sk >= (1LL << 30))
    throw Error("q", "the CUDA backward needs sequence lengths < 2^30 (32-bit positions)");
  if (p.hq > kMaxGridYZ) throw Error("q", "more than 65535 heads are not supported on CUDA");
  const int device = p.device;
  const int arch = jit::device_arch(device);
  const int bucket = head_dim_bucket(p.d, p.dv);
  const BwdTile tile = backward_tile(arch, bucket);

  const bool hopper = use_hopper_backward(p, arch);
  BwdParams prm{};
  prm.p = p;
  prm.accum_tiled = hopper ? hopper_bwd::tiled_accumulator(p) : 0;
  prm.rows_total = prm.accum_tiled ? accum_rows_tiled(p) : accum_rows(p);
  prm.accum_ld = bucket;
  prm.vec = all_rows_aligned(p) ? 1 : 0;
  const long long key_blocks = (p.sk + tile.block_n - 1) / tile.block_n;
  const long long slice_floats = p.hq * prm.rows_total * prm.accum_ld;
  long long grid_x = key_blocks;
  prm.num_slices = 1;
  if (p.deterministic && key_blocks > 0) {
    // One wave of CTAs, each owning a dQ slice (see BwdParams); fewer slices if memory is short.
    const long long ctas = p.batch * p.hk, sms = jit::device_sm_count(device);
    long long slices = std::min((sms + ctas - 1) / ctas, key_blocks);
    const long long slice_bytes = std::max(1LL, slice_floats * (long long)sizeof(float));
    slices = std::max(1LL, std::min(slices, 1 + kDeterministicScratchBudget / slice_bytes));
    prm.num_slices = (int)slices;
    grid_x = slices;
  }

  // Scratch: D (hq * rows_total floats), then the dQ accumulator, 256-byte aligned.
  const size_t dsum_bytes = ((size_t)(p.hq * prm.rows_total) * sizeof(float) + 255) / 256 * 256;
  const size_t accum_bytes = (size_t)(prm.num_slices * slice_floats) * sizeof(float);
  char* scratch =
      static_cast<char*>(jit::alloc_async(std::max<size_t>(dsum_bytes + accum_bytes, 256), p.stream));
  prm.dsum = reinterpret_cast<float*>(scratch);
  prm.dq_accum = reinterpret_cast<float*>(scratch + dsum_bytes);
  try {
    if (accum_bytes) jit::memset_async(prm.dq_accum, 0, accum_bytes, p.stream);
    const unsigned aux_x = (unsigned)((p.sq + kAuxRows - 1) / kAuxRows);
    if (aux_x > 0) {
      const jit::Kernel& dot = cached_kernel(backward_dot_spec, device, 0, arch, p.in_type);
      launch_chunked(dot, prm, aux_x, (unsigned)p.hq, kAuxThreads, 0, p.stream);
    }
    if (grid_x > 0 && hopper) {
      hopper_bwd::launch_main(prm);
    } else if (grid_x > 0) {
      const int smem =
          bwd_smem_bytes(tile.block_m, tile.block_n, bucket, backward_stages(arch, tile, bucket));
      const bool general = p.softcap != 0.0f || p.alibi != nullptr || p.dropout_p > 0.0f;
      const jit::Kernel& main =
          cached_kernel(backward_main_spec, device, smem, arch, p.in_type, bucket, general);
      launch_chunked(main, prm, (unsigned)grid_x, (unsigned)p.hk, 32u * (unsigned)tile.warps, smem, p.stream);
    }
    if (aux_x > 0) {
      const jit::Kernel& convert = cached_kernel(backward_convert_spec, device, 0, arch, p.in_type);
      launch_chunked(convert, prm, aux_x, (unsigned)p.hq, kAuxThreads, 0, p.stream);
    }
  } catch (...) {
    jit::free_async(scratch, p.stream);
    throw;
  }
  jit::free_async(scratch, p.stream);
}

}  // namespace flashport::cuda
