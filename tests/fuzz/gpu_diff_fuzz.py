"""Differential fuzzing of the CUDA kernels against the CPU oracle: random problems (fp16/bf16, head dims
8..256, GQA ratios, causal / sliding window / softcap / ALiBi / dropout, dense / varlen with empty and
one-token sequences / paged K/V with any page size / seqused_k, sq > sk and sq < sk, strided views,
deterministic backward) run through flashport.ops on the GPU and on the CPU with impl="reference" (fp64)
and impl="baseline" (same precision, naive), compared by SPEC's accuracy rule: max|gpu - ref| <=
factor * max|baseline - ref| + eps, for out, lse and (dense / varlen) dq, dk, dv. Every mismatch is
printed with the problem that reproduces it (`--problem "<the printed dict>"`).

  python3 tests/fuzz/gpu_diff_fuzz.py --seconds 120 [--device cuda] [--seed S]
On a machine without CUDA, `--device cpu` runs the same comparison of the CPU fast path (a self-check).
"""

import argparse
import ast
import multiprocessing
import os
import random
import sys
import time

import torch

from flashport import FlashportError, ops

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "python"))
import reference  # noqa: E402  (tests/python/reference.py: the Python suite's independent oracle)

FACTOR_FWD, FACTOR_BWD, EPS = 3.0, 4.0, 2e-5
ULP = {"float16": 2.0**-10, "bfloat16": 2.0**-7}  # spacing of values in [1, 2)


def problem(rng: random.Random):
    """A random problem: every size small enough for the fp64 CPU reference to be quick."""
    d = rng.choice([8, 16, 32, 40, 64, 64, 72, 96, 128, 128, 160, 192, 256])
    hk = rng.choice([1, 1, 2, 3])
    group = rng.choice([1, 1, 2, 4, 7])
    layout = rng.choice(["dense", "dense", "varlen", "paged"])
    p = dict(seed=rng.getrandbits(32), d=d, dv=d, hk=hk, hq=hk * group, layout=layout,
             dtype=rng.choice(["float16", "bfloat16"]), batch=rng.randint(1, 3),
             causal=rng.random() < 0.4, window=(-1, -1), softcap=0.0, alibi=False, dropout=0.0,
             deterministic=rng.random() < 0.2, strided=rng.random() < 0.3)
    p["sq"] = rng.choice([1, 2, 7, 16, 33, 64, 113, 128, 200])
    p["sk"] = rng.choice([1, 3, 16, 31, 64, 128, 203, 256])
    if rng.random() < 0.3:
        p["window"] = (rng.choice([-1, 0, 5, 40]), rng.choice([-1, 0, 3, 64]))
    if rng.random() < 0.25:
        p["softcap"] = rng.choice([5.0, 30.0])
    if rng.random() < 0.2:
        p["alibi"] = True
    if rng.random() < 0.2 and layout != "paged":
        p["dropout"] = rng.choice([0.1, 0.5])
    if layout == "varlen":  # lengths include empty and one-token sequences
        p["lens_q"] = [rng.choice([0, 1, 5, 17, 64, 130]) for _ in range(p["batch"])]
        p["lens_k"] = [rng.choice([0, 1, 9, 64, 131]) if rng.random() < 0.5 else lq for lq in p["lens_q"]]
    if layout == "paged":
        p["page"] = rng.choice([1, 3, 16, 64, 256])
        p["seqused"] = [rng.randint(0, p["sk"]) for _ in range(p["batch"])]
    return p


