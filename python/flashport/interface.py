"""flash-attn 2.x's Python API (names, arguments, defaults, layouts and returns), on torch tensors (with
autograd and torch.compile support through custom ops) or on host numpy arrays (forward only).

Differences from flash-attn, all deliberate:
- return_attn_probs: S_dmask is fp32 (batch, nheads, seqlen_q, seqlen_k), computed by the CPU reference
  for dense CPU inputs whatever dropout_p is (flash-attn returns it only when dropout_p > 0). On GPU and
  for varlen inputs it is None.
- Extra keyword-only arguments: FA3-style q_descale / k_descale / v_descale (fp32 (batch, nheads_k)) for
  fp8 inputs (e4m3fn / e5m2; the output is then bf16 on torch, float32 on numpy); seqused_k for varlen.
- Dropout masks come from Philox keyed by a (seed, offset) pair drawn from torch's default CPU generator
  (numpy's global generator on the numpy path), so torch.manual_seed(...) makes them repeatable.
"""

from __future__ import annotations

import numpy as np

from . import _numpy_path
from ._common import INT32_MAX, check_head_dim, check_int, error

_torch_path = None


def _torch():
    """The torch path, imported on first use so `import flashport` needs numpy only."""
    global _torch_path
    if _torch_path is None:
        from . import _torch_path as module

        _torch_path = module
    return _torch_path


def _numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def _attention(q, k, v, **kw):
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_head_dim(x, name)
    if _numpy(q):
        kw.pop("deterministic", None)
        fp8_dtype = kw.pop("fp8_dtype", None)
        if fp8_dtype is not None:
            return _numpy_fp8(q, k, v, fp8_dtype, **kw)
        return _numpy_path.attention(q, k, v, **kw)
    return _torch().attention(q, k, v, **kw)


def _numpy_fp8(q, k, v, fp8_dtype, *, cu_seqlens_q=None, cu_seqlens_k=None, block_table=None, q_descale=None,
               k_descale=None, v_descale=None, **kw):
    if q_descale is not None or k_descale is not None or v_descale is not None:
        raise error("descale_q", f"{q.dtype} inputs are quantised here; pass descales only with fp8 inputs")
    hk = k.shape[-2]
    q8, qd = _numpy_path.quantize(q, hk, cu_seqlens_q, fp8_dtype)
    if block_table is not None:  # paged pool: one scale per kv head, shared by every sequence
        pool = lambda x: _numpy_path.quantize(x.reshape((1, -1) + x.shape[-2:]), hk, None, fp8_dtype)
        (k8, kd), (v8, vd) = pool(k), pool(v)
        k8, v8 = (k8[0].reshape(k.shape), k8[1]), (v8[0].reshape(v.shape), v8[1])
        kd, vd = (np.broadcast_to(s, (block_table.shape[0], hk)) for s in (kd, vd))
    else:
        k8, kd = _numpy_path.quantize(k, hk, cu_seqlens_k, fp8_dtype)
        v8, vd = _numpy_path.quantize(v, hk, cu_seqlens_k, fp8_dtype)
    return _numpy_path.attention(q8, k8, v8, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                 block_table=block_table, q_descale=qd, k_descale=kd, v_descale=vd,
                                 out_dtype=q.dtype, **kw)


def _unpack(packed, count: int, axis: int, name: str):
    if packed.ndim <= axis or packed.shape[axis] != count:
        raise error(name, f"expected size {count} at dimension {axis}, got shape {tuple(packed.shape)}")
    index = (slice(None),) * axis
    return [packed[index + (i,)] for i in range(count)]


