// The HIP runtime as the AMD backend uses it: libamdhip64 opened at run time (so the library loads on
// machines without ROCm), each device's architecture, code objects loaded once per device, launches on
// the caller's stream. HIP's own types stay inside hip_runtime.cpp.
#pragma once

#include <cstddef>
#include <string>

#include "core/stream_scratch.hpp"

namespace flashport::amd {

/// A loaded kernel (hipFunction_t) of one device.
using KernelHandle = void*;

/// Grid and block of one launch; `args` is the kernel's single by-value parameter (all our HIP kernels
/// take one struct).
struct Launch {
  unsigned grid[3];
  unsigned block;
  const void* args;
};

/// Why the runtime cannot be used ("" when it can): the library (FLASHPORT_HIP_RUNTIME, else
/// libamdhip64.so) is missing or lacks an entry point, or it sees no device.
const std::string& runtime_unavailable();

/// Devices the runtime sees (0 when unavailable).
int device_count();

/// hipDeviceProp_t::gcnArchName of `device`, e.g. "gfx942:sramecc+:xnack-"; cached per device.
const std::string& device_arch_name(int device);

/// hipDeviceProp_t::multiProcessorCount of `device`: its compute units (304 on an MI300X); cached.
int device_cu_count(int device);

/// The kernel `entry` of the embedded code object `object` ("gfx942/attn_fwd_bf16_d128.co"), loaded
/// into `device` on first use (thread safe). Throws flashport::Error naming the object when the build
/// has no such code object or the runtime refuses it.
KernelHandle kernel(int device, const std::string& object, const char* entry);

/// kernel(device, object(), entry) cached under an integer `key` that names the variant (the caller's
/// encoding; `object` and `entry` must be the same for a key): after the first call a lookup by
/// (device, key) with no string work, as the CUDA backend's per-spec cache does.
template <class ObjectName>
KernelHandle cached_kernel(int device, unsigned key, const ObjectName& object, const char* entry);

/// The cache behind cached_kernel: the handle of (device, key), or null when not yet loaded.
KernelHandle find_cached(int device, unsigned key);
KernelHandle store_cached(int device, unsigned key, KernelHandle k);

template <class ObjectName>
KernelHandle cached_kernel(int device, unsigned key, const ObjectName& object, const char* entry) {
  if (KernelHandle k = find_cached(device, key)) return k;
  return store_cached(device, key, kernel(device, object(), entry));
}

/// Stream-ordered device memory (hipMallocAsync / hipFreeAsync): usable by work queued on `stream`
/// after the call, returned to the pool once that work is done. Coarse-grained device memory, which
/// the backward's fp32 atomics need.
void* alloc_async(int device, size_t bytes, void* stream);
void free_async(int device, void* ptr, void* stream);
/// alloc_async's memory owned by one library call (core::StreamScratch: free() at the call's end, or the
/// destructor on an error path).
struct FreeOnStream {
  int device;
  void* stream;
  void operator()(void* ptr) const { free_async(device, ptr, stream); }
};
class AsyncScratch : public core::StreamScratch<FreeOnStream> {
 public:
  AsyncScratch(int device, size_t bytes, void* stream)
      : StreamScratch(alloc_async(device, bytes, stream), FreeOnStream{device, stream}) {}
};

/// The device's index-fault record (core/index_rules.h's FaultRecord): `bytes` of host memory the GPU
/// writes through (hipHostMalloc, mapped and coherent), zeroed, allocated on the device's first call and
/// kept for the process; `host` and `device` address the same bytes. Thread safe.
struct MappedMemory {
  void* host;
  void* device;
};
const MappedMemory& fault_memory(int device, size_t bytes);

/// Waits for all work queued on `device` (hipDeviceSynchronize).
void device_synchronize(int device);

/// Queues `launch` of `k` on `stream` (a hipStream_t; null is the default stream) with `device`
/// current; no synchronisation. Throws flashport::Error with HIP's message on failure.
void launch(int device, KernelHandle k, const Launch& launch, void* stream);

}  // namespace flashport::amd
