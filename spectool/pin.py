"""spectool.toml: the pinned SGLang release (version, file, sha256), recipe set and options."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BadInputError

if TYPE_CHECKING:  # pragma: no cover
    from packaging.specifiers import SpecifierSet

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


def load_pin(path: Path | None = None, required: bool = True, hint: str = "") -> Pin | None:
    """The pin file (spectool.toml here, above, or $SPECTOOL_PIN). With none and `required`,
    a BadInputError whose message ends with `hint` (what the command takes instead)."""
    path = path or find_pin()
    if path is None:
        if required:
            raise BadInputError(f"no {PIN_FILE} found here or above{hint}.")
        return None
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInputError(f"{path}: cannot read the pin file: {exc}") from None
    sg = data.get("sglang")
    if not isinstance(sg, dict) or not isinstance(sg.get("version"), str):
        raise BadInputError(f'{path}: needs an [sglang] table with version = "X.Y.Z" (a string).')
    unknown = set(data) - {"sglang", "recipes", "options", "known"}
    if unknown:
        raise BadInputError(f"{path}: unknown table(s) {sorted(unknown)}; allowed: sglang, recipes, options, known.")
    recipes = data.get("recipes", {}).get("select")
    return Pin(
        Path(path),
        sg["version"],
        sg.get("file"),
        sg.get("sha256"),
        recipes,
        data.get("options", {}),
        data.get("known", {}),
    )


@dataclass
class Requirement:
    """What a changed file says about SGLang: the requirement as written, and the release
    it pins (``exact``) or the range it allows (``specifier``)."""

    file: Path
    text: str
    exact: str | None
    specifier: SpecifierSet | None = None


def _toml_requirement(path: Path, text: str) -> Requirement | None:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{path}: not valid TOML: {exc}") from None
    v = data.get("sglang", {}).get("version") if isinstance(data.get("sglang"), dict) else None
    return Requirement(path, f'[sglang] version = "{v}"', v) if isinstance(v, str) else None


def _requirements_lines(text: str):
    """The logical lines of a requirements file: continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line and not line.startswith("-"):
            yield line


def requirement_in(path: Path, text: str | None = None) -> Requirement | None:
    """The SGLang requirement of spectool.toml (its [sglang] version) or of a requirements
    file: the name matched as PEP 503 normalises it (``SGLang``, ``sglang[all]``), with
    environment markers and ``--hash`` options allowed. None when the file names no SGLang."""
    from packaging.requirements import InvalidRequirement
    from packaging.requirements import Requirement as Req
    from packaging.utils import canonicalize_name

    if text is None:
        if not path.is_file():
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
    if path.name.endswith(".toml"):
        return _toml_requirement(path, text)
    for line in _requirements_lines(text):
        try:
            req = Req(re.split(r"\s+--", line)[0])  # options such as --hash follow the requirement
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "sglang":
            continue
        pins = [s for s in req.specifier if s.operator in ("==", "===") and not s.version.endswith(".*")]
        exact = pins[0].version if len(pins) == 1 and len(req.specifier) == 1 else None
        return Requirement(path, line, exact, req.specifier)
    return None


def pinned_version_in(path: Path) -> str | None:
    """The SGLang release a changed file pins exactly (None: no SGLang, or a range)."""
    req = requirement_in(path)
    return req.exact if req else None


def lowest_allowed(req: Requirement, available: Callable[[], list[str]]) -> str:
    """The release a range requirement is checked at: the lowest of `available()` (the
    releases on the index, asked only once the requirement has a lower bound) that it allows.
    A requirement with no lower bound (``sglang``, ``sglang<0.6``) is refused: it names no
    release to check."""
    spec = req.specifier
    if spec is None or not any(s.operator in (">=", ">", "~=", "==", "===") for s in spec):
        raise BadInputError(
            f"{req.file}: {req.text!r} does not pin SGLang to a release, so the gate cannot tell which one to "
            "check. Pin it (sglang==X), or give a lower bound (sglang>=X,<Y: checked at its lowest allowed release)."
        )
    from packaging.version import Version

    allowed = [v for v in available() if spec.contains(Version(v), prereleases=False)]
    if not allowed:
        raise BadInputError(f"{req.file}: {req.text!r} allows no SGLang release on the package index.")
    return allowed[0]


def previous_pin(path: Path) -> str | None:
    """The SGLang release the file pinned in the last commit (``git show HEAD:FILE``); None
    outside git, for a new file, or when it pinned none."""
    import subprocess

    try:
        r = subprocess.run(
            ["git", "show", f"HEAD:./{path.as_posix()}"]
            if not path.is_absolute()
            else ["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    try:
        req = requirement_in(path, r.stdout.decode("utf-8", "replace"))
    except BadInputError:
        return None
    if req is None:
        return None
    if req.exact:
        return req.exact
    lower = [s.version for s in (req.specifier or []) if s.operator in (">=", "~=")]
    return lower[0] if lower else None


def applied_version(start: Path | None = None) -> str | None:
    """The SGLang release of a spectool.lock here or in ./build/* (where `spectool apply`
    puts the pinned tree), when they all agree on one."""
    import json

    start = start or Path.cwd()
    found = set()
    for lock in [start / "spectool.lock", *sorted(start.glob("build/*/spectool.lock"))]:
        try:
            found.add(json.loads(lock.read_text(encoding="utf-8"))["sglang_version"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found.pop() if len(found) == 1 else None
