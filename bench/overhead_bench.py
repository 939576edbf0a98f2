"""Per-call wall time of small attention calls through Python, the way users call them: flashport against
PyTorch SDPA (flash, cuDNN) and FA3 / flash-attn when importable, in one process.

Small problems are host-bound, so the time per call is what the Python and C++ layers cost around the
kernel. Each row: `--warmup` calls, then `--calls` back-to-back calls between two synchronisations, wall
time / calls (median, or with `--stat min` minimum, of `--repeats` such runs). `--perf-md` rewrites this
script's section of docs/PERF.md.
On a machine without CUDA it times the CPU path, the dense rows with tiny shapes (s 4, 2 heads, so that
they are host-bound there too), for comparing revisions there.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashport  # noqa: E402

BEGIN, END = "<!-- overhead_bench.py: begin -->", "<!-- overhead_bench.py: end -->"
SDPA = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-math": SDPBackend.MATH}


def peer_modules():
    """FA3 (flash_attn_interface) and flash-attn 2 when importable: {name: flash_attn_func-like module}."""
    found = {}
    for name, module in (("fa3", "flash_attn_interface"), ("flash-attn", "flash_attn")):
        try:
            found[name] = __import__(module)
        except Exception:  # not installed, or built for another torch
            pass
    return found


def wall_us(fn, device, warmup, calls, repeats, stat=statistics.median):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return stat(runs)


def dense_inputs(device, dtype, grad, b=1, s=128, h=16, d=64):
    if device != "cuda":  # tiny on the CPU, where the kernels would otherwise dominate
        s, h = 4, 2
    make = lambda: torch.randn(b, s, h, d, device=device, dtype=dtype, requires_grad=grad)
    return make(), make(), make()


def sdpa_call(backend, q, k, v, causal, **kw):
    """SDPA on flash-attn's (b, s, h, d) layout, as a model using SDPA would call it (transposed views)."""
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal, **kw).transpose(1, 2)


def train_rows(device, dtype, sdpa_names, peers):
    """forward + backward per impl; its own scope, so the closures keep these inputs (with grad)."""
    q, k, v = dense_inputs(device, dtype, True)
    g = torch.randn_like(q)

    def train_step(attn):
        def step():
            attn().backward(g)
        return step

    impls = {"flashport": train_step(lambda: flashport.flash_attn_func(q, k, v, causal=True))}
    for n in sdpa_names:
        impls[n] = train_step(lambda n=n: sdpa_call(SDPA[n], q, k, v, True))
    for n, m in peers.items():
        impls[n] = train_step(lambda m=m: m.flash_attn_func(q, k, v, causal=True))
    return impls