# ---------------------------------------------------------------------------------------------
# Dense.


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, q_descale=None,
                    k_descale=None, v_descale=None):
    """Attention over q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim).

    nheads % nheads_k == 0 (GQA/MQA). causal is aligned to the bottom-right corner when seqlen_q !=
    seqlen_k; window_size=(left, right) keeps keys in [i + sk - sq - left, i + sk - sq + right] (-1:
    unbounded). softcap > 0: scores c * tanh(s / c). alibi_slopes fp32 (nheads,) or (batch, nheads).
    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse (batch, nheads, seqlen_q),
    S_dmask) with return_attn_probs.
    """
    if not _numpy(q):  # torch (anything else is refused there): positional, the hot call
        for x, name in ((q, "q"), (k, "k"), (v, "v")):
            check_head_dim(x, name)
        return _torch().attention(q, k, v, None, None, 0, 0, None, None, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic, return_attn_probs, q_descale,
                                  k_descale, v_descale)
    return _attention(q, k, v, dropout_p=dropout_p, softmax_scale_=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
                      return_attn_probs=return_attn_probs, q_descale=q_descale, k_descale=k_descale,
                      v_descale=v_descale)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = _unpack(kv, 2, 2, "kv")
    if _numpy(q):
        return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                               deterministic, return_attn_probs)
    return _torch_packed(kv, 2, q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                         alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim). On torch with autograd, the gradient
    is written as one packed dqkv (no stacking of dq, dk, dv), as flash-attn does."""
    q, k, v = _unpack(qkv, 3, 2, "qkv")
    if _numpy(qkv):
        return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                               deterministic, return_attn_probs)
    return _torch_packed(qkv, 2, q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                         alibi_slopes, deterministic, return_attn_probs)


def _torch_packed(packed, axis, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *rest):
    """The torch path of the packed functions: q, k, v are slices of `packed` (or k, v are), rest is
    flash_attn_func's arguments from dropout_p to return_attn_probs."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_head_dim(x, name)
    return _torch().attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None, *rest,
                              packed=(packed, axis))


# ---------------------------------------------------------------------------------------------
# Varlen (sequences concatenated along the token dimension) and paged K/V.


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, seqused_k=None,
                           q_descale=None, k_descale=None, v_descale=None):
    """Attention over q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim); sequence b owns
    rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 (int32 (batch + 1,)). With block_table (int32 (batch,
    max_blocks)) k/v are pages (num_blocks, page_block_size, nheads_k, headdim); any page size works.
    softmax_lse is (nheads, total_q).
    """
    if not _numpy(q):  # torch: positional, as in flash_attn_func
        for x, name in ((q, "q"), (k, "k"), (v, "v")):
            check_head_dim(x, name)
        return _torch().attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                  block_table, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs, q_descale, k_descale, v_descale)
    return _attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, seqused_k=seqused_k, block_table=block_table, dropout_p=dropout_p,
                      softmax_scale_=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                      alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs,
                      q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim)."""
    k, v = _unpack(kv, 2, 1, "kv")
    if not _numpy(q):
        return _torch_packed(kv, 1, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                             softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                             return_attn_probs)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim) and one cu_seqlens for q and k."""
    q, k, v = _unpack(qkv, 3, 1, "qkv")
    if not _numpy(qkv):
        return _torch_packed(qkv, 1, q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                             softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                             return_attn_probs)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


# ---------------------------------------------------------------------------------------------
# KV cache (inference; no backward, like flash-attn).


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            q_descale=None, k_descale=None, v_descale=None):
    """Write k/v (batch, seqlen_new, nheads_k, headdim) into k_cache/v_cache *in place* at positions
    cache_seqlens[b] .. (int or int32 (batch,)), rotating k (and q) by rotary_cos/sin (seqlen_ro,
    rotary_dim / 2) when given, then attend q over the updated cache. k_cache is (batch_cache,
    seqlen_cache, nheads_k, headdim), or pages (num_blocks, page_block_size, nheads_k, headdim) with
    block_table. cache_batch_idx picks cache rows; cache_leftpad makes sequence b start at that slot.
    Returns out, or (out, softmax_lse) with return_softmax_lse.
    """
    for x, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (k, "k"), (v, "v")):
        check_head_dim(x, name)
    # int32 in C++: checked here so both paths name the argument (the torch path would overflow filling an
    # int32 tensor, the binding would refuse a bigger int without saying which).
    if cache_seqlens is not None and getattr(cache_seqlens, "ndim", 0) == 0:  # an int (or 0-d) for every row
        cache_seqlens = check_int(cache_seqlens, "cache_seqlens", 0, INT32_MAX)
    num_splits = check_int(num_splits, "num_splits", 0, INT32_MAX)
    fn = _numpy_path.kvcache if _numpy(q) else _torch().kvcache
    return fn(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
              block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
              return_softmax_lse, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


# ---------------------------------------------------------------------------------------------
# FP8 with dynamic quantisation (the AMD fork's entry points).


def _fp8_dtype(q):
    if _numpy(q):
        return "float8_e4m3fn"
    return _torch().default_fp8_dtype()


def _is_fp8_input(q) -> bool:
    name = q.dtype.name if _numpy(q) else str(q.dtype)
    return "float8" in name


def flash_attn_fp8_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, deterministic=False, return_attn_probs=False, descale_q=None,
                        descale_k=None, descale_v=None, descale_do=None):
    """flash_attn_func computed in fp8: fp16/bf16/fp32 q, k, v are quantised to e4m3 with one scale per
    (batch, kv head) from its amax, attention runs on the fp8 data with those descales, and the output
    comes back in the input dtype. Gradients flow through the dequantised values. Already-fp8 inputs
    take descale_q/k/v (fp32 (batch, nheads_k)) and return bf16 (float32 on numpy), without autograd.
    descale_do is accepted for compatibility and unused (the backward runs in the input precision).
    """
    if _is_fp8_input(q):
        return _attention(q, k, v, dropout_p=dropout_p, softmax_scale_=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                          deterministic=deterministic, return_attn_probs=return_attn_probs, q_descale=descale_q,
                          k_descale=descale_k, v_descale=descale_v)
    return _attention(q, k, v, dropout_p=dropout_p, softmax_scale_=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
                      return_attn_probs=return_attn_probs, q_descale=descale_q, k_descale=descale_k,
                      v_descale=descale_v, fp8_dtype=_fp8_dtype(q))


