// libamdhip64 opened at run time: the entry points the AMD backend calls, typed from the HIP 5.2
// headers the build uses (the same ABI through ROCm 6: see device_arch_name), module loading per
// device and launches.
#define __HIP_PLATFORM_AMD__ 1
#include "backends/hip/hip_runtime.hpp"

#include <dlfcn.h>
#include <hip/hip_runtime_api.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/hip/code_objects.hpp"
#include "core/tuning.hpp"
#include "flashport/error.hpp"

namespace flashport::amd {
namespace {

struct Runtime {
  decltype(&::hipGetDeviceCount) device_count = nullptr;
  decltype(&::hipGetDevice) get_device = nullptr;
  decltype(&::hipSetDevice) set_device = nullptr;
  decltype(&::hipGetDeviceProperties) properties = nullptr;
  decltype(&::hipModuleLoadData) module_load = nullptr;
  decltype(&::hipModuleGetFunction) module_function = nullptr;
  decltype(&::hipModuleLaunchKernel) module_launch = nullptr;
  decltype(&::hipGetErrorString) error_string = nullptr;
  hipError_t (*malloc_async)(void**, size_t, hipStream_t) = nullptr;  // C entry (C++ adds a template)
  decltype(&::hipFreeAsync) free_async = nullptr;
  hipError_t (*host_malloc)(void**, size_t, unsigned int) = nullptr;  // C entry (C++ adds a template)
  hipError_t (*host_device_pointer)(void**, void*, unsigned int) = nullptr;
  decltype(&::hipDeviceSynchronize) synchronize = nullptr;
  int devices = 0;
  std::string unavailable;
};

template <class Fn>
bool resolve(void* handle, Fn& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn && missing.empty()) missing = name;
  return fn != nullptr;
}

Runtime load_runtime() {
  Runtime r;
  const std::string& configured = core::tuning().hip_runtime.get();
  const std::string path = configured.empty() ? "libamdhip64.so" : configured;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle && configured.empty()) handle = dlopen("libamdhip64.so.6", RTLD_NOW | RTLD_LOCAL);
  if (!handle && configured.empty()) handle = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    r.unavailable = path + " could not be opened (no ROCm HIP runtime): " + (why ? why : "");
    return r;
  }
  std::string missing;
  resolve(handle, r.device_count, "hipGetDeviceCount", missing);
  resolve(handle, r.get_device, "hipGetDevice", missing);
  resolve(handle, r.set_device, "hipSetDevice", missing);
  // ROCm 6 renamed the 6.x layout's query hipGetDevicePropertiesR0600 and kept this name for the 5.x
  // layout, which is the one these headers declare.
  resolve(handle, r.properties, "hipGetDeviceProperties", missing);
  resolve(handle, r.module_load, "hipModuleLoadData", missing);
  resolve(handle, r.module_function, "hipModuleGetFunction", missing);
  resolve(handle, r.module_launch, "hipModuleLaunchKernel", missing);
  resolve(handle, r.error_string, "hipGetErrorString", missing);
  resolve(handle, r.malloc_async, "hipMallocAsync", missing);
  resolve(handle, r.free_async, "hipFreeAsync", missing);
  resolve(handle, r.host_malloc, "hipHostMalloc", missing);
  resolve(handle, r.host_device_pointer, "hipHostGetDevicePointer", missing);
  resolve(handle, r.synchronize, "hipDeviceSynchronize", missing);
  if (!missing.empty()) {
    r.unavailable = path + " lacks " + missing;
    return r;
  }
  if (r.device_count(&r.devices) != hipSuccess || r.devices <= 0) {
    r.devices = 0;
    r.unavailable = "the HIP runtime sees no AMD GPU";
  }
  return r;
}

const Runtime& runtime() {
  static const Runtime r = load_runtime();
  return r;
}

void check(hipError_t status, const std::string& what) {
  if (status == hipSuccess) return;
  const char* text = runtime().error_string ? runtime().error_string(status) : nullptr;
  throw Error("hip", what + " failed: " + (text ? text : "error " + std::to_string((int)status)));
}

/// Makes `device` current for a scope and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(runtime().get_device(&previous_), "hipGetDevice");
    if (previous_ != device) check(runtime().set_device(device), "hipSetDevice");
  }
  ~DeviceScope() {
    int now = previous_;
    // A destructor cannot throw: a failed restore leaves the device as the call set it.
    if (runtime().get_device(&now) == hipSuccess && now != previous_) (void)runtime().set_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

const CodeObject* find_object(const std::string& name) {
  for (int i = 0; i < kCodeObjectCount; ++i) {
    if (name == kCodeObjects[i].name) return &kCodeObjects[i];
  }
  return nullptr;
}

}  // namespace

