"""Context parallelism: ring attention over torch.distributed (NCCL on GPUs, gloo on CPUs).

Each rank of `group` holds one shard of every sequence (of q, k and v alike) and gets the attention of
its queries over the whole sequence's keys. K/V go round the ring (batch_isend_irecv to rank r+1, on a
side stream on CUDA) while the current block is computed; the backward sends K/V round again with their
dK/dV accumulators (fp32). Forward and backward are one autograd op over flashport's kernels.

Sharding (`layout`): "zigzag" (default) splits the sequence into 2W chunks and gives rank r chunks r and
2W-1-r, so every rank has the same causal work; "contiguous" gives rank r chunk r of W (causal work
grows with r). `zigzag_shard` / `zigzag_unshard` (and their varlen forms) convert a batch.

Supported per block: causal, sliding window (dense), softcap, GQA/MQA, any head dim flashport takes,
softmax_scale, deterministic. Not supported (named ValueError): dropout, ALiBi, window with varlen,
paged K/V. The multi-GPU throughput run (bench/ring_bench.py) is pending a 2-GPU machine.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._common import check_float, check_ndim, error, padded, window
from .._common import softmax_scale as _softmax_scale
from .._torch_path import check_tensor
from . import _ring

_LAYOUTS = ("zigzag", "contiguous")


def _world(group):
    if not dist.is_available() or not dist.is_initialized():
        raise error("group", "torch.distributed is not initialised (call torch.distributed.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


def _chunks(layout: str, rank: int, world: int, length: int):
    """rank -> [(global position, length)] of its chunks in memory order, for shards of `length` rows."""
    if layout == "zigzag":
        c = length // 2
        return lambda r: [(r * c, c), ((2 * world - 1 - r) * c, c)]
    return lambda r: [(r * length, length)]


def _check_common(q, k, v, dropout_p, alibi_slopes, layout):
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_tensor(x, name)
    if check_float(dropout_p, "dropout_p", 0.0, 1.0, hi_open=True) != 0.0:
        raise error("dropout_p", "ring attention has no dropout (its mask positions are per block); pass 0.0")
    if alibi_slopes is not None:
        raise error("alibi_slopes", "is not supported by ring attention")
    if layout not in _LAYOUTS:
        raise error("layout", f"expected one of {_LAYOUTS}, got {layout!r}")
    if k.shape[:-1] != v.shape[:-1]:
        raise error("v", f"expected the shape of k but the head dim, got {tuple(v.shape)} and k {tuple(k.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise error("k", f"ring attention needs k's shard the length of q's: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise error("k", f"head dim {k.shape[-1]} differs from q's {q.shape[-1]}")


def _pad(x):
    d = x.shape[-1]
    return x if d % 8 == 0 else F.pad(x, (0, padded(d) - d))


def _run(q, k, v, setup, return_attn_probs):
    dv = v.shape[-1]
    # Contiguous K/V: they are sent as they are. The head-dim padding (as flash_attn_func) is outside
    # the Function, so autograd slices it off the gradients.
    q, k, v = _pad(q), _pad(k).contiguous(), _pad(v).contiguous()
    out, lse = _ring.RingAttention.apply(q, k, v, setup)
    out = out[..., :dv] if out.shape[-1] != dv else out
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                         alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
                         layout="zigzag"):
    """flash_attn_func over a sequence sharded across `group` (default: the world): q (batch, shard,
    nheads, headdim), k/v (batch, shard, nheads_k, headdim) are this rank's shard (`layout`: zigzag needs
    an even shard length, i.e. a sequence length divisible by 2 * world size). Causal and window_size
    refer to global positions (q and k are the same sequence). Returns this rank's out, or (out,
    softmax_lse (batch, nheads, shard), None) with return_attn_probs. Every rank must call it with the
    same shapes and options."""
    _check_common(q, k, v, dropout_p, alibi_slopes, layout)
    check_ndim(q, 4, "q", "(batch, shard_len, nheads, headdim)")
    rank, world = _world(group)
    length = q.shape[1]
    if layout == "zigzag" and length % 2:
        raise error("q", f"zigzag shards hold two equal chunks, so their length must be even (the sequence "
                         f"length divisible by 2 * world size = {2 * world}); got a shard of {length}")
    wl, wr = window(window_size, causal)
    setup = _ring.Setup(_ring.Ring(group, q.device), _ring.DenseParts(2 if layout == "zigzag" else 1, length),
                        _chunks(layout, rank, world, length), None if wl < 0 else wl, None if wr < 0 else wr,
                        _softmax_scale(softmax_scale, q.shape[-1]), check_float(softcap, "softcap", 0.0),
                        bool(deterministic))
    return _run(q, k, v, setup, return_attn_probs)


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                return_attn_probs=False, group=None):
    """flash_attn_varlen_func over packed sequences each zigzag-sharded across `group`: q (total, nheads,
    headdim), k/v (total, nheads_k, headdim) hold this rank's shard of every sequence, cu_seqlens (int32
    (batch + 1,)) the shards' boundaries (each shard length even: every sequence length divisible by 2 *
    world size; `zigzag_shard_varlen` makes them), max_seqlen their largest. No sliding window. Returns
    out, or (out, softmax_lse (nheads, total), None) with return_attn_probs."""
    _check_common(q, k, v, dropout_p, alibi_slopes, "zigzag")
    check_ndim(q, 3, "q", "(total, nheads, headdim)")
    check_tensor(cu_seqlens, "cu_seqlens")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise error("cu_seqlens", f"expected int32 (batch + 1,), got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != q.device:
        raise error("cu_seqlens", f"is on {cu_seqlens.device}, q on {q.device}")
    rank, world = _world(group)
    lengths = cu_seqlens.diff()
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != q.shape[0] or bool((lengths < 0).any()):
        raise error("cu_seqlens", f"must rise from 0 to total = {q.shape[0]}")
    if bool((lengths % 2 != 0).any()):
        raise error("cu_seqlens", "zigzag shards hold two equal chunks per sequence, so every shard length must be "
                                  f"even (every sequence length divisible by 2 * world size = {2 * world})")
    wl, wr = window(window_size, causal)
    if wl >= 0 or (wr >= 0 and not causal):
        raise error("window_size", "sliding windows are supported by ring_flash_attn_func only (dense)")
    nominal = 1 << 30  # the plan without windows depends only on the chunks' order, not on their lengths
    setup = _ring.Setup(_ring.Ring(group, q.device), _ring.VarlenParts(2, cu_seqlens, int(max_seqlen)),
                        _chunks("zigzag", rank, world, 2 * nominal), None, 0 if causal else None,
                        _softmax_scale(softmax_scale, q.shape[-1]), check_float(softcap, "softcap", 0.0),
                        bool(deterministic))
    return _run(q, k, v, setup, return_attn_probs)


# ---------------------------------------------------------------------------------------------
# Sharding helpers.


def zigzag_indices(seqlen: int, rank: int, world_size: int) -> torch.Tensor:
    """The global positions rank `rank` holds, in shard order (int64): chunks rank and 2W-1-rank of 2W
    equal chunks (rotary positions and labels of a shard come from these)."""
    if seqlen % (2 * world_size):
        raise error("seqlen", f"must be divisible by 2 * world_size = {2 * world_size} for zigzag shards, "
                              f"got {seqlen}")
    c = seqlen // (2 * world_size)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((2 * world_size - 1 - rank) * c, (2 * world_size - rank) * c)])


def _rank_world(group, rank, world_size):
    if rank is None or world_size is None:
        r, w = _world(group)
        rank, world_size = (r if rank is None else rank), (w if world_size is None else world_size)
    return rank, world_size


def zigzag_shard(x, dim=1, group=None, *, rank=None, world_size=None):
    """This rank's zigzag shard of x along `dim` (the sequence; a copy). rank / world_size default to
    those of `group`. The sequence length must be divisible by 2 * world size (ValueError naming x)."""
    rank, world_size = _rank_world(group, rank, world_size)
    n = x.shape[dim]
    if n % (2 * world_size):
        raise error("x", f"sequence length {n} (dim {dim}) is not divisible by 2 * world size = {2 * world_size}")
    chunks = x.chunk(2 * world_size, dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim)


def zigzag_unshard(x, dim=1, group=None):
    """The whole sequence from every rank's zigzag shard x (all_gather over `group`; no autograd)."""
    _, world = _world(group)
    shards = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(shards, x.contiguous(), group=group)
    return zigzag_unshard_list(shards, dim)


