"""The release as published beside the patched tree under test: a control engine.

A golden scenario that fails on every patched engine, the patch without its flags included,
may fail on the release itself. A stock engine answers that: it imports a copy of the tree's
`sglang` package with every patched file put back byte for byte from the originals spectool
saved when it applied the recipes (the tree itself is left as it is).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ... import lockfile
from ...errors import BadInputError
from ...source import locate


def stock_copy(sglang_dir: str, dest: Path) -> Path:
    """Copy the patched tree's `sglang` package under `dest` with its original files restored;
    returns the folder to put first on an engine's PYTHONPATH. A clear error when the tree
    holds no record of what was patched."""
    tree = locate(sglang_dir)
    rec = lockfile.read(tree.dir)
    if rec.lock is None:
        raise BadInputError(
            f"a stock engine needs the originals spectool saved in {tree.dir} ({rec.problem or 'no spectool.lock'}); "
            "run 'spectool apply' there first, or leave the stock engines out (--only)."
        )
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree.root / "sglang", dest / "sglang", symlinks=True)
    for rel in rec.lock.files:
        original = lockfile.original_path(tree.dir, rel)
        if not original.is_file():
            raise BadInputError(f"the original of {rel} is missing from {original.parent}; run 'spectool recover'.")
        shutil.copyfile(original, dest / rel)
    return dest
