"""check on an applied tree answers from apply's read-back while no input changed, and plans
again (and sees the change) as soon as one did."""

from __future__ import annotations

import json
import shutil

import pytest

from spectool import api, plan, readback

from .conftest import FIXTURES, make_tree

TARGET = "sglang/srt/target.py"
RECIPES = FIXTURES / "add_method" / "recipe"


@pytest.fixture
def planned(monkeypatch):
    """Counts the full plans (parse, run, validate) that check makes."""
    calls = []
    real = plan.build_plan

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan, "build_plan", counting)
    return calls


def _applied(tmp_path, planned=None, recipes=RECIPES):
    """A tree with the recipe applied; the plans apply made are not counted."""
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: (FIXTURES / "add_method" / "before.py").read_bytes()})
    assert api.apply(tree, recipes_dir=recipes).wrote
    assert (tree / readback.READBACK).is_file()
    if planned is not None:
        planned.clear()
    return tree


def test_unchanged_tree_is_not_planned_again(tmp_path, planned):
    tree = _applied(tmp_path, planned)
    fast = api.check(tree, recipes_dir=RECIPES)
    assert planned == [], "an unchanged tree must not be parsed and planned again"
    assert fast.ok and [r.status for r in fast.plan.results] == ["already-applied"]
    (tree / readback.READBACK).unlink()
    full = api.check(tree, recipes_dir=RECIPES)
    assert len(planned) == 1
    assert fast.to_json() == full.to_json(), "the recorded answer is the full plan's, word for word"


@pytest.mark.parametrize(
    "edit, status",
    [
        (lambda text: text + "# a comment added by hand\n", "already-applied"),
        (lambda text: text.replace("def twice", "def thrice"), "would-apply"),
    ],
)
def test_a_modified_file_is_planned_and_reported(tmp_path, planned, edit, status):
    tree = _applied(tmp_path, planned)
    path = tree / TARGET
    path.write_text(edit(path.read_text()))
    out = api.check(tree, recipes_dir=RECIPES)
    assert len(planned) == 1
    assert not out.ok and [f["state"] for f in out.files] == ["modified"]
    assert [r.status for r in out.plan.results] == [status]


def test_other_recipes_options_or_engine_are_planned(tmp_path, planned, monkeypatch):
    recipes = tmp_path / "recipes" / "fx"
    shutil.copytree(RECIPES, recipes)
    yaml_path = recipes / "recipe.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("variants:", "options:\n  loud: {default: false}\nvariants:"))
    tree = _applied(tmp_path, planned, recipes)
    assert api.check(tree, recipes_dir=recipes).ok and planned == []
    assert api.check(tree, recipes_dir=recipes, options={"fx-add-method": {"loud": True}}).ok
    assert len(planned) == 1, "other options"
    engine = readback._engine
    monkeypatch.setattr(readback, "_engine", lambda: "other spectool code")
    assert api.check(tree, recipes_dir=recipes).ok
    assert len(planned) == 2, "a read-back recorded by other spectool code"
    monkeypatch.setattr(readback, "_engine", engine)
    yaml_path.write_text(yaml_path.read_text() + "# the same recipe, other bytes\n")
    out = api.check(tree, recipes_dir=recipes)
    assert len(planned) == 3 and "changed since they were applied" in out.notes[0], "a changed recipe"


def test_a_damaged_readback_is_ignored(tmp_path, planned):
    tree = _applied(tmp_path, planned)
    path = tree / readback.READBACK
    data = json.loads(path.read_text())
    data["results"][0]["status"] = "drift"
    data["inputs"] = {TARGET: "0" * 64}
    path.write_text(json.dumps(data))
    assert api.check(tree, recipes_dir=RECIPES).ok and len(planned) == 1
    path.write_text("{not json")
    assert api.check(tree, recipes_dir=RECIPES).ok and len(planned) == 2


def test_revert_removes_the_readback_and_apply_records_one_for_an_applied_tree(tmp_path):
    tree = _applied(tmp_path)
    api.revert(tree)
    assert not (tree / readback.READBACK).exists()
    api.apply(tree, recipes_dir=RECIPES)
    (tree / readback.READBACK).unlink()
    again = api.apply(tree, recipes_dir=RECIPES)
    assert not again.wrote and (tree / readback.READBACK).is_file(), "a tree applied before the read-back existed"
    dry = api.apply(tree, recipes_dir=RECIPES, dry_run=True)
    assert dry.ok and not dry.wrote
