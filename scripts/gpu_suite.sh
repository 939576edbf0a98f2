#!/usr/bin/env bash
# One device call: build with the CUDA backend, run the jit + gpu suites, the Python suite on the GPU,
# compute-sanitizer on small shapes, and the GPU benchmark. Logs go to $OUT (the device tool returns them).
# STEPS selects a subset: STEPS=build,jit,gpu,portable,python,prebuild,sanitize,ncu,ncusrc,bench,overhead,train,
# memory,fuzz,huge,fa3,decode,decodemodes,ab,bwdab,trainprof,sweep,fp8probe,pagedprefill
# (default: build,jit,gpu,portable,python,sanitize,bench). `overhead` times the per-call host cost (C++
# alone and through Python, against SDPA; with a pre-change tree in .base/ (carried), that too, for a
# before/after in one run); `train` runs examples/train_gpt.py per attention backend; `memory` the
# peak-memory benchmark; `prebuild` compiles every kernel variant into the cache; `fuzz` the differential
# GPU fuzzer (FUZZ_SECONDS, FUZZ_WORKERS; beside the sanitizer when both run); `huge` the
# more-than-2^31-elements test. `decode` times the decode grid (gpu_decode_bench.py --perf-md; FA3 as a peer
# when /tmp/fa3 holds an FA3_DECODE=1 build) after a quick pass per FLASHPORT_DECODE shape (DECODE_MODES,
# default 0 1 2 4: row-split kernel, default, two stages, four warps; README lists the shapes). `ab` times
# the portable forward and decode kernels (AB_KINDS, default prefill,decode; `backward` adds the backward
# call; each cell's kernels are timed too) of this tree and of .base/ (carried: a pre-change tree) in
# alternating rounds.
# GPU_FILTER narrows the gpu step to gtest filters, run group by group in the order given (space-separated;
# default: the whole ctest label), one process per test, each stopped after GPU_TEST_TIMEOUT seconds
# (default 150: a hung kernel then costs that, not the call). A snapshot without
# git history should pass FLASHPORT_COMMIT=<hash> so the benchmark stamps docs/PERF.md with it.
# `fa3` builds FA3 (flash-attention's hopper/, the same-run peer) in the background from the first step on,
# from sources in the ignored .peers/ (carried: .peers/fa3 and .peers/build_fa3.sh, .peers/fa3_bench.py,
# copied from the workspace's shared/peers), and at the end times it beside flashport (FA3_SEQS, FA3_DIMS
# narrow the grid; FA3_MODES=fwd,bwd,fp8_fwd times it with bench/gpu_bench.py instead, fp8_fwd against an
# FA3_FP8=1 build); overhead_bench then imports it too. A warm machine's /tmp/fa3 (a build an earlier
# call started: `bash .peers/build_fa3.sh` runs on after its call) is reused.
# `ncusrc` samples where the warps wait per SASS instruction (ncu source page; NCUSRC_CELLS, scripts/ncu_stalls.py).
# `bwdab` times the backward under each value of one knob (scripts/ab_bwd.py; BWDAB_KNOB, BWDAB_VALUES, BWDAB_ARGS).
# `sweep` times the Hopper forward per launch setting at training shapes (SWEEP_SHAPES, SWEEP_SETTINGS).
# BUILD_TARGETS narrows the build step to some ninja targets (e.g. host_overhead_bench).
# CONCURRENT=1 runs the gpu and portable steps in the background beside python, fuzz and sanitize (a
# correctness call: the GPU is shared, so take no timings from it).
# Logs go to $LOGS; at exit they, the benchmarks' JSON lines and the docs they rewrite are packed into
# $OUT/logs.tgz (the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:-/tmp/flashport-out}
OUT=${LOGS:-/tmp/flashport-logs}
mkdir -p "$OUT" "$DEST"
pack() {
  # -n: a plot a step drew under the same name (perf_paged_prefill.png) is the run's, not the repo's copy.
  cp -n docs/PERF.md docs/*.png "$OUT/" 2>/dev/null
  tar czf "$DEST/logs.tgz" -C "$OUT" . 2>/dev/null
}
trap pack EXIT
STEPS=${STEPS:-build,jit,gpu,portable,python,sanitize,bench}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
export FLASHPORT_CACHE_DIR=${FLASHPORT_CACHE_DIR:-/tmp/flashport-cache}
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "=== $1 ($(date +%T))"; }
# The Python package for the steps that import it, built once (the python step installs it too).
# PIP_EARLY=1 starts that install at once, beside the build; need_package then waits for it.
pip_pid=
if [[ -n "${PIP_EARLY:-}" ]]; then
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 &
  pip_pid=$!
fi
need_package() {
  if [[ -n "$pip_pid" ]]; then wait "$pip_pid"; pip_pid=; fi
  python3 -c 'import flashport' 2>/dev/null || python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1
}

if has fa3; then
  if [[ -d /tmp/fa3 && ! -f /tmp/fa3_failed ]]; then
    # A warm machine keeps the background build an earlier call started (setsid): reuse it, done or not.
    echo "fa3: reusing the build in /tmp/fa3 ($([[ -f /tmp/fa3_done ]] && echo done || echo running))"
  elif [[ -f .peers/build_fa3.sh && -d .peers/fa3/hopper ]]; then
    bash .peers/build_fa3.sh .peers/fa3
  else
    echo "fa3: .peers/build_fa3.sh or .peers/fa3/hopper missing (carry .peers)"
  fi
fi

ab_pid=
if has ab && [[ -d .base ]]; then  # the pre-change tree's package for the ab step, built beside the first steps
  python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/flashport-base ./.base >"$OUT/pip_base.log" 2>&1 &
  ab_pid=$!
fi

step "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

if has build; then
  step "build"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHPORT_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C build-gpu -j 16 ${BUILD_TARGETS:-} >"$OUT/build.log" 2>&1 || { grep -m 30 -A5 error "$OUT/build.log"; exit 1; }
  echo "built"
fi
if has prebuild; then
  # Every kernel variant of this GPU compiled once, in parallel, into the cache every later step shares (the
  # fuzzer's worker processes would otherwise each compile what they meet first).
  step "prebuild every kernel variant for this GPU"
  build-gpu/src/jit/flashport-prebuild -j "$(nproc)" 2>&1 | tail -2
fi
if has jit; then
  step "jit suite (variants compile for sm_80 and sm_90a)"
  (cd build-gpu && ctest -L jit --output-on-failure -j 8 >"$OUT/jit.log" 2>&1) || status=1
  tail -5 "$OUT/jit.log"
fi
gpu_steps() {
if has gpu; then
  step "gpu suite"
  if [[ -n "${GPU_FILTER:-}" ]]; then
    # One process per test, so a crash (a host segfault once hid every test after it) costs one result;
    # GPU_TIMEOUT bounds the whole loop: tests it leaves unstarted are listed as such.
    gpu_t0=$(date +%s)
    : >"$OUT/gpu.log"
    # Several filters separated by spaces run in that order (the first group first within GPU_TIMEOUT).
    set -f  # a filter such as '*' is a gtest pattern, not a file glob
    for t in $(for f in $GPU_FILTER; do
                 build-gpu/tests/flashport_tests_gpu --gtest_list_tests --gtest_filter="$f" |
                   awk '/^[^ ]/{suite=$1} /^  /{print suite $1}'
               done); do
      left=$((${GPU_TIMEOUT:-300} - ($(date +%s) - gpu_t0)))
      if ((left <= 0)); then echo "[ NOT RUN  ] $t (GPU_TIMEOUT)" >>"$OUT/gpu.log"; status=1; continue; fi
      # GPU_TEST_TIMEOUT caps one test, so a hung kernel costs that much, not the rest of the group's time.
      ((left > ${GPU_TEST_TIMEOUT:-150})) && left=${GPU_TEST_TIMEOUT:-150}
      timeout "$left" build-gpu/tests/flashport_tests_gpu --gtest_filter="$t" >>"$OUT/gpu.log" 2>&1
      rc=$?
      if ((rc == 124)); then echo "[ TIMED OUT] $t (GPU_TIMEOUT)" >>"$OUT/gpu.log"
      elif ((rc > 1)); then echo "[  CRASHED ] $t (exit $rc)" >>"$OUT/gpu.log"; fi
      ((rc == 0)) || status=1
    done
    set +f
  else
    (cd build-gpu && ctest -L gpu --output-on-failure -j 1 --timeout 300 >"$OUT/gpu.log" 2>&1) || status=1
  fi
  grep -E "tests passed|OK \]|Failed|FAILED \]|CRASHED|TIMED OUT|NOT RUN|\*\*\*" "$OUT/gpu.log" | head -60
fi
if has portable; then
  # On sm_90 the backward tests above run the Hopper main kernel wherever it applies; this reruns them
  # with the portable kernel forced, so both stay covered on this GPU.
  step "gpu backward suite with the portable kernel forced"
  # rerun LOG FILTER VAR=VALUE: the GPU tests matching FILTER with one knob set.
  rerun() {
    env "$3" build-gpu/tests/flashport_tests_gpu --gtest_filter="$2" >"$OUT/$1" 2>&1 || status=1
    grep -E "PASSED|FAILED|Failure" "$OUT/$1" | head -20
  }
  rerun gpu_portable_bwd.log 'GpuBackward*' FLASHPORT_CUDA_BACKWARD=portable
  # The knob reruns take the small cases (*Small*: SmallDeterministic included): ManyBlocks and
  # DeterministicBitwise cost 80-95 s per rerun and exercise no path the small cases do not.
  # The Hopper backward's other dQ path (producer warps' reductions instead of bulk reduce-adds).
  rerun gpu_hopper_bwd_dq0.log 'HopperBwd.Small*' FLASHPORT_HOPPER_BWD_DQ=0
  # d 256 in clusters of two (off by default): the tests with several key blocks per sequence too.
  rerun gpu_hopper_bwd_pair.log 'HopperBwd.Small*:HopperBwd.ManyBlocks' FLASHPORT_HOPPER_BWD_PAIR=1
  # 64 queries per step at d 64 with bulk dQ (the table takes 128; deterministic mode and dropout 64).
  rerun gpu_hopper_bwd_m64.log 'HopperBwd.Small*' FLASHPORT_HOPPER_BWD_BLOCK_M=64
  # The row-major dQ accumulator batches of many short sequences take (tiled by default at these sizes).
  rerun gpu_hopper_bwd_dq_rows.log 'HopperBwd.Small*' FLASHPORT_HOPPER_BWD_DQ_ROWS=1
fi
if has decodemodes; then
  # The decode variant's other shapes (DECODE_TEST_MODES, FLASHPORT_DECODE values: several CTAs per SM,
  # bulk row copies; `nocluster`: FLASHPORT_DECODE_CLUSTER=0, split grids of 2..8 merged through scratch and
  # split_combine instead of a cluster) over the decode-shaped tests, small pages, bad table entries and
  # splits included.
  step "gpu decode tests under each FLASHPORT_DECODE shape"
  decode_tests='GpuForwardSmall.*:GpuForward.DecodeShapesUseSplitKv:GpuForwardPaged.*:GpuKvCache*:GpuForwardFp8.SplitKvDecode'
  for mode in ${DECODE_TEST_MODES:-6 7 8 9 nocluster}; do
    knob=FLASHPORT_DECODE=$mode
    [[ $mode == nocluster ]] && knob=FLASHPORT_DECODE_CLUSTER=0
    echo "--- $knob"
    env "$knob" build-gpu/tests/flashport_tests_gpu --gtest_filter="$decode_tests" \
      >"$OUT/gpu_decode_mode$mode.log" 2>&1 || status=1
    grep -E "PASSED|FAILED|Failure" "$OUT/gpu_decode_mode$mode.log" | head -20
  done
fi
return $status
}
gpu_pid=
if [[ -n "${CONCURRENT:-}" ]]; then
  gpu_steps >"$OUT/gpu_steps.txt" 2>&1 &
  gpu_pid=$!
else
  gpu_steps
fi
py_pid=
if has python; then
  step "python suite on the GPU${PY_BACKGROUND:+ (in the background)}"
  if [[ -n "${PIP_EARLY:-}" ]]; then
    need_package || { tail -20 "$OUT/pip.log"; status=1; }
  else
    python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; status=1; }
  fi
  if [[ -n "${PY_BACKGROUND:-}" ]]; then  # beside the fuzzer and the sanitizer: a few cores of its own
    OMP_NUM_THREADS=2 python3 -m pytest -q -x tests/python >"$OUT/pytest.log" 2>&1 &
    py_pid=$!
  else
    python3 -m pytest -q -x tests/python >"$OUT/pytest.log" 2>&1 || status=1
    tail -15 "$OUT/pytest.log"
  fi
fi
fuzz_pid=
if has fuzz; then
  # In the background when the sanitizer runs too: the fuzzer is CPU-bound (the fp64 oracle), the
  # sanitizer GPU- and single-thread-bound.
  step "differential fuzzing of the CUDA kernels against the CPU oracle (${FUZZ_SECONDS:-120} s)"
  need_package
  python3 tests/fuzz/gpu_diff_fuzz.py --seconds "${FUZZ_SECONDS:-120}" --workers "${FUZZ_WORKERS:-14}" \
    >"$OUT/gpu_fuzz.log" 2>&1 &
  fuzz_pid=$!
  has sanitize || wait $fuzz_pid
fi
if has sanitize; then
  # Every kernel family on small shapes: the portable and Hopper forward and backward (*Small*), split-KV
  # combine, kv-cache append/rotary (GpuKvCacheSmall), merge_states, paged decode, the fp8 forward (its
  # tiles are decoded and stored synchronously, not by cp.async).
  # The three tools run at once (each is one CPU thread driving the GPU); SANITIZE_FILTER_<tool> narrows one.
  step "compute-sanitizer (memcheck, racecheck, synccheck) over every kernel family, small shapes"
  all_small='*Small*:GpuMergeStates*:GpuForwardPaged.DecodeWithSplits:GpuForwardFp8.*'
  # One plain run first fills the kernel cache the three tools then share: on a cold cache each tool compiled
  # every variant itself under instrumentation, and 200 s covered 41 of the 49 tests (2026-12-07).
  build-gpu/tests/flashport_tests_gpu --gtest_filter="${SANITIZE_FILTER:-$all_small}" >"$OUT/sanitize_warm.log" 2>&1
  declare -A san_pid
  for tool in memcheck racecheck synccheck; do
    var="SANITIZE_FILTER_$tool"
    timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/flashport_tests_gpu \
      --gtest_filter="${!var:-${SANITIZE_FILTER:-$all_small}}" >"$OUT/sanitize_$tool.log" 2>&1 &
    san_pid[$tool]=$!
  done
  for tool in memcheck racecheck synccheck; do
    wait ${san_pid[$tool]}; rc=$?
    echo "$tool exit $rc ($(grep -c 'OK \]' "$OUT/sanitize_$tool.log") tests passed)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED" "$OUT/sanitize_$tool.log" | tail -4
  done
fi
if [[ -n "$gpu_pid" ]]; then
  wait $gpu_pid || status=1
  cat "$OUT/gpu_steps.txt"
fi
if [[ -n "$py_pid" ]]; then
  wait $py_pid || status=1
  step "python suite on the GPU: result"
  tail -15 "$OUT/pytest.log"
fi
if [[ -n "$fuzz_pid" ]]; then
  wait $fuzz_pid || status=1
  step "differential fuzzing: result"
  grep -v "^  [0-9]* problems" "$OUT/gpu_fuzz.log" | tail -25
fi
if has huge; then
  step "tensors over 2^31 elements, forward and backward"
  FLASHPORT_HUGE=1 python3 -m pytest -q tests/python/test_huge.py 2>&1 | tail -5 || status=1
fi
if has ncu; then
  step "ncu counters of the Hopper forward"
  need_package
  OUT="$OUT/ncu" bash scripts/ncu_hopper_fwd.sh 2>&1 | tail -30
fi
if has ncusrc; then
  # Where the warps wait, per SASS instruction: one launch per NCUSRC_CELLS entry (pass:d:seqlen:causal;
  # decode:BxCTX for the decode variant through scripts/ncu_decode.sh) under `--set full --import-source
  # yes`, its source page summarised by scripts/ncu_stalls.py into ncusrc_<cell>.md.
  step "ncu source-level stall samples"
  need_package
  source scripts/find_ncu.sh
  ncu_bin=$(find_ncu)
  mkdir -p "$OUT/ncusrc"
  for cell in ${NCUSRC_CELLS:-fwd:128:4096:1 bwd:128:8192:0 decode:1x1024}; do
    IFS=: read -r pass a b c <<<"$cell"
    tag=${cell//:/_}
    if [[ $pass == decode ]]; then
      OUT="$OUT/ncusrc" CELLS="$a" bash scripts/ncu_decode.sh 2>&1 | tail -2
      csv="$OUT/ncusrc/decode_${a}_page${PAGE:-0}.sass.csv"
    else
      csv="$OUT/ncusrc/$tag.sass.csv"
      NCU_PASS=$pass timeout 120 "$ncu_bin" --set full --import-source yes --kernel-name-base demangled \
        -k "regex:flashport_attn_${pass}_sm90" --launch-skip 3 --launch-count 1 -f -o "$OUT/ncusrc/$tag" \
        python3 scripts/ncu_summary.py run "$a" "$b" "$c" --warmup 3 >"$OUT/ncusrc/$tag.log" 2>&1
      "$ncu_bin" --import "$OUT/ncusrc/$tag.ncu-rep" --page source --csv --print-source sass >"$csv" 2>>"$OUT/ncusrc/$tag.log"
    fi
    python3 scripts/ncu_stalls.py "$csv" >"$OUT/ncusrc_$tag.md" 2>&1 && head -16 "$OUT/ncusrc_$tag.md" || status=1
    rm -f "$OUT"/ncusrc/*.ncu-rep
    gzip -f "$csv"
  done
fi
fa3_ready() {  # waits up to FA3_WAIT seconds for the background build
  local waited=0
  while [[ ! -f /tmp/fa3_done && ! -f /tmp/fa3_failed && $waited -lt ${FA3_WAIT:-300} ]]; do sleep 5; waited=$((waited + 5)); done
  [[ -f /tmp/fa3_done ]]
}
if has overhead; then
  step "per-call overhead: C++ host time, then through Python vs SDPA"
  if has fa3 && fa3_ready; then export PYTHONPATH=/tmp/fa3/hopper${PYTHONPATH:+:$PYTHONPATH}; fi
  build-gpu/bench/host_overhead_bench 2>&1 | tee "$OUT/host_overhead.log"
  need_package
  python3 bench/overhead_bench.py --perf-md --out "$OUT/overhead.jsonl" 2>&1 | tee "$OUT/overhead.log" || status=1
  if [[ -d .base ]]; then
    # Its own inductor cache: the caches key on the traced graph, which calls flashport::fwd in both
    # trees, so the base run would otherwise load this tree's compiled graph (flashport::fwd_impl).
    echo "--- the same on the tree in .base/ (before the change)"
    python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/flashport-base ./.base >"$OUT/pip_base.log" 2>&1 \
      && PYTHONPATH=/tmp/flashport-base TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-base \
        python3 bench/overhead_bench.py --out "$OUT/overhead_base.jsonl" 2>&1 | tail -11
  fi
fi
if has ab && [[ -d .base ]]; then
  step "kernel before/after: the portable forward and decode of this tree and of .base/, alternating rounds"
  need_package
  wait "$ab_pid" || { tail -20 "$OUT/pip_base.log"; status=1; }
  for round in ${AB_ROUNDS:-1 2}; do
    PYTHONPATH=/tmp/flashport-base FLASHPORT_CUDA_FORWARD=portable \
      python3 scripts/ab_kernels.py --kinds "${AB_KINDS:-prefill,decode}" --tag "base$round" --out "$OUT/ab_base.jsonl" 2>&1 | tail -24
    FLASHPORT_CUDA_FORWARD=portable python3 scripts/ab_kernels.py --kinds "${AB_KINDS:-prefill,decode}" --tag "new$round" \
      --out "$OUT/ab_new.jsonl" 2>&1 | tail -24
  done
  python3 scripts/ab_kernels.py --compare "$OUT/ab_base.jsonl" "$OUT/ab_new.jsonl" | tee "$OUT/ab.md"
fi
if has bwdab; then
  # The backward under each value of one knob, one process per value, values alternating over rounds
  # (scripts/ab_bwd.py): BWDAB_KNOB, BWDAB_VALUES, BWDAB_ARGS (e.g. --dims 64 --seqlens 2048); or several
  # A/Bs in a row: BWDAB="knob|values|args;knob|values|args" (a knob arg:NAME passes --NAME VALUE).
  need_package
  # FA3 (the fa3 step's build, or one started before this script) for `--knob arg:impl --values flashport,fa3`.
  if [[ "${BWDAB:-}" == *arg:impl* ]] && fa3_ready; then export PYTHONPATH=/tmp/fa3/hopper${PYTHONPATH:+:$PYTHONPATH}; fi
  IFS=';' read -ra bwdab_runs <<<"${BWDAB:-${BWDAB_KNOB:-FLASHPORT_HOPPER_BWD_DQ}|${BWDAB_VALUES:-0,1}|${BWDAB_ARGS:-}}"
  for run in "${bwdab_runs[@]}"; do
    IFS='|' read -r knob values args <<<"$run"
    step "backward A/B: $knob = $values ($args)"
    python3 scripts/ab_bwd.py --knob "$knob" --values "$values" $args --out "$OUT/ab_bwd.jsonl" 2>&1 |
      tee -a "$OUT/ab_bwd.md" || status=1
  done
fi
if has train; then
  step "train_gpt: GPT-2 small, batch 8 x 1024, the attention backends side by side in one process"
  python3 examples/train_gpt.py --attn ${TRAIN_ATTN:-flashport sdpa-flash sdpa-cudnn} ${TRAIN_ARGS:-} --no-progress \
    --log "$OUT/train_{attn}.jsonl" 2>&1 | tail -12 || status=1
  python3 examples/train_gpt.py --plot "$OUT"/train_*.jsonl --out docs/train_gpt_loss.png 2>&1 | tail -8
  cp docs/train_gpt_loss.png "$OUT/" 2>/dev/null
fi
if has trainprof; then
  # Where a training step's time goes per attention backend (scripts/profile_train.py): wall time of
  # the forward, forward + backward and whole step in interleaved rounds, then GPU kernels and host ops.
  step "training step profile per attention backend"
  need_package
  for shape in ${TRAINPROF_SHAPES:-8x1024}; do
    python3 scripts/profile_train.py --batch "${shape%x*}" --seq "${shape#*x}" ${TRAINPROF_ARGS:---parts --kernels --ops} \
      2>&1 | tee "$OUT/trainprof_$shape.log" || status=1
  done
fi
if has sweep; then
  # The Hopper forward under each launch setting at training shapes (scripts/sweep_hopper_fwd.py), to
  # re-derive the d 64 rule: SWEEP_SHAPES "b,s,h,d[:causal]" entries, SWEEP_SETTINGS its --settings.
  step "Hopper forward launch settings at training shapes"
  need_package
  for shape in ${SWEEP_SHAPES:-8,1024,12,64:causal 4,2048,16,64 8,2048,16,64:causal 2,4096,12,64:causal 2,4096,12,64}; do
    python3 scripts/sweep_hopper_fwd.py --shape "${shape%%:*}" $([[ $shape == *:causal ]] && echo --causal) \
      ${SWEEP_SETTINGS:+--settings "$SWEEP_SETTINGS"} 2>&1 | tee -a "$OUT/sweep.log" || status=1
  done
fi
if has memory; then
  step "peak memory of forward + backward vs sequence length"
  python3 bench/memory_bench.py --out "$OUT/memory.jsonl" 2>&1 | tail -20 || status=1
  cp docs/perf_memory.png "$OUT/" 2>/dev/null
fi
if has decode; then
  step "decode: quick pass per FLASHPORT_DECODE shape, then the grid"
  need_package
  if [[ -f /tmp/fa3_done ]]; then export PYTHONPATH=/tmp/fa3/hopper${PYTHONPATH:+:$PYTHONPATH}; fi
  # DECODE_QUICK_ARGS picks the cells of the per-shape pass (default --quick), DECODE_ROUNDS repeats it
  # (modes alternating, so drift hits them alike); DECODE_GRID=0 skips the full grid.
  # DECODE_SETTINGS (space-separated) replaces the modes with settings: "rule" (nothing set) or
  # comma-separated NAME=VALUE knobs, `splits=N` passing num_splits=N (e.g. "rule splits=8
  # FLASHPORT_DECODE=6,splits=16").
  settings=${DECODE_SETTINGS:-$(for m in ${DECODE_MODES:-0 1 2 4}; do printf 'FLASHPORT_DECODE=%s ' "$m"; done)}
  for round in $(seq "${DECODE_ROUNDS:-1}"); do
    for setting in $settings; do
      echo "--- $setting (round $round)"
      (splits=0
       IFS=, read -ra kv <<<"$setting"
       for e in "${kv[@]}"; do
         case $e in rule) ;; splits=*) splits=${e#splits=} ;; *) export "$e" ;; esac
       done
       python3 bench/gpu_decode_bench.py ${DECODE_QUICK_ARGS:---quick} --num-splits "$splits" \
         --out "$OUT/decode_${setting//[=,]/_}_r$round.jsonl" 2>&1 | grep -E "^\[") || status=1
    done
  done
  if [[ ${DECODE_GRID:-1} != 0 ]]; then
    python3 bench/gpu_decode_bench.py --perf-md --out "$OUT/decode.jsonl" 2>&1 | tee "$OUT/decode.log" | grep -E "^\[" || status=1
  fi
fi
if has fp8probe; then
  # The fp8 forward's time split (scripts/fp8_probe.py: the V^T pass against the attention kernel and a
  # copy of V) once per FP8PROBE_ENV entry (space-separated; an entry is "rule", nothing set, or
  # comma-separated NAME=VALUE settings, e.g. FLASHPORT_HOPPER_FP8_TILE=64:128:3), FP8PROBE_ARGS its --dims / --seqs.
  step "fp8 forward: V^T pass and kernel per setting"
  need_package
  for setting in ${FP8PROBE_ENV:-rule}; do
    echo "--- $setting"
    (if [[ $setting != rule ]]; then IFS=, read -ra kv <<<"$setting"; export "${kv[@]}"; fi
     python3 scripts/fp8_probe.py ${FP8PROBE_ARGS:-} 2>&1 | tee -a "$OUT/fp8_probe.log") || status=1
  done
fi
if has pagedprefill; then
  # Chunked prefill over a paged cache against the dense one (scripts/paged_prefill_probe.py), once per
  # PAGED_SETTINGS entry (`default`, or VAR=VALUE set for that run): by default the default kernels and then
  # FLASHPORT_CUDA_FORWARD=portable (the path before the Hopper kernel took pages).
  step "paged prefill: one run per setting"
  need_package
  # --fa3: a background FA3_DECODE=1 build (started before this script, or by the fa3 step) as the peer.
  if [[ " ${PAGED_ARGS:-} " == *" --fa3 "* ]] && fa3_ready; then export PYTHONPATH=/tmp/fa3/hopper${PYTHONPATH:+:$PYTHONPATH}; fi
  for setting in ${PAGED_SETTINGS:-default FLASHPORT_CUDA_FORWARD=portable}; do
    echo "--- $setting" | tee -a "$OUT/paged_prefill.log"
    (if [[ $setting != default ]]; then export "${setting?}"; fi
     python3 scripts/paged_prefill_probe.py ${PAGED_ARGS:-} 2>&1 | tee -a "$OUT/paged_prefill.log") || status=1
  done
  python3 scripts/plot_paged_prefill.py "$OUT/paged_prefill.log" --out "$OUT/perf_paged_prefill.png" \
    --title "chunked prefill over a kv cache: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
fi
if has bench; then
  step "benchmark"
  python3 bench/gpu_bench.py --out "$OUT/bench_gpu.jsonl" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1
fi
if has fa3; then
  step "FA3 same-run peer: flashport vs FA3 vs cuDNN vs FA2"
  if fa3_ready; then
    need_package
    if [[ -n "${FA3_MODES:-}" ]]; then  # the repo's grid script with FA3 as a peer (fp8_fwd: e4m3 forwards)
      PYTHONPATH=/tmp/fa3/hopper${PYTHONPATH:+:$PYTHONPATH} python3 bench/gpu_bench.py --peers cudnn,fa3 --modes "$FA3_MODES" --dims "${FA3_DIMS:-64,128,256}" \
        --seqlens "${FA3_SEQS:-512,1024,2048,4096,8192,16384}" --out "$OUT/bench_fa3.jsonl" 2>&1 |
        tee "$OUT/fa3_bench.log" || status=1
    else
      OUT="$OUT" SEQS="${FA3_SEQS:-512,1024,2048,4096,8192,16384}" DIMS="${FA3_DIMS:-64,128,256}" \
        python3 .peers/fa3_bench.py 2>&1 | tee "$OUT/fa3_bench.log" || status=1
    fi
  else
    echo "FA3 did not build in time:"; tail -20 /tmp/fa3_build.log 2>/dev/null
  fi
fi
exit $status
