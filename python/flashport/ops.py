"""Low-level entry points: flashport's C++ API with caller-allocated outputs, for any DLPack tensors
(torch, numpy, cupy, jax, ...) zero-copy. Nothing is allocated, padded or checked here beyond what the
C++ core validates. Arguments may be passed by position in the order below or by keyword. Plain torch
tensors (once flashport's torch path is imported) are read from their attributes rather than through
DLPack, so they need not be detached.

- forward(q, k, v, out, lse, s_dmask, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
  max_seqlen_k, block_table, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
  dropout_p, seed, offset, q_descale, k_descale, v_descale, stream, impl)
- backward(dout, q, k, v, out, lse, dq, dk, dv, ...same layout and options..., deterministic, stream, impl)
- forward_kvcache(q, k_cache, v_cache, out, lse, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
  block_table, rotary_cos, rotary_sin, rotary_interleaved, num_splits, ..., stream, impl)
- merge_states(out_a, lse_a, out_b, lse_b, out, lse, stream)
- cast(src, dst): host-side dtype conversion with the library's rounding (numpy has no bf16/fp8).
- inspect(tensor): (dtype, shape, strides, (device, index), pointer) as flashport sees a tensor.

`stream` is the raw cudaStream_t handle as an int: 0 is the legacy default stream (torch's default
stream reports 0). With producers other than torch, export on that stream: the DLPack stream
convention names the legacy default stream 1, so call x.__dlpack__(stream=dlpack_stream(handle)) and
pass the capsule. `impl` is "automatic", "reference" (fp64 oracle, CPU), "baseline" (same-precision
naive, CPU) or "fast". A tensor argument may be a (tensor, dtype name) pair to read 1-byte storage as
fp8 ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2").
"""

from ._C import backward, cast, forward, forward_kvcache, inspect, merge_states  # noqa: F401


def dlpack_stream(handle: int) -> int:
    """The DLPack __dlpack__(stream=...) value for a raw cudaStream_t handle: the legacy default stream
    (handle 0) is 1 there, because DLPack reserves 0 as ambiguous."""
    return 1 if handle == 0 else handle
