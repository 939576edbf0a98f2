"""torch.library custom ops over flashport._C (flashport::fwd, bwd, fwd_kvcache, merge_states, fwd_fp8).

Each op has a fake (meta) implementation, so torch.compile(fullgraph=True) traces through it, and fwd /
fwd_fp8 have autograd formulas that call flashport's backward. Outputs are allocated here with torch and
handed to C++ zero-copy over DLPack; CUDA work runs on torch's current stream of the tensors' device.
"""

import contextlib
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._common import FP8_MAX, error, padded, split_rng_state

_FP8_DTYPES = {getattr(torch, name): name for name in FP8_MAX if hasattr(torch, name)}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in _FP8_DTYPES


def check_device(x: Optional[Tensor], name: str) -> None:
    """Clear error for tensors flashport cannot reach (mps, xpu, meta outside tracing, ...)."""
    if x is not None and x.device.type not in ("cpu", "cuda"):
        raise error(name, f"is on device '{x.device}', which flashport does not support (cpu and cuda are)")


def _stream_and_guard(x: Tensor):
    """(raw cudaStream_t of torch's current stream, device guard). torch's default stream reports 0,
    the legacy default stream's null handle, which is what the C++ API takes."""
    if x.device.type == "cuda":
        return torch.cuda.current_stream(x.device).cuda_stream, torch.cuda.device(x.device)
    return 0, contextlib.nullcontext()


def _contig(x: Optional[Tensor]) -> Optional[Tensor]:
    if x is None:
        return None
    return x.contiguous() if x.dim() and x.size(-1) > 1 and x.stride(-1) != 1 else x


def _d(x: Optional[Tensor]) -> Optional[Tensor]:
    """Detached view: DLPack refuses to export tensors that require grad (autograd is handled above)."""
    return None if x is None else x.detach()


def _rng(rng_state: Optional[Tensor]) -> Tuple[int, int]:
    if rng_state is None:
        return 0, 0
    seed, offset = rng_state.tolist()  # a host tensor: no device sync
    return split_rng_state(seed, offset)


def _lse_shape(q: Tensor, varlen: bool):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _out_dtype(q: Tensor, out_dtype: Optional[torch.dtype]) -> torch.dtype:
    if out_dtype is not None:
        return out_dtype
    return torch.bfloat16 if is_fp8(q.dtype) else q.dtype


def _s_dmask_shape(q, k, block_table, varlen, return_softmax):
    """fp32 (b, hq, sq, sk) probabilities from the CPU reference, else an empty placeholder."""
    if not return_softmax or varlen or q.device.type != "cpu":
        return (0,)
    sk = k.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    return (q.shape[0], q.shape[2], q.shape[1], sk)


# ---------------------------------------------------------------------------------------------
# Forward / backward.


@torch.library.custom_op("flashport::fwd", mutates_args=())
def fwd(
    q: Tensor, k: Tensor, v: Tensor,
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
    block_table: Optional[Tensor], alibi_slopes: Optional[Tensor],
    q_descale: Optional[Tensor], k_descale: Optional[Tensor], v_descale: Optional[Tensor],
    rng_state: Optional[Tensor],
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
    window_left: int, window_right: int, softcap: float, dropout_p: float,
    deterministic: bool, return_softmax: bool, out_dtype: Optional[torch.dtype],
) -> Tuple[Tensor, Tensor, Tensor]:
    """(out, softmax_lse, S_dmask); rng_state is a host int64 (seed, offset) pair (None: no dropout)."""
    varlen = cu_seqlens_q is not None
    q, k, v = _contig(q), _contig(k), _contig(v)
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=_out_dtype(q, out_dtype), device=q.device)
    lse = torch.empty(_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    s_shape = _s_dmask_shape(q, k, block_table, varlen, return_softmax)
    s_dmask = torch.empty(s_shape, dtype=torch.float32, device=q.device)
    seed, offset = _rng(rng_state)
    stream, guard = _stream_and_guard(q)
    with guard:
        _C.forward(_d(q), _d(k), _d(v), out, lse=lse, s_dmask=s_dmask if len(s_shape) == 4 else None,
                   cu_seqlens_q=_d(cu_seqlens_q), cu_seqlens_k=_d(cu_seqlens_k), seqused_k=_d(seqused_k),
                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, block_table=_d(block_table),
                   softmax_scale=softmax_scale, causal=causal, window_left=window_left, window_right=window_right,
                   softcap=softcap, alibi_slopes=_d(alibi_slopes), dropout_p=dropout_p, seed=seed, offset=offset,
                   q_descale=_d(q_descale), k_descale=_d(k_descale), v_descale=_d(v_descale), stream=stream)
    return out, lse, s_dmask


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, q_descale, k_descale,
              v_descale, rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
              softcap, dropout_p, deterministic, return_softmax, out_dtype):
    varlen = cu_seqlens_q is not None
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],), dtype=_out_dtype(q, out_dtype))
    lse = q.new_empty(_lse_shape(q, varlen), dtype=torch.float32)
    s_dmask = q.new_empty(_s_dmask_shape(q, k, block_table, varlen, return_softmax), dtype=torch.float32)
    return out, lse, s_dmask


