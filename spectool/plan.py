"""Plan every edit in memory: select variants, run operations, detect conflicts, render,
compile and look for undefined names. Nothing here writes to disk.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass, field

import libcst as cst

from .errors import DriftError, RecipeError, SourceError, SpectoolError
from .ops import FileState, OpContext, add_import
from .recipe import Recipe
from .source import MissingModule, SglangTree
from .statuses import OpStatus, Status


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileSet:
    """Parsed files of one tree, loaded on first use (only files that recipes name)."""

    def __init__(self, tree: SglangTree, overrides: dict[str, bytes] | None = None):
        self.tree = tree
        self.states: dict[str, FileState] = {}
        self.by_module: dict[str, str] = {}
        self.overrides = overrides or {}

    def get(self, module: str, op=None, ctx=None) -> FileState:
        rel = self.by_module.get(module)
        if rel is None:
            try:
                path = self.tree.file_for(module)
            except MissingModule as exc:
                if op is not None:
                    raise op.drift(
                        ctx,
                        None,
                        f"module file missing ({exc.message})",
                        ctx.tree.find_definition_elsewhere(
                            op.target.qualname.split(".")[-1] or module.split(".")[-1], ""
                        ),
                    ) from None
                raise
            rel = self.tree.relpath(path)
            self.by_module[module] = rel
        if rel not in self.states:
            data = self.overrides.get(rel)
            if data is None:
                data = (self.tree.root / rel).read_bytes()
            self.states[rel] = FileState(rel, data, parse_module(data, rel))
        return self.states[rel]

    def snapshot(self) -> dict:
        return {
            rel: (st.module, dict(st.owners), {k: list(v) for k, v in st.inserted_at.items()})
            for rel, st in self.states.items()
        }

    def restore(self, snap: dict) -> None:
        for rel, st in list(self.states.items()):
            if rel in snap:
                st.module, st.owners, st.inserted_at = snap[rel]
            else:
                del self.states[rel]
                self.by_module = {m: r for m, r in self.by_module.items() if r != rel}


_PARSE_CACHE: dict[str, cst.Module] = {}


def parse_module(data: bytes, rel: str) -> cst.Module:
    """libcst parse, cached by content hash (trees are immutable, so sharing is safe)."""
    key = sha256(data)
    mod = _PARSE_CACHE.get(key)
    if mod is None:
        try:
            mod = cst.parse_module(data)
        except cst.ParserSyntaxError as exc:
            raise SourceError(f"{rel} is not valid Python (line {exc.raw_line}): {exc.message}") from None
        except UnicodeDecodeError as exc:
            raise SourceError(f"{rel} cannot be decoded ({exc.reason}); is its coding declaration right?") from None
        _PARSE_CACHE[key] = mod
    return mod


@dataclass
class RecipeResult:
    id: str
    status: Status
    variant: str | None = None
    message: str = ""
    error: SpectoolError | None = None
    ops: list[dict] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out = {
            "id": self.id,
            "status": self.status,
            "variant": self.variant,
            "message": self.message,
            "operations": self.ops,
            "files": self.files,
        }
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out


@dataclass
class FileChange:
    """before: the bytes on disk now; after: what the plan writes; base: the bytes the plan
    started from (the saved original when recipes are re-planned, else equal to before)."""

    relpath: str
    before: bytes
    after: bytes
    base: bytes | None = None

    def diff(self) -> str:
        a = self.before.decode("utf-8", "replace").splitlines(keepends=True)
        b = self.after.decode("utf-8", "replace").splitlines(keepends=True)
        return "".join(difflib.unified_diff(a, b, f"a/{self.relpath}", f"b/{self.relpath}"))


@dataclass
class Plan:
    tree: SglangTree
    recipes: list[Recipe]
    results: list[RecipeResult]
    changes: list[FileChange]
    options: dict
    inputs: dict[str, str] = field(default_factory=dict)  # relpath -> sha256 of the bytes planned from

    @property
    def ok(self) -> bool:
        return all(r.status.ok for r in self.results)

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def diff(self) -> str:
        return "".join(c.diff() for c in self.changes)


def _options_for(recipe: Recipe, options: dict) -> dict:
    merged = dict(recipe.options)
    given = options.get(recipe.id, {})
    unknown = sorted(set(given) - set(merged))
    if unknown:
        raise RecipeError(f"options {unknown} given for recipe {recipe.id!r}, which declares {sorted(merged)}.")
    merged.update(given)
    return merged


def _ordered_before(recipes: list[Recipe]) -> dict[str, frozenset[str]]:
    """Per recipe, every recipe it requires, directly or not: the recipes it states an order
    with (they may insert at the same anchor; it goes after them)."""
    direct = {r.id: set(r.requires) for r in recipes}
    out: dict[str, frozenset[str]] = {}

    def visit(rid: str) -> frozenset[str]:
        if rid not in out:
            out[rid] = frozenset()  # a cycle is refused by load_recipes; never loop here
            acc = set()
            for req in direct.get(rid, ()):
                acc |= {req} | visit(req)
            out[rid] = frozenset(acc)
        return out[rid]

    for r in recipes:
        visit(r.id)
    return out


def build_plan(
    tree: SglangTree,
    recipes: list[Recipe],
    options: dict | None = None,
    overrides: dict[str, bytes] | None = None,
    validate: bool = True,
) -> Plan:
    """Run every recipe against the tree in memory and return what would change.
    `validate=False` skips compiling and pyflakes (for a read-back of an already validated plan)."""
    options = options or {}
    files = FileSet(tree, overrides)
    ordered = _ordered_before(recipes)
    results: list[RecipeResult] = []
    by_id: dict[str, RecipeResult] = {}
    for recipe in recipes:
        opts = _options_for(recipe, options)
        variant = recipe.variant_for(tree.version)
        res = RecipeResult(recipe.id, Status.UNSUPPORTED, variant.name if variant else None)
        by_id[recipe.id] = res
        results.append(res)
        failed_req = [r for r in recipe.requires if by_id.get(r) and not by_id[r].status.ok]
        if variant is None:
            ranges = ", ".join(f"{v.name} ({v.versions})" for v in recipe.variants)
            res.message = f"no variant covers SGLang {tree.version}; variants: {ranges}"
            continue
        if variant.unsupported:
            res.message = f"SGLang {tree.version} is not supported: {variant.unsupported}"
            continue
        if variant.upstreamed is not None and not variant.operations:
            # Upstream has the feature: it needs none of our other recipes.
            res.status, res.message = _check_upstreamed(tree, files, recipe, variant)
            continue
        if failed_req:
            res.status, res.message = Status.BLOCKED, f"requires {', '.join(failed_req)}, which did not apply"
            continue
        snap = files.snapshot()
        statuses = []
        try:
            for i, op in enumerate(variant.operations):
                if op.when and not opts.get(op.when):
                    res.ops.append({"op": op.kind, "target": str(op.target), "status": OpStatus.SKIPPED})
                    continue
                ctx = OpContext(recipe.id, variant.name, i, tree, files, opts, ordered[recipe.id])
                status = op.run(ctx)
                st = files.get(op.target.module)
                for imp in op.imports:
                    if add_import(st, imp, op.where, recipe.id) == OpStatus.APPLIED:
                        status = OpStatus.APPLIED
                statuses.append(status)
                res.ops.append({"op": op.kind, "target": str(op.target), "status": status})
                if st.relpath not in res.files:
                    res.files.append(st.relpath)
        except DriftError as exc:
            files.restore(snap)
            res.status, res.error, res.message = Status(exc.kind), exc, exc.message
            continue
        if statuses and all(s == OpStatus.ALREADY for s in statuses):
            res.status = Status.ALREADY_APPLIED
        else:
            n_already = sum(s == OpStatus.ALREADY for s in statuses)
            res.status = Status.WOULD_APPLY
            if n_already:
                res.message = f"{n_already} of {len(statuses)} operations were already in place"
        if variant.upstreamed is not None:
            res.message = (res.message + "; " if res.message else "") + variant.upstreamed.note
    changes = []
    for rel, st in sorted(files.states.items()):
        # An unedited module is still the parse of its bytes, which libcst renders back byte
        # for byte: skip the render.
        after = st.original if st.module is st.parsed else _render(st, [r.id for r in results if rel in r.files])
        # Planned from overrides (saved originals): what changes is relative to the disk.
        on_disk = (tree.root / rel).read_bytes() if rel in files.overrides else st.original
        if after != on_disk:
            changes.append(FileChange(rel, on_disk, after, st.original))
    plan = Plan(
        tree,
        recipes,
        results,
        changes,
        options,
        inputs={rel: sha256(st.original) for rel, st in sorted(files.states.items())},
    )
    if validate:
        _validate(plan)
    _name_required_statuses(recipes, by_id)
    return plan


def _name_required_statuses(recipes: list[Recipe], by_id: dict[str, RecipeResult]) -> None:
    """An upstreamed recipe's detail ends with the actual status of each recipe it requires
    (such as the one that keeps its flag), so no row says what another row contradicts."""
    for recipe in recipes:
        res = by_id.get(recipe.id)
        if res is None or res.status != Status.UPSTREAMED:
            continue
        for req in recipe.requires:
            other = by_id.get(req)
            if other is not None:
                where = f" ({other.variant})" if other.variant and other.status.ok else ""
                res.message = f"{res.message.rstrip('.')}. {req}: {other.status}{where} here."


_LONE_LF = re.compile(rb"(?<!\r)\n")


def _render(st: FileState, recipe_ids: list[str]) -> bytes:
    """The file's new bytes in its own encoding and line endings: inserted code is read
    from LF files, so in a file that uses CRLF throughout, its line breaks (docstrings and
    other multi-line strings included) become CRLF too."""
    try:
        data = st.module.bytes
    except UnicodeEncodeError as exc:
        raise RecipeError(
            f"recipe(s) {', '.join(recipe_ids) or '?'} insert {exc.object[exc.start : exc.end]!r} into {st.relpath}, "
            f"which is encoded as {st.module.encoding} (its coding declaration) and cannot hold it. Use only "
            "characters that encoding has (or escapes in strings) in the recipe's code.",
            file=st.relpath,
        ) from None
    if data != st.original and b"\r\n" in st.original and not _LONE_LF.search(st.original):
        data = _LONE_LF.sub(b"\r\n", data)
    return data


def _check_upstreamed(tree, files, recipe, variant) -> tuple[Status, str]:
    probe = variant.upstreamed.probe
    note = variant.upstreamed.note
    if probe is None:
        return Status.UPSTREAMED, note
    from .cstutil import find_definition

    try:
        st = files.get(probe.module)
    except MissingModule:
        return Status.DRIFT, f"declared upstreamed, but the probe module {probe.module} is missing"
    path = find_definition(st.module, probe.qualname)
    if path is None:
        return Status.DRIFT, f"declared upstreamed, but the probe {probe} is missing: the upstream feature moved"
    if variant.upstreamed.anchor:
        from .ops.statements import statement_matches
        from .patterns import Pattern

        pattern = Pattern.parse(variant.upstreamed.anchor, expression=False)
        if not statement_matches(st, path[-1], pattern):
            return Status.DRIFT, (
                f"declared upstreamed, but {probe} no longer contains "
                f"{variant.upstreamed.anchor.strip().splitlines()[0]!r}: the upstream code changed"
            )
    return Status.UPSTREAMED, note


def _validate(plan: Plan) -> None:
    """Every patched file must compile, and must not use names it does not define."""
    from .validate import new_undefined_names

    for change in plan.changes:
        touched = [r for r in plan.results if change.relpath in r.files and r.status == Status.WOULD_APPLY]
        problem = None
        try:
            compile(change.after, change.relpath, "exec", dont_inherit=True)
        except SyntaxError as exc:
            problem = f"does not compile after patching (line {exc.lineno}: {exc.msg})"
        if problem is None:
            names = new_undefined_names(change.base or change.before, change.after, change.relpath)
            if names:
                problem = "uses names it does not define after patching: " + ", ".join(names)
        if problem:
            for r in touched:
                r.status = Status.INVALID
                r.message = f"{change.relpath} {problem} (recipes touching it: {', '.join(t.id for t in touched)})"
    if any(r.status == Status.INVALID for r in plan.results):
        plan.changes = []
