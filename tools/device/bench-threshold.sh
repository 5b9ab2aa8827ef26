#!/usr/bin/env bash
# The fallback's sweep with T derived in the same call, for a target whose crossover is not
# known yet: measure no speculation and EAGLE-3 (A0, A1), let `spectool bench
# --suggest-threshold` place T from them, then measure the fallback (A2) at that T, into the
# same folder. A call cut off by its time limit resumes from cells.jsonl: a second call skips
# the cells already measured.
# Usage there: bash tools/device/bench-threshold.sh VERSION RESULTS [spectool bench args, e.g.
# --target qwen3-30b-a3b --concurrency 1,16,64 --max-batch 256 --reps 2]. FIXED_BUDGET,
# FALLBACK_BUDGET: each stage's --budget in seconds (engine start-up included).
set -euo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
source tools/device/setup.sh
python3 -m spectool.cli apply --sglang-dir "$SITE" >/dev/null
NAME=$(basename "$RESULTS"); DEST="$OUT/$NAME"
mkdir -p "$DEST"
[ -d "$RESULTS" ] && cp -r "$RESULTS"/. "$DEST"/
BENCH=(python3 -m spectool.cli bench --sglang-dir "$SITE" --out "$DEST" --no-transition)
set +e
timeout $((${FIXED_BUDGET:-300} + 60)) "${BENCH[@]}" --budget "${FIXED_BUDGET:-300}" --arms A0,A1 "$@" 2>&1 \
  | tee "$OUT/bench-fixed.log"
rc=${PIPESTATUS[0]}  # 124: stopped by its timeout, with every cell measured so far kept
THRESHOLD=""
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  rc=0
  "${BENCH[@]}" --suggest-threshold --json "$@" > "$DEST/suggested-threshold.json" || rc=$?
  THRESHOLD=$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1])).get("threshold"); print("" if t is None else t)' \
    "$DEST/suggested-threshold.json" 2>/dev/null)
  [ -n "$THRESHOLD" ] || { echo "bench-threshold: no T suggested (see suggested-threshold.json)"; rc=3; }
fi
if [ -n "$THRESHOLD" ]; then
  echo "bench-threshold: T=$THRESHOLD"
  timeout $((${FALLBACK_BUDGET:-250} + 60)) "${BENCH[@]}" --budget "${FALLBACK_BUDGET:-250}" --threshold "$THRESHOLD" \
    --arms A0,A1,A2 "$@" 2>&1 | tee "$OUT/bench-fallback.log"
  rc=${PIPESTATUS[0]}
fi
tar czf "$DEST.tgz" -C "$DEST" --exclude=models --exclude=traces . && rm -rf "$DEST"
exit "$rc"
