#!/usr/bin/env bash
# Golden GPU tests on the lent H200 (see tools/device/README.md): unpack the SGLang 0.5.12
# runtime, apply the recipes to it with spectool, run `spectool verify`, return results.
# Usage there: bash tools/device/verify-0.5.12.sh [extra spectool verify args]
set -euo pipefail
source tools/device/setup-0.5.12.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -m spectool.cli apply --sglang-dir /tmp/site
set +e
python3 -m spectool.cli verify --sglang-dir /tmp/site --out /tmp/verify "$@" 2>&1 | tee "$OUT/verify.log"
rc=${PIPESTATUS[0]}
set -e
cp /tmp/verify/verify-results.json "$OUT/" 2>/dev/null || true
cp golden/0.5.12/*/golden.json "$OUT/" 2>/dev/null || true
tar czf "$OUT/verify-logs.tgz" -C /tmp/verify --exclude='*.job.json' . 2>/dev/null || true
exit $rc
