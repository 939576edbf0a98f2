// The Hopper backward main kernel's contract with its host launcher: tile table, shared-memory size and
// the kernel parameter block. Plain C++ (no standard or toolkit header): compiled by g++ and by NVRTC.
#pragma once

#include "cuda/bwd_params.cuh"
#include "cuda/hopper/sm90_config.h"

namespace flashport::cuda::hopper_bwd {

using hopper::head_dim_chunks;
using hopper::kChunkRowBytes;
using hopper::kSmemLimit;
using hopper::TmaDesc;
using hopper::TmaDims;

/// Threads per CTA: warpgroup 0 produces (one thread issues TMA, one warp stages LSE and D, two warps
/// add dQ to global memory), warpgroups 1 and 2 consume, each owning 64 of the CTA's keys (the M of one
/// wgmma).
inline constexpr int kThreads = 384;
/// Keys per CTA: 64 per consumer warpgroup.
inline constexpr int kBlockN = 128;

/// One backward tile: query rows per step (the N of S^T = K Q^T) and Q/dO/LSE/D ring depth.
struct Tile {
  int block_m, stages;
};

/// Per head dim (d == dv): 64 queries per step. Registers per consumer thread: dK + dV (64 keys x padded
/// d, fp32) = d, S^T and dP^T = 64, their bf16 A operands 32, dQ (64 x 64) 32, under setmaxnreg's 232
/// with room for addresses:
///   d    dK+dV   S+dP   dQ   dQ split between the consumers
///   64   64      64     32   by keys (each its own 64 keys, all 64 columns; partial tiles summed)
///   96   128     64     32   by columns (each 64 of the padded 128, all 128 keys)
///   128  128     64     32   by columns
/// 128 queries per step at d 64 (S + dP 128 registers) spilled (ptxas, CUDA 13). d 192 and 256 would
/// need 192-256 registers for dK + dV alone: they stay on the portable kernel.
FP_HD constexpr Tile tile_for(int d) {
  switch (d) {
    case 64:
    case 96:
    case 128:
      return {64, 2};
    default:
      return {0, 0};
  }
}

/// Bytes of the kernel's SharedStorage (attn_bwd_sm90.cu static_asserts equality) plus 1 KB for aligning
/// its base to the 1024-byte swizzle period: K and V (kBlockN rows), stages x (Q, dO) (block_m rows),
/// each row d/64 chunks of 128 bytes; two dS^T buffers (kBlockN keys x block_m queries, 2 bytes); the
/// step's dQ (two 64 x 64 fp32 tiles); stages x (LSE, D) (block_m floats); 3 + 2 x stages mbarriers;
/// padded to 1024.
FP_HD constexpr int smem_bytes(int d, Tile t) {
  const int chunk_rows = kBlockN * 2 + t.stages * t.block_m * 2;
  const int tiles = head_dim_chunks(d) * kChunkRowBytes * chunk_rows + 2 * kBlockN * t.block_m * 2;
  const int rest = 2 * 64 * 64 * 4 + t.stages * t.block_m * 4 * 2 + 8 * (3 + 2 * t.stages);
  return (tiles + rest + 1023) / 1024 * 1024 + 1024;
}

/// Kernel parameters besides the four tensor maps (q, k, v, dout).
struct BwdSm90Params {
  BwdParams bwd;
  TmaDims dims_q, dims_k, dims_v, dims_do;
};

}  // namespace flashport::cuda::hopper_bwd
