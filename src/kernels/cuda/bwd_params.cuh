// Kernel arguments and shared-memory size of the CUDA backward kernels; shared by the host launcher
// (src/backends/cuda/backward.cpp) and the NVRTC-compiled kernels (attn_bwd*.cu).
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

/// Arguments of the three backward kernels (dot_do_o, main, dq_convert).
///
/// Scratch, fp32, allocated stream-ordered by the host:
/// - `dsum`: D_i = rowsum(dO_i * O_i), laid out like the LSE (lse_offset).
/// - `dq_accum`: (num_slices, hq, rows_total, accum_ld), row index `(varlen ? cu_seqlens_q[b] : b * sq)
///   + i`. Zeroed before the main kernel. Non-deterministic mode: one slice, CTAs add with atomics.
///   Deterministic mode: the main kernel runs `num_slices` CTAs per (kv head, batch); CTA x owns slice x
///   alone and visits key blocks x, x + num_slices, ... in order, adding without atomics; dq_convert
///   sums the slices in slice order. Either way dQ = scale * sum(slices).
struct BwdParams {
  AttnProblem p;
  float* dsum;
  float* dq_accum;
  long long rows_total;  // batch * sq (dense) or total_q (varlen)
  long long accum_ld;    // row pitch of dq_accum in floats (the head-dim bucket)
  int num_slices;        // >= 1; > 1 only in deterministic mode
  int vec;               // 1: every operand row is 16-byte aligned (cp.async, 16-byte accesses)
  int batch_offset;      // batch entry of grid z = 0 (launches are chunked: grid z <= 65535)
};

/// Dynamic shared memory of the main kernel, bytes: `stages` (1 or 2) buffers of Q and dO tiles
/// (block_m rows), K and V tiles (block_n rows), each row padded by 8 elements; then P and dS tiles
/// (block_m, block_n + 8). 16-bit elements throughout. attn_bwd.cu static_asserts that its carve-up
/// matches.
FP_HD constexpr int bwd_smem_bytes(int block_m, int block_n, int head_bucket, int stages) {
  return (2 * stages * block_m + 2 * block_n) * (head_bucket + 8) * 2 + 2 * block_m * (block_n + 8) * 2;
}

}  // namespace flashport::cuda
