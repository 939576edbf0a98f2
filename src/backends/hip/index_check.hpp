// Device-side index checks on AMD (core/index_rules.h): the CDNA index_check kernel queued before a
// call's kernels, its fault reported to the next call; the CUDA backend's sequence
// (backends/cuda/index_check.hpp).
#pragma once

#include "backends/hip/hip_runtime.hpp"
#include "core/index_rules.h"

namespace flashport::amd {

/// Throws the index fault a kernel on `device` recorded for an earlier call, if any, and clears it.
/// Reads host memory only (no synchronisation); nothing to do before the device's first check.
void raise_device_fault(int device);

/// Queues index_check (`kernel(device)`: the backend's handle of it) for `p` on p.stream when `p` has
/// index tensors, unless checked mode validated them on the host already or FLASHPORT_DEVICE_CHECKS=0.
void check_indices_async(const AttnProblem& p, IndexCallKind call, KernelHandle (*kernel)(int device));

/// flashport::check_device: waits for every queued call on `device`, then raise_device_fault.
void synchronize_and_raise(int device);

}  // namespace flashport::amd
