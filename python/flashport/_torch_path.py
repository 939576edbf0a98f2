"""The torch path of flash-attn's functions: argument checks, head-dim padding, dropout RNG state, and
calls into the flashport custom ops (autograd and torch.compile come from those ops)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _torch_fp8, _torch_ops
from ._common import check_float, check_int, check_ndim, error, padded, softmax_scale, window

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(x, name: str, optional: bool = False):
    if x is None and optional:
        return
    if type(x) is torch.Tensor and (x.is_cuda or x.is_cpu):
        return
    if not isinstance(x, torch.Tensor):
        raise error(name, f"expected a torch.Tensor (like q), got {type(x).__name__}")
    _torch_ops.check_device(x, name)


def _pad_head(x):
    """Zero-pad the head dim to a multiple of 8 like flash-attn (autograd slices the padding off)."""
    d = x.shape[-1]
    if d % 8 == 0:
        return x
    return F.pad(x, (0, padded(d) - d))


def draw_rng_state(dropout_p: float):
    """flash-attn's rng_state: a (seed, offset) int64 pair drawn from torch's default generator (so
    torch.manual_seed makes dropout repeatable), kept on the host and saved for backward, which
    regenerates the same Philox mask from it."""
    if dropout_p <= 0.0:
        return None
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64)


def attention(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, seqused_k=None,
              block_table=None, dropout_p=0.0, softmax_scale_=None, causal=False, window_size=(-1, -1),
              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, q_descale=None,
              k_descale=None, v_descale=None, fp8_dtype=None, packed=None):
    """Every dense / varlen / paged forward. `fp8_dtype` set: dynamic fp8 quantisation of q, k, v.
    `packed` (tensor, axis): q, k, v (or k, v) are its slices along axis, and their gradients are
    written into one packed gradient where the call allows (_torch_ops.call_out_packed); views q, k, v
    that tile one tensor are found without it (_torch_ops.packed_base).
    flash_attn_func and flash_attn_varlen_func pass their arguments positionally (keyword passing of
    some twenty arguments through two calls cost about a microsecond)."""
    varlen = cu_seqlens_q is not None
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_tensor(x, name)
    if (cu_seqlens_q is not None or cu_seqlens_k is not None or seqused_k is not None or block_table is not None
            or alibi_slopes is not None or q_descale is not None or k_descale is not None or v_descale is not None):
        for x, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k"), (seqused_k, "seqused_k"),
                        (block_table, "block_table"), (alibi_slopes, "alibi_slopes"), (q_descale, "q_descale"),
                        (k_descale, "k_descale"), (v_descale, "v_descale")):
            check_tensor(x, name, optional=True)
    check_ndim(q, 3 if varlen else 4, "q", "(total_q, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)")
    if varlen and cu_seqlens_k is None and block_table is None:
        raise error("cu_seqlens_k", "is required with cu_seqlens_q")
    d, dv = q.shape[-1], v.shape[-1]
    scale = softmax_scale(softmax_scale_, d)
    wl, wr = window(window_size, causal)
    dropout_p = check_float(dropout_p, "dropout_p", 0.0, 1.0, hi_open=True)
    softcap = check_float(softcap, "softcap", 0.0)
    max_seqlen_q, max_seqlen_k = check_int(max_seqlen_q, "max_seqlen_q", 0), check_int(max_seqlen_k, "max_seqlen_k", 0)
    pad = d % 8 or dv % 8 or k.shape[-1] % 8
    if pad:
        q, k, v = _pad_head(q), _pad_head(k), _pad_head(v)
    rng_state = draw_rng_state(dropout_p)
    return_softmax = bool(return_attn_probs) and q.device.type == "cpu" and not varlen
    if fp8_dtype is not None:
        if q_descale is not None or k_descale is not None or v_descale is not None:
            raise error("descale_q", f"{q.dtype} inputs are quantised here; pass descales only with fp8 inputs")
        out, lse, s_dmask = _torch_fp8.fwd_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, alibi_slopes,
                                               rng_state, max_seqlen_q, max_seqlen_k, scale, bool(causal), wl, wr,
                                               softcap, dropout_p, bool(deterministic), return_softmax, fp8_dtype)
    elif return_attn_probs:
        out, lse, s_dmask = _torch_ops.call_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                                alibi_slopes, q_descale, k_descale, v_descale, rng_state,
                                                max_seqlen_q, max_seqlen_k, scale, bool(causal), wl, wr, softcap,
                                                dropout_p, bool(deterministic), return_softmax, None)
    elif not pad and (packed is not None or (q._base is not None and q._base is k._base)):  # padded: copies
        packed = packed or (None, None)  # q, k, v maybe views of one fused projection (packed_base)
        return _torch_ops.call_out_packed(packed[0], packed[1], q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                          block_table, alibi_slopes, q_descale, k_descale, v_descale, rng_state,
                                          max_seqlen_q, max_seqlen_k, scale, bool(causal), wl, wr, softcap,
                                          dropout_p, bool(deterministic), False, None)
    else:  # out alone: no non-differentiable outputs, no S_dmask placeholder
        out = _torch_ops.call_out(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                                  q_descale, k_descale, v_descale, rng_state, max_seqlen_q, max_seqlen_k, scale,
                                  bool(causal), wl, wr, softcap, dropout_p, bool(deterministic), False, None)
        return out[..., :dv] if pad and out.shape[-1] != dv else out
    if out.shape[-1] != dv:
        out = out[..., :dv]
    if return_attn_probs:
        return out, lse, (s_dmask if return_softmax else None)
    return out


def kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale_=None, causal=False,
            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
            return_softmax_lse=False, q_descale=None, k_descale=None, v_descale=None):
    for x, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        check_tensor(x, name)
    for x, name in ((k, "k"), (v, "v"), (rotary_cos, "rotary_cos"), (rotary_sin, "rotary_sin"),
                    (cache_batch_idx, "cache_batch_idx"), (cache_leftpad, "cache_leftpad"), (block_table, "block_table"),
                    (alibi_slopes, "alibi_slopes"), (q_descale, "q_descale"), (k_descale, "k_descale"),
                    (v_descale, "v_descale")):
        check_tensor(x, name, optional=True)
    check_ndim(q, 4, "q", "(batch, seqlen, nheads, headdim)")
    for c, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        check_ndim(c, 4, name, "(batch_cache, seqlen_cache, nheads_k, headdim) or (num_blocks, page_block_size, nheads_k, headdim)")
        if c.shape[-1] > 1 and c.stride(-1) != 1:
            raise error(name, "must have contiguous last dimension")
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full((q.shape[0],), check_int(cache_seqlens, "cache_seqlens", 0), dtype=torch.int32,
                                   device=k_cache.device)
    scale = softmax_scale(softmax_scale_, q.shape[-1])
    wl, wr = window(window_size, causal)
    out, lse = _torch_ops.call_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                      cache_leftpad, block_table, alibi_slopes, q_descale, k_descale, v_descale, scale,
                                      bool(causal), wl, wr, check_float(softcap, "softcap", 0.0),
                                      bool(rotary_interleaved), check_int(num_splits, "num_splits", 0))
    return (out, lse) if return_softmax_lse else out


def merge_states(out_a, lse_a, out_b, lse_b):
    for x, name in ((out_a, "out_a"), (lse_a, "lse_a"), (out_b, "out_b"), (lse_b, "lse_b")):
        check_tensor(x, name)
    check_ndim(out_a, 4, "out_a", "(batch, seqlen, nheads, headdim)")
    return _torch_ops.call_merge(out_a, lse_a, out_b, lse_b)


def default_fp8_dtype():
    """e4m3fn on NVIDIA; ROCm builds of torch (AMD gfx94x) use e4m3fnuz, like the AMD fork."""
    return torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
