"""The support matrix: for every SGLang release, the expected status of every recipe.

``recipes/matrix.yaml`` is the committed expectation; ``check_release`` computes reality on a
fetched release. A release on the index that the matrix does not list is reported by name.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from packaging.version import Version

from .errors import RecipeError

EXPECTED = {"applies", "upstreamed", "unsupported"}
_FROM_PLAN = {"would-apply": "applies", "already-applied": "applies", "applied": "applies",
              "upstreamed": "upstreamed", "unsupported": "unsupported", "blocked": "unsupported"}


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
