#!/usr/bin/env bash
# The fallback's sweep with T derived in the same call, for a target whose crossover is not
# known yet: measure no speculation and EAGLE-3 (A0, A1), let `spectool bench
# --suggest-threshold` place T from them, then measure the fallback (A2) at that T, into the
# same folder. T is placed only once A0 and A1 are measured in full; a call that could not
# measure them all exits 75 (or 124 at its timeout) without measuring A2, as does one with no
# time left for A2 (CALL_BUDGET, stage.sh): call it again, unchanged, until it exits 0; each
# call resumes from cells.jsonl.
# Usage there: bash tools/device/bench-threshold.sh VERSION RESULTS [spectool bench args, e.g.
# --target qwen3-30b-a3b --concurrency 1,16,64 --max-batch 256 --reps 2]. FIXED_BUDGET,
# FALLBACK_BUDGET: each stage's --budget in seconds (engine start-up included), capped by what
# is left of the call's CALL_BUDGET. TRANSITION=1: the A2 engine also runs the transition
# workload.
set -euo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
source tools/device/setup.sh
source tools/device/bench-setup.sh
set +e
stage bench-fixed.log "${FIXED_BUDGET:-300}" --arms A0,A1 "$@"
rc=$?
THRESHOLD=""
if [ "$rc" -eq 0 ]; then
  "${BENCH[@]}" --suggest-threshold --json "$@" > "$DEST/suggested-threshold.json" || rc=$?
  [ "$rc" -ne 0 ] || THRESHOLD=$(python3 -c \
    'import json, sys; t = json.load(open(sys.argv[1])).get("threshold"); print("" if t is None else t)' \
    "$DEST/suggested-threshold.json")
  [ -n "$THRESHOLD" ] || { echo "bench-threshold: no T suggested (see above)"; [ "$rc" -ne 0 ] || rc=3; }
fi
if [ -n "$THRESHOLD" ]; then
  echo "bench-threshold: T=$THRESHOLD"
  STAGE_TRANSITION=${TRANSITION:-0} stage bench-fallback.log "${FALLBACK_BUDGET:-250}" --threshold "$THRESHOLD" --arms A0,A1,A2 "$@"
  rc=$?
fi
pack_results
exit "$rc"
