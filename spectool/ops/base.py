"""What every operation shares: its target, its file state, drift and conflict reporting.

``Operation`` is the extension point: its docstring is the contract a new kind of edit follows.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst

from .. import cstutil
from ..codefile import CodeRef
from ..errors import ConflictError, DriftError, RecipeError
from ..patterns import normalized
from ..statuses import OpStatus

if TYPE_CHECKING:  # pragma: no cover
    from ..source import SglangTree

# What Operation.run returns, under the short names operations use.
APPLIED = OpStatus.APPLIED
ALREADY = OpStatus.ALREADY


@dataclass
class FileState:
    """One SGLang file while a plan is built: its current tree and who inserted which nodes.
    ``parsed`` is the parse of ``original`` (the bytes the plan started from); ``module`` starts
    as it and is replaced by every edit."""

    relpath: str
    original: bytes
    module: cst.Module
    owners: dict[int, str] = field(default_factory=dict)
    parsed: cst.Module | None = None
    _keep: list = field(default_factory=list)  # keeps owned nodes alive so ids stay unique
    _code_cache: dict[int, str] = field(default_factory=dict)
    # (anchor: id of a statement or a name tuple, "before"/"after") -> [(recipe id, nodes inserted there)]
    inserted_at: dict[tuple[int, str], list[tuple[str, list]]] = field(default_factory=dict)
    _positions: Any = None

    def __post_init__(self):
        if self.parsed is None:
            self.parsed = self.module

    def code(self, node: cst.CSTNode) -> str:
        key = id(node)
        if key not in self._code_cache:
            self._code_cache[key] = self.module.code_for_node(node)
            self._keep.append(node)
        return self._code_cache[key]

    def own(self, recipe_id: str, nodes) -> None:
        nodes = list(nodes)
        self._keep.extend(nodes)
        for i in cstutil.collect_ids(nodes):
            self.owners.setdefault(i, recipe_id)

    def owner_in(self, node: cst.CSTNode, recipe_id: str) -> str | None:
        """Another recipe that inserted code inside this subtree, if any."""
        for i in cstutil.collect_ids([node]):
            o = self.owners.get(i)
            if o is not None and o != recipe_id:
                return o
        return None

    def line_of(self, where: cst.CSTNode | str) -> int | None:
        """The line of the file as read where a node starts (libcst's PositionProvider, for the
        drift report's candidates). A node this plan created, or a piece of code, is looked up
        by its first line of text: the first line of the file that holds it."""
        if isinstance(where, cst.CSTNode):
            if self._positions is None:
                from libcst.metadata import MetadataWrapper, PositionProvider

                wrapper = MetadataWrapper(self.parsed, unsafe_skip_copy=True)
                self._positions = wrapper.resolve(PositionProvider)
            pos = self._positions.get(where)
            if pos is not None:
                return pos.start.line
            where = self.code(where)
        text = self.original.decode("utf-8", "replace")
        first = where.strip().splitlines()[0] if where.strip() else ""
        pos = text.find(first)
        return None if pos < 0 else text.count("\n", 0, pos) + 1


@dataclass
class OpContext:
    recipe_id: str
    variant: str
    index: int
    tree: SglangTree
    files: Any  # plan.FileSet
    options: dict
    ordered_after: frozenset = frozenset()  # recipes this one requires (directly or not)


_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_QUAL_RE = re.compile(rf"^{_NAME}(?::{_NAME})?$")


@dataclass(frozen=True)
class Target:
    """``module:Class.method``: a file of the sglang package and a definition inside it."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, text: Any, where: str) -> Target:
        if not isinstance(text, str) or not _QUAL_RE.match(text):
            raise RecipeError(f"{where}: 'target' must look like 'sglang.srt.module:Class.method', got {text!r}.")
        module, _, qual = text.partition(":")
        if module != "sglang" and not module.startswith("sglang."):
            raise RecipeError(f"{where}: target module {module!r} must be inside the sglang package.")
        return cls(module, qual)

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}" if self.qualname else self.module


def _anchor_key(anchor) -> object:
    return id(anchor) if isinstance(anchor, cst.CSTNode) else anchor


