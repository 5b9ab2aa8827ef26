"""spectool port: carry a recipe over to another SGLang release.

Starts from the variant that covers the release (when it has operations) or else the nearest
variant by version, runs each of its operations against the new tree in memory, and for each
operation that drifted tries the nearest candidates the drift report knows:

* a target module gone: the same definition in exactly one other module (moved);
* a target definition gone: a definition of a similar name (renamed) in which the operation
  then runs cleanly (its anchors are all there);
* a placement anchor gone (``after:``/``before:`` of add_method, add_field, add_definition,
  ``after_flag`` of add_argument): a member, definition or flag of a similar name;
* a statement anchor or expression pattern not found in its function: the same statement in
  exactly one other function of the same class or module (moved within the scope);
* replace_method's method renamed: the code file is copied into a folder for the release,
  with the function renamed, since the method name lives in the code.

A candidate is taken only when it is the only one that passes (name similarity at least
``NAME_CUTOFF`` and the operation runs cleanly with it); otherwise every candidate is listed
for a human and nothing is guessed. An edited anchor statement (other code, not moved) is
always left to a human: what the inserted code relies on may have changed with it.

The new variant is appended to recipe.yaml as text (comments and anchors of the file are
kept; an operation carried over unchanged that had a YAML anchor is written as its alias),
with a range from the release up to the next patch release, cut out of the variant that
covered the release (an ``unsupported`` placeholder is split around it). When every operation
carried over unchanged and the source variant's range touches the new one, the source's range
is widened instead. Limits: ranges must be ``>=A,<B`` (either bound optional); upstreamed
variants (a probe, no operations) are not re-anchored; a recipe's ``requires`` are not ported
with it (port them first: the check afterwards says so).
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shutil
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import cstutil
from .errors import BadInputError, DriftError, RecipeError
from .ops import OPERATIONS, OpContext, add_import
from .ops.members import AddDefinition, AddField, AddMethod, ReplaceMethod, _def_name, _field_name
from .ops.statements import AddArgument, InsertStatements, _flag_of
from .patterns import WILD

NAME_CUTOFF = 0.75  # difflib ratio a renamed name must reach to count as a candidate
MAX_SHOWN = 6  # candidates listed per operation (the best first)

CARRIED, REANCHORED, HUMAN = "carried", "re-anchored", "needs-human"


@dataclass
class Change:
    """One re-anchoring: a key of the operation, old -> new, and why."""

    key: str
    old: str
    new: str
    score: float
    location: str
    why: str

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "old": self.old,
            "new": self.new,
            "score": round(self.score, 3),
            "location": self.location,
            "why": self.why,
        }

    def __str__(self) -> str:
        old, new = (x.strip().splitlines()[0] if x.strip() else x for x in (self.old, self.new))
        return f"{self.key}: {old} -> {new} ({self.why}; similarity {self.score:.2f}, {self.location})"


@dataclass
class OpPort:
    index: int  # 1-based, as drift reports number operations
    kind: str
    target: str
    outcome: str = CARRIED
    changes: list[Change] = field(default_factory=list)
    reason: str = ""
    candidates: list[str] = field(default_factory=list)
    spec: dict = field(default_factory=dict)  # the ported operation (op key included)
    alias: str | None = None  # the YAML anchor of the source operation, if it had one
    copies: dict[str, str] = field(default_factory=dict)  # new code file (relative) -> its text

    def to_json(self) -> dict:
        return {
            "operation": self.index,
            "op": self.kind,
            "target": self.target,
            "outcome": self.outcome,
            "changes": [c.to_json() for c in self.changes],
            "reason": self.reason,
            "candidates": self.candidates,
        }


@dataclass
class PortResult:
    recipe: str
    version: str
    source: str | None = None  # the variant ported from
    covered_by: str | None = None  # the variant that already applies unchanged (nothing written)
    variant: str | None = None  # the new (or widened) variant
    versions: str | None = None
    ops: list[OpPort] = field(default_factory=list)
    ranges: list[str] = field(default_factory=list)  # what changed in other variants' ranges
    wrote: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    check: object = None  # api.Outcome of `check` afterwards

    @property
    def needs_human(self) -> list[OpPort]:
        return [o for o in self.ops if o.outcome == HUMAN]

    @property
    def ok(self) -> bool:
        return not self.needs_human and (self.check is None or self.check.ok)

    def to_json(self) -> dict:
        return {
            "command": "port",
            "ok": self.ok,
            "recipe": self.recipe,
            "to": self.version,
            "from_variant": self.source,
            "covered_by": self.covered_by,
            "variant": self.variant,
            "versions": self.versions,
            "range_changes": self.ranges,
            "wrote": self.wrote,
            "notes": self.notes,
            "carried": [o.to_json() for o in self.ops if o.outcome == CARRIED],
            "reanchored": [o.to_json() for o in self.ops if o.outcome == REANCHORED],
            "needs_human": [o.to_json() for o in self.needs_human],
            "check": self.check.to_json() if self.check is not None else None,
        }


# -- versions --------------------------------------------------------------------------------


def _interval(spec: SpecifierSet) -> tuple[Version | None, Version | None] | None:
    """(lower, upper) of a '>=A,<B' range (either may be None); None for any other form."""
    lo = hi = None
    for s in spec:
        if s.operator == ">=" and lo is None and not s.version.endswith(".*"):
            lo = Version(s.version)
        elif s.operator == "<" and hi is None and not s.version.endswith(".*"):
            hi = Version(s.version)
        else:
            return None
    return lo, hi


def _spec_text(lo: Version | None, hi: Version | None) -> str:
    return ",".join(x for x in (f">={lo}" if lo else "", f"<{hi}" if hi else "") if x)


def _key(v: Version) -> float:
    rel = (list(v.release) + [0, 0, 0])[:3]
    return rel[0] * 1e6 + rel[1] * 1e3 + rel[2] + (v.post or 0) * 1e-3


def _distance(variant, version: Version) -> tuple[float, int]:
    """How far a variant's range is from a release; below it first on a tie."""
    iv = _interval(variant.versions)
    if iv is None:
        return (float("inf"), 1)
    lo, hi = iv
    if hi is not None and version >= hi:
        return (_key(version) - _key(hi), 0)
    if lo is not None and version < lo:
        return (_key(lo) - _key(version), 1)
    return (0.0, 0)


