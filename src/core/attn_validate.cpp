// Validation of the attention arguments and their translation into the plain AttnProblem block.
#include "attn_validate.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "check.hpp"
#include "index_fault.hpp"

namespace flashport::core {
namespace {

constexpr int64_t kMaxHeadDim = 256;

std::string num(int64_t v) {
  return std::to_string(v);
}

/// %g, so 1e-300 does not print as 0.000000.
std::string real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

/// A length the kernels hold in an int: [0, INT32_MAX].
void check_length(int64_t v, const char* name) {
  require(v >= 0 && v <= INT32_MAX, name, [&] {
    return "must be in [0, " + num(INT32_MAX) + "] (sequence lengths are int32), got " + num(v);
  });
}

/// A scalar the kernels use as fp32: outside [FLT_MIN, FLT_MAX] in magnitude (0 excepted) it would become
/// inf (NaN outputs) or a subnormal/zero (a silently different answer), so it is refused instead.
void check_fp32(double v, const char* name) {
  const double m = std::fabs(v);
  require(std::isfinite(v) && m <= FLT_MAX && (m == 0.0 || m >= FLT_MIN), name, [&] {
    return "must be finite and fit float32: 0 or a magnitude in [" + real(FLT_MIN) + ", " + real(FLT_MAX) +
           "], got " + real(v);
  });
}

Operand operand(const TensorView& t) {
  // 4-D (batch|block, token, head, channel) or 3-D varlen (token, head, channel).
  if (t.ndim == 4) return {t.data, t.stride[0], t.stride[1], t.stride[2]};
  return {t.data, 0, t.stride[0], t.stride[1]};
}

void check_options(const AttentionOptions& o, const TensorView& q, int64_t batch, int64_t hq, int64_t hk) {
  if (o.softmax_scale) check_fp32(*o.softmax_scale, "softmax_scale");
  require(o.window_left >= -1, "window_left",
          [&] { return "must be >= -1 (-1 = unbounded), got " + num(o.window_left); });
  require(o.window_right >= -1, "window_right",
          [&] { return "must be >= -1 (-1 = unbounded), got " + num(o.window_right); });
  require(!(o.softcap < 0.0), "softcap", [&] { return "must be >= 0 (0 = off), got " + real(o.softcap); });
  check_fp32(o.softcap, "softcap");
  require(o.dropout_p >= 0.0 && o.dropout_p < 1.0, "dropout_p",
          [&] { return "must be in [0, 1), got " + real(o.dropout_p); });
  check_fp32(o.dropout_p, "dropout_p");
  if (o.alibi_slopes) {
    const TensorView& a = *o.alibi_slopes;
    if (a.ndim == 1)
      check_tensor(a, "alibi_slopes", {hq}, {DType::f32}, q.device);
    else
      check_tensor(a, "alibi_slopes", {batch, hq}, {DType::f32}, q.device);
  }
  const std::optional<TensorView>* ds[3] = {&o.q_descale, &o.k_descale, &o.v_descale};
  const char* names[3] = {"q_descale", "k_descale", "v_descale"};
  for (int i = 0; i < 3; ++i) {
    if (!*ds[i]) continue;
    require(is_fp8(q.dtype), names[i],
            [&] { return std::string("descales apply to fp8 inputs only, q is ") + dtype_name(q.dtype); });
    check_tensor(**ds[i], names[i], {batch, hk}, {DType::f32}, q.device, false);
  }
}

void fill_options(AttnProblem& p, const AttentionOptions& o) {
  p.scale = (float)(o.softmax_scale ? *o.softmax_scale : 1.0 / std::sqrt((double)p.d));
  p.softcap = (float)o.softcap;
  // A window reaching past every key of the longest sequences (>= sq + sk) is unbounded: store -1, so
  // kernels never add a huge window to a position (2^63 - 1 overflowed the mask arithmetic).
  const auto bound = [&](int64_t w) { return w >= p.sq + p.sk ? -1 : w; };
  p.window_left = bound(o.window_left);
  p.window_right = o.causal ? 0 : bound(o.window_right);
  if (o.alibi_slopes) {
    p.alibi = static_cast<const float*>(o.alibi_slopes->data);
    p.alibi_batch_stride = o.alibi_slopes->ndim == 2 ? o.alibi_slopes->stride[0] : 0;
  }
  p.dropout_p = (float)o.dropout_p;
  p.dropout_threshold = sem::dropout_threshold(o.dropout_p);
  p.seed = o.dropout_seed;
  p.offset = o.dropout_offset;
  const std::optional<TensorView>* ds[3] = {&o.q_descale, &o.k_descale, &o.v_descale};
  const float** dst[3] = {&p.q_descale, &p.k_descale, &p.v_descale};
  for (int i = 0; i < 3; ++i) {
    if (!*ds[i]) continue;
    *dst[i] = static_cast<const float*>((*ds[i])->data);
    p.descale_batch_stride[i] = (*ds[i])->stride[0];
    p.descale_head_stride[i] = (*ds[i])->stride[1];
  }
  p.deterministic = o.deterministic;
}

/// cu_seqlens values (host only): non-decreasing (no negative length), lengths <= max_len, and, for
/// rows of a packed tensor (`total` >= 0), starting at 0 and ending at `total`. Paged keys pass
/// total = -1: their rows come from the block table, only the lengths matter.
void check_cu_seqlens(const TensorView& cu, const char* name, int64_t total, int64_t max_len,
                      const char* max_name) {
  const int32_t* v = host_ints(cu);
  if (!v) return;
  const int64_t n = cu.shape[0];
  if (total >= 0) require(v[0] == 0, name, [&] { return "must start at 0, got " + num(v[0]); });
  for (int64_t i = 1; i < n; ++i) {
    require(v[i] >= v[i - 1], name, [&] {
      return "must be non-decreasing (sequence lengths are differences, never negative), got " +
             num(v[i - 1]) + " then " + num(v[i]) + " at index " + num(i);
    });
    const int64_t len = (int64_t)v[i] - v[i - 1];  // int32 values of any sign: the difference needs 33 bits
    require(len <= max_len, max_name, [&] {
      return "is an upper bound of the lengths, but sequence " + num(i - 1) + " has length " + num(len) +
             " > " + num(max_len);
    });
  }
  if (total >= 0)
    require(v[n - 1] == total, name,
            [&] { return "must end at the total token count " + num(total) + ", got " + num(v[n - 1]); });
}

}  // namespace

AttnProblem build_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& opts, const SequenceLayout& lay,
                            void* stream, bool table_lengths_later) {
  AttnProblem p{};
  const Device dev = q.device;
  const bool varlen = lay.cu_seqlens_q.has_value();
  const bool paged = lay.block_table.has_value();
  require(varlen == lay.cu_seqlens_k.has_value() || (varlen && paged),
          varlen ? "cu_seqlens_k" : "cu_seqlens_q", "varlen needs both cu_seqlens_q and cu_seqlens_k");
  const std::initializer_list<DType> in_types = {DType::f16,  DType::bf16,     DType::f32, DType::f64,
                                                 DType::e4m3, DType::e4m3fnuz, DType::e5m2};

  // q and the sizes it defines.
  int64_t batch, sq, total_q = 0;
  if (varlen) {
    check_tensor(q, "q", {-1, -1, -1}, in_types, dev);
    require(lay.cu_seqlens_q->ndim == 1 && lay.cu_seqlens_q->shape[0] >= 1, "cu_seqlens_q",
            [&] { return "expected shape (batch + 1,), got " + lay.cu_seqlens_q->describe(); });
    batch = lay.cu_seqlens_q->shape[0] - 1;
    check_length(lay.max_seqlen_q, "max_seqlen_q");
    sq = lay.max_seqlen_q;
    total_q = q.shape[0];
  } else {
    check_tensor(q, "q", {-1, -1, -1, -1}, in_types, dev);
    batch = q.shape[0];
    sq = q.shape[1];
  }
  const int64_t hq = q.shape[q.ndim - 2], d = q.shape[q.ndim - 1];
  require(d >= 1 && d <= kMaxHeadDim, "q",
          [&] { return "head dim must be in [1, " + num(kMaxHeadDim) + "], got " + num(d); });
  require(hq >= 1, "q", [&] { return "needs at least one head, got " + q.describe(); });

  // k and v: dense, varlen, or paged.
  int64_t hk, dv, sk, num_blocks = 0, page = 0;
  if (paged) {
    check_tensor(k, "k", {-1, -1, -1, d}, {q.dtype}, dev);
    num_blocks = k.shape[0];
    page = k.shape[1];
    hk = k.shape[2];
    check_tensor(v, "v", {num_blocks, page, hk, -1}, {q.dtype}, dev);
    require(page >= 1, "k", [&] { return "page size must be >= 1, got " + k.describe(); });
    check_index_tensor(*lay.block_table, "block_table", {batch, -1}, dev);
    // The kernels tell paged from packed keys by a non-null table; an empty one has no data to point at.
    require(lay.block_table->shape[1] >= 1, "block_table", [&] {
      return "needs at least one column (page) per sequence, got " + lay.block_table->describe();
    });
    require(!__builtin_mul_overflow(lay.block_table->shape[1], page, &sk), "block_table",
            [&] { return "holds more tokens than int64 counts: " + lay.block_table->describe(); });
    if (varlen) {
      require(lay.max_seqlen_k >= 0 && lay.max_seqlen_k <= sk, "max_seqlen_k", [&] {
        return "must be in [0, max_blocks_per_seq * page_size = " + num(sk) + "], got " +
               num(lay.max_seqlen_k);
      });
      sk = lay.max_seqlen_k;
    }
  } else if (varlen) {
    check_tensor(k, "k", {-1, -1, d}, {q.dtype}, dev);
    hk = k.shape[1];
    check_tensor(v, "v", {k.shape[0], hk, -1}, {q.dtype}, dev);
    check_length(lay.max_seqlen_k, "max_seqlen_k");
    sk = lay.max_seqlen_k;
  } else {
    check_tensor(k, "k", {batch, -1, -1, d}, {q.dtype}, dev);
    hk = k.shape[2];
    sk = k.shape[1];
    check_tensor(v, "v", {batch, sk, hk, -1}, {q.dtype}, dev);
  }
  dv = v.shape[v.ndim - 1];
  require(dv >= 1 && dv <= kMaxHeadDim, "v",
          [&] { return "head dim must be in [1, " + num(kMaxHeadDim) + "], got " + num(dv); });
  require(hk >= 1 && hq % hk == 0, "k", [&] {
    return "number of kv heads must divide the number of query heads (GQA/MQA): hq = " + num(hq) +
           ", hk = " + num(hk);
  });

  // Sequence index tensors.
  if (varlen) {
    check_index_tensor(*lay.cu_seqlens_q, "cu_seqlens_q", {batch + 1}, dev);
    check_cu_seqlens(*lay.cu_seqlens_q, "cu_seqlens_q", total_q, lay.max_seqlen_q, "max_seqlen_q");
    if (lay.cu_seqlens_k) {
      check_index_tensor(*lay.cu_seqlens_k, "cu_seqlens_k", {batch + 1}, dev);
      check_cu_seqlens(*lay.cu_seqlens_k, "cu_seqlens_k", paged ? -1 : k.shape[0], lay.max_seqlen_k,
                       "max_seqlen_k");
    }
  }
  if (lay.seqused_k) {
    check_index_tensor(*lay.seqused_k, "seqused_k", {batch}, dev);
    if (const int32_t* u = host_ints(*lay.seqused_k)) {
      for (int64_t b = 0; b < batch; ++b) {
        const int32_t* cu = lay.cu_seqlens_k ? host_ints(*lay.cu_seqlens_k) : nullptr;
        const int64_t cap = cu ? (int64_t)cu[b + 1] - cu[b] : sk;
        require(u[b] >= 0 && u[b] <= cap, "seqused_k",
                [&] { return "entry " + num(b) + " = " + num(u[b]) + " is outside [0, " + num(cap) + "]"; });
      }
    }
  }
  // Output.
  const bool fp8 = is_fp8(q.dtype);
  const std::initializer_list<DType> out_fp8 = {DType::bf16, DType::f16, DType::f32};
  const std::initializer_list<DType> out_same = {q.dtype};
  if (varlen)
    check_tensor(out, "out", {total_q, hq, dv}, fp8 ? out_fp8 : out_same, dev);
  else
    check_tensor(out, "out", {batch, sq, hq, dv}, fp8 ? out_fp8 : out_same, dev);
  check_no_overlap(out, "out", q, "q");
  check_no_overlap(out, "out", k, "k");
  check_no_overlap(out, "out", v, "v");

  check_options(opts, q, batch, hq, hk);

  p.batch = batch, p.hq = hq, p.hk = hk, p.d = d, p.dv = dv, p.sq = sq, p.sk = sk;
  p.in_type = (int)q.dtype;
  p.out_type = (int)out.dtype;
  p.q = operand(q), p.k = operand(k), p.v = operand(v), p.o = operand(out);
  p.total_q = total_q;
  p.total_k = (varlen && !paged) ? k.shape[0] : 0;
  p.cu_seqlens_q = varlen ? static_cast<const int*>(lay.cu_seqlens_q->data) : nullptr;
  p.cu_seqlens_k = lay.cu_seqlens_k ? static_cast<const int*>(lay.cu_seqlens_k->data) : nullptr;
  p.seqused_k = lay.seqused_k ? static_cast<const int*>(lay.seqused_k->data) : nullptr;
  if (paged) {
    p.block_table = static_cast<const int*>(lay.block_table->data);
    p.block_table_stride = lay.block_table->stride[0];
    p.page_size = page;
    p.kv_rows = num_blocks;
  }
  fill_options(p, opts);
  p.stream = stream;
  p.device = dev.index;
  // Lengths from cu_seqlens_k / seqused_k are checked above, so the columns each sequence uses are known.
  if (paged && !table_lengths_later)
    check_block_table_values(*lay.block_table, p, lay.cu_seqlens_k, lay.seqused_k);
  return p;
}

