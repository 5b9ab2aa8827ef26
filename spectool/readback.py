"""The read-back of the last apply, kept in the tree so `check` need not parse an unchanged one.

After writing, apply reads every file back and plans the recipes again: each must now be in
place. That plan depends only on its inputs: spectool's own code, the SGLang version, each
recipe's id, content hash and options, and the bytes of every file the plan read.
``.spectool/readback.json`` records those inputs (file bytes by sha256) beside the plan's
per-recipe results. `check` hashes the same files; when every input is unchanged it reports
the recorded results instead of parsing, planning and validating again, and any difference (a
file edited by hand or replaced, a changed recipe, other recipes or options, another spectool)
sends it through the full plan.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from . import __version__
from .lockfile import is_package_file
from .statuses import Status

READBACK = ".spectool/readback.json"
SCHEMA = 1


@lru_cache(maxsize=1)
def _engine() -> str:
    """A fingerprint of the code that plans (the core and its operations, not the harness), so
    a read-back recorded by other spectool code is never trusted."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256(__version__.encode())
    for f in sorted([*here.glob("*.py"), *(here / "ops").glob("*.py")]):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _key(tree, recipes, options) -> dict:
    options = options or {}
    return {
        "engine": _engine(),
        "sglang_version": str(tree.version),
        "recipes": [[r.id, r.content_hash, options.get(r.id, {})] for r in recipes],
    }


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def record(tree, recipes, options, plan) -> bytes | None:
    """The read-back file for `plan`, a plan of the tree as it is on disk (no overrides) in
    which every recipe is in place; None when it is not such a plan."""
    if plan.changes or not all(r.status in (Status.ALREADY_APPLIED, Status.UPSTREAMED) for r in plan.results):
        return None
    data = {
        "schema": SCHEMA,
        "key": _key(tree, recipes, options),
        "inputs": plan.inputs,
        "results": [r.to_json() for r in plan.results],
    }
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def recall(tree, recipes, options):
    """The recorded plan of this tree, recipes and options when none of its inputs changed
    since apply read them back; else None."""
    from .plan import Plan, RecipeResult

    path = Path(tree.dir) / READBACK
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    # JSON turns the options' tuples into lists: compare like with like.
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or data.get("key") != json.loads(json.dumps(_key(tree, recipes, options)))
    ):
        return None
    inputs = data.get("inputs") or {}
    # A damaged or foreign record is only a missed shortcut: plan instead.
    if not isinstance(inputs, dict) or not all(is_package_file(rel) for rel in inputs):
        return None
    if any(_sha256(tree.root / rel) != digest for rel, digest in inputs.items()):
        return None
    try:
        results = [
            RecipeResult(r["id"], Status(r["status"]), r["variant"], r["message"], None, r["operations"], r["files"])
            for r in data["results"]
        ]
    except (KeyError, TypeError, ValueError):
        return None
    if [r.id for r in results] != [r.id for r in recipes]:
        return None
    return Plan(tree, recipes, results, [], options or {}, inputs=dict(inputs))
