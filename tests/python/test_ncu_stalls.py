"""scripts/ncu_stalls.py on a synthetic Nsight Compute source-page export: random per-instruction stall
samples, so the shares it prints must be the ones computed here, per reason, per opcode and per instruction."""

import csv
import gzip
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ncu_stalls.py")
REASONS = ["barrier", "long_sb", "wait", "mio"]
SOURCES = ["HGMMA.64x128x16.F32.BF16 R24, R156, gdesc[UR20].tnspB, R24", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
           "@!P1  BRA 0x7f54cd7be270", "MUFU.EX2 R129, R129", "FMNMX R17, R90, R91, !PT", "NOP"]


def write_export(path, samples):
    """The layout `ncu --page source --csv --print-source sass` writes: a kernel-name line, a header starting
    with Address, one row per instruction (a stall column per reason, and its not-issued twin)."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
              "Instructions Executed"] + [f"stall_{r}" for r in REASONS] + [f"stall_{r} (Not Issued)" for r in REASONS]
    with gzip.open(path, "wt", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Kernel Name", "synthetic"])
        out.writerow(header)
        for i, row in enumerate(samples):
            total = int(row.sum())
            out.writerow([hex(0x1000 + 16 * i), SOURCES[i % len(SOURCES)], total, total, 128 * (i + 1)]
                         + [int(x) for x in row] + [0] * len(REASONS))


def run(path, *args):
    done = subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True, check=True)
    return done.stdout


def table_rows(text, first_cell):
    """The markdown rows whose first cell is `first_cell`, as lists of cells."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows if r[0] == first_cell]


def test_shares_match_the_samples(tmp_path):
    samples = np.random.randint(0, 50, size=(len(SOURCES) * 3, len(REASONS)))
    samples[7, 1] = 900  # one instruction that must lead the ranking
    path = str(tmp_path / "k.sass.csv.gz")
    write_export(path, samples)
    text = run(path, "--top", "3", "--around", "7", "--width", "1")
    total = samples.sum()

    assert f"{len(samples)} instructions ({len(samples)} executed), {total} warp samples" in text
    for j, reason in enumerate(REASONS):
        assert table_rows(text, reason)[0][1] == f"{100.0 * samples[:, j].sum() / total:.1f}"
    for k, source in enumerate(SOURCES):
        family = source.split()[0] if not source.startswith("@") else source.split()[1]
        family = family.split(".")[0]
        mine = samples[k::len(SOURCES)].sum()
        assert table_rows(text, family)[0][1] == f"{100.0 * mine / total:.1f}", family
    # The leader is listed in the top 3 and in the window around it, with long_sb its main reason.
    leader = table_rows(text, "7")
    assert len(leader) == 2 and all(r[1] == f"{100.0 * samples[7].sum() / total:.1f}" for r in leader)
    assert leader[0][4].startswith(f"long_sb {100.0 * samples[7, 1] / total:.1f}")
    listed = {i for i in range(len(samples)) if table_rows(text, str(i))}
    assert {6, 7, 8} <= listed  # the window's neighbours too


def test_a_file_without_the_listing_is_refused(tmp_path):
    path = tmp_path / "not_a_listing.csv"
    path.write_text("Kernel Name,x\nID,Value\n1,2\n")
    done = subprocess.run([sys.executable, SCRIPT, str(path)], capture_output=True, text=True)
    assert done.returncode != 0 and "no `Address` header" in done.stderr
