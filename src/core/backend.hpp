// The interface between the core (validation, dispatch) and a backend (cpu, cuda, hip).
#pragma once

#include <cstddef>
#include <string>

#include "flashport/attention.hpp"
#include "flashport/error.hpp"
#include "problem.h"

namespace flashport::core {

/// KV-cache append + attention. `attn` describes the attention over the cache after the append
/// (k/v are the cache operands, seqused_k = cache_seqlens with seqused_k_add = s_new).
struct KvCacheProblem {
  AttnProblem attn;
  Operand k_new, v_new;  // (b, s_new, hk, d|dv); ptr null when nothing is appended
  long long s_new;
  const int* cache_seqlens;  // (b,) tokens already in the cache (absolute slots), before the append
  // Rotary: cos/sin (max_pos, rotary_dim / 2) in the input dtype, row stride in elements.
  const void* rotary_cos;
  const void* rotary_sin;
  long long rotary_row_stride, rotary_max_pos;
  int rotary_dim;  // 0: no rotary
  bool rotary_interleaved;
  bool rotary_q_per_token;  // causal or local: query t at cache_seqlens + t; else all at cache_seqlens
  int num_splits;
};

/// The dtype rules the GPU backends share: fp16/bf16 inputs with an output of the same dtype, or fp8
/// inputs (forward only: their kernels decode fp8 to bf16 while loading, or run e4m3 on Hopper) with a
/// bf16/fp16/fp32 output. `where` ("CUDA", "AMD") goes into the reason; empty when the dtypes are served.
inline std::string gpu_dtype_unsupported(const AttnProblem& p, bool backward, const char* where) {
  const auto name = [](int t) { return std::string(dtype_name(static_cast<DType>(t))); };
  const bool fp8 = is_fp8_elem(p.in_type);
  if (fp8 && backward) return std::string("fp8 backward is not supported on ") + where;
  if (!fp8 && p.in_type != kF16 && p.in_type != kBF16)
    return std::string("inputs must be fp16, bf16 or fp8 (float8_e4m3fn, float8_e4m3fnuz, float8_e5m2) on ") +
           where + ", got " + name(p.in_type);
  if (fp8 && p.out_type != kBF16 && p.out_type != kF16 && p.out_type != kF32)
    return std::string("out of fp8 inputs must be bf16, fp16 or fp32 on ") + where + ", got " +
           name(p.out_type);
  if (!fp8 && p.out_type != p.in_type)
    return "out must have the input dtype " + name(p.in_type) + ", got " + name(p.out_type);
  return {};
}

/// The GPU kv-cache kernels move 2-byte (on CUDA also 4-byte) elements: an fp8 cache is read by the
/// forward, never appended to or rotated. `backend` ("cuda", "hip") and `where` ("CUDA", "AMD") go into the
/// error.
inline void refuse_fp8_cache_update(const KvCacheProblem& kp, const char* backend, const char* where) {
  if (!is_fp8_elem(kp.attn.in_type)) return;
  if (kp.k_new.ptr)
    throw Error("k_new",
                std::string(backend) + " backend: appending to an fp8 KV cache is not supported on " + where);
  if (kp.rotary_dim > 0)
    throw Error("rotary_cos", std::string(backend) +
                                  " backend: rotary embedding of fp8 inputs is not supported on " + where);
}

/// The KV-cache kernels' arguments (CUDA kvcache_append.cu, CDNA kvcache_append.hpp) of a kv-cache call;
/// q_rot stays null (the launcher's scratch for rotate_q).
inline KvAppendParams append_params(const KvCacheProblem& kp) {
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

/// merge_states: (b, s, h, d) partial outputs and fp32 (b, h, s) LSEs.
struct MergeProblem {
  long long batch, seqlen, heads, d;
  int type;           // ElemType of out_a, out_b, out
  Operand a, b, out;  // (batch, token, head, channel)
  const float* lse_a;
  const float* lse_b;
  float* lse;  // may be null
  void* stream;
  int device;  // out_a's device index (every tensor of the call is on it)
};

/// The kernel arguments of `mp` (both GPU backends launch merge_states with them).
inline MergeParams merge_params(const MergeProblem& mp) {
  return {mp.batch, mp.seqlen, mp.heads, mp.d, mp.type, mp.a, mp.b, mp.out, mp.lse_a, mp.lse_b, mp.lse};
}

/// A backend runs validated problems. Each method may assume the core checked every shape, dtype,
/// stride and (for host memory) every index value; device-resident indices must still be guarded.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  /// Empty when the backend can run this problem with `impl`; otherwise the reason, which the
  /// core puts in the Error it raises.
  virtual std::string unsupported(const AttnProblem& p, Impl impl, bool backward) const = 0;
  virtual void forward(const AttnProblem& p, Impl impl) const = 0;
  virtual void backward(const AttnProblem& p, Impl impl) const = 0;
  virtual void forward_kvcache(const KvCacheProblem& p, Impl impl) const = 0;
  virtual void merge_states(const MergeProblem& p) const = 0;
  /// flashport::check_device: waits for the work queued on `device` and raises what the device recorded
  /// about earlier calls (index faults). Backends that find everything on the host have nothing to do.
  virtual void check_device(int device) const {}
  /// Checked mode: copies `bytes` of device memory to the host after the work queued on `stream`
  /// (synchronising). Backends whose memory the host reads directly never get here.
  virtual void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) const {
    throw Error("checked mode", std::string(name()) + " backend cannot copy device memory to the host");
  }
};

/// The backend for tensors on `device`, or null when none is built or usable (src/backends/registry.cpp).
const Backend* backend_for(DeviceType device);

}  // namespace flashport::core
