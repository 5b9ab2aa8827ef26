"""Faults: a crash between file writes, a corrupted lockfile, modified files, symlinks out of
the tree, concurrent runs."""

from __future__ import annotations

import os

import pytest

from spectool import api, transaction
from spectool.errors import SourceError

from .conftest import FIXTURES, make_tree

R1 = FIXTURES / "add_method" / "recipe"


def _two_file_tree(tmp_path, recipes):
    """Two files, two recipes: one transaction writes both."""
    import shutil

    rdir = tmp_path / "recipes"
    shutil.copytree(R1, rdir / "a")
    shutil.copytree(R1, rdir / "b")
    y = (rdir / "b" / "recipe.yaml").read_text().replace("fx-add-method", "fx-other").replace("srt.target", "srt.other")
    (rdir / "b" / "recipe.yaml").write_text(y)
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {"sglang/srt/target.py": src, "sglang/srt/other.py": src})
    return tree, rdir, src


def test_crash_between_writes_completes_on_next_run(tmp_path, monkeypatch):
    tree, rdir, src = _two_file_tree(tmp_path, None)

    def boom():
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(transaction, "_between_writes", boom)
    with pytest.raises(KeyboardInterrupt):
        api.apply(tree, recipes_dir=rdir)
    files = [(tree / f"sglang/srt/{n}.py").read_bytes() for n in ("other", "target")]
    assert sum(f != src for f in files) == 1, "crashed after the first of two replacements"
    assert (tree / ".spectool" / "journal.json").exists()
    monkeypatch.setattr(transaction, "_between_writes", None)

    out = api.apply(tree, recipes_dir=rdir)
    assert out.ok and "interrupted apply" in " ".join(out.notes)
    assert all((tree / f"sglang/srt/{n}.py").read_bytes() != src for n in ("other", "target"))
    assert {r.status for r in out.plan.results} == {"already-applied"}
    assert not (tree / ".spectool" / "journal.json").exists()
    api.revert(tree)
    assert all((tree / f"sglang/srt/{n}.py").read_bytes() == src for n in ("other", "target"))


def test_crash_before_journal_leaves_tree_untouched(tmp_path, monkeypatch):
    tree, rdir, src = _two_file_tree(tmp_path, None)

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(transaction, "write_atomic", fail)
    with pytest.raises(OSError):
        api.apply(tree, recipes_dir=rdir)
    monkeypatch.undo()
    assert all((tree / f"sglang/srt/{n}.py").read_bytes() == src for n in ("other", "target"))
    assert not (tree / "spectool.lock").exists()
    out = api.apply(tree, recipes_dir=rdir)  # the stray temp files are swept, apply works
    assert out.ok and out.wrote
    assert not list(tree.rglob("*.spectool-tmp"))


def test_corrupted_lockfile(tmp_path):
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()})
    api.apply(tree, recipes_dir=R1)
    (tree / "spectool.lock").write_text("{not json")
    for fn in (lambda: api.apply(tree, recipes_dir=R1), lambda: api.status(tree), lambda: api.revert(tree)):
        with pytest.raises(SourceError, match="lockfile .* is corrupt"):
            fn()


def test_modified_file_is_refused_unless_force(tmp_path):
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()})
    api.apply(tree, recipes_dir=R1)
    p = tree / "sglang/srt/target.py"
    p.write_text(p.read_text() + "\n# hand edit\n")
    with pytest.raises(SourceError, match="changed since spectool wrote them"):
        api.apply(tree, recipes_dir=R1)
    with pytest.raises(SourceError, match="changed since spectool wrote them"):
        api.revert(tree)
    assert not api.status(tree).ok
    assert api.apply(tree, recipes_dir=R1, force=True).ok
    api.revert(tree, force=True)
    assert p.read_bytes() == (FIXTURES / "add_method" / "before.py").read_bytes()


def test_other_sglang_under_lock_is_refused(tmp_path):
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()})
    api.apply(tree, recipes_dir=R1)
    (tree / "sglang" / "version.py").write_text('__version__ = "0.5.13"\n')
    with pytest.raises(SourceError, match="written for 0.5.12"):
        api.apply(tree, recipes_dir=R1)


def test_symlink_out_of_tree_is_refused(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_bytes((FIXTURES / "add_method" / "before.py").read_bytes())
    tree = make_tree(tmp_path / "t", "0.5.12", {})
    os.symlink(outside, tree / "sglang/srt/target.py")
    with pytest.raises(SourceError, match="symlink that leads out"):
        api.apply(tree, recipes_dir=R1)
    assert outside.read_bytes() == (FIXTURES / "add_method" / "before.py").read_bytes()


def test_concurrent_apply_is_locked_out(tmp_path):
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()})
    with transaction.locked(tree):
        with pytest.raises(SourceError, match="another spectool run holds the lock"):
            api.apply(tree, recipes_dir=R1)


def test_changed_recipe_reapplies_from_originals(tmp_path):
    """Editing a recipe after applying it: apply updates the tree instead of colliding with
    the old output; revert still restores the pristine bytes."""
    import shutil

    rdir = tmp_path / "r"
    shutil.copytree(R1, rdir)
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": src})
    assert api.apply(tree, recipes_dir=rdir).ok
    code = rdir / "code.py"
    code.write_text(code.read_text().replace("math.ceil(2 * x)", "math.ceil(3 * x)"))
    chk = api.check(tree, recipes_dir=rdir)
    assert chk.ok and "changed since they were applied" in " ".join(chk.notes)
    out = api.apply(tree, recipes_dir=rdir)
    assert out.ok and out.wrote, [r.to_json() for r in out.plan.results]
    text = (tree / "sglang/srt/target.py").read_text()
    assert "3 * x" in text and "2 * x" not in text
    assert {r.status for r in api.apply(tree, recipes_dir=rdir).plan.results} == {"already-applied"}
    api.revert(tree)
    assert (tree / "sglang/srt/target.py").read_bytes() == src
