"""Ring attention (flashport.distributed) throughput: forward + backward over W ranks against one-GPU
flashport on the same whole sequence, and the fraction of the ring's communication hidden behind its
attention.

    python bench/ring_bench.py                         # every visible GPU, 32k-512k tokens, NCCL
    python bench/ring_bench.py --device cpu --world 2 --seqlens 2048 --heads 2 --kv-heads 1 --head-dim 32

Per sequence length it reports, per rank group: ring time, tokens/s, TFLOPS per GPU (SPEC's FLOP count,
fwd + bwd = 3.5x forward, causal halves it), single-device flashport on the whole sequence (same FLOPs on
one device; --single-max caps the lengths it is run for), and hidden = (compute + comm - ring) / comm,
from two more timings of the same ring: with communication replaced by nothing (each rank reuses its own
K/V; the blocks computed are the same) and the exchanges alone. JSON lines go to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world", type=int, default=None, help="ranks (default: every visible GPU; 2 on the CPU)")
    p.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536, 131072, 262144, 524288])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--single-max", type=int, default=1 << 30, help="longest sequence run on one device")
    p.add_argument("--out", default=None, help="JSON lines file")
    args = p.parse_args(argv)
    if args.world is None:
        args.world = torch.cuda.device_count() if args.device == "cuda" else 2
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def _flops(args, n):
    """SPEC's count for fwd + bwd (3.5x the forward) of the whole sequence."""
    pairs = n * (n + 1) / 2 if args.causal else n * n
    return 3.5 * 2 * pairs * 2 * args.head_dim * args.heads * args.batch


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, args, device, barrier=True):
    for _ in range(args.warmup):
        fn()
    _sync(device)
    if barrier:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        fn()
    _sync(device)
    if barrier:
        dist.barrier()
    return (time.perf_counter() - start) / args.iters


def _inputs(args, n, device, shard):
    dtype = getattr(torch, args.dtype)
    length = n // args.world if shard else n
    make = lambda h: torch.randn(args.batch, length, h, args.head_dim, device=device, dtype=dtype, requires_grad=True)
    return make(args.heads), make(args.kv_heads), make(args.kv_heads)


def _bench_one(args, n, rank, device):
    import flashport
    from flashport.distributed import _ring, ring_flash_attn_func

    q, k, v = _inputs(args, n, device, shard=True)
    dout = torch.randn_like(q)

    def ring():
        out = ring_flash_attn_func(q, k, v, causal=args.causal, layout=args.layout)
        out.backward(dout)

    t_ring = _time(ring, args, device)
    with _ring.without_communication():
        t_comp = _time(ring, args, device)
    comm = _ring.Ring(None, device)
    kv = [k.detach(), v.detach()]
    dkv = [torch.zeros(k.shape, dtype=torch.float32, device=device) for _ in range(2)]

    def exchanges():  # what one ring fwd + bwd sends: K/V W-1 times in each pass, dK/dV W times
        for _ in range(2 * (args.world - 1)):
            comm.exchange(kv)()
        for _ in range(args.world if args.world > 1 else 0):
            comm.exchange(dkv)()

    t_comm = _time(exchanges, args, device)
    t_single = None
    if rank == 0 and n <= args.single_max:
        qs, ks, vs = _inputs(args, n, device, shard=False)
        douts = torch.randn_like(qs)

        def single():
            flashport.flash_attn_func(qs, ks, vs, causal=args.causal).backward(douts)

        t_single = _time(single, args, device, barrier=False)
        del qs, ks, vs, douts
    dist.barrier()
    flops = _flops(args, n)
    hidden = min(max((t_comp + t_comm - t_ring) / t_comm, 0.0), 1.0) if t_comm > 0 else None
    return {"seqlen": n, "world": args.world, "device": args.device, "dtype": args.dtype, "causal": args.causal,
            "layout": args.layout, "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads,
            "head_dim": args.head_dim, "ring_s": t_ring, "compute_s": t_comp, "comm_s": t_comm,
            "tokens_per_s": args.batch * n / t_ring, "tflops_per_gpu": flops / t_ring / args.world / 1e12,
            "single_s": t_single, "single_tflops": None if t_single is None else flops / t_single / 1e12,
            "hidden": hidden}


def _worker(rank, args, init, out_path):
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
        device = torch.device("cpu")
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(minutes=10))
    try:
        rows = []
        for n in args.seqlens:
            if n % (2 * args.world):
                raise ValueError(f"--seqlens: {n} is not divisible by 2 * world = {2 * args.world}")
            rows.append(_bench_one(args, n, rank, device))
        if rank == 0:
            with open(out_path, "w") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
    finally:
        dist.destroy_process_group()


def main(argv=None):
    args = _parse(argv)
    if args.world < 1:
        raise SystemExit("no ranks: --world must be >= 1 (no GPU visible? use --device cpu)")
    mp.set_forkserver_preload(["torch", "torch.distributed", "flashport.distributed"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.jsonl")
        mp.start_processes(_worker, args=(args, "file://" + os.path.join(tmp, "rendezvous"), path),
                           nprocs=args.world, join=True, start_method="forkserver")
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    print(f"ring attention fwd+bwd, {args.world} x {args.device}, {args.dtype}, b={args.batch} h={args.heads}/"
          f"{args.kv_heads} d={args.head_dim}, {'causal' if args.causal else 'full'}, {args.layout}")
    print(f"{'seqlen':>8} {'ring ms':>9} {'tok/s':>11} {'TFLOPS/GPU':>10} {'1-dev ms':>9} {'1-dev TFLOPS':>12} "
          f"{'compute ms':>10} {'comm ms':>8} {'hidden':>6}")
    for r in rows:
        single = (f"{r['single_s'] * 1e3:9.2f} {r['single_tflops']:12.2f}" if r["single_s"] is not None
                  else f"{'-':>9} {'-':>12}")
        hidden = f"{r['hidden']:6.2f}" if r["hidden"] is not None else f"{'-':>6}"
        print(f"{r['seqlen']:>8} {r['ring_s'] * 1e3:9.2f} {r['tokens_per_s']:11.0f} {r['tflops_per_gpu']:10.2f} "
              f"{single} {r['compute_s'] * 1e3:10.2f} {r['comm_s'] * 1e3:8.2f} {hidden}")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
