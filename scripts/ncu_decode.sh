#!/usr/bin/env bash
# Nsight Compute evidence for the decode variant (issue #14): `--set full` with source counters on one
# attn_fwd launch per cell (flash_attn_with_kvcache, one token, GQA 32/8, d 128, bf16; after warm-up
# calls), written as the details page and the per-SASS-instruction source page (stall samples per line).
#   OUT=/tmp/ncu-decode CELLS="1x8192 8x32768" PAGE=0 bash scripts/ncu_decode.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ncu-decode}
mkdir -p "$OUT"
source scripts/find_ncu.sh
NCU=$(find_ncu)
[[ -n "$NCU" ]] || { echo "ncu_decode: no ncu (set NCU)"; exit 0; }
export FLASHPORT_CACHE_DIR=${FLASHPORT_CACHE_DIR:-/tmp/flashport-cache}
for cell in ${CELLS:-1x8192 8x32768}; do
  rep="$OUT/decode_${cell}_page${PAGE:-0}"
  timeout "${NCU_CELL_TIMEOUT_S:-120}" "$NCU" --set full --import-source yes -k regex:'^attn_fwd$' --launch-skip 3 \
    --launch-count 1 -f -o "$rep" python3 scripts/profile_decode.py --cells "$cell" --page "${PAGE:-0}" --plain 5 \
    >"$rep.log" 2>&1 || { echo "ncu_decode $cell: failed"; tail -5 "$rep.log"; continue; }
  "$NCU" --import "$rep.ncu-rep" --page details >"$rep.details.txt" 2>&1
  "$NCU" --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.sass.csv" 2>&1
  echo "ncu_decode $cell: $(grep -m1 -E 'Duration' "$rep.details.txt" | tr -s ' ')"
done
