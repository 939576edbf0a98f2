// The plain parameter block every backend receives: pointers, 64-bit strides, lengths, flags.
// Built and validated by the core from the public argument structs; backends never see TensorView.
// Self-contained (builtin types only) so GPU kernels can take it by value.
#pragma once

#include "semantics.h"

namespace flashport {

/// Element type codes; equal to the values of flashport::DType.
enum ElemType : int { kF64 = 0, kF32 = 1, kF16 = 2, kBF16 = 3, kE4M3 = 4, kE4M3FNUZ = 5, kE5M2 = 6 };
/// Element type `t` is one of the fp8 formats.
FP_HD constexpr bool is_fp8_elem(int t) {
  return t == kE4M3 || t == kE4M3FNUZ || t == kE5M2;
}

/// One attention operand laid out as (batch, token, head, channel). Strides in elements.
/// Varlen: `batch_stride` is unused, rows start at cu_seqlens[b]. Paged: `batch_stride` is the
/// stride of one page (block) and tokens go through the block table.
struct Operand {
  void* ptr;
  long long batch_stride, row_stride, head_stride;
};

struct AttnProblem {
  // Sizes. `sq`/`sk` are the dense lengths or, for varlen, the max_seqlen bounds.
  long long batch, hq, hk, d, dv, sq, sk;
  int in_type, out_type;  // ElemType; q, k, v share in_type

  Operand q, k, v, o;
  // Backward only: dO (like o) and the gradients dQ/dK/dV (laid out like q/k/v). Named grad_* because
  // `dv` is the value head dim.
  Operand dout, grad_q, grad_k, grad_v;

  // Softmax statistics, fp32, contiguous: dense (b, hq, sq) at (b * hq + h) * sq + i;
  // varlen (hq, total_q) at h * total_q + cu_seqlens_q[b] + i. May be null in forward.
  float* lse;
  long long total_q;
  long long total_k;  // varlen (non-paged) K/V rows: the bound of whole-tensor copies (TMA maps)

  // Sequences. Null pointers mean dense.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  const int* seqused_k;
  long long seqused_k_add;  // added to seqused_k[b] (kv-cache: the s_new appended tokens)
  const int* leftpad_k;     // kv-cache only: keys of sequence b start at token leftpad_k[b]
  const int* kv_batch_idx;  // kv-cache only: cache row of batch entry b
  const int* block_table;   // paged KV, (batch, max_blocks) int32
  long long block_table_stride, page_size;
  // Bound of block_table entries (number of pages) or of kv_batch_idx entries (cache rows). Index
  // tensors in GPU memory are never read on the host, so addressing checks them against this.
  long long kv_rows;

  // Scores.
  float scale;    // softmax scale, times q/k descale for fp8 (applied per (b, hk) below)
  float softcap;  // 0: off
  long long window_left, window_right;  // causal folded in as window_right = 0; -1 unbounded
  const float* alibi;                   // (b, hq) with alibi_batch_stride, or (hq,) with stride 0
  long long alibi_batch_stride;

  // Dropout.
  float dropout_p;  // 0: no mask drawn
  unsigned int dropout_threshold;
  unsigned long long seed;
  unsigned int offset;

  // FP8 descales, fp32 (b, hk) with batch stride and head stride; null means 1.
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  long long descale_batch_stride[3], descale_head_stride[3];

  // Debug probabilities (reference only): fp32 (b, hq, sq, sk) contiguous, may be null.
  float* s_dmask;

