#!/usr/bin/env bash
# Hardware counters behind the Hopper forward's benchmark cells (issue #5): Nsight Compute profiles one
# launch of flashport_attn_fwd_sm90 per cell, after warm-up, and scripts/ncu_summary.py turns the raw pages
# into one markdown table (duration, TFLOPS, tensor pipe, issue slots, XU/FMA, smem, DRAM, L2, stalls).
# NCU_PASS=bwd profiles the backward's main kernel (flashport_attn_bwd_sm90; torch.autograd.grad per call)
# instead, into ncu_hopper_bwd.md / .tar.gz. NCU_IMPL=fa3 profiles FA3's main kernel on the same cells
# (ncu_fa3_fwd / ncu_fa3_bwd), for a side-by-side reading of the counters.
#
# Usage, on the GPU machine after `python3 -m pip install --no-build-isolation --no-deps .`:
#   OUT=/tmp/ncu-out bash scripts/ncu_hopper_fwd.sh
# Knobs: CELLS="d:seqlen:causal[:page] ..." (default: the seven cells below; a page field makes the cell a
# chunk of seqlen queries over a 32k-token kv cache through flash_attn_with_kvcache, 0 dense, else pages of
# that many tokens: the chunked-prefill cells of scripts/paged_prefill_probe.py), NCU=/path/to/ncu, NCU_BUDGET_S (wall
# budget, default 230 s: cells that would start after it are skipped), NCU_CELL_TIMEOUT_S (default 90),
# WARMUP (default 3), NCU_WORK (scratch folder, emptied of earlier cell files).
# Outputs: $OUT/ncu_hopper_fwd.md (the table) and $OUT/ncu_hopper_fwd.tar.gz (per cell: raw-page CSV,
# details page, ncu + driver log, .ncu-rep). Two files only, since the device tool returns at most 8.
# Exit status: 0 when done, and also when ncu, the counters, the GPU or the package are unavailable (a
# message says which; the suite goes on); 1 when ncu ran but no cell produced counters.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
OUT=${OUT:-/tmp/ncu-out}
WORK=${NCU_WORK:-${TMPDIR:-/tmp}/ncu_${NCU_IMPL:-flashport}_${NCU_PASS:-fwd}.work}
WARMUP=${WARMUP:-3}
BUDGET=${NCU_BUDGET_S:-230}
CELL_TIMEOUT=${NCU_CELL_TIMEOUT_S:-90}
CELLS=${CELLS:-"64:2048:0 64:16384:0 64:16384:1 128:2048:0 128:2048:1 128:16384:1 256:2048:0"}
PASS=${NCU_PASS:-fwd}
export NCU_PASS=$PASS
# NCU_IMPL=fa3: FA3's main kernel instead (flash_attn_interface importable, e.g. PYTHONPATH=/tmp/fa3/hopper);
# -k and the CSV match its demangled name.
IMPL=${NCU_IMPL:-flashport}
export NCU_IMPL=$IMPL
if [[ $IMPL == fa3 ]]; then
  KERNEL=$([[ $PASS == bwd ]] && echo FlashAttnBwdSm90 || echo FlashAttnFwdSm90)
  NAME=ncu_fa3_$PASS
else
  KERNEL=flashport_attn_${PASS}_sm90
  NAME=ncu_hopper_$PASS
fi
export FLASHPORT_CACHE_DIR=${FLASHPORT_CACHE_DIR:-/tmp/flashport-cache}  # gpu_suite.sh's: reuse its JIT cache
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/*.csv "$WORK"/*.log "$WORK"/*.meta.json "$WORK"/*.ncu-rep "$WORK"/*.details.txt
say() { echo "[$NAME $((SECONDS - T0))s] $*"; }
skip_suite() {
  say "SKIPPED: $*"
  echo "$NAME skipped: $*" >"$OUT/$NAME.md"
  tar -C "$WORK" -czf "$OUT/$NAME.tar.gz" . 2>/dev/null
  exit 0
}

source scripts/find_ncu.sh
NCU_BIN=$(find_ncu)
[[ -n "$NCU_BIN" ]] ||
  skip_suite "ncu not found (PATH, /opt/nvidia/nsight-compute/*/ncu, /usr/local/cuda/bin/ncu; or set NCU)"
