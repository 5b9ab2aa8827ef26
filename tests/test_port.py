"""spectool port: a recipe carried over to another release, re-anchored where exactly one
candidate fits, and left to a human (nothing written) where several do. Synthetic trees for
the re-anchoring cases; the shipped recipes on real releases for the no-drift case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from spectool import api
from spectool.cli import main
from spectool.port import port
from spectool.recipe import load_recipe
from tests.conftest import REPO, make_tree

OLD = """\
import os


def make_stream():
    return object()


class Worker:
    def __init__(self):
        self.size = 1
        self.stream = make_stream()

    def clear_cache_pool(self):
        self.size = 0

    def reset(self):
        self.size = 1

    def step(self, batch):
        if batch is None:
            return None
        return batch
"""

# 1.1: clear_cache_pool -> clear_cache_pools, reset -> reset_all, step -> forward_step, and
# the stream is made in a helper that __init__ calls.
NEW = """\
import os


def make_stream():
    return object()


class Worker:
    def __init__(self):
        self.size = 1
        self._init_streams()

    def _init_streams(self):
        self.stream = make_stream()

    def clear_cache_pools(self):
        self.size = 0

    def reset_all(self):
        self.size = 1

    def forward_step(self, batch):
        if batch is None:
            return None
        return batch
"""

RECIPE = """\
id: demo
summary: a demo recipe
variants:
  # The first release's variant.
  - name: v-1.0
    versions: ">=1.0,<1.1"
    operations:
      - &helper
        op: add_definition
        target: sglang.srt.worker
        before: Worker
        code: code.py:helper
      - op: add_method
        target: sglang.srt.worker:Worker
        after: clear_cache_pool
        code: code.py:Worker
      - op: replace_method
        target: sglang.srt.worker:Worker
        code: code.py:Replaced.reset
      - op: insert_after
        target: sglang.srt.worker:Worker.__init__
        anchor: "self.stream = make_stream()"
        code: code.py:after_stream
      - op: insert_before
        target: sglang.srt.worker:Worker.step
        anchor: |
          if batch is None:
              ...
        code: code.py:count_step
  - name: unsupported-1.1
    versions: ">=1.1,<1.3"
    unsupported: not ported yet.
"""

CODE = """\
def helper():
    return 2


class Worker:
    def stats(self):
        return {"size": self.size}


class Replaced:
    def reset(self):
        self.size = helper()


def after_stream(self):
    self.streams = [self.stream]


def count_step(self, batch):
    self.size += 0 if batch is None else 1
