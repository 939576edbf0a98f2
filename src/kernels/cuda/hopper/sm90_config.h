// What every Hopper (sm_90a) kernel shares with its host launcher: the shared-memory limit, the
// 128B-swizzle chunk geometry and the TMA descriptor types. Plain C++ (no standard or toolkit header):
// compiled by g++ and by NVRTC.
#pragma once

#include "core/problem.h"

namespace flashport::cuda::hopper {

/// Largest dynamic shared memory a block may opt into on sm_90 (227 KB).
inline constexpr int kSmemLimit = 232448;
/// Bytes of one row of a 128B-swizzled tile chunk (64 two-byte or 128 one-byte elements).
inline constexpr int kChunkRowBytes = 128;

/// 128-byte chunks `d` columns of `elem_bytes` occupy in shared memory (d = 96 pads its second chunk
/// with TMA's zero fill).
FP_HD constexpr int head_dim_chunks(int d, int elem_bytes = 2) {
  return (d * elem_bytes + kChunkRowBytes - 1) / kChunkRowBytes;
}

/// Bytes of one chunk row of a Q / K tile, which is also its swizzle span: 128, or 64 where the whole row
/// is 64 bytes (the FP8 forward at d 64: the 64-byte swizzle, so Q K^T does no padded work).
FP_HD constexpr int chunk_row_bytes(int d, int elem_bytes = 2) {
  return d * elem_bytes == 64 ? 64 : kChunkRowBytes;
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

/// Tensor-map coordinates 1..3 of a (head, row, batch) position under `dims`.
struct TmaOuter {
  int c1, c2, c3;
};
FP_HD constexpr TmaOuter outer_coords(const TmaDims& dims, int head, int row, int batch) {
  return {dims.head == 1  ? head
          : dims.row == 1 ? row
                          : batch,
          dims.head == 2  ? head
          : dims.row == 2 ? row
                          : batch,
          dims.head == 3  ? head
          : dims.row == 3 ? row
                          : batch};
}

}  // namespace flashport::cuda::hopper
