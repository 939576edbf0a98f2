// Launcher of the CDNA index_check (kernels/hip/index_check.hpp) and the per-device fault record it
// writes (see index_check.hpp).
#include "backends/hip/index_check.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include "backends/hip/hip_runtime.hpp"
#include "core/index_fault.hpp"
#include "core/tuning.hpp"
#include "flashport/attention.hpp"
#include "hip/attn_fwd_config.hpp"  // kMaxGridYZ
#include "hip/index_check_config.hpp"

namespace flashport::amd {
namespace {

/// Each device's record once its first check is queued: before that there is nothing to read, and the
/// per-call poll must not allocate or lock.
constexpr int kTrackedDevices = 64;
std::atomic<FaultRecord*> g_records[kTrackedDevices];

FaultRecord* record_if_any(int device) {
  if (device < 0 || device >= kTrackedDevices) return nullptr;
  return g_records[device].load(std::memory_order_acquire);
}

}  // namespace

void raise_device_fault(int device) {
  FaultRecord* record = record_if_any(device);
  if (record && record->kind != kFaultNone) [[unlikely]]
    core::raise_recorded_fault(record, "hip:" + std::to_string(device));
}

void check_indices_async(const AttnProblem& p, IndexCallKind call, KernelHandle (*kernel)(int device)) {
  const bool indices =
      p.cu_seqlens_q || p.cu_seqlens_k || p.seqused_k || p.leftpad_k || p.kv_batch_idx || p.block_table;
  if (p.batch <= 0 || !indices || flashport::checked_mode() || !core::tuning().device_checks.get()) return;
  const MappedMemory& memory = fault_memory(p.device, sizeof(FaultRecord));
  if (p.device >= 0 && p.device < kTrackedDevices)
    g_records[p.device].store(static_cast<FaultRecord*>(memory.host), std::memory_order_release);
  IndexCheckParams prm{p, static_cast<FaultRecord*>(memory.device), call};
  // Block-table columns in chunks along y: a sequence uses at most ceil(sk / page_size) entries once its
  // scalar rules hold (index_rules.h); past the grid's y limit the waves stride over the rest.
  long long chunks = 1;
  if (p.block_table && p.page_size > 0) {
    const long long columns = (p.sk + p.page_size - 1) / p.page_size;
    chunks =
        std::clamp<long long>((columns + kIndexColumnsPerWave - 1) / kIndexColumnsPerWave, 1, kMaxGridYZ);
  }
  const unsigned blocks = (unsigned)((p.batch + kIndexWaves - 1) / kIndexWaves);
  launch(p.device, kernel(p.device), Launch{{blocks, (unsigned)chunks, 1}, (unsigned)kIndexThreads, &prm},
         p.stream);
}

void synchronize_and_raise(int device) {
  if (!record_if_any(device)) return;  // no check ever queued on the device: nothing can be recorded
  device_synchronize(device);
  raise_device_fault(device);
}

}  // namespace flashport::amd