const std::string& runtime_unavailable() {
  return runtime().unavailable;
}

int device_count() {
  return runtime().devices;
}

namespace {
/// What the backend asks of a device's properties, read once per device.
struct DeviceInfo {
  std::string arch_name;
  int cu_count;
};
const DeviceInfo& device_info(int device) {
  static std::mutex mu;
  static std::map<int, DeviceInfo> infos;
  std::lock_guard<std::mutex> lock(mu);
  auto it = infos.find(device);
  if (it != infos.end()) return it->second;
  hipDeviceProp_t prop;
  std::memset(&prop, 0, sizeof prop);
  check(runtime().properties(&prop, device), "hipGetDeviceProperties(" + std::to_string(device) + ")");
  prop.gcnArchName[sizeof prop.gcnArchName - 1] = '\0';
  return infos.emplace(device, DeviceInfo{prop.gcnArchName, prop.multiProcessorCount}).first->second;
}
}  // namespace

const std::string& device_arch_name(int device) {
  return device_info(device).arch_name;
}

int device_cu_count(int device) {
  return device_info(device).cu_count;
}

KernelHandle kernel(int device, const std::string& object, const char* entry) {
  // Modules stay loaded for the process (like the CUDA backend's): a kernel handle must outlive calls.
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, hipFunction_t> loaded;
  const std::string key_name = object + ":" + entry;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find({device, key_name});
  if (it != loaded.end()) return it->second;
  const CodeObject* co = find_object(object);
  if (!co) throw Error("hip", "this build has no code object " + object + " (cmake/hip_kernels.cmake)");
  DeviceScope scope(device);
  hipModule_t module = nullptr;
  check(runtime().module_load(&module, co->data), "hipModuleLoadData(" + object + ")");
  hipFunction_t fn = nullptr;
  check(runtime().module_function(&fn, module, entry), "hipModuleGetFunction(" + object + ", " + entry + ")");
  loaded.emplace(std::make_pair(device, key_name), fn);
  return fn;
}

namespace {
std::mutex g_cached_mu;
std::unordered_map<unsigned long long, KernelHandle>& cached_handles() {
  static std::unordered_map<unsigned long long, KernelHandle> handles;
  return handles;
}
unsigned long long cache_key(int device, unsigned key) {
  return (unsigned long long)(unsigned)device << 32 | key;
}
}  // namespace

KernelHandle find_cached(int device, unsigned key) {
  std::lock_guard<std::mutex> lock(g_cached_mu);
  const auto it = cached_handles().find(cache_key(device, key));
  return it == cached_handles().end() ? nullptr : it->second;
}

KernelHandle store_cached(int device, unsigned key, KernelHandle k) {
  std::lock_guard<std::mutex> lock(g_cached_mu);
  cached_handles().emplace(cache_key(device, key), k);
  return k;
}

void* alloc_async(int device, size_t bytes, void* stream) {
  DeviceScope scope(device);
  void* ptr = nullptr;
  check(runtime().malloc_async(&ptr, bytes, static_cast<hipStream_t>(stream)),
        "hipMallocAsync(" + std::to_string(bytes) + " bytes)");
  return ptr;
}

void free_async(int device, void* ptr, void* stream) {
  DeviceScope scope(device);
  check(runtime().free_async(ptr, static_cast<hipStream_t>(stream)), "hipFreeAsync");
}

const MappedMemory& fault_memory(int device, size_t bytes) {
  static std::mutex mu;
  static std::map<int, MappedMemory> blocks;
  std::lock_guard<std::mutex> lock(mu);
  auto it = blocks.find(device);
  if (it != blocks.end()) return it->second;
  DeviceScope scope(device);
  MappedMemory m{nullptr, nullptr};
  check(runtime().host_malloc(&m.host, bytes, hipHostMallocMapped | hipHostMallocCoherent), "hipHostMalloc");
  std::memset(m.host, 0, bytes);
  check(runtime().host_device_pointer(&m.device, m.host, 0), "hipHostGetDevicePointer");
  return blocks.emplace(device, m).first->second;
}

void device_synchronize(int device) {
  DeviceScope scope(device);
  check(runtime().synchronize(), "hipDeviceSynchronize");
}

void launch(int device, KernelHandle k, const Launch& l, void* stream) {
  DeviceScope scope(device);
  void* params[] = {const_cast<void*>(l.args)};  // the kernel's one by-value struct parameter
  check(runtime().module_launch(static_cast<hipFunction_t>(k), l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1,
                                0, static_cast<hipStream_t>(stream), params, nullptr),
        "hipModuleLaunchKernel");
}

}  // namespace flashport::amd
