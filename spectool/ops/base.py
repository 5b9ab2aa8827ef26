"""What every operation shares: its target, its file state, drift and conflict reporting."""

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

# What run() returns (the names recipes' operations have always used).
APPLIED = OpStatus.APPLIED
ALREADY = OpStatus.ALREADY


@dataclass
class FileState:
    """One SGLang file while a plan is built: its current tree and who inserted which nodes."""

    relpath: str
    original: bytes
    module: cst.Module
    owners: dict[int, str] = field(default_factory=dict)
    _keep: list = field(default_factory=list)  # keeps owned nodes alive so ids stay unique
    _code_cache: dict[int, str] = field(default_factory=dict)

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

    def line_of(self, code: str) -> int | None:
        text = self.original.decode("utf-8", "replace")
        first = code.strip().splitlines()[0] if code.strip() else ""
        pos = text.find(first)
        return None if pos < 0 else text.count("\n", 0, pos) + 1


@dataclass
class OpContext:
    recipe_id: str
    variant: str
    index: int
    tree: "SglangTree"
    files: Any  # plan.FileSet
    options: dict


_QUAL_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$|^[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Target:
    """``module:Class.method``: a file of the sglang package and a definition inside it."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, text: Any, where: str) -> "Target":
        if not isinstance(text, str) or not _QUAL_RE.match(text):
            raise RecipeError(f"{where}: 'target' must look like 'sglang.srt.module:Class.method', got {text!r}.")
        module, _, qual = text.partition(":")
        if not module.startswith("sglang"):
            raise RecipeError(f"{where}: target module {module!r} must be inside the sglang package.")
        return cls(module, qual)

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}" if self.qualname else self.module


class Operation:
    """One AST-level rewrite. Subclasses declare their YAML keys and implement ``run``."""

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
                self.code[key] = CodeRef.parse(spec[key], base, recipe_file)
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
            raise self.drift(ctx, st, f"no definition {self.target.qualname!r} in this file",
                             self.nearest_definitions(ctx, st))
        return path

    def drift(self, ctx: OpContext, st: FileState | None, what: str, candidates=None) -> DriftError:
        file = st.relpath if st else self.target.module
        return DriftError(
            f"recipe '{ctx.recipe_id}' (variant {ctx.variant}), operation #{ctx.index + 1} "
            f"{self.kind} on {self.target} in {file}: {what}.",
            candidates=list(candidates or []),
            recipe=ctx.recipe_id, variant=ctx.variant, operation=ctx.index + 1, op=self.kind,
            file=file, target=str(self.target), anchor=self.anchor_text(),
        )

    def conflict(self, ctx: OpContext, st: FileState, other: str, what: str) -> ConflictError:
        return ConflictError(
            f"recipe '{ctx.recipe_id}' (variant {ctx.variant}), operation #{ctx.index + 1} "
            f"{self.kind} on {self.target} in {st.relpath}: {what} that recipe '{other}' "
            "already changed; two recipes may not touch the same node.",
            recipe=ctx.recipe_id, other=other, file=st.relpath, target=str(self.target),
        )

    def anchor_text(self) -> str:
        return self.target.qualname

    def nearest_definitions(self, ctx: OpContext, st: FileState) -> list[str]:
        names = cstutil.all_definitions(st.module)
        close = difflib.get_close_matches(self.target.qualname, names, n=4, cutoff=0.5)
        out = [f"{st.relpath}: {n}" for n in close]
        last = self.target.qualname.split(".")[-1]
        if last:
            out.extend(f"{hit} (same name, other file)" for hit in ctx.tree.find_definition_elsewhere(last, st.relpath))
        return out[:8]

    def nearest_statements(self, st: FileState, scope_node, text: str) -> list[str]:
        scored = []
        for stmt, _ in cstutil.iter_statements(scope_node, [scope_node]):
            code = st.code(stmt).strip()
            head = code.splitlines()[0] if code else ""
            ratio = difflib.SequenceMatcher(None, text.strip(), head).ratio()
            scored.append((ratio, head))
        scored.sort(key=lambda x: -x[0])
        out, seen = [], set()
        for ratio, head in scored:
            if head in seen or ratio < 0.3:
                continue
            seen.add(head)
            line = st.line_of(head)
            out.append(f"{st.relpath}:{line or '?'}: {head[:120]}")
            if len(out) == 4:
                break
        return out

    def same_code(self, st: FileState, nodes, ref_nodes, ref_module: cst.Module) -> bool:
        a = "\n".join(st.code(n) for n in nodes)
        b = "\n".join(ref_module.code_for_node(n) for n in ref_nodes)
        return normalized(a) == normalized(b)

    def run(self, ctx: OpContext) -> str:  # pragma: no cover - abstract
        raise NotImplementedError
