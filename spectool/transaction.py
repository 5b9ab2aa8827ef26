"""Journaled, atomic writes across files, under an exclusive lock on the tree.

Protocol, every path relative to the tree's directory and checked to stay inside it:

1. write the journal in state ``staging``, naming every target and its temp file;
2. stage each new file as a temp file beside its target (same mode, fsynced);
3. rewrite the journal in state ``commit``: the commit point;
4. ``os.replace`` each target by its temp file, delete what the transaction deletes;
5. fsync the directories, delete the journal, remove state folders left empty.

A crash before step 3 is rolled back (the temp files are deleted), a crash after it is
rolled forward, so the tree is either as it was or completely written, never half. Until
that happens, ``pending`` names what is unfinished: apply, revert and recover finish it
first (``recover``); status and check refuse to call such a tree fine. Relative paths keep
a moved or copied tree self-contained: the journal never points into another directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
from pathlib import Path, PurePosixPath

from .errors import SourceError

STATE_DIR = ".spectool"
JOURNAL = "journal.json"
TMP_SUFFIX = ".spectool-tmp"
JOURNAL_FORMAT = 2
_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def state_dir(tree_dir: Path) -> Path:
    return Path(tree_dir) / STATE_DIR


def recover_command(tree_dir: Path) -> str:
    return f"spectool recover --sglang-dir {tree_dir}"


@contextlib.contextmanager
def locked(tree_dir: Path, *, shared: bool = False):
    """A lock on the tree's directory itself (flock), so taking it creates no file.
    Exclusive for commands that write; shared for status and check, which then never read
    a tree another run is writing."""
    try:
        fd = os.open(tree_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise SourceError(f"cannot open {tree_dir} to lock it: {exc.strerror}.") from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SourceError(f"another spectool run holds the lock on {tree_dir}; wait for it to finish.") from None
        yield
    finally:
        os.close(fd)


def inside(tree_dir: Path, rel: object, what: str) -> Path:
    """The absolute path of `rel`, a relative POSIX path that must stay inside tree_dir
    (no absolute path, no '..', and no symlink that leads out); else a SourceError."""
    bad = not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel
    parts = () if bad else PurePosixPath(rel).parts
    if bad or PurePosixPath(rel).is_absolute() or any(p in ("..", ".") for p in parts) or not parts:
        raise SourceError(
            f"{what} names the path {rel!r}, which is not a plain relative path inside {tree_dir}; "
            "spectool refuses to read or write outside the tree it was given."
        )
    path = Path(tree_dir, *parts)
    base = os.path.realpath(tree_dir)
    real = os.path.realpath(path)
    if os.path.commonpath([base, real]) != base:
        raise SourceError(
            f"{what} names {rel}, which leads out of {tree_dir} (to {real}); spectool refuses to "
            "read or write outside the tree it was given."
        )
    return path


def _real_rel(tree_dir: Path, rel: str) -> str:
    """`rel` with symlinks inside the tree resolved: a patched symlink stays a symlink and
    its target file is written (and restored) instead."""
    path = inside(tree_dir, rel, "a write")
    base = os.path.realpath(tree_dir)
    return Path(os.path.relpath(os.path.realpath(path), base)).as_posix()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes, mode: int | None = None) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(path, mode)


def write_atomic(path: Path, data: bytes) -> None:
    """One file replaced atomically (temp file, fsync, rename), outside any journal: for
    spectool's own caches under .spectool, which a crash may lose but never half-write."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    _write_file(tmp, data)
    os.replace(tmp, path)


def _write_journal(tree_dir: Path, data: dict) -> None:
    journal = state_dir(tree_dir) / JOURNAL
    tmp = journal.with_name(JOURNAL + TMP_SUFFIX)
    _write_file(tmp, json.dumps(data, indent=1).encode())
    os.replace(tmp, journal)
    _fsync_dir(journal.parent)


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT/SIGTERM/SIGHUP wait until the write phase is over: a Ctrl-C then never
    leaves a transaction for the next run to finish (SIGKILL still can; recover handles it)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def commit(tree_dir: Path, changes: dict[str, bytes | None], command: str) -> None:
    """Write `changes` (paths relative to tree_dir; None deletes) as one transaction.
    Caller holds the lock. An OSError (read-only tree, full disk) before the commit point
    rolls back and becomes a SourceError: nothing was changed."""
    tree_dir = Path(tree_dir)
    entries, staged = [], {}
    for rel, data in changes.items():
        real = _real_rel(tree_dir, rel)
        if data is None:
            entries.append({"path": real, "delete": True})
        else:
            entries.append({"path": real, "tmp": real + TMP_SUFFIX})
            staged[real] = data
    journal = {"format": JOURNAL_FORMAT, "command": command, "state": "staging", "entries": entries}
    with _signals_deferred():
        try:
            state_dir(tree_dir).mkdir(exist_ok=True)
            _write_journal(tree_dir, journal)
            for real, data in staged.items():
                target = tree_dir / real
                target.parent.mkdir(parents=True, exist_ok=True)
                mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
                _write_file(tree_dir / (real + TMP_SUFFIX), data, mode)
            journal["state"] = "commit"
            _write_journal(tree_dir, journal)
        except OSError as exc:
            with contextlib.suppress(OSError, SourceError):
                _roll_back(tree_dir)
            raise SourceError(
                f"cannot write {exc.filename or tree_dir} ({exc.strerror}) while preparing the {command}; nothing "
                f"was changed. Make {tree_dir} writable (or free space) and run it again."
            ) from None
        try:
            _roll_forward(tree_dir, journal)
        except OSError as exc:
            raise SourceError(
                f"the {command} was cut short writing {exc.filename} ({exc.strerror}); its journal is kept. "
                f"Fix the cause and run '{recover_command(tree_dir)}' to finish it."
            ) from None


