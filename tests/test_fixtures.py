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
    src = (
        (FIXTURES / "insert_statements" / "before.py")
        .read_text()
        .replace("self.draft_worker.draft(", "self.drafter.draft(")
    )
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


def test_bulk_add_completes_a_partly_present_block(tmp_path):
    """add_method with a code class: a method of the block already there with the same code
    is kept where it is and the others are placed around it, giving the same file as a
    fresh apply; the report counts the operation as applied."""
    d = FIXTURES / "add_methods"
    code = (d / "recipe" / "code.py").read_text()
    step = code[code.index("    # inserted with the block") : code.index("    def _count_total")]
    src = (
        (d / "before.py")
        .read_text()
        .replace(
            "        self.n = n  # keep this comment\n",
            "        self.n = n  # keep this comment\n\n" + step.rstrip() + "\n",
        )
    )
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: src.encode()})
    out = api.apply(tree, recipes_dir=d)
    assert out.ok and out.plan.results[0].status == "applied"
    assert (tree / TARGET).read_bytes() == (d / "after.py").read_bytes()


def test_bulk_add_reports_the_method_that_drifted(tmp_path):
    """One method of the block present with other code: drift that names that method (its
    recipe, operation and file), and nothing is written."""
    d = FIXTURES / "add_methods"
    other = "    def _count_total(self):\n        return 0\n\n    def step(self, batch):"
    src = (d / "before.py").read_text().replace("    def step(self, batch):", other)
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: src.encode()})
    out = api.apply(tree, recipes_dir=d)
    res = out.plan.results[0]
    assert res.status == "drift"
    assert "fx-add-methods" in res.error.message and "operation #2" in res.error.message
    assert "different method '_count_total'" in res.error.message
    assert res.error.details["anchor"] == "Worker._count_total"
    assert (tree / TARGET).read_text() == src


def test_add_definition_needs_its_anchor_and_its_name_free(tmp_path):
    """add_definition: no top-level definition to place it before is drift with the nearest
    names; a different definition of the same name already there is drift too."""
    d = FIXTURES / "add_methods"
    src = (d / "before.py").read_text()
    for changed, needle in (
        (src.replace("class Worker:", "class Worker2:"), "no top-level definition 'Worker'"),
        (src.replace("class Other:", "class Counter:"), "different definition 'Counter'"),
    ):
        tree = make_tree(tmp_path / str(len(needle)), "0.5.12", {TARGET: changed.encode()})
        res = api.apply(tree, recipes_dir=d).plan.results[0]
        assert res.status == "drift" and needle in res.error.message, res.error.message
        assert (tree / TARGET).read_text() == changed
    renamed = make_tree(tmp_path / "c", "0.5.12", {TARGET: src.replace("class Worker:", "class Worker2:").encode()})
    assert any("Worker2" in c for c in api.apply(renamed, recipes_dir=d).plan.results[0].error.candidates)


@pytest.mark.parametrize(
    "code,op,needle",
    [
        ("class Worker:\n    n = 1\n\n    def f(self):\n        pass\n", "add_method", "must hold only methods"),
        ("class Worker:\n    def f(self):\n        pass\n", "replace_method", "must be a function."),
        ("def helper():\n    pass\n", "add_definition", "exactly one of 'before' or 'after'"),
    ],
)
def test_bulk_and_definition_ops_refuse_bad_code_at_load(tmp_path, code, op, needle):
    """A code class with statements other than methods, a class given to replace_method, an
    add_definition without a place: refused when the recipe loads, saying why."""
    from spectool.errors import RecipeError
    from spectool.recipe import load_recipe

    rdir = tmp_path / "r"
    rdir.mkdir()
    (rdir / "code.py").write_text(code)
    target = "sglang.srt.target" if op == "add_definition" else "sglang.srt.target:Worker"
    name = "helper" if op == "add_definition" else "Worker"
    (rdir / "recipe.yaml").write_text(
        f"id: bad\nsummary: s\nvariants:\n  - name: all\n    versions: '>=0.1'\n"
        f"    operations:\n      - op: {op}\n        target: {target}\n"
        f"        code: code.py:{name}\n"
    )
    with pytest.raises(RecipeError, match=needle):
        load_recipe(rdir / "recipe.yaml")


