// The CPU fast path's bf16 forward on AMX-BF16 tiles (fast_amx.hpp) around the AVX-512 stages; the
// rest of its table (backward) is the AVX-512 copy's. Chosen at run time by fast_dispatch.cpp.
#include "backends/cpu/fast_common.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c,bmi2")
// GCC 12's unpack and conversion intrinsics pass an undefined register as their (unused) merge source,
// which -Wmaybe-uninitialized reports wherever they inline.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace flashport::cpu::fast::amx {

#define FAST_W 16
#define FAST_MR 6
#define FAST_NV 4
// Order matters: the kernels build on the SIMD helpers and the fp32 forward's stages.
#include "backends/cpu/fast_simd.hpp"

#include "backends/cpu/fast_forward.hpp"

#include "backends/cpu/fast_amx.hpp"

}  // namespace flashport::cpu::fast::amx

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace flashport::cpu::fast {
const Kernels* kernels_amx() {
  const Kernels* avx512 = kernels_avx512();
  if (!avx512) return nullptr;
  static const Kernels kernels{"avx512-amx",
                               &amx::amx_packed_floats,
                               &amx::amx_pack_kv,
                               &amx::amx_forward_block,
                               avx512->decode_block,  // decode streams K/V: AMX tiles would idle
                               avx512->pack_query_tile,
                               avx512->backward_block};
  return &kernels;
}
}  // namespace flashport::cpu::fast

#else

namespace flashport::cpu::fast {
const Kernels* kernels_amx() {
  return nullptr;
}
}  // namespace flashport::cpu::fast

#endif