def tensors(p, device):
    """(q, k, v, dout, layout kwargs, alibi) for problem p on `device`, from p's seed (same on every device)."""
    g = torch.Generator().manual_seed(p["seed"])
    dt = getattr(torch, p["dtype"])
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dt)
    b, sq, sk, hq, hk, d, dv = (p[x] for x in ("batch", "sq", "sk", "hq", "hk", "d", "dv"))
    lay = {}
    if p["layout"] == "dense":
        q, k, v, dout = rand(b, sq, hq, d), rand(b, sk, hk, d), rand(b, sk, hk, dv), rand(b, sq, hq, dv)
        if p["strided"]:  # views with a head stride larger than d: q and k live inside wider tensors
            q = torch.cat([q, rand(b, sq, hq, 8)], -1)[..., :d]
            k = torch.cat([k, rand(b, sk, hk, 8)], -1)[..., :d]
    elif p["layout"] == "varlen":
        cu_q = torch.tensor([0] + list(accumulate(p["lens_q"])), dtype=torch.int32)
        cu_k = torch.tensor([0] + list(accumulate(p["lens_k"])), dtype=torch.int32)
        tq, tk = int(cu_q[-1]), int(cu_k[-1])
        q, k, v, dout = rand(tq, hq, d), rand(tk, hk, d), rand(tk, hk, dv), rand(tq, hq, dv)
        lay = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(p["lens_q"]), max_seqlen_k=max(p["lens_k"]))
    else:
        pages_per_seq = -(-sk // p["page"])
        pool = b * pages_per_seq + 2
        perm = torch.randperm(pool, generator=g)[: b * pages_per_seq].to(torch.int32)
        q, dout = rand(b, sq, hq, d), rand(b, sq, hq, dv)
        k, v = rand(pool, p["page"], hk, d), rand(pool, p["page"], hk, dv)
        lay = dict(block_table=perm.reshape(b, pages_per_seq), seqused_k=torch.tensor(p["seqused"], dtype=torch.int32),
                   max_seqlen_q=sq, max_seqlen_k=pages_per_seq * p["page"])
    alibi = (torch.rand(hq, generator=g) * 0.3) if p["alibi"] else None
    move = lambda t: None if t is None else t.to(device)
    return (*(move(t) for t in (q, k, v, dout)), {n: move(t) if torch.is_tensor(t) else t for n, t in lay.items()},
            move(alibi))


def accumulate(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def forward(p, device, impl):
    q, k, v, dout, lay, alibi = tensors(p, device)
    out = torch.full(q.shape[:-1] + (p["dv"],), float("nan"), dtype=q.dtype, device=device)
    lse_shape = (q.shape[1], q.shape[0]) if p["layout"] == "varlen" else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.full(lse_shape, float("nan"), device=device)
    wl, wr = p["window"]
    opts = dict(softmax_scale=p["d"] ** -0.5, causal=p["causal"], window_left=wl, window_right=wr,
                softcap=p["softcap"], alibi_slopes=alibi, dropout_p=p["dropout"], seed=p["seed"], offset=7)
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    ops.forward(q, k, v, out, lse=lse, stream=stream, impl=impl, **lay, **opts)
    return (q, k, v, dout, lay, opts, stream), out, lse


def backward(p, device, impl, state, out, lse):
    (q, k, v, dout, lay, opts, stream) = state
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    ops.backward(dout, q, k, v, out.to(device), lse.to(device), *grads, stream=stream, impl=impl,
                 deterministic=p["deterministic"], **lay, **opts)
    return grads


def baseline_grads(p, state):
    """dq, dk, dv of the naive same-precision attention (tests/python/reference.py, the accuracy rule's
    baseline, as the Python suite uses it) by torch autograd on the CPU."""
    q, k, v, dout, lay, opts, _ = state
    leaves = [t.detach().cpu().clone().requires_grad_() for t in (q, k, v)]
    kw = dict(scale=opts["softmax_scale"], causal=p["causal"], window=p["window"], softcap=p["softcap"],
              dropout_p=p["dropout"], upcast=False)
    alibi = None if opts["alibi_slopes"] is None else opts["alibi_slopes"].cpu()
    keep = lambda b, sq, sk: torch.from_numpy(reference.dropout_keep(p["seed"], 7, p["dropout"], b, p["hq"], sq, sk))
    if p["layout"] == "varlen":
        lq, lk = p["lens_q"], p["lens_k"]
        keeps = [keep(b, lq[b], lk[b]) for b in range(p["batch"])] if p["dropout"] else None
        out, _ = reference.varlen_ref(*leaves, lay["cu_seqlens_q"].cpu(), lay["cu_seqlens_k"].cpu(), alibi=alibi,
                                      keeps=keeps, **kw)
    else:
        keeps = torch.stack([keep(b, p["sq"], p["sk"]) for b in range(p["batch"])]) if p["dropout"] else None
        out, _ = reference.attention_ref(*leaves, alibi=alibi, keep=keeps, **kw)
    out.backward(dout.cpu().to(out.dtype))
    return [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]


def rule(got, ref, base, factor, what, p, scale_ref=None):
    got, ref, base = (t.detach().cpu().double() for t in (got, ref, base))
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(got), finite):
        return f"{what}: non-finite values where the reference has none (or the reverse)"
    if not finite.any():
        return None
    err = (got[finite] - ref[finite]).abs().max().item()
    base_err = (base[finite] - ref[finite]).abs().max().item()
    # Outputs are rounded to the input dtype at the end, so two correct answers may differ by one unit
    # in the last place of the largest value even where the baseline happens to be exact (one key per
    # query: P = 1).
    eps = EPS + ULP[p["dtype"]] * ref[finite].abs().max().item()
    if scale_ref is not None and scale_ref.numel():
        # dS = P (dP - D) cancels to exactly 0 when a query sees one key, but D = rowsum(dO * O) is computed
        # from O rounded to the input dtype (as flash-attn does): a rounding of O's scale, not dq's.
        eps += ULP[p["dtype"]] * scale_ref.detach().cpu().double().abs().max().item()
    if err > factor * base_err + eps:
        return f"{what}: max err {err:.3e} > {factor} x baseline {base_err:.3e} + {eps:.1e}"
    return None


def check(p, device):
    """A list of mismatch descriptions (empty: the problem passed)."""
    state, out, lse = forward(p, device, "automatic")
    cpu_state, ref_out, ref_lse = forward(p, "cpu", "reference")
    _, base_out, base_lse = forward(p, "cpu", "baseline")
    bad = [rule(out, ref_out, base_out, FACTOR_FWD, "out", p), rule(lse, ref_lse, base_lse, FACTOR_FWD, "lse", p)]
    if p["layout"] != "paged":  # no backward through paged K/V
        got = backward(p, device, "automatic", state, ref_out, ref_lse)
        ref = backward(p, "cpu", "reference", cpu_state, ref_out, ref_lse)
        base = baseline_grads(p, cpu_state)
        for name, a, r, b in zip(("dq", "dk", "dv"), got, ref, base):
            bad.append(rule(a, r, b, FACTOR_BWD, name, p, scale_ref=ref[2] if name != "dv" else None))
    return [m for m in bad if m]


def run(args_tuple):
    """One worker's loop: (tried, failures, families, refusals)."""
    seconds, max_problems, seed, device, only = args_tuple
    if only is None:
        torch.set_num_threads(1)  # one core per worker process: the workers are the parallelism
    rng = random.Random(seed)
    start, tried, failures, families, refusals = time.time(), 0, [], {}, {}
    while time.time() - start < seconds and tried < max_problems:
        p = ast.literal_eval(only) if only else problem(rng)
        key = f"{p['layout']}{'+dropout' if p['dropout'] else ''}{'+deterministic' if p['deterministic'] else ''}"
        try:
            bad = check(p, device)
        except FlashportError as e:  # refused by validation or a backend: a gap, not a wrong answer
            refusals[str(e)] = refusals.get(str(e), 0) + 1
            bad = []
            key += " (refused)"
        tried += 1
        families[key] = families.get(key, 0) + 1
        if bad:
            failures.append((p, bad))
            print(f"MISMATCH {p}: {'; '.join(bad)}", flush=True)
        if only:
            break
    return tried, failures, families, refusals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-problems", type=int, default=10**9, help="per worker")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1, help="processes (the fp64 CPU oracle is the bottleneck)")
    ap.add_argument("--problem", default=None, help="run only this problem (a dict as a MISMATCH line prints it)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    print(f"gpu_diff_fuzz: device {args.device}, seed {seed}, {args.workers} workers", flush=True)
    start = time.time()
    jobs = [(args.seconds, args.max_problems, seed + w, args.device, args.problem) for w in range(args.workers)]
    if args.workers == 1:
        results = [run(jobs[0])]
    else:
        # Spawned workers read OMP_NUM_THREADS when they start (flashport's CPU oracle is OpenMP): without
        # it every worker ran one thread per core, 13 workers x 16 threads on 16 cores.
        os.environ["OMP_NUM_THREADS"] = "1"
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:  # CUDA needs spawn, not fork
            results = pool.map(run, jobs)
    tried = sum(r[0] for r in results)
    failures = [f for r in results for f in r[1]]
    families, refusals = {}, {}
    for r in results:
        for table, into in ((r[2], families), (r[3], refusals)):
            for key, count in table.items():
                into[key] = into.get(key, 0) + count
    for message, count in sorted(refusals.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  refused x{count}: {message[:160]}")
    print(f"gpu_diff_fuzz: {tried} problems in {time.time() - start:.0f} s ({sum(refusals.values())} refused), "
          f"{len(failures)} mismatches; by family: {dict(sorted(families.items()))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
