#!/usr/bin/env bash
# Throughput sweep on the lent H200: unpack the SGLang runtime, apply the recipes, `spectool
# bench`. Resumes from RESULTS/cells.jsonl when that file travels along (it is committed).
# Usage there: bash tools/device/bench.sh VERSION RESULTS [spectool bench args]
set -euo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
source tools/device/setup.sh
python3 -m spectool.cli apply --sglang-dir "$SITE" >/dev/null
mkdir -p "$RESULTS"
set +e
python3 -m spectool.cli bench --sglang-dir "$SITE" --out "$RESULTS" "$@" 2>&1 | tee "$OUT/bench-$(basename "$RESULTS").log"
rc=${PIPESTATUS[0]}
set -e
mkdir -p "$OUT/$(basename "$RESULTS")"
for f in cells.jsonl transition.json bench-results.json bench-table.md bench-plot.png; do
  cp "$RESULTS/$f" "$OUT/$(basename "$RESULTS")/" 2>/dev/null || true
done
for a in A1 A2 A4; do tail -c 100000 "$RESULTS/$a.log" > "$OUT/$(basename "$RESULTS")/$a.log" 2>/dev/null || true; done
exit $rc
