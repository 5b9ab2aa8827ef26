# Sourced by the bench scripts after setup.sh, with RESULTS set: apply the recipes to the
# runtime, and measure into DEST=$OUT/NAME (NAME: RESULTS' last part), seeded from the
# committed RESULTS folder (or this warm machine's copy of an earlier call's, keep.sh) so that
# a cut-off run resumes from its cells.jsonl.
# pack_results packs DEST into one archive: the device tool returns only a few files a call.
python3 -m spectool.cli apply --sglang-dir "$SITE" >/dev/null
DEST="$OUT/$(basename "$RESULTS")"
mkdir -p "$DEST"
source tools/device/keep.sh
seed_dest "$RESULTS" "$DEST"
BENCH=(python3 -m spectool.cli bench --sglang-dir "$SITE" --out "$DEST")
pack_results() {
  keep_dest "$DEST"
  tar czf "$DEST.tgz" -C "$DEST" "${PACK_EXCLUDE[@]}" . && rm -rf "$DEST"
}

# stage(): one stage of a derived sweep, under this call's time (stage.sh).
source tools/device/stage.sh
