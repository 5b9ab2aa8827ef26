"""Finding SGLang in a directory: a git checkout (python/sglang), a site-packages, the package."""

from __future__ import annotations

import pytest

from spectool import api
from spectool.errors import SourceError
from spectool.source import locate

from .conftest import FIXTURES, make_tree


def test_checkout_layout_and_pyproject_version(tmp_path):
    root = tmp_path / "sglang-repo"
    make_tree(root / "python", "0.0.0.dev0", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()})
    (root / "python" / "sglang" / "version.py").write_text("try:\n    from ._version import __version__\nexcept ImportError:\n    __version__ = '0.0.0.dev0'\n")
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.12"\n')
    t = locate(root)
    assert t.kind == "checkout" and str(t.version) == "0.5.12" and t.root == (root / "python").resolve()
    out = api.apply(root, recipes_dir=FIXTURES / "add_method")
    assert out.ok and (root / "spectool.lock").exists()  # the lock lives in the directory the user named


def test_site_packages_metadata_wins(tmp_path):
    make_tree(tmp_path, "0.0.0.dev0", {})
    (tmp_path / "sglang-0.5.8.dist-info").mkdir()
    (tmp_path / "sglang-0.5.8.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.8\n")
    assert str(locate(tmp_path).version) == "0.5.8"
    assert str(locate(tmp_path / "sglang").version) == "0.5.8"  # the package itself


def test_version_override_and_unknown(tmp_path):
    make_tree(tmp_path, "0.5.12", {})
    assert str(locate(tmp_path, "0.5.17").version) == "0.5.17"
    (tmp_path / "sglang" / "version.py").write_text("")
    with pytest.raises(SourceError, match="cannot tell the SGLang version"):
        locate(tmp_path)
