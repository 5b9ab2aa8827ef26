"""Operation as an extension point: a kind written to the contract in spectool/ops/base.py and
registered in OPERATIONS is loaded, planned, applied, re-applied and reported like the shipped
ones; and the drift report's line numbers come from the parsed file."""

from __future__ import annotations

import textwrap

import pytest

from spectool import api, cstutil
from spectool.errors import RecipeError
from spectool.ops import ALREADY, APPLIED, OPERATIONS, Operation
from spectool.ops.base import FileState
from spectool.plan import parse_module

from .conftest import FIXTURES, make_tree

TARGET = "sglang/srt/target.py"


class AppendStatements(Operation):
    """Append the body of a code function to the end of the target function."""

    kind = "append_statements"
    required = {"target": str, "code": str}
    optional = {"when": str}

    def run(self, ctx):
        st = self.state(ctx)
        path = self.scope(ctx, st)
        fn = path[-1]
        ref = self.code["code"]
        new = ref.body_statements()
        body = list(fn.body.body)
        if len(body) >= len(new) and self.same_code(st, body[-len(new) :], new, ref.module()):
            return ALREADY
        st.own(ctx.recipe_id, new)
        st.module = cstutil.rebuild(path, fn.with_changes(body=fn.body.with_changes(body=(*body, *new))))
        return APPLIED


def _recipe(tmp_path, op_lines: str):
    d = tmp_path / "recipes" / "fx-append"
    d.mkdir(parents=True)
    (d / "recipe.yaml").write_text(
        textwrap.dedent("""\
        id: fx-append
        summary: append a statement
        variants:
          - name: all
            versions: ">=0.1"
            operations:
              - op: append_statements
        """)
        + textwrap.indent(textwrap.dedent(op_lines), " " * 8)
    )
    (d / "code.py").write_text("def tail(self):\n    self.ready = True\n")
    return d.parent


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(OPERATIONS, AppendStatements.kind, AppendStatements)


def test_a_registered_kind_applies_idempotently(tmp_path, registered):
    recipes = _recipe(tmp_path, "target: sglang.srt.target:Worker.__init__\ncode: code.py:tail\n")
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: (FIXTURES / "add_method" / "before.py").read_bytes()})
    out = api.apply(tree, recipes_dir=recipes)
    assert out.ok and out.wrote, [r.to_json() for r in out.plan.results]
    assert "        self.n = n  # keep this comment\n        self.ready = True\n" in (tree / TARGET).read_text()
    assert out.plan.results[0].ops == [
        {"op": "append_statements", "target": "sglang.srt.target:Worker.__init__", "status": "applied"}
    ]
    again = api.apply(tree, recipes_dir=recipes)
    assert not again.wrote and [r.status for r in again.plan.results] == ["already-applied"]


def test_a_registered_kind_gets_the_schema_checks_and_drift_reports(tmp_path, registered):
    with pytest.raises(RecipeError, match=r"unknown key\(s\) \['after'\]"):
        api.check(
            make_tree(tmp_path / "t0", "0.5.12", {}),
            recipes_dir=_recipe(
                tmp_path / "a", "target: sglang.srt.target:Worker.__init__\ncode: code.py:tail\nafter: x\n"
            ),
        )
    recipes = _recipe(tmp_path / "b", "target: sglang.srt.target:Worker.__init_\ncode: code.py:tail\n")
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: (FIXTURES / "add_method" / "before.py").read_bytes()})
    res = api.check(tree, recipes_dir=recipes).plan.results[0]
    assert res.status == "drift" and res.error.to_json()["op"] == "append_statements"
    assert "sglang/srt/target.py: Worker.__init__" in res.error.candidates


def test_unknown_kind_names_the_registered_ones(tmp_path):
    with pytest.raises(RecipeError, match="unknown op 'append_statements'; known: .*'add_method'"):
        api.check(
            make_tree(tmp_path / "t", "0.5.12", {}),
            recipes_dir=_recipe(tmp_path, "target: sglang.srt.target:Worker.__init__\ncode: code.py:tail\n"),
        )


def test_line_of_is_the_line_of_the_node_not_of_the_first_equal_text():
    src = (
        b"def other(self, batch):\n    out = self.verify(batch)\n\n\n"
        + (FIXTURES / "insert_statements" / "before.py").read_bytes()
    )
    st = FileState(TARGET, src, parse_module(src, TARGET))
    forward = cstutil.find_definition(st.module, "forward")[-1]
    hits = [
        stmt
        for stmt, _ in cstutil.iter_statements(forward, [forward])
        if st.code(stmt).strip() == "out = self.verify(batch)"
    ]
    assert [st.line_of(h) for h in hits] == [12]
    assert st.line_of("out = self.verify(batch)") == 2, "a piece of code: its first occurrence"
    created = hits[0].with_changes()
    assert st.line_of(created) == 2, "a node the plan created: looked up by its text"


def test_drift_candidates_point_at_the_lines_in_the_target_function(tmp_path):
    """The anchor's call was renamed; the same renamed line in an earlier function must not
    be the line the report gives for the candidate inside the target."""
    renamed = b'    verify_input = self.drafter.draft(batch, mode="x")\n'
    src = (
        b"def other(self, batch):\n"
        + renamed
        + b"\n\n"
        + (FIXTURES / "insert_statements" / "before.py")
        .read_bytes()
        .replace(b"self.draft_worker.draft(", b"self.drafter.draft(")
    )
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: src})
    res = api.check(tree, recipes_dir=FIXTURES / "insert_statements").plan.results[0]
    assert res.status == "drift"
    assert res.error.candidates[:2] == [
        f'{TARGET}:11: verify_input = self.drafter.draft(batch, mode="x")',
        f"{TARGET}:12: out = self.verify(batch)",
    ]