@torch.library.custom_op("flashport::bwd", mutates_args=())
def bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
    block_table: Optional[Tensor], alibi_slopes: Optional[Tensor], rng_state: Optional[Tensor],
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
    window_left: int, window_right: int, softcap: float, dropout_p: float, deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) in the dtypes of q, k, v."""
    dout, q, k, v, out = (_contig(t) for t in (dout, q, k, v, out))
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    seed, offset = _rng(rng_state)
    stream, guard = _stream_and_guard(q)
    with guard:
        _C.backward(_d(dout), _d(q), _d(k), _d(v), _d(out), _d(softmax_lse), dq, dk, dv,
                    cu_seqlens_q=_d(cu_seqlens_q), cu_seqlens_k=_d(cu_seqlens_k), seqused_k=_d(seqused_k),
                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, block_table=_d(block_table),
                    softmax_scale=softmax_scale, causal=causal, window_left=window_left, window_right=window_right,
                    softcap=softcap, alibi_slopes=_d(alibi_slopes), dropout_p=dropout_p, seed=seed, offset=offset,
                    deterministic=deterministic, stream=stream)
    return dq, dk, dv


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, softmax_lse, *args):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, seqused_k, block_table, alibi, q_descale, _, _, rng_state, max_q, max_k, scale, causal,
     wl, wr, softcap, dropout_p, deterministic, _, _) = inputs
    out, lse, _ = output
    ctx.fp8 = q_descale is not None or is_fp8(q.dtype)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, block_table, alibi, rng_state)
    ctx.params = (max_q, max_k, scale, causal, wl, wr, softcap, dropout_p, deterministic)


def _fwd_backward(ctx, dout, dlse, ds_dmask):
    if ctx.fp8:
        raise error("q", "fp8 inputs have no backward here; use the *_fp8_func entry points, which quantise "
                         "high-precision inputs and differentiate through the dequantised values")
    q, k, v, out, lse, cu_q, cu_k, seqused_k, block_table, alibi, rng_state = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_q, cu_k, seqused_k, block_table, alibi, rng_state, *ctx.params)
    return (dq, dk, dv) + (None,) * 20


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ---------------------------------------------------------------------------------------------
# KV cache and merge (no autograd, like flash-attn).


@torch.library.custom_op("flashport::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
    rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
    cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor], q_descale: Optional[Tensor], k_descale: Optional[Tensor],
    v_descale: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int, window_right: int,
    softcap: float, rotary_interleaved: bool, num_splits: int,
) -> Tuple[Tensor, Tensor]:
    """(out, softmax_lse) after appending k/v into the caches in place. Head dims that are not a
    multiple of 8 are zero-padded like flash-attn: the padded caches are copies, written back after."""
    q, k, v = _contig(q), _contig(k), _contig(v)
    d, dv = q.shape[-1], v_cache.shape[-1]
    pad = lambda t: t if t is None or t.shape[-1] % 8 == 0 else torch.nn.functional.pad(t, (0, padded(t.shape[-1]) - t.shape[-1]))
    q_w, k_w, v_w, kc_w, vc_w = pad(q), pad(k), pad(v), pad(k_cache), pad(v_cache)
    out = torch.empty(q.shape[:-1] + (vc_w.shape[-1],), dtype=_out_dtype(q, None), device=q.device)
    lse = torch.empty(_lse_shape(q, False), dtype=torch.float32, device=q.device)
    stream, guard = _stream_and_guard(q)
    with guard:
        _C.forward_kvcache(_d(q_w), _d(kc_w), _d(vc_w), out, lse=lse, k=_d(k_w), v=_d(v_w),
                           cache_seqlens=_d(cache_seqlens), cache_batch_idx=_d(cache_batch_idx),
                           cache_leftpad=_d(cache_leftpad), block_table=_d(block_table), rotary_cos=_d(rotary_cos),
                           rotary_sin=_d(rotary_sin), rotary_interleaved=rotary_interleaved, num_splits=num_splits,
                           softmax_scale=softmax_scale, causal=causal, window_left=window_left,
                           window_right=window_right, softcap=softcap, alibi_slopes=_d(alibi_slopes),
                           q_descale=_d(q_descale), k_descale=_d(k_descale), v_descale=_d(v_descale), stream=stream)
        if k is not None and kc_w is not k_cache:
            k_cache.copy_(kc_w[..., : k_cache.shape[-1]])
        if v is not None and vc_w is not v_cache:
            v_cache.copy_(vc_w[..., : v_cache.shape[-1]])
    return (out[..., :dv].contiguous() if out.shape[-1] != dv else out), lse


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, *args):
    out = q.new_empty(q.shape[:-1] + (v_cache.shape[-1],), dtype=_out_dtype(q, None))
    return out, q.new_empty(_lse_shape(q, False), dtype=torch.float32)


@torch.library.custom_op("flashport::merge_states", mutates_args=())
def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """(out, lse) of two partial attentions over disjoint key sets, merged by their log-sum-exp."""
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device)
    stream, guard = _stream_and_guard(out_a)
    with guard:
        _C.merge_states(_d(_contig(out_a)), _d(lse_a), _d(_contig(out_b)), _d(lse_b), out,
                        lse=lse, stream=stream)
    return out, lse


@merge_states.register_fake
def _merge_states_fake(out_a, lse_a, out_b, lse_b):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)
