"""Where a training step's time goes, per attention backend: examples/train_gpt.py's model and step under
torch.profiler, GPU kernel time grouped by kernel (per step) beside the step's wall time, so a gap between
backends can be put on attention kernels, the copies around them, or the host.

  python3 scripts/profile_train.py [--attn flashport sdpa-flash] [--seq 1024 --batch 8] [--kernels] [--host] [--ops]
                                  [--phases] [--idle [--trace-dir DIR]]
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

    def step(self, parts: str = "all", mark=None):
        """parts: "fwd" (the loss alone), "fwd+bwd" (no optimizer step) or "all". mark(phase), when
        given, is called as each phase's launches end (PHASES)."""
        with torch.autocast("cuda", dtype=torch.bfloat16), train_gpt.sdpa_context(self.attn):
            loss = self.model(self.x, self.y)
        if mark:
            mark("fwd")
        if parts == "fwd":
            return
        loss.backward()
        if mark:
            mark("bwd")
        if parts != "all":
            self.model.zero_grad(set_to_none=True)
            return
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if mark:
            mark("opt")

    def wall_ms(self, steps: int, parts: str = "all") -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(parts)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / steps


PHASES = ("fwd", "bwd", "opt")  # forward to the loss; loss.backward(); clip + AdamW + zero_grad


def marked_steps(run: Run, steps: int, queued: bool):
    """Runs `steps` steps with a host clock and a CUDA event at each phase end; returns per step and phase
    (host ms, GPU ms, lag ms): the phase's host time, the GPU's time from the previous mark's event to
    this one's, and how far the GPU is behind the host at the mark. With `queued`, a GPU sleep ahead of
    the steps lets the host enqueue them while the GPU is busy, so the host times are its own (nothing
    waits for the GPU) and the GPU times its busy time alone; keep `steps` to one or two there (the
    driver's launch queue holds about a step: past it, the host waits for free slots)."""
    torch.cuda.synchronize()
    marks = []
    before, start = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    before.record()
    if queued:
        torch.cuda._sleep(int(2e6 * 60 * steps))  # ~60 ms of a ~2 GHz clock per step: longer than the host
    start.record()
    t0 = time.perf_counter()

    def mark(phase):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        marks.append((phase, time.perf_counter(), ev))

    for _ in range(steps):
        run.step("all", mark)
    torch.cuda.synchronize()
    host_done = (marks[-1][1] - t0) * 1e3
    rows, prev_h, prev_g = [], 0.0, 0.0
    for phase, t, ev in marks:
        h, g = (t - t0) * 1e3, start.elapsed_time(ev)
        rows.append((phase, h - prev_h, g - prev_g, g - h))
        prev_h, prev_g = h, g
    if queued and host_done > before.elapsed_time(start):
        print(f"  ({run.attn}: the host ({host_done:.1f} ms) outlasted the GPU sleep; queued times include waits)")
    return rows


