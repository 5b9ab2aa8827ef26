"""Journaled, atomic writes across files, under an exclusive lock on the tree.

Protocol: stage every new file as a temp file beside its target (same mode, fsynced), then
write the journal (atomically), then ``os.replace`` each target, then write the lockfile,
then delete the journal. A crash before the journal exists leaves the tree untouched (the
temp files are swept on the next run); a crash after it is rolled forward on the next run,
so the tree is either as it was or completely patched, never half.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from .errors import SourceError

STATE_DIR = ".spectool"
JOURNAL = "journal.json"
LOCK = "lock"
TMP_SUFFIX = ".spectool-tmp"


def state_dir(tree_dir: Path) -> Path:
    return Path(tree_dir) / STATE_DIR


@contextlib.contextmanager
def locked(tree_dir: Path):
    """Exclusive lock: two spectool runs on one tree cannot interleave."""
    d = state_dir(tree_dir)
    d.mkdir(exist_ok=True)
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SourceError(f"another spectool run holds the lock on {tree_dir}; wait for it to finish.") from None
        yield
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


# A hook for fault-injection tests: called between two file replacements.
_between_writes = None


def commit(root: Path, tree_dir: Path, writes: dict[str, bytes], extra: dict[str, bytes | None]) -> None:
    """Write `writes` (paths relative to root) and `extra` (relative to tree_dir; None deletes)
    as one transaction. Caller holds the lock."""
    sdir = state_dir(tree_dir)
    sdir.mkdir(exist_ok=True)
    entries = []
    for rel, data in writes.items():
        target = root / rel
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
        tmp = target.with_name(target.name + TMP_SUFFIX)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        entries.append({"target": str(target), "tmp": str(tmp)})
    for rel, data in extra.items():
        target = Path(tree_dir) / rel
        if data is None:
            entries.append({"target": str(target), "delete": True})
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + TMP_SUFFIX)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        entries.append({"target": str(target), "tmp": str(tmp)})
    write_atomic(sdir / JOURNAL, json.dumps({"entries": entries}).encode())
    _roll_forward(sdir)


def _roll_forward(sdir: Path) -> None:
    journal = sdir / JOURNAL
    data = json.loads(journal.read_text())
    for i, e in enumerate(data["entries"]):
        target = Path(e["target"])
        if e.get("delete"):
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
        elif Path(e["tmp"]).exists():
            os.replace(e["tmp"], target)
        if _between_writes is not None and i == 0:
            _between_writes()
    for d in {Path(e["target"]).parent for e in data["entries"]}:
        with contextlib.suppress(OSError):
            _fsync_dir(d)
    journal.unlink()


def recover(root: Path, tree_dir: Path, touched: list[str]) -> bool:
    """Finish an interrupted transaction, or sweep temp files of one that never started.
    Returns True when a journal was rolled forward. Caller holds the lock."""
    sdir = state_dir(tree_dir)
    journal = sdir / JOURNAL
    if journal.exists():
        try:
            json.loads(journal.read_text())
        except ValueError:
            raise SourceError(f"the journal {journal} is corrupt; restore the tree (e.g. git checkout) and delete it.") from None
        _roll_forward(sdir)
        return True
    for rel in touched:
        tmp = root / (rel + TMP_SUFFIX)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return False