def nearest_variant(recipe, version: Version):
    """The variant with operations whose range is nearest to `version` (None: none has any)."""
    real = [v for v in recipe.variants if v.operations]
    return min(real, key=lambda v: _distance(v, version)) if real else None


def _next_patch(v: Version) -> Version:
    """The release after v's at its last level: 0.5.13 and 0.5.13.post1 -> 0.5.14."""
    if v.is_prerelease:
        return Version(v.base_version)
    rel = list(v.release)
    rel[-1] += 1
    return Version(".".join(map(str, rel)))


# -- candidates ------------------------------------------------------------------------------


TOKEN_SCORE = 0.8  # the score of a name whose words hold the other's (step -> forward_step)


def _ratio(a: str, b: str) -> float:
    """How alike two names are: difflib's ratio, or TOKEN_SCORE when the words of one
    (split at '_' and '.') run unbroken inside the other's (a prefix or suffix was added)."""
    ratio = difflib.SequenceMatcher(None, a, b).ratio()
    ta, tb = [t for t in re.split(r"[_.]", a) if t], [t for t in re.split(r"[_.]", b) if t]
    short, long_ = sorted((ta, tb), key=len)
    inside = short and any(long_[i : i + len(short)] == short for i in range(len(long_) - len(short) + 1))
    return max(ratio, TOKEN_SCORE) if inside else ratio


def _close(name: str, names, exclude=()) -> list[tuple[str, float]]:
    out = [(n, _ratio(name, n)) for n in dict.fromkeys(names) if n and n != name and n not in exclude]
    return sorted([x for x in out if x[1] >= NAME_CUTOFF], key=lambda x: -x[1])


