// Split-KV combine: merges the fp32 partial outputs and LSEs of the forward splits into O and LSE.
#include "cuda/attn_fwd_params.cuh"
#include "cuda/common/common.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {
constexpr int kWarps = 4;        // one warp per output row (b, h, i)
constexpr int kMaxSplits = 128;  // the host never asks for more
}  // namespace

/// Grid x: ceil(batch * hq * sq / kWarps), block 32 * kWarps. Row r = (b * hq + h) * sq + i. Rows
/// beyond the sequence's length (varlen is never split, so only dense rows exist) are skipped.
/// O = sum_s w_s O_s / sum_s w_s with w_s = exp(lse_s - max lse) (sem::lse_weight: -inf -> 0);
/// all splits empty -> O = 0, LSE = -inf.
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    split_combine(const __grid_constant__ FwdParams prm) {
  const AttnProblem& p = prm.p;
  __shared__ float s_w[kWarps][kMaxSplits];
  const int warp = warp_id(), lane = lane_id();
  const i64 row = block_x() * kWarps + warp;
  const i64 rows = p.batch * p.hq * p.sq;
  if (row >= rows) return;  // warp-uniform; no block barrier below
  const i64 i = row % p.sq, h = (row / p.sq) % p.hq, b = row / (p.sq * p.hq);
  const int splits = prm.num_splits < kMaxSplits ? prm.num_splits : kMaxSplits;
  const i64 split_stride = p.batch * p.hq * p.sq;  // rows per split in the workspace

  float m = kNegInf;
  for (int s = lane; s < splits; s += 32) m = fmaxf(m, prm.lse_partial[s * split_stride + row]);
  m = warp_max(m);
  float wsum = 0.0f;
  for (int s = lane; s < splits; s += 32) {
    const float w = sem::lse_weight(prm.lse_partial[s * split_stride + row], m);
    s_w[warp][s] = w;
    wsum += w;
  }
  wsum = warp_sum(wsum);
  __syncwarp();
  const float inv = sem::softmax_norm(wsum);
  const i64 o_off = q_offset(p, p.o, b, i, h);
  // dv is a multiple of 8 on CUDA (cuda_backend.cpp refuses others). Four channels per lane, one 16-byte load
  // per split (partial rows are dv floats from a 16-byte aligned base); loads issued regardless of the weight
  // and unrolled, so several splits' loads are in flight at once instead of one dependent load per split and
  // channel.
  for (i64 c = 4 * lane; c < p.dv; c += 128) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const U32x4 o = ld_global_16(prm.o_partial + (s * split_stride + row) * p.dv + c);
      const float w = s_w[warp][s];
      if (w > 0.0f) {  // w = 0: skipped (no NaN); a select, the load above is unconditional
        a0 += w * u32_as_float(o.x), a1 += w * u32_as_float(o.y);
        a2 += w * u32_as_float(o.z), a3 += w * u32_as_float(o.w);
      }
    }
    store_as(p.o.ptr, p.out_type, o_off + c, a0 * inv);
    store_as(p.o.ptr, p.out_type, o_off + c + 1, a1 * inv);
    store_as(p.o.ptr, p.out_type, o_off + c + 2, a2 * inv);
    store_as(p.o.ptr, p.out_type, o_off + c + 3, a3 * inv);
  }
  if (p.lse && lane == 0) p.lse[lse_offset(p, b, h, i)] = wsum > 0.0f ? m + logf(wsum) : kNegInf;
}