def phase_table(runs, args) -> None:
    """Host vs GPU time per phase of a step, backends interleaved: whether each phase is host- or
    GPU-bound, and which phase holds a backend's extra time (no profiler: nothing inflated)."""
    paced, queued = {}, {}
    for _ in range(args.rounds):
        for r in runs:
            for i, (phase, h, g, lag) in enumerate(marked_steps(r, args.phase_steps, False)):
                if i >= len(PHASES):  # the first step starts from an idle GPU: left out
                    paced.setdefault((r.attn, phase), []).append((h, g, lag))
            for phase, h, g, lag in marked_steps(r, 1, True):
                queued.setdefault((r.attn, phase), []).append((h, g, lag))
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"\n## phases of a step, batch {args.batch} x {args.seq}: ms, medians over {args.rounds} rounds. "
          f"Normal run ({args.phase_steps - 1} steps a round): host = the phase's launches, gpu = the GPU's time "
          "for them, lag = how far the GPU trails the host at the phase end. Queued (one step a round behind a "
          "GPU sleep): host alone = launches that never wait for the GPU, gpu busy = the GPU's time alone")
    print("| attention | phase | host | gpu | lag at end | host alone | gpu busy |\n|---|---|---|---|---|---|---|")
    for r in runs:
        tot = [0.0] * 4
        for phase in PHASES:
            p, q = paced[r.attn, phase], queued[r.attn, phase]
            row = [med([x[0] for x in p]), med([x[1] for x in p]), med([x[2] for x in p]),
                   med([x[0] for x in q]), med([x[1] for x in q])]
            tot = [tot[0] + row[0], tot[1] + row[1], tot[2] + row[3], tot[3] + row[4]]
            print(f"| {r.attn} | {phase} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
        print(f"| {r.attn} | step | {tot[0]:.2f} | {tot[1]:.2f} | | {tot[2]:.2f} | {tot[3]:.2f} |")


def idle_table(run: Run, args) -> None:
    """GPU idle time per step under torch.profiler (CPU + CUDA), each idle stretch charged to the
    innermost host op running at its midpoint (any thread): which host work the GPU waits for. The
    profiler slows the host, so the totals are inflated; the split between ops is what to read."""
    import bisect
    import gzip
    import json
    import tempfile

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            run.step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        if args.trace_dir:
            os.makedirs(args.trace_dir, exist_ok=True)
            with open(path, "rb") as f, gzip.open(os.path.join(args.trace_dir, f"trace_{run.attn}.json.gz"), "wb") as g:
                g.write(f.read())
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"))
    ops = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                  if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")), key=lambda o: o[0])
    starts = [o[0] for o in ops]
    busy_end, idle, charged = gpu[0][1], 0.0, {}
    for a, b in gpu[1:]:
        if a > busy_end + 2:  # an idle stretch (over 2 us)
            gap, mid = a - busy_end, (a + busy_end) / 2
            name = "(no host op)"
            # The latest-starting op that still runs at mid: for nested ops, the innermost.
            for i in range(bisect.bisect_right(starts, mid) - 1, -1, -1):
                if ops[i][1] >= mid:
                    name = ops[i][2]
                    break
            idle += gap
            charged[name] = charged.get(name, 0.0) + gap
        busy_end = max(busy_end, b)
    busy = sum(b - a for a, b in gpu)
    print(f"\n## {run.attn}: GPU idle {idle / args.steps / 1e3:.2f} ms/step of {(gpu[-1][1] - gpu[0][0]) / args.steps / 1e3:.2f} "
          f"(kernels {busy / args.steps / 1e3:.2f} ms/step; torch.profiler on, host inflated). Idle charged to the "
          "innermost host op at its midpoint:")
    print("| idle us/step | host op |\n|---|---|")
    for name, us in sorted(charged.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {us / args.steps:.0f} | {name[:100]} |")


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
    ap.add_argument("--phases", action="store_true",
                    help="host vs GPU time per phase (forward, backward, optimizer), no profiler")
    ap.add_argument("--idle", action="store_true",
                    help="GPU idle time per step charged to the host op running then (torch.profiler)")
    ap.add_argument("--trace-dir", help="with --idle: keep each backend's chrome trace here (gzipped)")
    ap.add_argument("--phase-steps", type=int, default=6, help="steps per --phases round (the first is dropped)")
    ap.add_argument("--parts", action="store_true",
                    help="also time the forward alone and forward + backward (on tiny shapes: host cost per part)")
    args = ap.parse_args()
    if args.phase_steps < 2:
        ap.error("--phase-steps must be at least 2 (the first step of a round is left out)")
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
    if args.phases:
        phase_table(runs, args)
    for r in runs:
        if args.kernels:
            w = sorted(walls[r.attn])
            kernel_table(r, args, w[len(w) // 2])
        if args.ops:
            op_table(r, args)
        if args.host:
            host_profile(r, args)
        if args.idle:
            idle_table(r, args)


if __name__ == "__main__":
    main()