def _module_of(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules_defining(tree, qualname: str, skip: str | None) -> list[tuple[str, str]]:
    """(module, 'rel:line') of every file of the tree that defines `qualname` (a top-level
    name, or Class.method): where a definition moved."""
    first = qualname.split(".")[0]
    pat = re.compile(rb"^(?:async\s+def|def|class)\s+" + re.escape(first.encode()) + rb"\b", re.M)
    out = []
    for rel, data in tree.sources_mentioning(first, skip):
        if not pat.search(data):
            continue
        try:
            line = _ast_line(ast.parse(data), qualname)
        except (SyntaxError, ValueError):
            continue
        if line is not None:
            out.append((_module_of(rel), f"{rel}:{line}"))
    return out


def _ast_line(module: ast.Module, qualname: str) -> int | None:
    body, node = module.body, None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    return node.lineno


@dataclass
class _Alt:
    key: str
    old: str
    new: str
    score: float
    location: str
    why: str
    spec: dict
    copy: tuple[str, str] | None = None  # (new code file relative to the recipe, its text)


class _Porter:
    """Runs one variant's operations against a tree, re-anchoring what drifted."""

    def __init__(self, recipe, variant, tree, version: Version, scratch: _ScratchCode):
        from .plan import FileSet

        self.recipe, self.variant, self.tree, self.version = recipe, variant, tree, version
        self.scratch = scratch
        self.files = FileSet(tree)
        self.adds: dict[str, int] = {}  # names an operation that did not port would have added -> its index

    # running ---------------------------------------------------------------------------------
    def make(self, spec: dict, index: int):
        cls = OPERATIONS[spec["op"]]
        body = {k: v for k, v in spec.items() if k != "op"}
        return cls(body, self.recipe.path.parent, self.recipe.path, f"{self.recipe.path}: port #{index + 1}")

    def run(self, op, index: int, keep: bool) -> DriftError | None:
        """Run op on the shared state; on drift (or when not `keep`) restore the state."""
        snap = self.files.snapshot()
        ctx = OpContext(self.recipe.id, self.variant.name, index, self.tree, self.files, {})
        try:
            op.run(ctx)
            st = self.files.get(op.target.module)
            for imp in op.imports:
                add_import(st, imp, op.where, self.recipe.id)
        except DriftError as exc:
            self.files.restore(snap)
            return exc
        if not keep:
            self.files.restore(snap)
        return None

    def port(self, index: int, op, alias: str | None) -> OpPort:
        """Carry op over, or re-anchor it to the one candidate that makes it apply, or say why not."""
        out = OpPort(index + 1, op.kind, str(op.target), spec={"op": op.kind, **op.spec}, alias=alias)
        err = self.run(op, index, keep=True)
        if err is not None:
            self._reanchor(out, op, index, err)
        if out.outcome == HUMAN:
            for name in self.added_names(op):
                self.adds.setdefault(name, index + 1)
        return out

    def _reanchor(self, out: OpPort, op, index: int, err: DriftError) -> None:
        out.outcome = HUMAN
        depends = self.depends_on_failed(op)
        if depends:
            out.reason = depends
            return
        alts = self.alternatives(op, index)
        passing = [a for a in alts if self.trial(a, index)]
        self.scratch.settle()
        if len(passing) == 1:
            alt = passing[0]
            if alt.copy:
                self.scratch.choose(*alt.copy)
            self.run(self.make(alt.spec, index), index, keep=True)
            out.outcome, out.spec = REANCHORED, alt.spec
            out.changes.append(Change(alt.key, alt.old, alt.new, alt.score, alt.location, alt.why))
            if alt.copy:
                out.copies[alt.copy[0]] = alt.copy[1]
            return
        if len(passing) > 1:
            out.reason = f"{err.message} {len(passing)} candidates make it apply: not guessed"
        elif alts:
            out.reason = f"{err.message} No candidate makes it apply on its own"
        else:
            out.reason = err.message
        shown = sorted(passing or alts, key=lambda a: -a.score)[:MAX_SHOWN]
        out.candidates = [f"{a.key}: {a.new} (similarity {a.score:.2f}, {a.location})" for a in shown]
        out.candidates += [c for c in err.candidates if all(c not in s for s in out.candidates)]

    def trial(self, alt: _Alt, index: int) -> bool:
        """Does the operation apply with this candidate? (Nothing of it is kept.)"""
        if alt.copy:
            self.scratch.write(*alt.copy)
        return self.run(self.make(alt.spec, index), index, keep=False) is None

    # what an operation adds ------------------------------------------------------------------
    @staticmethod
    def added_names(op) -> list[str]:
        try:
            if isinstance(op, AddMethod):
                return [m.name.value for m in op.methods()]
            if isinstance(op, AddDefinition):
                return [op.code["code"].definition().name.value]
            if isinstance(op, AddField):
                return [n for n in map(_field_name, op.code["code"].body_statements()) if n]
        except RecipeError:
            pass
        return []

    def depends_on_failed(self, op) -> str:
        names = [op.spec.get(k) for k in ("after", "before")] + op.target.qualname.split(".")
        for name in names:
            if name and name in self.adds:
                return (
                    f"anchored on {name!r}, which operation #{self.adds[name]} adds and which did not port: "
                    "port that one first"
                )
        return ""

    # candidates ------------------------------------------------------------------------------
    def alternatives(self, op, index: int) -> list[_Alt]:
        spec = {"op": op.kind, **op.spec}
        try:
            path = self.tree.file_for(op.target.module)
        except Exception:  # MissingModule: the module moved or is gone
            return self._moved_module(op, spec)
        st = self.files.get(op.target.module)
        qual = op.target.qualname
        scope = cstutil.find_definition(st.module, qual) if qual else [st.module]
        if scope is None:
            return self._renamed_target(op, spec, st) + self._moved_module(op, spec, skip=self.tree.relpath(path))
        node = scope[-1]
        if isinstance(op, ReplaceMethod):
            return self._renamed_method(op, spec, st, node)
        if isinstance(op, (AddMethod, AddField)) and op.spec.get("after"):
            members = [n for s in cstutil.body_of(node) for n in (_def_name(s), _field_name(s)) if n]
            if isinstance(op, AddField):
                members = [n for s in cstutil.body_of(node) if (n := _field_name(s))]
            if op.spec["after"] not in members:
                return self._renamed_name(spec, "after", members, st, node, "member renamed")
            return []
        if isinstance(op, AddDefinition):
            side = "before" if "before" in op.spec else "after"
            names = [n for s in st.module.body if (n := _def_name(s))]
            if op.spec[side] not in names:
                return self._renamed_name(spec, side, names, st, st.module, "definition renamed")
            return []
        if isinstance(op, AddArgument):
            flags = [f for s, _ in cstutil.iter_statements(node, [node]) if (f := _flag_of(s))]
            if op.spec["after_flag"] not in flags:
                return [
                    _Alt(
                        "after_flag",
                        op.spec["after_flag"],
                        f,
                        r,
                        f"in {qual}",
                        "flag renamed",
                        {**spec, "after_flag": f},
                    )
                    for f, r in _close(op.spec["after_flag"], flags)
                ]
            return []
        if isinstance(op, InsertStatements) or op.kind in ("replace_expr", "wrap_expr"):
            return self._moved_statement(op, spec, st, scope) or self._renamed_parameter(op, spec, st, scope)
        return []

    def _where(self, st, node) -> str:
        line = st.line_of(node) if node is not None else None
        return f"{st.relpath}:{line or '?'}"

    def _renamed_name(self, spec, key, names, st, scope_node, why) -> list[_Alt]:
        nodes = {(_def_name(s) or _field_name(s)): s for s in cstutil.body_of(scope_node)}
        return [
            _Alt(key, spec[key], n, r, self._where(st, nodes.get(n)), why, {**spec, key: n})
            for n, r in _close(spec[key], names)
        ]

    def _renamed_target(self, op, spec, st) -> list[_Alt]:
        qual = op.target.qualname
        depth = qual.count(".")
        parent, _, last = qual.rpartition(".")
        out = []
        for n in cstutil.all_definitions(st.module):
            if n.count(".") != depth or n == qual:
                continue
            # a method renamed in its class is judged by its own name; anything else by the whole
            r = _ratio(last, n.rpartition(".")[2]) if n.rpartition(".")[0] == parent else _ratio(qual, n)
            if r < NAME_CUTOFF:
                continue
            node = cstutil.find_definition(st.module, n)[-1]
            new = {**spec, "target": f"{op.target.module}:{n}"}
            out.append(
                _Alt("target", str(op.target), new["target"], r, self._where(st, node), "definition renamed", new)
            )
        return out

    def _moved_module(self, op, spec, skip: str | None = None) -> list[_Alt]:
        qual = op.target.qualname or spec.get("before") or spec.get("after") or ""
        if not qual:
            return []
        out = []
        for module, where in _modules_defining(self.tree, qual, skip):
            new = {**spec, "target": f"{module}:{op.target.qualname}" if op.target.qualname else module}
            out.append(
                _Alt("target", str(op.target), new["target"], 1.0, where, "definition moved to another module", new)
            )
        return out

    def _moved_statement(self, op, spec, st, scope) -> list[_Alt]:
        """The same anchor in another function of the enclosing class (or module)."""
        qual = op.target.qualname
        parent_qual = qual.rsplit(".", 1)[0] if "." in qual else ""
        parent = scope[-2] if len(scope) > 1 else st.module
        while not isinstance(parent, (cst.ClassDef, cst.Module)):  # a def inside an if/try at module level
            parent = scope[scope.index(parent) - 1]
        out = []
        for stmt, _ in cstutil.iter_statements(parent, [parent]):
            if not isinstance(stmt, cst.FunctionDef) or stmt is scope[-1]:
                continue
            name = f"{parent_qual}.{stmt.name.value}" if parent_qual else stmt.name.value
            new = {**spec, "target": f"{op.target.module}:{name}"}
            trial = self.make(new, 0)
            if self.run(trial, 0, keep=False) is None:
                out.append(
                    _Alt(
                        "target",
                        str(op.target),
                        new["target"],
                        1.0,
                        self._where(st, stmt),
                        "the same anchor, moved to another function of the scope",
                        new,
                    )
                )
        return out

    def _renamed_method(self, op, spec, st, cls_node) -> list[_Alt]:
        ref = op.code["code"]
        old = ref.qualname.split(".")[-1]
        methods = [n for s in cstutil.body_of(cls_node) if (n := _def_name(s))]
        if old in methods:
            return []
        out = []
        for n, r in _close(old, methods):
            rel, text = self._edited_copy(ref, lambda node, n=n: node.with_changes(name=cst.Name(n)))
            new_qual = ".".join(ref.qualname.split(".")[:-1] + [n])
            new = {**spec, "code": f"{rel}:{new_qual}"}
            node = next(s for s in cstutil.body_of(cls_node) if _def_name(s) == n)
            out.append(
                _Alt(
                    "code",
                    spec["code"],
                    new["code"],
                    r,
                    self._where(st, node),
                    "method renamed: the code file is copied with the function renamed",
                    new,
                    (rel, text),
                )
            )
        return out

    def _renamed_parameter(self, op, spec, st, scope) -> list[_Alt]:
        """The anchor names a parameter the function now calls otherwise: each parameter the
        anchor does not use is tried in its place (the code function that names it too is
        copied with the name changed)."""
        fn = scope[-1]
        key = "anchor" if "anchor" in spec else "pattern"
        pattern = getattr(op, "pattern", None)
        if not isinstance(fn, cst.FunctionDef) or pattern is None or key not in spec:
            return []
        used = {n.id for n in ast.walk(pattern.tree) if isinstance(n, ast.Name) and not n.id.startswith(WILD)}
        try:
            here = {
                n.id if isinstance(n, ast.Name) else n.arg
                for n in ast.walk(ast.parse(textwrap.dedent(st.code(fn))))
                if isinstance(n, (ast.Name, ast.arg))
            }
        except SyntaxError:
            return []
        missing = sorted(used - here)
        if len(missing) != 1:
            return []
        old = missing[0]
        params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)]
        ref = op.code.get("code")
        out = []
        for p in params:
            if p in used or p in ("self", "cls"):
                continue
            new = {**spec, key: re.sub(rf"\b{re.escape(old)}\b", p, spec[key])}
            copy = None
            if ref is not None and old in cst.Module([]).code_for_node(ref.definition()):
                rel, text = self._edited_copy(ref, lambda node, p=p: node.visit(_RenameName(old, p)))
                new["code"], copy = f"{rel}:{ref.qualname}", (rel, text)
            out.append(
                _Alt(
                    key,
                    spec[key].strip(),
                    new[key].strip(),
                    _ratio(old, p),
                    self._where(st, fn),
                    f"parameter renamed: {old} -> {p}",
                    new,
                    copy,
                )
            )
        return out

    def _edited_copy(self, ref, edit) -> tuple[str, str]:
        """(path relative to the recipe, text) of a copy of ref's code file in a folder named
        after the release, as earlier re-anchorings of this port left it, with `edit` applied
        to the definition ref names."""
        base = self.recipe.path.parent.resolve()
        rel_old = ref.file.relative_to(base).as_posix()
        folder = "v" + re.sub(r"\W", "_", str(self.version))
        rel = rel_old if rel_old.startswith(folder + "/") else f"{folder}/{Path(rel_old).name}"
        module = cst.parse_module(self.scratch.chosen.get(rel) or ref.file.read_text(encoding="utf-8"))
        path = cstutil.find_definition(module, ref.qualname)
        return rel, cstutil.rebuild(path, edit(path[-1])).code


