#!/usr/bin/env python3
"""Plots flashport_bench results: GFLOPS vs seqlen, one panel per (head dim, causal), flashport and its peer.

Reads JSON lines (flashport_bench output, or peer_torch.py's merged file) and writes a PNG whose path
it prints last. Without matplotlib it says so and exits 0.

Usage: python3 bench/plot.py build/bench_flashport_vs_torch.jsonl [--out plot.png]
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl")
    ap.add_argument("--out", help="PNG path (default: <input stem>.png)")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib is not installed; no plot written")
        return 0

    with open(args.jsonl) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    panels = sorted({(r["d"], bool(r["causal"])) for r in rows})
    if not panels:
        print("plot: no rows")
        return 0
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        series = sorted({(r.get("mode", "fwd"), r["dtype"]) for r in rows if r["d"] == d and bool(r["causal"]) == causal})
        for mode, dtype in series:
            sel = sorted((r for r in rows if r["d"] == d and bool(r["causal"]) == causal and r.get("mode", "fwd") == mode
                          and r["dtype"] == dtype), key=lambda r: r["sq"])
            xs = [r["sq"] for r in sel]
            ax.plot(xs, [r["tflops"] * 1e3 for r in sel], "o-", label=f"flashport {mode} {dtype}")
            peer = [(r["sq"], r["peer_tflops"] * 1e3) for r in sel if r.get("peer_tflops")]
            if peer:
                name = next(r["peer"] for r in sel if r.get("peer_tflops"))
                ax.plot([p[0] for p in peer], [p[1] for p in peer], "s--", label=f"{name} {mode} {dtype}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("GFLOPS")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    out = args.out or os.path.splitext(args.jsonl)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(os.path.abspath(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
