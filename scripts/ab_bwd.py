"""A/B of the CUDA backward under the values of one environment knob (e.g. FLASHPORT_HOPPER_BWD_DQ=0,1).

The knobs that pick kernels are read once per process, so each value runs in its own child process; the
values alternate over --rounds so that clock drift and a neighbour's load hit every value alike. A child
times torch.autograd.grad of q, k, v through flashport.flash_attn_func (inputs with requires_grad, as in
training) at bf16, batch x seqlen = --tokens, heads x d = --hidden, triton's do_bench median, and prints
one JSON line per cell; the parent prints a markdown table of TFLOPS (FLOP model of docs/SPEC.md: the
backward is 2.5 forwards) with every round's figure.

    python3 scripts/ab_bwd.py --knob FLASHPORT_HOPPER_BWD_DQ --values 0,1 --dims 64,128
    python3 scripts/ab_bwd.py --knob FLASHPORT_CUDA_BACKWARD --values portable, --softcap 30 --alibi 1
    python3 scripts/ab_bwd.py --knob FLASHPORT_CUDA_BACKWARD --values portable, --dropout 0.1
    python3 scripts/ab_bwd.py --knob arg:deterministic --values 0,1 --dims 64,128,256
    python3 scripts/ab_bwd.py --knob arg:softcap --values 0,30 --pass fwd

    python3 scripts/ab_bwd.py --knob arg:impl --values flashport,fa3 --softcap 30 --pass fwd

A knob `arg:NAME` is a command-line option of the child instead (--NAME VALUE), e.g. the deterministic flag.
Several environment knobs vary together as `--knob A+B --values 0+0,1+0,1+1` (one value per knob, in order).
`--pass fwd` times the forward (inputs with requires_grad, FLOP model 1 forward) instead of the backward.
`--check` also compares each cell's gradients with PyTorch SDPA's (the flash backend; plain attention only) and
prints the largest |difference| / max |SDPA gradient| per cell to stderr (a sanity check of a knob's kernel on
these shapes, not the accuracy rule of the GPU suite).
`--impl fa3` times FA3's `flash_attn_interface.flash_attn_func` (built by ../shared/peers; on PYTHONPATH) on
the same inputs: softcap and deterministic pass through, ALiBi it does not have.
"""
import argparse
import collections
import json
import os
import subprocess
import sys


def _inputs(d, causal, s, tokens, hidden, alibi):
    """q, k, v (bf16, batch x s = tokens, heads x d = hidden, requiring grad as in training), the ALiBi
    slopes 2^(-8 (h + 1) / heads) or None, and the forward's FLOPs (SPEC.md's model)."""
    import torch

    h, b = hidden // d, max(1, tokens // s)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    slopes = (torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)
              if alibi else None)
    pairs = s * (s + 1) // 2 if causal else s * s
    return q, k, v, slopes, 2 * pairs * 2 * d * h * b


def _attention(impl):
    """flash_attn_func of flashport or of FA3 (same arguments here; FA3 has no alibi_slopes)."""
    if impl == "fa3":
        import flash_attn_interface

        def fa3(q, k, v, causal, softcap, alibi_slopes, deterministic=False, dropout_p=0.0):
            if alibi_slopes is not None or dropout_p:
                raise SystemExit("ab_bwd: FA3 has no ALiBi and no dropout")
            return flash_attn_interface.flash_attn_func(q, k, v, causal=causal, softcap=softcap,
                                                        deterministic=deterministic)
        return fa3
    import flashport

    return lambda q, k, v, causal, softcap, alibi_slopes, deterministic=False, dropout_p=0.0: (
        flashport.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal, softcap=softcap,
                                  alibi_slopes=alibi_slopes, deterministic=deterministic))


def check_backward(q, k, v, dout, grads, causal):
    """max over dq, dk, dv of max |grad - SDPA flash's| / max |SDPA flash's|."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        ref_out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=bool(causal))
    refs = torch.autograd.grad(ref_out.transpose(1, 2), (q, k, v), dout)
    return max(((g.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-30)).item()
               for g, r in zip(grads, refs))


def time_backward(d, causal, s, tokens=16384, hidden=2048, softcap=0.0, alibi=False, deterministic=False,
                  impl="flashport", check=False, dropout=0.0):
    """(ms, TFLOPS) of one backward (grad of q, k, v through autograd) at bf16, batch x s = tokens,
    heads x d = hidden, with `softcap`, ALiBi, dropout and deterministic mode when asked; triton's do_bench median
    (its warmup absorbs a first call's JIT compile). TFLOPS count 2.5 forwards."""
    import torch
    from triton.testing import do_bench

    q, k, v, slopes, flops = _inputs(d, causal, s, tokens, hidden, alibi)
    out = _attention(impl)(q, k, v, bool(causal), softcap, slopes, deterministic, dropout)
    dout = torch.randn_like(out)
    ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=150,
                  return_mode="median")
    if check and not softcap and not alibi and not dropout:
        err = check_backward(q, k, v, dout, torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), causal)
        print(f"ab_bwd check: d {d} causal {causal} s {s}: max |grad - SDPA| / max |SDPA| = {err:.2e}",
              file=sys.stderr, flush=True)
    return ms, 2.5 * flops / ms / 1e9


