// The portable backward main kernel (attn_bwd.cu: FlashAttention-2 style, sm_80+ mma.sync): tile table,
// kernel specs and launch. D before it and the dQ conversion after it are backward.cpp's.
#pragma once

#include <vector>

#include "jit/jit.hpp"
#include "kernels/cuda/bwd_params.cuh"

namespace flashport::cuda {

/// Shape of the main backward kernel (attn_bwd.cu): query rows per inner step, key rows per CTA, warps.
struct BwdTile {
  int block_m, block_n, warps;
};

/// The tile table, per (arch, head-dim bucket); backward.cpp gives each row's reason. FLASHPORT_BWD_TILE
/// ="block_m,block_n,warps" overrides it (for tuning; a shape with no warp split fails to compile with a
/// static_assert naming it).
BwdTile backward_tile(int arch, int bucket);

/// The main kernel for ElemType `elem_type` (kF16 / kBF16) and head-dim bucket `bucket`. `general`: it
/// handles softcap, ALiBi and dropout (else it must not get them). Knobs for comparing variants:
/// FLASHPORT_BWD_PIPE=0..3 (fragment pipelining, see attn_bwd.cu kPipe), FLASHPORT_BWD_GENERAL=1 (the
/// general kernel for every call) and FLASHPORT_BWD_STAGES=1|2 (Q/dO buffers; 2 only where it fits).
jit::KernelSpec backward_main_spec(int arch, int elem_type, int bucket, bool general);

/// Every main kernel the launcher can pick on `arch`.
std::vector<jit::KernelSpec> backward_main_variants(int arch);

/// True for the portable main backward kernel (must not spill registers).
bool is_main_backward_kernel(const jit::KernelSpec& spec);

/// Copies of the fp32 dQ accumulator the kernel writes for prm (row-major, prm.rows_total and accum_ld
/// set): 1, or in deterministic mode about one wave of CTAs, each owning a slice (see BwdParams).
int backward_slices(const BwdParams& prm, int arch);

/// Launches one of the backward kernels (D, main, dQ convert) with grid (grid_x, grid_y, batch) on
/// prm.p.stream, in batch chunks that fit grid z (BwdParams::batch_offset).
void launch_batch_chunks(const jit::Kernel& kernel, BwdParams& prm, unsigned grid_x, unsigned grid_y,
                         unsigned threads, int smem, int arch);

/// Runs the main kernel on prm.p.stream: prm.dsum holds D, prm.dq_accum is zeroed (prm.num_slices
/// row-major slices); writes dk, dv and adds dQ partials. Never synchronises.
void launch_backward_main(BwdParams& prm, int arch);

}  // namespace flashport::cuda
