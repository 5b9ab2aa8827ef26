"""The small public API: apply, check, status, revert, recover. The CLI is a thin layer over these."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, lockfile, readback, transaction
from .errors import SourceError, ValidationError
from .lockfile import sha256
from .source import SglangTree, locate
from .statuses import FileIntegrity, Status

if TYPE_CHECKING:  # pragma: no cover - planning (libcst) is imported by the commands that plan
    from .plan import Plan
    from .recipe import Recipe


@dataclass
class Outcome:
    """What a command did, ready to print as text or JSON."""

    command: str
    tree: SglangTree | None
    plan: Plan | None = None
    ok: bool = True
    notes: list[str] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)
    wrote: bool = False
    applied: list[dict] = field(default_factory=list)  # status: the lockfile's recipe entries

    def to_json(self) -> dict:
        out = {
            "command": self.command,
            "ok": self.ok,
            "sglang_dir": str(self.tree.dir) if self.tree else None,
            "sglang_version": str(self.tree.version) if self.tree else None,
            "notes": self.notes,
            "files": self.files,
        }
        if self.plan is not None:
            out["recipes"] = [r.to_json() for r in self.plan.results]
            out["changed_files"] = [c.relpath for c in self.plan.changes]
        elif self.applied:
            out["recipes"] = self.applied
        return out


def _integrity(tree: SglangTree, lock: lockfile.Lock | None) -> list[dict]:
    """Per locked file: intact (as we wrote it), original, or modified since."""
    if lock is None:
        return []
    out = []
    for rel, h in sorted(lock.files.items()):
        path = transaction.inside(tree.root, rel, "spectool.lock")
        try:
            cur = sha256(path.read_bytes()) if path.exists() else None
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror}.") from None
        state = (
            FileIntegrity.INTACT
            if cur == h["after"]
            else FileIntegrity.ORIGINAL
            if cur == h["before"]
            else FileIntegrity.MISSING
            if cur is None
            else FileIntegrity.MODIFIED
        )
        out.append({"file": rel, "state": state, "before": h["before"], "after": h["after"], "current": cur})
    return out


def _dir_rel(tree: SglangTree, rel: str) -> str:
    """A path relative to the package root, relative to the tree directory instead."""
    return (tree.root / rel).relative_to(tree.dir).as_posix()


def _beside(tree: SglangTree, rec: lockfile.Record) -> list[str]:
    """Files (relative to the tree directory) beside which a temp file would be spectool's."""
    rels = set(rec.originals) | set(rec.lock.files if rec.lock else ())
    return sorted(_dir_rel(tree, r) for r in rels)


def _read_state(tree: SglangTree) -> lockfile.Record:
    """The tree's record for a command that does not write: an unfinished transaction or a
    damaged lockfile is refused, naming the command that repairs it."""
    rec = lockfile.read(tree.dir)
    unfinished = transaction.pending(tree.dir, _beside(tree, rec))
    if unfinished:
        raise SourceError(f"{unfinished}. Nothing else can be trusted until then.")
    if rec.problem is not None:
        raise SourceError(f"{rec.problem}. {lockfile.remedy(tree.dir, rec)}")
    return rec


def _recover(tree: SglangTree, out: Outcome) -> None:
    """Finish or roll back what an interrupted run left (caller holds the exclusive lock)."""
    note = transaction.recover(tree.dir, _beside(tree, lockfile.read(tree.dir)))
    if note:
        out.notes.append(note)


def _refuse_modified(tree: SglangTree, lock, files: list[dict], force: bool, verb: str) -> None:
    if force or lock is None:
        return
    bad = [f["file"] for f in files if f["state"].damaged]
    if str(tree.version) != lock.sglang_version:
        raise SourceError(
            f"{tree.dir} holds SGLang {tree.version}, but its spectool.lock was written for "
            f"{lock.sglang_version}: the tree was replaced under the patch. Revert or reinstall, "
            f"or pass --force to {verb} anyway."
        )
    if bad:
        raise SourceError(
            f"{len(bad)} patched file(s) changed since spectool wrote them ({', '.join(bad)}): "
            f"edited by hand or replaced by another SGLang. spectool will not {verb} over them; "
            "restore them or pass --force."
        )


def _select(recipes_dir, select) -> list[Recipe]:
    from .recipe import load_recipes

    return load_recipes(Path(recipes_dir) if recipes_dir else None, select or None)


