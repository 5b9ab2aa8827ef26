#!/usr/bin/env bash
# The same bench on both GPUs of an `nvidia-h200-x2` at once: two runs per call, each with its
# own GPU, runtime copy (SITE) and ports, into RESULTS-g0 and RESULTS-g1. Each run's output goes to $OUT/bench-gN.out; BENCH_TIMEOUT passes through.
# Usage there: bash tools/device/bench-both.sh VERSION RESULTS [spectool bench args]
set -uo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for g in 0 1; do
  (
    # A runtime copy per release and GPU: setup.sh keeps a copy already there, so a warm
    # machine must not find another release's under this name.
    export CUDA_VISIBLE_DEVICES=$g SITE=/tmp/site-$SGLANG_VERSION-g$g
    bash tools/device/bench.sh "$SGLANG_VERSION" "$RESULTS-g$g" "$@" --port-base $((22000 + 3000 * g)) \
      > "$OUT/bench-g$g.out" 2>&1
    echo "rc=$?" >> "$OUT/bench-g$g.out"
  ) &
done
wait
for g in 0 1; do echo "== GPU $g"; tail -n 24 "$OUT/bench-g$g.out"; done
