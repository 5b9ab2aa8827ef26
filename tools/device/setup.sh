# Sourced by the H200 scripts with SGLANG_VERSION set: unpack the carried runtime archive
# .device-cache/sglang-$SGLANG_VERSION-site.tar.xz into /tmp/site-$SGLANG_VERSION (kept while
# the machine stays warm), add the carried wheels spectool needs (libcst, pyflakes), and put
# both on PYTHONPATH. Carry the archive and .whl (one archive per call: 64 MiB limit). An
# archive too large to travel with the tree travels in parts (`split -b 24M ARCHIVE
# ARCHIVE.part-`), one per call on a warm machine, which keeps the parts carried before: the
# call that finds no archive but its parts joins them, and stops with exit 2 if they do not
# make the whole archive.
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site-$SGLANG_VERSION}  # one per GPU when two scripts run in one call
ARCHIVE=.device-cache/sglang-$SGLANG_VERSION-site.tar.xz
mkdir -p "$SITE" "$OUT"
if [ ! -d "$SITE/sglang" ]; then
  if [ ! -f "$ARCHIVE" ] && compgen -G "$ARCHIVE.part-*" > /dev/null; then
    if ! cat "$ARCHIVE".part-* | xz -t 2> /dev/null; then
      echo "setup.sh: the parts of $ARCHIVE on this machine ($(cd .device-cache && echo "$(basename "$ARCHIVE")".part-*)) are not the whole archive: carry the missing ones, one call each, on the warm machine" >&2
      exit 2
    fi
    cat "$ARCHIVE".part-* > "$ARCHIVE"
  fi
  tar xJf "$ARCHIVE" -C "$SITE"
fi
# Once per machine: a second script in the same call (e.g. one per GPU) must not reinstall the
# wheels under a process that is importing them.
if [ ! -f "$SITE/.spectool-wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  touch "$SITE/.spectool-wheels"
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
# The sha256 of the recipes, golden and spectool files this call runs, as they are on disk
# (the device's git index can be another commit's): committed beside each result.
find recipes golden spectool -type f ! -name '*.safetensors' ! -name '*.pyc' | sort | xargs sha256sum > "$OUT/.tree-sha256.$$"
mv "$OUT/.tree-sha256.$$" "$OUT/tree-sha256.txt"
