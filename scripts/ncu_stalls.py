"""Where a kernel's warps wait, per SASS instruction: reads Nsight Compute's source page exported as CSV
(`ncu --import R.ncu-rep --page source --csv --print-source sass > R.sass.csv`, from a report taken with
`--set full --import-source yes`, as scripts/ncu_decode.sh does; .csv or .csv.gz) and prints, as markdown:
the stall reasons' shares of all warp samples, the shares per opcode family, and the instructions that hold
the most samples with their two main reasons. Instructions are numbered by their place in the listing.

    python3 scripts/ncu_stalls.py R.sass.csv.gz [--top 30] [--around 1869 --width 12]

Warp samples cover every warp of the kernel, producers and idle warps included: a producer warp that waits
on an mbarrier shows up as `long_sb` at the branch of its try-wait loop, not as a stall of the math.
"""
import argparse
import collections
import csv
import gzip

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    """(header, rows) of the listing: the rows after the `Address` header line that have every column."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path, newline="")) as f:
        rows = list(csv.reader(f))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise SystemExit(f"ncu_stalls: {path} has no `Address` header (not a --page source --csv export?)")
    header = rows[start]
    return header, [r for r in rows[start + 1:] if len(r) == len(header)]


def opcode_family(source):
    """`@!P1 BRA 0x...` -> BRA; `WARPGROUP.DEPBAR.LE gsb0` -> WARPGROUP."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the source page export (.csv or .csv.gz)")
    ap.add_argument("--top", type=int, default=30, help="instructions listed by samples")
    ap.add_argument("--around", type=int, help="also list the instructions near this index")
    ap.add_argument("--width", type=int, default=10, help="instructions either side of --around")
    args = ap.parse_args()

    header, rows = load(args.csv)
    col = {name: i for i, name in enumerate(header)}
    for need in (SAMPLES, EXECUTED, "Source"):
        if need not in col:
            raise SystemExit(f"ncu_stalls: no column {need!r} (report taken without source counters?)")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, h: int(r[col[h]] or 0)
    total = sum(num(r, SAMPLES) for r in rows) or 1
    pct = lambda v: f"{100.0 * v / total:.1f}"

    by_reason = collections.Counter()
    by_family = collections.Counter()
    family_reasons = collections.defaultdict(collections.Counter)
    for r in rows:
        fam = opcode_family(r[col["Source"]].strip())
        by_family[fam] += num(r, SAMPLES)
        for h in reasons:
            by_reason[h[6:]] += num(r, h)
            family_reasons[fam][h[6:]] += num(r, h)
    executed = [num(r, EXECUTED) for r in rows]
    print(f"{args.csv}: {len(rows)} instructions ({sum(1 for x in executed if x)} executed), {total} warp samples\n")
    print("| reason | % of samples |\n|---|---|")
    for name, v in by_reason.most_common(10):
        print(f"| {name} | {pct(v)} |")
    print("\n| opcode | % of samples | main reasons |\n|---|---|---|")
    for fam, v in by_family.most_common(12):
        main_reasons = ", ".join(f"{k} {pct(x)}" for k, x in family_reasons[fam].most_common(3) if x)
        print(f"| {fam} | {pct(v)} | {main_reasons} |")

    def line(i):
        r = rows[i]
        top2 = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:2]
        why = ", ".join(f"{n} {pct(v)}" for v, n in top2 if v)
        return f"| {i} | {pct(num(r, SAMPLES))} | {num(r, EXECUTED)} | `{r[col['Source']].strip()[:64]}` | {why} |"

    print(f"\nThe {args.top} instructions with the most samples, in listing order:\n")
    print("| # | % of samples | executed | instruction | main reasons |\n|---|---|---|---|---|")
    ranked = sorted(range(len(rows)), key=lambda i: -num(rows[i], SAMPLES))[: args.top]
    for i in sorted(ranked):
        print(line(i))
    if args.around is not None:
        lo, hi = max(0, args.around - args.width), min(len(rows), args.around + args.width + 1)
        print(f"\nInstructions {lo}-{hi - 1}:\n")
        print("| # | % of samples | executed | instruction | main reasons |\n|---|---|---|---|---|")
        for i in range(lo, hi):
            print(line(i))


if __name__ == "__main__":
    main()
