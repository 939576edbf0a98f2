// Run-time compilation of the embedded kernel sources (NVRTC), the on-disk cache, and launching
// through the driver API. libcuda and libnvrtc are opened at run time (dlopen).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/stream_scratch.hpp"

namespace flashport::jit {

/// What makes one compiled kernel: the embedded entry source, the extern "C" kernel name, the -D
/// defines that specialise it (dtype, head dim, tile, feature flags), and the target arch
/// (80, 86, 89, 90, ...; 90 compiles for sm_90a so wgmma/setmaxnreg are available).
struct KernelSpec {
  std::string source;  ///< path under src/kernels/, e.g. "cuda/attn_fwd.cu"
  std::string entry;   ///< kernel name, declared extern "C" in the source
  std::vector<std::pair<std::string, std::string>> defines;
  int arch = 80;

  /// Stable text form "source:entry:arch:K=V,..." used in logs, cache keys and error messages.
  std::string key() const;
};

/// Result of compiling without loading (CI's jit test, flashport-prebuild): the cubin and the
/// resource usage ptxas reported.
struct CompileResult {
  std::vector<char> cubin;
  std::string log;       ///< NVRTC log (warnings, ptxas -v info)
  int registers = -1;    ///< per thread, from the ptxas info line
  int spill_bytes = 0;   ///< spill stores + loads reported by ptxas
  double seconds = 0.0;  ///< compile wall time (0 when served from the disk cache)
  bool from_cache = false;
};

/// Compiles `spec` with NVRTC, or returns the cached cubin. Needs libnvrtc but no GPU or driver.
/// Throws flashport::Error naming the kernel and carrying the compiler output on failure.
CompileResult compile(const KernelSpec& spec);

/// A loaded kernel, ready to launch on the current context of `device`.
struct Kernel {
  void* function = nullptr;  ///< CUfunction
  int max_dynamic_smem = 0;  ///< bytes the kernel was configured for
  int device = -1;           ///< GPU ordinal the module was loaded on
  int arch = 0;              ///< KernelSpec::arch it was compiled for
  std::string key;           ///< KernelSpec::key(), for error messages
  std::string label;         ///< "kernel " + key: the argument name of launch errors
};

/// Compiles (or loads from cache) and loads `spec` on GPU `device`; the first call per (spec,
/// device) in a process does the work, every later call returns the same Kernel (thread safe).
/// Raises the dynamic shared-memory limit to `dynamic_smem` bytes.
const Kernel& get(const KernelSpec& spec, int device, int dynamic_smem);

/// What identifies one KernelSpec without building it: the function that builds the spec (its
/// address) and the integers it takes (arch, dtype, head-dim bucket, tile, flags...).
struct SpecKey {
  const void* builder = nullptr;
  std::array<int, 8> values{};
  bool operator==(const SpecKey&) const = default;
};

/// get() for hot paths: the first call with a (key, device, dynamic_smem) builds the spec with
/// `make_spec()` and loads it; later calls find the loaded kernel in a table keyed by integers, with
/// no string building, hashing of sources or map of spec texts. `key` must determine the spec.
template <class MakeSpec>
const Kernel& get_cached(const SpecKey& key, int device, int dynamic_smem, MakeSpec&& make_spec);

/// How a launch is ordered after the kernel queued before it on the same stream. `overlap_prior`:
/// programmatic stream serialisation for kernels built for sm_90+ (unless FLASHPORT_OVERLAP_LAUNCHES=0), so
/// the kernel launches while its predecessor finishes; every flashport kernel waits for its predecessors
/// before touching memory (kernels/cuda/common/grid_dependency.cuh), so the order of memory accesses is
/// that of `serial`, a plain launch. Measured in docs/PERF.md ("Launches that overlap their predecessors").
enum class LaunchOrder { serial, overlap_prior };

/// Launches with cuLaunchKernelEx on `stream` (CUstream, may be null = legacy default stream).
/// `args` as for cuLaunchKernel. `cluster_x` > 1: thread-block clusters of that many CTAs along x
/// (sm_90+; grid_x must be a multiple). Never synchronises. Throws flashport::Error on a launch failure.
void launch(const Kernel& kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
            int dynamic_smem, void* stream, void** args, unsigned cluster_x = 1,
            LaunchOrder order = LaunchOrder::serial);

/// The table behind get_cached(): the kernel remembered for (key, device, dynamic_smem), or null.
const Kernel* find_cached(const SpecKey& key, int device, int dynamic_smem);
void remember_cached(const SpecKey& key, int device, int dynamic_smem, const Kernel& kernel);

template <class MakeSpec>
const Kernel& get_cached(const SpecKey& key, int device, int dynamic_smem, MakeSpec&& make_spec) {
  if (const Kernel* hit = find_cached(key, device, dynamic_smem)) return *hit;
  const Kernel& kernel = get(make_spec(), device, dynamic_smem);
  remember_cached(key, device, dynamic_smem, kernel);
  return kernel;
}

/// Blocks until the work queued on `stream` has finished (benchmarks and tools; the library's entry
/// points never call it).
void stream_synchronize(void* stream);

/// Compute capability (major * 10 + minor) of GPU `device`; throws when there is none. Cached.
int device_arch(int device);
/// Number of multiprocessors of GPU `device`. Cached.
int device_sm_count(int device);
/// Product name of GPU `device` (cuDeviceGetName), e.g. "NVIDIA H200".
std::string device_name(int device);
/// CUDA version the driver supports (cuDriverGetVersion, e.g. 13000); 0 without libcuda.
int driver_version();
/// The driver's cuTensorMapEncodeTiled (the Hopper kernels' TMA descriptors), or null without one.
void* tensor_map_encoder();
/// Milliseconds per call of `launch` (which enqueues work on `stream`) on GPU `device`: `warmup`
/// untimed calls, then the mean of `reps` calls between two events. Synchronises on the end event,
/// so only autotuning calls it. Throws flashport::Error when libcuda lacks the event functions.
float time_ms(int device, void* stream, const std::function<void()>& launch, int warmup, int reps);
/// True when libcuda loads and at least one GPU is visible.
bool driver_available();
/// Number of visible GPUs; 0 without a usable driver.
int device_count();
/// The device ordinal that owns `ptr` (a device pointer), or -1.
int pointer_device(const void* ptr);

/// Stream-ordered scratch memory (cuMemAllocAsync / cuMemFreeAsync): workspaces for split-KV,
/// dQ accumulators, rotated queries. Never synchronises.
void* alloc_async(size_t bytes, void* stream);
void free_async(void* ptr, void* stream);
/// Stream-ordered scratch owned by one library call (core::StreamScratch: free() at the call's end reports
/// a failing cuMemFreeAsync; on an error path the destructor returns it, keeping the original error).
struct FreeOnStream {
  void* stream;
  void operator()(void* ptr) const { free_async(ptr, stream); }
};
class AsyncScratch : public core::StreamScratch<FreeOnStream> {
 public:
  AsyncScratch(size_t bytes, void* stream)
      : StreamScratch(alloc_async(bytes, stream), FreeOnStream{stream}) {}
};
/// Copies `bytes` from device memory to host memory after the work queued on `stream` and waits for it
/// (cuMemcpyDtoHAsync + cuStreamSynchronize): checked mode only.
void copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
/// Host memory that kernels on one GPU write through: `host` for the CPU, `device` for kernel arguments.
struct MappedMemory {
  void* host = nullptr;
  void* device = nullptr;
};
inline constexpr size_t kFaultMemoryBytes = 256;
/// kFaultMemoryBytes of zeroed, mapped, portable pinned host memory for GPU `device` (cuMemHostAlloc):
/// where kernels report faults the host reads without synchronising. Allocated on the first call per
/// device and kept for the process (kernels in flight or captured in graphs may still write it).
const MappedMemory& fault_memory(int device);
/// Waits for all work on GPU `device` (cuCtxSynchronize in its primary context): flashport::check_device.
void device_synchronize(int device);
/// cuMemsetD8Async.
void memset_async(void* ptr, unsigned char value, size_t bytes, void* stream);

/// Embedded source text by path under src/kernels/ ("cuda/attn_fwd.cu"); throws when unknown.
const std::string& embedded_source(const std::string& path);
/// Every embedded path (for tests and prebuild).
std::vector<std::string> embedded_paths();

/// The directory of the disk cache: $FLASHPORT_CACHE_DIR, else $XDG_CACHE_HOME/flashport, else
/// ~/.cache/flashport. Empty when it cannot be created or written (kernels then stay in memory).
std::string cache_dir();
/// The path of `spec`'s disk-cache entry (whether or not it exists yet); empty without a usable
/// cache directory. Needs libnvrtc (its version is part of the key).
std::string cache_file(const KernelSpec& spec);
/// The disk cache's size cap when FLASHPORT_CACHE_MAX_MB is unset. Every variant for sm_80 and
/// sm_90a is about 15 MB (131 entries), so this keeps dozens of generations (kernel edits, NVRTC
/// updates) before the oldest go, and bounds the directory all the same.
inline constexpr uint64_t kDefaultCacheMaxMb = 1024;
/// `text` as a cap in whole megabytes ("0" = unlimited); throws flashport::Error naming `name` (the
/// variable or option it came from) when it is not one.
uint64_t parse_cache_max_mb(const std::string& text, const std::string& name);
/// The cap in bytes from FLASHPORT_CACHE_MAX_MB (read on each call), 0 = unlimited; an invalid value
/// is reported once on stderr, naming the variable, and the default is used.
uint64_t cache_max_bytes();

/// What one pruning pass did. `skipped`: another process (or thread) held the prune lock, nothing
/// was done. `error`: the directory or the lock could not be opened, nothing was done.
struct PruneStats {
  size_t removed = 0, remaining = 0, temps_removed = 0;
  uint64_t removed_bytes = 0, remaining_bytes = 0;
  bool skipped = false;
  std::string error;
};
/// Called with the path and size of each entry a pass removes (progress output).
using PruneCallback = std::function<void(const std::string& path, uint64_t bytes)>;

/// Least-recently-used pruning of the kernel entries in `dir` (recency: an entry's mtime, refreshed
/// on every disk-cache hit). When they total more than `max_bytes` (0 = unlimited), removes the
/// oldest until they total at most 90% of it, never `keep`. Also removes temp files of crashed
/// writers older than ten minutes. Other files in `dir` are never touched. Safe while other
/// processes read, write and prune the same directory.
PruneStats prune_cache(const std::string& dir, uint64_t max_bytes, const std::string& keep = {},
                       const PruneCallback& on_remove = {});
/// Removes every kernel entry in `dir` (and stale temp files), with the same locking as prune_cache.
PruneStats clear_cache(const std::string& dir, const PruneCallback& on_remove = {});

/// Number of NVRTC compilations this process has run (cache hits excluded); for tests and tools.
size_t compile_count();
/// Forgets the in-process compile results so the next compile() consults the disk cache again
/// (tests). Loaded kernels (get) are unaffected.
void drop_memory_cache();
/// "major.minor" of the loaded libnvrtc and the file it came from; throws when none loads.
std::string nvrtc_version();
std::string nvrtc_library();

}  // namespace flashport::jit
