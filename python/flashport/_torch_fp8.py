"""Dynamic fp8 attention for torch (the AMD fork's *_fp8_func): the op flashport::fwd_fp8 quantises
high-precision q/k/v per (batch, kv head) amax, attends in fp8 with descales, and returns the output in
the input dtype. Backward differentiates through the dequantised values (straight-through for the
rounding) with flashport's backward in the input dtype.
"""


from typing import Optional, Tuple

import torch
from torch import Tensor

from ._common import error, fp8_descale, fp8_groups
from ._torch_ops import _fwd_fake, _tracing, bwd, run_bwd, run_fwd


def quantize(x: Tensor, nheads_k: int, cu_seqlens: Optional[Tensor], fp8_dtype: torch.dtype,
             shared_batch: int = 0) -> Tuple[Tensor, Tensor]:
    """(x in fp8, fp32 descale (batch, nheads_k)) with x ~= fp8 * descale, one scale per (sequence, kv head).

    Dense x is (b, s, h, d); varlen x is (total, h, d) split by cu_seqlens; `shared_batch` > 0 treats x
    (paged blocks) as one pool whose per-head scales every one of the `shared_batch` sequences shares.
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise error("q", f"fp8 quantisation takes float16/bfloat16/float32 inputs, got {x.dtype}")
    fp8_name = str(fp8_dtype).removeprefix("torch.")
    xf = x.float()
    if cu_seqlens is None:
        # Paged blocks (shared_batch) are one pool: a batch of one whose tokens are every block's.
        pool = (1, x.shape[0] * x.shape[1]) + tuple(x.shape[2:])
        grouped_shape, axes = fp8_groups(pool if shared_batch else tuple(x.shape), nheads_k, False)
        grouped = xf.reshape(grouped_shape)
        if grouped.numel():
            amax = grouped.abs().amax(dim=axes)
        else:
            amax = xf.new_zeros(grouped.shape[0], nheads_k)
        descale = fp8_descale(amax, fp8_name, torch.where, torch.full_like)
        x8 = (grouped / descale[:, None, :, None, None]).reshape(x.shape).to(fp8_dtype)
        if shared_batch:
            descale = descale.expand(shared_batch, nheads_k)
        return x8, descale
    total = x.shape[0]
    batch = cu_seqlens.shape[0] - 1
    grouped_shape, axes = fp8_groups(tuple(x.shape), nheads_k, True)
    grouped = xf.reshape(grouped_shape)
    token_seq = torch.searchsorted(cu_seqlens[1:].to(torch.int64), torch.arange(total, device=x.device), right=True)
    amax = xf.new_zeros(batch, nheads_k)
    if total:
        token_amax = grouped.abs().amax(dim=axes)
        amax = amax.scatter_reduce(0, token_seq[:, None].expand(total, nheads_k), token_amax, reduce="amax")
    descale = fp8_descale(amax, fp8_name, torch.where, torch.full_like)
    x8 = (grouped / descale[token_seq][:, :, None, None]).reshape(x.shape).to(fp8_dtype)
    return x8, descale


def dequantize(x8: Tensor, descale: Tensor, nheads_k: int, cu_seqlens: Optional[Tensor], dtype: torch.dtype,
               shared_batch: int = 0) -> Tensor:
    """Inverse of quantize(), in `dtype`."""
    h, d = x8.shape[-2], x8.shape[-1]
    group = h // nheads_k
    xf = x8.float()
    if cu_seqlens is None:
        lead = 1 if shared_batch else x8.shape[0]
        scale = descale[:1] if shared_batch else descale
        return (xf.reshape(lead, -1, nheads_k, group, d) * scale[:, None, :, None, None]).reshape(x8.shape).to(dtype)
    total = x8.shape[0]
    token_seq = torch.searchsorted(cu_seqlens[1:].to(torch.int64), torch.arange(total, device=x8.device), right=True)
    return (xf.reshape(total, nheads_k, group, d) * descale[token_seq][:, :, None, None]).reshape(x8.shape).to(dtype)


def _quantize_all(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, fp8_dtype):
    hk = k.shape[-2]
    paged = block_table.shape[0] if block_table is not None else 0
    cu_k = None if paged else cu_seqlens_k
    return (quantize(q, hk, cu_seqlens_q, fp8_dtype), quantize(k, hk, cu_k, fp8_dtype, paged),
            quantize(v, hk, cu_k, fp8_dtype, paged))


@torch.library.custom_op("flashport::fwd_fp8", mutates_args=())
def fwd_fp8(
    q: Tensor, k: Tensor, v: Tensor,
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor], rng_state: Optional[Tensor],
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
    window_left: int, window_right: int, softcap: float, dropout_p: float,
    deterministic: bool, return_softmax: bool, fp8_dtype: torch.dtype,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(out in q's dtype, softmax_lse, S_dmask) of attention over the fp8-quantised inputs."""
    (q8, qd), (k8, kd), (v8, vd) = _quantize_all(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, fp8_dtype)
    return run_fwd(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, None, block_table, alibi_slopes, qd, kd, vd, rng_state,
                   max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                   deterministic, return_softmax, q.dtype)


@fwd_fp8.register_fake
def _fwd_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, alibi_slopes, rng_state, max_seqlen_q,
                  max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, dropout_p, deterministic,
                  return_softmax, fp8_dtype):
    return _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, None, block_table, alibi_slopes, None, None, None,
                     rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                     dropout_p, deterministic, return_softmax, q.dtype)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, block_table, alibi, rng_state, max_q, max_k, scale, causal, wl, wr, softcap, dropout_p,
     deterministic, _, fp8_dtype) = inputs
    out, lse, _ = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, block_table, alibi, rng_state)
    ctx.fp8_dtype = fp8_dtype
    ctx.params = (max_q, max_k, scale, causal, wl, wr, softcap, dropout_p, deterministic)


def _backward(ctx, dout, dlse, ds_dmask):
    q, k, v, out, lse, cu_q, cu_k, block_table, alibi, rng_state = ctx.saved_tensors
    (q8, qd), (k8, kd), (v8, vd) = _quantize_all(q, k, v, cu_q, cu_k, block_table, ctx.fp8_dtype)
    hk = k.shape[-2]
    paged = block_table.shape[0] if block_table is not None else 0
    cu_k_q = None if paged else cu_k
    q_dq = dequantize(q8, qd, hk, cu_q, q.dtype)
    k_dq = dequantize(k8, kd, hk, cu_k_q, k.dtype, paged)
    v_dq = dequantize(v8, vd, hk, cu_k_q, v.dtype, paged)
    op = bwd if _tracing(dout) else run_bwd
    dq, dk, dv = op(dout, q_dq, k_dq, v_dq, out, lse, cu_q, cu_k, None, block_table, alibi, rng_state, *ctx.params)
    return (dq, dk, dv) + (None,) * 16


fwd_fp8.register_autograd(_backward, setup_context=_setup_context)
