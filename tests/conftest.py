"""Shared helpers: fake-but-real SGLang trees for fixtures, and fetched releases (network)."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def sglang_release(tmp_path_factory, pytestconfig):
    """Fetch a pinned SGLang release once per session (cached in SPECTOOL_CACHE across runs);
    a release not in the cache yet is announced on the terminal before it downloads."""
    from spectool.fetch import cache_dir, fetch

    cache = {}

    def get(version: str) -> Path:
        if version not in cache:
            if not (cache_dir() / f"sglang-{version}" / ".spectool-fetched").exists():
                _say(pytestconfig, f"fetching SGLang {version} into {cache_dir()} (first use; cached afterwards)")
            cache[version] = fetch(version, progress=False)
        dest = tmp_path_factory.mktemp(f"sglang-{version}")
        shutil.copytree(cache[version], dest, dirs_exist_ok=True, symlinks=True)
        return dest

    return get


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
            assert api.apply(tree).ok
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
