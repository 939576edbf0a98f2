"""Host cost of one attention call as a model makes it (q, k, v views of a fused qkv projection, bf16
autocast, non-leaf inputs) against leaf inputs, flashport vs SDPA; wall time per call of many calls
between two synchronisations, median of interleaved rounds. Also a cProfile of flashport's calls."""
import argparse
import cProfile
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

import flashport

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="1,64,12,64")
ap.add_argument("--calls", type=int, default=100)
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--host-only", action="store_true",
                help="time the host alone: the calls are made while a GPU sleep runs ahead of them, so none "
                     "waits for the GPU (keep --calls to a few dozen: the driver's launch queue is finite)")
args = ap.parse_args()
b, s, h, d = map(int, args.shape.split(","))
W = h * d
dev = "cuda"
lin = torch.nn.Linear(W, 3 * W, device=dev)
x = torch.randn(b, s, W, device=dev)
g = torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16)


def fp(q, k, v):
    return flashport.flash_attn_func(q, k, v, causal=True)


def sdpa(backend):
    """SDPA on one backend, as the GPT block calls it: (b, s, h, d) views transposed to (b, h, s, d)."""
    from torch.nn.attention import sdpa_kernel

    def fn(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True).transpose(1, 2)
    return fn


def ident(q, k, v):
    return q * 1


def leaf_inputs():
    t = [torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    return lambda: t


def view_inputs():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return lin(x).view(b, s, 3, h, d).unbind(2)


def timed(fn, inputs, bwd):
    torch.cuda.synchronize()
    if args.host_only:
        torch.cuda._sleep(int(2e6 * 100))  # ~100 ms at ~2 GHz: the GPU is busy past the calls' launches
    t0 = time.perf_counter()
    for _ in range(args.calls):
        q, k, v = inputs()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = fn(q, k, v)
        if bwd:
            o.backward(g)
    if not args.host_only:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / args.calls * 1e6


leaf = leaf_inputs()
for name, inputs in (("leaf", leaf), ("view", view_inputs)):
    for bwd in (False, True):
        fns = {"base": ident, "flashport": fp, "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
               "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
        for fn in fns.values():
            timed(fn, inputs, bwd)
        res = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, fn in fns.items():
                res[n].append(timed(fn, inputs, bwd))
        med = {n: statistics.median(v) for n, v in res.items()}
        print(f"{args.shape}{' host alone' if args.host_only else ''} {name:4s} {'fwd+bwd' if bwd else 'fwd':7s} base {med['base']:7.1f} us; beyond it: "
              + ", ".join(f"{n} {med[n] - med['base']:7.1f}" for n in fns if n != "base"), flush=True)

if args.host_only:
    raise SystemExit(0)
prof = cProfile.Profile()
torch.cuda.synchronize()
prof.enable()
for _ in range(200):
    q, k, v = view_inputs()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = fp(q, k, v)
    o.backward(g)
torch.cuda.synchronize()
prof.disable()
print("cProfile, 200 view-input fwd+bwd calls (nanobind functions count inside their Python caller):")
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
