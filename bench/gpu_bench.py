#!/usr/bin/env python3
"""GPU benchmark: the standard grid of shared/BENCH.md, flashport vs PyTorch SDPA (cuDNN, flash) in one run,
and FA3 (flash-attention's hopper/, `flash_attn_interface`) with `--peers ...,fa3` where it imports.

Modes: fwd, bwd (bf16), and fp8_fwd: the same inputs quantised to e4m3 with unit descales per (batch, kv
head), flashport against FA3's fp8 forward (SDPA has none), checked against cuDNN's bf16 attention of the
dequantised inputs. Writes one JSON line per (impl row) with the keys of the CPU benchmark, prints a table,
the cuBLAS and copy ceilings, and (with --perf-md) rewrites docs/PERF.md plus a PNG plot.
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
    return f * {"fwd": 1.0, "fp8_fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]


def fa3_module():
    """flash_attn_interface (FA3) or None; imported once."""
    if not hasattr(fa3_module, "mod"):
        try:
            import flash_attn_interface
            fa3_module.mod = flash_attn_interface
        except ImportError:
            fa3_module.mod = None
    return fa3_module.mod


def fp8_inputs(q, k, v):
    """q, k, v as e4m3 with unit (batch, kv head) descales."""
    q8, k8, v8 = (t.detach().to(torch.float8_e4m3fn) for t in (q, k, v))
    ones = torch.ones(q.shape[0], k.shape[2], device=q.device, dtype=torch.float32)
    return q8, k8, v8, dict(q_descale=ones, k_descale=ones, v_descale=ones)


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
    if mode == "fp8_fwd":
        if name not in ("flashport", "fa3") or (name == "fa3" and fa3_module() is None):
            return None
        q8, k8, v8, ds = fp8_inputs(q, k, v)
        lib = flashport if name == "flashport" else fa3_module()
        return lambda: lib.flash_attn_func(q8, k8, v8, causal=causal, **ds)
    if name == "flashport":
        fwd = lambda: flashport.flash_attn_func(q, k, v, causal=causal)
    elif name == "fa3":
        if fa3_module() is None:
            return None

        def fwd():
            out = fa3_module().flash_attn_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out
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
    ap.add_argument("--modes", default="fwd,bwd", help="comma list of fwd, bwd, fp8_fwd")
    ap.add_argument("--peers", default="cudnn,fa2",
                    help="comma list of cudnn, fa2, fa3 (where flash_attn_interface imports); 'none' times flashport alone")
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
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=(mode not in ("fwd", "fp8_fwd")))
                   for _ in range(3))
        # Correctness of the timed configuration, once, against cuDNN. fp8: against cuDNN's bf16 attention
        # of the dequantised inputs, relative to its largest output (e4m3 probabilities: a few per cent).
        with torch.no_grad():
            if mode == "fp8_fwd":
                q8, k8, v8, ds = fp8_inputs(q, k, v)
                ins, ours = (q8.bfloat16(), k8.bfloat16(), v8.bfloat16()), flashport.flash_attn_func(
                    q8, k8, v8, causal=causal, **ds)
                del q8, k8, v8, ds
            else:
                ins, ours = (q, k, v), flashport.flash_attn_func(q, k, v, causal=causal)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in ins), is_causal=causal).transpose(1, 2)
            err = (ours.float() - ref.float()).abs().max().item()
            if mode == "fp8_fwd":
                err /= ref.float().abs().max().item()
            del ins
        ok = err < (5e-2 if mode == "fp8_fwd" else 2e-2)
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
                fn = run_impl(peer, q, k, v, causal, mode) if peer else None
                pms = time_ms(fn) if fn else None
            except Exception as e:  # a peer that cannot run this shape is reported missing
                print(f"  peer {peer} unavailable for d={d} s={s}: {type(e).__name__}", flush=True)
                pms = None
            peer_name = ("fa3" if peer == "fa3" else f"torch-sdpa-{peer}") if peer else None
            row = dict(backend="cuda", peer=peer_name, dtype="e4m3" if mode == "fp8_fwd" else "bf16", d=d, sq=s,
                       sk=s, causal=causal,
                       mode=mode, pass_=ok, max_err=err, ms=ms, tflops=fl / ms / 1e9,
                       peer_ms=pms, peer_tflops=(fl / pms / 1e9) if pms else None, device=dev,
                       ceiling_tflops=mm_tflops)
            row["pass"] = row.pop("pass_")
            rows.append(row)
        r = rows[-1]
        short = lambda x: x["peer"].replace("torch-sdpa-", "")
        peers = " ".join(f"{short(x)}={x['peer_tflops']:.0f}" if x["peer_tflops"] else f"{short(x)}=-"
                         for x in rows[-len(peer_names):]) if peer_names else ""
        what = {"bwd": "grad rel", "fp8_fwd": "out rel"}.get(mode, "out")
        print(f"[{idx + 1}/{len(configs)}] {mode} d={d} s={s} causal={int(causal)}: flashport "
              f"{r['tflops']:.0f} TFLOPS ({r['tflops'] / mm_tflops:.0%} of cuBLAS) | {peers} | {what} err {err:.1e}",
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
             f"--perf-md`). bf16 (fp8_fwd: e4m3, unit descales), batch*seqlen = 16384, nheads*d = 2048. TFLOPS by SPEC.md's FLOP model; median "
             f"of triton do_bench. Ceilings in the same run: cuBLAS bf16 8192^3 {mm_tflops:.0f} TFLOPS, copy "
             f"{copy_gbs:.0f} GB/s.", "",
             "| mode | d | causal | seqlen | flashport | % cuBLAS | cuDNN | FA2 | FA3 | vs cuDNN | vs FA2 | vs FA3 | pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["mode"], r["d"], r["causal"], r["sq"]), {})[r["peer"]] = r
    for (mode, d, causal, s), peers in sorted(by.items()):
        r = next(iter(peers.values()))
        cu, fa, f3 = peers.get("torch-sdpa-cudnn", {}), peers.get("torch-sdpa-fa2", {}), peers.get("fa3", {})
        fmt = lambda x: f"{x:.0f}" if x else "-"
        ratio = lambda x: f"{r['tflops'] / x:.2f}x" if x else "-"
        lines.append(f"| {mode} | {d} | {int(causal)} | {s} | {r['tflops']:.0f} | {r['tflops'] / mm_tflops:.0%} | "
                     f"{fmt(cu.get('peer_tflops'))} | {fmt(fa.get('peer_tflops'))} | {fmt(f3.get('peer_tflops'))} | "
                     f"{ratio(cu.get('peer_tflops'))} | {ratio(fa.get('peer_tflops'))} | {ratio(f3.get('peer_tflops'))} | "
                     f"{'yes' if r['pass'] else 'NO'} |")
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
             ("torch-sdpa-fa2", "FA2", "tab:green", "+"), ("fa3", "FA3", "tab:red", "^")]
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
