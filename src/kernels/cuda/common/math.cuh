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

/// tanh(x) by the SFU: tanh.approx.f32 (sm_75+), one MUFU operation, maximum relative error 2^-10.99
/// (flash-attn's softcap uses the same instruction). Within SPEC's rule where a cap multiplies it: the
/// bf16 baseline rounds the capped score itself to 2^-9 relative. 1 - 2 / (2^2x + 1) by ex2 and rcp is
/// exact to ~1e-7 but costs two SFU operations; with it the Hopper forward's softcap ran at 0.51-0.70x of
/// plain at d 64-128 (H200), SFU-bound.
FP_DEV float fast_tanh(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
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
