// The HIP backend (AMD CDNA GPUs through libamdhip64, code objects built by cmake/hip_kernels.cmake),
// registered in src/backends/registry.cpp when the library is built with FLASHPORT_HIP=ON.
#pragma once

#include "core/backend.hpp"
#include "kernels/hip/kvcache_append_config.hpp"

namespace flashport::amd {

/// The kv-cache kernels' arguments for a validated kv-cache call (q_rot left null: the caller's scratch).
inline KvAppendParams append_params(const core::KvCacheProblem& kp) {
  KvAppendParams prm{};
  prm.attn = kp.attn;
  prm.k_new = kp.k_new, prm.v_new = kp.v_new, prm.s_new = kp.s_new;
  prm.cache_seqlens = kp.cache_seqlens;
  prm.rotary_cos = kp.rotary_cos, prm.rotary_sin = kp.rotary_sin;
  prm.rotary_row_stride = kp.rotary_row_stride, prm.rotary_max_pos = kp.rotary_max_pos;
  prm.rotary_dim = kp.rotary_dim;
  prm.rotary_interleaved = kp.rotary_interleaved ? 1 : 0;
  prm.rotary_q_per_token = kp.rotary_q_per_token ? 1 : 0;
  return prm;
}

/// The HIP backend, or null when no HIP runtime or AMD GPU is usable (amd::runtime_unavailable()).
const core::Backend* backend();

}  // namespace flashport::amd
