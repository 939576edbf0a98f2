// 64-bit index helpers: grid positions and sizes widened before any multiplication.
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::cuda {

/// ceil(a / b) for non-negative a, positive b.
FP_DEV constexpr i64 ceil_div(i64 a, i64 b) {
  return (a + b - 1) / b;
}

/// Block indices and the lane / warp of this thread, as the wide types offsets are built from.
FP_DEV i64 block_x() {
  return (i64)blockIdx.x;
}
FP_DEV i64 block_y() {
  return (i64)blockIdx.y;
}
FP_DEV i64 block_z() {
  return (i64)blockIdx.z;
}
FP_DEV int lane_id() {
  return (int)(threadIdx.x & 31u);
}
FP_DEV int warp_id() {
  return (int)(threadIdx.x >> 5);
}

/// The flat global thread index of a 1-D launch and the total thread count (for grid-stride loops).
FP_DEV i64 global_thread() {
  return (i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x;
}
FP_DEV i64 grid_threads() {
  return (i64)gridDim.x * (i64)blockDim.x;
}

/// Clamps v into [lo, hi].
FP_DEV i64 clamp_i64(i64 v, i64 lo, i64 hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

}  // namespace flashport::cuda
