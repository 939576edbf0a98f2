// The public entry points: validate, build the problem block, pick a backend, run.
#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "attn_validate.hpp"
#include "backend.hpp"
#include "check.hpp"
#include "flashport/attention.hpp"
#include "split_plan.h"

namespace flashport {
namespace {

using core::require;

std::string num(int64_t v) {
  return std::to_string(v);
}

// flash-attn's bound (its split-KV combine holds at most 128 partial results), which every backend's
// combine kernel is sized for.
constexpr int kMaxNumSplits = core::kMaxSplits;

const core::Backend& backend_or_throw(const TensorView& q) {
  const core::Backend* be = core::backend_for(q.device.type);
  if (!be)
    throw Error("q", std::string("no usable backend for device ") + device_type_name(q.device.type) +
                         " (built without it, or no driver/GPU found); available: " + available_backends());
  return *be;
}

void check_supported(const core::Backend& be, const AttnProblem& p, Impl impl, bool backward) {
  const std::string why = be.unsupported(p, impl, backward);
  if (!why.empty())
    throw Error(impl == Impl::automatic ? "q" : "impl", std::string(be.name()) + " backend: " + why);
}

Operand operand(const TensorView& t) {
  if (t.ndim == 4) return {t.data, t.stride[0], t.stride[1], t.stride[2]};
  return {t.data, 0, t.stride[0], t.stride[1]};
}

using Named = std::pair<const TensorView*, const char*>;

/// Outputs may not share memory with the small inputs read while they are written (index tensors,
/// ALiBi slopes, descales, rotary tables): a write would change them mid-call (the fuzzer's out over
/// cache_leftpad made the CPU forward read past K).
template <class Inputs>
void check_outputs_spare(std::initializer_list<Named> outputs, const Inputs& inputs) {
  for (const auto& [out, out_name] : outputs)
    for (const auto& [in, in_name] : inputs)
      if (out && in) core::check_no_overlap(*out, out_name, *in, in_name);
}

const TensorView* ptr(const std::optional<TensorView>& t) {
  return t ? &*t : nullptr;
}

/// The small inputs every attention call may read (see check_outputs_spare).
std::array<Named, 8> small_inputs(const SequenceLayout& lay, const AttentionOptions& o) {
  return {{{ptr(lay.cu_seqlens_q), "cu_seqlens_q"},
           {ptr(lay.cu_seqlens_k), "cu_seqlens_k"},
           {ptr(lay.seqused_k), "seqused_k"},
           {ptr(lay.block_table), "block_table"},
           {ptr(o.alibi_slopes), "alibi_slopes"},
           {ptr(o.q_descale), "q_descale"},
           {ptr(o.k_descale), "k_descale"},
           {ptr(o.v_descale), "v_descale"}}};
}

}  // namespace

void forward(const ForwardArgs& a) {
  core::begin_call(a.stream);
  AttnProblem p = core::build_attention(a.q, a.k, a.v, a.out, a.options, a.layout, a.stream);
  if (a.lse) {
    core::attach_lse(p, *a.lse, a.q.device);
    for (const auto& [t, name] : {std::pair{&a.out, "out"}, {&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}})
      core::check_no_overlap(*a.lse, "lse", *t, name);
  }
  if (a.s_dmask) {
    require(!p.cu_seqlens_q, "s_dmask", "is only available for dense (non-varlen) inputs");
    core::check_tensor(*a.s_dmask, "s_dmask", {p.batch, p.hq, p.sq, p.sk}, {DType::f32}, a.q.device);
    require(a.s_dmask->is_contiguous(), "s_dmask", "must be contiguous");
    core::check_no_overlap(*a.s_dmask, "s_dmask", a.out, "out");
    p.s_dmask = static_cast<float*>(a.s_dmask->data);
  }
  check_outputs_spare({{&a.out, "out"}, {ptr(a.lse), "lse"}, {ptr(a.s_dmask), "s_dmask"}},
                      small_inputs(a.layout, a.options));
  const core::Backend& be = backend_or_throw(a.q);
  check_supported(be, p, a.impl, false);
  be.forward(p, a.impl);
}

void backward(const BackwardArgs& a) {
  core::begin_call(a.stream);
  AttnProblem p = core::build_attention(a.q, a.k, a.v, a.out, a.options, a.layout, a.stream);
  const Device dev = a.q.device;
  core::attach_lse(p, a.lse, dev);
  // dout looks like out; dq/dk/dv like q/k/v, in their dtype, or for fp8 inputs in out's (grad_type).
  const DType grad_dtype = is_fp8(a.q.dtype) ? a.out.dtype : a.q.dtype;
  const TensorView& o = a.out;
  if (o.ndim == 4)
    core::check_tensor(a.dout, "dout", {o.shape[0], o.shape[1], o.shape[2], o.shape[3]}, {o.dtype}, dev);
  else
    core::check_tensor(a.dout, "dout", {o.shape[0], o.shape[1], o.shape[2]}, {o.dtype}, dev);
  const std::pair<const TensorView*, const char*> ins[] = {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}};
  const std::pair<const TensorView*, const char*> grads[] = {{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
  for (int i = 0; i < 3; ++i) {
    const TensorView& in = *ins[i].first;
    const TensorView& g = *grads[i].first;
    if (in.ndim == 4)
      core::check_tensor(g, grads[i].second, {in.shape[0], in.shape[1], in.shape[2], in.shape[3]},
                         {grad_dtype}, dev);
    else
      core::check_tensor(g, grads[i].second, {in.shape[0], in.shape[1], in.shape[2]}, {grad_dtype}, dev);
    for (const auto& [other, name] : ins) core::check_no_overlap(g, grads[i].second, *other, name);
    core::check_no_overlap(g, grads[i].second, a.out, "out");
    core::check_no_overlap(g, grads[i].second, a.dout, "dout");
    core::check_no_overlap(g, grads[i].second, a.lse, "lse");
    for (int j = 0; j < i; ++j) core::check_no_overlap(g, grads[i].second, *grads[j].first, grads[j].second);
  }
  check_outputs_spare({{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}}, small_inputs(a.layout, a.options));
  p.dout = operand(a.dout);
  p.grad_q = operand(a.dq), p.grad_k = operand(a.dk), p.grad_v = operand(a.dv);
  const core::Backend& be = backend_or_throw(a.q);
  check_supported(be, p, a.impl, true);
  be.backward(p, a.impl);
}

core::KvCacheProblem core::build_kvcache(const KvCacheArgs& a) {
  const Device dev = a.q.device;
  const bool paged = a.block_table.has_value();
  require(a.q.ndim == 4, "q",
          [&] { return "expected shape (batch, seqlen_q, nheads, headdim), got " + a.q.describe(); });
  const int64_t batch = a.q.shape[0], sq = a.q.shape[1];
  require(a.k_cache.ndim == 4, "k_cache",
          [&] { return "expected 4 dimensions, got " + a.k_cache.describe(); });
  require(a.k_new.has_value() == a.v_new.has_value(), a.k_new ? "v_new" : "k_new",
          "k and v must be given together");
  require(a.options.dropout_p == 0.0, "dropout_p",
          [&] { return "must be 0 with a kv cache, got " + std::to_string(a.options.dropout_p); });
  require(a.num_splits >= 0 && a.num_splits <= kMaxNumSplits, "num_splits", [&] {
    return "must be in [0, " + num(kMaxNumSplits) + "] (0 = heuristic), got " + num(a.num_splits);
  });
  require(!(paged && a.cache_batch_idx), "cache_batch_idx",
          "cannot be combined with a paged cache (block_table)");
  if (a.k_new) require(a.cache_seqlens.has_value(), "cache_seqlens", "is required when appending k/v");

  // The cache as the attention's keys: dense per batch row (through cache_batch_idx) or paged.
  SequenceLayout lay;
  if (paged) lay.block_table = a.block_table;
  const int64_t cache_rows = a.k_cache.shape[0];
  int64_t capacity = a.k_cache.shape[1];
  if (paged) {
    const int64_t pages = a.block_table->ndim == 2 ? a.block_table->shape[1] : 0;
    require(!__builtin_mul_overflow(pages, a.k_cache.shape[1], &capacity), "block_table",
            [&] { return "holds more tokens than int64 counts: " + a.block_table->describe(); });
  }
  TensorView k_cache = a.k_cache, v_cache = a.v_cache;
  if (!paged && !a.cache_batch_idx) {
    require(cache_rows == batch, "k_cache", [&] {
      return "expected batch " + num(batch) + " rows (or pass cache_batch_idx), got " + a.k_cache.describe();
    });
  }
  if (!paged && a.cache_batch_idx) {
    // Validate against a view with q's batch so build_attention's dense shape checks apply unchanged;
    // the rows cache_batch_idx picks from must exist in both caches.
    require(a.v_cache.ndim < 1 || a.v_cache.shape[0] == cache_rows, "v_cache", [&] {
      return "expected " + num(cache_rows) + " rows like k_cache (cache_batch_idx indexes both), got " +
             a.v_cache.describe();
    });
    k_cache.shape[0] = batch;
    v_cache.shape[0] = batch;
  }
  AttnProblem p = core::build_attention(a.q, k_cache, v_cache, a.out, a.options, lay, a.stream, paged);
  if (a.lse) {
    core::attach_lse(p, *a.lse, dev);
    for (const auto& [t, name] :
         {std::pair{&a.q, "q"}, {&a.out, "out"}, {&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}})
      core::check_no_overlap(*a.lse, "lse", *t, name);
  }

  core::KvCacheProblem kp{};
  const int64_t hk = p.hk;
  int64_t s_new = 0;
  if (a.k_new) {
    core::check_tensor(*a.k_new, "k_new", {batch, -1, hk, p.d}, {a.q.dtype}, dev);
    s_new = a.k_new->shape[1];
    core::check_tensor(*a.v_new, "v_new", {batch, s_new, hk, p.dv}, {a.q.dtype}, dev);
    // Appending makes the caches outputs: each element its own memory, and no input read after the
    // write (q, k_new, v_new) may share memory with either cache.
    for (const auto& [cache, cname] : {std::pair{&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}}) {
      core::check_no_self_overlap(*cache, cname, "k/v are appended");
      for (const auto& [in, iname] : {std::pair{&a.q, "q"}, {&*a.k_new, "k_new"}, {&*a.v_new, "v_new"}})
        core::check_no_overlap(*cache, cname, *in, iname);
    }
    kp.k_new = operand(*a.k_new);
    kp.v_new = operand(*a.v_new);
  }
  // Without k_new the caches are inputs only: they may be read-only, broadcast, or share memory with q.
  core::check_no_overlap(a.out, "out", a.k_cache, "k_cache");
  core::check_no_overlap(a.out, "out", a.v_cache, "v_cache");
  const int32_t* seqlens = nullptr;
  if (a.cache_seqlens) {
    core::check_index_tensor(*a.cache_seqlens, "cache_seqlens", {batch}, dev);
    p.seqused_k = static_cast<const int*>(a.cache_seqlens->data);
    p.seqused_k_add = s_new;
    kp.cache_seqlens = p.seqused_k;
    seqlens = core::host_ints(*a.cache_seqlens);
    for (int64_t b = 0; seqlens && b < batch; ++b) {
      require(seqlens[b] >= 0, "cache_seqlens",
              [&] { return "entry " + num(b) + " = " + num(seqlens[b]) + " must be >= 0"; });
      require(seqlens[b] + s_new <= capacity, "cache_seqlens", [&] {
        return "entry " + num(b) + " = " + num(seqlens[b]) + " plus " + num(s_new) +
               " new tokens exceeds the cache capacity " + num(capacity) +
               (paged ? " (block_table.shape[1] * page_size)" : " (k_cache.shape[1])");
      });
    }
  }
  if (a.cache_batch_idx) {
    core::check_index_tensor(*a.cache_batch_idx, "cache_batch_idx", {batch}, dev);
    if (const int32_t* idx = core::host_ints(*a.cache_batch_idx))
      for (int64_t b = 0; b < batch; ++b)
        require(idx[b] >= 0 && idx[b] < cache_rows, "cache_batch_idx", [&] {
          return "entry " + num(b) + " = " + num(idx[b]) + " is outside [0, " + num(cache_rows) + ")";
        });
    p.kv_batch_idx = static_cast<const int*>(a.cache_batch_idx->data);
    p.kv_rows = cache_rows;
  }
  if (a.cache_leftpad) {
    core::check_index_tensor(*a.cache_leftpad, "cache_leftpad", {batch}, dev);
    if (const int32_t* lp = core::host_ints(*a.cache_leftpad))
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t end = seqlens ? seqlens[b] + s_new : capacity;
        require(lp[b] >= 0 && lp[b] <= end, "cache_leftpad",
                [&] { return "entry " + num(b) + " = " + num(lp[b]) + " is outside [0, " + num(end) + "]"; });
      }
    p.leftpad_k = static_cast<const int*>(a.cache_leftpad->data);
  }
  // The pages each sequence uses follow from cache_seqlens and the appended tokens (all of them without
  // cache_seqlens); entries past them are never read, so they may hold anything (padding, -1).
  if (paged) core::check_block_table_values(*a.block_table, p, std::nullopt, a.cache_seqlens);
  require(a.rotary_cos.has_value() == a.rotary_sin.has_value(), a.rotary_cos ? "rotary_sin" : "rotary_cos",
          "rotary_cos and rotary_sin must be given together");
  if (a.rotary_cos) {
    require(a.cache_seqlens.has_value(), "cache_seqlens",
            "is required with rotary_cos/rotary_sin (positions)");
    const TensorView& c = *a.rotary_cos;
    require(c.ndim == 2, "rotary_cos",
            [&] { return "expected shape (max_pos, rotary_dim / 2), got " + c.describe(); });
    // Bounded before doubling: a corrupt extent near INT64_MIN/MAX would overflow the product.
    require(c.shape[1] >= 1 && c.shape[1] <= p.d / 2, "rotary_cos", [&] {
      return "rotary_dim = 2 * " + num(c.shape[1]) + " must be in [2, head dim " + num(p.d) + "]";
    });
    const int64_t rot = c.shape[1] * 2;
    core::check_tensor(c, "rotary_cos", {-1, rot / 2}, {a.q.dtype}, dev);
    core::check_tensor(*a.rotary_sin, "rotary_sin", {c.shape[0], rot / 2}, {a.q.dtype}, dev);
    for (int64_t b = 0; seqlens && b < batch; ++b)
      require(seqlens[b] + std::max<int64_t>(s_new, sq) <= c.shape[0], "rotary_cos", [&] {
        return "has " + num(c.shape[0]) + " positions, sequence " + num(b) + " needs " +
               num(seqlens[b] + std::max<int64_t>(s_new, sq));
      });
    kp.rotary_cos = c.data;
    kp.rotary_sin = a.rotary_sin->data;
    kp.rotary_row_stride = c.stride[0];
    require(a.rotary_sin->stride[0] == c.stride[0], "rotary_sin", "must have the row stride of rotary_cos");
    kp.rotary_max_pos = c.shape[0];
    kp.rotary_dim = (int)rot;
  }
  kp.s_new = s_new;
  kp.rotary_interleaved = a.rotary_interleaved;
  {
    const TensorView* k_out = a.k_new ? &a.k_cache : nullptr;  // the caches are written only when appending
    const TensorView* v_out = a.k_new ? &a.v_cache : nullptr;
    const std::initializer_list<Named> outputs = {
        {&a.out, "out"}, {ptr(a.lse), "lse"}, {k_out, "k_cache"}, {v_out, "v_cache"}};
    const std::array<Named, 5> cache_inputs = {{{ptr(a.cache_seqlens), "cache_seqlens"},
                                                {ptr(a.cache_batch_idx), "cache_batch_idx"},
                                                {ptr(a.cache_leftpad), "cache_leftpad"},
                                                {ptr(a.rotary_cos), "rotary_cos"},
                                                {ptr(a.rotary_sin), "rotary_sin"}}};
    check_outputs_spare(outputs, small_inputs(lay, a.options));
    check_outputs_spare(outputs, cache_inputs);
  }
  kp.rotary_q_per_token = a.options.causal || a.options.window_left >= 0 || a.options.window_right >= 0;
  kp.num_splits = a.num_splits;
  kp.attn = p;
  return kp;
}

void forward_kvcache(const KvCacheArgs& a) {
  core::begin_call(a.stream);
  const core::KvCacheProblem kp = core::build_kvcache(a);
  const core::Backend& be = backend_or_throw(a.q);
  check_supported(be, kp.attn, a.impl, false);
  be.forward_kvcache(kp, a.impl);
}

void merge_states(const MergeArgs& a) {
  const Device dev = a.out_a.device;
  const std::initializer_list<DType> types = {DType::f32, DType::f16, DType::bf16, DType::f64};
  core::check_tensor(a.out_a, "out_a", {-1, -1, -1, -1}, types, dev);
  const TensorView& t = a.out_a;
  const int64_t b = t.shape[0], s = t.shape[1], h = t.shape[2], d = t.shape[3];
  require(d >= 1, "out_a", [&] { return "head dim must be >= 1, got " + t.describe(); });
  core::check_tensor(a.out_b, "out_b", {b, s, h, d}, {t.dtype}, dev);
  core::check_tensor(a.out, "out", {b, s, h, d}, {t.dtype}, dev);
  core::check_tensor(a.lse_a, "lse_a", {b, h, s}, {DType::f32}, dev);
  core::check_tensor(a.lse_b, "lse_b", {b, h, s}, {DType::f32}, dev);
  require(a.lse_a.is_contiguous(), "lse_a", "must be contiguous");
  require(a.lse_b.is_contiguous(), "lse_b", "must be contiguous");
  core::check_no_overlap(a.out, "out", a.out_a, "out_a", true);
  core::check_no_overlap(a.out, "out", a.out_b, "out_b", true);
  core::check_no_overlap(a.out, "out", a.lse_a, "lse_a");
  core::check_no_overlap(a.out, "out", a.lse_b, "lse_b");
  core::MergeProblem mp{b,
                        s,
                        h,
                        d,
                        (int)t.dtype,
                        operand(a.out_a),
                        operand(a.out_b),
                        operand(a.out),
                        static_cast<const float*>(a.lse_a.data),
                        static_cast<const float*>(a.lse_b.data),
                        nullptr,
                        a.stream,
                        dev.index};
  if (a.lse) {
    core::check_tensor(*a.lse, "lse", {b, h, s}, {DType::f32}, dev);
    require(a.lse->is_contiguous(), "lse", "must be contiguous");
    core::check_no_overlap(*a.lse, "lse", a.lse_a, "lse_a", true);
    core::check_no_overlap(*a.lse, "lse", a.lse_b, "lse_b", true);
    core::check_no_overlap(*a.lse, "lse", a.out, "out");
    mp.lse = static_cast<float*>(a.lse->data);
  }
  backend_or_throw(a.out_a).merge_states(mp);
}

const char* version() {
  return FLASHPORT_VERSION;
}

const char* available_backends() {
  static const std::string names = [] {
    std::string s = "cpu";
    if (core::backend_for(DeviceType::cuda)) s += ",cuda";
    if (core::backend_for(DeviceType::hip)) s += ",hip";
    return s;
  }();
  return names.c_str();
}

}  // namespace flashport
