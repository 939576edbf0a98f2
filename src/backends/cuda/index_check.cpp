// Launcher of index_check.cu and the per-device fault record it writes (see index_check.hpp).
#include "backends/cuda/index_check.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/variants.hpp"
#include "core/index_fault.hpp"
#include "core/tuning.hpp"
#include "flashport/attention.hpp"
#include "jit/jit.hpp"
#include "kernels/cuda/index_check_params.cuh"

namespace flashport::cuda {
namespace {

static_assert(sizeof(FaultRecord) <= jit::kFaultMemoryBytes, "the fault record must fit its mapped memory");

constexpr int kWarpsPerBlock = 4;  // index_check.cu: one warp per sequence

/// Devices whose fault record exists (set by the first check queued there): before that there is
/// nothing to read, and polling must not allocate (a call may be inside a graph capture).
constexpr int kTrackedDevices = 64;
std::atomic<bool> g_has_record[kTrackedDevices];

FaultRecord* record_if_any(int device) {
  if (device < 0 || device >= kTrackedDevices) return nullptr;
  if (!g_has_record[device].load(std::memory_order_acquire)) return nullptr;
  return static_cast<FaultRecord*>(jit::fault_memory(device).host);
}

bool has_device_indices(const AttnProblem& p) {
  return p.cu_seqlens_q || p.cu_seqlens_k || p.seqused_k || p.leftpad_k || p.kv_batch_idx || p.block_table;
}

}  // namespace

void raise_device_fault(int device) {
  // Every CUDA call passes here: the label is built only when there is a fault to raise.
  FaultRecord* record = record_if_any(device);
  if (record && record->kind != kFaultNone) [[unlikely]]
    core::raise_recorded_fault(record, "cuda:" + std::to_string(device));
}

void check_indices_async(const AttnProblem& p, IndexCallKind call) {
  if (p.batch <= 0 || !has_device_indices(p) || flashport::checked_mode() ||
      !core::tuning().device_checks.get())
    return;
  const jit::MappedMemory& memory = jit::fault_memory(p.device);
  if (p.device >= 0 && p.device < kTrackedDevices)
    g_has_record[p.device].store(true, std::memory_order_release);
  IndexCheckParams prm{p, static_cast<FaultRecord*>(memory.device), call};
  const int arch = jit::device_arch(p.device);
  const jit::Kernel& kernel = cached_kernel(index_check_spec, p.device, 0, arch);
  void* args[] = {&prm};
  const long long blocks = (p.batch + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // Block-table columns in chunks along y: a sequence uses at most ceil(sk / page_size) entries once its
  // scalar rules hold (index_rules.h); past the grid's y limit the warps stride over the rest.
  long long chunks = 1;
  if (p.block_table && p.page_size > 0) {
    const long long columns = (p.sk + p.page_size - 1) / p.page_size;
    chunks = std::clamp<long long>((columns + kIndexCheckColumnsPerWarp - 1) / kIndexCheckColumnsPerWarp, 1,
                                   limits(arch).max_grid_yz);
  }
  jit::launch(kernel, (unsigned)blocks, (unsigned)chunks, 1, 32 * kWarpsPerBlock, 0, p.stream, args);
}

void synchronize_and_raise(int device) {
  if (!record_if_any(device)) return;  // no check ever queued on the device: nothing can be recorded
  jit::device_synchronize(device);
  raise_device_fault(device);
}

}  // namespace flashport::cuda
