// Every FLASHPORT_* environment knob, parsed in one place. The parsers are pure functions of a getenv-like
// lookup (tests pass a map); tuning() applies them to the process environment once. A malformed value is
// kept as an error and thrown, naming the variable, by the first call that uses the knob: loading the
// library never throws, and a bad knob nobody uses stays harmless.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashport/error.hpp"

namespace flashport::core {

/// One variable's text, or null when it is unset.
using EnvLookup = std::function<const char*(const char* name)>;

/// std::getenv: the process environment.
const EnvLookup& process_env();

/// A knob's value (the default when unset or empty), or why its text was rejected.
template <class T>
struct Knob {
  const char* name;
  T value;
  std::string error;  // non-empty: the text was malformed; get() throws it

  Knob(const char* name, T value = {}, std::string error = {})
      : name(name), value(std::move(value)), error(std::move(error)) {}

  const T& get() const {
    if (!error.empty()) [[unlikely]]
      throw Error(name, error);
    return value;
  }
};

/// FLASHPORT_BWD_TILE: the portable backward's tile; warps == 0 when unset.
struct BwdTileSetting {
  int block_m = 0, block_n = 0, warps = 0;
};

/// One entry of FLASHPORT_HOPPER_TILE "d:block_n:stages[:exp_emu[:block_m]]". Whether the shape fits the
/// kernel is the Hopper launcher's check (it knows the kernel's limits).
struct HopperTileSetting {
  int d = 0, block_n = 0, stages = 0, exp_emu = 0, block_m = 0;  // block_m 0: the kernel's default
};

/// The knobs read once per process (they pick kernels, and a kernel's spec must not change under a
/// process's cached launches).
struct Tuning {
  Knob<std::string> cuda_forward{"FLASHPORT_CUDA_FORWARD"};    // "" (automatic), "portable", "hopper"
  Knob<std::string> cuda_backward{"FLASHPORT_CUDA_BACKWARD"};  // same
  Knob<std::vector<HopperTileSetting>> hopper_tile{"FLASHPORT_HOPPER_TILE"};
  Knob<int> hopper_persistent{"FLASHPORT_HOPPER_PERSISTENT", -1};  // 0, 1, 2; -1: the launch rule
  // Paged K/V pages of fewer tokens than this (and than the key tile) load through the Hopper forward's
  // cp.async gather, any page size (0..256; 0: one TMA box per page, pages of a multiple of 8 only).
  Knob<int> hopper_paged_gather{"FLASHPORT_HOPPER_PAGED_GATHER", 128};
  // 1 (unset): e4m3 calls the Hopper fp8 forward takes run there; 0: on the portable fp8 variant (6-15x
  // slower on an H100, 2026-12-06: docs/HOPPER_NOTES.md; hopper::declines).
  Knob<bool> hopper_fp8{"FLASHPORT_HOPPER_FP8", true};
  // The Hopper fp8 forward's tile per head dim, FLASHPORT_HOPPER_TILE's format (hopper_fwd.cpp, fp8_tile)
  Knob<std::vector<HopperTileSetting>> hopper_fp8_tile{"FLASHPORT_HOPPER_FP8_TILE"};
  Knob<bool> autotune{"FLASHPORT_AUTOTUNE"};
  Knob<BwdTileSetting> bwd_tile{"FLASHPORT_BWD_TILE"};
  Knob<int> bwd_pipe{"FLASHPORT_BWD_PIPE", -1};     // 0..3, -1 when unset
  Knob<int> bwd_stages{"FLASHPORT_BWD_STAGES", 0};  // 1, 2, 0 when unset
  Knob<bool> bwd_general{"FLASHPORT_BWD_GENERAL"};
  // How the Hopper backward adds dQ: 1 (unset) bulk reduce-adds (d 64, 128: from a double-buffered
  // staging tile; d 256: by producer warps from the step's freed Q / dO stage), 0 vector reductions
  // (producer warps'; d 256: the consumers'; hopper_bwd::Tile::dq_mode)
  Knob<int> hopper_bwd_dq{"FLASHPORT_HOPPER_BWD_DQ", 1};
  // The Hopper d 256 backward in clusters of two CTAs that add each other's dQ half before the global
  // reduction (attn_bwd_sm90_wide.cu); off by default: 0.82-0.91x of one CTA each on an H100
  // (docs/BWD_NOTES.md part 9)
  Knob<bool> hopper_bwd_pair{"FLASHPORT_HOPPER_BWD_PAIR"};
  // The Hopper backward's d 64 consumer loop (hopper_bwd::Tile::pipe, stages): 0 serial with 2 stages,
  // 1 pipelined with 2, 2 pipelined with 3, 3 serial with 3; -1 (unset): the tile table's
  Knob<int> hopper_bwd_pipe{"FLASHPORT_HOPPER_BWD_PIPE", -1};
  // Queries per step of the Hopper backward at d 64 (hopper_bwd::Tile::block_m): 64
  // (hopper_bwd::tile_64_queries) or 128 (bulk dQ; not in deterministic mode or with dropout); 0 (unset):
  // the tile table's (128)
  Knob<int> hopper_bwd_block_m{"FLASHPORT_HOPPER_BWD_BLOCK_M", 0};
  // The narrow Hopper backward's serial loop (FP_BWD_ORDER, attn_bwd_sm90.cu): 0 (unset) each step's GEMMs
  // in two groups, each waited for whole; 1 in overlapping groups (P^T's exponentials beside dP^T's GEMM,
  // the dQ staging beside dK's)
  Knob<int> hopper_bwd_order{"FLASHPORT_HOPPER_BWD_ORDER", 0};
  // The Hopper backward's grid for causal and windowed calls (BwdParams::keys_outer): 1 (unset) key blocks
  // outside kv heads on grids of a few waves whose batch entries' rows fit L2 (a batch entry's longest
  // CTAs start first, its short ones last), 2 wherever it can, 0 never (each head's key blocks in turn)
  Knob<int> hopper_bwd_keys_outer{"FLASHPORT_HOPPER_BWD_KEYS_OUTER", 1};
  // The Hopper backward's dQ accumulator at d 64, 128, 192, 256 (hopper_bwd::row_major_dq): -1 (unset)
  // tiled unless its padding (64 rows per sequence) exceeds the row-major size and 256 MB, then row-major;
  // 1 row-major always (vector reductions); 0 tiled always
  Knob<int> hopper_bwd_dq_rows{"FLASHPORT_HOPPER_BWD_DQ_ROWS", -1};
  // 0: decode-like calls keep the row-split kernel; 1 (unset): the decode variant; 2..5: its other shapes
  // (sm80/tiles.hpp, decode_tile)
  Knob<int> decode_variant{"FLASHPORT_DECODE", 1};
  // 1 (unset): the decode variant's split grids (2..8 splits, sm_90+, 2-byte types, d <= 128) merge inside
  // a thread-block cluster instead of through fp32 scratch and a split_combine launch; 0: the latter
  Knob<bool> decode_cluster{"FLASHPORT_DECODE_CLUSTER", true};
  Knob<bool> jit_verbose{"FLASHPORT_JIT_VERBOSE"};
  // Device-resident index tensors checked on the GPU before each call's kernels (index_rules.h); 0 skips
  // the extra launch (a bad index is then clamped without a report).
  Knob<bool> device_checks{"FLASHPORT_DEVICE_CHECKS", true};
  // 1 (unset): the device memory pool the stream-ordered scratch comes from keeps freed memory across
  // synchronisations (its release threshold, 0 by default, raised to the maximum as PyTorch's
  // cudaMallocAsync allocator does), so a step that synchronises does not map the scratch again; a
  // threshold someone else set is left alone. 0: the pool is not touched.
  Knob<bool> keep_scratch{"FLASHPORT_KEEP_SCRATCH", true};
  // 1 (unset): launches that ask for it (jit::LaunchOrder::overlap_prior: the forward side) of sm_90+ kernels
  // use programmatic stream serialisation, each starting while the previous kernel on the stream finishes
  // (kernels/cuda/common/grid_dependency.cuh); 0: every launch plain
  Knob<bool> overlap_launches{"FLASHPORT_OVERLAP_LAUNCHES", true};
  Knob<std::string> nvrtc_path{"FLASHPORT_NVRTC_PATH"};  // any path; "" when unset
  // Extra NVRTC defines for timing ablations (e.g. FP_BWD_ABLATE=1): space-separated NAME[=VALUE] entries
  Knob<std::vector<std::string>> jit_defines{"FLASHPORT_JIT_DEFINES"};
  // The HIP runtime the AMD backend opens; "" (unset): libamdhip64.so. The HIP backend tests point it at
  // a stand-in that runs the kernels on the CPU wave64 model (tests/hip/backend/fake_hip_runtime.cpp).
  Knob<std::string> hip_runtime{"FLASHPORT_HIP_RUNTIME"};
  // Not ours, so not validated: toolkit roots searched for libnvrtc (<root>/lib64/).
  std::string cuda_home, cuda_path;
};

/// Every once-read knob of `env`; never throws.
Tuning parse_tuning(const EnvLookup& env);

/// parse_tuning(process_env()), parsed on the first call (thread safe) and kept for the process.
const Tuning& tuning();

// Knobs read on every use: tests and tools (flashport-prebuild, the cache tests, the CPU fast path's
// per-ISA tests) change them within one process, and they select no JIT-compiled kernel (whose cached
// launches must not change under a process).

/// The kernel cache directory: FLASHPORT_CACHE_DIR, else $XDG_CACHE_HOME/flashport, else
/// $HOME/.cache/flashport (the password database's home when HOME is unset); empty when none is known.
std::string cache_dir_setting(const EnvLookup& env);

/// FLASHPORT_CACHE_MAX_MB in whole megabytes (0 = unlimited); `default_mb` when unset or empty.
Knob<uint64_t> cache_max_mb_setting(const EnvLookup& env, uint64_t default_mb);

/// `text` as a whole number of megabytes that fits in bytes; throws Error naming `name` otherwise.
uint64_t parse_cache_max_mb(const std::string& text, const std::string& name);

/// FLASHPORT_CPU_ISA: "" (the widest the CPU runs), "amx", "avx512", "avx2" or "base": the cap on the CPU
/// fast path's kernel copy (backends/cpu/fast_dispatch.cpp reads it on each call).
Knob<std::string> cpu_isa_setting(const EnvLookup& env);

/// Whole decimal ints (no sign) separated by `sep`, e.g. "64:128:2", into `out`; false when any part is
/// not one (the knobs' syntax, shared with stored values such as the autotune store's).
bool parse_ints(std::string_view text, char sep, std::vector<int>& out);

}  // namespace flashport::core