def flash_attn_qkvpacked_fp8_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                  softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_fp8_func with qkv (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = _unpack(qkv, 3, 2, "qkv")
    return flash_attn_fp8_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                               deterministic, return_attn_probs)


def flash_attn_varlen_fp8_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn_varlen_func computed in fp8 (scales per (sequence, kv head); one per kv head for a
    paged block_table pool); output in the input dtype."""
    return _attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, block_table=block_table, dropout_p=dropout_p,
                      softmax_scale_=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                      alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs,
                      fp8_dtype=_fp8_dtype(q))


def flash_attn_varlen_qkvpacked_fp8_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                         causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                         deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_fp8_func with qkv (total, 3, nheads, headdim)."""
    q, k, v = _unpack(qkv, 3, 1, "qkv")
    return flash_attn_varlen_fp8_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                      return_attn_probs)


# ---------------------------------------------------------------------------------------------
# Extras.


def merge_states(out_a, lse_a, out_b, lse_b):
    """Combine two partial attentions of the same queries over disjoint key sets: out_* (batch, seqlen,
    nheads, headdim), lse_* fp32 (batch, nheads, seqlen). Returns (out, lse). Rows where both LSEs are
    -inf give 0 and -inf. No autograd."""
    if _numpy(out_a):
        return _numpy_path.merge_states(out_a, lse_a, out_b, lse_b)
    return _torch().merge_states(out_a, lse_a, out_b, lse_b)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's layout, (batch, nheads, seqlen, headdim).

    attn_mask must be None. is_causal is top-left aligned like torch's (key j visible to query i iff
    j <= i); that needs seqlen_q >= seqlen_k here (for bottom-right alignment use flash_attn_func).
    Key/value heads fewer than query heads need enable_gqa=True, like torch.
    """
    if attn_mask is not None:
        raise error("attn_mask", "is not supported; use causal/window masks through flash_attn_func")
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        if x.ndim != 4:
            raise error(name, f"expected (batch, nheads, seqlen, headdim), got shape {tuple(x.shape)}")
    sq, sk = query.shape[2], key.shape[2]
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise error("key", f"has {key.shape[1]} heads but query has {query.shape[1]}; pass enable_gqa=True for GQA")
    window = (-1, -1)
    if is_causal:
        if sq < sk:
            raise error("is_causal", f"top-left causal alignment needs seqlen_q >= seqlen_k, got {sq} < {sk}; "
                                     "use flash_attn_func(causal=True) for bottom-right alignment")
        window = (-1, sq - sk)  # bottom-right diagonal shifted up by sq - sk = torch's top-left diagonal
    swap = (lambda x: x.swapaxes(1, 2)) if _numpy(query) else (lambda x: x.transpose(1, 2))
    out = flash_attn_func(swap(query), swap(key), swap(value), dropout_p=dropout_p, softmax_scale=scale,
                          window_size=window)
    return swap(out)
