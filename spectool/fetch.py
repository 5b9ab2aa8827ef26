"""Download a pinned SGLang release from the package index, check its hash, unpack it.

Uses the index's JSON simple API (PEP 691) and nothing else: no pip, no dependencies.
From 0.5.12 SGLang ships only platform wheels; the Python sources are the same in each, so
the choice is deterministic: the pinned file, else the sdist, else a pure wheel, else the
CPython 3.12 manylinux x86_64 wheel.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tarfile
import urllib.request
import zipfile
from pathlib import Path

from .errors import FetchError
from .pin import load_pin

DEFAULT_INDEX = "https://pypi.org/simple"


def cache_dir() -> Path:
    d = Path(os.environ.get("SPECTOOL_CACHE", Path.home() / ".cache" / "spectool"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _index_url() -> str:
    return os.environ.get("SPECTOOL_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def list_files(project: str = "sglang") -> list[dict]:
    """Every file of the project on the index: filename, url, sha256."""
    url = f"{_index_url()}/{project}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data = json.load(r)
    except (OSError, ValueError) as exc:
        raise FetchError(
            f"cannot read the package index at {url}: {exc}. Set SPECTOOL_INDEX_URL to a mirror."
        ) from None
    return [
        {"filename": f["filename"], "url": f["url"], "sha256": f.get("hashes", {}).get("sha256")}
        for f in data.get("files", [])
        if not f.get("yanked")
    ]


def releases(project: str = "sglang") -> list[str]:
    from packaging.version import InvalidVersion, Version

    out = set()
    for f in list_files(project):
        m = re.match(rf"{project}-([^-]+?)(?:\.tar\.gz|-py|-cp)", f["filename"])
        if m:
            try:
                out.add(str(Version(m.group(1))))
            except InvalidVersion:
                pass
    return sorted(out, key=Version)


def _choose(files: list[dict], version: str, pinned_file: str | None) -> dict:
    mine = [
        f
        for f in files
        if f["filename"].startswith(f"sglang-{version}-") or f["filename"] == f"sglang-{version}.tar.gz"
    ]
    if pinned_file:
        for f in mine:
            if f["filename"] == pinned_file:
                return f
        raise FetchError(f"the pinned file {pinned_file} is not on the index for SGLang {version}.")
    if not mine:
        raise FetchError(f"SGLang {version} is not on the package index ({_index_url()}/sglang/).")
    prefs = [r"\.tar\.gz$", r"-py3-none-any\.whl$", r"-cp312-cp312-manylinux[^-]*_x86_64\.whl$", r"\.whl$"]
    for p in prefs:
        for f in mine:
            if re.search(p, f["filename"]):
                return f
    return mine[0]


def fetch(version: str | None = None, *, dest=None, progress: bool = True) -> Path:
    """Path of the unpacked release (a folder holding the sglang package)."""
    pin = load_pin(required=version is None, hint="; name the release (spectool fetch VERSION)")
    if version is None:
        version = pin.version
    pinned_file, pinned_sha = pin.known(version) if pin else (None, None)
    root = cache_dir() / f"sglang-{version}"
    done = root / ".spectool-fetched"
    if done.exists() and pinned_sha:
        cached = json.loads(done.read_text())
        if cached.get("sha256") != pinned_sha:
            raise FetchError(
                f"the cached SGLang {version} in {root} came from {cached.get('file')} with sha256 "
                f"{cached.get('sha256')}, but the pin file says {pinned_sha}. Delete {root} to fetch again."
            )
    if not done.exists():
        with _cache_lock(root):  # another spectool (or test worker) may be fetching it too
            if not done.exists():
                _fetch_into_cache(version, pinned_file, pinned_sha, root, done, progress)
    if dest:
        dest = Path(dest)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(root, dest, symlinks=True, ignore=shutil.ignore_patterns(".spectool-fetched"))
        return dest
    return root


@contextlib.contextmanager
def _cache_lock(root: Path):
    """An exclusive lock on one release's cache entry, so that concurrent fetches of the same
    release download and unpack it once."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fetch_into_cache(version, pinned_file, pinned_sha, root: Path, done: Path, progress: bool) -> None:
    """Download (unless the archive is cached with the right sha256) and unpack one release."""
    files = list_files()
    f = _choose(files, version, pinned_file)
    expected = pinned_sha or f["sha256"]
    archive = cache_dir() / "downloads" / f["filename"]
    archive.parent.mkdir(exist_ok=True)
    if not archive.exists() or _sha(archive) != expected:
        _download(f["url"], archive, progress)
    got = _sha(archive)
    if expected and got != expected:
        archive.unlink()
        raise FetchError(
            f"{f['filename']} has sha256 {got}, but {'the pin file' if pinned_sha else 'the index'} "
            f"says {expected}. Refusing to use it."
        )
    _unpack(archive, root)
    done.write_text(json.dumps({"file": f["filename"], "sha256": got}))


def prepare_pinned_tree(progress: bool = True) -> Path:
    """The pinned release copied to ./build/sglang-VERSION (the README's one-command run)."""
    pin = load_pin(
        hint=": pass --sglang-dir DIR, an SGLang tree (a checkout, a site-packages or the package; its "
        "version is read from the tree), or pin a release to fetch in spectool.toml ([sglang] version)"
        + _installed_hint()
    )
    build = pin.path.parent / "build" / f"sglang-{pin.version}"
    if not build.exists():
        fetch(pin.version, dest=build, progress=progress)
    return build


def _installed_hint() -> str:
    """'. SGLang is installed here: --sglang-dir X' when this Python environment has one
    (found without importing it)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return ""
    return f". SGLang is installed in this environment: --sglang-dir {Path(list(spec.submodule_search_locations)[0]).parent}"


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(url: str, target: Path, progress: bool) -> None:
    tmp = target.with_suffix(target.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as out:
            total = int(r.headers.get("Content-Length") or 0)
            if progress:
                from rich.progress import Progress

                with Progress(transient=True) as bar:
                    task = bar.add_task(f"downloading {target.name}", total=total or None)
                    for chunk in iter(lambda: r.read(1 << 16), b""):
                        out.write(chunk)
                        bar.update(task, advance=len(chunk))
            else:
                shutil.copyfileobj(r, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"download of {url} failed: {exc}") from None
    os.replace(tmp, target)


def _unpack(archive: Path, root: Path) -> None:
    """Unpack only the sglang package (and its metadata) into root, atomically."""
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            members = [n for n in z.namelist() if n.startswith("sglang/") or ".dist-info/" in n]
            z.extractall(tmp, members)
    else:
        with tarfile.open(archive) as t:
            members = []
            for m in t.getmembers():
                parts = m.name.split("/")
                if len(parts) < 2 or m.issym() or m.islnk():
                    continue
                rest = "/".join(parts[1:])
                if rest.startswith(("sglang/", "python/sglang/")) or rest == "PKG-INFO":
                    m.name = rest[len("python/") :] if rest.startswith("python/") else rest
                    members.append(m)
            t.extractall(tmp, members, filter="data")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