"""


def demo(tmp_path: Path, new_source: str = NEW) -> tuple[Path, Path]:
    """(recipes dir, tree of release 1.1)."""
    recipes = tmp_path / "recipes"
    (recipes / "demo").mkdir(parents=True)
    (recipes / "demo" / "recipe.yaml").write_text(RECIPE)
    (recipes / "demo" / "code.py").write_text(CODE)
    old = make_tree(tmp_path / "old", "1.0", {"sglang/srt/worker.py": OLD.encode()})
    assert api.check(old, recipes_dir=recipes).ok  # the variant applies to the release it was written for
    tree = make_tree(tmp_path / "new", "1.1", {"sglang/srt/worker.py": new_source.encode()})
    return recipes, tree


def test_a_renamed_and_moved_tree_is_reanchored(tmp_path):
    recipes, tree = demo(tmp_path)
    res = port("demo", tree, recipes_dir=recipes)
    outcomes = {o.index: (o.outcome, [(c.key, c.old, c.new) for c in o.changes]) for o in res.ops}
    assert outcomes == {
        1: ("carried", []),
        2: ("re-anchored", [("after", "clear_cache_pool", "clear_cache_pools")]),
        3: ("re-anchored", [("code", "code.py:Replaced.reset", "v1_1/code.py:Replaced.reset_all")]),
        4: ("re-anchored", [("target", "sglang.srt.worker:Worker.__init__", "sglang.srt.worker:Worker._init_streams")]),
        5: ("re-anchored", [("target", "sglang.srt.worker:Worker.step", "sglang.srt.worker:Worker.forward_step")]),
    }
    assert res.ok and res.check.ok, res.to_json()
    evidence = res.ops[1].changes[0]
    assert evidence.score > 0.9 and evidence.location == "sglang/srt/worker.py:16"
    text = (recipes / "demo" / "recipe.yaml").read_text()
    assert text.startswith(RECIPE.split("  - name: unsupported-1.1")[0])  # comments and anchors kept
    assert "- *helper" in text  # the unchanged operation is its alias
    variants = {v.name: str(v.versions) for v in load_recipe(recipes / "demo" / "recipe.yaml").variants}
    assert variants == {"v-1.0": "<1.1,>=1.0", "v-1.1": "<1.2,>=1.1", "unsupported-1.2": "<1.3,>=1.2"}
    copy = (recipes / "demo" / "v1_1" / "code.py").read_text()
    assert "def reset_all(self):" in copy and "def reset(self)" not in copy
    out = api.apply(tree, recipes_dir=recipes)
    assert out.ok and out.wrote
    patched = (tree / "sglang/srt/worker.py").read_text()
    assert "self.streams = [self.stream]" in patched and "def stats(self):" in patched


def test_a_renamed_parameter_is_reanchored_with_a_copy_of_the_code(tmp_path):
    source = NEW.replace(
        "def forward_step(self, batch):\n        if batch is None:\n            return None\n        return batch",
        "def step(self, inputs):\n        if inputs is None:\n            return None\n        return inputs",
    )
    recipes, tree = demo(tmp_path, source)
    res = port("demo", tree, recipes_dir=recipes)
    assert res.ok, res.to_json()
    [change] = res.ops[4].changes
    assert (change.key, change.old, change.new) == (
        "anchor",
        "if batch is None:\n    ...",
        "if inputs is None:\n    ...",
    )
    assert change.why == "parameter renamed: batch -> inputs" and change.location == "sglang/srt/worker.py:22"
    assert res.ops[4].spec["code"] == "v1_1/code.py:count_step"
    copy = (recipes / "demo" / "v1_1" / "code.py").read_text()
    assert "def count_step(self, inputs):\n    self.size += 0 if inputs is None else 1" in copy
    assert "def reset_all(self):" in copy  # one copy holds both re-anchorings
    assert api.apply(tree, recipes_dir=recipes).ok


def test_ambiguous_candidates_are_left_to_a_human(tmp_path):
    # Two members could be the renamed clear_cache_pool: neither is chosen.
    source = NEW.replace(
        "    def clear_cache_pools(self):",
        "    def clear_cache_pool_a(self):\n        pass\n\n    def clear_cache_pool_b(self):",
    )
    recipes, tree = demo(tmp_path, source)
    before = (recipes / "demo" / "recipe.yaml").read_bytes()
    res = port("demo", tree, recipes_dir=recipes)
    human = {o.index: o for o in res.needs_human}
    assert list(human) == [2]
    assert "2 candidates make it apply: not guessed" in human[2].reason
    assert [c.split(" (")[0] for c in human[2].candidates[:2]] == [
        "after: clear_cache_pool_a",
        "after: clear_cache_pool_b",
    ]
    assert not res.ok and not res.wrote
    assert (recipes / "demo" / "recipe.yaml").read_bytes() == before
    assert not (recipes / "demo" / "v1_1").exists()  # the trial copy of a code file is gone


def test_an_operation_anchored_on_one_that_did_not_port_says_so(tmp_path):
    # The method the class of methods would follow is gone without a trace; the op that
    # places after a method that #2 adds is blocked by it, not re-anchored.
    recipe = RECIPE.replace(
        "        code: code.py:Replaced.reset\n",
        "        code: code.py:Replaced.reset\n"
        "      - op: add_method\n        target: sglang.srt.worker:Worker\n"
        "        after: stats\n        code: code.py:More\n",
    )
    recipes, tree = demo(tmp_path, NEW.replace("clear_cache_pools", "drop_everything"))
    (recipes / "demo" / "recipe.yaml").write_text(recipe)
    (recipes / "demo" / "code.py").write_text(CODE + "\n\nclass More:\n    def more(self):\n        return 1\n")
    res = port("demo", tree, recipes_dir=recipes)
    human = {o.index: o.reason for o in res.needs_human}
    assert list(human) == [2, 4]
    assert "no member 'clear_cache_pool'" in human[2]
    assert human[4].startswith("anchored on 'stats', which operation #2 adds")


def test_the_cli_reports_json_and_exit_codes(tmp_path):
    recipes, tree = demo(tmp_path)
    runner = CliRunner()
    r = runner.invoke(
        main,
        [
            "port",
            "demo",
            "--to",
            "1.1",
            "--sglang-dir",
            str(tree),
            "--recipes-dir",
            str(recipes),
            "--dry-run",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    import jsonschema

    from spectool.report import schema

    jsonschema.validate(data, schema())
    assert data["command"] == "port" and data["variant"] == "v-1.1" and data["versions"] == ">=1.1,<1.2"
    assert [o["operation"] for o in data["reanchored"]] == [2, 3, 4, 5]
    assert data["reanchored"][0]["changes"][0]["location"] == "sglang/srt/worker.py:16"
    assert not (recipes / "demo" / "v1_1").exists() and "v-1.1" not in (recipes / "demo" / "recipe.yaml").read_text()
    r = runner.invoke(main, ["port", "demo", "--to", "1.1", "--sglang-dir", str(tree), "--recipes-dir", str(recipes)])
    assert r.exit_code == 0, r.output
    assert "#2 add_method sglang.srt.worker:Worker: re-anchored" in r.output
    assert (
        "after: clear_cache_pool -> clear_cache_pools (member renamed; similarity 0.97, sglang/srt/worker.py:16)"
        in r.output
    )
    r = runner.invoke(main, ["port", "nope", "--to", "1.1", "--sglang-dir", str(tree), "--recipes-dir", str(recipes)])
    assert r.exit_code == 2 and "unknown recipe id(s) ['nope']" in r.output
    r = runner.invoke(main, ["port", "demo", "--to", "1.2", "--sglang-dir", str(tree), "--recipes-dir", str(recipes)])
    assert r.exit_code == 2 and "holds SGLang 1.1, not 1.2" in r.output


# -- real releases -----------------------------------------------------------------------------


@pytest.mark.network
def test_the_shipped_recipes_cover_0512_post1_unchanged(sglang_release, tmp_path):
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    tree = sglang_release("0.5.12.post1")
    for rid in ("spec-disable-threshold", "spec-fallback"):
        res = port(rid, tree, recipes_dir=recipes)
        assert res.ok and res.covered_by and not res.wrote and not res.needs_human, res.to_json()
        assert {o.outcome for o in res.ops} == {"carried"}


@pytest.mark.network
def test_porting_the_0512_variants_to_0512_post1_needs_no_human(sglang_release, tmp_path):
    """With the 0.5.12 variants narrowed to 0.5.12 alone, port carries every operation over to
    0.5.12.post1 and widens their ranges back: the recipe files come out as shipped."""
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    tree = sglang_release("0.5.12.post1")
    for rid in ("spec-disable-threshold", "spec-fallback"):
        path = recipes / rid / "recipe.yaml"
        path.write_text(path.read_text().replace('versions: ">=0.5.12,<0.5.13"', 'versions: ">=0.5.12,<0.5.12.post1"'))
        assert (
            load_recipe(path).variant_for(tree and __import__("packaging.version").version.Version("0.5.12.post1"))
            is None
        )
    for rid in ("spec-disable-threshold", "spec-fallback"):  # the fallback requires the flag: port it first
        res = port(rid, tree, recipes_dir=recipes)
        assert res.ok and not res.needs_human and res.check.ok, res.to_json()
        assert {o.outcome for o in res.ops} == {"carried"}
        assert res.ranges == [
            f"{res.variant} (<0.5.12.post1,>=0.5.12) widened to >=0.5.12,<0.5.13: it applies unchanged"
        ]
        assert (recipes / rid / "recipe.yaml").read_text() == (REPO / "recipes" / rid / "recipe.yaml").read_text()
