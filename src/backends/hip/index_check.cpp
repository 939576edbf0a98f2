// Launcher of the CDNA index_check (kernels/hip/index_check.hpp) and the per-device fault record it
// writes (see index_check.hpp).
#include "backends/hip/index_check.hpp"

#include "backends/hip/hip_runtime.hpp"
#include "core/index_fault.hpp"
#include "hip/attn_fwd_config.hpp"  // kMaxGridYZ
#include "hip/index_check_config.hpp"

namespace flashport::amd {
namespace {

core::DeviceFaultRecords g_records;

}  // namespace

void raise_device_fault(int device) {
  g_records.raise(device, "hip");
}

void check_indices_async(const AttnProblem& p, IndexCallKind call, KernelHandle (*kernel)(int device)) {
  if (!core::wants_device_check(p)) return;
  const MappedMemory& memory = fault_memory(p.device, sizeof(FaultRecord));
  g_records.publish(p.device, static_cast<FaultRecord*>(memory.host));
  IndexCheckParams prm{p, static_cast<FaultRecord*>(memory.device), call};
  const long long chunks = core::index_check_chunks(p, kIndexColumnsPerWave, kMaxGridYZ);
  const unsigned blocks = (unsigned)((p.batch + kIndexWaves - 1) / kIndexWaves);
  launch(p.device, kernel(p.device), Launch{{blocks, (unsigned)chunks, 1}, (unsigned)kIndexThreads, &prm},
         p.stream);
}

void synchronize_and_raise(int device) {
  if (!g_records.get(device)) return;  // no check ever queued on the device: nothing can be recorded
  device_synchronize(device);
  raise_device_fault(device);
}

}  // namespace flashport::amd
