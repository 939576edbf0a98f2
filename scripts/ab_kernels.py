"""Kernel time of the CUDA portable forward (prefill, forced with FLASHPORT_CUDA_FORWARD=portable), of
the decode variant and of the backward (autograd's backward call alone, its aux kernels included; the
Hopper kernels on sm_90), for a before/after of a kernel change (`--kinds` picks among them): run once per
tree (the other tree installed with `pip install --target DIR`, put first on PYTHONPATH) and in
alternating rounds, so drift hits both alike; `--compare A.jsonl B.jsonl` prints the ratio table. The
forward cells' inputs have requires_grad unset: this times kernels, not the autograd path
(bench/overhead_bench.py does that). Each cell's kernels are also timed one by one under torch.profiler
(mean device time per launch; `--no-kernels` skips it), and `--compare` lists them too: a call's wall time
moves by a few percent between rounds, which hides a change to one of its small kernels (the backward's
D and dQ-convert kernels are 10-20% of it).

  FLASHPORT_CUDA_FORWARD=portable python3 scripts/ab_kernels.py --tag new --out new.jsonl
  python3 scripts/ab_kernels.py --compare base.jsonl new.jsonl
"""
import argparse
import json
import statistics
import sys


def cells(kinds):
    if "prefill" in kinds:
        # Batch x seqlen = 16k tokens, 2048 = heads x d (BENCH.md's grid), portable kernel.
        for d in (64, 128):
            for s in (1024, 4096):
                for causal in (False, True):
                    yield {"kind": "prefill", "d": d, "s": s, "causal": causal}
    if "decode" in kinds:
        # One token, GQA 32/8, d 128; dense caches, pages of 16 and 256 (batch 1 too: per-call launches).
        for batch, ctx, page in ((1, 1024, 0), (1, 4096, 0), (1, 8192, 0), (8, 32768, 0), (128, 8192, 0),
                                 (8, 32768, 16), (1, 1024, 16), (1, 8192, 16), (1, 8192, 256)):
            yield {"kind": "decode", "batch": batch, "ctx": ctx, "page": page}
    if "backward" in kinds:
        # GPT-2 small's attention (12 heads, d 64, causal) at the train_gpt shapes, a small call, and d 128.
        for b, s, h, d in ((8, 1024, 12, 64), (2, 4096, 12, 64), (1, 128, 16, 64), (16, 1024, 16, 128)):
            yield {"kind": "backward", "batch": b, "s": s, "heads": h, "d": d}


def make_call(cell):
    import torch

    import flashport

    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    if cell["kind"] == "backward":
        b, s, h, d = cell["batch"], cell["s"], cell["heads"], cell["d"]
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=bf, generator=gen, requires_grad=True)
                   for _ in range(3))
        out = flashport.flash_attn_func(q, k, v, causal=True)
        grad = torch.randn_like(out)
        flops = 10 * b * h * s * s * d // 2  # 2.5x the forward's (SPEC.md), causal
        return (lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)), flops, 0
    if cell["kind"] == "prefill":
        d, s = cell["d"], cell["s"]
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=bf, generator=gen) for _ in range(3))
        flops = 4 * b * h * s * s * d // (2 if cell["causal"] else 1)
        return (lambda: flashport.flash_attn_func(q, k, v, causal=cell["causal"])), flops, 0
    batch, ctx, page = cell["batch"], cell["ctx"], cell["page"]
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=bf, generator=gen)
    seqlens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    if page:
        pages = batch * ctx // page
        kc = torch.randn(pages, page, 8, 128, device="cuda", dtype=bf, generator=gen)
        vc = torch.randn_like(kc)
        table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).reshape(batch, ctx // page)
        call = lambda: flashport.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table)
    else:
        kc = torch.randn(batch, ctx, 8, 128, device="cuda", dtype=bf, generator=gen)
        vc = torch.randn_like(kc)
        call = lambda: flashport.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)
    return call, 0, 2 * batch * ctx * 8 * 128 * 2


def time_call(call, reps=5, iters=30):
    import torch

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(per_call)


def kernel_times(call, iters=20):
    """Mean device time per launch of each CUDA kernel `call` runs, us, by kernel name (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    return {e.key[:60]: e.device_time_total / e.count for e in prof.key_averages()
            if e.device_type.name == "CUDA" and e.count and not e.key.startswith("Memcpy")}


def key(cell):
    return ",".join(f"{k}={v}" for k, v in cell.items())


def compare(paths):
    runs, kernel_runs = [], []
    for path in paths:
        rows, kernels = {}, {}
        for line in open(path):
            r = json.loads(line)
            rows.setdefault(r["cell"], []).append(r["us"])
            for name, us in r.get("kernels", {}).items():
                kernels.setdefault((r["cell"], name), []).append(us)
        runs.append(rows)
        kernel_runs.append(kernels)
    base, new = runs
    print(f"| cell | before us | after us | after / before |")
    print("|---|---|---|---|")
    ratios = []
    for cell in base:
        if cell not in new:
            continue
        b, n = min(base[cell]), min(new[cell])  # best round of each: the least disturbed
        ratios.append(n / b)
        print(f"| {cell} | {b:.1f} | {n:.1f} | {n / b:.3f} |")
    print(f"geometric mean after / before: {statistics.geometric_mean(ratios):.3f} over {len(ratios)} cells")
    shared = [k for k in kernel_runs[0] if k in kernel_runs[1]]
    if shared:  # kernels of the same name in both trees; the best round of each
        print("\n| cell | kernel | before us | after us | after / before |")
        print("|---|---|---|---|---|")
        for cell, name in shared:
            b, n = min(kernel_runs[0][(cell, name)]), min(kernel_runs[1][(cell, name)])
            print(f"| {cell} | {name} | {b:.2f} | {n:.2f} | {n / b:.3f} |")
    for tree, kernels, other in (("before", kernel_runs[0], kernel_runs[1]), ("after", kernel_runs[1], kernel_runs[0])):
        for cell, name in kernels:
            if (cell, name) not in other:
                print(f"only {tree}: {cell} {name} {min(kernels[(cell, name)]):.2f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--kinds", default="prefill,decode", help="comma-separated: prefill, decode, backward")
    ap.add_argument("--no-kernels", action="store_true", help="skip the per-kernel times (torch.profiler)")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare)
    import flashport

    out = open(args.out, "a") if args.out else None
    for cell in cells(args.kinds.split(",")):
        call, flops, nbytes = make_call(cell)
        us = time_call(call)
        rate = f"{flops / us / 1e6:.0f} TFLOPS" if flops else f"{nbytes / us / 1e3:.0f} GB/s"
        print(f"{args.tag:5s} {key(cell):45s} {us:9.1f} us  {rate}  ({flashport.__file__})", flush=True)
        row = {"tag": args.tag, "cell": key(cell), "us": us}
        if not args.no_kernels:
            row["kernels"] = kernel_times(call)
            print("      " + ", ".join(f"{name} {t:.2f}" for name, t in row["kernels"].items()), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    sys.exit(main())
