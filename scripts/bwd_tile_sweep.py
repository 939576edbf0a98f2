"""Times the CUDA backward for the tile in FLASHPORT_BWD_TILE (one process per tile: it is read once).

usage: python3 scripts/bwd_tile_sweep.py 64,128,256   (seqlen 8k, causal and not; timing: ab_bwd.py)
"""
import os
import sys

from ab_bwd import time_backward

tile = os.environ.get("FLASHPORT_BWD_TILE", "default")
for d in [int(x) for x in sys.argv[1].split(",")]:
    for causal in (False, True):
        try:
            ms, tf = time_backward(d, causal, 8192)
        except Exception as e:
            print(f"tile {tile} d={d} causal={int(causal)}: FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        print(f"tile {tile} d={d} causal={int(causal)}: {tf:.0f} TFLOPS ({ms:.2f} ms)", flush=True)
