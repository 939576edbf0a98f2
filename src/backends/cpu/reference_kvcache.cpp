// The CPU reference KV-cache append: new keys (rotary applied) and values written into the cache in place.
#include "backends/cpu/elem.hpp"
#include "backends/cpu/reference.hpp"

namespace flashport::cpu::ref {

void append_kv(const core::KvCacheProblem& kp) {
  const AttnProblem& a = kp.attn;
  const bool rotate = kp.rotary_dim > 0;
  const int rot_dim = kp.rotary_dim;
  for (long long b = 0; b < a.batch; ++b) {
    // Absolute cache slots: with a left pad, token index j of the attention is slot j + leftpad.
    const long long base = kp.cache_seqlens ? (long long)kp.cache_seqlens[b] : a.sk - kp.s_new;
    const long long pad = a.leftpad_k ? (long long)a.leftpad_k[b] : 0;
    for (long long t = 0; t < kp.s_new; ++t) {
      const long long pos = base + t;
      for (long long h = 0; h < a.hk; ++h) {
        const long long k_src = dense_offset(kp.k_new, b, t, h), v_src = dense_offset(kp.v_new, b, t, h);
        const long long k_dst = k_offset(a, a.k, b, pos - pad, h), v_dst = k_offset(a, a.v, b, pos - pad, h);
        for (long long c = 0; c < a.dv; ++c)
          store(a.v.ptr, a.in_type, v_dst + c, load_f64(kp.v_new.ptr, a.in_type, v_src + c));
        for (long long c = 0; c < a.d; ++c) {
          if (!rotate || c >= rot_dim) {
            store(a.k.ptr, a.in_type, k_dst + c, load_f64(kp.k_new.ptr, a.in_type, k_src + c));
            continue;
          }
          const float y =
              rotated_channel(kp, kp.k_new.ptr, k_src, (int)c, pos,
                              [&](const void* x, long long e) { return load_f32(x, a.in_type, e); });
          store(a.k.ptr, a.in_type, k_dst + c, y);
        }
      }
    }
  }
}

}  // namespace flashport::cpu::ref
