// Device-side index checks (core/index_rules.h): queued before a call's kernels, reported to the next.
#pragma once

#include "core/index_rules.h"

namespace flashport::cuda {

/// Throws the index fault a kernel on `device` recorded for an earlier call, if any, and clears it.
/// Reads host memory only (no synchronisation); nothing to do before the device's first check.
void raise_device_fault(int device);

/// Queues index_check.cu for `p` on p.stream when `p` has index tensors in device memory, unless
/// checked mode validated them on the host already or FLASHPORT_DEVICE_CHECKS=0.
void check_indices_async(const AttnProblem& p, IndexCallKind call);

/// Where a kernel that checks `p`'s index tensors itself (the decode variant of kvcache calls) reports: the
/// device's fault record, published for raise_device_fault; null when `p` wants no device check
/// (check_indices_async would queue nothing).
FaultRecord* in_kernel_fault_record(const AttnProblem& p);

/// flashport::check_device: waits for every queued call on `device`, then raise_device_fault.
void synchronize_and_raise(int device);

}  // namespace flashport::cuda
