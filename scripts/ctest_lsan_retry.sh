#!/usr/bin/env bash
# Runs ctest with the given arguments in the current directory; when it fails only because
# LeakSanitizer's stop-the-world tracer crashed at a test's exit ("Tracer caught signal 11" then
# "LeakSanitizer has encountered a fatal error", a known tool flake of about 1 in 300 process exits:
# google/sanitizers#1353), reruns the failed tests once. Anything else stays a failure: a sanitizer
# report, a failed assertion, a crash of the test itself, or the tracer crashing again on the rerun.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT

ctest "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && exit 0

tracer_crashes=$(grep -c 'LeakSanitizer has encountered a fatal error' "$log")
other_failures=$(grep -cE 'ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:|\[  FAILED  \]|Segmentation fault|SEGFAULT|Timeout|Not Run' "$log")
if [ "$tracer_crashes" -gt 0 ] && [ "$other_failures" -eq 0 ]; then
  echo "ctest_lsan_retry: $tracer_crashes test(s) failed only on LeakSanitizer's tracer crash; rerunning them once"
  exec ctest --rerun-failed --output-on-failure
fi
exit "$status"
