"""Engine fixtures, before and after side by side (black-style, byte for byte).

Each folder under fixtures/ holds before.py, after.py and recipe/ (recipe.yaml + code.py).
before.py is placed at sglang/srt/target.py of a minimal tree; applying the recipe must give
after.py exactly; a second apply must change nothing; revert must restore before.py.
Regenerate after.py files (then review the diff!) with SPECTOOL_REGEN=1.
"""

from __future__ import annotations

import os

import pytest

from spectool import api
from .conftest import FIXTURES, make_tree

CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "before.py").exists())
TARGET = "sglang/srt/target.py"


@pytest.mark.parametrize("case", CASES)
def test_fixture(case, tmp_path):
    d = FIXTURES / case
    before = (d / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    out = api.apply(tree, recipes_dir=d)
    assert out.ok, [r.to_json() for r in out.plan.results]
    got = (tree / TARGET).read_bytes()
    expected_path = d / "after.py"
    if os.environ.get("SPECTOOL_REGEN") or not expected_path.exists():
        expected_path.write_bytes(got)
    assert got == expected_path.read_bytes(), "applied output differs from after.py"
    assert got != before
    compile(got, TARGET, "exec")

    again = api.apply(tree, recipes_dir=d)
    assert again.ok and not again.wrote
    assert {r.status for r in again.plan.results} == {"already-applied"}
    assert (tree / TARGET).read_bytes() == got

    api.revert(tree)
    assert (tree / TARGET).read_bytes() == before
    assert not (tree / "spectool.lock").exists()


def test_fixture_outputs_keep_bytes_outside_edits():
    """CRLF and latin-1 fixtures: encoding and line endings of untouched lines survive."""
    crlf = (FIXTURES / "crlf" / "after.py").read_bytes()
    assert b"\r\n" in crlf and b"\n" not in crlf.replace(b"\r\n", b"")
    latin = (FIXTURES / "latin1" / "after.py").read_bytes()
    assert b"caf\xe9 au lait" in latin and b'"\xe9t\xe9"' in latin
    with pytest.raises(UnicodeDecodeError):
        latin.decode("utf-8")


def test_drift_reports_nearest_candidates(tmp_path):
    """A renamed method: the error names recipe, operation, file, anchor and candidates."""
    src = (FIXTURES / "add_method" / "before.py").read_text().replace("class Worker:", "class WorkerV2:")
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: src.encode()})
    out = api.apply(tree, recipes_dir=FIXTURES / "add_method")
    assert not out.ok
    res = out.plan.results[0]
    assert res.status == "drift"
    msg = res.error.message
    assert "fx-add-method" in msg and "add_method" in msg and "sglang/srt/target.py" in msg and "Worker" in msg
    assert any("WorkerV2" in c for c in res.error.candidates)
    assert (tree / TARGET).read_text() == src  # nothing written


def test_drift_in_function_lists_statements(tmp_path):
    src = (FIXTURES / "insert_statements" / "before.py").read_text().replace("self.draft_worker.draft(", "self.drafter.draft(")
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: src.encode()})
    out = api.apply(tree, recipes_dir=FIXTURES / "insert_statements")
    res = out.plan.results[0]
    assert res.status == "drift"
    assert "matched 0 statements, expected 1" in res.error.message
    assert any("self.drafter.draft" in c for c in res.error.candidates)


def test_conflict_between_recipes(tmp_path):
    """Two recipes touching the same node is a conflict, and nothing is written."""
    import shutil

    rdir = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "replace_expr" / "recipe", rdir / "a")
    shutil.copytree(FIXTURES / "replace_expr" / "recipe", rdir / "b")
    y = (rdir / "b" / "recipe.yaml").read_text().replace("fx-replace-expr", "fx-zz-second")
    y = y.replace('pattern: "$SM < 90"', 'pattern: "$SM < 90 or $SM == 120"')
    (rdir / "b" / "recipe.yaml").write_text(y)
    before = (FIXTURES / "replace_expr" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    out = api.apply(tree, recipes_dir=rdir)
    statuses = {r.id: r.status for r in out.plan.results}
    assert statuses["fx-replace-expr"] == "would-apply"
    assert statuses["fx-zz-second"] == "conflict", statuses
    assert "fx-replace-expr" in out.plan.results[1].error.message
    assert (tree / TARGET).read_bytes() == before


def test_unsupported_version_is_reported(tmp_path):
    before = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.0.1", {TARGET: before})
    out = api.apply(tree, recipes_dir=FIXTURES / "add_method")
    assert out.plan.results[0].status == "unsupported"
    assert "no variant covers SGLang 0.0.1" in out.plan.results[0].message


def test_undefined_name_is_caught(tmp_path):
    """Code that uses a name the target does not define is refused before writing."""
    import shutil

    rdir = tmp_path / "r" / "x"
    shutil.copytree(FIXTURES / "add_method" / "recipe", rdir)
    y = (rdir / "recipe.yaml").read_text().replace('        imports: ["import math"]\n', "")
    (rdir / "recipe.yaml").write_text(y)
    before = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    out = api.apply(tree, recipes_dir=rdir.parent)
    assert out.plan.results[0].status == "invalid"
    assert "math" in out.plan.results[0].message
    assert (tree / TARGET).read_bytes() == before
