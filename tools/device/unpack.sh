#!/usr/bin/env bash
# Unpack a carried runtime archive into /tmp/site-VERSION and nothing else: the first of two
# calls that measure two releases in one run. The folder stays while the machine is warm (a
# next call within its idle time), so the second call carries the other release's archive and
# names this one with `spectool bench --arm-sglang-dir NAME=/tmp/site-VERSION` (README.md).
# Usage there: bash tools/device/unpack.sh VERSION
set -euo pipefail
SGLANG_VERSION=$1
source tools/device/setup.sh
echo "SGLang $SGLANG_VERSION unpacked into $SITE"
