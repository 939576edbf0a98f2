#!/usr/bin/env python3
"""Nsight Compute evidence for the Hopper forward kernel (issue #5), or with NCU_PASS=bwd the Hopper backward's
main kernel (issue #13); used by scripts/ncu_hopper_fwd.sh.

  run D SEQLEN CAUSAL [--warmup N] [--meta FILE]
      On the GPU, under ncu: N warm-up calls of flashport.flash_attn_func (the first JIT-compiles), then the
      call ncu profiles (ncu is given --launch-skip N --launch-count 1), then event timings of flashport and
      of PyTorch SDPA's cuDNN backend on the same inputs. bf16, b * s = 16384, h * d = 2048, (b, s, h, d).
  summarize WORKDIR [--md FILE]
      Reads WORKDIR/<cell>.meta.json and WORKDIR/<cell>.csv (`ncu --import R --page raw --csv
      --print-units base`) and prints one markdown table, rows = cells.
  selftest
      Parses a hand-written raw-page CSV (no GPU, no ncu) and checks the numbers that come out.
"""
import argparse
import csv
import io
import json
import math
import os
import re
import sys

from kvcache_cells import heads, make_inputs, visible_pairs

BWD = os.environ.get("NCU_PASS", "fwd") == "bwd"  # the backward: torch.autograd.grad of q, k, v
# NCU_IMPL=fa3: the same cells through FA3's flash_attn_interface (built from ../shared/peers), whose main
# kernels' demangled names carry these class names.
FA3 = os.environ.get("NCU_IMPL", "flashport") == "fa3"
if FA3:
    KERNEL = "FlashAttnBwdSm90" if BWD else "FlashAttnFwdSm90"
else:
    KERNEL = "flashport_attn_bwd_sm90" if BWD else "flashport_attn_fwd_sm90"
MMA_FLOP_PER_SM_CLK = 4096  # dense bf16 wgmma on sm_90: 989 TFLOPS = 132 SMs * 4096 * 1.83 GHz

# Column -> metric names, first present wins. The legend of the table names the one that was used.
TENSOR = ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"]
ISSUE = ["sm__inst_issued.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active"]
XU = ["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
      "sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active"]
FMA = ["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
       "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"]
SMEM = ["l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed"]
DRAM = ["dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]
L2HIT = ["lts__t_sector_hit_rate.pct"]
OCC = ["sm__warps_active.avg.pct_of_peak_sustained_active"]
DURATION = ["gpu__time_duration.sum"]
CLOCK = ["sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
         "gpc__cycles_elapsed.avg.per_second"]
NSM = ["device__attribute_multiprocessor_count"]

# Warp-stall families ncu has used, preferred first: cycles per issued instruction, then latency sums,
# then PC samples. Shares are taken within one family, so the choice does not change the ranking much.
STALL_FAMILIES = [(re.compile(pat.replace("<r>", r"(\w+?)")), pat.replace("\\", "")) for pat in (
    r"^smsp__average_warps_issue_stalled_<r>_per_issue_active\.ratio$",
    r"^smsp__average_warp_latency_issue_stalled_<r>\.ratio$",
    r"^smsp__average_warp_latency_issue_stalled_<r>\.pct$",
    r"^smsp__warp_issue_stalled_<r>_per_warp_active\.pct$",
    r"^smsp__pcsamp_warps_issue_stalled_<r>$",
)]

_TIME_TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
               "second": 1e3}
_PER_TIME = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e-3, "us": 1e-3, "msecond": 1e-6, "ms": 1e-6, "second": 1e-9,
             "s": 1e-9}
_HZ_TO_GHZ = {"hz": 1e-9, "khz": 1e-6, "mhz": 1e-3, "ghz": 1.0}


def flops(b, h, s, d, causal):
    """SPEC.md's forward FLOP model, the one bench/gpu_bench.py flops() uses: causal counts visible pairs; the
    backward is 2.5 forwards."""
    pairs = s * (s + 1) // 2 if causal else s * s
    return 2 * pairs * (d + d) * h * b * (2.5 if BWD else 1.0)