def _read_journal(tree_dir: Path) -> dict | None:
    journal = state_dir(tree_dir) / JOURNAL
    try:
        raw = journal.read_bytes()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise SourceError(
            f"{state_dir(tree_dir)} is not a folder, but spectool keeps its state there; move it "
            "away and run the command again. Nothing was changed."
        ) from None
    except OSError as exc:
        raise SourceError(f"cannot read the journal {journal}: {exc.strerror}.") from None
    problem = None
    try:
        data = json.loads(raw)
        if (
            not isinstance(data, dict)
            or data.get("format") != JOURNAL_FORMAT
            or data.get("state") not in ("staging", "commit")
        ):
            problem = "not a spectool journal of this version"
        elif not isinstance(data.get("entries"), list) or not all(isinstance(e, dict) for e in data["entries"]):
            problem = "its entries are not a list of objects"
    except (ValueError, UnicodeDecodeError):
        problem = "not valid JSON"
    if problem:
        raise SourceError(
            f"the journal {journal} is damaged ({problem}), so spectool cannot tell how far the last write got. "
            "Restore the tree from its origin (git checkout -- . ; or reinstall the package), then delete "
            f"{state_dir(tree_dir)} and spectool.lock."
        )
    for e in data["entries"]:
        inside(tree_dir, e.get("path"), f"the journal {journal}")
        if not e.get("delete"):
            if e.get("tmp") != f"{e['path']}{TMP_SUFFIX}":
                raise SourceError(
                    f"the journal {journal} names a temp file {e.get('tmp')!r} that does not belong to "
                    f"{e['path']}; restore the tree from its origin and delete {state_dir(tree_dir)}."
                )
    return data


def _stray_temps(tree_dir: Path, beside: list[str]) -> list[Path]:
    """Temp files no journal accounts for: under .spectool, and beside the given files."""
    found = []
    sdir = state_dir(tree_dir)
    if sdir.is_dir():
        found.extend(p for p in sdir.rglob("*" + TMP_SUFFIX))
    for rel in beside:
        p = tree_dir / (rel + TMP_SUFFIX)
        if p.exists() or p.is_symlink():
            found.append(p)
    return sorted(set(found))


def pending(tree_dir: Path, beside: list[str] = ()) -> str | None:
    """What an interrupted run left unfinished, in words, or None. `beside`: files (relative
    to tree_dir) next to which temp files would belong to spectool."""
    tree_dir = Path(tree_dir)
    data = _read_journal(tree_dir)
    if data is not None:
        verb = data.get("command", "write")
        how = "finishes it" if data["state"] == "commit" else "rolls it back (it had not reached its commit point)"
        return (
            f"an interrupted spectool {verb} left its journal in {state_dir(tree_dir)}: the tree may be half "
            f"written. '{recover_command(tree_dir)}' {how}"
        )
    strays = _stray_temps(tree_dir, list(beside))
    if strays:
        names = ", ".join(os.path.relpath(p, tree_dir) for p in strays[:4])
        return f"an interrupted spectool run left temp files ({names}); '{recover_command(tree_dir)}' deletes them"
    return None


def recover(tree_dir: Path, beside: list[str] = ()) -> str | None:
    """Finish (past the commit point) or roll back (before it) an interrupted transaction,
    and delete stray temp files. Returns what was done, or None. Caller holds the lock."""
    tree_dir = Path(tree_dir)
    data = _read_journal(tree_dir)
    if data is not None:
        verb = data.get("command", "write")
        if data["state"] == "commit":
            _roll_forward(tree_dir, data)
            return f"finished an interrupted {verb} found in the journal"
        _roll_back(tree_dir, data)
        return f"rolled back an interrupted {verb} that had not reached its commit point (nothing of it was written)"
    strays = _stray_temps(tree_dir, list(beside))
    for p in strays:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    if strays:
        _prune(tree_dir)
        return f"deleted {len(strays)} temp file(s) an interrupted run left"
    _prune(tree_dir)
    return None


def _roll_forward(tree_dir: Path, data: dict) -> None:
    entries = data["entries"]
    for e in entries:
        if not e.get("delete") and os.path.lexists(tree_dir / e["tmp"]):
            os.replace(tree_dir / e["tmp"], tree_dir / e["path"])
    for e in entries:
        if e.get("delete"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tree_dir / e["path"])
    for d in sorted({(tree_dir / e["path"]).parent for e in entries}):
        with contextlib.suppress(OSError):
            _fsync_dir(d)
    _finish(tree_dir)


def _roll_back(tree_dir: Path, data: dict | None = None) -> None:
    data = data if data is not None else _read_journal(tree_dir)
    for e in (data or {}).get("entries", []):
        if not e.get("delete"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tree_dir / e["tmp"])
    _finish(tree_dir)


def _finish(tree_dir: Path) -> None:
    sdir = state_dir(tree_dir)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sdir / (JOURNAL + TMP_SUFFIX))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sdir / JOURNAL)
    with contextlib.suppress(OSError):
        _fsync_dir(sdir)
    _prune(tree_dir)


def _prune(tree_dir: Path) -> None:
    """Remove folders under .spectool (and .spectool itself) that hold nothing."""
    sdir = state_dir(tree_dir)
    if not sdir.is_dir() or sdir.is_symlink():
        return
    for dirpath, _, _ in sorted(os.walk(sdir), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
