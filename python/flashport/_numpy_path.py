"""The numpy path: flash-attn's functions on host numpy arrays (no autograd), outputs allocated here.

numpy has no bfloat16 or fp8 types: inputs are float16/float32/float64; fp8 data travels as uint8
storage tagged with its format (ml_dtypes float8 arrays are recognised and tagged automatically).
"""

from __future__ import annotations

import numpy as np

from . import _C
from ._common import FP8_MAX, check_float, check_int, check_ndim, error, fp8_descale, fp8_groups, padded, softmax_scale, split_rng_state
from ._common import window as parse_window

_FLOAT_KINDS = ("float16", "float32", "float64")


def as_array(x, name: str):
    """A numpy argument as _C receives it: the array itself, or (uint8 view, fp8 name) for fp8 data."""
    if x is None:
        return None
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], np.ndarray):
        return x  # already tagged (array, dtype name)
    if not isinstance(x, np.ndarray):
        raise error(name, f"expected a numpy.ndarray (like q), got {type(x).__name__}")
    if x.dtype.name in FP8_MAX:
        return (x.view(np.uint8), x.dtype.name)
    return x


def _data(x):
    return x[0] if isinstance(x, tuple) else x


def _dtype_name(x) -> str:
    return x[1] if isinstance(x, tuple) else x.dtype.name


def _retag(x, data):
    return (data, x[1]) if isinstance(x, tuple) else data


def last_contiguous(x):
    """flash-attn's maybe_contiguous: copy only when the last dimension is strided (None passes)."""
    data = _data(x)
    if data is not None and data.ndim and data.shape[-1] > 1 and data.strides[-1] != data.itemsize:
        return _retag(x, np.ascontiguousarray(data))
    return x


def pad_head(x, target: int):
    """Zero-pad the last dimension to `target` (0x00 is +0 in every fp8 format too)."""
    data = _data(x)
    if data.shape[-1] == target:
        return x
    widths = [(0, 0)] * (data.ndim - 1) + [(0, target - data.shape[-1])]
    return _retag(x, np.pad(data, widths))


def draw_rng(dropout_p: float) -> tuple[int, int]:
    """Seed and Philox offset from numpy's global generator (np.random.seed makes runs repeatable)."""
    if dropout_p <= 0.0:
        return 0, 0
    seed, offset = np.random.randint(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=2, dtype=np.int64)
    return split_rng_state(seed, offset)


