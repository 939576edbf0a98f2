#!/usr/bin/env python3
"""Decode benchmark (shared/BENCH.md): one new query token per sequence against a KV cache, d 128, GQA 32/8
and 64/8, dense and paged (pages of 16 and 256), batch x context over the grid; GB/s of K/V bytes read
against the copy ceiling of the same run. Peers: PyTorch SDPA (cuDNN, flash) on the dense cache with
enable_gqa, where they run, and FA3's flash_attn_with_kvcache (dense and paged) when flash_attn_interface
imports (../shared/peers: FA3_DECODE=1 builds its decode kernels).

    python3 bench/gpu_decode_bench.py [--perf-md]   # also rewrites its section of docs/PERF.md + a PNG
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import ceilings, splice_perf_md, style_panel, time_ms  # noqa: E402

try:
    import flashport  # noqa: E402
except ImportError:  # --replot needs only the JSON lines
    flashport = None

try:  # FA3 (flash-attention's hopper/), built beside flashport for a same-run comparison
    import flash_attn_interface as fa3
except ImportError:
    fa3 = None

D = 128
HEADS = [(32, 8), (64, 8)]
BATCHES = [1, 8, 32, 128]
CONTEXTS = [1024, 8192, 32768, 131072]
LAYOUTS = ["dense", "paged16", "paged256"]
MAX_TOKENS = 1 << 21  # batch * context cap: 8 GiB of bf16 K+V at 8 kv heads x d 128
L2_ROTATE_BYTES = 256 << 20  # caches smaller than this are replicated and rotated so L2 cannot hold them
BEGIN, END = "<!-- gpu_decode_bench.py: begin -->", "<!-- gpu_decode_bench.py: end -->"


def make_case(b, ctx, hq, hk, layout, gen):
    """q (b, 1, hq, d) and the cache: dense (b, ctx, hk, d) or pages (b * ctx / page, page, hk, d) with
    a random block table (each sequence owns ctx / page pages in shuffled order)."""
    q = torch.randn(b, 1, hq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    if layout == "dense":
        k = torch.randn(b, ctx, hk, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        return q, k, v, None
    page = int(layout[5:])
    n_pages = b * ctx // page
    k = torch.randn(n_pages, page, hk, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    table = torch.randperm(n_pages, device="cuda", generator=gen).to(torch.int32).view(b, ctx // page)
    return q, k, v, table


def dense_view(k, table, b, ctx):
    """The (b, ctx, hk, d) cache a block table describes (for the correctness check)."""
    if table is None:
        return k
    return k[table.long()].reshape(b, ctx, k.shape[2], k.shape[3])


def parse_cells(text):
    """--cells: "BxCTX,..." as [(batch, context)], both positive, or an error naming the flag."""
    try:
        cells = [tuple(int(x) for x in c.split("x")) for c in text.split(",")]
    except ValueError:
        cells = []
    if not cells or any(len(c) != 2 or min(c) <= 0 for c in cells):
        raise argparse.ArgumentTypeError(f"--cells wants BATCHxCONTEXT[,...] with positive numbers, got {text!r}")
    return cells


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_gpu_decode.jsonl")
    ap.add_argument("--perf-md", action="store_true", help="rewrite the decode section of docs/PERF.md + PNG")
    ap.add_argument("--quick", action="store_true", help="a few cells only (smoke test)")
    ap.add_argument("--cells", metavar="BxCTX,...", type=parse_cells,
                    help="only these batch x context cells (e.g. 1x8192,128x1024)")
    ap.add_argument("--layouts", help=f"comma-separated subset of {','.join(LAYOUTS)}")
    ap.add_argument("--heads", help="comma-separated q/kv head pairs, e.g. 32/8")
    ap.add_argument("--no-peers", action="store_true", help="flashport only (A/B of its own settings)")
    ap.add_argument("--num-splits", type=int, default=0,
                    help="flashport's num_splits (0: its heuristic; for a split-count A/B)")
    ap.add_argument("--replot", metavar="JSONL", help="only redraw docs/perf_decode.png from an earlier --out file")
    args = ap.parse_args()
    if args.replot:
        rows = [json.loads(line) for line in open(args.replot)]
        plot(rows, rows[0]["device"], rows[0]["ceiling_gbs"], ["docs/perf_decode.png"])
        return 0
    dev = torch.cuda.get_device_name()
    _, copy_gbs = ceilings()
    print(f"device {dev}; copy ceiling {copy_gbs:.0f} GB/s", flush=True)
    batches, contexts = ([1, 32], [8192]) if args.quick else (BATCHES, CONTEXTS)
    shapes = [(b, ctx) for b in batches for ctx in contexts]
    if args.cells:
        shapes = args.cells
    layouts = args.layouts.split(",") if args.layouts else LAYOUTS
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")] if args.heads else HEADS
    cells = [(hq, hk, b, ctx, layout) for hq, hk in heads for layout in layouts for b, ctx in shapes
             if b * ctx <= MAX_TOKENS]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    out_file = open(args.out, "w")  # one line per cell as it completes: a cut-short run keeps what it measured
    for idx, (hq, hk, b, ctx, layout) in enumerate(cells):
        kv_bytes = 2 * b * ctx * hk * D * 2
        n_sets = max(1, min(8, -(-L2_ROTATE_BYTES // kv_bytes)))
        sets = [make_case(b, ctx, hq, hk, layout, gen) for _ in range(n_sets)]
        seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)

        # Correctness of the timed configuration, once, against PyTorch's math SDPA in fp32 on the first two
        # sequences (the math path expands K/V to every query head: the whole batch would not fit).
        q, k, v, table = sets[0]
        out = flashport.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table,
                                                 num_splits=args.num_splits)
        nb = min(b, 2)
        tb = None if table is None else table[:nb]
        kd, vd = dense_view(k[:nb] if tb is None else k, tb, nb, ctx), dense_view(v[:nb] if tb is None else v, tb, nb, ctx)
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(q[:nb].transpose(1, 2).float(), kd.transpose(1, 2).float(),
                                                 vd.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
        err = (out[:nb].float() - ref).abs().max().item()
        del kd, vd, ref

        turn = [0]

        def ours():
            q, k, v, table = sets[turn[0] % n_sets]
            turn[0] += 1
            return flashport.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table,
                                                     num_splits=args.num_splits)

        ms = time_ms(ours)
        peers = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            if layout != "dense" or args.no_peers:
                peers[name] = None
                continue
            views = [tuple(t.transpose(1, 2) for t in s[:3]) for s in sets]

            def peer(backend=backend, views=views):
                qt, kt, vt = views[turn[0] % n_sets]
                turn[0] += 1
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

            try:
                peers[name] = time_ms(peer)
            except Exception as e:  # a peer that cannot run this shape is reported missing
                print(f"  peer {name} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                peers[name] = None
        if fa3 is not None and not args.no_peers:  # checked against flashport's output on the first set, then timed
            def fa3_call():
                q, k, v, table = sets[turn[0] % n_sets]
                turn[0] += 1
                return fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table)

            try:
                q0, k0, v0, t0 = sets[0]
                fa3_err = (fa3.flash_attn_with_kvcache(q0, k0, v0, cache_seqlens=seqlens, page_table=t0).float()
                           - out.float()).abs().max().item()
                if fa3_err < 2e-2:
                    peers["fa3"] = time_ms(fa3_call)
                else:
                    print(f"  peer fa3 differs from flashport by {fa3_err:.2e}: not reported", flush=True)
                    peers["fa3"] = None
            except Exception as e:
                print(f"  peer fa3 unavailable: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                peers["fa3"] = None
        row = dict(backend="cuda", mode="decode", dtype="bf16", d=D, hq=hq, hk=hk, batch=b, context=ctx,
                   layout=layout, ms=ms, gbs=kv_bytes / ms / 1e6, ceiling_gbs=copy_gbs, max_err=err,
                   pass_=err < 2e-2, device=dev,
                   peer_gbs={n: (kv_bytes / p / 1e6 if p else None) for n, p in peers.items()})
        row["pass"] = row.pop("pass_")
        rows.append(row)
        out_file.write(json.dumps(row) + "\n")
        out_file.flush()
        peer_txt = " ".join(f"{n}={g:.0f}" if g else f"{n}=-" for n, g in row["peer_gbs"].items())
        print(f"[{idx + 1}/{len(cells)}] {hq}/{hk} b={b} ctx={ctx} {layout}: {row['gbs']:.0f} GB/s "
              f"({row['gbs'] / copy_gbs:.0%} of copy) | {peer_txt} | err {err:.1e}", flush=True)
        del sets, q, k, v, table, out
        torch.cuda.empty_cache()
    out_file.close()
    if args.perf_md:
        write_perf_md(rows, dev, copy_gbs)
    print(f"results: {os.path.abspath(args.out)}")


def write_perf_md(rows, dev, copy_gbs):
    lines = [f"### Decode\n\n{dev}, torch {torch.__version__}, commit {os.environ.get('FLASHPORT_COMMIT', 'n/a')}. "
             f"Command: `python3 bench/gpu_decode_bench.py --perf-md`. One query token per sequence, bf16, d 128, "
             f"every sequence at the full context; GB/s = K and V bytes read / median time; copy ceiling "
             f"{copy_gbs:.0f} GB/s in the same run. Peers: PyTorch SDPA on the dense cache (enable_gqa); FA3's "
             f"flash_attn_with_kvcache where built (`-`: not run).", "",
             "| heads q/kv | layout | batch | context | flashport GB/s | % copy | cuDNN | FA2 | FA3 | "
             "flashport / best peer | pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: f"{x:.0f}" if x else "-"
    for r in rows:
        best = max([g for g in r["peer_gbs"].values() if g] or [0])
        ratio = f"{r['gbs'] / best:.2f}x" if best else "-"
        lines.append(f"| {r['hq']}/{r['hk']} | {r['layout']} | {r['batch']} | {r['context']} | {r['gbs']:.0f} | "
                     f"{r['gbs'] / copy_gbs:.0%} | {fmt(r['peer_gbs'].get('cudnn'))} | {fmt(r['peer_gbs'].get('fa2'))} "
                     f"| {fmt(r['peer_gbs'].get('fa3'))} | {ratio} | {'yes' if r['pass'] else 'NO'} |")
    block = "\n".join(lines) + "\n\n![decode GB/s vs context](perf_decode.png)"
    old = open("docs/PERF.md").read() if os.path.exists("docs/PERF.md") else ""
    text = splice_perf_md(old, block, BEGIN, END)
    with open("docs/PERF.md", "w") as f:
        f.write(text)
    paths = ["docs/perf_decode.png"]
    if os.environ.get("OUT"):  # the device tool returns $OUT only
        with open(os.path.join(os.environ["OUT"], "PERF.md"), "w") as f:
            f.write(text)
        paths.append(os.path.join(os.environ["OUT"], "perf_decode.png"))
    plot(rows, dev, copy_gbs, paths)


def plot(rows, dev, copy_gbs, paths):
    """GB/s vs context, one panel per (heads, layout), one line per batch; dashed, the best peer of that cell
    (the fastest of cuDNN, FA2 and FA3 that ran: what the issue's bar compares against); the copy ceiling
    dotted grey."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    heads = sorted({(r["hq"], r["hk"]) for r in rows})
    layouts = [l for l in LAYOUTS if any(r["layout"] == l for r in rows)]
    fig, axes = plt.subplots(len(heads), len(layouts), figsize=(4.2 * len(layouts), 3.4 * len(heads)),
                             squeeze=False, sharey=True)
    for i, hh in enumerate(heads):
        for j, layout in enumerate(layouts):
            ax = axes[i, j]
            for b in sorted({r["batch"] for r in rows}):
                pts = sorted((r["context"], r["gbs"]) for r in rows
                             if (r["hq"], r["hk"]) == hh and r["layout"] == layout and r["batch"] == b)
                if not pts:
                    continue
                line, = ax.plot(*zip(*pts), marker="o", label=f"batch {b}")
                peer = sorted((r["context"], max((g for g in r["peer_gbs"].values() if g), default=None))
                              for r in rows
                              if (r["hq"], r["hk"]) == hh and r["layout"] == layout and r["batch"] == b)
                if any(g for _, g in peer):
                    ax.plot([c for c, _ in peer], [g if g else float("nan") for _, g in peer], "--", marker="x",
                            color=line.get_color(), alpha=0.6, label=f"best peer, batch {b}")
            ax.axhline(copy_gbs, color="gray", linestyle=":", linewidth=1, label="copy ceiling")
            style_panel(ax, f"{hh[0]}/{hh[1]} heads, {layout}", "context" if i == len(heads) - 1 else None,
                        "GB/s of K/V read" if j == 0 else None)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"decode, bf16, d 128, {dev}")
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
