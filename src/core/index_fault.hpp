// The host side of device-reported index faults (index_rules.h): reading a device's fault record and
// turning a fault into the named Error its host-side twin would raise.
#pragma once

#include <atomic>
#include <string>

#include "core/index_rules.h"
#include "core/problem.h"

namespace flashport::core {

/// The argument a fault names and the reason, worded like validation's own message for the same input.
struct FaultText {
  std::string argument, message;
};
FaultText describe_fault(const IndexFault& f, int call);

/// When `record` holds a fault, clears it (so later calls run) and throws it as Error, saying it was
/// found on the GPU (`device_label`, e.g. "cuda:0") by an earlier call whose results are unreliable.
/// Reads host memory only: no synchronisation. A null record does nothing.
void raise_recorded_fault(FaultRecord* record, const std::string& device_label);

/// Whether a call on `p` gets a device index check: it has sequences and index tensors the host may not
/// read (cu_seqlens, seqused_k, cache_leftpad, cache_batch_idx, block_table), and neither checked mode
/// (which reads them on the host) nor FLASHPORT_DEVICE_CHECKS=0 turns the check off.
bool wants_device_check(const AttnProblem& p);

/// Grid y of a device index check: block-table columns in chunks of `columns_per_group` (a sequence uses
/// at most ceil(sk / page_size) entries once its scalar rules hold, index_rules.h), at least 1, at most
/// `max_grid_y` (past it the check's groups stride over the rest).
long long index_check_chunks(const AttnProblem& p, long long columns_per_group, long long max_grid_y);

/// Each device's fault record (host view of the mapped memory the checks write) once its first check is
/// queued: before that there is nothing to read, and the poll every call makes must not allocate or lock.
class DeviceFaultRecords {
 public:
  FaultRecord* get(int device) const {
    return device >= 0 && device < kTracked ? slots_[device].load(std::memory_order_acquire) : nullptr;
  }
  void publish(int device, FaultRecord* host) {
    if (device >= 0 && device < kTracked) slots_[device].store(host, std::memory_order_release);
  }
  /// raise_recorded_fault on `device`'s record, labelled "<backend>:<device>" (built only for a fault).
  void raise(int device, const char* backend) const {
    FaultRecord* record = get(device);
    if (record && record->kind != kFaultNone) [[unlikely]]
      raise_recorded_fault(record, std::string(backend) + ":" + std::to_string(device));
  }

 private:
  static constexpr int kTracked = 64;
  std::atomic<FaultRecord*> slots_[kTracked]{};
};

}  // namespace flashport::core
