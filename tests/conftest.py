"""Shared helpers: fake-but-real SGLang trees for fixtures, and fetched releases (network)."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent

# One torch thread: the tests' models are tiny, and torch's OpenMP threads spin waiting for
# each other whenever another process holds a core, which made them several times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def make_tree(root: Path, version: str, files: dict[str, bytes]) -> Path:
    """A minimal folder holding an `sglang` package: enough for locate() and the engine."""
    pkg = root / "sglang"
    (pkg / "srt").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def _say(config, text: str) -> None:
    """One line on the terminal even while pytest captures output (a download takes a while)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(text)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(text)


def _link_or_copy(src, dst):
    """Hard link into the release cache (same filesystem), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _changed_in_cache(root: Path) -> list[str]:
    """Files of a cached release written after it was unpacked: new files, or files written
    in place (directly, or through a hard link of a test's tree)."""
    fetched = (root / ".spectool-fetched").stat().st_mtime
    return [str(Path(d, f).relative_to(root)) for d, _, files in os.walk(root) for f in files
            if os.stat(os.path.join(d, f)).st_mtime > fetched]


@pytest.fixture(scope="session")
def cached_release(pytestconfig):
    """The cached, unpacked SGLang release itself (SPECTOOL_CACHE; fetched on first use and
    announced on the terminal), for tests that only read it: nothing may write into it, which
    the end of the session checks."""
    from spectool.fetch import cache_dir, fetch

    roots = {}

    def get(version: str) -> Path:
        if version not in roots:
            if not (cache_dir() / f"sglang-{version}" / ".spectool-fetched").exists():
                _say(pytestconfig, f"fetching SGLang {version} into {cache_dir()} (first use; cached afterwards)")
            roots[version] = fetch(version, progress=False)
        return roots[version]

    yield get
    changed = {v: files for v, root in roots.items() if (files := _changed_in_cache(root))}
    assert not changed, (f"tests wrote into cached releases (directly or through a hard link): {changed}; "
                         "write into a tree of sglang_release by replacing files, and delete these releases "
                         "from the cache")


@pytest.fixture(scope="session")
def sglang_release(cached_release, tmp_path_factory):
    """A fresh tree of a pinned SGLang release per call, made of hard links into the release
    cache. A test changes a file of it by replacing the file, as spectool writes (a temp file
    and os.replace), never in place: that would change the cache."""

    def get(version: str) -> Path:
        dest = tmp_path_factory.mktemp(f"sglang-{version}")
        shutil.copytree(cached_release(version), dest, dirs_exist_ok=True, symlinks=True, copy_function=_link_or_copy)
        return dest

    return get


def _named_releases(items) -> list[str]:
    """The releases the network tests among `items` name: their `version` parameters and the
    release strings of their modules, in the matrix's order."""
    import ast

    from spectool import matrix

    known = list(matrix.load())
    named = set()
    modules = set()
    for item in items:
        if item.get_closest_marker("network") is None and "cached_release" not in item.fixturenames:
            continue
        params = getattr(item, "callspec", None)
        if params is not None and params.params.get("version") in known:
            named.add(params.params["version"])
        modules.add(Path(item.path))
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in known:
                named.add(node.value)
    return [v for v in known if v in named]


def pytest_collection_finish(session):
    """Fetch every release the session's network tests name before the first of them runs,
    several at once (a download waits on the network, an unpack on the disk), one line each."""
    from spectool.errors import FetchError
    from spectool.fetch import cache_dir, fetch

    if session.config.option.collectonly:
        return
    missing = [v for v in _named_releases(session.items)
               if not (cache_dir() / f"sglang-{v}" / ".spectool-fetched").exists()]
    if not missing:
        return
    _say(session.config, f"fetching {len(missing)} SGLang release(s) into {cache_dir()} (first use; cached afterwards)")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {pool.submit(fetch, v, progress=False): v for v in missing}
        for done, future in enumerate(as_completed(futures), 1):
            try:
                future.result()
                _say(session.config, f"  SGLang {futures[future]} fetched ({done} of {len(missing)})")
            except FetchError as exc:  # the tests that need it fetch it again and fail with the reason
                _say(session.config, f"  SGLang {futures[future]} not fetched: {exc}")


def pytest_report_header(config):
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    return f"spectool: GPU {'available' if gpu else 'not available: tests marked gpu are skipped'}; cache {os.environ.get('SPECTOOL_CACHE', '~/.cache/spectool')}"


@pytest.fixture(scope="session")
def patched_release(sglang_release):
    """A fetched release with every recipe applied, once per session and version, for tests
    that only read the patched files (load the inserted functions); the apply must succeed."""
    from spectool import api

    cache = {}

    def get(version: str) -> Path:
        if version not in cache:
            tree = sglang_release(version)
            out = api.apply(tree)
            assert out.ok, (version, [r.to_json() for r in out.plan.results])
            cache[version] = tree
        return cache[version]

    return get


@pytest.fixture(scope="session")
def load_tool():
    """tools/NAME.py as a module: the tools are scripts beside the package, not in it."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
