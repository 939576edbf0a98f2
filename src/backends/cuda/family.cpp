// The family tables (see family.hpp) and the one place a call's kernel family is chosen.
#include "backends/cuda/family.hpp"

#include <cstdio>
#include <mutex>
#include <set>

#include "backends/cuda/sm80/backward.hpp"
#include "backends/cuda/sm80/forward.hpp"
#include "backends/cuda/sm90/hopper_bwd.hpp"
#include "backends/cuda/sm90/hopper_fwd.hpp"
#include "core/tuning.hpp"
#include "flashport/error.hpp"

namespace flashport::cuda {
namespace {

/// The portable families take every call CudaBackend::unsupported accepts.
std::string takes_every_call(const AttnProblem&, int) {
  return {};
}

constexpr ForwardFamily kForward[] = {
    {"hopper", 90, hopper::unsupported, hopper::declines, hopper::variants, hopper::is_main_kernel,
     hopper::launch},
    {"portable", 0, takes_every_call, nullptr, forward_variants, is_main_forward_kernel,
     [](const AttnProblem& p, int) { launch_forward(p); }},
};

constexpr BackwardFamily kBackward[] = {
    {"hopper",
     90,
     hopper_bwd::unsupported,
     nullptr,
     hopper_bwd::variants,
     hopper_bwd::is_main_kernel,
     {hopper_bwd::tiled_accumulator, [](const BwdParams&, int) { return 1; }, hopper_bwd::launch_main,
      hopper_bwd::dq_tile_counts}},
    {"portable",
     0,
     takes_every_call,
     nullptr,
     backward_main_variants,
     is_main_backward_kernel,
     {[](const AttnProblem&) { return 0; }, backward_slices, launch_backward_main,
      [](const BwdParams&) { return 0LL; }}},
};

/// Prints why `family` declined, the first time this reason comes up in the process.
void report_decline(const char* family, const std::string& reason) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  const std::string line = std::string("flashport: the ") + family + " kernels decline: " + reason;
  {
    std::lock_guard lock(mutex);
    if (!seen.insert(line).second) return;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

std::span<const ForwardFamily> forward_families() {
  return kForward;
}

std::span<const BackwardFamily> backward_families() {
  return kBackward;
}

template <class Family>
const Family& choose(std::span<const Family> table, const AttnProblem& p, int arch,
                     const std::string& forced) {
  const bool verbose = core::tuning().jit_verbose.get();
  for (size_t i = 0; i < table.size(); ++i) {
    const Family& f = table[i];
    const bool is_forced = !forced.empty() && forced == f.name;
    if (!forced.empty() && !is_forced && i + 1 < table.size()) {
      if (verbose) report_decline(f.name, "not the kernel family forced by the environment (" + forced + ")");
      continue;
    }
    // The arch test first: on other GPUs the reason (a string) is built only to be printed.
    if (f.only_arch && f.only_arch != arch) {
      if (verbose) report_decline(f.name, f.unsupported(p, arch));
      continue;
    }
    if (std::string why = f.unsupported(p, arch); !why.empty()) {
      if (verbose) report_decline(f.name, why);
      continue;
    }
    const char* declined = f.declines && !is_forced ? f.declines(p, arch) : nullptr;
    if (!declined) return f;
    if (verbose) report_decline(f.name, declined);
  }
  throw Error("q", "no CUDA kernel family takes this call");  // the last family takes every call
}

template const ForwardFamily& choose(std::span<const ForwardFamily>, const AttnProblem&, int,
                                     const std::string&);
template const BackwardFamily& choose(std::span<const BackwardFamily>, const AttnProblem&, int,
                                      const std::string&);

}  // namespace flashport::cuda
