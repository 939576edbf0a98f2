// Kernel arguments of kvcache_append.cu (NVRTC-safe mirror of core::KvCacheProblem's append part).
#pragma once

#include "core/problem.h"

namespace flashport::cuda {

/// `attn` addresses the cache (k/v operands, leftpad, kv_batch_idx, block table) and q; new tokens
/// go to absolute cache slots cache_seqlens[b] + t (attention key index slot - leftpad).
struct KvAppendParams {
  AttnProblem attn;
  Operand k_new, v_new;  // (b, s_new, hk, d|dv)
  long long s_new;
  const int* cache_seqlens;  // (b,)
  const void* rotary_cos;    // (max_pos, rotary_dim / 2) in attn.in_type; null: no rotary
  const void* rotary_sin;
  long long rotary_row_stride, rotary_max_pos;
  int rotary_dim;
  int rotary_interleaved;
  int rotary_q_per_token;  // q rows at cache_seqlens + i (causal/local) or all at cache_seqlens
  void* q_rot;             // rotate_q output: dense (b, sq, hq, d) in attn.in_type
};

}  // namespace flashport::cuda
