"""Times calls whose kernel choice moved to the Hopper forward, beside the call they should match:

- a kv-cache prefill chunk with cache_leftpad / cache_batch_idx (dense cache) against the same call without
  them (both on the Hopper forward since the eighteenth session; before, the indexed call ran the portable
  kernel);
- e4m3 attention with softcap and with ALiBi against plain e4m3 (the fp8 transform builds).

Wall time per call from CUDA events around --iters calls (median of --reps; ab_kernels.time_call),
TFLOPS by SPEC.md's FLOP model (4 * sq * sk_visible * d per head). One markdown table on stdout.

    python3 scripts/probe_new_paths.py --iters 20 --reps 5
"""
import argparse

import torch

import flashport
from ab_kernels import time_call  # scripts/ is on sys.path when this runs as a script


def kvcache_cells(args):
    b, sq, hq, hk, d, cache = 4, 2048, 32, 8, 128, 16384
    seqlen = 8192  # keys already cached before the chunk's queries
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b, cache, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    seqlens = torch.full((b,), seqlen + sq, device="cuda", dtype=torch.int32)
    pad = torch.tensor([0, 512, 1000, 64], device="cuda", dtype=torch.int32)
    idx = torch.tensor([3, 1, 0, 2], device="cuda", dtype=torch.int32)
    # Every row sees the cached keys and the chunk's up to its own (bottom-right causal); a left pad shifts
    # the sequence by its slots and cache_seqlens with it, so the FLOPs are the same in every cell.
    flops = 4.0 * b * hq * d * (sq * seqlen + sq * (sq + 1) / 2)
    cells = [
        ("kv-cache prefill, causal", {}),
        ("  + cache_batch_idx", {"cache_batch_idx": idx}),
        ("  + cache_leftpad", {"cache_leftpad": pad}),
    ]
    for name, extra in cells:
        lens = seqlens + pad if "cache_leftpad" in extra else seqlens
        us = time_call(lambda: flashport.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                                                 **extra), args.reps, args.iters)
        yield name, us, flops / us / 1e6


def fp8_cells(args):
    b, s, h, d = 4, 4096, 16, 128
    dt = torch.float8_e4m3fn
    q, k, v = (torch.randn(b, s, h, d, device="cuda").to(dt) for _ in range(3))
    ones = torch.ones(b, h, device="cuda", dtype=torch.float32)
    slopes = torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)
    flops = 4.0 * b * h * d * s * s
    for name, extra in [("e4m3 plain", {}), ("e4m3 softcap 30", {"softcap": 30.0}),
                        ("e4m3 ALiBi", {"alibi_slopes": slopes})]:
        us = time_call(lambda: flashport.flash_attn_fp8_func(q, k, v, descale_q=ones, descale_k=ones,
                                                             descale_v=ones, **extra), args.reps, args.iters)
        yield name, us, flops / us / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}")
    print("| call | us | TFLOPS |\n|---|---|---|")
    for cells in (kvcache_cells, fp8_cells):
        try:
            for name, us, tflops in cells(args):
                print(f"| {name} | {us:.1f} | {tflops:.0f} |", flush=True)
        except Exception as e:  # one group failing must not hide the other's numbers
            print(f"| {cells.__name__} failed: {type(e).__name__}: {e} | | |", flush=True)


if __name__ == "__main__":
    main()
