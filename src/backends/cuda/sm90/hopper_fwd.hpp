// The Hopper (sm_90a) forward launcher: support check, TMA tensor maps, tile choice and launch of
// src/kernels/cuda/hopper/attn_fwd_sm90.cu (warp-specialised TMA + wgmma kernel).
#pragma once

#include <string>
#include <vector>

#include "core/problem.h"
#include "jit/jit.hpp"

namespace flashport::cuda::hopper {

/// Empty when the Hopper kernel covers `p` on a GPU of compute capability `arch` (major * 10 +
/// minor); otherwise why not (the portable sm80+ kernel then runs). Covers fp16/bf16 with out of
/// the same dtype, d == dv in {64, 96, 128, 192, 256}, dense or varlen (cu_seqlens, seqused_k),
/// causal / window / softcap / ALiBi / GQA / dropout (where dropout_fits), softmax scale > 0, 16-byte
/// aligned rows; and e4m3 (OCP e4m3fn) with (b, hk) descales, bf16 / fp16 out, d == dv in {128, 256},
/// without softcap / ALiBi / dropout. Not: paged or kv-cache K/V (block table, cache batch index, left
/// pad), e5m2 / e4m3fnuz, s_dmask.
std::string unsupported(const AttnProblem& p, int arch);

/// The forward family's heuristic (family.hpp): null when `p` fills the GPU with 128-row query tiles (two
/// per SM), else why the portable kernel, which splits the keys of decode-like calls, should run it. e4m3
/// calls go portable when FLASHPORT_HOPPER_FP8=0 (default 1 since its GPU suite passed:
/// docs/HOPPER_NOTES.md).
const char* declines(const AttnProblem& p, int arch);

/// The forward family's launch: forward() without the support check (the family table made it).
void launch(const AttnProblem& p, int arch);

/// Runs the forward of `p` on p.stream without synchronising. Throws Error when unsupported(p, 90)
/// is not empty or a tensor map cannot be encoded. With FLASHPORT_AUTOTUNE=1 the first problem of
/// each autotune bucket in a process takes autotune_shape()'s shape (tuning it when the store has
/// none: that call synchronises); head dims FLASHPORT_HOPPER_TILE names keep its shape.
void forward(const AttnProblem& p);

/// A forward shape chosen by autotuning: the tile and how many eighths of the exponentials run on
/// the FMA pipe.
struct TunedShape {
  int block_n = 0, stages = 0, exp_emu = 0, block_m = 0;
};

/// The autotuned shape of `p`'s bucket (head dim, causal = window_right == 0, dtype, persistent
/// mode): read from the autotune store (autotune.hpp) or, on a miss, found by timing the table's
/// shape and the timing alternatives on `p` itself and stored. Then runs the forward of `p` with
/// it, so p.o / p.lse hold that shape's result. Synchronises p.stream; ignores FLASHPORT_AUTOTUNE
/// and FLASHPORT_HOPPER_TILE (forward() consults it only with FLASHPORT_AUTOTUNE=1).
TunedShape autotune_shape(const AttnProblem& p);

/// The FP8 forward's V^T pass (fp8_v_transpose.cu), launched before the e4m3 kernel.
jit::KernelSpec fp8_transpose_spec(int arch);

/// Every Hopper forward kernel (element type x head dim) for `arch`; empty unless arch == 90.
std::vector<jit::KernelSpec> variants(int arch);

/// True for the Hopper forward kernel (register-resident accumulators: it must not spill).
bool is_main_kernel(const jit::KernelSpec& spec);

}  // namespace flashport::cuda::hopper