class _RenameName(cst.CSTTransformer):
    """Rename a variable: every Name `old`, except attribute names and keyword arguments."""

    def __init__(self, old: str, new: str):
        super().__init__()
        self.old, self.new, self.skip = old, new, set()

    def visit_Attribute(self, node) -> None:
        self.skip.add(id(node.attr))

    def visit_Arg(self, node) -> None:
        if node.keyword is not None:
            self.skip.add(id(node.keyword))

    def leave_Name(self, original, updated):
        if original.value == self.old and id(original) not in self.skip:
            return updated.with_changes(value=self.new)
        return updated


class _ScratchCode:
    """Copies of code files that re-anchorings need. A candidate's copy is written while it is
    tried (a code reference must name an existing file); `settle` puts back what the chosen
    candidates wrote, and `discard` removes every copy the port does not keep."""

    def __init__(self, base: Path):
        self.base, self.made, self.chosen = base, [], {}

    def write(self, rel: str, text: str) -> None:
        path = self.base / rel
        if path.exists() and path not in self.made and path.read_text(encoding="utf-8") != text:
            raise BadInputError(f"{path} exists with other content; move it away and port again.")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        now = time.time_ns()
        os.utime(path, ns=(now, now))  # code files are parsed once per mtime: a rewrite is seen
        if path not in self.made:
            self.made.append(path)

    def choose(self, rel: str, text: str) -> None:
        self.chosen[rel] = text
        self.write(rel, text)

    def settle(self) -> None:
        for path in self.made:
            rel = path.relative_to(self.base).as_posix()
            if rel in self.chosen:
                self.write(rel, self.chosen[rel])

    def discard(self, keep: bool) -> None:
        for path in reversed(self.made):
            if keep and path.relative_to(self.base).as_posix() in self.chosen:
                continue
            path.unlink(missing_ok=True)
            try:
                path.parent.rmdir()
            except OSError:
                pass


