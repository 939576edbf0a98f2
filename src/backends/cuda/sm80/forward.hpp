// Launchers of the portable (sm_80+) forward-side kernels: attention (with split-KV), kv-cache append,
// merge.
#pragma once

#include <functional>
#include <vector>

#include "core/backend.hpp"
#include "jit/jit.hpp"

namespace flashport::cuda {

/// Runs attention forward for `p` on the GPU that owns p.q.ptr, on p.stream. `num_splits`: 0 picks
/// split-KV by a heuristic (dense queries only), 1 disables it, > 1 asks for that many splits
/// (capped by the number of key tiles; ignored for varlen queries). `check_call` >= 0 (an IndexCallKind):
/// the call's device index check is still to be made: by the decode variant itself where it runs without a
/// block table (it reports a broken sequence rule; index_rules.h), else by index_check.cu queued first.
void launch_forward(const AttnProblem& p, int num_splits = 0, int check_call = -1);

/// True for decode-sized calls: query rows (the GQA group's heads packed in) fit one 16-row fragment. The
/// portable kernel's decode variant takes them (its warps split the keys, split-KV fills the GPU), and the
/// Hopper forward declines them: its 128-row tiles would hold a few rows each and one CTA per (batch, head)
/// streams the cache at a third of the decode variant's rate (H100, 32/8 heads, d 128: 1.0-1.3 TB/s).
bool decode_sized(const AttnProblem& p);

/// Every portable forward attention kernel for `arch` (split-KV combine, kv-cache and merge kernels are
/// variants.cpp's).
std::vector<jit::KernelSpec> forward_variants(int arch);
/// True for the portable forward attention kernel (must not spill registers).
bool is_main_forward_kernel(const jit::KernelSpec& spec);

/// Appends k_new/v_new into the cache (rotary on k), rotates q into stream-ordered scratch when
/// rotary is on, then attends over the updated cache through `attend` (the backend's kernel choice; the
/// scratch q lives until it returns).
void launch_forward_kvcache(const core::KvCacheProblem& kp,
                            const std::function<void(const AttnProblem&)>& attend);

/// merge_states on the GPU that owns mp.out.ptr.
void launch_merge_states(const core::MergeProblem& mp);

/// The number of splits launch_forward would use for `p` with the request `num_splits` (exposed for
/// tests and the benchmark driver).
int forward_num_splits(const AttnProblem& p, int num_splits);

}  // namespace flashport::cuda
