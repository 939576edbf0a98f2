// The host side of device-reported index faults (index_rules.h): reading a device's fault record and
// turning a fault into the named Error its host-side twin would raise.
#pragma once

#include <string>

#include "core/index_rules.h"

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

}  // namespace flashport::core
