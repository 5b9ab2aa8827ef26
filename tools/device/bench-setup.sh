# Sourced by the bench scripts after setup.sh, with RESULTS set: apply the recipes to the
# runtime, and measure into DEST=$OUT/NAME (NAME: RESULTS' last part), seeded from the
# committed RESULTS folder so that a cut-off run resumes from its cells.jsonl.
# pack_results packs DEST into one archive: the device tool returns only a few files a call.
python3 -m spectool.cli apply --sglang-dir "$SITE" >/dev/null
DEST="$OUT/$(basename "$RESULTS")"
mkdir -p "$DEST"
if [ -d "$RESULTS" ]; then cp -r "$RESULTS"/. "$DEST"/; fi
BENCH=(python3 -m spectool.cli bench --sglang-dir "$SITE" --out "$DEST")
pack_results() { tar czf "$DEST.tgz" -C "$DEST" --exclude=models --exclude=traces . && rm -rf "$DEST"; }

# stage LOG BUDGET [bench args]: one stage of a derived sweep (bench-threshold.sh,
# bench-tiers.sh) under --budget BUDGET (engine start-up included) and a timeout a minute past
# it, its output in $OUT/LOG. Its status: the bench's, 124 at the timeout, and 75 where the
# budget stopped it with cells left, so that nothing is derived from part of the grid (a
# second call resumes the cells). A stage skips the transition workload unless the caller
# sets STAGE_TRANSITION=1 for it (the derived arm's stage, whose switches it measures).
stage() {
  local log=$1 budget=$2 transition=(--no-transition)
  shift 2
  [ "${STAGE_TRANSITION:-0}" = 1 ] && transition=()
  timeout $((budget + 60)) "${BENCH[@]}" "${transition[@]}" --budget "$budget" "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ] && grep -q "time budget reached" "$OUT/$log"; then rc=75; fi
  [ "$rc" -eq 0 ] || echo "$log: stopped with cells left to measure ($rc); call again to resume them"
  return "$rc"
}
