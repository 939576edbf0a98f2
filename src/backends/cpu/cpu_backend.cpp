// The CPU backend: picks the reference, the baseline or the fast path per call, and runs the KV-cache
// append and merge_states (both memory-bound, so one implementation serves every Impl).
#include "backends/cpu/cpu_backend.hpp"

#include <vector>

#include "backends/cpu/elem.hpp"
#include "backends/cpu/fast.hpp"
#include "backends/cpu/reference.hpp"

namespace flashport::cpu {
namespace {

/// Whether `automatic` may take the fast path for this problem.
bool fast_covers(const AttnProblem& p, bool backward) {
  return !p.s_dmask && fast::unsupported(p, backward).empty();
}

/// Runs a forward with `impl`, which the core has already checked with unsupported().
void run_forward(const AttnProblem& p, Impl impl) {
  switch (impl) {
    case Impl::automatic:
      if (fast_covers(p, false)) {
        fast::forward(p);
      } else {
        ref::forward(p, false);
      }
      return;
    case Impl::fast:
      fast::forward(p);
      return;
    case Impl::baseline:
      ref::forward(p, true);
      return;
    case Impl::reference:
      ref::forward(p, false);
      return;
  }
}

/// q rotated at its cache positions (SPEC "KV-cache update"), as a dense (b, sq, hq, d) buffer in in_type.
std::vector<unsigned char> rotate_queries(const core::KvCacheProblem& kp, Operand& q_rot) {
  const AttnProblem& a = kp.attn;
  const int rot_dim = kp.rotary_dim, type = a.in_type;
  std::vector<unsigned char> bytes((size_t)(a.batch * a.sq * a.hq * a.d * elem_bytes(type)));
  q_rot = {bytes.data(), a.sq * a.hq * a.d, a.hq * a.d, a.d};
  for (long long b = 0; b < a.batch; ++b) {
    const long long base = kp.cache_seqlens ? (long long)kp.cache_seqlens[b] : a.sk - kp.s_new;
    for (long long i = 0; i < a.sq; ++i) {
      const long long pos = kp.rotary_q_per_token ? base + i : base;
      for (long long h = 0; h < a.hq; ++h) {
        const long long src = q_offset(a, a.q, b, i, h);
        const long long dst = dense_offset(q_rot, b, i, h);
        for (long long c = 0; c < a.d; ++c) {
          if (c >= rot_dim) {
            store(q_rot.ptr, type, dst + c, load_f64(a.q.ptr, type, src + c));
            continue;
          }
          const float y = rotated_channel(kp, a.q.ptr, src, (int)c, pos,
                                          [&](const void* x, long long e) { return load_f32(x, type, e); });
          store(q_rot.ptr, type, dst + c, y);
        }
      }
    }
  }
  return bytes;
}

class CpuBackend final : public core::Backend {
 public:
  const char* name() const override { return "cpu"; }

  std::string unsupported(const AttnProblem& p, Impl impl, bool backward) const override {
    if (impl == Impl::fast) {
      if (p.s_dmask) return "s_dmask (attention probabilities) is produced by the reference only";
      return fast::unsupported(p, backward);
    }
    if (!backward) return {};
    if (impl == Impl::baseline)
      return "no baseline backward (the baseline exists for the forward accuracy rule)";
    if (impl == Impl::automatic && fast_covers(p, true)) return {};
    if (p.block_table) return "backward through paged K/V is not supported on the CPU";
    if (p.kv_batch_idx || p.leftpad_k) return "backward through a KV cache is not supported";
    return {};
  }

  void forward(const AttnProblem& p, Impl impl) const override { run_forward(p, impl); }

  void backward(const AttnProblem& p, Impl impl) const override {
    if (impl == Impl::fast || (impl == Impl::automatic && fast_covers(p, true))) {
      fast::backward(p);
    } else {
      ref::backward(p);
    }
  }

  void forward_kvcache(const core::KvCacheProblem& kp, Impl impl) const override {
    if (kp.k_new.ptr) ref::append_kv(kp);
    if (kp.rotary_dim <= 0) {
      run_forward(kp.attn, impl);
      return;
    }
    AttnProblem rotated = kp.attn;
    const std::vector<unsigned char> q_bytes = rotate_queries(kp, rotated.q);
    run_forward(rotated, impl);
  }

  void merge_states(const core::MergeProblem& mp) const override { ref::merge_states(mp); }
};

}  // namespace

const core::Backend& backend() {
  static const CpuBackend instance;
  return instance;
}

}  // namespace flashport::cpu
