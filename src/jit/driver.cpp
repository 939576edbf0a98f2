// The CUDA driver side of the JIT: libcuda opened at run time, primary contexts shared with the
// CUDA runtime (and PyTorch), module loading, launches and stream-ordered scratch memory.
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "jit/detail.hpp"

namespace flashport::jit {
namespace {

/// Driver entry points. Resolved through cuGetProcAddress at the CUDA 12.0 ABI, which every
/// function below kept through CUDA 13, so 12.x and 13.x drivers both work.
struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_version = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuDeviceGetCount) device_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_retain = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop = nullptr;
  decltype(&::cuStreamGetCtx) stream_ctx = nullptr;
  decltype(&::cuModuleLoadData) module_load = nullptr;
  decltype(&::cuModuleGetFunction) module_function = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuFuncGetAttribute) func_get_attribute = nullptr;
  decltype(&::cuLaunchKernelEx) launch = nullptr;
  decltype(&::cuMemAllocAsync) alloc_async = nullptr;
  decltype(&::cuMemFreeAsync) free_async = nullptr;
  decltype(&::cuMemsetD8Async) memset_async = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_attribute = nullptr;
  // Optional (autotuning only): missing ones leave the driver usable; their callers throw.
  decltype(&::cuDeviceGetName) device_name = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventElapsedTime) event_elapsed = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;
  decltype(&::cuStreamIsCapturing) stream_is_capturing = nullptr;
  // Optional (the Hopper kernels' TMA descriptors, backends/cuda/sm90/tma_map.cpp).
  decltype(&::cuTensorMapEncodeTiled) tensor_map_encode_tiled = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cuMemcpyDtoHAsync) memcpy_dtoh_async = nullptr;
  // Optional (device fault records, flashport::check_device).
  decltype(&::cuMemHostAlloc) host_alloc = nullptr;
  decltype(&::cuMemHostGetDevicePointer) host_device_pointer = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  // Optional (the scratch pool's release threshold, keep_pool_memory).
  decltype(&::cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&::cuDeviceGetMemPool) device_mem_pool = nullptr;
  decltype(&::cuMemPoolGetAttribute) pool_get_attribute = nullptr;
  decltype(&::cuMemPoolSetAttribute) pool_set_attribute = nullptr;
  int devices = 0;
  int cuda_version = 0;     ///< what the driver supports, e.g. 13000
  std::string unavailable;  ///< why the driver cannot be used; empty when it can
};

constexpr int kProcAddressVersion = 12000;