# -- YAML text -------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style as the shipped recipes write it: sequences indented under their key,
    multi-line code as literal blocks, long prose folded."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _str(dumper, data):
    style = "|" if "\n" in data else ">" if len(data) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)
_ALIAS = "__spectool_alias_{}__"
_ALIAS_RE = re.compile(r"['\"]?__spectool_alias_([\w-]+)__['\"]?")


def _variant_block(data: dict, indent: int) -> str:
    """A variant as YAML text, a sequence item at `indent` spaces (aliases restored)."""
    text = yaml.dump([data], Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)
    text = _ALIAS_RE.sub(lambda m: "*" + m.group(1), text)
    return "".join(" " * indent + line if line.strip() else line for line in text.splitlines(keepends=True))


@dataclass
class _Doc:
    text: str
    items: list  # the variants' composed mapping nodes

    @classmethod
    def read(cls, path: Path) -> _Doc:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        seq = next(v for k, v in root.value if k.value == "variants")
        return cls(text, list(seq.value))

    def value_node(self, i: int, key: str):
        return next((v for k, v in self.items[i].value if k.value == key), None)

    def anchor_of(self, node) -> str | None:
        m = re.match(r"&([\w-]+)", self.text[node.start_mark.index :])
        return m.group(1) if m else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".port-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# -- the command -----------------------------------------------------------------------------


