// The CDNA KV-cache update (SPEC "KV-cache update"), written once over the wave layer like the forward:
// `append` writes k_new / v_new into the cache at cache_seqlens[b] + t (rotary on k's first rotary_dim
// channels), `rotate_q` writes q rotated at its cache positions into a dense scratch the forward then
// reads. The structure is kernels/cuda/kvcache_append.cu's (one wave per row, lanes over channels); the
// rules are core/problem.h's: append_row and q_rot_row (which row goes where, and the guards),
// rotated_channel (taps, interleaved or not), and numeric.h's conversions, which the CPU backend stores
// and loads through too, so the cache contents are the CPU backend's bit for bit. Memory-bound: the
// element type is read at run time (one code object per arch, both entry points in kvcache_append.hip).
//
// Bit-identical rotation also needs x c + s x' s' rounded per operation: HIP compiles with FP
// contraction on by default, so kvcache_append.hip turns it off (and the build checks its code
// objects for fused multiply-adds).
#pragma once

#include "core/problem.h"
#include "hip/kvcache_append_config.hpp"
#include "wave/wave.hpp"

namespace flashport::amd {

static_assert(kKvThreads == kKvWaves * wave::kWaveSize, "kvcache_append_config.hpp assumes wave64");

namespace kv {

using namespace flashport::wave;

/// fp16 / bf16 element `off` of `base` widened to fp32, and the round-to-nearest-even store back.
FP_DEV float load16(const void* base, int type, i64 off) {
  const u16 v = static_cast<const u16*>(base)[off];
  return type == kBF16 ? num::bf16_to_f32(v) : num::f16_to_f32(v);
}
FP_DEV u16 round16(int type, float x) {
  return type == kBF16 ? num::f32_to_bf16(x) : num::f32_to_f16(x);
}

/// Channel c of a row rotated at position `pos`, in fp32 (rounded to the storage type by the caller).
FP_DEV float rotated(const KvAppendParams& kp, const void* x, int type, i64 off, int c, i64 pos) {
  return rotated_channel(kp, x, off, c, pos, [&](const void* base, i64 e) { return load16(base, type, e); });
}

/// One wave per row of problem.h's append_row, which skips rows whose slot is outside the cache, whose
/// rotary position is past the table, or whose block-table / batch-index entry is outside the pool.
FP_DEV void append(const KvAppendParams& kp) {
  const AttnProblem& a = kp.attn;
  const i64 row_id = (i64)block_x() * kKvWaves + wave_id();
  if (row_id >= a.batch * kp.s_new * a.hk) return;
  const AppendRow row = append_row(kp, row_id);
  if (!row.ok) return;
  const int type = a.in_type;
  const u16* g_k_new = static_cast<const u16*>(kp.k_new.ptr);
  const u16* g_v_new = static_cast<const u16*>(kp.v_new.ptr);
  u16* g_k_cache = static_cast<u16*>(a.k.ptr);
  u16* g_v_cache = static_cast<u16*>(a.v.ptr);
  for (int c = lane_id(); c < a.dv; c += kWaveSize)
    g_v_cache[row.v_dst + c] = g_v_new[row.v_src + c];  // bits
  for (int c = lane_id(); c < a.d; c += kWaveSize) {
    if (c < kp.rotary_dim)
      g_k_cache[row.k_dst + c] = round16(type, rotated(kp, g_k_new, type, row.k_src, c, row.pos));
    else
      g_k_cache[row.k_dst + c] = g_k_new[row.k_src + c];
  }
}

/// One wave per row of problem.h's q_rot_row: q rotated at its cache position into the dense scratch
/// kp.q_rot (b, sq, hq, d), copied unrotated when the position is outside the table.
FP_DEV void rotate_q(const KvAppendParams& kp) {
  const AttnProblem& a = kp.attn;
  const i64 row_id = (i64)block_x() * kKvWaves + wave_id();
  if (row_id >= a.batch * a.sq * a.hq) return;
  const QRotRow row = q_rot_row(kp, row_id);
  const u16* g_q = static_cast<const u16*>(a.q.ptr);
  u16* g_q_rot = static_cast<u16*>(kp.q_rot);
  for (int c = lane_id(); c < a.d; c += kWaveSize) {
    if (row.in_table && c < kp.rotary_dim)
      g_q_rot[row.dst + c] = round16(a.in_type, rotated(kp, g_q, a.in_type, row.src, c, row.pos));
    else
      g_q_rot[row.dst + c] = g_q[row.src + c];
  }
}

}  // namespace kv
}  // namespace flashport::amd