Driver load_driver() {
  Driver d;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) handle = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    d.unavailable = "libcuda.so.1 not found (no NVIDIA driver)";
    return d;
  }
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(handle, "cuGetProcAddress_v2"));
  if (!get_proc) {
    d.unavailable = "libcuda lacks cuGetProcAddress_v2 (driver older than CUDA 12)";
    return d;
  }
  auto optional_sym = [&](auto& fn, const char* name) {
    void* address = nullptr;
    CUdriverProcAddressQueryResult status{};
    if (get_proc(name, &address, kProcAddressVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) {
      address = nullptr;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(address);
  };
  auto sym = [&](auto& fn, const char* name) {
    optional_sym(fn, name);
    if (!fn && d.unavailable.empty())
      d.unavailable =
          std::string("libcuda lacks ") + name + " (driver older than CUDA 12, or a stub library)";
  };
  sym(d.init, "cuInit");
  sym(d.driver_version, "cuDriverGetVersion");
  sym(d.error_name, "cuGetErrorName");
  sym(d.error_string, "cuGetErrorString");
  sym(d.device_count, "cuDeviceGetCount");
  sym(d.device_get, "cuDeviceGet");
  sym(d.device_attribute, "cuDeviceGetAttribute");
  sym(d.primary_retain, "cuDevicePrimaryCtxRetain");
  sym(d.ctx_get_current, "cuCtxGetCurrent");
  sym(d.ctx_set_current, "cuCtxSetCurrent");
  sym(d.ctx_push, "cuCtxPushCurrent");
  sym(d.ctx_pop, "cuCtxPopCurrent");
  sym(d.stream_ctx, "cuStreamGetCtx");
  sym(d.module_load, "cuModuleLoadData");
  sym(d.module_function, "cuModuleGetFunction");
  sym(d.func_set_attribute, "cuFuncSetAttribute");
  sym(d.func_get_attribute, "cuFuncGetAttribute");
  sym(d.launch, "cuLaunchKernelEx");
  sym(d.alloc_async, "cuMemAllocAsync");
  sym(d.free_async, "cuMemFreeAsync");
  sym(d.memset_async, "cuMemsetD8Async");
  sym(d.pointer_attribute, "cuPointerGetAttribute");
  optional_sym(d.device_name, "cuDeviceGetName");
  optional_sym(d.event_create, "cuEventCreate");
  optional_sym(d.event_record, "cuEventRecord");
  optional_sym(d.event_synchronize, "cuEventSynchronize");
  optional_sym(d.event_elapsed, "cuEventElapsedTime");
  optional_sym(d.event_destroy, "cuEventDestroy");
  optional_sym(d.stream_is_capturing, "cuStreamIsCapturing");
  optional_sym(d.tensor_map_encode_tiled, "cuTensorMapEncodeTiled");
  optional_sym(d.stream_synchronize, "cuStreamSynchronize");
  optional_sym(d.memcpy_dtoh_async, "cuMemcpyDtoHAsync");
  optional_sym(d.host_alloc, "cuMemHostAlloc");
  optional_sym(d.host_device_pointer, "cuMemHostGetDevicePointer");
  optional_sym(d.ctx_synchronize, "cuCtxSynchronize");
  optional_sym(d.ctx_get_device, "cuCtxGetDevice");
  optional_sym(d.device_mem_pool, "cuDeviceGetMemPool");
  optional_sym(d.pool_get_attribute, "cuMemPoolGetAttribute");
  optional_sym(d.pool_set_attribute, "cuMemPoolSetAttribute");
  if (!d.unavailable.empty()) return d;
  d.driver_version(&d.cuda_version);
  if (CUresult rc = d.init(0); rc != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.error_name(rc, &name);
    d.unavailable = std::string("cuInit failed: ") + (name ? name : "unknown error");
  } else if (d.device_count(&d.devices) != CUDA_SUCCESS || d.devices == 0) {
    d.unavailable = "no CUDA device visible";
  }
  return d;
}

/// The driver; never throws (a failure is recorded in `unavailable`).
const Driver& driver_state() {
  static const Driver d = load_driver();
  return d;
}

/// The driver for an operation that needs it; throws naming `who` when there is none.
const Driver& driver(const std::string& who) {
  const Driver& d = driver_state();
  if (!d.unavailable.empty()) throw Error(who, "CUDA driver unavailable: " + d.unavailable);
  return d;
}

std::string describe(CUresult rc) {
  const Driver& d = driver_state();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.error_name) d.error_name(rc, &name);
  if (d.error_string) d.error_string(rc, &text);
  return std::string(name ? name : "CUDA error " + std::to_string(static_cast<int>(rc))) +
         (text ? std::string(" (") + text + ")" : "");
}

void check(CUresult rc, const std::string& who, const char* call) {
  if (rc != CUDA_SUCCESS) throw Error(who, std::string(call) + " failed: " + describe(rc));
}

void check_device(int device, const std::string& who) {
  const Driver& d = driver(who);
  if (device < 0 || device >= d.devices) {
    throw Error(who, "device " + std::to_string(device) + " out of range (" + std::to_string(d.devices) +
                         " visible)");
  }
}

/// Per-device values read once and kept (every launch needs them; the driver calls behind them cost
/// more than the rest of a small launch). Devices past kCachedDevices are looked up each time.
constexpr int kCachedDevices = 64;
std::atomic<CUcontext> g_contexts[kCachedDevices];
std::atomic<int> g_archs[kCachedDevices], g_sm_counts[kCachedDevices];  // 0: not read yet
std::atomic<const MappedMemory*> g_fault_memory[kCachedDevices];

/// The primary context of `device`, retained once per process and kept for its lifetime.
CUcontext primary_context(int device, const std::string& who) {
  if (device >= 0 && device < kCachedDevices)
    if (CUcontext ctx = g_contexts[device].load(std::memory_order_acquire)) return ctx;
  static std::mutex mutex;
  static std::map<int, CUcontext> contexts;
  check_device(device, who);
  std::lock_guard lock(mutex);
  CUcontext& ctx = contexts[device];
  if (!ctx) {
    const Driver& d = driver(who);
    CUdevice dev = 0;
    check(d.device_get(&dev, device), who, "cuDeviceGet");
    check(d.primary_retain(&ctx, dev), who, "cuDevicePrimaryCtxRetain");
  }
  if (device < kCachedDevices) g_contexts[device].store(ctx, std::memory_order_release);
  return ctx;
}