  bool deterministic;
  void* stream;
  // Ordinal of the device that holds every tensor (the caller's Device index): GPU backends check it
  // against q's pointer once per call and then launch there without asking the driver again.
  int device;
};

/// Kernel arguments of merge_states (CUDA merge_states.cu, CDNA merge_states.hpp): two partial attention
/// states (b, s, h, d) of ElemType `type` with fp32 (b, h, s) LSEs, merged into `out` (which may alias a or
/// b) and optionally `lse` (which may alias lse_a or lse_b); core::MergeProblem without the stream.
struct MergeParams {
  long long batch, seqlen, heads, d;
  int type;
  Operand a, b, out;
  const float* lse_a;
  const float* lse_b;
  float* lse;
};

/// Row `row` of merge_states, in the LSEs' order ((b * heads + h) * seqlen + s): its states' fp64 weights
/// (sem::lse_weight against their max: a state of LSE -inf weighs 0 and is never read, so its unwritten
/// output cannot leak NaN), the merged LSE (-inf when both weigh 0; out is then 0), and the offsets of
/// its channel 0 in a, b and out. The CPU, CUDA and CDNA merges all take it; out = (w_a a + w_b b) / w_sum.
struct MergeRow {
  double w_a, w_b, w_sum;
  float lse;
  long long a_off, b_off, o_off;
};
FP_HD MergeRow merge_row(const MergeParams& mp, long long row) {
  const long long s = row % mp.seqlen, h = (row / mp.seqlen) % mp.heads, b = row / (mp.seqlen * mp.heads);
  const double lse_a = mp.lse_a[row], lse_b = mp.lse_b[row];
  const double m = lse_a > lse_b ? lse_a : lse_b;
  MergeRow r;
  r.w_a = sem::lse_weight(lse_a, m), r.w_b = sem::lse_weight(lse_b, m);
  r.w_sum = r.w_a + r.w_b;
  r.lse = r.w_sum > 0.0 ? (float)(m + ::log(r.w_sum)) : sem::kNegInf;
  r.a_off = b * mp.a.batch_stride + s * mp.a.row_stride + h * mp.a.head_stride;
  r.b_off = b * mp.b.batch_stride + s * mp.b.row_stride + h * mp.b.head_stride;
  r.o_off = b * mp.out.batch_stride + s * mp.out.row_stride + h * mp.out.head_stride;
  return r;
}

/// Kernel arguments of the KV-cache append (CUDA kvcache_append.cu, CDNA kvcache_append.hpp): the
/// append part of core::KvCacheProblem in plain fields. `attn` addresses the cache (k/v operands,
/// leftpad, kv_batch_idx, block table) and q; new tokens go to absolute cache slots cache_seqlens[b] + t
/// (attention key index slot - leftpad).
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

// ---------------------------------------------------------------------------------------------
// Addressing shared by every backend.

/// Number of queries of sequence b.
// Lengths are clamped at 0: index tensors in GPU memory are never value-checked, and a decreasing
// cu_seqlens (or a left pad past the end) must give an empty sequence, never a negative loop bound or
// buffer size.
FP_HD long long clamp_len(long long n) {
  return n > 0 ? n : 0;
}

FP_HD long long seqlen_q(const AttnProblem& p, long long b) {
  return p.cu_seqlens_q ? clamp_len(p.cu_seqlens_q[b + 1] - (long long)p.cu_seqlens_q[b]) : p.sq;
}

/// Number of keys of sequence b (after seqused_k and the kv-cache left pad).
FP_HD long long seqlen_k(const AttnProblem& p, long long b) {
  long long n = p.seqused_k      ? (long long)p.seqused_k[b] + p.seqused_k_add
                : p.cu_seqlens_k ? p.cu_seqlens_k[b + 1] - (long long)p.cu_seqlens_k[b]
                                 : p.sk;
  return clamp_len(p.leftpad_k ? n - p.leftpad_k[b] : n);
}

/// Key rows sequence b occupies in memory: more than seqlen_k when seqused_k trims it.
FP_HD long long key_rows(const AttnProblem& p, long long b) {
  return p.cu_seqlens_k ? clamp_len(p.cu_seqlens_k[b + 1] - (long long)p.cu_seqlens_k[b]) : p.sk;
}

/// Query and key counts of sequence b for a kernel reading index tensors the host never checked:
/// seqlen_q / seqlen_k where the indices are valid; an index that would address outside its tensor
/// (cu_seqlens past total, a left pad past the end) gives an empty sequence instead, so nothing is read
/// out of bounds. Called by the CUDA portable forward (`sequence()` in kernels/cuda/attn_fwd.cuh), the
/// Hopper forward (`make_block()` in kernels/cuda/hopper/softmax_sm90.cuh) and the CDNA forward; the
/// backward (bwd_seq.cuh) applies the same rules in its 32-bit Seq.
struct SeqLens {
  long long q, k;
};
FP_HD SeqLens guarded_lengths(const AttnProblem& p, long long b) {
  long long len_q = p.sq;
  if (p.cu_seqlens_q) {
    const long long s0 = p.cu_seqlens_q[b], s1 = p.cu_seqlens_q[b + 1];
    len_q = (s0 < 0 || s1 < s0 || s1 > p.total_q) ? 0 : s1 - s0;
  }
  long long n = p.sk;
  if (p.seqused_k) n = (long long)p.seqused_k[b] + p.seqused_k_add;
  if (p.cu_seqlens_k && !p.block_table) {  // k_offset's row base: cu_seqlens_k[b] + token
    const long long s0 = p.cu_seqlens_k[b], s1 = p.cu_seqlens_k[b + 1];
    const long long cap = (s0 < 0 || s1 < s0 || s1 > p.total_k) ? 0 : s1 - s0;  // total_k may be 0
    n = p.seqused_k ? (n < cap ? n : cap) : cap;
  } else if (p.cu_seqlens_k && !p.seqused_k) {
    const long long s0 = p.cu_seqlens_k[b], s1 = p.cu_seqlens_k[b + 1];
    n = s1 < s0 ? 0 : s1 - s0;
  }
  n = n < 0 ? 0 : n > p.sk ? p.sk : n;  // p.sk bounds every sequence (cache capacity, max_seqlen_k)
  if (p.leftpad_k) {
    const long long pad = p.leftpad_k[b];
    n = (pad < 0 || pad > n) ? 0 : n - pad;  // k_offset adds the pad: only valid pads reach it
  }
  return {len_q, n};
}

/// Element offset of (sequence b, query i, head h) in a query-shaped operand (q, o, dout, dq).
FP_HD long long q_offset(const AttnProblem& p, const Operand& t, long long b, long long i, long long h) {
  const long long row = p.cu_seqlens_q ? (long long)p.cu_seqlens_q[b] + i : i;
  const long long base = p.cu_seqlens_q ? 0 : b * t.batch_stride;
  return base + row * t.row_stride + h * t.head_stride;
}

/// Element offset of token `token` (the left pad included) of kv head h in page `page` of a paged
/// operand, -1 for a page outside the pool [0, kv_rows). k_offset's paged rule, also called by kernels
/// that read the block table themselves (the CUDA decode variant's page window).
FP_HD long long page_row_offset(const AttnProblem& p, const Operand& t, long long page, long long token,
                                long long h) {
  if (page < 0 || page >= p.kv_rows) return -1;
  return page * t.batch_stride + (token % p.page_size) * t.row_stride + h * t.head_stride;
}

/// Element offset of (sequence b, key j, kv head h) in a key-shaped operand (k, v, dk, dv), through
/// cu_seqlens_k, the kv-cache batch index and left pad, or the block table.
FP_HD long long k_offset(const AttnProblem& p, const Operand& t, long long b, long long j, long long h) {
  const long long token = p.leftpad_k ? j + p.leftpad_k[b] : j;
  // Returns -1 (callers skip or zero-fill) for a block or cache row outside [0, kv_rows).
  if (p.block_table)
    return page_row_offset(p, t, p.block_table[b * p.block_table_stride + token / p.page_size], token, h);
  if (p.cu_seqlens_k) return ((long long)p.cu_seqlens_k[b] + token) * t.row_stride + h * t.head_stride;
  const long long row_b = p.kv_batch_idx ? (long long)p.kv_batch_idx[b] : b;
  if (p.kv_batch_idx && (row_b < 0 || row_b >= p.kv_rows)) return -1;
  return row_b * t.batch_stride + token * t.row_stride + h * t.head_stride;
}

/// Offset of (b, h, i) in the fp32 LSE buffer.
FP_HD long long lse_offset(const AttnProblem& p, long long b, long long h, long long i) {
  return p.cu_seqlens_q ? h * p.total_q + p.cu_seqlens_q[b] + i : (b * p.hq + h) * p.sq + i;
}

// GQA/MQA: query heads [hk * group, (hk + 1) * group) read kv head hk (validation checks hq % hk == 0).

/// Query heads per kv head.
FP_HD long long gqa_group(const AttnProblem& p) {
  return p.hq / p.hk;
}

/// The kv head query head h reads.
FP_HD long long kv_head(const AttnProblem& p, long long h) {
  return h / gqa_group(p);
}

/// Query head g (0 <= g < group) of kv head hk: kv_head's inverse. Templated on the index type so
/// 32-bit kernel code stays 32-bit.
template <class I>
FP_HD I group_head(I hk, I group, I g) {
  return hk * group + g;
}

/// GQA packing of a forward whose query blocks hold `block_m` rows: the group (its query heads share a
/// block's rows, query-major: row r is query r / group of head group_head(hk, group, r % group)) when
/// that needs fewer blocks than one head per block (short query lengths: decode, where each kv head's
/// K/V is then read once per block instead of once per query head), else 1. The CUDA portable and the
/// CDNA forward both launch by it.
FP_HD long long gqa_pack(const AttnProblem& p, long long block_m) {
  const long long group = gqa_group(p);
  const long long plain = group * ((p.sq + block_m - 1) / block_m),
                  packed = (p.sq * group + block_m - 1) / block_m;
  return group > 1 && packed < plain ? group : 1;
}

/// The query heads that read kv head hk.
FP_HD sem::Range group_heads(const AttnProblem& p, long long hk) {
  const long long group = gqa_group(p);
  return {group_head(hk, group, 0LL), group_head(hk + 1, group, 0LL)};
}

/// ALiBi slope of (b, h), 0 when ALiBi is off.
FP_HD float alibi_slope(const AttnProblem& p, long long b, long long h) {
  return p.alibi ? p.alibi[b * p.alibi_batch_stride + h] : 0.0f;
}

/// ElemType of dq / dk / dv: the input's, or for fp8 inputs the output's (SPEC "Backward": fp8 gradients
/// are taken with respect to the fp8 tensors' values, the descales being constants, and come out in the
/// output dtype).
FP_HD int grad_type(const AttnProblem& p) {
  return is_fp8_elem(p.in_type) ? p.out_type : p.in_type;
}

/// Descale factor `which` (0 q, 1 k, 2 v) of (b, kv head hk); 1 when absent.
FP_HD float descale(const AttnProblem& p, int which, long long b, long long hk) {
  const float* d = which == 0 ? p.q_descale : which == 1 ? p.k_descale : p.v_descale;
  return d ? d[b * p.descale_batch_stride[which] + hk * p.descale_head_stride[which]] : 1.0f;
}

/// The score transform of SPEC steps 1-3 for a raw dot product (scale already includes descales).
template <class T>
FP_HD T score(const AttnProblem& p, T dot, T scale, T slope, long long i, long long j, long long sq,
              long long sk) {
  T s = sem::softcap(scale * dot, T(p.softcap));
  return p.alibi ? s + sem::alibi_bias(slope, i, j, sq, sk) : s;
}

// ---------------------------------------------------------------------------------------------
// KV-cache update (SPEC "KV-cache update"): the row rules of the append and of q's rotation, shared by
// the CUDA and CDNA kernels (one row per warp / wave, lanes over channels) and the CPU backend.

/// Element offset of (b, token i, head h) in a dense (b, s, h, d) operand (k_new, v_new, the q scratch).
FP_HD long long dense_offset(const Operand& t, long long b, long long i, long long h) {
  return b * t.batch_stride + i * t.row_stride + h * t.head_stride;
}

/// Channel c (< rotary_dim) of the row at element `off` of `x`, rotated at position `pos`, in fp32 (the
/// caller rounds it to the storage type). `load(ptr, off)` reads one element of the input dtype as fp32.
/// `Params`: KvAppendParams (kernels) or core::KvCacheProblem (CPU), which name the table alike.
template <class Params, class Load>
FP_HD float rotated_channel(const Params& kp, const void* x, long long off, int c, long long pos, Load load) {
  const long long cs = pos * kp.rotary_row_stride;
  return sem::rotary_channel(
      c, kp.rotary_dim, kp.rotary_interleaved != 0, [&](int ch) { return load(x, off + ch); },
      [&](int k) { return load(kp.rotary_cos, cs + k); }, [&](int k) { return load(kp.rotary_sin, cs + k); });
}

/// Where appended row r = (b * s_new + t) * hk + h goes. `ok` is false when its slot is outside the
/// cache, its rotary position past the table, or its block-table / batch-index entry outside the pool:
/// device-resident cache_seqlens and leftpad are not validated on the host, so such a row is skipped
/// rather than written out of bounds.
struct AppendRow {
  long long b, t, h, pos;  // pos: absolute slot cache_seqlens[b] + t (key position pos - leftpad)
  long long k_src, v_src, k_dst, v_dst;
  bool ok;
};
FP_HD AppendRow append_row(const KvAppendParams& kp, long long row) {
  const AttnProblem& a = kp.attn;
  AppendRow r{};
  r.h = row % a.hk, r.t = (row / a.hk) % kp.s_new, r.b = row / (a.hk * kp.s_new);
  r.pos = (long long)kp.cache_seqlens[r.b] + r.t;
  const long long pad = a.leftpad_k ? (long long)a.leftpad_k[r.b] : 0;
  if (r.pos < 0 || r.pos >= a.sk || pad < 0) return r;
  if (kp.rotary_dim > 0 && r.pos >= kp.rotary_max_pos) return r;
  r.k_dst = k_offset(a, a.k, r.b, r.pos - pad, r.h), r.v_dst = k_offset(a, a.v, r.b, r.pos - pad, r.h);
  r.ok = r.k_dst >= 0 && r.v_dst >= 0;
  r.k_src = dense_offset(kp.k_new, r.b, r.t, r.h), r.v_src = dense_offset(kp.v_new, r.b, r.t, r.h);
  return r;
}

/// Query row r = (b * sq + i) * hq + h of rotate_q: rotated at cache_seqlens[b] (+ i when per token)
/// into the dense scratch at r * d. Outside the table (only with invalid device-resident
/// cache_seqlens) it is copied unrotated.
struct QRotRow {
  long long b, i, h, pos, src, dst;
  bool in_table;
};
FP_HD QRotRow q_rot_row(const KvAppendParams& kp, long long row) {
  const AttnProblem& a = kp.attn;
  QRotRow r{};
  r.h = row % a.hq, r.i = (row / a.hq) % a.sq, r.b = row / (a.hq * a.sq);
  r.pos = (long long)kp.cache_seqlens[r.b] + (kp.rotary_q_per_token ? r.i : 0);
  r.in_table = r.pos >= 0 && r.pos < kp.rotary_max_pos;
  r.src = q_offset(a, a.q, r.b, r.i, r.h), r.dst = row * a.d;
  return r;
}

}  // namespace flashport
