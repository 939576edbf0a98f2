"""Where a training step's time goes, per attention backend: examples/train_gpt.py's model and step under
torch.profiler, GPU kernel time grouped by kernel (per step) beside the step's wall time, so a gap between
backends can be put on attention kernels, the copies around them, or the host.

  python3 scripts/profile_train.py [--attn flashport sdpa-flash] [--seq 1024 --batch 8] [--kernels] [--host] [--ops]
"""
import argparse
import importlib.util
import os
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("train_gpt", os.path.join(ROOT, "examples", "train_gpt.py"))
train_gpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_gpt)


class Run:
    """One backend's model, optimizer and fixed batch; step() is one training step."""

    def __init__(self, attn: str, args):
        ns = argparse.Namespace(attn=attn, layers=args.layers, width=args.width, heads=args.heads, seq=args.seq,
                                batch=args.batch, lr=6e-4)
        torch.manual_seed(0)
        self.attn, self.model = attn, train_gpt.build_model(ns).cuda()
        self.opt = train_gpt.make_optimizer(self.model, ns, True)
        self.x = torch.randint(0, train_gpt.VOCAB, (args.batch, args.seq), device="cuda")
        self.y = torch.randint(0, train_gpt.VOCAB, (args.batch, args.seq), device="cuda")
        for _ in range(5):
            self.step()

    def step(self, parts: str = "all"):
        """parts: "fwd" (the loss alone), "fwd+bwd" (no optimizer step) or "all"."""
        with torch.autocast("cuda", dtype=torch.bfloat16), train_gpt.sdpa_context(self.attn):
            loss = self.model(self.x, self.y)
        if parts == "fwd":
            return
        loss.backward()
        if parts != "all":
            self.model.zero_grad(set_to_none=True)
            return
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def wall_ms(self, steps: int, parts: str = "all") -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(parts)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / steps


def kernel_table(run: Run, args, wall_ms: float) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            run.step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = ev.cuda_time_total
        if us > 0:
            rows.append((us / args.steps, ev.count // args.steps, ev.key))
    rows.sort(reverse=True)
    gpu_ms = sum(r[0] for r in rows) / 1e3
    print(f"\n## {run.attn}: batch {args.batch} x {args.seq}, {args.layers} layers; wall {wall_ms:.2f} ms/step "
          f"({args.batch * args.seq / wall_ms * 1e3:,.0f} tok/s), GPU kernels {gpu_ms:.2f} ms/step")
    print("| us/step | calls/step | kernel |\n|---|---|---|")
    for us, n, key in rows[: args.top]:
        print(f"| {us:.0f} | {n} | {key[:110]} |")


def op_table(run: Run, args) -> None:
    """torch.profiler's host side of a step: self CPU time per op (aten ops, autograd nodes, flashport's
    Python autograd nodes), per step, so a backend's extra host time can be put on named ops."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            run.step()
        torch.cuda.synchronize()
    rows = [(ev.self_cpu_time_total / args.steps, ev.cpu_time_total / args.steps, ev.count // args.steps, ev.key)
            for ev in prof.key_averages()]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) / 1e3
    print(f"\n## {run.attn}: host ops per step (torch.profiler, self CPU {total:.2f} ms/step, profiler-inflated)")
    print("| self us/step | total us/step | calls/step | op |\n|---|---|---|---|")
    for self_us, tot_us, n, key in rows[: args.top]:
        print(f"| {self_us:.0f} | {tot_us:.0f} | {n} | {key[:90]} |")
    for self_us, tot_us, n, key in rows:
        if "Attention" in key or "flash" in key.lower() or "efficient" in key or "cudnn" in key.lower():
            if (self_us, tot_us, n, key) not in rows[: args.top]:
                print(f"| {self_us:.0f} | {tot_us:.0f} | {n} | {key[:90]} |")


def host_profile(run: Run, args) -> None:
    """cProfile of a few steps: the Python functions that cost the host most (tottime per step)."""
    import cProfile
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        run.step()
    torch.cuda.synchronize()
    prof.disable()
    print(f"\n## {run.attn}: host functions, {args.steps} steps (cProfile; its own overhead inflates them)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attn", nargs="+", default=["flashport", "sdpa-flash", "sdpa-cudnn"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps")
    ap.add_argument("--timed", type=int, default=20, help="steps timed without the profiler")
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, backends interleaved")
    ap.add_argument("--kernels", action="store_true", help="GPU kernel time per step, per kernel")
    ap.add_argument("--host", action="store_true", help="cProfile of the host side")
    ap.add_argument("--ops", action="store_true", help="torch.profiler's self CPU time per op of a step")
    ap.add_argument("--parts", action="store_true",
                    help="also time the forward alone and forward + backward (on tiny shapes: host cost per part)")
    args = ap.parse_args()
    runs = [Run(attn, args) for attn in args.attn]
    print(f"batch {args.batch} x {args.seq}, {args.layers} layers x {args.width} ({args.heads} heads): "
          f"wall ms/step, median of {args.rounds} interleaved rounds of {args.timed} steps")
    walls = {}
    for parts in (["fwd", "fwd+bwd", "all"] if args.parts else ["all"]):
        for _ in range(args.rounds):
            for r in runs:
                walls.setdefault((r.attn, parts), []).append(r.wall_ms(args.timed, parts))
        for r in runs:
            w = sorted(walls[r.attn, parts])
            spread = f"all: {', '.join(f'{x:.2f}' for x in w)}" if len(w) <= 7 else f"min {w[0]:.2f}, max {w[-1]:.2f}"
            print(f"  {parts:8s} {r.attn:11s} {w[len(w) // 2]:7.2f}  ({spread})"
                  + (f"  {args.batch * args.seq / w[len(w) // 2] * 1e3:,.0f} tok/s" if parts == "all" else ""))
    walls = {a: w for (a, parts), w in walls.items() if parts == "all"}
    for r in runs:
        if args.kernels:
            w = sorted(walls[r.attn])
            kernel_table(r, args, w[len(w) // 2])
        if args.ops:
            op_table(r, args)
        if args.host:
            host_profile(r, args)


if __name__ == "__main__":
    main()
