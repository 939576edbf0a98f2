#!/usr/bin/env python3
"""Peak GPU memory of one attention forward + backward vs sequence length: flashport vs PyTorch SDPA's flash,
cuDNN and math backends (batch 1, 16 heads, d 64, causal, bf16 by default).

Counted: what the call adds on top of its inputs (q, k, v and dout are allocated before the measurement).
That is torch.cuda.max_memory_allocated() minus the memory allocated before the call, plus the high-water
mark of the device's stream-ordered pool, where flashport's kernels take their scratch (cuMemAllocAsync:
the dQ accumulator, softmax statistics), which torch's allocator never sees. Every implementation needs
at least out + dq + dk + dv (four tensors of the input's size); that floor is drawn dashed. The math backend
materialises the (b, h, s, s) scores and probabilities, runs out of memory at long lengths, and is recorded
as OOM there.

    python3 bench/memory_bench.py                          # docs/perf_memory.png, bench_memory.jsonl, table
    python3 bench/memory_bench.py --seqlens 1024,2048,4096,8192,16384,32768
    python3 bench/memory_bench.py --replot bench_memory.jsonl   # redraw only (no GPU needed)
"""
import argparse
import ctypes
import gc
import json
import os
import shutil
import sys

IMPLS = ("flashport", "sdpa-flash", "sdpa-cudnn", "sdpa-math")
LABELS = {"flashport": "flashport", "sdpa-flash": "SDPA flash", "sdpa-cudnn": "SDPA cuDNN", "sdpa-math": "SDPA math"}
MIB = 2**20


class AsyncPoolHighWater:
    """Used-memory high-water mark of the device's current memory pool (the one cuMemAllocAsync draws from),
    through the driver API. torch's caching allocator uses cudaMalloc, not this pool, so the mark holds
    flashport's scratch alone. `high_mib()` is None when the driver API cannot be reached."""

    USED_MEM_HIGH = 8  # CU_MEMPOOL_ATTR_USED_MEM_HIGH (cuuint64_t; setting it to 0 resets it)

    def __init__(self, device_index: int):
        self.lib = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            dev, self.pool = ctypes.c_int(), ctypes.c_void_p()
            if (lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), device_index)
                    or lib.cuDeviceGetMemPool(ctypes.byref(self.pool), dev)):
                raise OSError("a driver call failed")
            self.lib = lib
        except (OSError, AttributeError) as e:
            print(f"note: no driver memory-pool statistics ({e}); flashport's scratch is not counted")

    def reset(self):
        if self.lib:
            zero = ctypes.c_uint64(0)
            self.lib.cuMemPoolSetAttribute(self.pool, self.USED_MEM_HIGH, ctypes.byref(zero))

    def high_mib(self):
        if not self.lib:
            return None
        value = ctypes.c_uint64(0)
        if self.lib.cuMemPoolGetAttribute(self.pool, self.USED_MEM_HIGH, ctypes.byref(value)):
            return None
        return value.value / MIB


