"""The Hopper fp8 forward's time split: the V^T pass against the attention kernel, per shape.

For each (batch x seqlen = 16k tokens, heads x d = 2048) shape, bf16 inputs are quantised to e4m3 with unit
descales; the call is flashport.flash_attn_func through torch. Prints the call's median (triton do_bench),
the GPU time of each of its kernels (torch.profiler, 20 calls), the bf16 call for reference, and a clone of
the e4m3 V (the bytes the V^T pass reads and writes) as its copy-rate bar.
Usage: python3 scripts/fp8_probe.py [--dims 128,256] [--seqs 1024,4096,16384]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import flashport


def kernel_times(fn, calls=20):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count >= calls:
            out[e.key[:40]] = e.device_time_total / e.count
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="128,256")
    ap.add_argument("--seqs", default="1024,4096,16384")
    args = ap.parse_args()
    for d in (int(x) for x in args.dims.split(",")):
        for s in (int(x) for x in args.seqs.split(",")):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
                ds = torch.ones(b, h, device="cuda", dtype=torch.float32)
                f8 = lambda: flashport.flash_attn_func(q8, k8, v8, causal=causal, q_descale=ds, k_descale=ds, v_descale=ds)
                f16 = lambda: flashport.flash_attn_func(q, k, v, causal=causal)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                t8, t16 = do_bench(f8, warmup=25, rep=100, return_mode="median"), do_bench(f16, warmup=25, rep=100, return_mode="median")
                parts = ", ".join(f"{k} {v:.1f} us" for k, v in kernel_times(f8).items())
                # The V^T pass reads and writes V once: a clone of v8 (same bytes) is its copy-rate reference.
                t_copy = do_bench(lambda: v8.clone(), warmup=25, rep=100, return_mode="median")
                print(f"d {d} s {s} causal {int(causal)}: fp8 {t8 * 1e3:.1f} us ({flops / t8 / 1e9:.0f} TFLOPS), "
                      f"bf16 {t16 * 1e3:.1f} us ({flops / t16 / 1e9:.0f}); v8.clone {t_copy * 1e3:.1f} us; "
                      f"fp8 kernels: {parts}", flush=True)


if __name__ == "__main__":
    main()
