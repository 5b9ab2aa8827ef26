#!/usr/bin/env bash
# The fallback's sweep with T derived in the same call, for a target whose crossover is not
# known yet: measure no speculation and EAGLE-3 (A0, A1), let `spectool bench
# --suggest-threshold` place T from them, then measure the fallback (A2) at that T, into the
# same folder. A call cut off by its time limit resumes from cells.jsonl: a second call skips
# the cells already measured. T is placed only once A0 and A1 are measured in full; a call
# that could not measure them all exits 75 (or 124 at its timeout) without measuring A2.
# Usage there: bash tools/device/bench-threshold.sh VERSION RESULTS [spectool bench args, e.g.
# --target qwen3-30b-a3b --concurrency 1,16,64 --max-batch 256 --reps 2]. FIXED_BUDGET,
# FALLBACK_BUDGET: each stage's --budget in seconds (engine start-up included).
set -euo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
source tools/device/setup.sh
source tools/device/bench-setup.sh
BENCH=(python3 -m spectool.cli bench --sglang-dir "$SITE" --out "$DEST" --no-transition)
set +e
timeout $((${FIXED_BUDGET:-300} + 60)) "${BENCH[@]}" --budget "${FIXED_BUDGET:-300}" --arms A0,A1 "$@" 2>&1 \
  | tee "$OUT/bench-fixed.log"
rc=${PIPESTATUS[0]}  # 124: stopped by its timeout, with every cell measured so far kept
THRESHOLD=""
if [ "$rc" -eq 124 ] || grep -q "time budget reached" "$OUT/bench-fixed.log"; then
  # T comes from the whole grid only: a cut-off stage's T could sit below the crossover, and
  # A2's cells measured at it would be resumed later as if they were at the right T.
  echo "bench-threshold: A0 and A1 not measured in full; call again to resume them, then T is placed"
  [ "$rc" -ne 0 ] || rc=75
elif [ "$rc" -eq 0 ]; then
  "${BENCH[@]}" --suggest-threshold --json "$@" > "$DEST/suggested-threshold.json" || rc=$?
  [ "$rc" -ne 0 ] || THRESHOLD=$(python3 -c \
    'import json, sys; t = json.load(open(sys.argv[1])).get("threshold"); print("" if t is None else t)' \
    "$DEST/suggested-threshold.json")
  [ -n "$THRESHOLD" ] || { echo "bench-threshold: no T suggested (see above)"; [ "$rc" -ne 0 ] || rc=3; }
fi
if [ -n "$THRESHOLD" ]; then
  echo "bench-threshold: T=$THRESHOLD"
  timeout $((${FALLBACK_BUDGET:-250} + 60)) "${BENCH[@]}" --budget "${FALLBACK_BUDGET:-250}" --threshold "$THRESHOLD" \
    --arms A0,A1,A2 "$@" 2>&1 | tee "$OUT/bench-fallback.log"
  rc=${PIPESTATUS[0]}
fi
pack_results
exit "$rc"
