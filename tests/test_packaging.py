"""Every recipe file is shipped as package data (pyproject's data-files table)."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_recipe_file_is_packaged():
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = set()
    for patterns in table.values():
        for pat in patterns:
            shipped.update(p.relative_to(REPO).as_posix() for p in REPO.glob(pat))
    files = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "recipes").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert files <= shipped, f"add to [tool.setuptools.data-files]: {sorted(files - shipped)}"
