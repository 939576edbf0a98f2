// Emulator stand-in for cuda/common/grid_dependency.cuh: the emulator runs one grid at a time, in order.
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::cuda {

inline void order_after_prior_grids() {}

}  // namespace flashport::cuda