def zigzag_unshard_list(shards, dim=1):
    """The whole sequence from the list of every rank's zigzag shard (rank order), without communication."""
    world = len(shards)
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))], dim)


def zigzag_shard_varlen(x, cu_seqlens, group=None, *, rank=None, world_size=None):
    """(shard of x (total, ...), its cu_seqlens): every sequence of the packed x zigzag-sharded. Each
    sequence length must be divisible by 2 * world size (ValueError naming cu_seqlens)."""
    rank, world_size = _rank_world(group, rank, world_size)
    bounds = cu_seqlens.cpu().tolist()
    pieces, lengths = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if (hi - lo) % (2 * world_size):
            raise error("cu_seqlens", f"sequence length {hi - lo} is not divisible by 2 * world size = "
                                      f"{2 * world_size}")
        pieces.append(zigzag_shard(x[lo:hi], 0, rank=rank, world_size=world_size))
        lengths.append((hi - lo) // world_size)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(cu_seqlens.device)
    return (torch.cat(pieces) if pieces else x[:0]), cu


def zigzag_unshard_varlen_list(shards, cu_seqlens_shard):
    """The packed whole sequences from every rank's varlen shard (rank order) and the shards' cu_seqlens."""
    bounds = cu_seqlens_shard.cpu().tolist()
    seqs = [zigzag_unshard_list([s[lo:hi] for s in shards], 0) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return torch.cat(seqs) if seqs else shards[0][:0]


__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "zigzag_indices",
    "zigzag_shard",
    "zigzag_shard_varlen",
    "zigzag_unshard",
    "zigzag_unshard_list",
    "zigzag_unshard_varlen_list",
]
