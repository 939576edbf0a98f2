// Launcher of index_check.cu and the per-device fault record it writes (see index_check.hpp).
#include "backends/cuda/index_check.hpp"

#include "backends/cuda/arch.hpp"
#include "backends/cuda/variants.hpp"
#include "core/index_fault.hpp"
#include "jit/jit.hpp"
#include "kernels/cuda/index_check_params.cuh"

namespace flashport::cuda {
namespace {

static_assert(sizeof(FaultRecord) <= jit::kFaultMemoryBytes, "the fault record must fit its mapped memory");

constexpr int kWarpsPerBlock = 4;  // index_check.cu: one warp per sequence

core::DeviceFaultRecords g_records;

}  // namespace

void raise_device_fault(int device) {
  g_records.raise(device, "cuda");  // every CUDA call passes here
}

FaultRecord* in_kernel_fault_record(const AttnProblem& p) {
  if (!core::wants_device_check(p)) return nullptr;
  const jit::MappedMemory& memory = jit::fault_memory(p.device);
  g_records.publish(p.device, static_cast<FaultRecord*>(memory.host));
  return static_cast<FaultRecord*>(memory.device);
}

void check_indices_async(const AttnProblem& p, IndexCallKind call) {
  FaultRecord* record = in_kernel_fault_record(p);
  if (!record) return;
  IndexCheckParams prm{p, record, call};
  const int arch = jit::device_arch(p.device);
  const jit::Kernel& kernel = cached_kernel(index_check_spec, p.device, 0, arch);
  void* args[] = {&prm};
  const long long blocks = (p.batch + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const long long chunks = core::index_check_chunks(p, kIndexCheckColumnsPerWarp, limits(arch).max_grid_yz);
  // Launched while its predecessor finishes (jit::LaunchOrder), as the forward-side kernels after it are.
  jit::launch(kernel, (unsigned)blocks, (unsigned)chunks, 1, 32 * kWarpsPerBlock, 0, p.stream, args, 1,
              jit::LaunchOrder::overlap_prior);
}

void synchronize_and_raise(int device) {
  if (!g_records.get(device)) return;  // no check ever queued on the device: nothing can be recorded
  jit::device_synchronize(device);
  raise_device_fault(device);
}

}  // namespace flashport::cuda
