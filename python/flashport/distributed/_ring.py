"""Ring attention's machinery: which blocks a ring step computes (the plan), how partial results merge,
the P2P ring, and the autograd Function that runs forward and backward over it.

Every rank holds the same number of chunks of the global sequence, in increasing position order in
memory (zigzag: chunks r and 2W-1-r of 2W; contiguous: chunk r of W). At ring step s a rank holds the K/V
of rank (r - s) mod W. Each (query chunk, key chunk) pair is one flashport call whose mask is the global
mask expressed in the block's own bottom-right-aligned window, or is skipped; pairs that agree coalesce
into one call over whole shards, so the causal zigzag ring makes exactly one call per step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _torch_ops

_NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------
# Plan: the flashport calls of one ring step.


@dataclass(frozen=True)
class Call:
    """One flashport call of a ring step: query rows `q_chunk` (None: the whole shard) keeping its first
    `q_keep` rows, keys `k_chunk` likewise, under window (left, right) (-1 unbounded, flashport's
    bottom-right convention on the block's own lengths). q_keep / k_keep None: the whole part."""

    q_chunk: Optional[int]
    k_chunk: Optional[int]
    window: Tuple[int, int]
    q_keep: Optional[int] = None
    k_keep: Optional[int] = None


def _pair(q_pos: int, lq: int, k_pos: int, lk: int, wl: Optional[int], wr: Optional[int]):
    """The block of queries [q_pos, q_pos + lq) against keys [k_pos, k_pos + lk) under the global window
    (wl, wr) (None: unbounded; global sq = sk, so query i sees keys [i - wl, i + wr]). Returns None when
    no pair is visible, else (q_keep, k_keep, left, right): flashport aligns a block bottom-right, so with
    delta = (q_pos - k_pos) - (lk - lq) the block's window is (wl - delta, wr + delta). A negative side
    (a band not touching the block's diagonal) is not expressible; the rows it leaves empty are trimmed
    instead: dropping the last s queries moves the window by (+s, -s), dropping the last s keys by (-s, +s),
    and exactly those queries / keys see nothing in the block."""
    delta = (q_pos - k_pos) - (lk - lq)
    left = None if wl is None else wl - delta
    right = None if wr is None else wr + delta
    if left is not None and left < 0:
        lq += left
        right = None if right is None else right + left
        left = 0
    if right is not None and right < 0:
        lk += right
        left = None if left is None else left + right
        right = 0
    if lq <= 0 or lk <= 0 or (left is not None and left < 0):
        return None
    # After trimming the last query sees the last key, so the block is not empty. Sides that mask
    # nothing are dropped, so full blocks take the kernels' unmasked path.
    if left is not None and left >= lk - 1:
        left = None
    if right is not None and right >= lq - 1:
        right = None
    return lq, lk, left, right


def plan_step(q_chunks: List[Tuple[int, int]], k_chunks: List[Tuple[int, int]], wl: Optional[int],
              wr: Optional[int], same: bool) -> List[Call]:
    """The calls of one step: q_chunks / k_chunks are the (global position, length) of the chunks held,
    in memory order; `same`: the keys are this rank's own (step 0)."""
    if same and wl is None and wr == 0:
        # Chunks lie in increasing position order, so plain causal over the whole shard is the global mask.
        return [Call(None, None, (-1, 0))]
    pairs = [[_pair(qp, ql, kp, kl, wl, wr) for kp, kl in k_chunks] for qp, ql in q_chunks]

    def full(i, j):
        p = pairs[i][j]
        return p is not None and p == (q_chunks[i][1], k_chunks[j][1], None, None)

    nq, nk = len(q_chunks), len(k_chunks)
    if all(full(i, j) for i in range(nq) for j in range(nk)):
        return [Call(None, None, (-1, -1))]
    calls, done = [], [[pairs[i][j] is None for j in range(nk)] for i in range(nq)]
    for i in range(nq):  # a query chunk that sees every key chunk in full: one call over all keys
        if all(full(i, j) for j in range(nk)):
            calls.append(Call(i, None, (-1, -1)))
            done[i] = [True] * nk
    if not any(all(row) for row in done):
        for j in range(nk):  # a key chunk every query chunk sees in full: one call over all queries
            if all(full(i, j) for i in range(nq)):
                calls.append(Call(None, j, (-1, -1)))
                for row in done:
                    row[j] = True
    for i in range(nq):
        for j in range(nk):
            if not done[i][j]:
                lq, lk, left, right = pairs[i][j]
                calls.append(Call(i, j, (-1 if left is None else left, -1 if right is None else right),
                                  None if lq == q_chunks[i][1] else lq, None if lk == k_chunks[j][1] else lk))
    return calls


# ---------------------------------------------------------------------------------------------
# Layouts: how a plan's parts map onto tensors.


class DenseParts:
    """(b, L, h, d) shards, chunks of `chunk` rows along dim 1 (views, no copies); LSE (b, h, L)."""

    def __init__(self, nchunks: int, length: int):
        self.chunk = length // nchunks

    def rows(self, part: Optional[int], keep: Optional[int], length: int) -> slice:
        lo = 0 if part is None else part * self.chunk
        hi = (length if part is None else lo + self.chunk) if keep is None else lo + keep
        return slice(lo, hi)

    def take(self, x, part, keep):
        return x[:, self.rows(part, keep, x.shape[1])]

    def take_lse(self, lse, part, keep):
        return lse[:, :, self.rows(part, keep, lse.shape[2])]

    def put(self, dst, part, keep, fn):
        """dst's rows of the part updated in place by fn(view) (the views write through)."""
        fn(self.take(dst, part, keep))

    def put_lse(self, dst, part, keep, fn):
        fn(self.take_lse(dst, part, keep))

    @staticmethod
    def lse_rows(lse):  # (b, h, L) -> (b, L, h, 1), to scale out rows
        return lse.transpose(1, 2).unsqueeze(-1)

    def varlen(self, part):
        return None, 0


class VarlenParts:
    """(T, h, d) packed shards: each sequence of the shard holds `nchunks` equal chunks; chunk c of every
    sequence is gathered by index (a copy) with its own cu_seqlens. LSE (h, T)."""

    def __init__(self, nchunks: int, cu_seqlens, max_seqlen: int):
        self.cu, self.max = cu_seqlens, max_seqlen
        host = cu_seqlens.cpu().long()  # one small host copy per call (a sync on a GPU)
        token = torch.arange(int(host[-1]))
        seq = torch.searchsorted(host, token, right=True) - 1
        chunk = (token - host[seq]) // (host.diff() // nchunks)[seq]
        self.index = [torch.nonzero(chunk == c).flatten().to(cu_seqlens.device) for c in range(nchunks)]
        self.cu_chunk = (cu_seqlens // nchunks).to(torch.int32)
        self.max_chunk = max_seqlen // nchunks

    def take(self, x, part, keep):
        return x if part is None else x.index_select(0, self.index[part])

    def take_lse(self, lse, part, keep):
        return lse if part is None else lse.index_select(1, self.index[part])

    def put(self, dst, part, keep, fn):
        if part is None:
            fn(dst)
        else:
            view = dst.index_select(0, self.index[part])
            fn(view)
            dst.index_copy_(0, self.index[part], view)

    def put_lse(self, dst, part, keep, fn):
        if part is None:
            fn(dst)
        else:
            view = dst.index_select(1, self.index[part])
            fn(view)
            dst.index_copy_(1, self.index[part], view)

    @staticmethod
    def lse_rows(lse):  # (h, T) -> (T, h, 1)
        return lse.t().unsqueeze(-1)

    def varlen(self, part):
        return (self.cu, self.max) if part is None else (self.cu_chunk, self.max_chunk)


def merge_into(parts, acc_out, acc_lse, call, out, lse):
    """acc (fp32 out, lse) of the call's query rows <- the LSE-weighted merge with the block's (out, lse).
    Rows where both are -inf stay 0 / -inf."""
    acc_l = parts.take_lse(acc_lse, call.q_chunk, call.q_keep)
    new = torch.logaddexp(acc_l, lse)
    safe = new.masked_fill(new == _NEG_INF, 0.0)
    w_acc, w_blk = parts.lse_rows(torch.exp(acc_l - safe)), parts.lse_rows(torch.exp(lse - safe))
    parts.put(acc_out, call.q_chunk, call.q_keep, lambda o: o.mul_(w_acc).add_(out.float() * w_blk))
    parts.put_lse(acc_lse, call.q_chunk, call.q_keep, lambda l: l.copy_(new))


# ---------------------------------------------------------------------------------------------
# The ring: batched P2P to the next rank, overlapped with the current block's attention.

_COMMUNICATE = True  # bench/ring_bench.py turns it off to time the computation alone


@contextlib.contextmanager
def without_communication():
    """Inside: every exchange returns the tensors it was given (each rank computes the same blocks with
    its own K/V). For timing the computation alone; the results are wrong."""
    global _COMMUNICATE
    saved, _COMMUNICATE = _COMMUNICATE, False
    try:
        yield
    finally:
        _COMMUNICATE = saved


class Ring:
    """Sends to rank r+1 and receives from rank r-1 of `group` with dist.batch_isend_irecv. On CUDA the
    ops are issued on a side stream that first waits for the compute stream (so sends see finished
    data); the compute stream waits for it only when the received tensors are needed."""

    def __init__(self, group, device: torch.device):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        peer = lambda r: dist.get_global_rank(group, r) if group is not None else r
        self.next, self.prev = peer((self.rank + 1) % self.size), peer((self.rank - 1) % self.size)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def exchange(self, tensors):
        """Start sending `tensors` onward and receiving their successors; returns a callable that waits
        and gives the received tensors."""
        if not _COMMUNICATE:
            return lambda: tensors
        recv = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recv]
        if self.stream is None:
            reqs = dist.batch_isend_irecv(ops)
        else:
            main = torch.cuda.current_stream(tensors[0].device)
            self.stream.wait_stream(main)
            with torch.cuda.stream(self.stream):
                reqs = dist.batch_isend_irecv(ops)
            for t in tensors + recv:  # used on the side stream: not to be reused before it is done
                t.record_stream(self.stream)

        def wait():
            for req in reqs:
                req.wait()
            if self.stream is not None:
                torch.cuda.current_stream(tensors[0].device).wait_stream(self.stream)
            return recv

        return wait


# ---------------------------------------------------------------------------------------------
# Forward and backward.


@dataclass
class Setup:
    """What the rank holds and how to compute: chunk positions per rank, masks, flashport scalars."""

    ring: Ring
    parts: object  # DenseParts or VarlenParts
    chunks_of: object  # rank -> [(global position, length)] in memory order
    wl: Optional[int]
    wr: Optional[int]
    scale: float
    softcap: float
    deterministic: bool

    def plan(self, step: int):
        r, w = self.ring.rank, self.ring.size
        return plan_step(self.chunks_of(r), self.chunks_of((r - step) % w), self.wl, self.wr, step == 0)


def _block_args(setup, call):
    """cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k of a call (None, None, 0, 0 when dense)."""
    (cu_q, max_q), (cu_k, max_k) = setup.parts.varlen(call.q_chunk), setup.parts.varlen(call.k_chunk)
    return cu_q, cu_k, max_q, max_k


def _block_fwd(setup, call, q, k, v):
    parts = setup.parts
    cu_q, cu_k, max_q, max_k = _block_args(setup, call)
    out, lse, _ = _torch_ops.run_fwd(parts.take(q, call.q_chunk, call.q_keep), parts.take(k, call.k_chunk, call.k_keep),
                                     parts.take(v, call.k_chunk, call.k_keep), cu_q, cu_k, None, None, None, None,
                                     None, None, None, max_q, max_k, setup.scale, False, call.window[0],
                                     call.window[1], setup.softcap, 0.0, setup.deterministic, False, None)
    return out, lse


def _block_bwd(setup, call, dout, q, k, v, out, lse):
    parts = setup.parts
    take_q = lambda x: parts.take(x, call.q_chunk, call.q_keep)
    take_k = lambda x: parts.take(x, call.k_chunk, call.k_keep)
    cu_q, cu_k, max_q, max_k = _block_args(setup, call)
    return _torch_ops.run_bwd(take_q(dout), take_q(q), take_k(k), take_k(v), take_q(out),
                              parts.take_lse(lse, call.q_chunk, call.q_keep).contiguous(), cu_q, cu_k, None, None,
                              None, None, max_q, max_k, setup.scale, False, call.window[0], call.window[1],
                              setup.softcap, 0.0, setup.deterministic)


def ring_forward(setup: Setup, q, k, v):
    """(out in q's dtype, lse fp32) of the rank's queries over the whole ring's keys."""
    acc_out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float32, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    acc_lse = torch.full(lse_shape, _NEG_INF, dtype=torch.float32, device=q.device)
    w = setup.ring.size
    for step in range(w):
        pending = setup.ring.exchange([k, v]) if step + 1 < w else None
        for call in setup.plan(step):
            out, lse = _block_fwd(setup, call, q, k, v)
            merge_into(setup.parts, acc_out, acc_lse, call, out, lse)
        if pending is not None:
            k, v = pending()
    return acc_out.to(q.dtype), acc_lse


def ring_backward(setup: Setup, dout, q, k, v, out, lse):
    """(dq, dk, dv) for the rank's shards. dK/dV accumulate in fp32 and travel with K/V: the buffer for
    rank o's keys collects every rank's contribution on its way round and the last send brings it home."""
    w = setup.ring.size
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = dv = None
    pending_d = None
    for step in range(w):
        pending_kv = setup.ring.exchange([k, v]) if step + 1 < w else None
        blocks = [(call, _block_bwd(setup, call, dout, q, k, v, out, lse)) for call in setup.plan(step)]
        if pending_d is not None:  # the buffer for the keys held now, arrived during this step's work
            dk, dv = pending_d()
        else:
            dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
            dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for call, (dq_b, dk_b, dv_b) in blocks:
            setup.parts.put(dq, call.q_chunk, call.q_keep, lambda g: g.add_(dq_b))
            setup.parts.put(dk, call.k_chunk, call.k_keep, lambda g: g.add_(dk_b))
            setup.parts.put(dv, call.k_chunk, call.k_keep, lambda g: g.add_(dv_b))
        if w > 1:
            pending_d = setup.ring.exchange([dk, dv])
        if pending_kv is not None:
            k, v = pending_kv()
    if pending_d is not None:
        dk, dv = pending_d()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttention(torch.autograd.Function):
    """Ring attention as one autograd op: forward keeps (q, k, v, out, lse) of this rank; backward runs
    the ring again (K/V round once more, dK/dV with them)."""

    @staticmethod
    def forward(ctx, q, k, v, setup):
        out, lse = ring_forward(setup, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = setup
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(ctx.setup, dout.contiguous(), q, k, v, out, lse)
        return dq, dk, dv, None
