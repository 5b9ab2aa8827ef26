"""spectool.toml: the pinned SGLang release (version, file, sha256), recipe set and options."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BadInputError

PIN_FILE = "spectool.toml"


@dataclass
class Pin:
    path: Path
    version: str
    file: str | None
    sha256: str | None
    recipes: list[str] | None
    options: dict = field(default_factory=dict)
    hashes: dict[str, dict] = field(default_factory=dict)  # other known releases: version -> {file, sha256}

    def known(self, version: str) -> tuple[str | None, str | None]:
        if version == self.version:
            return self.file, self.sha256
        h = self.hashes.get(version, {})
        return h.get("file"), h.get("sha256")


def find_pin() -> Path | None:
    env = os.environ.get("SPECTOOL_PIN")
    if env:
        return Path(env)
    for d in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parent.parent]:
        if (d / PIN_FILE).is_file():
            return d / PIN_FILE
    return None


def load_pin(path: Path | None = None, required: bool = True) -> Pin | None:
    path = path or find_pin()
    if path is None:
        if required:
            raise BadInputError(f"no {PIN_FILE} found here or above; give a version explicitly.")
        return None
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInputError(f"{path}: cannot read the pin file: {exc}") from None
    sg = data.get("sglang")
    if not isinstance(sg, dict) or not isinstance(sg.get("version"), str):
        raise BadInputError(f"{path}: needs an [sglang] table with version = \"X.Y.Z\" (a string).")
    unknown = set(data) - {"sglang", "recipes", "options", "known"}
    if unknown:
        raise BadInputError(f"{path}: unknown table(s) {sorted(unknown)}; allowed: sglang, recipes, options, known.")
    recipes = data.get("recipes", {}).get("select")
    return Pin(Path(path), sg["version"], sg.get("file"), sg.get("sha256"), recipes,
               data.get("options", {}), data.get("known", {}))


def pinned_version_in(path: Path) -> str | None:
    """The SGLang version a changed file pins: spectool.toml's [sglang] version, or a
    requirements line ``sglang==X`` (extras allowed)."""
    import re

    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.name.endswith(".toml"):
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise BadInputError(f"{path}: not valid TOML: {exc}") from None
        v = data.get("sglang", {}).get("version")
        return v if isinstance(v, str) else None
    m = re.search(r"^\s*sglang(?:\[[^\]]*\])?\s*==\s*([0-9][^\s;#]*)", text, re.M)
    return m.group(1) if m else None
