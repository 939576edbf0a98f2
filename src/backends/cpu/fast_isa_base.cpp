// The CPU fast path's kernels for the baseline target (SSE2 on x86-64, whatever the host compiler
// targets elsewhere): the fallback on CPUs without AVX2 and the reference for the wider builds.
#include "backends/cpu/fast_common.hpp"

namespace flashport::cpu::fast::base {

#define FAST_W 4
#define FAST_MR 3
#define FAST_NV 4
// Order matters: the kernels build on the SIMD helpers.
#include "backends/cpu/fast_simd.hpp"

#include "backends/cpu/fast_forward.hpp"

#include "backends/cpu/fast_decode.hpp"

#include "backends/cpu/fast_backward.hpp"

}  // namespace flashport::cpu::fast::base

namespace flashport::cpu::fast {
const Kernels& kernels_base() {
  static const Kernels kernels{"base",
                               &base::packed_floats,
                               &base::pack_kv,
                               &base::forward_block,
                               &base::decode_block,
                               &base::pack_query_tile,
                               &base::backward_block};
  return kernels;
}
}  // namespace flashport::cpu::fast
