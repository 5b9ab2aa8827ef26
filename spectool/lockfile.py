"""``spectool.lock`` in the tree: what was applied, with content hashes, so status and revert
can tell an intact patch from a hand-edited or replaced file. Originals are kept under
``.spectool/orig/`` so revert restores them byte for byte."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SourceError

LOCKFILE = "spectool.lock"
SCHEMA = 1
ORIG_DIR = ".spectool/orig"


@dataclass
class Lock:
    sglang_version: str
    recipes: list[dict] = field(default_factory=list)  # id, variant, content_hash, options
    files: dict[str, dict] = field(default_factory=dict)  # relpath -> {before, after}
    spectool_version: str = ""

    def to_bytes(self) -> bytes:
        data = {"schema": SCHEMA, "spectool_version": self.spectool_version,
                "sglang_version": self.sglang_version, "recipes": self.recipes, "files": self.files}
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def read(tree_dir: Path) -> Lock | None:
    path = Path(tree_dir) / LOCKFILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
        lock = Lock(str(data["sglang_version"]), list(data["recipes"]), dict(data["files"]),
                    data.get("spectool_version", ""))
        for rel, h in lock.files.items():
            if not {"before", "after"} <= set(h):
                raise ValueError(f"file entry {rel} lacks before/after hashes")
        return lock
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(
            f"the lockfile {path} is corrupt ({exc}). Restore the tree from its origin (for a "
            "git checkout: git checkout -- . ; for a package: reinstall it), delete the lockfile "
            "and .spectool/, then apply again."
        ) from None
