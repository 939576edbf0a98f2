// The table of backends: the one place that names them all, so the core itself knows none.
#include "backends/cpu/cpu_backend.hpp"
#include "core/backend.hpp"
#ifdef FLASHPORT_WITH_CUDA
#include "backends/cuda/cuda_backend.hpp"
#endif
#ifdef FLASHPORT_WITH_HIP
#include "backends/hip/hip_backend.hpp"
#endif

namespace flashport::core {

const Backend* backend_for(DeviceType device) {
  switch (device) {
    case DeviceType::cpu:
      return &cpu::backend();
#ifdef FLASHPORT_WITH_CUDA
    case DeviceType::cuda:
      return cuda::backend();  // null when no driver/GPU is usable
#endif
#ifdef FLASHPORT_WITH_HIP
    case DeviceType::hip:
      return amd::backend();  // null when no HIP runtime/GPU is usable
#endif
    default:
      return nullptr;
  }
}

}  // namespace flashport::core
