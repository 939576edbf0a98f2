// Fast math and warp-level reductions for the CUDA kernels.
#pragma once

#include "core/semantics.h"
#include "cuda/common/types.cuh"

namespace flashport::cuda {

using sem::kLn2;
using sem::kLog2e;
using sem::kNegInf;
inline constexpr unsigned kFullMask = 0xffffffffu;

/// 2^x via the SFU (ex2.approx.ftz: ~2 ulp, subnormal results flushed to 0; 2^-inf = 0).
FP_DEV float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/// 1 / x via the SFU (rcp.approx.ftz: ~1 ulp; 1 / inf = 0).
FP_DEV float fast_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/// tanh(x) from x2 = 2 x log2(e) (callers fold the factor into their scale): 1 - 2 / (2^x2 + 1), two SFU
/// operations and no branch, within about 1e-7 of tanhf absolutely (enough where a cap multiplies it: the
/// softcap). tanhf and an IEEE division cost four quarter-rate operations and a branch per element.
FP_DEV float fast_tanh_exp2(float x2) {
  return 1.0f - 2.0f * fast_rcp(fast_exp2(x2) + 1.0f);
}

/// log2(x) via the SFU (lg2.approx.ftz; log2(0) = -inf).
FP_DEV float fast_log2(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/// Value of `v` held by lane `lane ^ mask`.
FP_DEV float shfl_xor(float v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}
FP_DEV u32 shfl_xor(u32 v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}
/// Value of `v` held by lane `src` (every lane of the warp takes part).
FP_DEV i64 shfl_i64(i64 v, int src) {
  return __shfl_sync(kFullMask, v, src);
}

/// Whether `v` holds on every lane of the warp.
FP_DEV bool warp_all(bool v) {
  return __all_sync(kFullMask, v);
}

/// Max / sum over the four lanes of a quad (lanes 4g..4g+3: the threads sharing an mma row).
FP_DEV float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}
FP_DEV float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}

/// Max / sum over the whole warp (every lane gets the result).
FP_DEV float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
  return v;
}
FP_DEV float warp_sum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}

}  // namespace flashport::cuda
