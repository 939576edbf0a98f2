"""Where a small training call's time goes: host (Python + C++) or GPU kernels. Runs forward + backward of
b 1, s 128, 16 heads, d 64, causal bf16 (inputs with grad) under torch.profiler for flashport and SDPA and
prints, per iteration, the wall time, the summed GPU kernel time and the kernels. A call whose kernel sum
is well below its wall time is host-bound. Diagnostic for bench/overhead_bench.py's rows; needs CUDA."""

import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashport


def main(iters=50, s=128, d=64):
    q, k, v = (torch.randn(1, s, 16, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    sdpa = lambda backend: (lambda: sdpa_call(backend, q, k, v))
    impls = {"flashport": lambda: flashport.flash_attn_func(q, k, v, causal=True),
             "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    for name, fn in impls.items():
        for _ in range(20):
            fn().backward(g)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn().backward(g)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / iters * 1e6
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn().backward(g)
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.device_time_total for e in kernels) / iters
        print(f"{name}: wall {wall:.1f} us/iter, GPU kernels {total:.1f} us/iter")
        for e in sorted(kernels, key=lambda e: -e.device_time_total)[:8]:
            print(f"    {e.device_time_total / iters:8.1f} us  x{e.count // iters}  {e.key[:90]}")


def sdpa_call(backend, q, k, v):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True).transpose(1, 2)


if __name__ == "__main__":
    sys.exit(main())