def rows_for(device, dtype, peers):
    """(row name, {impl: callable}) for every row of the table."""
    on_gpu = device == "cuda"
    sdpa_names = ["sdpa-flash", "sdpa-cudnn"] if on_gpu else ["sdpa-math"]
    rows = []

    def forward_row(name, grad):
        q, k, v = dense_inputs(device, dtype, grad)
        impls = {"flashport": lambda: flashport.flash_attn_func(q, k, v, causal=True)}
        for n in sdpa_names:
            impls[n] = lambda n=n: sdpa_call(SDPA[n], q, k, v, True)
        for n, m in peers.items():
            impls[n] = lambda m=m: m.flash_attn_func(q, k, v, causal=True)
        rows.append((name, impls))

    forward_row("forward, inputs without grad", False)
    forward_row("forward, inputs with requires_grad", True)

    rows.append(("forward + backward", train_rows(device, dtype, sdpa_names, peers)))

    # Varlen: 8 sequences of 128 tokens, with grad (flash-attn's varlen entry; SDPA has no varlen call).
    total, h, d = 8 * 128, 16, 64
    qv, kv_, vv = (torch.randn(total, h, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    cu = torch.arange(0, total + 1, 128, device=device, dtype=torch.int32)
    impls = {"flashport": lambda: flashport.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 128, 128, causal=True)}
    for n, m in peers.items():
        impls[n] = lambda m=m: m.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 128, 128, causal=True)
    rows.append(("varlen forward, 8 x 128 tokens, with grad", impls))

    # Decode: batch 1, one new token, 1k cache, GQA 32/8, d 128.
    ctx = 1024
    qd = torch.randn(1, 1, 32, 128, device=device, dtype=dtype)
    kc, vc = (torch.randn(1, ctx, 8, 128, device=device, dtype=dtype) for _ in range(2))
    seqlens = torch.full((1,), ctx, device=device, dtype=torch.int32)
    impls = {"flashport": lambda: flashport.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, causal=True)}
    qt, kt, vt = qd.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    for n in sdpa_names:
        def decode(n=n):
            with sdpa_kernel(SDPA[n]):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        impls[n] = decode
    for n, m in peers.items():
        if hasattr(m, "flash_attn_with_kvcache"):
            impls[n] = lambda m=m: m.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, causal=True)
    rows.append(("flash_attn_with_kvcache, batch 1, 1k cache, GQA 32/8, d 128", impls))

    # Compiled: the graph calls flashport's registered op on every run (SDPA: its aten op).
    peer = sdpa_names[0]
    compiled = torch.compile(lambda q, k, v: flashport.flash_attn_func(q, k, v, causal=True), fullgraph=True)
    compiled_sdpa = torch.compile(lambda q, k, v: sdpa_call(SDPA[peer], q, k, v, True), fullgraph=True)
    qc, kc_, vc_ = dense_inputs(device, dtype, False)
    rows.append(("torch.compile(fullgraph=True) forward",
                 {"flashport": lambda: compiled(qc, kc_, vc_), peer: lambda: compiled_sdpa(qc, kc_, vc_)}))
    qg, kg, vg = dense_inputs(device, dtype, True)
    g = torch.randn_like(qg)
    rows.append(("torch.compile(fullgraph=True) forward, inputs with requires_grad",
                 {"flashport": lambda: compiled(qg, kg, vg), peer: lambda: compiled_sdpa(qg, kg, vg)}))
    rows.append(("torch.compile(fullgraph=True) forward + backward",
                 {"flashport": lambda: compiled(qg, kg, vg).backward(g),
                  peer: lambda: compiled_sdpa(qg, kg, vg).backward(g)}))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="overhead_bench.jsonl", help="JSON lines, one per (row, impl)")
    parser.add_argument("--perf-md", action="store_true", help="rewrite this script's section of docs/PERF.md")
    parser.add_argument("--rows", default="", help="time only the rows whose name contains this (e.g. torch.compile)")
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="of the repeats; min is steadier on a loaded machine (shared CPU cores)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    peers = peer_modules() if device == "cuda" else {}
    dev = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{dev}, torch {torch.__version__}, flashport {flashport.__version__}, peers: "
          f"{', '.join(peers) or 'none importable'}", flush=True)
    results = []
    for name, impls in rows_for(device, dtype, peers):
        if args.rows not in name:
            continue
        times = {}
        for impl, fn in impls.items():
            try:
                times[impl] = wall_us(fn, device, args.warmup, args.calls, args.repeats,
                                      min if args.stat == "min" else statistics.median)
            except Exception as e:  # a peer without this feature or backend on this GPU
                print(f"  {name}: {impl} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        ratio = ratio_to_sdpa(times)
        print(f"{name}: " + ", ".join(f"{n} {t:.1f} us" for n, t in times.items()) +
              (f"  (flashport / best SDPA {ratio:.2f})" if ratio else ""), flush=True)
        for impl, t in times.items():
            results.append({"row": name, "impl": impl, "us": t, "device": dev, "torch": torch.__version__})
    with open(args.out, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    table = markdown(results)
    print("\n" + table)
    if args.perf_md:
        write_perf_md(table, dev, args)


def ratio_to_sdpa(times):
    """flashport's time over the best SDPA backend's in one row, or None where either is missing."""
    sdpa = [t for n, t in times.items() if n.startswith("sdpa")]
    return times["flashport"] / min(sdpa) if sdpa and "flashport" in times else None


def markdown(results):
    impls = []
    for r in results:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    rows = {}
    for r in results:
        rows.setdefault(r["row"], {})[r["impl"]] = r["us"]
    lines = ["| call | " + " | ".join(impls) + " | flashport / best SDPA |",
             "|---" * (len(impls) + 2) + "|"]
    for row, times in rows.items():
        ratio = f"{ratio_to_sdpa(times):.2f}" if ratio_to_sdpa(times) else "-"
        cells = [f"{times[i]:.1f}" if i in times else "-" for i in impls]
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def write_perf_md(table, dev, args):
    from gpu_bench import splice_perf_md

    block = (f"### Per-call overhead (small calls through Python)\n\n{dev}, torch {torch.__version__}, commit "
             f"{os.environ.get('FLASHPORT_COMMIT', 'n/a')}. Command: `python3 bench/overhead_bench.py --perf-md`. "
             f"Wall time per call in microseconds ({args.calls} back-to-back calls between two synchronisations, "
             f"{args.stat} of {args.repeats}): b 1, s 128, 16 heads, d 64, causal, bf16 unless the row says "
             "otherwise.\n\n" + table)
    old = open("docs/PERF.md").read() if os.path.exists("docs/PERF.md") else ""
    text = splice_perf_md(old, block, BEGIN, END)
    with open("docs/PERF.md", "w") as f:
        f.write(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "PERF.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
