// A tiny kernel for the JIT's own tests: it shows the pattern every kernel follows (no CUDA
// toolkit header, plain types, core headers by path, inline PTX for what headers would provide).

#include "core/numeric.h"
#include "cuda/common/grid_dependency.cuh"

#ifndef SELFTEST_SCALE
#define SELFTEST_SCALE 1.0f
#endif

#ifdef SELFTEST_BREAK
// Deliberate syntax error: the error-reporting test checks that this line reaches the message.
__device__ int selftest_broken = ;
#endif

namespace selftest {

/// 2^x with the hardware approximation, as cuda_fp16.h-free kernels do it.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace selftest

/// out[i] = bf16(2^(SELFTEST_SCALE * f16_to_f32(in[i]))) for i < n.
extern "C" __global__ void flashport_jit_selftest(const unsigned short* g_in, unsigned short* g_out, int n) {
  flashport::cuda::order_after_prior_grids();  // jit::launch may overlap it with the previous kernel
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = flashport::num::f16_to_f32(g_in[i]) * SELFTEST_SCALE;
  g_out[i] = flashport::num::f32_to_bf16(selftest::exp2_approx(x));
}
