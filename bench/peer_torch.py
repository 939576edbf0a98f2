#!/usr/bin/env python3
"""Peer timings for flashport_bench: PyTorch's CPU scaled_dot_product_attention on the same shapes.

Reads the JSON lines flashport_bench wrote, times torch.nn.functional.scaled_dot_product_attention on
the CPU for every row (layout (b, h, s, d), same dtype, is_causal, fresh random normal inputs, the
row's thread count, warm-up then the median of --reps), fills peer / peer_ms / peer_tflops, prints a
table with the flashport/torch ratio and writes the merged JSON lines to a file whose path it prints
last. Without an importable torch it says so and leaves the peer fields null.

On a shared machine the load drifts between the driver's run and this one, so by default each row is
timed in --rounds alternating rounds: torch, then the row re-run through the driver that wrote it
(its "driver" and "rerun" fields), and so on; both sides report the median over rounds, and the row's
ms/tflops are replaced by the interleaved figure (ms_first keeps the driver's original). --rounds 0
times torch once and keeps the driver's numbers.

Decode rows (flashport_bench --decode, "mode": "decode") time SDPA with one query token per sequence,
q (b, hq, 1, d) and the full caches k/v (b, hk, context, d) with enable_gqa=True (no mask: the one token
sees every key), and print their own table (milliseconds, speed-up, GB/s of K and V read).

Usage: python3 bench/peer_torch.py build/bench_flashport.jsonl [--out merged.jsonl] [--reps 5] [--rounds 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PEER = "torch-sdpa-cpu"


def load_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def time_torch(torch, row, reps):
    """Median milliseconds of one SDPA call (forward, or forward + backward) on the row's shape."""
    import torch.nn.functional as F

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[row["dtype"]]
    if row.get("mode") == "decode":
        return time_torch_decode(torch, row, reps, dtype)
    b, h, s, d = row["b"], row["hq"], row["sq"], row["d"]
    backward = row.get("mode", "fwd") == "fwd+bwd"
    torch.set_num_threads(int(row.get("threads") or torch.get_num_threads()))
    q, k, v = (torch.randn(b, h, s, d, dtype=dtype, requires_grad=backward) for _ in range(3))
    dout = torch.randn(b, h, s, d, dtype=dtype) if backward else None

    def step():
        if backward:
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"]).backward(dout)
        else:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"])

    step()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_torch_decode(torch, row, reps, dtype):
    """Median milliseconds of SDPA decoding one token per sequence against full (b, hk, sk, d) caches."""
    import torch.nn.functional as F

    b, hq, hk, sk, d = row["b"], row["hq"], row["hk"], row["sk"], row["d"]
    torch.set_num_threads(int(row.get("threads") or torch.get_num_threads()))
    q = torch.randn(b, hq, 1, d, dtype=dtype)
    k, v = (torch.randn(b, hk, sk, d, dtype=dtype) for _ in range(2))
    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rerun_flashport(row):
    """Median ms of the row re-timed by its driver, or None when the driver cannot be run."""
    driver, args = row.get("driver"), row.get("rerun")
    if not driver or not args or not os.access(driver, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as tmp:
        env = dict(os.environ, OMP_NUM_THREADS=str(row.get("threads") or os.cpu_count()))
        done = subprocess.run([driver, *args, "--out", tmp.name], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            return None
        fresh = load_rows(tmp.name)
    return fresh[0]["ms"] if fresh else None


def print_decode_table(rows):
    print()
    print("| dtype | batch | context | page | flashport ms | torch ms | torch/flashport | flashport GB/s | isa | pass |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer = r.get("peer_ms")
        gbs = r["gbs"] * r.get("ms_first", r["ms"]) / r["ms"]  # the interleaved median's GB/s
        peer_s, ratio = (f"{peer:.2f}", f"{peer / r['ms']:.2f}") if peer else ("missing", "-")
        print(f"| {r['dtype']} | {r['b']} | {r['sk']} | {r.get('page') or '-'} | {r['ms']:.2f} | {peer_s} | {ratio} | "
              f"{gbs:.1f} | {r.get('isa', '-')} | {'yes' if r['pass'] else 'NO'} |")
    print()


def print_table(rows):
    decode = [r for r in rows if r.get("mode") == "decode"]
    if decode:
        print_decode_table(decode)
    rows = [r for r in rows if r.get("mode") != "decode"]
    if not rows:
        return
    print()
    print("| mode | dtype | d | causal | seqlen | flashport GFLOPS | torch GFLOPS | flashport/torch | isa | pass |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ours = r["tflops"] * 1e3
        peer = r["peer_tflops"] * 1e3 if r.get("peer_tflops") else None
        ratio = f"{ours / peer:.2f}" if peer else "-"
        peer_s = f"{peer:.1f}" if peer else "missing"
        print(f"| {r.get('mode', 'fwd')} | {r['dtype']} | {r['d']} | {int(r['causal'])} | {r['sq']} | {ours:.1f} | "
              f"{peer_s} | {ratio} | {r.get('isa', '-')} | {'yes' if r['pass'] else 'NO'} |")
    print()


# FLASHPORT_CPU_ISA caps flashport's kernels; these cap torch the same way, so a forced-AVX2 run on an
# AVX-512 machine compares like with like. ATEN_CPU_CAPABILITY alone is not enough: SDPA's GEMMs go to
# MKL (fp32) and oneDNN (bf16), which pick their own ISA from CPUID (measured here, one thread, fp32
# d 64: 57-62 GFLOPS with ATen capped, 46 with MKL and oneDNN capped too).
TORCH_ISA_CAPS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
               "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
}


def cap_torch_isa():
    """Before torch is imported: give torch the ISA cap FLASHPORT_CPU_ISA gives flashport (unset caps only)."""
    caps = TORCH_ISA_CAPS.get(os.environ.get("FLASHPORT_CPU_ISA", "").lower(), {})
    for name, value in caps.items():
        os.environ.setdefault(name, value)
    if caps:
        print("peer_torch: torch capped like flashport: "
              + " ".join(f"{n}={os.environ[n]}" for n in caps), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl", help="flashport_bench output (JSON lines)")
    ap.add_argument("--out", help="merged JSON lines (default: <input stem>_vs_torch.jsonl)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="alternating torch / flashport rounds per row")
    args = ap.parse_args()

    rows = load_rows(args.jsonl)
    cap_torch_isa()
    try:
        import torch
    except ImportError as e:
        torch = None
        print(f"peer_torch: torch is not importable ({e}); peer fields stay null", flush=True)

    if torch is not None:
        print(f"peer_torch: torch {torch.__version__}, CPU SDPA, {len(rows)} rows, median of {args.reps}", flush=True)
        for n, r in enumerate(rows):
            ours, peers = [r["ms"]], []
            try:
                for _ in range(max(1, args.rounds)):
                    peers.append(time_torch(torch, r, args.reps))
                    again = rerun_flashport(r) if args.rounds > 0 else None
                    if again is not None:
                        ours.append(again)
            except Exception as e:  # a shape or dtype the peer cannot run is reported missing
                print(f"[{n + 1}/{len(rows)}] torch could not run {r.get('mode')} {r['dtype']} d={r['d']} "
                      f"s={r['sq']}: {type(e).__name__}: {e}", flush=True)
                continue
            if len(ours) > 1:
                flops = r["tflops"] * r["ms"]
                r["ms_first"], r["ms"] = r["ms"], statistics.median(ours)
                r["tflops"], r["interleaved_rounds"] = flops / r["ms"], len(ours) - 1
            ms = statistics.median(peers)
            r["peer"], r["peer_ms"] = PEER, ms
            r["peer_tflops"] = r["tflops"] * r["ms"] / ms  # same FLOP count as the flashport row
            shape = (f"b={r['b']:<2d} ctx={r['sk']:<6d}" if r.get("mode") == "decode" else
                     f"s={r['sq']:<5d} causal={int(r['causal'])}")
            print(f"[{n + 1}/{len(rows)}] {r.get('mode', 'fwd'):7s} {r['dtype']:4s} d={r['d']:<3d} {shape}"
                  f"  torch {ms:9.2f} ms  flashport {r['ms']:9.2f} ms  "
                  f"ratio {ms / r['ms']:.2f}", flush=True)

    print_table(rows)
    out = args.out or os.path.splitext(args.jsonl)[0] + "_vs_torch.jsonl"
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(os.path.abspath(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