def time_forward(d, causal, s, tokens=16384, hidden=2048, softcap=0.0, alibi=False, impl="flashport", dropout=0.0):
    """(ms, TFLOPS) of one forward through flashport.flash_attn_func, same inputs and options as
    time_backward."""
    from triton.testing import do_bench

    q, k, v, slopes, flops = _inputs(d, causal, s, tokens, hidden, alibi)
    attention = _attention(impl)
    ms = do_bench(lambda: attention(q, k, v, bool(causal), softcap, slopes, False, dropout), warmup=25, rep=150,
                  return_mode="median")
    return ms, flops / ms / 1e9


def child(args):
    for d in args.dims:
        for causal in args.causal:
            for s in args.seqlens:
                if args.pass_ == "fwd":
                    _, tflops = time_forward(d, causal, s, args.tokens, args.hidden, args.softcap, bool(args.alibi),
                                             args.impl, args.dropout)
                else:
                    _, tflops = time_backward(d, causal, s, args.tokens, args.hidden, args.softcap,
                                              bool(args.alibi), bool(args.deterministic), args.impl, args.check,
                                              args.dropout)
                value = (getattr(args, args.knob[4:]) if args.knob.startswith("arg:") else
                         "+".join(os.environ.get(k, "") for k in args.knob.split("+")))
                print(json.dumps({"value": str(value), "d": d, "causal": causal, "s": s,
                                  "tflops": round(tflops, 1)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", required=True, help="environment variable to vary")
    ap.add_argument("--values", required=True, help="comma-separated values (an empty item: unset)")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--softcap", type=float, default=0.0, help="softcap of every call (0: off)")
    ap.add_argument("--alibi", type=int, default=0, help="1: ALiBi slopes on every call")
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout_p of every call")
    ap.add_argument("--pass", dest="pass_", choices=("bwd", "fwd"), default="bwd", help="what to time")
    ap.add_argument("--deterministic", type=int, default=0, help="1: deterministic=True on every call")
    ap.add_argument("--impl", choices=("flashport", "fa3"), default="flashport", help="whose attention to time")
    ap.add_argument("--check", action="store_true", help="compare each cell's gradients with SDPA's (stderr)")
    ap.add_argument("--out", help="JSON lines of every child's cells")
    ap.add_argument("--child-timeout", type=float, default=300.0,
                    help="seconds one value's child may run (a hung kernel fails that value, not the call)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]
    args.dims, args.seqlens, args.causal = ints(args.dims), ints(args.seqlens), ints(args.causal)
    if args.child:
        return child(args)

    values = args.values.split(",")
    results = collections.defaultdict(list)  # (d, causal, s, value) -> TFLOPS per round
    sink = open(args.out, "a") if args.out else None
    passthrough = [a for a in sys.argv[1:] if a != "--child"]
    for rnd in range(args.rounds):
        for value in values:
            env, extra = dict(os.environ), []
            if args.knob.startswith("arg:"):
                extra = [f"--{args.knob[4:]}", value]
            else:
                knobs, parts = args.knob.split("+"), value.split("+") if "+" in args.knob else [value]
                if len(parts) != len(knobs):
                    sys.exit(f"ab_bwd: value {value!r} does not give one value per knob of {args.knob}")
                for knob, part in zip(knobs, parts):
                    env.pop(knob, None)
                    if part:
                        env[knob] = part
            print(f"ab_bwd: round {rnd + 1}/{args.rounds}, {args.knob}={value or '(unset)'}", file=sys.stderr,
                  flush=True)
            try:
                proc = subprocess.run([sys.executable, __file__, "--child", *passthrough, *extra], env=env,
                                      capture_output=True, text=True, timeout=args.child_timeout)
            except subprocess.TimeoutExpired:
                sys.exit(f"ab_bwd: {args.knob}={value} ran past --child-timeout {args.child_timeout:.0f} s")
            if proc.returncode != 0:
                sys.exit(f"ab_bwd: {args.knob}={value} failed:\n{proc.stderr[-2000:]}")
            for line in proc.stderr.splitlines():
                if line.startswith("ab_bwd check"):
                    print(f"{line} [{args.knob}={value or '(unset)'}]", file=sys.stderr, flush=True)
            for line in proc.stdout.splitlines():
                if not line.startswith("{"):
                    continue
                row = json.loads(line)
                results[(row["d"], row["causal"], row["s"], value)].append(row["tflops"])
                if sink:
                    sink.write(json.dumps({**row, "knob": args.knob, "round": rnd + 1}) + "\n")
    cells = sorted({key[:3] for key in results})
    print("| d | causal | s | " + " | ".join(f"{args.knob}={v or '(unset)'}" for v in values) + " |")
    print("|---|---|---|" + "---|" * len(values))
    for cell in cells:
        figures = [" / ".join(f"{t:.0f}" for t in results[cell + (v,)]) for v in values]
        print(f"| {cell[0]} | {'yes' if cell[1] else 'no'} | {cell[2]} | " + " | ".join(figures) + " |")


if __name__ == "__main__":
    main()