def _changed_recipes(lock, recipes) -> list[str]:
    """Recipes whose files changed since they were applied (content hash in the lock)."""
    if lock is None:
        return []
    applied = {r["id"]: r.get("content_hash") for r in lock.recipes}
    return [r.id for r in recipes if r.id in applied and applied[r.id] != r.content_hash]


def _originals(tree: SglangTree, lock) -> dict[str, bytes]:
    """The saved pristine bytes of every locked file (lockfile.read checked their hashes):
    plans start from them when recipes changed since the apply, so an updated recipe
    replaces its old output instead of colliding with it."""
    return {rel: lockfile.original_path(tree.dir, rel).read_bytes() for rel in lock.files}


def originals(sglang_dir, *, version=None) -> dict[str, bytes]:
    """The release's own bytes of every file the recipes patched in the tree (path relative
    to the package root), from the originals spectool saved and the lockfile checked; a
    SourceError (with the remedy) when the tree holds no trustworthy record of them."""
    tree = locate(sglang_dir, version)
    rec = lockfile.read(tree.dir)
    if not rec.applied:
        raise SourceError(
            f"{tree.dir} was never patched by spectool (no spectool.lock): it is the release as published; "
            f"run 'spectool apply --sglang-dir {sglang_dir}' first."
        )
    if rec.lock is None:
        raise SourceError(f"{rec.problem}. {lockfile.remedy(tree.dir, rec)}")
    return _originals(tree, rec.lock)


def check(sglang_dir, *, recipes_dir=None, select=None, options=None, version=None) -> Outcome:
    """Would everything apply, or is it applied and intact? Writes nothing."""
    from .plan import build_plan

    tree = locate(sglang_dir, version)
    recipes = _select(recipes_dir, select)
    with transaction.locked(tree.dir, shared=True):
        lock = _read_state(tree).lock
        files = _integrity(tree, lock)
        changed = _changed_recipes(lock, recipes)
        if changed:
            plan = build_plan(tree, recipes, options, overrides=_originals(tree, lock))
        else:  # unchanged since apply read it back: its recorded plan, nothing parsed
            plan = readback.recall(tree, recipes, options) or build_plan(tree, recipes, options)
    out = Outcome("check", tree, plan, files=files)
    if changed:
        out.notes.append(
            f"recipe(s) changed since they were applied: {', '.join(changed)}; planned from the saved originals (apply updates the tree)"
        )
    out.ok = plan.ok and not any(f["state"].damaged for f in files)
    if lock and str(tree.version) != lock.sglang_version:
        out.ok = False
        out.notes.append(f"spectool.lock was written for SGLang {lock.sglang_version}, the tree is {tree.version}")
    return out


def apply(
    sglang_dir, *, recipes_dir=None, select=None, options=None, version=None, dry_run=False, force=False
) -> Outcome:
    """Apply the recipes to the tree: all of them, or (on any drift or conflict) none."""
    from .plan import build_plan

    tree = locate(sglang_dir, version)
    recipes = _select(recipes_dir, select)
    with transaction.locked(tree.dir, shared=dry_run):
        out = Outcome("apply", tree)
        if dry_run:
            lock = _read_state(tree).lock
        else:
            _recover(tree, out)
            lock = lockfile.require(tree.dir).lock
        files = _integrity(tree, lock)
        _refuse_modified(tree, lock, files, force, "apply")
        changed = _changed_recipes(lock, recipes)
        originals = _originals(tree, lock) if changed else None
        plan = (None if originals else readback.recall(tree, recipes, options)) or build_plan(
            tree, recipes, options, overrides=originals
        )
        if changed:
            out.notes.append(
                f"recipe(s) changed since they were applied: {', '.join(changed)}; re-applied from the saved originals"
            )
        out.plan, out.files = plan, files
        out.ok = plan.ok
        if not plan.ok or dry_run:
            return out
        new_lock = _new_lock(tree, lock, plan, files, options)
        if not plan.changed and (lock is None or new_lock.to_bytes() == lock.to_bytes()):
            if originals is None:  # what is on disk was just planned: keep the read-back
                _keep_readback(tree, recipes, options, plan)
            return out
        again = _read_back(tree, recipes, options, plan) if plan.changed else plan
        changes: dict[str, bytes | None] = {_dir_rel(tree, c.relpath): c.after for c in plan.changes}
        for c in plan.changes:
            if lock is None or c.relpath not in lock.files:
                changes[f"{lockfile.ORIG_DIR}/{c.relpath}"] = c.before
        changes[lockfile.LOCKFILE] = changes[lockfile.COPY] = new_lock.to_bytes()
        changes[readback.READBACK] = readback.record(tree, recipes, options, again)  # None: drop a stale one
        transaction.commit(tree.dir, changes, "apply")
        out.wrote = True
        if force and any(f["state"] != FileIntegrity.INTACT for f in files) and not plan.changed:
            out.notes.append("recorded the current bytes of the changed file(s) as applied (--force)")
        for r in plan.results:
            if r.status == Status.WOULD_APPLY:
                r.status = Status.APPLIED
        return out


