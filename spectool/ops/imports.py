"""Add an import at module level (after the existing top-of-file imports)."""

from __future__ import annotations

import libcst as cst

from ..errors import RecipeError
from ..patterns import normalized
from .base import ALREADY, APPLIED, OpContext, Operation


def import_statement(text: str, where: str) -> cst.SimpleStatementLine:
    try:
        stmt = cst.parse_statement(text.strip() + "\n") if isinstance(text, str) else None
    except Exception:  # ParserSyntaxError, or libcst's parser on input it cannot handle at all
        stmt = None
    if not (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))
    ):
        raise RecipeError(f"{where}: {text!r} is not an import statement.")
    return stmt


def add_import(st, text: str, where: str, recipe_id: str) -> str:
    stmt = import_statement(text, where)
    want = normalized(text)
    last = -1
    for i, s in enumerate(st.module.body):
        if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], (cst.Import, cst.ImportFrom)):
            if normalized(st.code(s)) == want:
                return ALREADY
            last = i
        elif last >= 0 and not (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr)):
            if not isinstance(s, (cst.Try, cst.If)):
                break
    body = list(st.module.body)
    body.insert(last + 1, stmt)
    st.own(recipe_id, [stmt])
    st.module = st.module.with_changes(body=tuple(body))
    return APPLIED


class AddImport(Operation):
    """``import: "from x import y"``; the target names only the module."""

    kind = "add_import"
    required = {"target": str, "import": str}
    optional = {"when": str}
    code_keys = ()

    def validate(self) -> None:
        import_statement(self.spec["import"], self.where)

    def anchor_text(self) -> str:
        return self.spec.get("import", "")

    def run(self, ctx: OpContext) -> str:
        return add_import(self.state(ctx), self.spec["import"], self.where, ctx.recipe_id)