say "ncu: $NCU_BIN ($("$NCU_BIN" --version 2>&1 | tail -1))"
cc=$(python3 -c 'import torch, flashport
assert torch.cuda.is_available(), "no CUDA device"
print("%d%d" % torch.cuda.get_device_capability())' 2>"$WORK/env.log") ||
  skip_suite "python3 cannot import torch + flashport with a GPU: $(tail -1 "$WORK/env.log")"
[[ "$cc" == 90 ]] || skip_suite "the GPU is sm_$cc; $KERNEL runs on sm_90 only"

# Explicit metrics on top of the sections, for the columns the sections may not carry on every version.
STALL_REASONS="barrier branch_resolving dispatch_stall drain gmma imc_miss lg_throttle long_scoreboard
  math_pipe_throttle membar mio_throttle misc no_instruction not_selected selected short_scoreboard sleeping
  tex_throttle wait"
WANTED=(gpu__time_duration.sum sm__cycles_elapsed.avg.per_second
  sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active
  sm__inst_issued.avg.pct_of_peak_sustained_active smsp__issue_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
  sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
  sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
  l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
  dram__throughput.avg.pct_of_peak_sustained_elapsed dram__bytes_read.sum dram__bytes_write.sum
  lts__t_sector_hit_rate.pct sm__warps_active.avg.pct_of_peak_sustained_active
  launch__registers_per_thread launch__grid_size)
for r in $STALL_REASONS; do WANTED+=("smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"); done

# Drop names this ncu does not know (one bad name fails the whole collection). The check trusts the
# query only when it lists a plausible number of names; otherwise the retry below covers a bad name.
"$NCU_BIN" --query-metrics --chip gh100 >"$WORK/query_metrics.txt" 2>&1 ||
  "$NCU_BIN" --query-metrics >"$WORK/query_metrics.txt" 2>&1
known=$(awk '$1 ~ /^[a-z0-9]+__[a-z0-9_]+$/ {print $1}' "$WORK/query_metrics.txt" | sort -u)
METRIC_LIST=()
if [[ $(wc -l <<<"$known") -gt 300 ]] && grep -qx sm__cycles_elapsed <<<"$known"; then
  dropped=()
  for m in "${WANTED[@]}"; do
    if [[ $m == gpu__time_duration* || $m == launch__* ]] || grep -qx "${m%%.*}" <<<"$known"; then
      METRIC_LIST+=("$m")
    else
      dropped+=("$m")
    fi
  done
  ((${#dropped[@]} == 0)) || say "metrics this ncu does not list, dropped: ${dropped[*]}"
else
  say "could not list ncu's metrics; passing all ${#WANTED[@]} and retrying without them if that fails"
  METRIC_LIST=("${WANTED[@]}")
fi
METRICS=$(IFS=,; echo "${METRIC_LIST[*]}")
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats)
# Collection modes, most complete first; the first that works on a cell is kept for the rest.
MODES=(full sections metrics)
mode_idx=0
TIMEOUT=()
command -v timeout >/dev/null && TIMEOUT=(timeout --kill-after=10 "$CELL_TIMEOUT")

# What ncu prints when it cannot read the counters (KINDS.md saw the first on gVisor).
NO_COUNTERS="LibraryNotLoaded|ERR_NVGPUCTRPERM|Failed to initialize the profiler|permission to access NVIDIA GPU Performance"

# One cell under ncu; sets $cell_state to ok | counters | driver | nokernel | timeout | ncu.
run_cell() {
  local d=$1 s=$2 c=$3 mode=$4 page=${5:-} tag="d${1}_s${2}_c${3}${5:+_p$5}"
  local args=(--target-processes all --clock-control none --replay-mode kernel --cache-control all
    --kernel-name-base demangled -k "regex:$KERNEL" --launch-skip "$WARMUP" --launch-count 1 --export "$WORK/$tag" --force-overwrite)
  case $mode in
    full) args+=("${SECTIONS[@]}" --metrics "$METRICS") ;;
    sections) args+=("${SECTIONS[@]}") ;;
    metrics) args+=(--metrics "$METRICS") ;;
  esac
  rm -f "$WORK/$tag.ncu-rep" "$WORK/$tag.csv" "$WORK/$tag.meta.json"
  local extra=()
  [[ -n $page ]] && extra=(--page "$page")
  echo "== mode $mode: $NCU_BIN ${args[*]} python3 scripts/ncu_summary.py run $d $s $c ${extra[*]}" >>"$WORK/$tag.log"
  "${TIMEOUT[@]}" "$NCU_BIN" "${args[@]}" python3 scripts/ncu_summary.py run "$d" "$s" "$c" "${extra[@]}" \
    --warmup "$WARMUP" --meta "$WORK/$tag.meta.json" >>"$WORK/$tag.log" 2>&1
  local rc=$?
  if [[ -f "$WORK/$tag.ncu-rep" ]]; then
    local rep="$WORK/$tag.ncu-rep"
    "$NCU_BIN" --import "$rep" --page raw --csv --print-units base >"$WORK/$tag.csv" 2>>"$WORK/$tag.log" ||
      "$NCU_BIN" --import "$rep" --page raw --csv >"$WORK/$tag.csv" 2>>"$WORK/$tag.log"
    "$NCU_BIN" --import "$rep" --page details >"$WORK/$tag.details.txt" 2>&1
  fi
  if grep -q "$KERNEL" "$WORK/$tag.csv" 2>/dev/null; then
    cell_state=ok
  elif grep -qiE "$NO_COUNTERS" "$WORK/$tag.log"; then
    cell_state=counters
  elif [[ $rc -eq 124 ]]; then
    cell_state=timeout
  elif grep -q NCU_DRIVER_FAIL "$WORK/$tag.log"; then
    cell_state=driver
  elif grep -q NCU_DRIVER_OK "$WORK/$tag.log" && grep -qi "No kernels were profiled" "$WORK/$tag.log"; then
    cell_state=nokernel
  else
    cell_state=ncu
  fi
  say "$tag [$mode]: $cell_state (ncu exit $rc)"
}

