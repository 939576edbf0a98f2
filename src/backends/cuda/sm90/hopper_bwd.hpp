// The Hopper (sm_90a) backward main kernel's launcher: support check, TMA tensor maps and launch of
// src/kernels/cuda/hopper/attn_bwd_sm90.cu (d <= 128) and attn_bwd_sm90_wide.cu (d 256). D = rowsum(dO * O)
// before it and the dQ conversion after it are the portable aux kernels (backward.cpp runs them around either
// main kernel; family.cpp's table puts it first).
#pragma once

#include <string>
#include <vector>

#include "jit/jit.hpp"
#include "kernels/cuda/bwd_params.cuh"

namespace flashport::cuda::hopper_bwd {

/// Empty when the Hopper backward covers `p` on a GPU of compute capability `arch` (major * 10 +
/// minor); otherwise why not (the portable sm80+ backward then runs). Covers fp16/bf16, d == dv in
/// {64, 96, 128, 192, 256}, dense or varlen (cu_seqlens, seqused_k), causal / local windows, GQA/MQA,
/// 16-byte aligned rows, softcap and ALiBi, deterministic mode, dropout where its tile's dQ mode allows
/// (without softcap and ALiBi; dropout_fits). Not: paged or kv-cache layouts.
std::string unsupported(const AttnProblem& p, int arch);

/// Whether dropout runs on the Hopper kernels at head dim d with this process's dQ mode
/// (FLASHPORT_HOPPER_BWD_DQ) and a tiled dQ accumulator unless FLASHPORT_HOPPER_BWD_DQ_ROWS=1: d 64,
/// 192, 256, and 128 with bulk dQ (dropout_fits in bwd_sm90_config.h).
bool takes_dropout(int d);

/// BwdParams::accum_tiled for the kernel that runs `p`: the column-block width of its tiled dQ accumulator
/// (64 at d 64 and 128, 128 at d 192 and 256), 0 for row-major: d 96, and batches of many sequences
/// shorter than 64 queries, whose tiles would pad each to 64 rows (FLASHPORT_HOPPER_BWD_DQ_ROWS).
int tiled_accumulator(const AttnProblem& p);

/// Deterministic mode: BwdParams::dq_tile_count's length, one turn counter per 64-query dQ tile of
/// every query head (the tiled row numbering, whatever the accumulator's layout); 0 otherwise.
long long dq_tile_counts(const BwdParams& prm);

/// The backward family's launch (family.hpp): runs the main kernel on prm.p.stream for a problem
/// unsupported(prm.p, arch) took. prm.dsum must hold D, prm.dq_accum must be zeroed (one slice, tiled
/// as tiled_accumulator says); writes dk, dv and adds the unscaled dQ partials into prm.dq_accum. Never
/// synchronises.
void launch_main(BwdParams& prm, int arch);

/// Every Hopper backward kernel (element type x head dim) for `arch`; empty unless arch == 90.
std::vector<jit::KernelSpec> variants(int arch);

/// True for the Hopper backward main kernel (register-resident accumulators: it must not spill).
bool is_main_kernel(const jit::KernelSpec& spec);

}  // namespace flashport::cuda::hopper_bwd
