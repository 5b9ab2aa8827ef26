"""Recipe files: a strict YAML schema, loaded into Recipe / Variant / Operation objects.

Every schema error names the file, the key and what was expected. Versions must be strings
(YAML would read ``0.5.10`` as the float 0.51), ranges are PEP 440 specifiers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from .errors import RecipeError
from .ops import OPERATIONS, Operation, Target

RECIPE_KEYS = {"id": str, "summary": str, "requires": list, "options": dict, "variants": list, "description": str}
VARIANT_KEYS = {"name": str, "versions": str, "operations": list, "upstreamed": dict, "unsupported": str, "notes": str}
UPSTREAMED_KEYS = {"note": str, "probe": str, "anchor": str}
OPTION_KEYS = {"default": object, "help": str}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a silent override is a bug in a recipe)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise RecipeError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _check_keys(data: Any, allowed: dict, required: set, where: str) -> None:
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping with keys {sorted(allowed)}, got {type(data).__name__}.")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}.")
    missing = sorted(required - set(data))
    if missing:
        raise RecipeError(f"{where}: missing required key(s) {missing}.")
    for key, typ in allowed.items():
        if key in data and typ is not object and not isinstance(data[key], typ):
            got = type(data[key]).__name__
            hint = " (quote version strings: YAML reads 0.5.10 as a number)" if typ is str and got in ("float", "int") else ""
            raise RecipeError(f"{where}: key {key!r} must be {typ.__name__}, got {got} {data[key]!r}{hint}.")


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


def _hash_dir(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(path)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def load_recipe(path: Path) -> Recipe:
    """Load and validate one recipe.yaml (its code files are parsed now, not at apply time)."""
    path = Path(path)
    where = str(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except RecipeError as exc:
        raise RecipeError(f"{where}: {exc.message}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{where}: not valid YAML: {exc}".replace("\n", " ")) from None
    except OSError as exc:
        raise RecipeError(f"{where}: cannot read: {exc.strerror}") from None
    _check_keys(data, RECIPE_KEYS, {"id", "summary", "variants"}, where)
    options = {}
    for name, spec in (data.get("options") or {}).items():
        _check_keys(spec, OPTION_KEYS, {"default"}, f"{where}: options.{name}")
        options[name] = spec["default"]
    variants = []
    for i, vdata in enumerate(data["variants"]):
        vwhere = f"{where}: variants[{i}]"
        _check_keys(vdata, VARIANT_KEYS, {"name", "versions"}, vwhere)
        try:
            spec = SpecifierSet(vdata["versions"])
        except InvalidSpecifier:
            raise RecipeError(f"{vwhere}: 'versions' {vdata['versions']!r} is not a PEP 440 specifier set (e.g. '>=0.5.12,<0.5.13').") from None
        ops = []
        for j, odata in enumerate(vdata.get("operations") or []):
            owhere = f"{vwhere}.operations[{j}]"
            if not isinstance(odata, dict) or "op" not in odata:
                raise RecipeError(f"{owhere}: each operation needs 'op', one of {sorted(OPERATIONS)}.")
            kind = odata["op"]
            cls = OPERATIONS.get(kind)
            if cls is None:
                raise RecipeError(f"{owhere}: unknown op {kind!r}; known: {sorted(OPERATIONS)}.")
            body = {k: v for k, v in odata.items() if k != "op"}
            _check_keys(body, {**cls.required, **cls.optional}, set(cls.required), f"{owhere} ({kind})")
            if "when" in body and body["when"] not in options:
                raise RecipeError(f"{owhere}: 'when' names option {body['when']!r}, which the recipe does not declare.")
            ops.append(cls(body, path.parent, path, owhere))
        up = None
        if "upstreamed" in vdata:
            _check_keys(vdata["upstreamed"], UPSTREAMED_KEYS, {"note"}, f"{vwhere}.upstreamed")
            probe = vdata["upstreamed"].get("probe")
            up = Upstreamed(vdata["upstreamed"]["note"], Target.parse(probe, f"{vwhere}.upstreamed.probe") if probe else None,
                            vdata["upstreamed"].get("anchor"))
            if up.anchor is not None:
                from .patterns import Pattern

                try:
                    Pattern.parse(up.anchor, expression=False)
                except SyntaxError as exc:
                    raise RecipeError(f"{vwhere}.upstreamed.anchor is not a statement pattern: {exc}.") from None
        if not ops and up is None and "unsupported" not in vdata:
            raise RecipeError(f"{vwhere}: a variant needs 'operations', 'upstreamed' or 'unsupported'.")
        variants.append(Variant(vdata["name"], spec, ops, up, vdata.get("unsupported"), vdata.get("notes", "")))
    requires = data.get("requires") or []
    return Recipe(data["id"], data["summary"], path, variants, list(requires), options, _hash_dir(path.parent))


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
    files = [directory / "recipe.yaml"] if (directory / "recipe.yaml").is_file() else sorted(directory.glob("*/recipe.yaml"))
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
