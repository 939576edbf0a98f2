// Split-KV combine: merges the fp32 partial outputs and LSEs of the forward splits into O and LSE.
#include "cuda/attn_fwd_params.cuh"
#include "cuda/common/common.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {
constexpr int kWarps = 4;        // one warp per output row (b, h, i)
constexpr int kMaxSplits = 128;  // the host never asks for more
constexpr int kBatch = 16;       // splits whose partial outputs one lane has in flight at once
}  // namespace

/// Grid x: ceil(batch * hq * sq / kWarps), block 32 * kWarps. Row r = (b * hq + h) * sq + i. Rows
/// beyond the sequence's length (varlen is never split, so only dense rows exist) are skipped.
/// O = sum_s w_s O_s / sum_s w_s with w_s = exp(lse_s - max lse) (sem::lse_weight: -inf -> 0);
/// all splits empty -> O = 0, LSE = -inf.
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    split_combine(const __grid_constant__ FwdParams prm) {
  order_after_prior_grids();
  const AttnProblem& p = prm.p;
  __shared__ float s_w[kWarps][kMaxSplits];
  const int warp = warp_id(), lane = lane_id();
  const i64 row = block_x() * kWarps + warp;
  const i64 rows = p.batch * p.hq * p.sq;
  if (row >= rows) return;  // warp-uniform; no block barrier below
  const i64 i = row % p.sq, h = (row / p.sq) % p.hq, b = row / (p.sq * p.hq);
  const int splits = prm.num_splits < kMaxSplits ? prm.num_splits : kMaxSplits;
  const i64 split_stride = p.batch * p.hq * p.sq;  // rows per split in the workspace

  // Latency, not bandwidth, bounds a small combine (batch 1: 32 rows, a few warps on the whole GPU), so
  // a row's loads are issued before any is waited on: the first kBatch splits' partial outputs (dv is a
  // multiple of 8 on CUDA, cuda_backend.cpp refuses others: four channels per lane, one 16-byte load per
  // split from a 16-byte aligned row) go out before the LSE reduction, and later batches kBatch at a time.
  const i64 c_lane = 4 * lane;
  U32x4 o[kBatch];
  auto load_batch = [&](i64 c, int s0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (s0 + j < splits) o[j] = ld_global_16(prm.o_partial + ((s0 + j) * split_stride + row) * p.dv + c);
  };
  if (c_lane < p.dv) load_batch(c_lane, 0);

  float lse_s[kMaxSplits / 32];  // split lane + 32 k
  float m = kNegInf;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    lse_s[k] = s < splits ? prm.lse_partial[s * split_stride + row] : kNegInf;
    m = fmaxf(m, lse_s[k]);
  }
  m = warp_max(m);
  float wsum = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    const float w = sem::lse_weight(lse_s[k], m);
    if (s < splits) s_w[warp][s] = w, wsum += w;
  }
  wsum = warp_sum(wsum);
  __syncwarp();
  const float inv = sem::softmax_norm(wsum);
  const i64 o_off = q_offset(p, p.o, b, i, h);
  for (i64 c = c_lane; c < p.dv; c += 128) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      if (c != c_lane || s0 != 0) load_batch(c, s0);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float w = s0 + j < splits ? s_w[warp][s0 + j] : 0.0f;
        if (w > 0.0f) {  // w = 0: skipped (no NaN from an empty split's partial)
          a0 += w * u32_as_float(o[j].x), a1 += w * u32_as_float(o[j].y);
          a2 += w * u32_as_float(o[j].z), a3 += w * u32_as_float(o[j].w);
        }
      }
    }
    store_as(p.o.ptr, p.out_type, o_off + c, a0 * inv);
    store_as(p.o.ptr, p.out_type, o_off + c + 1, a1 * inv);
    store_as(p.o.ptr, p.out_type, o_off + c + 2, a2 * inv);
    store_as(p.o.ptr, p.out_type, o_off + c + 3, a3 * inv);
  }
  if (p.lse && lane == 0) p.lse[lse_offset(p, b, h, i)] = wsum > 0.0f ? m + logf(wsum) : kNegInf;
}
