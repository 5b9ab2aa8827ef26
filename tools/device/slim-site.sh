#!/usr/bin/env bash
# Shrink an unpacked SGLang runtime folder so that its archive fits one GPU run.
#
# usage: slim-site.sh DIR
#
# Drops sgl_kernel's CPython 3.10 extension modules (the GPU machine runs Python 3.12, which
# cannot import them) and strips debug information from every shared library that carries it
# (xgrammar's bindings are 52 MB with it, 3 MB without). Code and symbol tables stay as built.
set -euo pipefail
site=${1:?usage: slim-site.sh DIR}
[ -d "$site" ] || { echo "slim-site.sh: no folder $site" >&2; exit 2; }
rm -f "$site"/sgl_kernel/*.cpython-310-*.so
find "$site" -name '*.so*' -type f -print0 |
  while IFS= read -r -d '' lib; do
    if readelf -S "$lib" 2>/dev/null | grep -q '\.debug_info'; then
      strip --strip-debug "$lib"
    fi
  done