def _insert_recipes(root, specs):
    """Recipes inserting at anchors of the insert_statements fixture: specs is a list of
    (id, [(op, anchor, statement)], requires)."""
    import yaml

    rdir = root / "recipes"
    for rid, ops, requires in specs:
        d = rdir / rid
        d.mkdir(parents=True)
        code, operations = [], []
        for i, (op, anchor, stmt) in enumerate(ops):
            code.append(f"def snippet{i}(self, batch, verify_input):\n    {stmt}\n")
            target = "sglang.srt.target:forward"
            operations.append({"op": op, "target": target, "anchor": anchor, "code": f"code.py:snippet{i}"})
        (d / "code.py").write_text("\n\n".join(code))
        data = {"id": rid, "summary": "s", "variants": [{"name": "all", "versions": ">=0.1", "operations": operations}]}
        if requires:
            data["requires"] = requires
        (d / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return rdir


DRAFT = "$V = self.draft_worker.draft(...)"
VERIFY = "out = self.verify(batch)"


@pytest.mark.parametrize("op,anchor", [("insert_after", DRAFT), ("insert_before", VERIFY)])
def test_same_anchor_is_a_conflict_without_an_order(tmp_path, op, anchor):
    """Two recipes inserting at one anchor: a conflict at plan time, nothing written."""
    rdir = _insert_recipes(
        tmp_path, [("fx-a", [(op, anchor, "self.a = 1")], None), ("fx-b", [(op, anchor, "self.b = 2")], None)]
    )
    before = (FIXTURES / "insert_statements" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    out = api.apply(tree, recipes_dir=rdir)
    statuses = {r.id: r.status for r in out.plan.results}
    assert statuses == {"fx-a": "would-apply", "fx-b": "conflict"}, statuses
    msg = out.plan.results[1].error.message
    assert "fx-a" in msg and "requires: [fx-a]" in msg
    assert (tree / TARGET).read_bytes() == before and not (tree / ".spectool").exists()


@pytest.mark.parametrize("op,anchor", [("insert_after", DRAFT), ("insert_before", VERIFY)])
def test_same_anchor_with_a_stated_order(tmp_path, op, anchor):
    """When one recipe requires the other, it goes after it at the shared anchor, and the
    result reads back as applied: a second apply changes nothing, revert is byte-exact."""
    rdir = _insert_recipes(
        tmp_path,
        [
            ("fx-a", [(op, anchor, "self.a = 1"), (op, anchor, "self.a2 = 1")], None),
            ("fx-b", [(op, anchor, "self.b = 2")], ["fx-a"]),
        ],
    )
    before = (FIXTURES / "insert_statements" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    out = api.apply(tree, recipes_dir=rdir)
    assert out.ok and out.wrote, [r.to_json() for r in out.plan.results]
    text = (tree / TARGET).read_text()
    order = [text.index(s) for s in ("self.a = 1", "self.a2 = 1", "self.b = 2")]
    assert order == sorted(order) if op == "insert_after" else order == sorted(order, reverse=True)
    again = api.apply(tree, recipes_dir=rdir)
    assert not again.wrote and {r.status for r in again.plan.results} == {"already-applied"}
    assert api.status(tree).ok and api.check(tree, recipes_dir=rdir).ok
    api.revert(tree)
    assert (tree / TARGET).read_bytes() == before


def test_not_idempotent_is_refused_before_writing(tmp_path):
    """Code that matches its own anchor would be inserted again by every apply: the
    in-memory read-back refuses it and the tree stays untouched."""
    from spectool.errors import ValidationError

    again = "again = self.draft_worker.draft(batch)"
    rdir = _insert_recipes(tmp_path, [("fx-loop", [("insert_after", DRAFT, again)], None)])
    before = (FIXTURES / "insert_statements" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    with pytest.raises(ValidationError, match="Nothing was written"):
        api.apply(tree, recipes_dir=rdir)
    assert (tree / TARGET).read_bytes() == before and not (tree / ".spectool").exists()


def test_crlf_file_gets_crlf_docstrings(tmp_path):
    """A method with a multi-line docstring inserted into a CRLF file: no lone LF."""
    import shutil

    rdir = tmp_path / "r" / "x"
    shutil.copytree(FIXTURES / "crlf" / "recipe", rdir)
    code = 'class Worker:\n    def extra(self):\n        """Two\n\n        lines."""\n        return 42\n'
    (rdir / "code.py").write_text(code)
    before = (FIXTURES / "crlf" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    assert api.apply(tree, recipes_dir=rdir.parent).ok
    after = (tree / TARGET).read_bytes()
    assert b'"""Two\r\n\r\n        lines."""' in after and b"\n" not in after.replace(b"\r\n", b"")
    assert not api.apply(tree, recipes_dir=rdir.parent).wrote
    api.revert(tree)
    assert (tree / TARGET).read_bytes() == before


def test_drift_candidates_come_from_the_file_on_disk(tmp_path):
    """Candidates name lines of the target's own class, and never a definition that only an
    earlier recipe of the same plan added."""
    src = b"""class First:
    def run(self):
        x = self.compute()
        return x


class Worker:
    def run(self):
        x = self.compute()
        return x
"""
    import yaml

    def recipe(rid, code, operations):
        (rdir / rid).mkdir(parents=True)
        (rdir / rid / "code.py").write_text(code)
        variant = {"name": "all", "versions": ">=0.1", "operations": operations}
        (rdir / rid / "recipe.yaml").write_text(yaml.safe_dump({"id": rid, "summary": "s", "variants": [variant]}))

    rdir = tmp_path / "recipes"
    worker = "sglang.srt.target:Worker"
    recipe(
        "fx-a",
        "class Worker:\n    def helper_v2(self):\n        return 1\n",
        [{"op": "add_method", "target": worker, "code": "code.py:Worker.helper_v2"}],
    )
    recipe(
        "fx-b",
        "def log(self):\n    print(1)\n",
        [
            {"op": "insert_after", "target": f"{worker}.run", "anchor": "x = self.compute(1)", "code": "code.py:log"},
            {"op": "insert_after", "target": f"{worker}.helper_v3", "anchor": "x = 1", "code": "code.py:log"},
        ],
    )
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: src})
    res = {r.id: r for r in api.check(tree, recipes_dir=rdir).plan.results}
    candidates = res["fx-b"].error.candidates
    assert res["fx-b"].status == "drift"
    assert any(c.startswith(f"{TARGET}:9: x = self.compute()") for c in candidates), candidates
    text = (rdir / "fx-b" / "recipe.yaml").read_text()
    (rdir / "fx-b" / "recipe.yaml").write_text(text.replace("x = self.compute(1)", "x = self.compute()"))
    res = {r.id: r for r in api.check(tree, recipes_dir=rdir).plan.results}
    assert res["fx-b"].status == "drift" and "helper_v3" in res["fx-b"].error.message
    assert not any("helper_v2" in c for c in res["fx-b"].error.candidates), res["fx-b"].error.candidates


def _member_recipes(root, requires: bool):
    """Two recipes adding a field, a method and a top-level function at the same anchors of
    the add_field fixture's ServerArgs."""
    import yaml

    rdir = root / "recipes"
    for rid, n in (("fx-a", 1), ("fx-b", 2)):
        d = rdir / rid
        d.mkdir(parents=True)
        (d / "code.py").write_text(
            f"class F:\n    extra{n}: int = {n}\n\n\nclass M:\n    def m{n}(self):\n"
            f"        return {n}\n\n\ndef helper{n}():\n    return {n}\n"
        )
        cls = "sglang.srt.target:ServerArgs"
        ops = [
            {"op": "add_field", "target": cls, "after": "speculative_adaptive", "code": "code.py:F"},
            {"op": "add_method", "target": cls, "after": "other", "code": f"code.py:M.m{n}"},
            {
                "op": "add_definition",
                "target": "sglang.srt.target",
                "before": "ServerArgs",
                "code": f"code.py:helper{n}",
            },
        ]
        data = {"id": rid, "summary": "s", "variants": [{"name": "all", "versions": ">=0.1", "operations": ops}]}
        if requires and rid == "fx-b":
            data["requires"] = ["fx-a"]
        (d / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return rdir


def test_members_at_one_anchor_need_an_order(tmp_path):
    """add_field, add_method and add_definition at an anchor another recipe uses: a conflict
    without `requires`; with it, the second goes after the first and reads back as applied."""
    before = (FIXTURES / "add_field" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: before})
    out = api.apply(tree, recipes_dir=_member_recipes(tmp_path / "u", requires=False))
    res = {r.id: r for r in out.plan.results}
    assert res["fx-b"].status == "conflict" and "requires: [fx-a]" in res["fx-b"].error.message
    assert (tree / TARGET).read_bytes() == before
    rdir = _member_recipes(tmp_path / "o", requires=True)
    assert api.apply(tree, recipes_dir=rdir).ok
    text = (tree / TARGET).read_text()
    assert text.index("extra1") < text.index("extra2") < text.index("speculative_adaptive_config")
    assert text.index("def m1") < text.index("def m2")
    assert text.index("def helper2") < text.index("def helper1") < text.index("class ServerArgs")
    again = api.apply(tree, recipes_dir=rdir)
    assert not again.wrote and {r.status for r in again.plan.results} == {"already-applied"}
    api.revert(tree)
    assert (tree / TARGET).read_bytes() == before