def _new_lock(tree, lock, plan: Plan, files: list[dict], options) -> lockfile.Lock:
    """The lockfile after this apply: every locked or changed file with its before and after
    hashes (with --force, a hand-edited file's current bytes become its after), and the
    recipes of this plan merged into those applied before."""
    new = lockfile.Lock(
        str(tree.version),
        spectool_version=__version__,
        files={rel: dict(h) for rel, h in (lock.files if lock else {}).items()},
    )
    for f in files:
        if f["current"] is not None and f["current"] != f["after"]:
            new.files[f["file"]]["after"] = f["current"]
    for c in plan.changes:
        entry = new.files.setdefault(c.relpath, {"before": sha256(c.before)})
        entry["after"] = sha256(c.after)
    old = {r["id"]: r for r in (lock.recipes if lock else [])}
    same = ("variant", "content_hash", "options")
    mine = [
        old[r["id"]] if r["id"] in old and all(old[r["id"]].get(k) == r[k] for k in same) else r
        for r in _lock_recipes(plan, options)
    ]
    ids = {r["id"] for r in mine}
    new.recipes = [r for r in old.values() if r["id"] not in ids] + mine
    return new


def _lock_recipes(plan: Plan, options) -> list[dict]:
    by_id = {r.id: r for r in plan.recipes}
    return [
        {
            "id": r.id,
            "variant": r.variant,
            "status": r.status if r.status != Status.WOULD_APPLY else Status.APPLIED,
            "content_hash": by_id[r.id].content_hash,
            "options": (options or {}).get(r.id, {}),
        }
        for r in plan.results
        if r.status.ok
    ]


def _keep_readback(tree, recipes, options, plan) -> None:
    """Record a plan of the tree as it is on disk, so check can skip planning it again."""
    data = readback.record(tree, recipes, options, plan)
    current = tree.dir / readback.READBACK
    if data is not None and not (current.is_file() and current.read_bytes() == data):
        transaction.write_atomic(current, data)


def _read_back(tree, recipes, options, plan) -> Plan:
    """'Applied' only if the planned bytes read back as applied, checked in memory before
    anything is written: a recipe that is not idempotent, or two recipes that undo or
    duplicate each other, are refused while the tree is still untouched. Returns the plan
    of the planned bytes: the tree as it will be on disk (the read-back check records)."""
    from .plan import build_plan

    planned = {c.relpath: c.after for c in plan.changes}
    again = build_plan(tree, recipes, options, overrides=planned, validate=False)
    bad = [r.id for r in again.results if r.status not in (Status.ALREADY_APPLIED, Status.UPSTREAMED)]
    moved = [c.relpath for c in again.changes if c.after != planned.get(c.relpath, c.before)]
    if bad or moved:
        raise ValidationError(
            f"the planned result does not read back as applied (recipe(s) {', '.join(bad) or '-'}; file(s) "
            f"{', '.join(moved) or '-'}): a second apply would change it again, so the recipes are not "
            "idempotent together. Nothing was written; report the recipes."
        )
    again.changes = []  # relative to the disk as it will be once the plan is written
    return again


def status(sglang_dir, *, version=None) -> Outcome:
    """What is applied, from the lockfile, with hash checks of every patched file and of the
    saved originals. Never ok on a tree an interrupted run left, or with a damaged record."""
    tree = locate(sglang_dir, version)
    out = Outcome("status", tree)
    with transaction.locked(tree.dir, shared=True):
        rec = lockfile.read(tree.dir)
        unfinished = transaction.pending(tree.dir, _beside(tree, rec))
        if unfinished:
            out.ok = False
            out.notes.append(f"{unfinished}.")
            return out
        if rec.problem is not None:
            out.ok = False
            out.files = _integrity(tree, rec.lock)
            out.notes.append(f"{rec.problem}. {lockfile.remedy(tree.dir, rec)}")
            return out
        lock = rec.lock
        if lock is None:
            out.notes.append("no spectool.lock: nothing applied")
            return out
        out.files = _integrity(tree, lock)
    out.notes.append(f"applied to SGLang {lock.sglang_version} by spectool {lock.spectool_version}")
    out.applied = lock.recipes
    out.ok = all(f["state"] == FileIntegrity.INTACT for f in out.files) and str(tree.version) == lock.sglang_version
    return out


