"""``spectool.lock`` in the tree: what was applied, with content hashes, so status and revert
can tell an intact patch from a hand-edited or replaced file. Originals are kept under
``.spectool/orig/`` so revert restores them byte for byte, and ``.spectool/lock.json`` holds a
copy of the lockfile written in the same transaction.

The lockfile is trusted only when it parses, every path in it stays inside the tree, it
equals the copy, and its files are exactly the saved originals with their ``before`` hashes.
Otherwise ``read`` says why; revert can still work from the copy, or (with --force) from the
saved originals alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .errors import SourceError
from .transaction import STATE_DIR, TMP_SUFFIX, inside

LOCKFILE = "spectool.lock"
COPY = f"{STATE_DIR}/lock.json"
SCHEMA = 1
ORIG_DIR = f"{STATE_DIR}/orig"
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Lock:
    sglang_version: str
    recipes: list[dict] = field(default_factory=list)  # id, variant, content_hash, options
    files: dict[str, dict] = field(default_factory=dict)  # relpath (to the package root) -> {before, after}
    spectool_version: str = ""

    def to_bytes(self) -> bytes:
        data = {
            "schema": SCHEMA,
            "spectool_version": self.spectool_version,
            "sglang_version": self.sglang_version,
            "recipes": self.recipes,
            "files": self.files,
        }
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def is_package_file(rel) -> bool:
    """A plain relative path to a module of the sglang package (sglang/...py)."""
    if not isinstance(rel, str) or "\\" in rel or "\0" in rel:
        return False
    p = PurePosixPath(rel)
    return (
        not p.is_absolute()
        and len(p.parts) >= 2
        and p.parts[0] == "sglang"
        and p.suffix == ".py"
        and not any(part in ("..", ".") for part in p.parts)
        and p.as_posix() == rel
    )


def parse(raw: bytes) -> Lock:
    """A Lock from the bytes of a lockfile; ValueError saying what is wrong."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
    for key, typ in (("sglang_version", str), ("recipes", list), ("files", dict)):
        if not isinstance(data.get(key), typ):
            raise ValueError(f"'{key}' must be a {typ.__name__}")
    if not all(isinstance(r, dict) and isinstance(r.get("id"), str) for r in data["recipes"]):
        raise ValueError("'recipes' must be objects with an 'id'")
    for rel, h in data["files"].items():
        if not is_package_file(rel):
            raise ValueError(f"file entry {rel!r} is not a path inside the sglang package (sglang/...py)")
        if not isinstance(h, dict) or not all(
            isinstance(h.get(k), str) and _HASH_RE.match(h[k]) for k in ("before", "after")
        ):
            raise ValueError(f"file entry {rel} lacks before/after sha256 hashes")
    return Lock(
        data["sglang_version"], list(data["recipes"]), dict(data["files"]), str(data.get("spectool_version", ""))
    )


@dataclass
class Record:
    """The tree's spectool state as found on disk, and how far it can be trusted.

    lock: the record to act on (the lockfile, or its copy when only the copy is sound);
    problem: why spectool.lock cannot be trusted as it is (None: it can);
    originals: the files saved under .spectool/orig (relative to the package root)."""

    lock: Lock | None
    problem: str | None = None
    originals: list[str] = field(default_factory=list)
    from_copy: bool = False
    parsed: list[Lock] = field(default_factory=list)  # the lockfile and the copy, those that parse

    @property
    def applied(self) -> bool:
        return self.lock is not None or bool(self.originals) or self.problem is not None


def saved_originals(tree_dir: Path) -> list[str]:
    """Every file under .spectool/orig, relative to it (the package root's layout)."""
    base = Path(tree_dir) / ORIG_DIR
    if not base.is_dir():
        return []
    out = []
    for dirpath, _, names in os.walk(base):
        for n in names:
            if not n.endswith(TMP_SUFFIX):
                out.append(Path(os.path.relpath(os.path.join(dirpath, n), base)).as_posix())
    return sorted(out)


def original_path(tree_dir: Path, rel: str) -> Path:
    return inside(Path(tree_dir), f"{ORIG_DIR}/{rel}", "spectool.lock")


def _mismatch(tree_dir: Path, lock: Lock, originals: list[str]) -> str | None:
    """Why lock does not describe the saved originals, or None."""
    extra = sorted(set(originals) - set(lock.files))
    if extra:
        return f"it does not list {len(extra)} file(s) whose originals are saved in {ORIG_DIR} ({', '.join(extra[:3])})"
    for rel, h in sorted(lock.files.items()):
        p = original_path(tree_dir, rel)
        try:
            ok = sha256(p.read_bytes()) == h["before"]
        except OSError:
            return f"the saved original of {rel} is missing from {ORIG_DIR}"
        if not ok:
            return f"the saved original of {rel} in {ORIG_DIR} does not match its 'before' hash"
    return None


def _load(path: Path) -> tuple[bytes | None, Lock | None, str | None]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return b"", None, f"cannot be read ({exc.strerror})"
    try:
        return raw, parse(raw), None
    except ValueError as exc:
        return raw, None, f"is corrupt ({exc})"


def read(tree_dir: Path) -> Record:
    """The lockfile, checked against its copy and the saved originals."""
    tree_dir = Path(tree_dir)
    originals = saved_originals(tree_dir)
    raw, lock, err = _load(tree_dir / LOCKFILE)
    craw, copy, cerr = _load(tree_dir / COPY)
    problem = None
    parsed = [x for x in (lock, copy) if x is not None]
    if lock is not None:
        problem = _mismatch(tree_dir, lock, originals)
        if problem is None and raw is not None and craw is not None and raw != craw:
            problem = f"it differs from spectool's own copy in {COPY} (edited by hand?)"
        if problem is None:
            return Record(lock, None, originals, parsed=parsed)
        problem = f"{LOCKFILE} cannot be trusted: {problem}"
    elif err is not None:
        problem = f"{LOCKFILE} {err}"
    elif craw is not None or originals:
        problem = f"{LOCKFILE} is missing, but {STATE_DIR}/ holds the state of an apply"
    else:
        return Record(None, None, [])
    if copy is not None and _mismatch(tree_dir, copy, originals) is None:
        return Record(copy, problem, originals, from_copy=True, parsed=parsed)
    if cerr is not None:
        problem += f"; its copy {COPY} {cerr}"
    elif copy is not None:
        problem += f"; its copy {COPY} does not match the saved originals either"
    return Record(None, problem, originals, parsed=parsed)


def require(tree_dir: Path) -> Record:
    """read(), for commands that need a trustworthy lockfile (apply, check, status refuse a
    damaged one and name the command that repairs it)."""
    rec = read(tree_dir)
    if rec.problem is not None:
        raise SourceError(f"{rec.problem}. {remedy(tree_dir, rec)}")
    return rec


def remedy(tree_dir: Path, rec: Record) -> str:
    """The one command that gets a tree with a damaged record back to its originals."""
    if rec.lock is not None:
        return (
            f"'spectool revert --sglang-dir {tree_dir}' restores the originals using spectool's copy of "
            f"the lockfile ({COPY}); apply again afterwards."
        )
    if rec.originals:
        return (
            f"'spectool revert --force --sglang-dir {tree_dir}' restores the {len(rec.originals)} saved "
            f"original(s) in {ORIG_DIR} (checked against any hash a readable lockfile still records), "
            "then apply again."
        )
    return (
        f"No saved originals are left in {ORIG_DIR}: restore the tree from its origin (git checkout -- . ; "
        f"or reinstall the package), delete {LOCKFILE} and {STATE_DIR}/, then apply again."
    )
