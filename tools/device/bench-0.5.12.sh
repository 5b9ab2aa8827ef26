#!/usr/bin/env bash
# Throughput sweep on the lent H200: SGLang 0.5.12 runtime, recipes applied, `spectool bench`.
# Resumes from results/bench/cells.jsonl when that file travels along.
set -euo pipefail
source tools/device/setup-0.5.12.sh
python3 -m spectool.cli apply --sglang-dir /tmp/site >/dev/null
mkdir -p results/bench-0.5.12
set +e
python3 -m spectool.cli bench --sglang-dir /tmp/site --out results/bench-0.5.12 "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
set -e
for f in cells.jsonl transition.json bench-results.json bench-table.md bench-plot.png; do
  cp "results/bench-0.5.12/$f" "$OUT/" 2>/dev/null || true
done
tail -c 200000 results/bench-0.5.12/A2.log > "$OUT/A2.log" 2>/dev/null || true
exit $rc
