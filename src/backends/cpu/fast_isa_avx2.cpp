// The CPU fast path's kernels compiled for AVX2 with FMA and F16C; chosen at run time by fast_dispatch.cpp.
#include "backends/cpu/fast_common.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")

namespace flashport::cpu::fast::avx2 {

#define FAST_W 8
#define FAST_MR 3
#define FAST_NV 4
// Order matters: the kernels build on the SIMD helpers.
#include "backends/cpu/fast_simd.hpp"

#include "backends/cpu/fast_forward.hpp"

#include "backends/cpu/fast_decode.hpp"

#include "backends/cpu/fast_backward.hpp"

}  // namespace flashport::cpu::fast::avx2

#pragma GCC pop_options

namespace flashport::cpu::fast {
const Kernels* kernels_avx2() {
  static const Kernels kernels{"avx2",
                               &avx2::packed_floats,
                               &avx2::pack_kv,
                               &avx2::forward_block,
                               &avx2::decode_block,
                               &avx2::pack_query_tile,
                               &avx2::backward_block};
  return &kernels;
}
}  // namespace flashport::cpu::fast

#else

namespace flashport::cpu::fast {
const Kernels* kernels_avx2() {
  return nullptr;
}
}  // namespace flashport::cpu::fast

#endif
