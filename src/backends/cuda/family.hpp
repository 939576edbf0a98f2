// Kernel families: the seam between the CUDA backend's dispatch and its kernels. Each operation (forward,
// backward) has one ordered table; a call's kernel is chosen once, by choose(), from it. Adding a family:
// a folder of launchers (sm80/, sm90/, ...) and a row in family.cpp.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/problem.h"
#include "jit/jit.hpp"
#include "kernels/cuda/bwd_params.cuh"

namespace flashport::cuda {

/// One family of kernels for one operation, and how to launch it. `Launch` is the operation's launch
/// interface. Plain function pointers: the tables are constant and a call allocates nothing to consult them.
template <class Launch>
struct KernelFamily {
  const char* name;  // what FLASHPORT_CUDA_FORWARD / FLASHPORT_CUDA_BACKWARD call it
  int only_arch;     // 0: every arch the backend takes; else the one arch its kernels compile for
  /// Empty when the family's kernels compute `p` on `arch`, else why not. Calls CudaBackend::unsupported
  /// accepted only.
  std::string (*unsupported)(const AttnProblem& p, int arch);
  /// Null, or a reason (static text) why the family, though it could, should not run `p` (a heuristic;
  /// a family forced by its knob ignores it). Null pointer member: no heuristic.
  const char* (*declines)(const AttnProblem& p, int arch);
  std::vector<jit::KernelSpec> (*variants)(int arch);   // every kernel it can launch (CI compiles them)
  bool (*is_main_kernel)(const jit::KernelSpec& spec);  // its kernels that must not spill
  Launch launch;
};

using ForwardFamily = KernelFamily<void (*)(const AttnProblem& p, int arch)>;

/// A backward main kernel between the shared D and dQ-convert steps (backward.cpp).
struct BackwardMain {
  int (*accum_tiled)(const AttnProblem& p);           // BwdParams::accum_tiled it reads and writes
  int (*slices)(const BwdParams& prm, int arch);      // BwdParams::num_slices it needs
  void (*main)(BwdParams& prm, int arch);             // D in prm.dsum, dq_accum zeroed: writes dk, dv, dQ
  long long (*dq_tile_counts)(const BwdParams& prm);  // BwdParams::dq_tile_count's length (0: none)
};
using BackwardFamily = KernelFamily<BackwardMain>;

/// The forward families, most specialised first: Hopper (sm_90a), then the portable one (sm_80+).
std::span<const ForwardFamily> forward_families();
/// The backward main-kernel families, in the same order.
std::span<const BackwardFamily> backward_families();

/// Whether `f` is `table`'s last family: the fallback that takes every call the backend accepts (the
/// portable one; for the forward, the family whose launcher also takes a num_splits).
template <class Family>
bool is_fallback(std::span<const Family> table, const Family& f) {
  return &f == &table.back();
}

/// The first family of `table` that takes `p` on `arch`. `forced` (a family name, or empty for
/// automatic: the FLASHPORT_CUDA_FORWARD / _BACKWARD knob) skips every other family but the last, the
/// fallback that takes every call the backend accepts; a forced family skips its `declines` heuristic.
/// With FLASHPORT_JIT_VERBOSE=1 each declining family's reason goes to stderr, once per distinct reason.
template <class Family>
const Family& choose(std::span<const Family> table, const AttnProblem& p, int arch,
                     const std::string& forced);

}  // namespace flashport::cuda
