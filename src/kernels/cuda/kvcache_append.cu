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

/// Grid x: ceil(batch * s_new * hk / kWarps), one warp per row of problem.h's append_row (which skips
/// rows whose slot, rotary position or pool entry is out of range).
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    kv_append(const __grid_constant__ KvAppendParams kp) {
  const AttnProblem& a = kp.attn;
  const i64 row_id = block_x() * kWarps + warp_id();
  if (row_id >= a.batch * kp.s_new * a.hk) return;
  const AppendRow row = append_row(kp, row_id);
  if (!row.ok) return;
  const int type = a.in_type;
  const u16* k_in = static_cast<const u16*>(kp.k_new.ptr);
  const u16* v_in = static_cast<const u16*>(kp.v_new.ptr);
  u16* k_out = static_cast<u16*>(a.k.ptr);
  u16* v_out = static_cast<u16*>(a.v.ptr);
  for (int c = lane_id(); c < a.dv; c += 32) v_out[row.v_dst + c] = v_in[row.v_src + c];  // bit copy
  const bool rotate = kp.rotary_dim > 0;
  for (int c = lane_id(); c < a.d; c += 32) {
    if (rotate && c < kp.rotary_dim)
      store_as(k_out, type, row.k_dst + c, rotated(kp, k_in, type, row.k_src, c, row.pos));
    else
      k_out[row.k_dst + c] = k_in[row.k_src + c];
  }
}

/// Grid x: ceil(batch * sq * hq / kWarps), one warp per row of problem.h's q_rot_row: q rotated at its
/// cache position into the dense scratch kp.q_rot (b, sq, hq, d).
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    rotate_q(const __grid_constant__ KvAppendParams kp) {
  const AttnProblem& a = kp.attn;
  const i64 row_id = block_x() * kWarps + warp_id();
  if (row_id >= a.batch * a.sq * a.hq) return;
  const QRotRow row = q_rot_row(kp, row_id);
  const u16* q = static_cast<const u16*>(a.q.ptr);
  u16* out = static_cast<u16*>(kp.q_rot);
  for (int c = lane_id(); c < a.d; c += 32) {
    if (row.in_table && c < kp.rotary_dim)
      store_as(out, a.in_type, row.dst + c, rotated(kp, q, a.in_type, row.src, c, row.pos));
    else
      out[row.dst + c] = q[row.src + c];
  }
}
