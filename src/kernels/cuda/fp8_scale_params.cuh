// Kernel arguments of fp8_scale.cu (NVRTC-safe).
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

/// Threads per block, and columns per thread: consecutive threads take consecutive chunks of a row, so a
/// warp reads 32 x 8 contiguous elements of a dense operand (one thread per whole row read 32 rows a head
/// apart). The launcher sizes the grid with both.
constexpr int kFp8ScaleThreads = 128;
constexpr int kFp8ScaleChunk = 8;

/// One operand of an fp8_scale pass: rows of `cols` elements at (batch, row, head).
struct Fp8ScaleOperand {
  Operand src, dst;
  long long rows, heads, cols;  // varlen: rows = total rows (Fp8ScaleParams::batch is then 1)
};

/// dst = src * descale per (sequence, kv head) over q, k and v of `p` at once (grid y: 0 q, 1 k, 2 v). src
/// of ElemType src_type (fp8 or 16/32-bit), dst of dst_type (16/32-bit); dst may be src (in place: each
/// element is read and written by one thread).
struct Fp8ScaleParams {
  AttnProblem p;  // sizes, cu_seqlens (the sequence of a packed row), descales
  Fp8ScaleOperand op[3];
  int src_type, dst_type;
  long long batch;
};

}  // namespace flashport::cuda
