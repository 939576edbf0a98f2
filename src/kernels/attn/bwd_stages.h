// The backward's per-element rule, written once for the CUDA portable backwards (kernels/cuda/attn_bwd.cu,
// mma.sync; attn_bwd_f32.cu, fp32 inputs) and the CDNA backward (kernels/hip/attn_bwd.hpp, MFMA). The
// tile loops, products and dQ accumulation differ with the hardware and stay with each kernel; how one
// score element becomes P and dS does not. Self-contained like core/ (see fwd_stages.h).
#pragma once

#include "attn/stage.h"
#include "core/semantics.h"

namespace flashport::attn {

/// SPEC's gradient for one (query, key) element (FlashAttention-2's recomputation), from its probability
/// `prob` = 2^(s - lse) before dropout (each kernel computes it with its exp2; 0 for keys the row does
/// not see): the dropout factor z = 1 / (1 - p) where the key is kept, 0 where dropped (`kept` true and
/// `keep_scale` 1 without dropout), and dS = P (z dP - D) softcap'(s) with D = rowsum(dO * O), where
/// `capped` is the softcapped score and `cap` <= 0 means no softcap. Out: `p` = P z (the operand of dV =
/// P^T dO) and `ds` (of dK = dS^T Q and dQ = dS K; the softmax scale is applied to both at the end).
/// Kernels that compile a feature out pass constants (kept = true, cap = 0) and its code folds away.
/// (Taking the score and LSE here instead, with the exp2 as a functor, gave the same math but made
/// ptxas spill 12 bytes in the sm_80 d 256 backward at 255 registers.)
FP_STAGE void prob_grad(float prob, bool kept, float keep_scale, float dp, float d_row, float cap,
                        float capped, float& p, float& ds) {
  const float dp_kept = kept ? dp * keep_scale : 0.0f;  // dL/dP through the dropout
  float g = prob * (dp_kept - d_row);
  if (cap > 0.0f) g *= sem::softcap_grad(capped, cap);
  p = kept ? prob * keep_scale : 0.0f;
  ds = g;
}

}  // namespace flashport::attn