def recover(sglang_dir, *, version=None) -> Outcome:
    """Finish or roll back what an interrupted apply or revert left; nothing else."""
    tree = locate(sglang_dir, version)
    out = Outcome("recover", tree)
    with transaction.locked(tree.dir):
        _recover(tree, out)
        if not out.notes:
            out.notes.append("nothing to recover: no journal and no temp files")
        rec = lockfile.read(tree.dir)
    if rec.problem is not None:
        out.ok = False
        out.notes.append(f"{rec.problem}. {lockfile.remedy(tree.dir, rec)}")
    return out


def revert(sglang_dir, *, version=None, force=False) -> Outcome:
    """Restore every patched file byte for byte and forget the lock. Works from spectool's
    copy of the lockfile when spectool.lock is damaged or gone, and (with --force) from the
    saved originals alone when both are."""
    tree = locate(sglang_dir, version)
    with transaction.locked(tree.dir):
        out = Outcome("revert", tree)
        _recover(tree, out)
        rec = lockfile.read(tree.dir)
        if not rec.applied:
            out.notes.append("no spectool.lock: nothing to revert")
            return out
        changes: dict[str, bytes | None] = {}
        if rec.lock is None:
            if not force:
                raise SourceError(f"{rec.problem}. {lockfile.remedy(tree.dir, rec)}")
            out.notes.append(f"{rec.problem}; restored the saved originals (--force)")
            files = _restore_without_lock(tree, rec, changes)
        else:
            if rec.problem is not None:
                out.notes.append(f"{rec.problem}; reverted with spectool's copy of the lockfile")
            files = _integrity(tree, rec.lock)
            _refuse_modified(tree, rec.lock, files, force, "revert")
            for f in files:
                if f["state"] != FileIntegrity.ORIGINAL:
                    changes[_dir_rel(tree, f["file"])] = lockfile.original_path(tree.dir, f["file"]).read_bytes()
                changes[f"{lockfile.ORIG_DIR}/{f['file']}"] = None
        changes[lockfile.LOCKFILE] = changes[lockfile.COPY] = changes[readback.READBACK] = None
        transaction.commit(tree.dir, changes, "revert")
        out.files = [{**f, "state": FileIntegrity.REVERTED} for f in files]
        out.wrote = True
        return out


def _restore_without_lock(tree: SglangTree, rec: lockfile.Record, changes: dict) -> list[dict]:
    """revert --force with no trustworthy lockfile: restore every saved original, checked
    against the 'before' hashes any readable lockfile (or copy) still records. A damaged
    original, or a recorded file with no original that is not pristine, is refused: the
    tree would be left half-restored with nothing to say so."""
    befores: dict[str, set[str]] = {}
    for lock in rec.parsed:
        for rel, h in lock.files.items():
            befores.setdefault(rel, set()).add(h["before"])
    files = []
    for rel in sorted(set(rec.originals) | set(befores)):
        if not lockfile.is_package_file(rel):
            raise SourceError(
                f"{lockfile.ORIG_DIR}/{rel} is not a saved original of a file of the sglang package; "
                "spectool will not write it. Delete it, then run revert --force again."
            )
        target = transaction.inside(tree.root, rel, "a saved original")
        orig = lockfile.original_path(tree.dir, rel)
        if not orig.is_file():
            cur = sha256(target.read_bytes()) if target.is_file() else None
            if cur not in befores[rel]:
                raise SourceError(
                    f"spectool.lock records {rel}, but its saved original is missing from {lockfile.ORIG_DIR} and the "
                    f"file is not pristine. Restore {rel} from the tree's origin, then run revert --force again."
                )
            files.append({"file": rel, "state": FileIntegrity.ORIGINAL})
            continue
        data = orig.read_bytes()
        if rel in befores and sha256(data) not in befores[rel]:
            raise SourceError(
                f"the saved original of {rel} does not match the hash spectool.lock records: it is damaged, and "
                f"spectool will not write it. Restore {rel} from the tree's origin and delete {orig}, then run "
                "revert --force again."
            )
        if not target.is_file() or sha256(target.read_bytes()) != sha256(data):
            changes[_dir_rel(tree, rel)] = data
        changes[f"{lockfile.ORIG_DIR}/{rel}"] = None
        files.append({"file": rel, "state": FileIntegrity.MODIFIED})
    return files
