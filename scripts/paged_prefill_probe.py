"""Chunked prefill against a paged KV cache (issue #14): a chunk of queries attends, causal, over a cache of
`context` tokens, dense or in pages of 16 / 64 / 256 tokens (shuffled), through flashport.flash_attn_with_kvcache
with cache_seqlens. Prints TFLOPS (SPEC's causal FLOP model over the visible keys) per layout, so the paged
rows read against the dense one in the same process. Run once per FLASHPORT_CUDA_FORWARD setting to compare
the Hopper kernel with the portable one. --fa3 times FA3's flash_attn_with_kvcache on the same inputs as well
(flash_attn_interface on the path: ../shared/peers' FA3_DECODE=1 build has its paged d-128 kernels).
Usage: python3 scripts/paged_prefill_probe.py [--chunks 2048,8192] [--context 32768] [--dims 128] [--fa3]
"""
import argparse

from triton.testing import do_bench

import flashport
from kvcache_cells import heads, make_inputs, visible_pairs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", default="2048,8192")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--dims", default="128")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--pages", default="0,16,64,256", help="0: the dense cache")
    ap.add_argument("--fa3", action="store_true", help="also time FA3 (flash_attn_interface) where it imports")
    args = ap.parse_args()
    fa3 = None
    if args.fa3:
        try:
            import flash_attn_interface as fa3
        except ImportError as e:
            print(f"FA3 not importable ({e}): flashport only", flush=True)
    b, ctx = args.batch, args.context
    for d in (int(x) for x in args.dims.split(",")):
        hq = heads(d)[0]
        for chunk in (int(x) for x in args.chunks.split(",")):
            flops = 4 * b * hq * d * visible_pairs(chunk, ctx)
            for page in (int(x) for x in args.pages.split(",")):
                q, k, v, seqlens, table = make_inputs(b, chunk, ctx, d, page)
                call = lambda: flashport.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table,
                                                                 causal=True)
                ms = do_bench(call, warmup=10, rep=50, return_mode="median")
                name = "dense" if page == 0 else f"paged{page}"
                peer = ""
                if fa3 is not None:
                    fa3_call = lambda: fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table,
                                                                   causal=True)
                    try:
                        err = (fa3_call().float() - call().float()).abs().max().item()
                        fa3_ms = do_bench(fa3_call, warmup=10, rep=50, return_mode="median")
                        peer = f" | FA3 {fa3_ms * 1e3:.1f} us, {flops / fa3_ms / 1e9:.0f} TFLOPS (max diff {err:.1e})"
                    except Exception as e:  # a shape its build left out
                        peer = f" | FA3 unavailable: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
                print(f"d {d} chunk {chunk} context {ctx} {name}: {ms * 1e3:.1f} us, {flops / ms / 1e9:.0f} TFLOPS{peer}",
                      flush=True)
                del q, k, v


if __name__ == "__main__":
    main()
