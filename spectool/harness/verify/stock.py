"""The release as published beside the patched tree under test: a control engine.

A golden scenario that fails on every patched engine, the patch without its flags included,
may fail on the release itself. A stock engine answers that: it imports a copy of the tree's
`sglang` package with every patched file put back byte for byte from the originals spectool
saved when it applied the recipes (the tree itself is left as it is).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ... import api
from ...source import locate


def stock_copy(sglang_dir: str, dest: Path) -> Path:
    """Copy the patched tree's `sglang` package under `dest` with its original files restored
    (api.originals); returns the folder to put first on an engine's PYTHONPATH."""
    files = api.originals(sglang_dir)  # refused first, before anything is copied
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(locate(sglang_dir).root / "sglang", dest / "sglang", symlinks=True)
    for rel, data in files.items():
        (dest / rel).write_bytes(data)
    return dest
