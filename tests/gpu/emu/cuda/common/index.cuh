// Emulator stand-in for cuda/common/index.cuh.
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::cuda {

constexpr i64 ceil_div(i64 a, i64 b) {
  return (a + b - 1) / b;
}
inline i64 block_x() {
  return (i64)blockIdx.x;
}
inline i64 block_y() {
  return (i64)blockIdx.y;
}
inline i64 block_z() {
  return (i64)blockIdx.z;
}
inline int lane_id() {
  return (int)(threadIdx.x & 31u);
}
inline int warp_id() {
  return (int)(threadIdx.x >> 5);
}
inline i64 global_thread() {
  return (i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x;
}
inline i64 grid_threads() {
  return (i64)gridDim.x * (i64)blockDim.x;
}
inline i64 clamp_i64(i64 v, i64 lo, i64 hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

}  // namespace flashport::cuda
