#!/usr/bin/env python3
"""GPU benchmark: the standard grid of shared/BENCH.md, flashport vs PyTorch SDPA (cuDNN, flash) in one run.

Writes one JSON line per (impl row) with the keys of the CPU benchmark, prints a table, the cuBLAS and
copy ceilings, and (with --perf-md) rewrites docs/PERF.md plus a PNG plot.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
try:
    import flashport
except ImportError:  # the --replot paths here and in gpu_decode_bench.py redraw without the extension
    flashport = None


def flops(b, h, s, d, causal, mode):
    pairs = s * (s + 1) // 2 if causal else s * s
    f = 2 * pairs * (d + d) * h * b
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]


def time_ms(fn):
    from triton.testing import do_bench  # here: --replot runs where triton is not installed
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = time_ms(lambda: a @ b)
    x = torch.empty(2 * 1024**3, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    cp = time_ms(lambda: y.copy_(x))
    del x, y
    return 2 * 8192**3 / mm / 1e9, 2 * 2 * 1024**3 / cp / 1e6  # TFLOPS, GB/s


def run_impl(name, q, k, v, causal, mode):
    """Returns a callable for one implementation in (b, s, h, d) layout, or None when unavailable."""
    if name == "flashport":
        fwd = lambda: flashport.flash_attn_func(q, k, v, causal=causal)
    else:
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[name]
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def fwd():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    if mode == "fwd":
        return fwd
    out = fwd()
    dout = torch.randn_like(out)

    def bwd():
        q.grad = k.grad = v.grad = None
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    return bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_gpu.jsonl")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--peers", default="cudnn,fa2", help="comma list of cudnn, fa2; 'none' times flashport alone")
    ap.add_argument("--perf-md", action="store_true", help="rewrite docs/PERF.md and docs/perf_gpu.png")
    ap.add_argument("--replot", metavar="JSONL", help="only redraw docs/perf_gpu.png from an earlier --out file")
    args = ap.parse_args()
    if args.replot:
        replot(args.replot, None)
        return 0
    peer_names = [] if args.peers == "none" else args.peers.split(",")
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    mm_tflops, copy_gbs = ceilings()
    print(f"device {dev}; cuBLAS bf16 8192^3: {mm_tflops:.0f} TFLOPS; copy {copy_gbs:.0f} GB/s", flush=True)
    rows = []
    dims = [int(x) for x in args.dims.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    configs = [(d, s, c, m) for m in args.modes.split(",") for d in dims for c in (False, True) for s in seqlens]
    for idx, (d, s, causal, mode) in enumerate(configs):
        h, b = 2048 // d, max(1, 16384 // s)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=(mode != "fwd"))
                   for _ in range(3))
        # Correctness of the timed configuration, once, against cuDNN.
        with torch.no_grad():
            ours = flashport.flash_attn_func(q, k, v, causal=causal)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal).transpose(1, 2)
            err = (ours.float() - ref.float()).abs().max().item()
        ok = err < 2e-2
        if mode == "bwd":
            # The gradients too: largest |ours - cuDNN| over dq, dk, dv, relative to that gradient's largest
            # magnitude (gradients grow with the sequence length; outputs do not).
            dout = torch.randn_like(q)
            ours_g = torch.autograd.grad(flashport.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref_out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         is_causal=causal).transpose(1, 2)
                ref_g = torch.autograd.grad(ref_out, (q, k, v), dout)
            err = max(((a.float() - r.float()).abs().max() / r.float().abs().max()).item()
                      for a, r in zip(ours_g, ref_g))
            ok = err < 2e-2
            del dout, ours_g, ref_g, ref_out
        fl = flops(b, h, s, d, causal, mode)
        ms = time_ms(run_impl("flashport", q, k, v, causal, mode))
        for peer in peer_names or [None]:
            try:
                pms = time_ms(run_impl(peer, q, k, v, causal, mode)) if peer else None
            except Exception as e:  # a peer that cannot run this shape is reported missing
                print(f"  peer {peer} unavailable for d={d} s={s}: {type(e).__name__}", flush=True)
                pms = None
            row = dict(backend="cuda", peer=f"torch-sdpa-{peer}" if peer else None, dtype="bf16", d=d, sq=s, sk=s, causal=causal,
                       mode=mode, pass_=ok, max_err=err, ms=ms, tflops=fl / ms / 1e9,
                       peer_ms=pms, peer_tflops=(fl / pms / 1e9) if pms else None, device=dev,
                       ceiling_tflops=mm_tflops)
            row["pass"] = row.pop("pass_")
            rows.append(row)
        r = rows[-1]
        peers = " ".join(f"{x['peer'][11:]}={x['peer_tflops']:.0f}" if x["peer_tflops"] else f"{x['peer'][11:]}=-"
                         for x in rows[-len(peer_names):]) if peer_names else ""
        print(f"[{idx + 1}/{len(configs)}] {mode} d={d} s={s} causal={int(causal)}: flashport "
              f"{r['tflops']:.0f} TFLOPS ({r['tflops'] / mm_tflops:.0%} of cuBLAS) | {peers} | {'grad rel' if mode == 'bwd' else 'out'} err {err:.1e}",
              flush=True)
        del q, k, v
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    if args.perf_md:
        write_perf_md(rows, dev, mm_tflops, copy_gbs)
    print(f"results: {os.path.abspath(args.out)}")


PERF_BEGIN, PERF_END = "<!-- gpu_bench.py: begin -->", "<!-- gpu_bench.py: end -->"


def splice_perf_md(old_text, block, begin=PERF_BEGIN, end=PERF_END):
    """docs/PERF.md with the generated block between the markers begin / end replaced (prose and the other
    sections kept). Without the markers: this script's block goes after the title line, another script's
    (the decode benchmark's) before the CPU section."""
    block = f"{begin}\n{block.rstrip()}\n{end}"
    if begin in old_text and end in old_text:
        head, rest = old_text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if begin != PERF_BEGIN:
        cpu = old_text.find("\n## CPU")
        return old_text + "\n" + block + "\n" if cpu < 0 else old_text[:cpu + 1] + block + "\n\n" + old_text[cpu + 1:]
    title = "# flashport performance (GPU)\n\n"
    body = old_text[len(title):] if old_text.startswith(title) else old_text
    return title + block + "\n\n" + body


def write_perf_md(rows, dev, mm_tflops, copy_gbs):
    # A snapshot without git history (the device copy) passes the commit in FLASHPORT_COMMIT.
    commit = os.environ.get("FLASHPORT_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"{datetime.date.today()}, {dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
             f"commit {commit or 'n/a'}. Command: `scripts/gpu_suite.sh` (bench step: `python3 bench/gpu_bench.py "
             f"--perf-md`). bf16, batch*seqlen = 16384, nheads*d = 2048. TFLOPS by SPEC.md's FLOP model; median "
             f"of triton do_bench. Ceilings in the same run: cuBLAS bf16 8192^3 {mm_tflops:.0f} TFLOPS, copy "
             f"{copy_gbs:.0f} GB/s.", "",
             "| mode | d | causal | seqlen | flashport | % cuBLAS | cuDNN | FA2 | vs cuDNN | vs FA2 | pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["mode"], r["d"], r["causal"], r["sq"]), {})[r["peer"]] = r
    for (mode, d, causal, s), peers in sorted(by.items()):
        r = next(iter(peers.values()))
        cu, fa = peers.get("torch-sdpa-cudnn", {}), peers.get("torch-sdpa-fa2", {})
        fmt = lambda x: f"{x:.0f}" if x else "-"
        ratio = lambda x: f"{r['tflops'] / x:.2f}x" if x else "-"
        lines.append(f"| {mode} | {d} | {int(causal)} | {s} | {r['tflops']:.0f} | {r['tflops'] / mm_tflops:.0%} | "
                     f"{fmt(cu.get('peer_tflops'))} | {fmt(fa.get('peer_tflops'))} | {ratio(cu.get('peer_tflops'))} | "
                     f"{ratio(fa.get('peer_tflops'))} | {'yes' if r['pass'] else 'NO'} |")
    os.makedirs("docs", exist_ok=True)
    old_text = open("docs/PERF.md").read() if os.path.exists("docs/PERF.md") else ""
    text = splice_perf_md(old_text, "\n".join(lines) + "\n\n![TFLOPS vs seqlen](perf_gpu.png)")
    with open("docs/PERF.md", "w") as f:
        f.write(text)
    if os.environ.get("OUT"):  # the device tool returns $OUT only
        with open(os.path.join(os.environ["OUT"], "PERF.md"), "w") as f:
            f.write(text)
    plot(by, dev, ["docs/perf_gpu.png"] + ([os.path.join(os.environ["OUT"], "perf_gpu.png")]
                                             if os.environ.get("OUT") else []))


def plot(by, dev, paths):
    """TFLOPS vs seqlen: one panel per (mode, head dim); flashport, cuDNN and FA2 in fixed colours,
    non-causal solid, causal dashed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    modes = sorted({m for m, _, _, _ in by})
    dims = sorted({d for _, d, _, _ in by})
    impls = [(None, "flashport", "tab:blue", "o"), ("torch-sdpa-cudnn", "cuDNN", "tab:orange", "x"),
             ("torch-sdpa-fa2", "FA2", "tab:green", "+")]
    fig, axes = plt.subplots(len(modes), len(dims), figsize=(4.2 * len(dims), 3.6 * len(modes)), squeeze=False,
                             sharex=True)
    for row, mode in enumerate(modes):
        for col, d in enumerate(dims):
            ax = axes[row, col]
            for causal in (False, True):
                pts = sorted((s, p) for (m, dd, c, s), p in by.items() if (m, dd, c) == (mode, d, causal))
                if not pts:
                    continue
                xs = [s for s, _ in pts]
                for peer, name, colour, marker in impls:
                    ys = [(next(iter(p.values()))["tflops"] if peer is None else
                           p.get(peer, {}).get("peer_tflops")) for _, p in pts]
                    if all(y is None for y in ys):
                        continue
                    ax.plot(xs, [y if y is not None else float("nan") for y in ys], "--" if causal else "-",
                            color=colour, marker=marker, label=f"{name}{' causal' if causal else ''}")
            style_panel(ax, f"{mode} d{d}", "seqlen" if row == len(modes) - 1 else None,
                        "TFLOPS" if col == 0 else None)
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"bf16, {dev}, batch*seqlen = 16k, nheads*d = 2048")
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=110)


def style_panel(ax, title, xlabel=None, ylabel=None):
    """One panel of a sequence-length / context sweep: log2 x axis from the data, y from 0, light grid."""
    ax.set_xscale("log", base=2)
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)


def replot(jsonl, dev):
    """Redraws docs/perf_gpu.png from a --out file of an earlier run (no GPU needed)."""
    by = {}
    for line in open(jsonl):
        r = json.loads(line)
        by.setdefault((r["mode"], r["d"], r["causal"], r["sq"]), {})[r["peer"]] = r
    plot(by, dev or r.get("device", ""), ["docs/perf_gpu.png"])


if __name__ == "__main__":
    sys.exit(main())
