"""Shared helpers: fake-but-real SGLang trees for fixtures, and fetched releases (network)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import shutil
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
    return [
        str(Path(d, f).relative_to(root))
        for d, _, files in os.walk(root)
        for f in files
        if os.stat(os.path.join(d, f)).st_mtime > fetched
    ]


@pytest.fixture(scope="session")
def cached_release(pytestconfig):
    """The cached, unpacked SGLang release itself (SPECTOOL_CACHE; fetched on first use and
    announced on the terminal), for tests that only read it: nothing may write into it, which
    the end of the session checks."""
    from spectool.fetch import cache_dir, fetch

    roots = {}
    prefetch = pytestconfig.stash.get(PREFETCH, None)

    def get(version: str) -> Path:
        if version not in roots:
            if prefetch is not None:
                prefetch.wait([version])
            if not (cache_dir() / f"sglang-{version}" / ".spectool-fetched").exists():
                _say(pytestconfig, f"fetching SGLang {version} into {cache_dir()} (first use; cached afterwards)")
            roots[version] = fetch(version, progress=False)
        return roots[version]

    yield get
    changed = {v: files for v, root in roots.items() if (files := _changed_in_cache(root))}
    assert not changed, (
        f"tests wrote into cached releases (directly or through a hard link): {changed}; "
        "write into a tree of sglang_release by replacing files, and delete these releases "
        "from the cache"
    )


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


class _Prefetch:
    """Releases fetched in two worker processes while the first tests run (a download waits
    on the network, an unpack on the disk; the tests use the other core): a line on the
    terminal for each, printed between tests."""

    def __init__(self, config, versions: list[str]):
        from spectool.fetch import fetch

        self.config = config
        spawn = multiprocessing.get_context("spawn")  # not a fork of pytest
        self.pool = concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=spawn)
        self.futures = {v: self.pool.submit(fetch, v, progress=False) for v in versions}
        self.reported: set[str] = set()

    def report(self) -> None:
        for version, future in self.futures.items():
            if future.done() and version not in self.reported:
                self.reported.add(version)
                error = future.exception()
                count = f"{len(self.reported)} of {len(self.futures)}"
                _say(
                    self.config,
                    f"  SGLang {version} fetched ({count})"
                    if error is None
                    else f"  SGLang {version} not fetched: {error}",
                )

    def wait(self, versions=None) -> None:
        """Until these releases (default: all) are fetched or failed; a release that failed
        is fetched again by the test that needs it, which then fails with the reason."""
        futures = [self.futures[v] for v in (versions or self.futures) if v in self.futures]
        concurrent.futures.wait(futures)
        self.report()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


PREFETCH = pytest.StashKey[_Prefetch]()


def _start_prefetch(config, versions: list[str]) -> None:
    from spectool.fetch import cache_dir

    missing = [v for v in versions if not (cache_dir() / f"sglang-{v}" / ".spectool-fetched").exists()]
    if missing:
        _say(
            config,
            f"fetching {len(missing)} SGLang release(s) into {cache_dir()} while the first tests run "
            "(first use; cached afterwards)",
        )
        config.stash[PREFETCH] = _Prefetch(config, missing)


def pytest_collection_finish(session):
    """Start fetching every release the session's network tests name that is not cached yet.
    Under pytest-xdist the controller fetches (it shows the progress) and the workers, which
    collect, wait for a release they need on its fetch lock."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    _start_prefetch(session.config, _named_releases(session.items))


_CONTROLLER: list[pytest.Config] = []  # the xdist controller's config, for its progress lines


def pytest_sessionstart(session):
    """The pytest-xdist controller collects nothing: it fetches every release of the matrix."""
    if session.config.pluginmanager.has_plugin("dsession") and not session.config.option.collectonly:
        from spectool import matrix

        _CONTROLLER.append(session.config)
        _start_prefetch(session.config, list(matrix.load()))


def pytest_runtest_logreport(report):
    """Progress lines on the xdist controller, as test reports come back from the workers."""
    for config in _CONTROLLER:
        prefetch = config.stash.get(PREFETCH, None)
        if prefetch is not None:
            prefetch.report()


def pytest_runtest_setup(item):
    """A network test that fetches on its own (a subprocess, the CLI) waits for the prefetch,
    so that no two processes unpack one release at once."""
    prefetch = item.config.stash.get(PREFETCH, None)
    if prefetch is not None and item.get_closest_marker("network") and "cached_release" not in item.fixturenames:
        prefetch.wait()


def pytest_runtest_teardown(item, nextitem):
    prefetch = item.config.stash.get(PREFETCH, None)
    if prefetch is not None:
        prefetch.report()


def pytest_sessionfinish(session):
    prefetch = session.config.stash.get(PREFETCH, None)
    if prefetch is not None:
        prefetch.close()


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
