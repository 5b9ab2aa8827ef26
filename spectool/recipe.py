"""Recipe files: a strict YAML schema, loaded into Recipe / Variant / Operation objects.

Every schema error names the file, the key and what was expected. Versions must be strings
(YAML would read ``0.5.10`` as the float 0.51), ranges are PEP 440 specifiers, and no SGLang
version may fall in two variants. Recipes are untrusted input: the YAML loader bounds size,
nesting and alias expansion, and code files must stay inside the recipe's folder.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from .errors import RecipeError
from .ops import OPERATIONS, Operation, Target

RECIPE_KEYS = {"id": str, "summary": str, "requires": list, "options": dict, "variants": list, "description": str}
VARIANT_KEYS = {"name": str, "versions": str, "operations": list, "upstreamed": dict, "unsupported": str, "notes": str}
UPSTREAMED_KEYS = {"note": str, "probe": str, "anchor": str}
OPTION_KEYS = {"default": object, "help": str}
LIST_ITEMS = {"requires": str, "imports": str}  # list-valued keys and the type of their items
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
GENERATOR_OPS = ("insert_before", "insert_after", "replace_expr", "wrap_expr")  # code goes into a function

# Limits on a recipe file: far above any real recipe, far below what hurts.
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000  # YAML nodes after expanding every alias


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate and unhashable keys (a silent override is a bug in a
    recipe), nesting deeper than MAX_DEPTH, recursive aliases, and documents that expand to
    more than MAX_NODES nodes (an alias bomb is a few hundred bytes)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise RecipeError(f"nested deeper than {MAX_DEPTH} levels at line {mark.line + 1}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node, {}, MAX_NODES)
        return node


def _expanded_size(node, memo: dict, limit: int) -> int:
    """Nodes in the document with every alias expanded (memoized on the node graph, so the
    count itself stays cheap); RecipeError above `limit` or on a recursive alias."""
    key = id(node)
    if key in memo:
        if memo[key] is None:
            raise RecipeError(f"an alias at line {node.start_mark.line + 1} refers to itself (recursive alias)")
        return memo[key]
    memo[key] = None
    if isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_size(c, memo, limit) for c in node.value)
    elif isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_size(k, memo, limit) + _expanded_size(v, memo, limit) for k, v in node.value)
    else:
        n = 1
    if n > limit:
        raise RecipeError(
            f"expands to more than {limit} YAML nodes once its aliases are resolved "
            f"(at line {node.start_mark.line + 1}); a recipe needs far fewer"
        )
    memo[key] = n
    return n


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise RecipeError(
                f"a key at line {key_node.start_mark.line + 1} is a {type(key).__name__}; keys must be plain words"
            ) from None
        if key in seen:
            raise RecipeError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _is(value: Any, typ: type) -> bool:
    """isinstance, except that a bool is not an int (YAML reads 'yes' and 'true' as bools)."""
    if typ is object:
        return True
    if typ in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, typ)


def _check_keys(data: Any, allowed: dict, required: set, where: str) -> None:
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping with keys {sorted(allowed)}, got {type(data).__name__}.")
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise RecipeError(
            f"{where}: key {_short(odd[0])} is a {type(odd[0]).__name__}; allowed keys: {sorted(allowed)}."
        )
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}.")
    missing = sorted(required - set(data))
    if missing:
        raise RecipeError(f"{where}: missing required key(s) {missing}.")
    for key, typ in allowed.items():
        if key in data and not _is(data[key], typ):
            got = type(data[key]).__name__
            hint = (
                " (quote version strings: YAML reads 0.5.10 as a number)"
                if typ is str and got in ("float", "int")
                else ""
            )
            raise RecipeError(f"{where}: key {key!r} must be {typ.__name__}, got {got} {_short(data[key])}{hint}.")
        item = LIST_ITEMS.get(key)
        if key in data and item is not None:
            bad = [x for x in data[key] if not _is(x, item)]
            if bad:
                raise RecipeError(
                    f"{where}: key {key!r} must be a list of {item.__name__}, but holds "
                    f"{type(bad[0]).__name__} {_short(bad[0])}."
                )


@dataclass
class Upstreamed:
    """The feature exists upstream: `probe` (a definition) and optionally `anchor` (a statement
    pattern inside it) must be found, or the upstream code moved and that is drift too."""

    note: str
    probe: Target | None
    anchor: str | None = None


@dataclass
class Variant:
    name: str
    versions: SpecifierSet
    operations: list[Operation]
    upstreamed: Upstreamed | None = None
    unsupported: str | None = None
    notes: str = ""

    def covers(self, version: Version) -> bool:
        return self.versions.contains(version, prereleases=True)


@dataclass
class Recipe:
    id: str
    summary: str
    path: Path
    variants: list[Variant]
    requires: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    content_hash: str = ""

    def variant_for(self, version: Version) -> Variant | None:
        hits = [v for v in self.variants if v.covers(version)]
        return hits[0] if hits else None


def _hash_dir(path: Path, where: str) -> str:
    h = hashlib.sha256()
    try:
        for f in sorted(path.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(path)).encode())
                h.update(f.read_bytes())
    except OSError as exc:
        raise RecipeError(f"{where}: cannot read {exc.filename} in the recipe's folder: {exc.strerror}.") from None
    return h.hexdigest()[:16]


def _read_yaml(path: Path, where: str) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"{where}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise RecipeError(f"{where}: larger than {MAX_BYTES // 1024} KiB; a recipe is a short YAML file.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the recipe as UTF-8."
        ) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except RecipeError as exc:
        raise RecipeError(f"{where}: {exc.message}.") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{where}: not valid YAML: {exc}".replace("\n", " ")) from None
    except RecursionError:
        raise RecipeError(f"{where}: nested too deeply to read.") from None


def _probe_versions(variants: list[Variant]) -> list[Version]:
    """Versions where two variants could meet: every version a specifier names, and its
    neighbours (the next and previous release at each level, a post release, one more level)."""
    out = {Version("0"), Version("99999")}
    for v in variants:
        for spec in v.versions:
            try:
                base = Version(spec.version.removesuffix(".*"))
            except ValueError:
                continue
            out.add(base)
            rel = list(base.release) + [0] * (3 - len(base.release))
            for i in range(3):
                for step in (1, -1):
                    r = rel[:i] + [rel[i] + step] + [0] * (len(rel) - i - 1)
                    if r[i] >= 0:
                        out.add(Version(".".join(map(str, r))))
            out.add(Version(".".join(map(str, rel + [1]))))
            out.add(Version(f"{'.'.join(map(str, base.release))}.post{(base.post or 0) + 1}"))
    return sorted(out)


def _refuse_overlaps(variants: list[Variant], where: str) -> None:
    names = [v.name for v in variants]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RecipeError(f"{where}: variant name(s) {dup} are used twice; each variant needs its own name.")
    for version in _probe_versions(variants):
        hits = [v for v in variants if v.covers(version)]
        if len(hits) > 1:
            raise RecipeError(
                f"{where}: variants {hits[0].name!r} ({hits[0].versions}) and {hits[1].name!r} "
                f"({hits[1].versions}) both cover SGLang {version}; the version ranges of a recipe's variants "
                "must not overlap (which one applies would be a matter of order)."
            )


def _refuse_generators(op: Operation, owhere: str) -> None:
    """Code inserted into a function body must not contain `yield`: it would turn the
    function into a generator, which compiles and passes every name check."""
    if op.kind not in GENERATOR_OPS or "code" not in op.code:
        return
    ref = op.code["code"]
    if op.kind in ("replace_expr", "wrap_expr"):
        nodes = [ref.returned_expression()[0]]
    else:
        nodes = ref.body_statements()
    finder = _YieldFinder()
    for n in nodes:
        n.visit(finder)
    if finder.found:
        raise RecipeError(
            f"{owhere}: code {ref} contains 'yield'; inserted into {op.target} it would turn that function into "
            "a generator. Move the loop into a helper function (add_method) and call it."
        )


class _YieldFinder(cst.CSTVisitor):
    found = False

    def visit_Yield(self, node) -> bool:
        self.found = True
        return False

    def visit_FunctionDef(self, node) -> bool:  # a nested def's yield is its own
        return False

    def visit_Lambda(self, node) -> bool:
        return False

    def visit_ClassDef(self, node) -> bool:
        return False


def load_recipe(path: Path) -> Recipe:
    """Load and validate one recipe.yaml (its code files are parsed now, not at apply time)."""
    path = Path(path)
    where = str(path)
    data = _read_yaml(path, where)
    _check_keys(data, RECIPE_KEYS, {"id", "summary", "variants"}, where)
    if not ID_RE.match(data["id"]):
        raise RecipeError(
            f"{where}: key 'id' {_short(data['id'])} must be letters, digits, '.', '_' or '-' (e.g. 'spec-fallback')."
        )
    options = {}
    for name, spec in (data.get("options") or {}).items():
        if not isinstance(name, str) or not name.isidentifier():
            raise RecipeError(f"{where}: options: option name {_short(name)} must be an identifier (e.g. 'threshold').")
        _check_keys(spec, OPTION_KEYS, {"default"}, f"{where}: options.{name}")
        options[name] = spec["default"]
    if not data["variants"]:
        raise RecipeError(f"{where}: key 'variants' is empty; a recipe needs at least one variant.")
    variants = []
    for i, vdata in enumerate(data["variants"]):
        vwhere = f"{where}: variants[{i}]"
        _check_keys(vdata, VARIANT_KEYS, {"name", "versions"}, vwhere)
        if not vdata["versions"].strip():
            raise RecipeError(f"{vwhere}: key 'versions' is empty; give a PEP 440 range such as '>=0.5.12,<0.5.13'.")
        try:
            spec = SpecifierSet(vdata["versions"])
        except InvalidSpecifier:
            raise RecipeError(
                f"{vwhere}: 'versions' {_short(vdata['versions'])} is not a PEP 440 specifier set "
                "(e.g. '>=0.5.12,<0.5.13')."
            ) from None
        ops = []
        for j, odata in enumerate(vdata.get("operations") or []):
            owhere = f"{vwhere}.operations[{j}]"
            if not isinstance(odata, dict) or "op" not in odata:
                raise RecipeError(f"{owhere}: each operation needs 'op', one of {sorted(OPERATIONS)}.")
            kind = odata["op"]
            cls = OPERATIONS.get(kind) if isinstance(kind, str) else None
            if cls is None:
                raise RecipeError(f"{owhere}: unknown op {_short(kind)}; known: {sorted(OPERATIONS)}.")
            body = {k: v for k, v in odata.items() if k != "op"}
            _check_keys(body, {**cls.required, **cls.optional}, set(cls.required), f"{owhere} ({kind})")
            if "count" in body and body["count"] < 1:
                raise RecipeError(
                    f"{owhere}: key 'count' is {body['count']}; it must be at least 1 (the anchor's matches)."
                )
            if "when" in body and body["when"] not in options:
                raise RecipeError(f"{owhere}: 'when' names option {body['when']!r}, which the recipe does not declare.")
            op = cls(body, path.parent, path, owhere)
            _refuse_generators(op, owhere)
            ops.append(op)
        up = None
        if "upstreamed" in vdata:
            _check_keys(vdata["upstreamed"], UPSTREAMED_KEYS, {"note"}, f"{vwhere}.upstreamed")
            probe = vdata["upstreamed"].get("probe")
            up = Upstreamed(
                vdata["upstreamed"]["note"],
                Target.parse(probe, f"{vwhere}.upstreamed.probe") if probe else None,
                vdata["upstreamed"].get("anchor"),
            )
            if up.anchor is not None:
                from .patterns import Pattern

                try:
                    Pattern.parse(up.anchor, expression=False)
                except SyntaxError as exc:
                    raise RecipeError(f"{vwhere}.upstreamed.anchor is not a statement pattern: {exc}.") from None
        if not ops and up is None and "unsupported" not in vdata:
            raise RecipeError(f"{vwhere}: a variant needs 'operations', 'upstreamed' or 'unsupported'.")
        variants.append(Variant(vdata["name"], spec, ops, up, vdata.get("unsupported"), vdata.get("notes", "")))
    _refuse_overlaps(variants, where)
    requires = data.get("requires") or []
    return Recipe(data["id"], data["summary"], path, variants, list(requires), options, _hash_dir(path.parent, where))


def default_recipes_dir() -> Path:
    """The recipes shipped with spectool (repo checkout or installed package data)."""
    import sys

    here = Path(__file__).resolve().parent
    for cand in (here.parent / "recipes", Path(sys.prefix) / "share" / "spectool" / "recipes"):
        if cand.is_dir():
            return cand
    raise RecipeError("no recipes directory found next to spectool; pass --recipes-dir.")


def load_recipes(directory: Path | None = None, select: list[str] | None = None) -> list[Recipe]:
    """All recipes under directory (each in its own folder), ordered so requirements come first."""
    directory = Path(directory) if directory else default_recipes_dir()
    if not directory.is_dir():
        raise RecipeError(f"recipes directory {directory} does not exist.")
    recipes = {}
    files = (
        [directory / "recipe.yaml"]
        if (directory / "recipe.yaml").is_file()
        else sorted(directory.glob("*/recipe.yaml"))
    )
    if not files:
        raise RecipeError(f"no recipes in {directory}: expected DIR/recipe.yaml or DIR/*/recipe.yaml.")
    for f in files:
        r = load_recipe(f)
        if r.id in recipes:
            raise RecipeError(f"{f}: recipe id {r.id!r} is also used by {recipes[r.id].path}.")
        recipes[r.id] = r
    if select:
        unknown = [s for s in select if s not in recipes]
        if unknown:
            raise RecipeError(f"unknown recipe id(s) {unknown}; available: {sorted(recipes)}.")
        wanted = set()
        stack = list(select)
        while stack:  # a selected recipe pulls in what it requires
            rid = stack.pop()
            if rid not in wanted:
                wanted.add(rid)
                stack.extend(recipes[rid].requires)
        recipes = {k: v for k, v in recipes.items() if k in wanted}
    for r in recipes.values():
        for req in r.requires:
            if req not in recipes:
                raise RecipeError(f"{r.path}: requires {req!r}, which is not in {directory}.")
    order, state = [], {}

    def visit(rid, chain):
        if state.get(rid) == 1:
            raise RecipeError(f"recipe requirements form a cycle: {' -> '.join(chain + [rid])}.")
        if state.get(rid) == 2:
            return
        state[rid] = 1
        for req in recipes[rid].requires:
            visit(req, chain + [rid])
        state[rid] = 2
        order.append(recipes[rid])

    for rid in sorted(recipes):
        visit(rid, [])
    return order
