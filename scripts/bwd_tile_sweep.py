"""Times the CUDA backward for the tile in FLASHPORT_BWD_TILE (one process per tile: it is read once)."""
import os
import sys

import torch
from triton.testing import do_bench

import flashport

tile = os.environ.get("FLASHPORT_BWD_TILE", "default")
for d in [int(x) for x in sys.argv[1].split(",")]:
    for causal in (False, True):
        s = 8192
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out = flashport.flash_attn_func(q, k, v, causal=causal)
        dout = torch.randn_like(out)
        try:
            ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=100,
                          return_mode="median")
        except Exception as e:
            print(f"tile {tile} d={d} causal={int(causal)}: FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        pairs = s * (s + 1) // 2 if causal else s * s
        tf = 2.5 * 2 * pairs * 2 * d * h * b / ms / 1e9
        print(f"tile {tile} d={d} causal={int(causal)}: {tf:.0f} TFLOPS ({ms:.2f} ms)", flush=True)