/// Makes `ctx` current for the scope. With no context current it is set (as cudaSetDevice
/// would); when another is current (the caller's) it is pushed and popped so the caller's
/// thread state is left as found.
class ContextScope {
 public:
  ContextScope(CUcontext ctx, const std::string& who) : d_(driver(who)) {
    CUcontext current = nullptr;
    check(d_.ctx_get_current(&current), who, "cuCtxGetCurrent");
    if (current == ctx) return;
    if (!current) {
      check(d_.ctx_set_current(ctx), who, "cuCtxSetCurrent");
    } else {
      check(d_.ctx_push(ctx), who, "cuCtxPushCurrent");
      pushed_ = true;
    }
  }
  ~ContextScope() {
    CUcontext popped = nullptr;
    if (pushed_) d_.ctx_pop(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const Driver& d_;
  bool pushed_ = false;
};

/// Context for stream-ordered memory calls: the stream's own context, else the current one,
/// else device 0's primary context.
CUcontext context_for_stream(void* stream, const std::string& who) {
  const Driver& d = driver(who);
  CUcontext ctx = nullptr;
  if (stream) check(d.stream_ctx(static_cast<CUstream>(stream), &ctx), who, "cuStreamGetCtx");
  if (!ctx) check(d.ctx_get_current(&ctx), who, "cuCtxGetCurrent");
  return ctx ? ctx : primary_context(0, who);
}

int attribute(int device, CUdevice_attribute which, const std::string& who) {
  const Driver& d = driver(who);
  check_device(device, who);
  CUdevice dev = 0;
  check(d.device_get(&dev, device), who, "cuDeviceGet");
  int value = 0;
  check(d.device_attribute(&value, which, dev), who, "cuDeviceGetAttribute");
  return value;
}

constexpr int kDefaultSmemLimit = 48 * 1024;  // dynamic smem allowed without the opt-in attribute

/// Raises `kernel`'s dynamic shared-memory limit to `bytes` when it needs the opt-in.
void configure_smem(Kernel& kernel, int bytes) {
  if (bytes <= kernel.max_dynamic_smem) return;
  const std::string& who = kernel.label;
  if (bytes > kDefaultSmemLimit) {
    const int optin = attribute(kernel.device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, who);
    const Driver& d = driver(who);
    auto fn = static_cast<CUfunction>(kernel.function);
    int static_smem = 0;
    d.func_get_attribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn);
    if (bytes + static_smem > optin) {
      throw Error(who, std::to_string(bytes) + " bytes of dynamic shared memory + " +
                           std::to_string(static_smem) + " static exceed the device's opt-in limit of " +
                           std::to_string(optin));
    }
    check(d.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes), who,
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  }
  kernel.max_dynamic_smem = std::max(kernel.max_dynamic_smem, bytes);
}

struct LoadedKernel {
  std::mutex mutex;
  bool loaded = false;
  Kernel kernel;
};

}  // namespace

int detail::driver_cuda_version() {
  return driver_state().cuda_version;
}

const Kernel& get(const KernelSpec& spec, int device, int dynamic_smem) {
  static std::mutex table_mutex;
  static std::map<std::pair<std::string, int>, std::unique_ptr<LoadedKernel>> table;
  const std::string key = spec.key();
  LoadedKernel* entry;
  {
    std::lock_guard lock(table_mutex);
    auto& slot = table[{key, device}];
    if (!slot) slot = std::make_unique<LoadedKernel>();
    entry = slot.get();
  }
  std::lock_guard lock(entry->mutex);
  if (!entry->loaded) {
    const std::string who = "kernel " + key;
    const Driver& d = driver(who);
    const CUcontext ctx = primary_context(device, who);
    const CompileResult compiled = compile(spec);
    ContextScope scope(ctx, who);
    CUmodule module = nullptr;  // lives as long as the process: kernels are cached forever
    if (const CUresult rc = d.module_load(&module, compiled.cubin.data()); rc != CUDA_SUCCESS) {
      throw Error(who, "cuModuleLoadData failed: " + describe(rc) + " (cubin from NVRTC " + nvrtc_version() +
                           " for arch " + std::to_string(spec.arch) + "; device " + std::to_string(device) +
                           " is arch " + std::to_string(device_arch(device)) + ", driver supports CUDA " +
                           std::to_string(d.cuda_version / 1000) + "." +
                           std::to_string(d.cuda_version % 1000 / 10) + ")");
    }
    CUfunction function = nullptr;
    check(d.module_function(&function, module, spec.entry.c_str()), who, "cuModuleGetFunction");
    entry->kernel.function = function;
    entry->kernel.device = device;
    entry->kernel.arch = spec.arch;
    entry->kernel.key = key;
    entry->kernel.label = who;
    entry->loaded = true;
  }
  configure_smem(entry->kernel, dynamic_smem);
  return entry->kernel;
}

