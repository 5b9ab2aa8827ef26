# Sourced by bench-setup.sh: a results folder that lasts across the calls of one warm machine.
# The device returns a call's folder packed, and the next call starts from the tree it is
# sent: without this, a sweep longer than one call needs the returned archive unpacked into the
# tree within the machine's idle time. Here each call also leaves its folder in
# KEEP_ROOT/NAME (default /tmp/bench-keep) on the machine, and the next call into the same
# NAME seeds from whichever holds more cells: that copy or the RESULTS folder it was sent.
# BENCH_KEEP=0 turns it off (bench-runs.sh, whose runs are each meant to start afresh).
# seed_dest RESULTS DEST: fill DEST from the fuller of RESULTS and the kept copy.
# keep_dest DEST: replace the kept copy with DEST (models and traces left out, as packed).
# What a packed folder leaves out (pack_results in bench-setup.sh), and so the kept copy.
PACK_EXCLUDE=(--exclude=models --exclude=traces)
_cells() { if [ -f "$1/cells.jsonl" ]; then wc -l < "$1/cells.jsonl"; else echo 0; fi; }
_kept() { echo "${KEEP_ROOT:-/tmp/bench-keep}/$(basename "$1")"; }

seed_dest() {
  local results=$1 dest=$2 kept
  kept=$(_kept "$dest")
  if [ "${BENCH_KEEP:-1}" = 1 ] && [ -d "$kept" ] && [ "$(_cells "$kept")" -gt "$(_cells "$results")" ]; then
    echo "seeding $(basename "$dest") from this machine's copy ($(_cells "$kept") cells; $results has $(_cells "$results"))"
    cp -r "$kept"/. "$dest"/
  elif [ -d "$results" ]; then
    cp -r "$results"/. "$dest"/
  fi
}

keep_dest() {
  local dest=$1 kept
  [ "${BENCH_KEEP:-1}" = 1 ] || return 0
  kept=$(_kept "$dest")
  rm -rf "$kept" && mkdir -p "$kept"
  tar cf - -C "$dest" "${PACK_EXCLUDE[@]}" . | tar xf - -C "$kept"
}
