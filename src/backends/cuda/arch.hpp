// What one GPU generation allows a launch: the one table every launcher and tile table asks.
#pragma once

#include <algorithm>

namespace flashport::cuda {

struct ArchLimits {
  int smem_per_block;     // bytes of shared memory one block may opt in to (static + dynamic)
  long long max_grid_yz;  // grid dimensions y and z (x is 2^31 - 1 everywhere)
};

/// Limits of compute capability `arch` (major * 10 + minor), from the CUDA programming guide's table of
/// technical specifications. Unlisted archs get the smallest opt-in size of sm_80 and later (99 KB), so a
/// new GPU starts on tiles that fit.
constexpr ArchLimits limits(int arch) {
  constexpr long long kGridYZ = 65535;
  switch (arch) {
    case 80:
    case 87:
      return {163 * 1024, kGridYZ};  // A100, Orin
    case 90:
    case 100:
    case 103:
    case 110:
      return {227 * 1024, kGridYZ};  // H100/H200, B200/B300, Thor
    default:
      return {99 * 1024, kGridYZ};  // sm_86, sm_89, sm_120/121 (consumer and workstation parts)
  }
}

/// Calls `launch(b0, nb)` for the batch entries [b0, b0 + nb), in chunks that fit grid z on `arch`: the
/// kernels that put the batch in grid z take the chunk's first entry as a parameter.
template <class Launch>
void for_batch_chunks(long long batch, int arch, Launch&& launch) {
  const long long chunk = limits(arch).max_grid_yz;
  for (long long b0 = 0; b0 < batch; b0 += chunk) launch(b0, std::min(chunk, batch - b0));
}

}  // namespace flashport::cuda
