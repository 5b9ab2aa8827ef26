# Sourced by the H200 scripts: unpack the carried SGLang 0.5.12 runtime into /tmp/site (kept
# while the machine stays warm), add the carried wheels spectool needs (libcst, pyflakes),
# and put both on PYTHONPATH. Send .device-cache and .whl along (carry).
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/site "$OUT"
[ -d /tmp/site/sglang ] || tar xJf .device-cache/sglang-0.5.12-site.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
