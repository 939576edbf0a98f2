"""Opcode counts of two SASS snapshots (scripts/sass_snapshot.sh take), per kernel family: tells a change
that only reorders or renames registers (same opcode multiset) from one that changes integer bookkeeping
only (math, memory and barrier counts equal) from one that changes the main loops.

usage: python3 scripts/sass_opcodes.py OLD NEW
"""

import collections
import os
import re
import sys

INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
# Tensor-core, floating-point, memory, synchronisation and TMA opcodes: what the main loops are made of.
HEAVY = re.compile(r"^(HMMA|HGMMA|FFMA|FMUL|FADD|MUFU|LDS|STS|LDG|STG|LDGSTS|LDSM|BAR|RED|ATOM|SYNCS|UTMA|"
                   r"UBLKCP|WARPGROUP|SHFL|F2FP)")


def opcodes(path):
    counts = collections.Counter()
    with open(path) as f:
        for line in f:
            m = INSTR.match(line)
            if m:
                counts[m.group(1)] += 1
    return counts


def main(old, new):
    families = collections.defaultdict(lambda: {"differ": 0, "same_ops": 0, "same_heavy": 0, "max_delta": 0})
    for name in sorted(os.listdir(new)):
        if not name.endswith(".sass") or not os.path.exists(os.path.join(old, name)):
            continue
        with open(os.path.join(old, name)) as a, open(os.path.join(new, name)) as b:
            if a.read() == b.read():
                continue
        before, after = opcodes(os.path.join(old, name)), opcodes(os.path.join(new, name))
        delta = {k: after[k] - before[k] for k in before.keys() | after.keys() if before[k] != after[k]}
        heavy = {k: v for k, v in delta.items() if HEAVY.match(k)}
        fam = families[re.sub(r"_(80|90)_.*", r" sm\1", name[: -len(".sass")])]
        fam["differ"] += 1
        fam["same_ops"] += not delta
        fam["same_heavy"] += not heavy
        fam["max_delta"] = max(fam["max_delta"], sum(abs(v) for v in delta.values()))
        if heavy:
            print(f"math/memory/sync opcodes differ: {name[:-5]}: {heavy}")
    for key, f in sorted(families.items()):
        print(f"{key}: {f['differ']} differ; same opcode multiset: {f['same_ops']}; math/memory/sync counts "
              f"equal: {f['same_heavy']}; largest opcode-count change: {f['max_delta']}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