def _variant_name(source: str, version: Version, taken: set[str]) -> str:
    stem = re.sub(r"-(?:\d[\w.]*|seed)$", "", source)
    name = f"{stem}-{version}"
    n = 2
    while name in taken:
        name, n = f"{stem}-{version}-{n}", n + 1
    return name


def port(recipe_id: str, tree_dir, *, recipes_dir=None, dry_run: bool = False) -> PortResult:
    """Port recipe `recipe_id` to the SGLang tree in `tree_dir` (see the module docstring).
    Writes the recipe (unless dry_run or an operation needs a human) and checks it."""
    from .recipe import default_recipes_dir, load_recipes
    from .source import locate

    recipes = load_recipes(Path(recipes_dir) if recipes_dir else None, [recipe_id])
    recipe = next(r for r in recipes if r.id == recipe_id)
    tree = locate(tree_dir)
    version = tree.version
    res = PortResult(recipe.id, str(version))
    covering = recipe.variant_for(version)
    if covering is not None and not covering.operations and covering.upstreamed is not None:
        res.covered_by = covering.name
        res.notes.append(
            f"variant {covering.name} covers SGLang {version} and says the feature is upstream; "
            "port does not re-anchor upstream probes"
        )
        res.check = _check(recipe.id, tree, Path(recipes_dir) if recipes_dir else default_recipes_dir())
        return res
    source = covering if covering is not None and covering.operations else nearest_variant(recipe, version)
    if source is None:
        raise BadInputError(f"recipe {recipe.id!r} has no variant with operations to port from.")
    res.source = source.name
    if covering is not None and covering.unsupported:
        res.notes.append(
            f"{covering.name} marked SGLang {version} unsupported: {covering.unsupported.strip()} "
            "Review that the ported variant answers this."
        )
    doc = _Doc.read(recipe.path)
    src_index = recipe.variants.index(source)
    op_nodes = doc.value_node(src_index, "operations").value
    scratch = _ScratchCode(recipe.path.parent)
    porter = _Porter(recipe, source, tree, version, scratch)
    root = Path(recipes_dir) if recipes_dir else default_recipes_dir()
    try:
        for i, op in enumerate(source.operations):
            res.ops.append(porter.port(i, op, doc.anchor_of(op_nodes[i])))
        if covering is source and all(o.outcome == CARRIED for o in res.ops):
            res.covered_by = source.name
            res.notes.append(
                f"variant {source.name} ({source.versions}) covers SGLang {version} and applies "
                "unchanged: nothing to write"
            )
        elif res.needs_human:
            res.notes.append(f"{len(res.needs_human)} operation(s) need a human: nothing was written")
        else:
            text = _new_text(res, recipe, doc, source, covering, version)
            _refuse_broken(recipe.path, text)
            if dry_run:
                res.notes.append("--dry-run: nothing written; the check below ran on a copy of the recipes")
                with tempfile.TemporaryDirectory() as tmp:
                    copy = Path(tmp) / "recipes"
                    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
                    (copy / recipe.path.relative_to(root)).write_text(text, encoding="utf-8")
                    res.check = _check(recipe.id, tree, copy)
                return res
            _write_atomic(recipe.path, text)
            res.wrote.append(str(recipe.path))
            res.wrote.extend(str(recipe.path.parent / r) for r in sorted(scratch.chosen))
    finally:
        scratch.discard(keep=bool(res.wrote))
    res.check = _check(recipe.id, tree, root)
    return res


