"""Find the ``sglang`` package in a directory and read its version.

DIR may be a git checkout of SGLang (``DIR/python/sglang``), a folder holding the package
(site-packages, an unpacked wheel or sdist: ``DIR/sglang``), or the package itself. Every
spelling of one tree resolves to one canonical directory (the checkout, or the folder that
holds the package): its lockfile, saved originals and lock live there, whichever was typed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import SourceError

_VERSION_RE = re.compile(r"""^\s*(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:\w+\s*=\s*)?['"]([^'"]+)['"]""", re.M)
_TOPLEVEL_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)


class MissingModule(SourceError):
    """A module a recipe names is not in the tree (reported as drift, not bad input)."""


@dataclass
class SglangTree:
    dir: Path  # the canonical tree directory: lockfile, saved originals and lock live here
    root: Path  # the folder that holds the `sglang` package
    version: Version
    kind: str  # checkout | package

    def file_for(self, module: str) -> Path:
        rel = Path(*module.split("."))
        for cand in (self.root / rel.with_suffix(".py"), self.root / rel / "__init__.py"):
            if cand.exists() or cand.is_symlink():
                self.check_inside(cand)
                return cand
        raise MissingModule(f"module {module} not found under {self.root} (no {rel}.py).")

    def relpath(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def check_inside(self, path: Path) -> None:
        real = Path(os.path.realpath(path))
        base = Path(os.path.realpath(self.root))
        if base not in real.parents and real != base:
            raise SourceError(
                f"{path} is a symlink that leads out of {self.dir} (to {real}); spectool refuses "
                "to write outside the tree it was given."
            )

    def sources_mentioning(self, needle: str, skip: str | None = None):
        """(relative path, bytes) of every readable .py file under sglang/ but `skip` whose
        text holds `needle`, in path order: the cheap filter before a pattern or a parse,
        when looking for where a definition went."""
        raw = needle.encode()
        for path in sorted((self.root / "sglang").rglob("*.py")):
            rel = self.relpath(path)
            if rel == skip:
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if raw in data:
                yield rel, data

    def find_definition_elsewhere(self, name: str, skip: str) -> list[str]:
        """'path:line: def name' in other files: where a moved (or de-underscored) function went."""
        core = name.lstrip("_")
        pat = re.compile(rb"^[ \t]*(?:async\s+def|def|class)\s+_*" + re.escape(core.encode()) + rb"\b", re.M)
        hits = []
        for rel, data in self.sources_mentioning(core, skip):
            m = pat.search(data)
            if m:
                line = data.count(b"\n", 0, m.start()) + 1
                hits.append(f"{rel}:{line}: {m.group(0).decode(errors='replace').strip()}")
                if len(hits) == 4:
                    break
        return hits


def _read_version(pkg: Path) -> str | None:
    """Most authoritative first: package metadata, the generated _version.py, a static
    pyproject version, git tags (a checkout), and a module-level literal in version.py."""
    parent = pkg.parent
    for meta in sorted(parent.glob("sglang-*.dist-info/METADATA")) + [parent / "PKG-INFO"]:
        if meta.is_file():
            m = re.search(r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8", errors="replace"), re.M)
            if m:
                return m.group(1)
    f = pkg / "_version.py"
    if f.is_file():
        m = _VERSION_RE.search(f.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1)
    pyproject = parent / "pyproject.toml"
    if pyproject.is_file():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.M)
        if m:
            return m.group(1)
    if (parent.parent / ".git").exists():
        import subprocess

        r = subprocess.run(
            ["git", "-C", str(parent.parent), "describe", "--tags", "--abbrev=0"], capture_output=True, text=True
        )
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().lstrip("v")
    f = pkg / "version.py"
    if f.is_file():
        m = _TOPLEVEL_RE.search(f.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1)
    return None


def _canonical(root: Path) -> tuple[Path, str]:
    """The tree directory for the folder that holds the package: the checkout's top when
    that folder is a checkout's ``python/``, else the folder itself."""
    if root.name == "python":
        return root.parent, "checkout"
    return root, "package"


def locate(directory: str | Path, version: str | None = None) -> SglangTree:
    """The SGLang tree in directory, with its version (``version`` overrides detection)."""
    d = Path(directory)
    if not d.is_dir():
        raise SourceError(f"--sglang-dir {d} is not a directory.")
    d = d.resolve()
    for root, kind in ((d / "python", "checkout"), (d, "package"), (d.parent, "package")):  # noqa: B007
        pkg = root / "sglang"
        if (pkg / "srt").is_dir() and (pkg / "__init__.py").is_file():
            break
    else:
        raise SourceError(
            f"{d} does not hold SGLang: expected python/sglang/ (a git checkout), sglang/ (a "
            "site-packages or unpacked wheel) or the sglang package itself, each with srt/."
        )
    tree_dir, kind = (d, "checkout") if kind == "checkout" else _canonical(root)
    _refuse_misplaced_state(tree_dir, root)
    text = version or _read_version(pkg)
    if text is None:
        raise SourceError(
            f"cannot tell the SGLang version of {pkg}: no _version.py, version.py, dist-info "
            "or pyproject.toml with a version. Pass --sglang-version."
        )
    try:
        v = Version(text)
    except InvalidVersion:
        raise SourceError(f"SGLang version {text!r} read from {pkg} is not a PEP 440 version.") from None
    return SglangTree(tree_dir, root, v, kind)


def _refuse_misplaced_state(tree_dir: Path, root: Path) -> None:
    """spectool state beside another spelling of the tree (inside the package, or in a
    checkout's python/) would split the tree's record in two: refuse, say how to join it."""
    for other in (root / "sglang", root):
        if other == tree_dir:
            continue
        found = [n for n in ("spectool.lock", ".spectool") if os.path.lexists(other / n)]
        if found:
            raise SourceError(
                f"found spectool state ({', '.join(found)}) in {other}, but this tree's state lives in {tree_dir}. "
                f"Move {' and '.join(str(other / n) for n in found)} into {tree_dir} (paths inside are relative "
                "to the package, so they stay valid), then run the command again."
            )
