"""The small public API: apply, check, status, revert. The CLI is a thin layer over these."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, lockfile, readback, transaction
from .errors import SourceError, ValidationError
from .source import SglangTree, locate
from .statuses import FileIntegrity, Status

if TYPE_CHECKING:  # pragma: no cover - planning (libcst) is imported by the commands that plan
    from .plan import Plan
    from .recipe import Recipe


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
        path = tree.root / rel
        cur = sha256(path.read_bytes()) if path.exists() else None
        state = (FileIntegrity.INTACT if cur == h["after"] else FileIntegrity.ORIGINAL if cur == h["before"]
                 else FileIntegrity.MISSING if cur is None else FileIntegrity.MODIFIED)
        out.append({"file": rel, "state": state, "before": h["before"], "after": h["after"], "current": cur})
    return out


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
    """The saved pristine bytes of every locked file: plans start from them when recipes
    changed since the apply, so an updated recipe replaces its old output instead of
    colliding with it."""
    out = {}
    for rel, h in lock.files.items():
        p = tree.dir / lockfile.ORIG_DIR / rel
        if not p.exists() or sha256(p.read_bytes()) != h["before"]:
            raise SourceError(f"the saved original of {rel} is missing or damaged in {p.parent}; revert by hand (git checkout / reinstall).")
        out[rel] = p.read_bytes()
    return out


def check(sglang_dir, *, recipes_dir=None, select=None, options=None, version=None) -> Outcome:
    """Would everything apply, or is it applied and intact? Writes nothing."""
    from .plan import build_plan

    tree = locate(sglang_dir, version)
    recipes = _select(recipes_dir, select)
    lock = lockfile.read(tree.dir)
    files = _integrity(tree, lock)
    changed = _changed_recipes(lock, recipes)
    if changed:
        plan = build_plan(tree, recipes, options, overrides=_originals(tree, lock))
    else:  # unchanged since apply read it back: its recorded plan, nothing parsed
        plan = readback.recall(tree, recipes, options) or build_plan(tree, recipes, options)
    out = Outcome("check", tree, plan, files=files)
    if changed:
        out.notes.append(f"recipe(s) changed since they were applied: {', '.join(changed)}; planned from the saved originals (apply updates the tree)")
    out.ok = plan.ok and not any(f["state"].damaged for f in files)
    if lock and str(tree.version) != lock.sglang_version:
        out.ok = False
        out.notes.append(f"spectool.lock was written for SGLang {lock.sglang_version}, the tree is {tree.version}")
    return out


def apply(sglang_dir, *, recipes_dir=None, select=None, options=None, version=None,
          dry_run=False, force=False) -> Outcome:
    """Apply the recipes to the tree: all of them, or (on any drift or conflict) none."""
    from .plan import build_plan

    tree = locate(sglang_dir, version)
    recipes = _select(recipes_dir, select)
    with transaction.locked(tree.dir):
        lock = lockfile.read(tree.dir)
        touched = sorted(lock.files) if lock else []
        out = Outcome("apply", tree)
        if not dry_run and transaction.recover(tree.root, tree.dir, touched):
            out.notes.append("finished an interrupted apply found in the journal")
            lock = lockfile.read(tree.dir)
        files = _integrity(tree, lock)
        _refuse_modified(tree, lock, files, force, "apply")
        changed = _changed_recipes(lock, recipes)
        originals = _originals(tree, lock) if changed else None
        plan = build_plan(tree, recipes, options, overrides=originals)
        if changed:
            out.notes.append(f"recipe(s) changed since they were applied: {', '.join(changed)}; re-applied from the saved originals")
        out.plan, out.files = plan, files
        out.ok = plan.ok
        if not plan.ok or dry_run:
            return out
        if not plan.changed:
            if originals is None:  # what is on disk was just planned: keep the read-back
                _keep_readback(tree, recipes, options, plan)
            return out
        new_lock = lockfile.Lock(str(tree.version), spectool_version=__version__,
                                 files=dict(lock.files) if lock else {})
        extra: dict[str, bytes | None] = {}
        for c in plan.changes:
            entry = new_lock.files.get(c.relpath)
            if entry is None:
                new_lock.files[c.relpath] = {"before": sha256(c.before), "after": sha256(c.after)}
                extra[f"{lockfile.ORIG_DIR}/{c.relpath}"] = c.before
            else:
                entry["after"] = sha256(c.after)
        new_lock.recipes = _lock_recipes(plan, options)
        extra[lockfile.LOCKFILE] = new_lock.to_bytes()
        transaction.commit(tree.root, tree.dir, {c.relpath: c.after for c in plan.changes}, extra)
        out.wrote = True
        again = _post_check(tree, recipes, options, plan)
        _keep_readback(tree, recipes, options, again)
        return out


def _lock_recipes(plan: Plan, options) -> list[dict]:
    by_id = {r.id: r for r in plan.recipes}
    return [
        {"id": r.id, "variant": r.variant, "status": r.status if r.status != Status.WOULD_APPLY else Status.APPLIED,
         "content_hash": by_id[r.id].content_hash, "options": (options or {}).get(r.id, {})}
        for r in plan.results if r.status.ok
    ]


def _keep_readback(tree, recipes, options, plan) -> None:
    """Record a plan of the tree as it is on disk, so check can skip planning it again."""
    data = readback.record(tree, recipes, options, plan)
    current = tree.dir / readback.READBACK
    if data is not None and not (current.is_file() and current.read_bytes() == data):
        transaction.write_atomic(current, data)


def _post_check(tree, recipes, options, plan) -> Plan:
    """'Applied' only after reading the files back: every recipe must now be in place. Returns
    the read-back plan."""
    from .plan import build_plan

    again = build_plan(tree, recipes, options)
    bad = [r.id for r in again.results if r.status not in (Status.ALREADY_APPLIED, Status.UPSTREAMED)]
    if bad or again.changes:
        raise ValidationError(
            f"after writing, recipe(s) {', '.join(bad) or '?'} do not read back as applied; the "
            "recipe is not idempotent (a second apply would change the file again). Run "
            "'spectool revert' and report the recipe."
        )
    for r in plan.results:
        if r.status == Status.WOULD_APPLY:
            r.status = Status.APPLIED
    return again


def status(sglang_dir, *, version=None) -> Outcome:
    """What is applied, from the lockfile, with hash checks."""
    tree = locate(sglang_dir, version)
    lock = lockfile.read(tree.dir)
    out = Outcome("status", tree)
    if lock is None:
        out.notes.append("no spectool.lock: nothing applied")
        return out
    out.files = _integrity(tree, lock)
    out.notes.append(f"applied to SGLang {lock.sglang_version} by spectool {lock.spectool_version}")
    out.applied = lock.recipes
    out.ok = all(f["state"] == FileIntegrity.INTACT for f in out.files) and str(tree.version) == lock.sglang_version
    return out


def revert(sglang_dir, *, version=None, force=False) -> Outcome:
    """Restore every patched file byte for byte and forget the lock."""
    tree = locate(sglang_dir, version)
    with transaction.locked(tree.dir):
        lock = lockfile.read(tree.dir)
        out = Outcome("revert", tree)
        if lock is None:
            out.notes.append("no spectool.lock: nothing to revert")
            return out
        transaction.recover(tree.root, tree.dir, sorted(lock.files))
        files = _integrity(tree, lock)
        _refuse_modified(tree, lock, files, force, "revert")
        writes, extra = {}, {lockfile.LOCKFILE: None, readback.READBACK: None}
        for f in files:
            orig_path = tree.dir / lockfile.ORIG_DIR / f["file"]
            if not orig_path.exists():
                raise SourceError(f"the saved original of {f['file']} is missing from {orig_path.parent}; cannot revert it.")
            data = orig_path.read_bytes()
            if sha256(data) != f["before"]:
                raise SourceError(f"the saved original of {f['file']} does not match its hash in spectool.lock; cannot revert it.")
            if f["state"] != FileIntegrity.ORIGINAL:
                writes[f["file"]] = data
            extra[f"{lockfile.ORIG_DIR}/{f['file']}"] = None
        transaction.commit(tree.root, tree.dir, writes, extra)
        out.files = [{**f, "state": FileIntegrity.REVERTED} for f in files]
        out.wrote = True
        return out
