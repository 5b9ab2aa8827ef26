"""The support matrix: for every SGLang release, the expected status of every recipe.

``recipes/matrix.yaml`` is the committed expectation; ``actual`` computes reality on a
fetched release. A release on the index that the matrix does not list is reported by name.
``markdown`` renders the expectation as the README's support table
(``python -m spectool.matrix`` prints it).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from packaging.version import Version

from .errors import RecipeError
from .statuses import Status

EXPECTED = {"applies", "upstreamed", "unsupported"}
_FROM_PLAN = {
    Status.WOULD_APPLY: "applies",
    Status.ALREADY_APPLIED: "applies",
    Status.APPLIED: "applies",
    Status.UPSTREAMED: "upstreamed",
    Status.UNSUPPORTED: "unsupported",
    Status.BLOCKED: "unsupported",
}


def default_path() -> Path:
    from .recipe import default_recipes_dir

    return default_recipes_dir() / "matrix.yaml"


def load(path: Path | None = None) -> dict[str, dict[str, str]]:
    path = Path(path or default_path())
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    rel = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(rel, dict):
        raise RecipeError(f"{path}: expected a 'releases' mapping of version -> {{recipe: status}}.")
    for v, row in rel.items():
        if not isinstance(v, str):
            raise RecipeError(f"{path}: release {v!r} must be a quoted string.")
        bad = {k: s for k, s in row.items() if s not in EXPECTED}
        if bad:
            raise RecipeError(f"{path}: release {v}: statuses must be one of {sorted(EXPECTED)}, got {bad}.")
    return dict(sorted(rel.items(), key=lambda kv: Version(kv[0])))


def actual(tree_dir, recipes_dir=None) -> dict[str, tuple[str, str]]:
    """recipe id -> (matrix status or the raw failure, message) on this tree."""
    from . import api

    out = api.check(tree_dir, recipes_dir=recipes_dir)
    return {r.id: (_FROM_PLAN.get(r.status, r.status), r.message) for r in out.plan.results}


def missing_releases(matrix: dict, available: list[str], since: str = "0.5.6.post2") -> list[str]:
    return [v for v in available if Version(v) >= Version(since) and v not in matrix]


def _cell(status: str, recipe, version: str) -> str:
    """'applies (variant)' where a recipe's variant covers the release, else the bare status."""
    if status == "applies" and recipe is not None:
        variant = recipe.variant_for(Version(version))
        if variant is not None:
            return f"applies (`{variant.name}`)"
    return status


def markdown(rows: dict[str, dict[str, str]] | None = None, recipes: list | None = None) -> str:
    """The support matrix as a Markdown table: one column per recipe, and consecutive releases
    whose cells are equal share a row (``0.5.13 – 0.5.14``). ``recipes`` (default: the shipped
    ones) name the variant that applies; a recipe missing from them shows its bare status."""
    if rows is None:
        rows = load()
    if recipes is None:
        from .recipe import load_recipes

        recipes = load_recipes()
    by_id = {r.id: r for r in recipes}
    ids = sorted({rid for row in rows.values() for rid in row})
    groups: list[tuple[list[str], tuple[str, ...]]] = []
    for version, row in rows.items():
        cells = tuple(_cell(row[rid], by_id.get(rid), version) if rid in row else "-" for rid in ids)
        if groups and groups[-1][1] == cells:
            groups[-1][0].append(version)
        else:
            groups.append(([version], cells))
    lines = ["| SGLang | " + " | ".join(f"`{rid}`" for rid in ids) + " |", "|---" * (len(ids) + 1) + "|"]
    for versions, cells in groups:
        span = versions[0] if len(versions) == 1 else f"{versions[0]} – {versions[-1]}"
        lines.append(f"| {span} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(markdown(), end="")
