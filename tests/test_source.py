"""Finding SGLang in a directory: a git checkout (python/sglang), a site-packages, the package."""

from __future__ import annotations

import pytest

from spectool import api
from spectool.errors import SourceError
from spectool.source import locate

from .conftest import FIXTURES, make_tree


def test_checkout_layout_and_pyproject_version(tmp_path):
    root = tmp_path / "sglang-repo"
    make_tree(
        root / "python", "0.0.0.dev0", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()}
    )
    (root / "python" / "sglang" / "version.py").write_text(
        "try:\n    from ._version import __version__\nexcept ImportError:\n    __version__ = '0.0.0.dev0'\n"
    )
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


def test_every_spelling_is_one_tree(tmp_path):
    """DIR, DIR/sglang (a site-packages) and DIR, DIR/python, DIR/python/sglang (a checkout)
    resolve to one tree directory: one lockfile, one lock, one state."""
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    site = make_tree(tmp_path / "site", "0.5.12", {"sglang/srt/target.py": src})
    assert {locate(p).dir for p in (site, site / "sglang")} == {site.resolve()}
    out = api.apply(site / "sglang", recipes_dir=FIXTURES / "add_method")
    assert out.ok and (site / "spectool.lock").exists() and not (site / "sglang" / "spectool.lock").exists()
    st = api.status(site)
    assert st.ok and st.files[0]["state"] == "intact"
    api.revert(site)
    assert (site / "sglang/srt/target.py").read_bytes() == src

    repo = tmp_path / "repo"
    make_tree(repo / "python", "0.5.12", {"sglang/srt/target.py": src})
    (repo / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.12"\n')
    spellings = (repo, repo / "python", repo / "python" / "sglang")
    assert {(locate(p).dir, locate(p).kind) for p in spellings} == {(repo.resolve(), "checkout")}
    assert api.apply(repo / "python", recipes_dir=FIXTURES / "add_method").ok
    assert (repo / "spectool.lock").exists() and not (repo / "python" / "spectool.lock").exists()
    assert all(api.status(p).ok for p in spellings)


def test_state_under_another_spelling_is_refused(tmp_path):
    """A lockfile inside the package (written when it was named directly) would split the
    tree's record in two: refused, with how to join it."""
    make_tree(tmp_path, "0.5.12", {})
    (tmp_path / "sglang" / "spectool.lock").write_text("{}")
    with pytest.raises(SourceError, match=r"found spectool state \(spectool.lock\) in .*sglang.*Move"):
        api.status(tmp_path)


def test_a_definition_that_moved_is_found_in_other_files(tmp_path):
    make_tree(
        tmp_path,
        "0.5.12",
        {
            "sglang/srt/old.py": b"def caller():\n    return prepare_batch()\n",
            "sglang/srt/utils/batching.py": b"import os\n\n\ndef _prepare_batch(reqs):\n    return reqs\n",
            "sglang/srt/worker.py": b"class Worker:\n    async def prepare_batch(self):\n        pass\n",
            "sglang/srt/mentions.py": b"# prepare_batch is called elsewhere\n",
        },
    )
    tree = locate(tmp_path)
    hits = tree.find_definition_elsewhere("prepare_batch", skip="sglang/srt/old.py")
    # Underscored or not, a method too; a file that only mentions the name is not a hit.
    assert hits == [
        "sglang/srt/utils/batching.py:4: def _prepare_batch",
        "sglang/srt/worker.py:2: async def prepare_batch",
    ]
    assert [rel for rel, _ in tree.sources_mentioning("prepare_batch", skip="sglang/srt/worker.py")] == [
        "sglang/srt/mentions.py",
        "sglang/srt/old.py",
        "sglang/srt/utils/batching.py",
    ]
