#!/usr/bin/env bash
# Draft-length tiers on the lent H200, in one call: measure the fixed configurations (no
# speculation, EAGLE-3 at 3, 2 and 1 draft steps), let `spectool bench --suggest-tiers` derive
# the tiers from them, then measure the tiered engine its flags start, into the same folder.
# Usage there: bash tools/device/bench-tiers.sh VERSION RESULTS [spectool bench args, e.g.
# --concurrency 1,16,64 --max-batch 256 --reps 2]. FIXED_BUDGET, TIER_BUDGET: each stage's
# --budget in seconds (engine start-up included), capped by what is left of the call's
# CALL_BUDGET (stage.sh). Returns $OUT/NAME.tgz (with both stages' logs of every call) and this
# call's two logs. The tiers are derived only once the fixed configurations are measured in
# full; a call that could not measure them all, or had no time left for the tiered stage,
# exits 75 (or 124 at its timeout): call it again, unchanged, until it exits 0.
# TRANSITION=1: the tiered engine also runs the transition workload (its switches' cost;
# --transition-rounds N among the bench args reads each phase as the median of N rounds).
# UPSTREAM_SITE: an unpacked SGLang of 0.5.14 or later (tools/device/unpack.sh in the call
# before), or the tree under test itself (/tmp/site-VERSION) when it is one: the tiered stage
# also measures SGLang's own adaptive steps there, in the same run, with the same tiers (UP,
# from suggested-tiers.json). Upstream's default adaptive configuration is not among the arms:
# on 0.5.17 its engine fails at start-up in this bench (see the results report).
set -euo pipefail
SGLANG_VERSION=$1; RESULTS=$2; shift 2
# Each 0.5.14+ engine starts in about two minutes; the tiered stage waits for the slowest.
TIER_BUDGET=${TIER_BUDGET:-$([ -n "${UPSTREAM_SITE:-}" ] && echo 420 || echo 200)}
source tools/device/setup.sh
# Checked once setup.sh has unpacked the tree under test, which UPSTREAM_SITE may name, and
# before anything is patched or started.
if [ -n "${UPSTREAM_SITE:-}" ] && ! grep -qs speculative_adaptive_config "$UPSTREAM_SITE/sglang/srt/server_args.py"; then
  echo "bench-tiers: UPSTREAM_SITE=$UPSTREAM_SITE holds no SGLang with adaptive steps (0.5.14 or later);" \
    "unpack one there in the call before (tools/device/unpack.sh), on this warm machine" >&2
  exit 2
fi
source tools/device/bench-setup.sh
set +e
stage bench-fixed.log "${FIXED_BUDGET:-300}" --arms A0,A1 \
  --variant "S2=A1:speculative_num_steps=2;speculative_num_draft_tokens=3" \
  --variant "S1=A1:speculative_num_steps=1;speculative_num_draft_tokens=2" "$@"
rc=$?
if [ "$rc" -eq 0 ]; then
  "${BENCH[@]}" --suggest-tiers --tier-arms 3=A1,2=S2,1=S1,0=A0 --json "$@" > "$DEST/suggested-tiers.json" || rc=$?
fi
VARIANT=""
if [ "$rc" -eq 0 ]; then
  read -r THRESHOLD VARIANT < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r.get("threshold") or 1, r.get("variant") or "")' "$DEST/suggested-tiers.json")
  [ -n "$VARIANT" ] || { echo "bench-tiers: no tiers suggested (see suggested-tiers.json)"; rc=3; }
fi
UPSTREAM=()
if [ -n "$VARIANT" ] && [ -n "${UPSTREAM_SITE:-}" ]; then
  # The same tiers as upstream's adaptive config (UP2-0_48 ...).
  UP=$(python3 -c '
import json, sys
from spectool.harness.bench.analyze import upstream_variant
r = json.load(open(sys.argv[1]))
json.dump(r["upstream_adaptive_config"], open(sys.argv[2], "w"))
print(upstream_variant(r["tiers"], r["boundaries"], sys.argv[2]))' "$DEST/suggested-tiers.json" "$DEST/upstream-adaptive-config.json")
  UPSTREAM=(--variant "$UP")
  # On another tree its own engine; on the tree under test the arm needs no tree of its own.
  [ "$(realpath "$UPSTREAM_SITE")" = "$(realpath "$SITE")" ] || UPSTREAM+=(--arm-sglang-dir "${UP%%=*}=$UPSTREAM_SITE")
fi
if [ -n "$VARIANT" ]; then
  # A0 stays among the arms, so the table keeps the envelope beside the tiered arm.
  STAGE_TRANSITION=${TRANSITION:-0} stage bench-tiered.log "$TIER_BUDGET" --threshold "$THRESHOLD" --arms A0 --variant "$VARIANT" \
    "${UPSTREAM[@]}" "$@"
  rc=$?
fi
pack_results
exit "$rc"
