// The CPU fast path's kernels compiled for AVX2 with FMA and F16C; chosen at run time by fast_dispatch.cpp.
#include "backends/cpu/fast_common.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")

namespace flashport::cpu::fast::avx2 {

#define FAST_W 8
// 6 x 2 vectors: 12 accumulators, 2 B vectors and 1 broadcast fill 15 of the 16 ymm registers (BLIS's
// Haswell shape). 3 x 4 needed 17 and read one B vector from memory three times a step: measured here
// (one thread, L1-resident, 2026-12-04) the same on S = K Q^T (109 GFLOPS) but 10% slower on the
// forward's P V (91 vs 101) and 5-10% slower on the backward's row-operand products.
#define FAST_MR 6
#define FAST_NV 2
// The micro-kernel's reduction loop unrolled 4 times: rolled, GCC reloaded the A stride from the stack
// and paid the loop's compare and branch every 12 FMAs. Measured here (Xeon, 2 threads, AVX2 forced,
// d 128 non-causal 2k, 6 interleaved runs): forward 190 -> 203 GFLOPS f32, 193 -> 206 bf16. The same
// unroll in the AVX-512 copy moved its cells by -3% to +3% (noise-sized), so only AVX2 takes it.
#define FAST_KUNROLL 4
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