void launch(const Kernel& kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
            int dynamic_smem, void* stream, void** args, unsigned cluster_x, LaunchOrder order) {
  const std::string& who = kernel.label;
  if (dynamic_smem > std::max(kernel.max_dynamic_smem, kDefaultSmemLimit)) {
    throw Error(who, "launch with " + std::to_string(dynamic_smem) +
                         " bytes of dynamic shared memory, but get() "
                         "configured " +
                         std::to_string(kernel.max_dynamic_smem));
  }
  const Driver& d = driver(who);
  ContextScope scope(primary_context(kernel.device, who), who);
  CUlaunchConfig config{};
  config.gridDimX = grid_x;
  config.gridDimY = grid_y;
  config.gridDimZ = grid_z;
  config.blockDimX = block_x;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = static_cast<unsigned>(dynamic_smem);
  config.hStream = static_cast<CUstream>(stream);
  CUlaunchAttribute attrs[2]{};
  unsigned num_attrs = 0;
  if (cluster_x > 1) {
    CUlaunchAttribute& cluster = attrs[num_attrs++];
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = cluster_x;
    cluster.value.clusterDim.y = 1;
    cluster.value.clusterDim.z = 1;
  }
  // Kernels built for sm_90+ wait for their predecessors' completion before touching memory
  // (grid_dependency.cuh; JitVariants checks the instruction is there), so they may launch while those
  // finish.
  if (order == LaunchOrder::overlap_prior && kernel.arch >= 90 && core::tuning().overlap_launches.get()) {
    CUlaunchAttribute& overlap = attrs[num_attrs++];
    overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    overlap.value.programmaticStreamSerializationAllowed = 1;
  }
  config.attrs = num_attrs > 0 ? attrs : nullptr;
  config.numAttrs = num_attrs;
  const CUresult rc = d.launch(&config, static_cast<CUfunction>(kernel.function), args, nullptr);
  if (rc != CUDA_SUCCESS) {
    throw Error(who, "cuLaunchKernelEx(grid " + std::to_string(grid_x) + "x" + std::to_string(grid_y) + "x" +
                         std::to_string(grid_z) + ", block " + std::to_string(block_x) + ", smem " +
                         std::to_string(dynamic_smem) +
                         (cluster_x > 1 ? ", cluster " + std::to_string(cluster_x) : std::string()) +
                         ") failed: " + describe(rc));
  }
}

namespace {

/// `read(device)` once per device, kept in `slots` (values are positive once read).
template <class Read>
int cached_per_device(std::atomic<int>* slots, int device, Read read) {
  const bool cacheable = device >= 0 && device < kCachedDevices;
  if (cacheable)
    if (const int v = slots[device].load(std::memory_order_relaxed)) return v;
  const int v = read(device);
  if (cacheable) slots[device].store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace

int device_arch(int device) {
  return cached_per_device(g_archs, device, [](int dev) {
    const std::string who = "device";
    return attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, who) * 10 +
           attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, who);
  });
}

int device_sm_count(int device) {
  return cached_per_device(g_sm_counts, device, [](int dev) {
    return attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "device");
  });
}

namespace {

/// get_cached()'s table: (spec key, device, smem) -> loaded kernel. Entries are never removed (like
/// the kernels themselves), so the pointers stay valid.
struct CachedSlot {
  SpecKey key;
  int device, smem;
  bool operator==(const CachedSlot& o) const { return key == o.key && device == o.device && smem == o.smem; }
};
struct CachedSlotHash {
  size_t operator()(const CachedSlot& s) const {
    uint64_t h = 0xcbf29ce484222325ull ^ reinterpret_cast<uintptr_t>(s.key.builder);
    for (int v : s.key.values) h = (h ^ (uint32_t)v) * 0x100000001b3ull;
    return (size_t)((h ^ (uint32_t)s.device) * 0x100000001b3ull ^ (uint32_t)s.smem);
  }
};
std::shared_mutex g_cached_mutex;
std::unordered_map<CachedSlot, const Kernel*, CachedSlotHash> g_cached;

}  // namespace

