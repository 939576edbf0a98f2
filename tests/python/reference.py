"""Test oracles written independently of flashport: naive torch attention in float64 (the reference) and
in the input precision (the accuracy rule's baseline), a numpy Philox4x32-10 for dropout masks, and
SPEC's accuracy rule."""

from __future__ import annotations

import numpy as np
import torch

MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123's Philox4x32-10 on uint64 arrays holding 32-bit words."""
    c = [np.asarray(x, dtype=np.uint64) & MASK32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0) & MASK32, np.uint64(k1) & MASK32
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & MASK32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & MASK32
    return c


def dropout_keep(seed: int, offset: int, p: float, b_idx: int, hq: int, sq: int, sk: int) -> np.ndarray:
    """(hq, sq, sk) bool: SPEC's keep mask of sequence b_idx (counter (j/4, i, b*hq + h, offset))."""
    seed &= 0xFFFFFFFFFFFFFFFF
    h, i, j = np.meshgrid(np.arange(hq), np.arange(sq), np.arange(sk), indexing="ij")
    words = philox4x32_10(j // 4, i, b_idx * hq + h, np.full_like(j, offset & 0xFFFFFFFF), seed & 0xFFFFFFFF, seed >> 32)
    word = np.choose(j % 4, words)
    t = p * 4294967296.0
    threshold = 0xFFFFFFFF if t >= 4294967295.0 else int(t)
    return word >= np.uint64(threshold)


def visible(sq: int, sk: int, causal: bool, window=(-1, -1)) -> torch.Tensor:
    """(sq, sk) bool: key j visible to query i, bottom-right aligned."""
    wl, wr = window
    if causal:
        wr = 0
    r = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if wl >= 0:
        vis &= j >= r - wl
    if wr >= 0:
        vis &= j <= r + wr
    return vis


def attention_ref(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None, keep=None,
                  dropout_p=0.0, upcast=True):
    """Naive attention of one dense batch: q (b, sq, hq, d), k/v (b, sk, hk, d|dv) -> (out, lse).

    upcast=True: float64 everywhere (the reference). upcast=False: the baseline of the accuracy rule,
    scores and P rounded to the input dtype. keep: bool (b, hq, sq, sk) dropout keep mask.
    alibi: fp32 (hq,) or (b, hq). Fully masked rows give out 0 and lse -inf.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if sk == 0:  # no keys: every row is fully masked
        out = (q.sum() * 0 + torch.zeros(b, sq, hq, v.shape[-1], dtype=q.dtype)).to(torch.float64 if upcast else dtype)
        return out, torch.full((b, hq, sq), float("-inf"))
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    scale = d**-0.5 if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, k)
    s = (s.double() * scale) if upcast else (s.float() * scale)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        slopes = alibi.to(s.dtype).reshape(-1, hq) if alibi.dim() == 2 else alibi.to(s.dtype).reshape(1, hq)
        dist = (torch.arange(sq)[:, None] + sk - sq - torch.arange(sk)[None, :]).abs().to(s.dtype)
        s = s - slopes[:, :, None, None] * dist
    if not upcast:
        s = s.to(dtype).float()
    vis = visible(sq, sk, causal, window)
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    denom = e.sum(-1, keepdim=True)
    p = e / torch.where(denom == 0, torch.ones_like(denom), denom)
    lse = (torch.log(denom) + m).squeeze(-1)
    if keep is not None and dropout_p > 0:
        p = p * keep.to(p.dtype) / (1.0 - dropout_p)
    if not upcast:
        p = p.to(dtype)
    out = torch.einsum("bhij,bjhd->bihd", p, v if upcast else v.to(p.dtype))
    return out.to(torch.float64 if upcast else dtype), lse.float()


def varlen_ref(q, k, v, cu_q, cu_k, **kw):
    """attention_ref per sequence of packed (total, h, d) tensors; alibi (b, hq) rows follow sequences."""
    outs, lses = [], []
    alibi = kw.pop("alibi", None)
    keeps = kw.pop("keeps", None)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        a = None if alibi is None else (alibi[b] if alibi.dim() == 2 else alibi)
        keep = None if keeps is None else keeps[b][None]
        o, lse = attention_ref(q[qs][None], k[ks][None], v[ks][None], alibi=a, keep=keep, **kw)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)


def check_rule(out, ref, base, factor=2.0, what="out"):
    """SPEC's accuracy rule: max|out - ref| <= factor * max|base - ref| + 1e-5."""
    out, ref, base = out.detach().cpu().double(), ref.detach().cpu().double(), base.detach().cpu().double()
    if out.numel() == 0:
        return
    err = (out - ref).abs().max().item()
    base_err = (base - ref).abs().max().item()
    assert err <= factor * base_err + 1e-5, f"{what}: max err {err:.3e} > {factor} x baseline {base_err:.3e} + 1e-5"


def work_dtype(device):
    """float32 on the CPU (tight checks), float16 on CUDA (the GPU backend takes fp16/bf16 only)."""
    return torch.float32 if str(device) == "cpu" else torch.float16