def _check(recipe_id: str, tree, recipes_root: Path):
    from . import api

    return api.check(tree.dir, recipes_dir=recipes_root, select=[recipe_id])


def _refuse_broken(path: Path, text: str) -> None:
    """Load the new recipe text beside the recipe (its code references resolve there): the
    loader refuses overlapping ranges and schema errors before anything is replaced."""
    from .recipe import load_recipe

    tmp = path.with_name("recipe.port-check.yaml")
    tmp.write_text(text, encoding="utf-8")
    try:
        load_recipe(tmp)
    finally:
        tmp.unlink(missing_ok=True)


def _new_text(res: PortResult, recipe, doc: _Doc, source, covering, version: Version) -> str:
    """recipe.yaml's new text: the ranges decided, the variant appended (or the source widened)."""
    intervals = {v.name: _interval(v.versions) for v in recipe.variants}
    odd = [f"{n} ({v.versions})" for n, v in ((v.name, v) for v in recipe.variants) if intervals[n] is None]
    if odd:
        raise BadInputError(
            f"{recipe.path}: variant range(s) {', '.join(odd)} are not of the form '>=A,<B'; "
            "spectool port cannot place a new range beside them. Edit the ranges by hand."
        )
    lo, hi = version, _next_patch(version)
    edits: list[tuple[int, int, str]] = []  # (start, end, text) in doc.text
    extra_blocks: list[dict] = []
    names = {v.name for v in recipe.variants}
    if covering is not None:
        clo, chi = intervals[covering.name]
        ci = recipe.variants.index(covering)
        if covering.operations:  # a real variant that drifted: the new one takes over from here
            hi = chi
        elif chi is not None:
            hi = min(hi, chi)
        low_part = clo is None or clo < lo
        high_part = hi is not None and (chi is None or hi < chi)
        parts = []
        if low_part:
            parts.append((clo, lo))
        if high_part:
            parts.append((hi, chi))
        if not parts:
            _drop_item(doc, ci, edits)
            res.ranges.append(f"{covering.name} ({covering.versions}) removed: the new variant covers all of it")
        else:
            first = parts[0]
            _set_versions(doc, ci, first, edits)
            new_name = _renamed_placeholder(covering.name, clo, first[0], names)
            if new_name != covering.name:
                _set_scalar(doc, ci, "name", new_name, edits)
                names.add(new_name)
            res.ranges.append(f"{covering.name} ({covering.versions}) -> {new_name} ({_spec_text(*first)})")
            if len(parts) == 2:
                data = yaml.safe_load(doc.text[doc.items[ci].start_mark.index : doc.items[ci].end_mark.index])
                name = _renamed_placeholder(covering.name, clo, parts[1][0], names)
                names.add(name)
                extra_blocks.append(
                    {
                        "name": name,
                        "versions": _spec_text(*parts[1]),
                        **{k: v for k, v in data.items() if k not in ("name", "versions")},
                    }
                )
                res.ranges.append(f"new {name} ({_spec_text(*parts[1])}): the rest of {covering.name}")
    else:
        above = [iv[0] for iv in intervals.values() if iv[0] is not None and iv[0] > version]
        if above:
            hi = min(hi, min(above))
    unchanged = all(o.outcome == CARRIED for o in res.ops)
    slo, shi = intervals[source.name]
    si = recipe.variants.index(source)
    if unchanged and covering is not source and (shi == lo or (hi is not None and hi == slo)):
        widened = (slo, hi) if shi == lo else (lo, shi)
        _set_versions(doc, si, widened, edits)
        res.variant, res.versions = source.name, _spec_text(*widened)
        res.ranges.append(f"{source.name} ({source.versions}) widened to {res.versions}: it applies unchanged")
    else:
        res.variant = _variant_name(source.name, version, names)
        res.versions = _spec_text(lo, hi)
        moved = [f"#{o.index} {c.key} {c.old} -> {c.new}" for o in res.ops for c in o.changes]
        block = {
            "name": res.variant,
            "versions": res.versions,
            "notes": f"The operations of {source.name}" + (", re-anchored: " + "; ".join(moved) if moved else "") + ".",
            "operations": [_ALIAS.format(o.alias) if o.outcome == CARRIED and o.alias else o.spec for o in res.ops],
        }
        extra_blocks.insert(0, block)
    text = doc.text
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    if extra_blocks:
        last = doc.items[-1]
        indent = last.start_mark.column - 2
        shift = sum(len(new) - (end - start) for start, end, new in edits if start < last.end_mark.index)
        at = _line_end(text, last.end_mark.index + shift)
        blocks = "".join("\n" + _variant_block(b, indent) for b in extra_blocks)
        text = text[:at] + blocks + text[at:]
    return text


