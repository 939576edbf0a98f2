#!/usr/bin/env bash
# Tuning run for the Hopper forward: its GPU tests under each knob setting, then forward TFLOPS per setting.
# Usage (on a GPU machine, after a build in build-gpu and `pip install .`): bash scripts/hopper_sweep.sh
set -uo pipefail
cd "$(dirname "$0")/.."
SEQ=${SEQ:-2048,16384}
variants=(
  ""
  "FLASHPORT_HOPPER_PERSISTENT=1"
  "FLASHPORT_HOPPER_PERSISTENT=2"
  "FLASHPORT_HOPPER_TILE=64:128:2:2,128:176:2"
  "FLASHPORT_HOPPER_TILE=64:128:2:3,128:128:2:1"
  "FLASHPORT_HOPPER_TILE=64:192:2,128:128:3"
  "FLASHPORT_HOPPER_TILE=64:192:2:2 FLASHPORT_HOPPER_PERSISTENT=2"
)
for v in "${variants[@]}"; do
  echo "=== tests [$v]"
  (cd build-gpu && env $v ctest -L gpu -R HopperFwd --timeout 120 2>&1 | grep -E "tests passed|Failed|\*\*\*")
done
for v in "${variants[@]}"; do
  echo "=== bench [$v]"
  env $v FLASHPORT_CUDA_FORWARD=hopper python3 bench/gpu_bench.py --modes fwd --dims 64,128,256 --seqlens "$SEQ" \
    --peers none --out /tmp/h.jsonl 2>&1 | grep -E "^\[" | sed -E 's/ \(.*of cuBLAS\)//; s/\| +\|/|/'
done
