"""Code that recipes insert lives in real .py files beside the YAML; this module loads it.

A code reference is ``FILE.py:QUALNAME``. What is taken from the definition depends on the
operation: a whole ``def`` (add_method), the statements of a function body (insert_*,
add_argument: the function is only a container whose parameters document the names the
snippet uses), the statements of a class body (add_field), or the expression a function
returns (replace_expr: parameters bind to the pattern's ``$wildcards``). A leading docstring
documents the snippet and is never inserted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst

from .cstutil import find_definition
from .errors import RecipeError


@lru_cache(maxsize=256)
def _parse_file(path: Path, mtime_ns: int) -> cst.Module:
    try:
        return cst.parse_module(path.read_bytes())
    except cst.ParserSyntaxError as exc:
        raise RecipeError(
            f"recipe code file {path} has a syntax error at line {exc.raw_line}, column "
            f"{exc.raw_column}: {exc.message}. Fix the file; nothing was changed.",
            file=str(path),
        ) from None


def _strip_docstring(stmts):
    stmts = list(stmts)
    if stmts and isinstance(stmts[0], cst.SimpleStatementLine):
        small = stmts[0].body
        if len(small) == 1 and isinstance(small[0], cst.Expr) and isinstance(small[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            stmts = stmts[1:]
    if stmts:
        # The first inserted statement must not carry the blank line that followed the docstring.
        first = stmts[0]
        lines = [l for l in first.leading_lines if l.comment is not None]
        stmts[0] = first.with_changes(leading_lines=lines)
    return stmts


@dataclass(frozen=True)
class CodeRef:
    recipe_file: Path  # the recipe.yaml that names it, for error messages
    file: Path
    qualname: str

    @classmethod
    def parse(cls, text: str, base: Path, recipe_file: Path) -> "CodeRef":
        if not isinstance(text, str) or ":" not in text:
            raise RecipeError(
                f"{recipe_file}: code reference {text!r} must be 'FILE.py:QUALNAME' "
                "(a function or class in a .py file beside the recipe)."
            )
        file, qual = text.split(":", 1)
        path = (base / file).resolve()
        if not path.is_file():
            raise RecipeError(f"{recipe_file}: code file {file} (from {text!r}) does not exist in {base}.")
        return cls(recipe_file, path, qual)

    def module(self) -> cst.Module:
        return _parse_file(self.file, self.file.stat().st_mtime_ns)

    def definition(self):
        path = find_definition(self.module(), self.qualname)
        if path is None:
            raise RecipeError(
                f"{self.recipe_file}: {self.file.name} has no definition named {self.qualname!r}."
            )
        return path[-1]

    def function(self) -> cst.FunctionDef:
        node = self.definition()
        if not isinstance(node, cst.FunctionDef):
            raise RecipeError(f"{self.recipe_file}: {self.file.name}:{self.qualname} must be a function.")
        return node

    def body_statements(self) -> list[cst.BaseStatement]:
        node = self.definition()
        return _strip_docstring(node.body.body)

    def returned_expression(self) -> tuple[cst.BaseExpression, list[str]]:
        fn = self.function()
        stmts = _strip_docstring(fn.body.body)
        ok = (
            len(stmts) == 1
            and isinstance(stmts[0], cst.SimpleStatementLine)
            and len(stmts[0].body) == 1
            and isinstance(stmts[0].body[0], cst.Return)
            and stmts[0].body[0].value is not None
        )
        if not ok:
            raise RecipeError(
                f"{self.recipe_file}: {self.file.name}:{self.qualname} must be a function whose "
                "body is a single 'return EXPRESSION' (its parameters bind to the pattern's $wildcards)."
            )
        params = [p.name.value for p in fn.params.params]
        return stmts[0].body[0].value, params

    def __str__(self) -> str:
        return f"{self.file.name}:{self.qualname}"
