// What every Hopper (sm_90a) kernel shares with its host launcher: the shared-memory limit, the
// 128B-swizzle chunk geometry and the TMA descriptor types. Plain C++ (no standard or toolkit header):
// compiled by g++ and by NVRTC.
#pragma once

#include "core/problem.h"

namespace flashport::cuda::hopper {

/// Largest dynamic shared memory a block may opt into on sm_90 (227 KB).
inline constexpr int kSmemLimit = 232448;
/// Bytes of one 64-column row of a 128B-swizzled tile chunk (64 two-byte elements).
inline constexpr int kChunkRowBytes = 128;

/// 64-column chunks a head dim occupies in shared memory (d = 96 pads its second chunk with
/// TMA's zero fill).
FP_HD constexpr int head_dim_chunks(int d) {
  return (d + 63) / 64;
}

/// A CUtensorMap (128 bytes; CUDA 13 aligns it to 128, TMA needs at least 64), opaque to the kernel;
/// passed as a __grid_constant__ parameter so its address is a parameter-space address TMA reads.
struct alignas(128) TmaDesc {
  unsigned long long data[16];
};

/// Which tensor-map dimension (1..3) carries the head, row (token) and batch coordinate: the host
/// orders the three outer dimensions by stride, so any (b, s, h, d) stride order works.
struct TmaDims {
  int head, row, batch;
};

}  // namespace flashport::cuda::hopper