class Operation:
    """One kind of AST edit a recipe names with ``op: KIND``; subclass it to add a kind.

    **YAML keys.** ``kind`` is the name recipes use. ``required`` and ``optional`` map every key
    the operation accepts (besides ``op``) to its Python type (``object``: any); the recipe
    loader refuses unknown keys, missing required ones and wrong types, naming file and key.
    Every kind requires ``target`` (``sglang.module:Class.method``, parsed into
    ``self.target``); ``when`` (a recipe option that switches the operation on), ``count`` (how
    many anchor matches to expect, default 1) and ``imports`` (module-level import statements
    added with the edit) are read here for kinds that list them. Keys named in ``code_keys``
    hold code references, ``FILE.py:QUALNAME`` beside the recipe, loaded into
    ``self.code[key]`` (a ``CodeRef``).

    **validate()** runs when the recipe is loaded: check the spec, parse patterns and code now
    and raise ``RecipeError`` (message starting with ``self.where``) for anything wrong, so a
    broken recipe fails with exit 2 before any planning. Call ``super().validate()`` to load
    the code references.

    **run(ctx)** edits ``self.state(ctx).module`` in memory (the plan writes files, never an
    operation) and returns ``APPLIED`` when it changed the tree or ``ALREADY`` when its edit
    was in place. libcst trees are immutable: find the node (``self.scope``,
    ``cstutil.iter_statements``, ``patterns.Pattern``), build the new one and rebuild the path
    above it (``cstutil.rebuild``), then record the nodes it inserted with
    ``st.own(ctx.recipe_id, nodes)`` so another recipe touching them is a conflict.

    **Idempotence.** run on its own output must return ``ALREADY`` and change nothing: compare
    what is there with what would be inserted independently of formatting (``same_code``,
    patterns). apply re-plans the planned bytes in memory before writing and refuses a recipe
    that would change them again; each kind has a before/after fixture under tests/fixtures/
    that checks it. An operation that inserts next to an anchor statement goes beyond what
    earlier operations inserted there (``queued_at``, ``mark_inserted``): two recipes sharing
    an anchor conflict unless one requires the other.

    **Errors.** A source that does not match the recipe (definition or anchor missing, matched
    the wrong number of times, different code already there) raises ``self.drift(ctx, st, what,
    candidates)``: the recipe's status becomes ``drift`` (exit 1, nothing written) and the
    candidates (``nearest_definitions``, ``nearest_statements``) show where the code went. A
    node another recipe inserted or changed (``st.owner_in``) raises ``self.conflict(...)``.
    A ``RecipeError`` stops the command with exit 2; any other exception is an internal error
    (exit 3). ``anchor_text()`` is what the drift report names as the anchor.

    **Registering.** Add the class to the tuple in spectool/ops/__init__.py; ``OPERATIONS``
    maps each ``kind`` to its class, and the recipe loader accepts every kind listed there.
    """

    kind: ClassVar[str]
    required: ClassVar[dict[str, type]] = {}
    optional: ClassVar[dict[str, type]] = {}
    code_keys: ClassVar[tuple[str, ...]] = ("code",)

    def __init__(self, spec: dict, base: Path, recipe_file: Path, where: str):
        self.spec = spec
        self.where = where
        self.target = Target.parse(spec.get("target"), where)
        self.when = spec.get("when")
        self.code: dict[str, CodeRef] = {}
        for key in self.code_keys:
            if key in spec:
                self.code[key] = CodeRef.parse(spec[key], base, recipe_file, f"{where}.{key}")
        self.count = int(spec.get("count", 1))
        self.imports: list[str] = list(spec.get("imports", []))
        self.validate()

    def validate(self) -> None:
        """Load the code it names now, so a broken code file fails before any planning."""
        for ref in self.code.values():
            ref.definition()

    # -- helpers -----------------------------------------------------------------------
    def state(self, ctx: OpContext) -> FileState:
        return ctx.files.get(self.target.module, self, ctx)

    def scope(self, ctx: OpContext, st: FileState) -> cstutil.Path:
        path = cstutil.find_definition(st.module, self.target.qualname)
        if path is None:
            raise self.drift(
                ctx, st, f"no definition {self.target.qualname!r} in this file", self.nearest_definitions(ctx, st)
            )
        return path

    def drift(self, ctx: OpContext, st: FileState | None, what: str, candidates=None) -> DriftError:
        file = st.relpath if st else self.target.module
        return DriftError(
            f"recipe '{ctx.recipe_id}' (variant {ctx.variant}), operation #{ctx.index + 1} "
            f"{self.kind} on {self.target} in {file}: {what}.",
            candidates=list(candidates or []),
            recipe=ctx.recipe_id,
            variant=ctx.variant,
            operation=ctx.index + 1,
            op=self.kind,
            file=file,
            target=str(self.target),
            anchor=self.anchor_text(),
        )

    def conflict(self, ctx: OpContext, st: FileState, other: str, what: str) -> ConflictError:
        return ConflictError(
            f"recipe '{ctx.recipe_id}' (variant {ctx.variant}), operation #{ctx.index + 1} "
            f"{self.kind} on {self.target} in {st.relpath}: {what} that recipe '{other}' "
            "already changed; two recipes may not touch the same node.",
            recipe=ctx.recipe_id,
            other=other,
            file=st.relpath,
            target=str(self.target),
        )

    def queued_at(self, ctx: OpContext, st: FileState, anchor, side: str) -> int:
        """How many statements earlier operations inserted at this anchor on this side: this
        one goes beyond them, so a second plan finds every block where the first put it.
        A recipe may share an anchor only with recipes it requires (that states the order).
        `anchor` is the anchor statement, or for a named definition that other edits rebuild
        (a class, a member) a tuple naming it."""
        n = 0
        for owner, nodes in st.inserted_at.get((_anchor_key(anchor), side), []):
            if owner != ctx.recipe_id and owner not in ctx.ordered_after:
                label = st.code(anchor).strip().splitlines()[0][:80] if isinstance(anchor, cst.CSTNode) else anchor[-1]
                raise ConflictError(
                    f"recipe '{ctx.recipe_id}' (variant {ctx.variant}), operation #{ctx.index + 1} "
                    f"{self.kind} on {self.target} in {st.relpath}: inserts {side} {label!r}, as recipe "
                    f"'{owner}' does. Two recipes may insert at one anchor only when one requires the other "
                    f"(it then goes after it): add 'requires: [{owner}]' to one of them, or anchor elsewhere.",
                    recipe=ctx.recipe_id,
                    other=owner,
                    file=st.relpath,
                    target=str(self.target),
                )
            n += len(nodes)
        return n

    def mark_inserted(self, ctx: OpContext, st: FileState, anchor, side: str, nodes) -> None:
        st.inserted_at.setdefault((_anchor_key(anchor), side), []).append((ctx.recipe_id, list(nodes)))
        if isinstance(anchor, cst.CSTNode):
            st._keep.append(anchor)  # its id stays unique while the plan runs

    def anchor_text(self) -> str:
        return self.target.qualname

    def nearest_definitions(self, ctx: OpContext, st: FileState) -> list[str]:
        names = cstutil.all_definitions(st.parsed)  # what is on disk, not what the plan added
        close = difflib.get_close_matches(self.target.qualname, names, n=4, cutoff=0.5)
        out = [f"{st.relpath}: {n}" for n in close]
        last = self.target.qualname.split(".")[-1]
        if last:
            out.extend(f"{hit} (same name, other file)" for hit in ctx.tree.find_definition_elsewhere(last, st.relpath))
        return out[:8]

    def nearest_statements(self, st: FileState, scope_node, text: str) -> list[str]:
        scored = []
        for stmt, _ in cstutil.iter_statements(scope_node, [scope_node]):
            if id(stmt) in st.owners:  # inserted by the plan: not in the file
                continue
            code = st.code(stmt).strip()
            head = code.splitlines()[0] if code else ""
            ratio = difflib.SequenceMatcher(None, text.strip(), head).ratio()
            scored.append((ratio, head, stmt))
        scored.sort(key=lambda x: -x[0])
        out, seen = [], set()
        for ratio, head, stmt in scored:
            if head in seen or ratio < 0.3:
                continue
            seen.add(head)
            line = st.line_of(stmt)
            out.append(f"{st.relpath}:{line or '?'}: {head[:120]}")
            if len(out) == 4:
                break
        return out

    def same_code(self, st: FileState, nodes, ref_nodes, ref_module: cst.Module) -> bool:
        a = "\n".join(st.code(n) for n in nodes)
        b = "\n".join(ref_module.code_for_node(n) for n in ref_nodes)
        return normalized(a) == normalized(b)

    def run(self, ctx: OpContext) -> OpStatus:  # pragma: no cover - abstract
        """Edit the file state in memory; APPLIED if the tree changed, ALREADY if it was in place."""
        raise NotImplementedError
