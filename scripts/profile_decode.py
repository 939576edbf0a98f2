"""Where a decode call's GPU time goes: flash_attn_with_kvcache (one query token, GQA 32/8, d 128, bf16,
dense cache, cache_seqlens given as serving passes it) against SDPA cuDNN on the same cache. Per call:
every GPU kernel and memset with its duration (torch.profiler), the span from the first to the last of
them (GPU busy plus the gaps between a call's launches), and the wall time of back-to-back calls.
The decode grid (bench/gpu_decode_bench.py) reported flashport far below the copy ceiling at every size
(23 GB/s at batch 1 x 1k against cuDNN's 352); this says whether the kernel, the split-KV combine, the
device index check or the gaps between launches account for it.

  python3 scripts/profile_decode.py [--cells 1x1024,1x8192,8x32768] [--calls 20] [--page 16] [--splits 0,16,32]
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashport

D, HQ, HK = 128, 32, 8


def calls(batch: int, ctx: int, page: int, splits: list):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, ctx, HK, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    seqlens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if page:
        # The same tokens in pages of `page` rows, pages in a random order (as a serving engine's allocator
        # leaves them); SDPA has no paged form, so it reads the dense copy.
        pages = batch * ctx // page
        order = torch.randperm(pages, device="cuda", generator=gen)
        kp = torch.empty(pages, page, HK, D, device="cuda", dtype=torch.bfloat16)
        vp = torch.empty_like(kp)
        kp[order] = k.reshape(pages, page, HK, D)
        vp[order] = v.reshape(pages, page, HK, D)
        table = order.to(torch.int32).reshape(batch, ctx // page)
        return {
            f"flashport, pages of {page}, num_splits {n}": (lambda n=n: flashport.flash_attn_with_kvcache(
                q, kp, vp, cache_seqlens=seqlens, block_table=table, num_splits=n))
            for n in splits
        }

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    forced = {f"flashport, num_splits {n}": (lambda n=n: flashport.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=seqlens, num_splits=n)) for n in splits if n}
    return {
        "flashport": lambda: flashport.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        **forced,
        "flashport, no cache_seqlens": lambda: flashport.flash_attn_with_kvcache(q, k, v),
        "sdpa-cudnn": cudnn,
    }


def kernels_of(fn, n: int):
    """(name, us per call, launches per call) of every GPU activity, and the first-to-last span per call."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by = {}
    for e in events:
        t = by.setdefault(e.name, [0.0, 0])
        t[0] += e.time_range.end - e.time_range.start
        t[1] += 1
    starts = sorted(e.time_range.start for e in events)
    ends = sorted(e.time_range.end for e in events)
    span = (ends[-1] - starts[0]) / n if events else 0.0
    return sorted(((name, us / n, cnt / n) for name, (us, cnt) in by.items()), key=lambda r: -r[1]), span


def wall_us(fn, n: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="1x1024,1x8192,8x32768", help="batch x context, comma separated")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--splits", default="0", help="num_splits values to time (0: the heuristic)")
    ap.add_argument("--plain", type=int, default=0,
                    help="only call flashport this many times per cell, nothing timed (for ncu: scripts/ncu_decode.sh)")
    ap.add_argument("--page", type=int, default=0, help="page size of a paged cache (0: dense, with SDPA)")
    args = ap.parse_args()
    for cell in args.cells.split(","):
        batch, ctx = (int(x) for x in cell.split("x"))
        kv_mb = batch * ctx * HK * D * 2 * 2 / 2**20
        if args.plain:
            fn = next(iter(calls(batch, ctx, args.page, [0]).values()))
            for _ in range(args.plain):
                fn()
            torch.cuda.synchronize()
            continue
        print(f"\n## batch {batch} x context {ctx}: {kv_mb:.0f} MiB of K and V")
        for name, fn in calls(batch, ctx, args.page, [int(n) for n in args.splits.split(",")]).items():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                print(f"{name}: {type(e).__name__}: {e}")
                continue
            rows, span = kernels_of(fn, args.calls)
            busy = sum(us for _, us, _ in rows)
            wall = wall_us(fn, args.calls * 5)
            print(f"{name}: wall {wall:.1f} us/call back to back; GPU busy {busy:.1f} us, first-to-last span "
                  f"{span:.1f} us per call ({kv_mb * 2**20 / busy / 1e3:.0f} GB/s on the busy time)")
            for kname, us, cnt in rows[:8]:
                print(f"    {us:8.1f} us  x{cnt:.0f}  {kname[:100]}")


if __name__ == "__main__":
    main()
