// Kernel arguments of fp8_scale.cu (NVRTC-safe).
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

/// dst = src * descale per (sequence, kv head) over one operand of `p` (which: 0 q, 1 k, 2 v), rows of
/// `cols` elements at (batch, row, head). src of ElemType src_type (fp8 or 16/32-bit), dst of dst_type
/// (16/32-bit); dst may be src (in place: each element is read and written by one thread).
struct Fp8ScaleParams {
  AttnProblem p;  // sizes, cu_seqlens (the sequence of a packed row), descales
  Operand src, dst;
  int src_type, dst_type, which;
  long long batch, rows, heads, cols;  // varlen: batch 1, rows = total rows
};

}  // namespace flashport::cuda