def number(text):
    """A raw-page value as float ('1,234.5' has a thousands separator), or None for 'n/a' and tuples."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def time_ms(value, unit):
    return value * _TIME_TO_MS.get(unit.strip().lower(), float("nan"))


def clock_ghz(value, unit):
    u = unit.strip().lower()
    if u in _HZ_TO_GHZ:
        return value * _HZ_TO_GHZ[u]
    if u.startswith("cycle/"):
        return value * _PER_TIME.get(u[len("cycle/"):], float("nan"))
    return float("nan")


def parse_raw_csv(text):
    """Rows of `ncu --page raw --csv`: a header of identifiers and metric names, a units row, then one row per
    profiled launch. Lines before the header (==PROF== banners, warnings) are skipped. Returns a list of
    {metric: (value_text, unit)} for the launches of KERNEL."""
    lines = text.lstrip("\ufeff").splitlines()

    def is_header(line):
        if not line.startswith('"'):
            return False
        fields = next(csv.reader([line]), [])
        return "ID" in fields and "Kernel Name" in fields

    start = next((i for i, ln in enumerate(lines) if is_header(ln)), None)
    if start is None:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader)
    units = [""] * len(header)
    rows = []
    for fields in reader:
        if len(fields) != len(header):
            continue
        rec = dict(zip(header, fields))
        if rec.get("ID", "") == "" and not rows:  # the units row
            units = fields
            continue
        if KERNEL in rec.get("Kernel Name", ""):
            rows.append({name: (val, units[i]) for i, (name, val) in enumerate(zip(header, fields))})
    return rows


def pick(row, names):
    """(metric name, value, unit) of the first name present with a number, or (None, None, '')."""
    for name in names:
        if name in row:
            val = number(row[name][0])
            if val is not None:
                return name, val, row[name][1]
    return None, None, ""


def stalls(row):
    """[(reason, % of the family's total)] sorted descending, and the family's pattern; 'selected' (the
    issuing cycle) counts in the total but is no stall."""
    for family, display in STALL_FAMILIES:
        found = {}
        for name, (val, _) in row.items():
            m = family.match(name)
            v = number(val)
            if m and v is not None and "not_issued" not in name:
                found[m.group(1)] = v
        total = sum(found.values())
        if len(found) >= 3 and total > 0:
            shares = sorted(((r, 100.0 * v / total) for r, v in found.items()), key=lambda kv: -kv[1])
            return shares, display.strip("^$")
    return [], None


def summarize_cell(meta, row):
    """The table's numbers for one cell; None where the metric was not collected."""
    page = meta.get("page")  # kv-cache cells: the seqlen column reads "chunk/page"; `context` keys
    out = {"d": meta["d"], "causal": meta["causal"], "s": meta["s"] if page is None else f"{meta['s']}/p{page}",
           "used": {}}
    if page is None:
        fl = flops(meta["b"], meta["h"], meta["s"], meta["d"], meta["causal"])
    else:  # a bottom-right causal chunk of s queries over `context` keys
        pairs = visible_pairs(meta["s"], meta["context"]) if meta["causal"] else meta["context"] * meta["s"]
        fl = 4 * pairs * meta["d"] * meta["h"] * meta["b"]
    name, val, unit = pick(row, DURATION)
    out["ms"] = time_ms(val, unit) if name else None
    out["tflops_ncu"] = fl / out["ms"] / 1e9 if out["ms"] else None
    out["tflops_events"] = fl / meta["fp_ms"] / 1e9 if meta.get("fp_ms") else None
    out["vs_cudnn"] = meta["cudnn_ms"] / meta["fp_ms"] if meta.get("cudnn_ms") and meta.get("fp_ms") else None
    name, val, unit = pick(row, CLOCK)
    out["ghz"] = clock_ghz(val, unit) if name else None
    _, nsm, _ = pick(row, NSM)
    nsm = nsm or 132
    out["mma_peak_pct"] = (100.0 * out["tflops_ncu"] / (nsm * MMA_FLOP_PER_SM_CLK * out["ghz"] / 1e3)
                           if out["tflops_ncu"] and out["ghz"] else None)
    for key, names in (("tensor", TENSOR), ("issue", ISSUE), ("xu", XU), ("fma", FMA), ("smem", SMEM),
                       ("dram", DRAM), ("l2hit", L2HIT), ("occ", OCC)):
        name, val, _ = pick(row, names)
        out[key] = val
        if name:
            out["used"][key] = name
    out["stalls"], out["stall_family"] = stalls(row)
    return out


def fmt(x, spec=".0f", suffix=""):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}{suffix}"


def markdown(cells, notes):
    head = ("| d | causal | seqlen | ncu ms | TFLOPS (ncu) | TFLOPS (events) | vs cuDNN | SM GHz | MMA peak % | "
            "tensor % | issue % | XU % | FMA % | smem % | DRAM % | L2 hit % | occupancy % | "
            "top stalls (% of warp cycles) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        top = ", ".join(f"{r} {p:.0f}" for r, p in [kv for kv in c["stalls"] if kv[0] != "selected"][:3]) or "-"
        lines.append(
            f"| {c['d']} | {int(c['causal'])} | {c['s']} | {fmt(c['ms'], '.3f')} | {fmt(c['tflops_ncu'])} | "
            f"{fmt(c['tflops_events'])} | {fmt(c['vs_cudnn'], '.2f', 'x')} | {fmt(c['ghz'], '.2f')} | "
            f"{fmt(c['mma_peak_pct'])} | {fmt(c['tensor'])} | {fmt(c['issue'])} | {fmt(c['xu'])} | "
            f"{fmt(c['fma'])} | {fmt(c['smem'])} | {fmt(c['dram'])} | {fmt(c['l2hit'])} | {fmt(c['occ'])} | {top} |")
    used = {}
    for c in cells:
        for key, name in c["used"].items():
            used.setdefault(key, set()).add(name)
    fams = {c["stall_family"] for c in cells if c["stall_family"]}
    legend = ["", "Columns: ncu ms = gpu__time_duration.sum of the one profiled launch (caches flushed, clocks "
              "not locked); TFLOPS by SPEC.md's FLOP model (causal counts visible pairs, so masked work on "
              "diagonal tiles is not counted); TFLOPS (events) and vs cuDNN = median event timing in the same "
              "process outside the profiled launch (cuDNN = PyTorch SDPA cuDNN backend); MMA peak % = TFLOPS "
              "(ncu) / (SMs * 4096 bf16 FLOP/clk * measured SM clock)."]
    for key in ("tensor", "issue", "xu", "fma", "smem", "dram", "l2hit", "occ"):
        if key in used:
            legend.append(f"- {key}: {', '.join(sorted(used[key]))}")
    if fams:
        legend.append(f"- stalls: share of each reason in the sum over reasons (incl. 'selected') of "
                      f"{', '.join(sorted(fams))}; averaged over all warps, producer (TMA) and consumer (MMA) alike.")
    return "\n".join(lines + legend + (["", "Notes:"] + [f"- {n}" for n in notes] if notes else [])) + "\n"


def details(cells):
    out = []
    for c in cells:
        if c["stalls"]:
            all_stalls = ", ".join(f"{r} {p:.1f}" for r, p in c["stalls"] if p >= 0.5)
            out.append(f"- d{c['d']} causal={int(c['causal'])} s={c['s']}: {all_stalls}")
    return (["", "All stall reasons >= 0.5% per cell:"] + out) if out else []


CELL_ORDER = lambda m: (m["d"], m["causal"], m["s"], m.get("page", -1))  # noqa: E731


def cmd_summarize(args):
    metas, notes, cells = [], list(args.note), []
    for fn in sorted(os.listdir(args.workdir)):
        if fn.endswith(".meta.json"):
            try:
                with open(os.path.join(args.workdir, fn)) as f:
                    meta = json.load(f)
                meta["tag"] = fn[: -len(".meta.json")]
                CELL_ORDER(meta)
                metas.append(meta)
            except (OSError, ValueError, KeyError, TypeError) as e:
                notes.append(f"{fn}: unreadable ({type(e).__name__}: {e})")
    for meta in sorted(metas, key=CELL_ORDER):
        path = os.path.join(args.workdir, meta["tag"] + ".csv")
        rows = []
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                rows = parse_raw_csv(f.read())
        if not rows:
            if not any(n.startswith(meta["tag"] + ":") for n in notes):
                notes.append(f"{meta['tag']}: no counters for {KERNEL} (see {meta['tag']}.log in the tarball)")
            continue
        if len(rows) > 1:
            notes.append(f"{meta['tag']}: {len(rows)} launches in the report, the first is shown")
        if meta.get("max_err") is not None and meta["max_err"] > 2e-2:
            notes.append(f"{meta['tag']}: max |flashport - cuDNN| = {meta['max_err']:.2e} (above 2e-2)")
        cells.append(summarize_cell(meta, rows[0]))
    device = next((m.get("device") for m in metas if m.get("device")), "unknown GPU")
    title = [f"# ncu: {KERNEL} on {device}", "",
             "bf16, batch * seqlen = 16384, nheads * d = 2048, layout (b, s, h, d); one launch per cell "
             "profiled after warm-up (`scripts/ncu_hopper_fwd.sh`, --clock-control none, --cache-control all, "
             "--replay-mode kernel).", "", ""]
    knobs = sorted({f"{k}={v}" for m in metas for k, v in m.get("env", {}).items()})
    if knobs:
        title[-2:-2] = ["", "Kernel knobs set: " + ", ".join(knobs)]
    text = "\n".join(title) + markdown(cells, notes) + "\n".join(details(cells)) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    return 0 if cells else 1


def time_call_ms(fn, torch, reps=7, inner=10):
    """Median over reps of the mean of `inner` back-to-back calls between two events, so host-side launch
    overhead (larger under ncu's interception) is hidden behind queued GPU work."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return sorted(times)[len(times) // 2]


def run_kvcache_cell(args, torch, flashport, knobs):
    """The chunked-prefill cell of scripts/paged_prefill_probe.py (kvcache_cells.py): a chunk of `seqlen`
    queries over a 32k-token cache, batch 2; --page 0 dense, else pages of that many tokens."""
    d, chunk, context, b = args.d, args.seqlen, 32768, 2
    torch.manual_seed(0)
    q, k, v, seqlens, table = make_inputs(b, chunk, context, d, args.page)
    hq = heads(d)[0]
    call = lambda: flashport.flash_attn_with_kvcache(  # noqa: E731
        q, k, v, cache_seqlens=seqlens, block_table=table, causal=bool(args.causal))
    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    call()  # the launch ncu profiles
    torch.cuda.synchronize()
    meta = dict(d=d, s=chunk, causal=bool(args.causal), b=b, h=hq, page=args.page, context=context,
                device=torch.cuda.get_device_name(), warmup=args.warmup, env=knobs, pass_="fwd")
    meta["fp_ms"] = time_call_ms(call, torch)
    if args.meta:
        with open(args.meta, "w") as f:
            json.dump(meta, f)
    print("NCU_DRIVER_OK " + json.dumps(meta), flush=True)
    return 0


def cmd_run(args):
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        import flashport

        d, s, causal = args.d, args.seqlen, bool(args.causal)
        knobs = {k: v for k, v in os.environ.items() if k.startswith("FLASHPORT_") and k != "FLASHPORT_CACHE_DIR"}
        if args.page >= 0:  # a chunked-prefill cell: forward only, no cuDNN peer
            return run_kvcache_cell(args, torch, flashport, knobs)
        h, b = 2048 // d, max(1, 16384 // s)
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=BWD) for _ in range(3))
        dout = torch.randn_like(q)
        meta = dict(d=d, s=s, causal=causal, b=b, h=h, device=torch.cuda.get_device_name(), warmup=args.warmup,
                    env=knobs, pass_="bwd" if BWD else "fwd")

        def backward_of(out):  # the backward alone (one launch of KERNEL per call), dq returned
            return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)[0]

        if FA3:
            import flash_attn_interface

            def fwd():
                out = flash_attn_interface.flash_attn_func(q, k, v, causal=causal)
                return out[0] if isinstance(out, tuple) else out
        else:
            fwd = lambda: flashport.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        meta["impl"] = "fa3" if FA3 else "flashport"
        with torch.enable_grad() if BWD else torch.no_grad():
            if BWD:
                fwd = backward_of(fwd())
            for _ in range(args.warmup):
                fwd()
            torch.cuda.synchronize()
            out = fwd()  # the launch ncu profiles: --launch-skip equals the warm-up count
            torch.cuda.synchronize()
            meta["fp_ms"] = time_call_ms(fwd, torch)
            try:
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

                def cudnn_fwd():
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)

                cudnn = backward_of(cudnn_fwd()) if BWD else cudnn_fwd
                ref = cudnn()
                meta["max_err"] = (out.float() - ref.float()).abs().max().item()
                meta["cudnn_ms"] = time_call_ms(cudnn, torch)
            except Exception as e:  # a missing peer is reported missing, never invented
                print(f"cuDNN peer unavailable: {type(e).__name__}: {e}", flush=True)
        if args.meta:
            with open(args.meta, "w") as f:
                json.dump(meta, f)
        print("NCU_DRIVER_OK " + json.dumps(meta), flush=True)
        return 0
    except Exception as e:
        print(f"NCU_DRIVER_FAIL {type(e).__name__}: {e}", flush=True)
        raise


# A hand-written raw page in the layout ncu prints (header, units row, one row per launch), with the
# quirks that matter: a banner line before the header, thousands separators, 'n/a', tuple-valued columns,
# a second kernel that must be ignored, and a family of stall ratios.
_SELFTEST_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","device__attribute_multiprocessor_count","gpu__time_duration.sum","sm__cycles_elapsed.avg.per_second","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","sm__inst_issued.avg.pct_of_peak_sustained_active","sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active","sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active","l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed","dram__throughput.avg.pct_of_peak_sustained_elapsed","lts__t_sector_hit_rate.pct","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio"
"","","","","","","","","","","","","nsecond","cycle/second","%","%","%","%","%","%","%","%","ratio","ratio","ratio","ratio","ratio","ratio"
"0","4242","python3.12","127.0.0.1","flashport_attn_fwd_sm90","1","7","(384, 1, 1)","(16, 32, 8)","0","9.0","132","1,250,000","1,755,000,000","71.5","38.25","12.5","20.0","3.1","9.75","88.0","18.7","2.00","4.00","1.00","1.00","1.50","0.50"
"1","4242","python3.12","127.0.0.1","cudnn_generated_fort_native_sdpa","1","7","(128, 1, 1)","(16, 32, 8)","0","9.0","132","999","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a","n/a"
'''


def cmd_selftest(_args):
    rows = parse_raw_csv(_SELFTEST_CSV)
    assert len(rows) == 1, f"expected one {KERNEL} row, got {len(rows)}"
    meta = dict(d=128, s=2048, causal=False, b=8, h=16, fp_ms=1.2, cudnn_ms=1.32, device="fake")
    c = summarize_cell(meta, rows[0])
    fl = flops(8, 16, 2048, 128, False)
    assert fl == 4 * 8 * 16 * 2048 * 2048 * 128
    assert abs(c["ms"] - 1.25) < 1e-12, c["ms"]
    assert abs(c["tflops_ncu"] - fl / 1.25e9) < 1e-6
    assert abs(c["ghz"] - 1.755) < 1e-12
    assert abs(c["vs_cudnn"] - 1.1) < 1e-12
    assert abs(c["mma_peak_pct"] - 100 * (fl / 1.25e9) / (132 * 4096 * 1.755 / 1e3)) < 1e-9
    assert (c["tensor"], c["issue"], c["xu"], c["fma"], c["smem"], c["dram"], c["l2hit"], c["occ"]) == (
        71.5, 38.25, 12.5, 20.0, 3.1, 9.75, 88.0, 18.7)
    assert [r for r, _ in c["stalls"]][:3] == ["gmma", "barrier", "wait"], c["stalls"]
    assert abs(c["stalls"][0][1] - 40.0) < 1e-9  # 4 of a total of 10
    table = markdown([c], [])
    assert "| 128 | 0 | 2048 | 1.250 |" in table and "gmma 40, barrier 20, wait 15 |" in table, table
    # units ncu prints without --print-units base
    assert abs(time_ms(1.5, "usecond") - 1.5e-3) < 1e-15 and abs(clock_ghz(1.98, "cycle/nsecond") - 1.98) < 1e-12
    assert abs(clock_ghz(1980, "Mhz") - 1.98) < 1e-12
    assert parse_raw_csv("==ERROR== no kernels were profiled\n") == []
    # a report whose identifier columns come in another order still parses
    moved = _SELFTEST_CSV.replace('"ID","Process ID"', '"Process ID","ID"').replace('"0","4242"', '"4242","0"')
    assert parse_raw_csv(moved)[0]["gpu__time_duration.sum"] == ("1,250,000", "nsecond")
    # a metric missing from the report leaves its column empty instead of failing the table
    del rows[0]["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
    assert summarize_cell(meta, rows[0])["tensor"] is None
    print("selftest ok")
    print(table)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("d", type=int)
    r.add_argument("seqlen", type=int)
    r.add_argument("causal", type=int, choices=(0, 1))
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--meta")
    r.add_argument("--page", type=int, default=-1,
                   help=">= 0: a chunk of `seqlen` queries over a 32k-token kv cache, 0 dense, else pages of that size")
    s = sub.add_parser("summarize")
    s.add_argument("workdir")
    s.add_argument("--md")
    s.add_argument("--note", action="append", default=[], help="a line for the notes under the table")
    sub.add_parser("selftest")
    args = ap.parse_args()
    return {"run": cmd_run, "summarize": cmd_summarize, "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
