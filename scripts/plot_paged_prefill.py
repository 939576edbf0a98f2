#!/usr/bin/env python3
"""Plots scripts/paged_prefill_probe.py output: TFLOPS per cache layout (dense, pages of N), one panel per
(head dim, chunk), a bar per probe setting and one for FA3 where the log has it.

Reads the probe's printed lines; a line "--- SETTING" (gpu_suite.sh's pagedprefill step writes one before
each run) starts that setting's rows, "default" before the first. FA3's bars come from the first setting
that timed it. Without matplotlib it says so and exits 0.

Usage: python3 scripts/plot_paged_prefill.py LOG [--out docs/perf_paged_prefill.png] [--title TEXT]
"""
import argparse
import re
import sys

ROW = re.compile(r"d (\d+) chunk (\d+) context (\d+) (dense|paged(\d+)): [\d.]+ us, (\d+) TFLOPS"
                 r"(?: \| FA3 [\d.]+ us, (\d+) TFLOPS)?")


def parse(lines):
    """(setting, d, chunk, cache label, flashport TFLOPS, FA3 TFLOPS or None) per probe line."""
    setting, rows = "default", []
    for line in lines:
        if line.startswith("--- "):
            setting = line[4:].strip()
            continue
        m = ROW.search(line)
        if m:
            d, chunk, _, layout, page, fp, fa3 = m.groups()
            cache = "dense" if layout == "dense" else f"pages {page}"
            rows.append((setting, int(d), int(chunk), cache, int(fp), int(fa3) if fa3 else None))
    return rows


def label(setting):
    return {"default": "flashport", "FLASHPORT_CUDA_FORWARD=portable": "flashport, portable kernel"}.get(
        setting, f"flashport, {setting}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--out", default="perf_paged_prefill.png")
    ap.add_argument("--title", default="chunked prefill over a kv cache (causal, bf16)")
    args = ap.parse_args()
    with open(args.log) as f:
        rows = parse(f)
    if not rows:
        print("plot_paged_prefill: no probe rows in", args.log)
        return 0
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_paged_prefill: matplotlib is not installed; no plot written")
        return 0

    panels = sorted({(r[1], r[2]) for r in rows})
    settings = list(dict.fromkeys(r[0] for r in rows))
    fa3_setting = next((s for s in settings if any(r[0] == s and r[5] for r in rows)), None)
    series = [(label(s), s, 4) for s in settings] + ([("FA3", fa3_setting, 5)] if fa3_setting else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (d, chunk) in zip(axes[0], panels):
        caches = list(dict.fromkeys(r[3] for r in rows if (r[1], r[2]) == (d, chunk)))
        width = 0.8 / len(series)
        for i, (name, setting, col) in enumerate(series):
            vals = {r[3]: r[col] for r in rows if (r[0], r[1], r[2]) == (setting, d, chunk) and r[col]}
            xs = [j + (i - (len(series) - 1) / 2) * width for j, c in enumerate(caches) if c in vals]
            ax.bar(xs, [vals[c] for c in caches if c in vals], width, label=name)
        ax.set_xticks(range(len(caches)), caches, rotation=30)
        ax.set_title(f"d {d}, chunk {chunk}")
        ax.set_ylabel("TFLOPS")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper center", ncol=len(series))
    fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
