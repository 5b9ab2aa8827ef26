#!/usr/bin/env bash
# Several independent runs (fresh engines each) of the same bench in one call, on both GPUs
# of an `nvidia-h200-x2` (bench-both.sh): RESULTS-a-g0, RESULTS-a-g1, RESULTS-b-g0, ... A run
# starts only while CALL_LIMIT (default 585 s) leaves RUN_S (default 230 s) for it, and each
# is capped at what is left, so a call never overruns. Everything is packed into one
# $OUT/runs.tar at the end: the device tool brings back only a few files per call.
# Usage there: bash tools/device/bench-runs.sh VERSION RESULTS RUNS [spectool bench args]
set -uo pipefail
SGLANG_VERSION=$1; RESULTS=$2; RUNS=$3; shift 3
OUT=${OUT:-/tmp/out}
export BENCH_KEEP=0  # each run on engines of its own, never resumed from an earlier call's copy
CALL_LIMIT=${CALL_LIMIT:-585}; RUN_S=${RUN_S:-230}
for r in $(echo abcdefgh | head -c "$RUNS" | fold -w1); do
  left=$((CALL_LIMIT - SECONDS))
  if [ "$left" -lt "$RUN_S" ]; then echo "run $r not started: $left s left, a run needs $RUN_S"; break; fi
  echo "== run $r at ${SECONDS}s ($left s left)"
  BENCH_TIMEOUT=$((left - 15)) bash "$(dirname "$0")/bench-both.sh" "$SGLANG_VERSION" "$RESULTS-$r" "$@" --budget $((left - 45))
  for g in 0 1; do mv "$OUT/bench-g$g.out" "$OUT/bench-$r-g$g.out"; done
done
( cd "$OUT" && tar cf runs.tar --remove-files -- * 2>/dev/null; ls -la runs.tar )
