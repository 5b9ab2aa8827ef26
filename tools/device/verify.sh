#!/usr/bin/env bash
# Golden GPU tests on the lent H200 (see tools/device/README.md): unpack the SGLang runtime,
# apply the recipes to it with spectool, run `spectool verify`, return the results in $OUT.
# Usage there: bash tools/device/verify.sh VERSION [extra spectool verify args, e.g. --record, --tp 2]
# VERIFY_DIR: where the engines write (default /tmp/verify-VERSION; a second run in the same
# call, e.g. at TP=2, takes its own).
set -euo pipefail
SGLANG_VERSION=$1; shift
source tools/device/setup.sh
VERIFY_DIR=${VERIFY_DIR:-/tmp/verify-$SGLANG_VERSION}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -m spectool.cli apply --sglang-dir "$SITE"
set +e
timeout "${VERIFY_TIMEOUT:-580}" python3 -m spectool.cli verify --sglang-dir "$SITE" --out "$VERIFY_DIR" "$@" 2>&1 | tee "$OUT/verify-$SGLANG_VERSION.log"
rc=${PIPESTATUS[0]}
set -e
mkdir -p "$OUT/verify-$SGLANG_VERSION"
cp "$VERIFY_DIR/verify-results.json" "$OUT/verify-$SGLANG_VERSION/" 2>/dev/null || true
cp golden/"$SGLANG_VERSION"/*/golden.json "$OUT/verify-$SGLANG_VERSION/" 2>/dev/null || true
tar czf "$OUT/verify-$SGLANG_VERSION/verify-logs.tgz" -C "$VERIFY_DIR" --exclude='*.job.json' --exclude=models . 2>/dev/null || true
exit $rc
