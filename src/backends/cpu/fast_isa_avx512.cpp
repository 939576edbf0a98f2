// The CPU fast path's kernels compiled for AVX-512 (F, BW, DQ, VL) with FMA and F16C; chosen at run time by
// fast_dispatch.cpp.
#include "backends/cpu/fast_common.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi2")

namespace flashport::cpu::fast::avx512 {

#define FAST_W 16
#define FAST_MR 6
#define FAST_NV 4
// Order matters: the kernels build on the SIMD helpers.
#include "backends/cpu/fast_simd.hpp"

#include "backends/cpu/fast_forward.hpp"

#include "backends/cpu/fast_decode.hpp"

#include "backends/cpu/fast_backward.hpp"

}  // namespace flashport::cpu::fast::avx512

#pragma GCC pop_options

namespace flashport::cpu::fast {
const Kernels* kernels_avx512() {
  static const Kernels kernels{"avx512",
                               &avx512::packed_floats,
                               &avx512::pack_kv,
                               &avx512::forward_block,
                               &avx512::decode_block,
                               &avx512::pack_query_tile,
                               &avx512::backward_block};
  return &kernels;
}
}  // namespace flashport::cpu::fast

#else

namespace flashport::cpu::fast {
const Kernels* kernels_avx512() {
  return nullptr;
}
}  // namespace flashport::cpu::fast

#endif
