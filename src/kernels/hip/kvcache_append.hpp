// The CDNA KV-cache update (SPEC "KV-cache update"), written once over the wave layer like the forward:
// `append` writes k_new / v_new into the cache at cache_seqlens[b] + t (rotary on k's first rotary_dim
// channels), `rotate_q` writes q rotated at its cache positions into a dense scratch the forward then
// reads. The structure is kernels/cuda/kvcache_append.cu's (one wave per row, lanes over channels, the
// same guards); the rules are core/'s: k_offset (cache_batch_idx, leftpad, paged block table),
// rotary_channel (taps, interleaved or not), and numeric.h's conversions, which the CPU backend stores
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
  const i64 cs = pos * kp.rotary_row_stride;
  return sem::rotary_channel(
      c, kp.rotary_dim, kp.rotary_interleaved != 0, [&](int ch) { return load16(x, type, off + ch); },
      [&](int k) { return load16(kp.rotary_cos, type, cs + k); },
      [&](int k) { return load16(kp.rotary_sin, type, cs + k); });
}

/// One wave per new token row r = (b * s_new + t) * hk + h. Rows whose slot is outside the cache
/// (device-resident cache_seqlens / leftpad are not validated on the host), whose rotary position is
/// past the table, or whose block-table / batch-index entry is outside the pool are skipped rather
/// than written out of bounds.
FP_DEV void append(const KvAppendParams& kp) {
  const AttnProblem& a = kp.attn;
  const i64 row = (i64)block_x() * kKvWaves + wave_id();
  if (row >= a.batch * kp.s_new * a.hk) return;
  const i64 h = row % a.hk, t = (row / a.hk) % kp.s_new, b = row / (a.hk * kp.s_new);
  const i64 pos = (i64)kp.cache_seqlens[b] + t;  // absolute slot
  const i64 pad = a.leftpad_k ? (i64)a.leftpad_k[b] : 0;
  if (pos < 0 || pos >= a.sk || pad < 0) return;  // slot pos = key pos - pad, any pad
  const bool rotate = kp.rotary_dim > 0;
  if (rotate && pos >= kp.rotary_max_pos) return;
  const i64 k_dst = k_offset(a, a.k, b, pos - pad, h), v_dst = k_offset(a, a.v, b, pos - pad, h);
  if (k_dst < 0 || v_dst < 0) return;
  const i64 k_src = b * kp.k_new.batch_stride + t * kp.k_new.row_stride + h * kp.k_new.head_stride;
  const i64 v_src = b * kp.v_new.batch_stride + t * kp.v_new.row_stride + h * kp.v_new.head_stride;
  const int type = a.in_type;
  const u16* g_k_new = static_cast<const u16*>(kp.k_new.ptr);
  const u16* g_v_new = static_cast<const u16*>(kp.v_new.ptr);
  u16* g_k_cache = static_cast<u16*>(a.k.ptr);
  u16* g_v_cache = static_cast<u16*>(a.v.ptr);
  for (int c = lane_id(); c < a.dv; c += kWaveSize) g_v_cache[v_dst + c] = g_v_new[v_src + c];  // bit copy
  for (int c = lane_id(); c < a.d; c += kWaveSize) {
    if (rotate && c < kp.rotary_dim)
      g_k_cache[k_dst + c] = round16(type, rotated(kp, g_k_new, type, k_src, c, pos));
    else
      g_k_cache[k_dst + c] = g_k_new[k_src + c];
  }
}

/// One wave per query row r = (b * sq + i) * hq + h: q rotated at cache_seqlens[b] (+ i when per token)
/// into the dense scratch kp.q_rot (b, sq, hq, d). A position outside the table copies q unrotated
/// (only reachable with invalid device-resident cache_seqlens).
FP_DEV void rotate_q(const KvAppendParams& kp) {
  const AttnProblem& a = kp.attn;
  const i64 row = (i64)block_x() * kKvWaves + wave_id();
  if (row >= a.batch * a.sq * a.hq) return;
  const i64 h = row % a.hq, i = (row / a.hq) % a.sq, b = row / (a.hq * a.sq);
  const i64 pos = (i64)kp.cache_seqlens[b] + (kp.rotary_q_per_token ? i : 0);
  const bool in_table = pos >= 0 && pos < kp.rotary_max_pos;
  const i64 src = q_offset(a, a.q, b, i, h), dst = row * a.d;
  const u16* g_q = static_cast<const u16*>(a.q.ptr);
  u16* g_q_rot = static_cast<u16*>(kp.q_rot);
  for (int c = lane_id(); c < a.d; c += kWaveSize) {
    if (in_table && c < kp.rotary_dim)
      g_q_rot[dst + c] = round16(a.in_type, rotated(kp, g_q, a.in_type, src, c, pos));
    else
      g_q_rot[dst + c] = g_q[src + c];
  }
}

}  // namespace kv
}  // namespace flashport::amd