ok_cells=0
NOTES=()
for cell in $CELLS; do
  IFS=: read -r d s c page <<<"$cell"
  tag="d${d}_s${s}_c${c}${page:+_p$page}"
  if ((SECONDS - T0 > BUDGET - 25)); then
    say "budget of ${BUDGET}s nearly spent: skipping d=$d s=$s causal=$c"
    NOTES+=(--note "$tag: skipped, time budget of ${BUDGET}s spent")
    continue
  fi
  while :; do
    run_cell "$d" "$s" "$c" "${MODES[$mode_idx]}" "$page"
    case $cell_state in
      ok) ok_cells=$((ok_cells + 1)); break ;;
      counters)
        tail -5 "$WORK/$tag.log"
        skip_suite "ncu cannot read the hardware counters here (see the log above; gVisor machines can't)" ;;
      ncu)
        # Likely a metric or section name this ncu rejects: fall back to a smaller request.
        grep -E "==ERROR==" "$WORK/$tag.log" | head -3
        if ((mode_idx + 1 >= ${#MODES[@]} || SECONDS - T0 >= BUDGET - 25)); then break; fi
        mode_idx=$((mode_idx + 1)) ;;
      *) tail -3 "$WORK/$tag.log"; break ;;
    esac
  done
  [[ $cell_state == ok ]] || NOTES+=(--note "$tag: no counters ($cell_state; log in the tarball)")
done

python3 scripts/ncu_summary.py summarize "$WORK" --md "$WORK/$NAME.md" "${NOTES[@]}" ||
  say "the summary found no cell with counters (or failed); raw outputs are in the tarball"
cp "$WORK/$NAME.md" "$OUT/$NAME.md" 2>/dev/null ||
  echo "$NAME: no summary; see $NAME.tar.gz" >"$OUT/$NAME.md"
tarball="$OUT/$NAME.tar.gz"
tar -C "$WORK" -czf "$tarball" . 2>/dev/null
if (($(stat -c %s "$tarball" 2>/dev/null || echo 0) > 15 * 1024 * 1024)); then  # the device tool returns <= 16 MiB
  say "tarball over 15 MiB: leaving the .ncu-rep files out"
  tar -C "$WORK" --exclude='*.ncu-rep' -czf "$tarball" .
fi
say "done: $ok_cells cell(s) with counters; $OUT/$NAME.md, $tarball"
((ok_cells > 0)) || exit 1
exit 0
