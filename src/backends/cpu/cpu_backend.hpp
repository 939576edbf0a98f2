// The CPU backend: the fp64 reference (the oracle), the same-precision baseline, and the fast path.
#pragma once

#include "core/backend.hpp"

namespace flashport::cpu {

const core::Backend& backend();

}  // namespace flashport::cpu
