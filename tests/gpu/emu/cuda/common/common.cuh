// Emulator stand-in for cuda/common/common.cuh.
#pragma once

#include "cuda/common/async_copy.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/index.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/types.cuh"
