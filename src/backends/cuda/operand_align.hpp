// Whether an operand's rows allow 16-byte vector accesses: the launchers' choice between a kernel's
// vector and scalar paths (and the Hopper kernels' eligibility).
#pragma once

#include <cstdint>

#include "core/problem.h"

namespace flashport::cuda {

/// 16-byte aligned rows of `elem_bytes`-byte elements: the base pointer and every stride whole 16-byte
/// chunks.
inline bool rows_aligned(const Operand& t, int elem_bytes = 2) {
  const long long chunk = 16 / elem_bytes;
  return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.batch_stride % chunk == 0 &&
         t.row_stride % chunk == 0 && t.head_stride % chunk == 0;
}

}  // namespace flashport::cuda
