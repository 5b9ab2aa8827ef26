#!/usr/bin/env bash
# Golden GPU tests on the lent H200 (see tools/device/README.md): unpack the SGLang runtime,
# apply the recipes to it with spectool, run `spectool verify`, return the results in $OUT.
# Usage there: bash tools/device/verify.sh VERSION [extra spectool verify args, e.g. --record, --tp 2]
# VERIFY_DIR: where the engines write (default /tmp/verify-VERSION; a second run in the same
# call, e.g. at TP=2, takes its own). Returns $OUT/NAME.log and $OUT/NAME.tgz (NAME:
# VERIFY_DIR's last part) holding verify-results.json, golden.json and verify-logs.tgz.
set -euo pipefail
SGLANG_VERSION=$1; shift
source tools/device/setup.sh
VERIFY_DIR=${VERIFY_DIR:-/tmp/verify-$SGLANG_VERSION}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -m spectool.cli apply --sglang-dir "$SITE"
set +e
timeout "${VERIFY_TIMEOUT:-580}" python3 -m spectool.cli verify --sglang-dir "$SITE" --out "$VERIFY_DIR" "$@" 2>&1 | tee "$OUT/$(basename "$VERIFY_DIR").log"
rc=${PIPESTATUS[0]}
set -e
# The device tool returns only about 8 files per call: the report, the golden file and the
# engine logs go back as one archive named after VERIFY_DIR (two runs in a call, two archives).
PACK="$OUT/$(basename "$VERIFY_DIR")"
mkdir -p "$PACK"
cp "$VERIFY_DIR/verify-results.json" "$PACK/" 2>/dev/null || true
cp golden/"$SGLANG_VERSION"/*/golden.json "$PACK/" 2>/dev/null || true
# Golden models the run trained on the GPU (the MoE target and its head, when not committed)
# come back to be committed under golden/models/.
for m in "$VERIFY_DIR"/models/golden-moe-*; do
  if [ -d "$m" ]; then mkdir -p "$PACK/models" && cp -r "$m" "$PACK/models/"; fi
done
tar czf "$PACK/verify-logs.tgz" -C "$VERIFY_DIR" --exclude='*.job.json' --exclude=models --exclude=stock . 2>/dev/null || true
tar czf "$PACK.tgz" -C "$PACK" . && rm -rf "$PACK"
exit $rc