const Kernel* find_cached(const SpecKey& key, int device, int dynamic_smem) {
  std::shared_lock lock(g_cached_mutex);
  const auto it = g_cached.find({key, device, dynamic_smem});
  return it == g_cached.end() ? nullptr : it->second;
}

void remember_cached(const SpecKey& key, int device, int dynamic_smem, const Kernel& kernel) {
  std::unique_lock lock(g_cached_mutex);
  g_cached.emplace(CachedSlot{key, device, dynamic_smem}, &kernel);
}

void stream_synchronize(void* stream) {
  const std::string who = "stream";
  const Driver& d = driver(who);
  if (!d.stream_synchronize) throw Error(who, "libcuda lacks cuStreamSynchronize");
  ContextScope scope(context_for_stream(stream, who), who);
  check(d.stream_synchronize(static_cast<CUstream>(stream)), who, "cuStreamSynchronize");
}

std::string device_name(int device) {
  const std::string who = "device";
  const Driver& d = driver(who);
  check_device(device, who);
  if (!d.device_name) throw Error(who, "libcuda lacks cuDeviceGetName");
  CUdevice dev = 0;
  check(d.device_get(&dev, device), who, "cuDeviceGet");
  char name[256] = {};
  check(d.device_name(name, sizeof name - 1, dev), who, "cuDeviceGetName");
  return name;
}

int driver_version() {
  return driver_state().cuda_version;
}

void* tensor_map_encoder() {
  return reinterpret_cast<void*>(driver_state().tensor_map_encode_tiled);
}

float time_ms(int device, void* stream, const std::function<void()>& launch, int warmup, int reps) {
  const std::string who;  // no single argument is at fault
  const Driver& d = driver(who);
  if (!d.event_create || !d.event_record || !d.event_synchronize || !d.event_elapsed || !d.event_destroy ||
      !d.stream_is_capturing)
    throw Error(who, "kernel timing: libcuda lacks the cuEvent / cuStreamIsCapturing functions");
  if (reps < 1) throw Error(who, "kernel timing needs reps >= 1, got " + std::to_string(reps));
  // Events belong to a context and must be recorded on a stream of the same one: the primary
  // context, as launch() uses (the caller's stream comes from it too).
  ContextScope scope(primary_context(device, who), who);
  const auto cu_stream = static_cast<CUstream>(stream);
  // Under graph capture the launches would be recorded, not run, and waiting on the event would
  // invalidate the caller's capture: refuse before enqueuing anything.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(d.stream_is_capturing(cu_stream, &capture), who, "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
    throw Error(who, "kernel timing: the stream is capturing a graph");
  CUevent events[2] = {nullptr, nullptr};
  struct Destroy {
    const Driver& d;
    CUevent* events;
    ~Destroy() {
      for (int i = 0; i < 2; ++i)
        if (events[i]) d.event_destroy(events[i]);
    }
  } destroy{d, events};
  for (CUevent& e : events) check(d.event_create(&e, CU_EVENT_DEFAULT), who, "cuEventCreate");
  for (int i = 0; i < warmup; ++i) launch();
  check(d.event_record(events[0], cu_stream), who, "cuEventRecord");
  for (int i = 0; i < reps; ++i) launch();
  check(d.event_record(events[1], cu_stream), who, "cuEventRecord");
  check(d.event_synchronize(events[1]), who, "cuEventSynchronize");
  float ms = 0.0f;
  check(d.event_elapsed(&ms, events[0], events[1]), who, "cuEventElapsedTime");
  return ms / static_cast<float>(reps);
}

bool driver_available() {
  return driver_state().unavailable.empty();
}

int device_count() {
  return driver_available() ? driver_state().devices : 0;
}

int pointer_device(const void* ptr) {
  if (!ptr || !driver_available()) return -1;
  int ordinal = -1;
  const CUresult rc = driver_state().pointer_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                       reinterpret_cast<CUdeviceptr>(ptr));
  return rc == CUDA_SUCCESS ? ordinal : -1;
}