def attention(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
              seqused_k=None, block_table=None, dropout_p=0.0, softmax_scale_=None, causal=False,
              window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_attn_probs=False,
              q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """Forward of every dense / varlen / paged flash-attn entry point on numpy arrays."""
    varlen = cu_seqlens_q is not None
    q, k, v = (last_contiguous(as_array(t, n)) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    check_ndim(_data(q), 3 if varlen else 4, "q", "(total_q, nheads, headdim)" if varlen else
               "(batch, seqlen, nheads, headdim)")
    d, dv = _data(q).shape[-1], _data(v).shape[-1]
    scale = softmax_scale(softmax_scale_, d)
    wl, wr = parse_window(window_size, causal)
    dropout_p = check_float(dropout_p, "dropout_p", 0.0, 1.0, hi_open=True)
    q, k = pad_head(q, padded(d)), pad_head(k, padded(_data(k).shape[-1]))
    v = pad_head(v, padded(dv))
    fp8 = _dtype_name(q) in FP8_MAX
    out_dtype = np.dtype(out_dtype) if out_dtype is not None else (np.float32 if fp8 else _data(q).dtype)
    qd = _data(q)
    out = np.empty(qd.shape[:-1] + (_data(v).shape[-1],), dtype=out_dtype)
    lse = np.empty((qd.shape[1], qd.shape[0]) if varlen else (qd.shape[0], qd.shape[2], qd.shape[1]), np.float32)
    s_dmask = None
    if return_attn_probs and not varlen:
        sk = _data(k).shape[1] * (block_table.shape[1] if block_table is not None else 1)
        s_dmask = np.empty((qd.shape[0], qd.shape[2], qd.shape[1], sk), np.float32)
    seed, offset = draw_rng(dropout_p)
    _C.forward(q, k, v, out, lse=lse, s_dmask=s_dmask, cu_seqlens_q=as_array(cu_seqlens_q, "cu_seqlens_q"),
               cu_seqlens_k=as_array(cu_seqlens_k, "cu_seqlens_k"), seqused_k=as_array(seqused_k, "seqused_k"),
               max_seqlen_q=check_int(max_seqlen_q, "max_seqlen_q", 0),
               max_seqlen_k=check_int(max_seqlen_k, "max_seqlen_k", 0),
               block_table=as_array(block_table, "block_table"), softmax_scale=scale, causal=bool(causal),
               window_left=wl, window_right=wr, softcap=check_float(softcap, "softcap", 0.0),
               alibi_slopes=as_array(alibi_slopes, "alibi_slopes"), dropout_p=dropout_p, seed=seed, offset=offset,
               q_descale=as_array(q_descale, "q_descale"), k_descale=as_array(k_descale, "k_descale"),
               v_descale=as_array(v_descale, "v_descale"))
    out = out[..., :dv]
    return (out, lse, s_dmask) if return_attn_probs else out


def _index_array(x, name: str, batch: int):
    if x is None:
        return None
    if isinstance(x, (int, np.integer)):
        return np.full((batch,), int(x), dtype=np.int32)
    return as_array(x, name)


def kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale_=None, causal=False,
            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
            return_softmax_lse=False, q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_with_kvcache on numpy arrays: k/v are written into k_cache/v_cache in place."""
    q = last_contiguous(as_array(q, "q"))
    caches = [as_array(k_cache, "k_cache"), as_array(v_cache, "v_cache")]
    check_ndim(_data(q), 4, "q", "(batch, seqlen, nheads, headdim)")
    for c, n in zip(caches, ("k_cache", "v_cache")):
        check_ndim(_data(c), 4, n, "(batch_cache, seqlen_cache, nheads_k, headdim) or paged (num_blocks, page, nheads_k, headdim)")
        if _data(c).strides[-1] != _data(c).itemsize and _data(c).shape[-1] > 1:
            raise error(n, "must have a contiguous last dimension (it is updated in place)")
    new = [last_contiguous(as_array(t, n)) for t, n in ((k, "k"), (v, "v"))]
    d, dv = _data(q).shape[-1], _data(caches[1]).shape[-1]
    scale = softmax_scale(softmax_scale_, d)
    wl, wr = parse_window(window_size, causal)
    # Pad like flash-attn: the padded caches are copies, written back after the call.
    work = [pad_head(c, padded(_data(c).shape[-1])) for c in caches]
    q = pad_head(q, padded(d))
    new = [None if t is None else pad_head(t, padded(_data(t).shape[-1])) for t in new]
    batch = _data(q).shape[0]
    fp8 = _dtype_name(q) in FP8_MAX
    qd = _data(q)
    out = np.empty(qd.shape[:-1] + (_data(work[1]).shape[-1],), np.float32 if fp8 else qd.dtype)
    lse = np.empty((qd.shape[0], qd.shape[2], qd.shape[1]), np.float32)
    _C.forward_kvcache(q, work[0], work[1], out, lse=lse, k=new[0], v=new[1],
                       cache_seqlens=_index_array(cache_seqlens, "cache_seqlens", batch),
                       cache_batch_idx=as_array(cache_batch_idx, "cache_batch_idx"),
                       cache_leftpad=as_array(cache_leftpad, "cache_leftpad"),
                       block_table=as_array(block_table, "block_table"),
                       rotary_cos=as_array(rotary_cos, "rotary_cos"), rotary_sin=as_array(rotary_sin, "rotary_sin"),
                       rotary_interleaved=bool(rotary_interleaved), num_splits=check_int(num_splits, "num_splits", 0),
                       softmax_scale=scale, causal=bool(causal), window_left=wl, window_right=wr,
                       softcap=check_float(softcap, "softcap", 0.0), alibi_slopes=as_array(alibi_slopes, "alibi_slopes"),
                       q_descale=as_array(q_descale, "q_descale"), k_descale=as_array(k_descale, "k_descale"),
                       v_descale=as_array(v_descale, "v_descale"))
    if new[0] is not None:
        for c, w in zip(caches, work):
            if w is not c:
                _data(c)[...] = _data(w)[..., : _data(c).shape[-1]]
    out = out[..., :dv]
    return (out, lse) if return_softmax_lse else out


def merge_states(out_a, lse_a, out_b, lse_b):
    """(out, lse) of two partial attentions over disjoint keys; numpy arrays."""
    arrays = [as_array(t, n) for t, n in ((out_a, "out_a"), (lse_a, "lse_a"), (out_b, "out_b"), (lse_b, "lse_b"))]
    check_ndim(_data(arrays[0]), 4, "out_a", "(batch, seqlen, nheads, headdim)")
    out = np.empty(_data(arrays[0]).shape, _data(arrays[0]).dtype)
    lse = np.empty(_data(arrays[1]).shape, np.float32)
    _C.merge_states(*arrays, out, lse=lse)
    return out, lse


# ---------------------------------------------------------------------------------------------
# Dynamic fp8 quantisation (per (batch, kv head) amax), the AMD fork's *_fp8_func on numpy.


def quantize(x, nheads_k: int, cu_seqlens=None, fp8: str = "float8_e4m3fn"):
    """(fp8 data tagged for _C, fp32 descale (batch, nheads_k)) with x ~= data * descale."""
    x = np.asarray(x)
    if x.dtype.name not in _FLOAT_KINDS:
        raise error("q", f"fp8 quantisation takes float16/float32/float64 inputs, got {x.dtype}")
    xf = x.astype(np.float32)
    grouped_shape, axes = fp8_groups(xf.shape, nheads_k, cu_seqlens is not None)
    grouped = xf.reshape(grouped_shape)
    if cu_seqlens is None:
        amax = np.abs(grouped).max(axis=axes, initial=0.0)
    else:
        cu = np.asarray(cu_seqlens).astype(np.int64)
        token_seq = np.searchsorted(cu[1:], np.arange(xf.shape[0]), side="right")
        amax = np.zeros((cu.shape[0] - 1, nheads_k), np.float32)
        np.maximum.at(amax, token_seq, np.abs(grouped).max(axis=axes, initial=0.0))
    descale = fp8_descale(amax, fp8, np.where, np.full_like).astype(np.float32)
    if cu_seqlens is None:
        scaled = grouped / descale[:, None, :, None, None]
    else:
        scaled = grouped / descale[token_seq][:, :, None, None]
    data = np.empty(x.shape, np.uint8)
    _C.cast(np.ascontiguousarray(scaled.reshape(x.shape), dtype=np.float32), (data, fp8))
    return (data, fp8), descale
