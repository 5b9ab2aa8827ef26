# Sourced by bench-setup.sh (with OUT, DEST and BENCH set): stage LOG BUDGET [bench args], one
# stage of a derived sweep (bench-threshold.sh, bench-tiers.sh) under --budget BUDGET (engine
# start-up included) and a timeout a minute past it. Its status: the bench's, 124 at the
# timeout, and 75 where the budget stopped it with cells left, so that nothing is derived from
# part of the grid (a second call resumes the cells). A stage skips the transition workload
# unless the caller sets STAGE_TRANSITION=1 for it (the derived arm's stage, whose switches it
# measures).
#
# A call has CALL_BUDGET seconds in all (default 540: the device's 600 s per call, less the
# packing), counted from the script's start (bash's SECONDS). A stage whose budget and timeout
# fit in what is left runs as asked; one that does not gets what is left less its timeout's
# minute, and where that is under MIN_STAGE_S (default 180: an engine's start-up and a few
# cells) it does not start and returns 75. So the same command, called again until it exits
# 0, measures a whole sweep, each call resuming the cells the one before left. The stage's
# output goes to $OUT/LOG (this call's) and is appended to $DEST/LOG, which the results folder
# keeps: one log of every call's stage.
call_seconds_left() { echo $((${CALL_BUDGET:-540} - SECONDS)); }

stage() {
  local log=$1 budget=$2 transition=(--no-transition)
  shift 2
  [ "${STAGE_TRANSITION:-0}" = 1 ] && transition=()
  local left=$(($(call_seconds_left) - 60))
  if [ "$budget" -gt "$left" ]; then
    if [ "$left" -lt "${MIN_STAGE_S:-180}" ]; then
      echo "$log: $((left + 60)) s left of this call's ${CALL_BUDGET:-540}, too few for the stage; call again to run it"
      return 75
    fi
    budget=$left
  fi
  timeout $((budget + 60)) "${BENCH[@]}" "${transition[@]}" --budget "$budget" "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ] && grep -q "time budget reached" "$OUT/$log"; then rc=75; fi
  [ "$rc" -eq 0 ] || echo "$log: stopped with cells left to measure ($rc); call again to resume them" | tee -a "$OUT/$log"
  { echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ), --budget $budget: ${transition[*]} $*"; cat "$OUT/$log"; echo; } >> "$DEST/$log"
  return "$rc"
}