def _line_end(text: str, index: int) -> int:
    """The start of the line after the one holding `index` (or index, at a line start)."""
    if index == 0 or text[index - 1] == "\n":
        return index
    nl = text.find("\n", index)
    return len(text) if nl < 0 else nl + 1


def _renamed_placeholder(name: str, old_lo, new_lo, taken: set[str]) -> str:
    """A variant named after its lower bound ('unsupported-0.5.13') follows a new lower bound."""
    if old_lo is not None and new_lo is not None and name.endswith(f"-{old_lo}") and new_lo != old_lo:
        cand = name[: -len(str(old_lo))] + str(new_lo)
        if cand not in taken:
            return cand
    return name


def _set_scalar(doc: _Doc, i: int, key: str, value: str, edits) -> None:
    node = doc.value_node(i, key)
    edits.append((node.start_mark.index, node.end_mark.index, f'"{value}"'))


def _set_versions(doc: _Doc, i: int, interval, edits) -> None:
    _set_scalar(doc, i, "versions", _spec_text(*interval), edits)


def _drop_item(doc: _Doc, i: int, edits) -> None:
    """Remove a variant item whose whole range the new variant takes (from its '- ' to the next item)."""
    node = doc.items[i]
    start = doc.text.rfind("\n", 0, node.start_mark.index) + 1
    end = doc.items[i + 1].start_mark.index if i + 1 < len(doc.items) else len(doc.text)
    end = doc.text.rfind("\n", 0, end) + 1 if i + 1 < len(doc.items) else end
    edits.append((start, end, ""))