namespace {

/// Once per device (with the current context's device current): raises the release threshold of the
/// pool cuMemAllocAsync draws from when it is still the default 0, so freed scratch stays mapped across
/// synchronisations (FLASHPORT_KEEP_SCRATCH, core/tuning.hpp). Best effort: a driver without the
/// pool entry points, or a failing call, leaves the pool as it is.
void keep_pool_memory(const Driver& d) {
  static std::atomic<unsigned long long> done{0};  // bit per device ordinal (< 64)
  if (!core::tuning().keep_scratch.get()) return;  // before any driver call on this per-call path
  CUdevice dev = 0;
  if (!d.ctx_get_device || !d.device_mem_pool || !d.pool_get_attribute || !d.pool_set_attribute ||
      d.ctx_get_device(&dev) != CUDA_SUCCESS || dev < 0 || dev >= 64)
    return;
  const unsigned long long bit = 1ull << dev;
  if (done.load(std::memory_order_relaxed) & bit) return;
  done.fetch_or(bit, std::memory_order_relaxed);  // a race sets the same value twice: harmless
  CUmemoryPool pool = nullptr;
  cuuint64_t threshold = 0;
  if (d.device_mem_pool(&pool, dev) != CUDA_SUCCESS ||
      d.pool_get_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) != CUDA_SUCCESS ||
      threshold != 0)
    return;
  threshold = ~cuuint64_t{0};
  d.pool_set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
}

}  // namespace

void* alloc_async(size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  const std::string who = "workspace";
  const Driver& d = driver(who);
  ContextScope scope(context_for_stream(stream, who), who);
  keep_pool_memory(d);
  CUdeviceptr ptr = 0;
  const CUresult rc = d.alloc_async(&ptr, bytes, static_cast<CUstream>(stream));
  if (rc != CUDA_SUCCESS) {
    throw Error(who, "cuMemAllocAsync(" + std::to_string(bytes) + " bytes) failed: " + describe(rc));
  }
  return reinterpret_cast<void*>(ptr);
}

void free_async(void* ptr, void* stream) {
  if (!ptr) return;
  const std::string who = "workspace";
  const Driver& d = driver(who);
  ContextScope scope(context_for_stream(stream, who), who);
  check(d.free_async(reinterpret_cast<CUdeviceptr>(ptr), static_cast<CUstream>(stream)), who,
        "cuMemFreeAsync");
}

void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  const std::string who = "checked mode";
  const Driver& d = driver(who);
  if (!d.memcpy_dtoh_async || !d.stream_synchronize)
    throw Error(who, "libcuda lacks cuMemcpyDtoHAsync / cuStreamSynchronize");
  ContextScope scope(context_for_stream(stream, who), who);
  const auto cu_stream = static_cast<CUstream>(stream);
  check(d.memcpy_dtoh_async(dst, reinterpret_cast<CUdeviceptr>(src), bytes, cu_stream), who,
        "cuMemcpyDtoHAsync");
  check(d.stream_synchronize(cu_stream), who, "cuStreamSynchronize");
}

const MappedMemory& fault_memory(int device) {
  static std::mutex mutex;
  static std::map<int, MappedMemory> blocks;
  const std::string who = "device fault record";
  if (device >= 0 && device < kCachedDevices)
    if (const MappedMemory* m = g_fault_memory[device].load(std::memory_order_acquire)) return *m;
  std::lock_guard lock(mutex);
  MappedMemory& m = blocks[device];  // std::map: the address stays valid as entries are added
  if (!m.host) {
    const Driver& d = driver(who);
    if (!d.host_alloc || !d.host_device_pointer)
      throw Error(who, "libcuda lacks cuMemHostAlloc / cuMemHostGetDevicePointer");
    ContextScope scope(primary_context(device, who), who);
    void* host = nullptr;
    check(d.host_alloc(&host, kFaultMemoryBytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), who,
          "cuMemHostAlloc");
    std::memset(host, 0, kFaultMemoryBytes);
    CUdeviceptr dev_ptr = 0;
    check(d.host_device_pointer(&dev_ptr, host, 0), who, "cuMemHostGetDevicePointer");
    m.device = reinterpret_cast<void*>(dev_ptr);
    m.host = host;  // kept for the process: kernels in flight or captured in graphs may write it
  }
  if (device >= 0 && device < kCachedDevices) g_fault_memory[device].store(&m, std::memory_order_release);
  return m;
}

void device_synchronize(int device) {
  const std::string who = "flashport.check";
  const Driver& d = driver(who);
  if (!d.ctx_synchronize) throw Error(who, "libcuda lacks cuCtxSynchronize");
  ContextScope scope(primary_context(device, who), who);
  check(d.ctx_synchronize(), who, "cuCtxSynchronize");
}

void memset_async(void* ptr, unsigned char value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  const std::string who = "workspace";
  const Driver& d = driver(who);
  ContextScope scope(context_for_stream(stream, who), who);
  check(d.memset_async(reinterpret_cast<CUdeviceptr>(ptr), value, bytes, static_cast<CUstream>(stream)), who,
        "cuMemsetD8Async");
}

}  // namespace flashport::jit
