// The flashport C++ API: argument structs and the four entry points (see shared SPEC.md semantics).
#pragma once

#include <cstdint>
#include <optional>

#include "flashport/tensor.hpp"

namespace flashport {

/// Which implementation runs a call. `automatic` picks the fastest backend that supports the call on
/// the tensors' device. `reference` (fp64 accumulation, literal SPEC) and `baseline` (naive, rounds
/// scores and P to the input dtype: the accuracy rule's baseline) exist on the CPU only.
enum class Impl : uint8_t { automatic, reference, baseline, fast };

/// Everything that changes the scores or the softmax (SPEC.md "The score of query i and key j").
struct AttentionOptions {
  std::optional<double> softmax_scale;     ///< default 1/sqrt(head dim of q)
  bool causal = false;                     ///< bottom-right aligned; forces window_right = 0
  int64_t window_left = -1;                ///< -1: unbounded
  int64_t window_right = -1;               ///< -1: unbounded
  double softcap = 0.0;                    ///< 0: off; c > 0: s = c * tanh(s / c)
  std::optional<TensorView> alibi_slopes;  ///< fp32 (hq,) or (b, hq)
  double dropout_p = 0.0;                  ///< in [0, 1)
  uint64_t dropout_seed = 0;               ///< Philox key
  uint32_t dropout_offset = 0;             ///< Philox counter word 3
  bool deterministic = false;              ///< backward: bitwise-reproducible dQ/dK/dV
  /// FP8 inputs only: fp32 (b, hk) descale factors; absent means 1.
  std::optional<TensorView> q_descale, k_descale, v_descale;
};

/// How sequences are laid out. All absent: dense (b, s, h, d) tensors.
struct SequenceLayout {
  std::optional<TensorView> cu_seqlens_q;  ///< int32 (b+1,): varlen queries, q is (total_q, hq, d)
  std::optional<TensorView> cu_seqlens_k;  ///< int32 (b+1,): varlen keys, k/v are (total_k, hk, d)
  std::optional<TensorView> seqused_k;     ///< int32 (b,): use only the first seqused_k[i] keys
  int64_t max_seqlen_q = 0;                ///< varlen: upper bound of query lengths
  int64_t max_seqlen_k = 0;                ///< varlen: upper bound of key lengths
  /// int32 (b, max_blocks_per_seq): paged KV; k/v are then (num_blocks, page_size, hk, d).
  std::optional<TensorView> block_table;
};

/// forward(): out = attention(q, k, v).
struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;                 ///< (b, sq, hq, dv) or (total_q, hq, dv); written
  std::optional<TensorView> lse;  ///< fp32 (b, hq, sq) or (hq, total_q); written
  /// fp32 (b, hq, sq, sk): softmax probabilities, negated where dropout dropped them (flash-attn's
  /// return_attn_probs, for tests). Reference implementation only.
  std::optional<TensorView> s_dmask;
  AttentionOptions options;
  SequenceLayout layout;
  void* stream = nullptr;  ///< cudaStream_t / hipStream_t of the caller; ignored on the CPU
  Impl impl = Impl::automatic;
};

/// backward(): gradients of forward() with the same options and layout.
struct BackwardArgs {
  TensorView dout, q, k, v, out, lse;
  TensorView dq, dk, dv;  ///< written, same dtype and layout as q, k, v
  AttentionOptions options;
  SequenceLayout layout;
  void* stream = nullptr;
  Impl impl = Impl::automatic;
};

/// forward_kvcache(): append k_new/v_new into the cache (rotary optional), then attend over it.
struct KvCacheArgs {
  TensorView q;                             ///< (b, sq, hq, d)
  TensorView k_cache, v_cache;              ///< (b_cache, s_cache, hk, d) or paged (num_blocks, page, hk, d)
  TensorView out;                           ///< (b, sq, hq, dv)
  std::optional<TensorView> k_new, v_new;   ///< (b, s_new, hk, d|dv), written into the cache
  std::optional<TensorView> cache_seqlens;  ///< int32 (b,); absent: every sequence has s_cache
  std::optional<TensorView> cache_batch_idx;         ///< int32 (b,): cache row of each batch entry
  std::optional<TensorView> cache_leftpad;           ///< int32 (b,): first valid cache slot
  std::optional<TensorView> block_table;             ///< int32 (b, max_blocks_per_seq)
  std::optional<TensorView> rotary_cos, rotary_sin;  ///< (max_pos, rotary_dim / 2), q's dtype
  bool rotary_interleaved = true;                    ///< flash-attn's default: GPT-J pairs
  int num_splits = 0;                                ///< 0: heuristic; 1: no split-KV
  std::optional<TensorView> lse;                     ///< fp32 (b, hq, sq)
  AttentionOptions options;                          ///< dropout must be 0
  void* stream = nullptr;
  Impl impl = Impl::automatic;
};

/// merge_states(): combine two partial attentions over disjoint key sets by their LSE.
/// out = (exp(lse_a - m) * out_a + exp(lse_b - m) * out_b) / (exp(lse_a - m) + exp(lse_b - m)).
struct MergeArgs {
  TensorView out_a, lse_a;  ///< (b, s, h, d), fp32 (b, h, s)
  TensorView out_b, lse_b;
  TensorView out;                 ///< (b, s, h, d); may be out_a or out_b itself
  std::optional<TensorView> lse;  ///< fp32 (b, h, s); may alias lse_a or lse_b
  void* stream = nullptr;
};

void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);
void forward_kvcache(const KvCacheArgs& args);
void merge_states(const MergeArgs& args);

/// Checked mode (off by default; process-wide): index tensors in GPU memory (cu_seqlens_q/k, seqused_k,
/// block_table, cache_seqlens, cache_batch_idx, cache_leftpad) are copied to the host and validated
/// like host ones, so a bad value raises a named Error instead of being clamped by the kernels. Each
/// call with such tensors then synchronises with its stream (the copy waits for the work before it),
/// which is why it is opt-in: for debugging, and for tests of what a GPU call would accept.
void set_checked_mode(bool on);
bool checked_mode();

/// Device checks (on unless FLASHPORT_DEVICE_CHECKS=0): without checked mode, a call with index tensors
/// in GPU memory queues a small kernel that checks them on the device before the call's own kernels,
/// which clamp every index and so never read or write out of bounds. A fault it finds is recorded in
/// host memory, and the next call on that device raises it as the Error host-side validation would
/// raise for the same values (and does not run). check_device waits for the work queued on `device`
/// (it synchronises, so call it where a stall is acceptable: tests, the end of a step) and raises a
/// recorded fault. The record is per device: any thread's next call may be the one that raises it.
void check_device(Device device);

/// The library version, "MAJOR.MINOR.PATCH".
const char* version();

/// Backends usable on this machine, comma separated ("cpu", "cpu,cuda").
const char* available_backends();

}  // namespace flashport
