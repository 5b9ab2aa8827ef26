#!/usr/bin/env bash
# Throughput sweep on the lent H200: SGLang 0.5.12 runtime, recipes applied, `spectool bench`.
# Resumes from results/bench/cells.jsonl when that file travels along.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/site "$OUT"
[ -d /tmp/site/sglang ] || tar xJf .device-cache/sglang-0.5.12-site.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
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
