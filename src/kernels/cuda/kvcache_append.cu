// KV-cache update: appends k_new/v_new at cache_seqlens[b] + t (rotary on k), and rotates q for the
// attention that follows. Element type is the runtime attn.in_type (memory-bound: no variants): fp16,
// bf16 or fp32 (fp8 caches are refused by the host).
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

/// Element s_off of src to element d_off of dst, bit for bit: 4-byte (fp32) or 2-byte elements.
FP_DEV void copy_elem(void* dst, i64 d_off, const void* src, i64 s_off, bool wide) {
  if (wide)
    static_cast<u32*>(dst)[d_off] = static_cast<const u32*>(src)[s_off];
  else
    static_cast<u16*>(dst)[d_off] = static_cast<const u16*>(src)[s_off];
}

}  // namespace

/// Grid x: ceil(batch * s_new * hk / kWarps), one warp per row of problem.h's append_row (which skips
/// rows whose slot, rotary position or pool entry is out of range).
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    kv_append(const __grid_constant__ KvAppendParams kp) {
  order_after_prior_grids();
  const AttnProblem& a = kp.attn;
  const i64 row_id = block_x() * kWarps + warp_id();
  if (row_id >= a.batch * kp.s_new * a.hk) return;
  const AppendRow row = append_row(kp, row_id);
  if (!row.ok) return;
  const int type = a.in_type;
  const bool wide = type == f32::kElemType;
  for (int c = lane_id(); c < a.dv; c += 32)
    copy_elem(a.v.ptr, row.v_dst + c, kp.v_new.ptr, row.v_src + c, wide);
  const bool rotate = kp.rotary_dim > 0;
  for (int c = lane_id(); c < a.d; c += 32) {
    if (rotate && c < kp.rotary_dim)
      store_as(a.k.ptr, type, row.k_dst + c, rotated(kp, kp.k_new.ptr, type, row.k_src, c, row.pos));
    else
      copy_elem(a.k.ptr, row.k_dst + c, kp.k_new.ptr, row.k_src + c, wide);
  }
}

/// Grid x: ceil(batch * sq * hq / kWarps), one warp per row of problem.h's q_rot_row: q rotated at its
/// cache position into the dense scratch kp.q_rot (b, sq, hq, d).
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    rotate_q(const __grid_constant__ KvAppendParams kp) {
  order_after_prior_grids();
  const AttnProblem& a = kp.attn;
  const i64 row_id = block_x() * kWarps + warp_id();
  if (row_id >= a.batch * a.sq * a.hq) return;
  const QRotRow row = q_rot_row(kp, row_id);
  const bool wide = a.in_type == f32::kElemType;
  for (int c = lane_id(); c < a.d; c += 32) {
    if (row.in_table && c < kp.rotary_dim)
      store_as(kp.q_rot, a.in_type, row.dst + c, rotated(kp, a.q.ptr, a.in_type, row.src, c, row.pos));
    else
      copy_elem(kp.q_rot, row.dst + c, a.q.ptr, row.src + c, wide);
  }
}
