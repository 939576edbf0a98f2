// KV-cache update: appends k_new/v_new at cache_seqlens[b] + t (rotary on k), and rotates q for the
// attention that follows. Element type is the runtime attn.in_type (memory-bound: no variants).
#include "cuda/common/common.cuh"
#include "cuda/kvcache_params.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {

constexpr int kWarps = 4;  // one warp per (batch, token, head) row

/// Channel c of a row rotated at position `pos`, rounded to the storage type by the caller.
FP_DEV float rotated(const KvAppendParams& kp, const void* x, int type, i64 off, int c, i64 pos) {
  return rotated_channel(kp, x, off, c, pos, [&](const void* base, i64 e) { return load_as(base, type, e); });
}

}  // namespace

/// Grid x: ceil(batch * s_new * hk / kWarps). Row r = (b * s_new + t) * hk + h. Rows whose slot is
/// outside the cache (device-resident cache_seqlens / leftpad are not validated on the host) or
/// whose rotary position is past the table are skipped rather than written out of bounds.
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    kv_append(const __grid_constant__ KvAppendParams kp) {
  const AttnProblem& a = kp.attn;
  const i64 row = block_x() * kWarps + warp_id();
  if (row >= a.batch * kp.s_new * a.hk) return;
  const i64 h = row % a.hk, t = (row / a.hk) % kp.s_new, b = row / (a.hk * kp.s_new);
  const i64 pos = (i64)kp.cache_seqlens[b] + t;  // absolute slot
  const i64 pad = a.leftpad_k ? (i64)a.leftpad_k[b] : 0;
  if (pos < 0 || pos >= a.sk || pad < 0) return;  // slot pos = key pos - pad, any pad
  const bool rotate = kp.rotary_dim > 0;
  if (rotate && pos >= kp.rotary_max_pos) return;
  const i64 k_dst = k_offset(a, a.k, b, pos - pad, h), v_dst = k_offset(a, a.v, b, pos - pad, h);
  if (k_dst < 0 || v_dst < 0) return;  // negative block-table / batch-index entry
  const i64 k_src = dense_offset(kp.k_new, b, t, h), v_src = dense_offset(kp.v_new, b, t, h);
  const int type = a.in_type;
  const u16* k_in = static_cast<const u16*>(kp.k_new.ptr);
  const u16* v_in = static_cast<const u16*>(kp.v_new.ptr);
  u16* k_out = static_cast<u16*>(a.k.ptr);
  u16* v_out = static_cast<u16*>(a.v.ptr);
  for (int c = lane_id(); c < a.dv; c += 32) v_out[v_dst + c] = v_in[v_src + c];  // bit copy
  for (int c = lane_id(); c < a.d; c += 32) {
    if (rotate && c < kp.rotary_dim)
      store_as(k_out, type, k_dst + c, rotated(kp, k_in, type, k_src, c, pos));
    else
      k_out[k_dst + c] = k_in[k_src + c];
  }
}

/// Grid x: ceil(batch * sq * hq / kWarps). Writes q rotated at cache_seqlens[b] (+ i when per token)
/// into the dense scratch kp.q_rot (b, sq, hq, d). A position outside the table copies q unrotated
/// (only reachable with invalid device-resident cache_seqlens).
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    rotate_q(const __grid_constant__ KvAppendParams kp) {
  const AttnProblem& a = kp.attn;
  const i64 row = block_x() * kWarps + warp_id();
  if (row >= a.batch * a.sq * a.hq) return;
  const i64 h = row % a.hq, i = (row / a.hq) % a.sq, b = row / (a.hq * a.sq);
  const i64 pos = (i64)kp.cache_seqlens[b] + (kp.rotary_q_per_token ? i : 0);
  const bool ok = pos >= 0 && pos < kp.rotary_max_pos;
  const i64 src = q_offset(a, a.q, b, i, h), dst = row * a.d;
  const u16* q = static_cast<const u16*>(a.q.ptr);
  u16* out = static_cast<u16*>(kp.q_rot);
  for (int c = lane_id(); c < a.d; c += 32) {
    if (ok && c < kp.rotary_dim)
      store_as(out, a.in_type, dst + c, rotated(kp, q, a.in_type, src, c, pos));
    else
      out[dst + c] = q[src + c];
  }
}
