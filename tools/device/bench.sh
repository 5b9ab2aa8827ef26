#!/usr/bin/env bash
# Throughput sweep on the lent H200: unpack the SGLang runtime, apply the recipes, `spectool
# bench`. Measures straight into $OUT/NAME (seeded from the committed RESULTS folder, so a run
# resumes from its cells.jsonl and a call cut off at its time limit still returns every cell).
# Usage there: bash tools/device/bench.sh VERSION RESULTS [spectool bench args]
set -euo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
source tools/device/setup.sh
source tools/device/bench-setup.sh
# BENCH_TIMEOUT (seconds) stops a run that overshoots, so the results are still packed.
set +e
timeout "${BENCH_TIMEOUT:-580}" "${BENCH[@]}" "$@" 2>&1 | tee "$OUT/bench-$(basename "$RESULTS").log"
rc=${PIPESTATUS[0]}
# The device tool returns only a few files per call: pack the folder into one.
pack_results
exit $rc