void check_block_table_values(const TensorView& block_table, AttnProblem p,
                              const std::optional<TensorView>& cu_seqlens_k,
                              const std::optional<TensorView>& seqused_k) {
  // The host copies (or host tensors themselves) stand in for the pointers the kernels read.
  p.block_table = host_ints(block_table);
  if (!p.block_table) return;
  if (cu_seqlens_k && !(p.cu_seqlens_k = host_ints(*cu_seqlens_k))) return;
  if (seqused_k && !(p.seqused_k = host_ints(*seqused_k))) return;
  const int64_t columns = block_table.shape[1];
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t used =
        std::min<int64_t>(block_table_columns(p, b), columns);  // lengths were checked: <= columns
    for (int64_t c = 0; c < used; ++c) {
      const IndexFault f = block_table_fault(p, b, c);
      if (f.kind == kFaultNone) continue;
      const FaultText t = describe_fault(f, kCallForward);
      throw Error(t.argument, t.message);
    }
  }
}

void attach_lse(AttnProblem& p, const TensorView& lse, const Device& dev) {
  if (p.cu_seqlens_q)
    check_tensor(lse, "lse", {p.hq, p.total_q}, {DType::f32}, dev);
  else
    check_tensor(lse, "lse", {p.batch, p.hq, p.sq}, {DType::f32}, dev);
  require(lse.is_contiguous(), "lse", [&] { return "must be contiguous, got " + lse.describe(); });
  p.lse = static_cast<float*>(lse.data);
}

}  // namespace flashport::core