def attention(impl):
    """(q, k, v) -> out, each in the implementation's native layout: flashport (b, s, h, d), SDPA (b, h, s, d)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "flashport":
        import flashport

        return lambda q, k, v: flashport.flash_attn_func(q, k, v, causal=True)
    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa-math": SDPBackend.MATH}[impl]

    def run(q, k, v):
        with sdpa_kernel([backend]):  # this backend only: SDPA raises instead of falling back
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def measure(impl, s, args, pool):
    """One row: the memory one forward + backward adds, or status "oom" / "unavailable"."""
    import torch

    b, h, d = args.batch, args.heads, args.dim
    shape = (b, s, h, d) if impl == "flashport" else (b, h, s, d)
    row = dict(impl=impl, seqlen=s, batch=b, heads=h, dim=d, dtype="bf16", causal=True,
               floor_mib=4 * b * s * h * d * 2 / MIB)  # out, dq, dk, dv
    gc.collect()
    torch.cuda.empty_cache()
    try:
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        pool.reset()
        base = torch.cuda.memory_allocated()
        out = attention(impl)(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        torch_mib = (torch.cuda.max_memory_allocated() - base) / MIB
        scratch = pool.high_mib()
        row.update(status="ok", torch_mib=torch_mib, scratch_mib=scratch, extra_mib=torch_mib + (scratch or 0.0))
        del out, grads
    except torch.OutOfMemoryError:
        row.update(status="oom")
    except RuntimeError as e:  # e.g. "No available kernel" when a backend does not cover the shape
        row.update(status="unavailable", error=str(e).splitlines()[0][:200])
    gc.collect()
    torch.cuda.empty_cache()  # an OOM leaves the cache full; the next row starts from an empty one
    return row


def cell(row):
    if row is None:
        return "-"
    if row["status"] != "ok":
        return row["status"].upper() if row["status"] == "oom" else "n/a"
    return f"{row['extra_mib']:,.0f}"


def table(rows):
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    by = {(r["impl"], r["seqlen"]): r for r in rows}
    lines = ["| seqlen | " + " | ".join(LABELS[i] for i in impls) + " | floor (out + grads) |",
             "|---" * (len(impls) + 2) + "|"]
    for s in sorted({r["seqlen"] for r in rows}):
        floor = next(r["floor_mib"] for r in rows if r["seqlen"] == s)
        lines.append(f"| {s} | " + " | ".join(cell(by.get((i, s))) for i in impls) + f" | {floor:,.0f} |")
    r0 = rows[0]
    return (f"Extra GPU memory (MiB) of forward + backward, batch {r0['batch']}, {r0['heads']} heads, d {r0['dim']}, "
            f"causal, {r0['dtype']}; {r0.get('device', '')}\n\n" + "\n".join(lines))


def plot(rows, paths):
    """MiB vs seqlen, log-log; an OOM marked where the line stops."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_bench import style_panel

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    colours = {"flashport": "tab:blue", "sdpa-cudnn": "tab:orange", "sdpa-flash": "tab:green", "sdpa-math": "tab:red"}
    markers = {"flashport": "o", "sdpa-cudnn": "x", "sdpa-flash": "+", "sdpa-math": "s"}  # gpu_bench's, plus math
    for impl in IMPLS:
        pts = sorted((r["seqlen"], r) for r in rows if r["impl"] == impl)
        ok = [(s, r["extra_mib"]) for s, r in pts if r["status"] == "ok"]
        if ok:
            ax.plot(*zip(*ok), marker=markers[impl], color=colours[impl], label=LABELS[impl])
        for s, r in pts:
            if r["status"] == "oom":
                y = ok[-1][1] if ok else 1.0
                ax.plot([s], [y], marker="X", markersize=9, color=colours[impl], linestyle="none")
                ax.annotate("OOM", (s, y), textcoords="offset points", xytext=(0, -16), ha="center",
                            color=colours[impl], fontsize=8)
                break
    floor = sorted({(r["seqlen"], r["floor_mib"]) for r in rows})
    ax.plot(*zip(*floor), "--", color="gray", linewidth=1, label="out + dq + dk + dv")
    r0 = rows[0]
    style_panel(ax, f"forward + backward, b {r0['batch']}, {r0['heads']} heads, d {r0['dim']}, causal, {r0['dtype']}",
                "seqlen", "extra GPU memory (MiB)")
    ax.set_yscale("log")  # after style_panel, whose linear y starts at 0
    ax.autoscale(enable=True, axis="y")
    ax.legend(fontsize=8)
    if r0.get("device"):
        fig.suptitle(r0["device"], fontsize=9)
    fig.tight_layout()
    for path in paths:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
        print(os.path.abspath(path))


def outputs(args):
    """The PNG, plus a copy under $OUT where the device tool collects results."""
    return [args.png] + ([os.path.join(os.environ["OUT"], os.path.basename(args.png))] if os.environ.get("OUT") else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--out", default="bench_memory.jsonl", help="JSON lines, one per (impl, seqlen)")
    ap.add_argument("--png", default="docs/perf_memory.png")
    ap.add_argument("--replot", metavar="JSONL", help="only redraw the plot and table from an earlier --out file")
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        print(table(rows))
        plot(rows, outputs(args))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("memory_bench.py measures GPU memory and needs a CUDA device (torch.cuda.is_available() is False); "
              "--replot redraws an earlier result without one", file=sys.stderr)
        return 2
    impls = args.impls.split(",")
    unknown = set(impls) - set(IMPLS)
    if unknown:
        ap.error(f"--impls: unknown {sorted(unknown)}; choose from {list(IMPLS)}")
    dev = torch.cuda.get_device_name()
    pool = AsyncPoolHighWater(torch.cuda.current_device())
    for impl in impls:  # one-time allocations (kernel JIT, cuBLAS workspace) before anything is measured
        measure(impl, 256, args, pool)
    rows = []
    for s in [int(x) for x in args.seqlens.split(",")]:
        for impl in impls:
            row = measure(impl, s, args, pool)
            row["device"] = dev
            rows.append(row)
            detail = (f"{row['extra_mib']:,.1f} MiB (torch {row['torch_mib']:,.1f}, scratch "
                      f"{row['scratch_mib'] if row['scratch_mib'] is None else round(row['scratch_mib'], 1)})"
                      if row["status"] == "ok" else row["status"] + (f": {row['error']}" if "error" in row else ""))
            print(f"s={s:6d} {impl:11s} {detail}", flush=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    if os.environ.get("OUT"):
        dst = os.path.join(os.environ["OUT"], os.path.basename(args.out))
        if not os.path.exists(dst) or not os.path.samefile(args.out, dst):
            shutil.copy(args.out, dst)
    print()
    print(table(rows))
    plot(rows, outputs(args))
    print(f"results: {os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
