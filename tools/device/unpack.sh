#!/usr/bin/env bash
# Unpack a carried runtime archive into /tmp/site-VERSION and nothing else: the first of two
# calls that measure two releases in one run. The folder stays while the machine is warm (a
# next call within its idle time), so the second call carries the other release's archive and
# names this one with `spectool bench --arm-sglang-dir NAME=/tmp/site-VERSION` (README.md).
# Usage there: bash tools/device/unpack.sh VERSION
set -euo pipefail
SGLANG_VERSION=$1
source tools/device/setup.sh
# setup.sh keeps a runtime already unpacked on a warm machine; one that a bench or verify of
# this release patched is not the release as published.
for lock in "$SITE/spectool.lock" "$SITE/sglang/spectool.lock"; do
  if [ -e "$lock" ]; then
    echo "unpack.sh: $SITE holds SGLang $SGLANG_VERSION patched by spectool ($lock); unpack it elsewhere:" \
      "SITE=/tmp/stock-$SGLANG_VERSION bash tools/device/unpack.sh $SGLANG_VERSION" >&2
    exit 2
  fi
done
echo "SGLang $SGLANG_VERSION unpacked into $SITE"
