"""Code that recipes insert lives in real .py files beside the YAML; this module loads it.

A code reference is ``FILE.py:QUALNAME``. What is taken from the definition depends on the
operation: a whole ``def`` (add_method), the statements of a function body (insert_*,
add_argument: the function is only a container whose parameters document the names the
snippet uses), the statements of a class body (add_field), or the expression a function
returns (replace_expr: parameters bind to the pattern's ``$wildcards``). A leading docstring
documents the snippet and is never inserted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst

from .cstutil import find_definition
from .errors import RecipeError

MAX_BYTES = 1 << 20
_QUALNAME_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@lru_cache(maxsize=256)
def _parse_file(path: Path, mtime_ns: int) -> cst.Module:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"recipe code file {path} cannot be read: {exc.strerror}.", file=str(path)) from None
    if len(data) > MAX_BYTES:
        raise RecipeError(f"recipe code file {path} is larger than {MAX_BYTES // 1024} KiB.", file=str(path))
    try:
        return cst.parse_module(data)
    except cst.ParserSyntaxError as exc:
        raise RecipeError(
            f"recipe code file {path} has a syntax error at line {exc.raw_line}, column "
            f"{exc.raw_column}: {exc.message}. Fix the file; nothing was changed.",
            file=str(path),
        ) from None
    except (UnicodeDecodeError, LookupError) as exc:
        raise RecipeError(
            f"recipe code file {path} cannot be decoded ({exc}); save it as UTF-8 or give it a correct "
            "coding declaration. Nothing was changed.",
            file=str(path),
        ) from None
    except Exception as exc:  # libcst's native parser on input it cannot handle at all
        raise RecipeError(
            f"recipe code file {path} cannot be parsed ({type(exc).__name__}: {str(exc)[:200]}). Nothing was changed.",
            file=str(path),
        ) from None


def _strip_docstring(stmts):
    stmts = list(stmts)
    if stmts and isinstance(stmts[0], cst.SimpleStatementLine):
        small = stmts[0].body
        if (
            len(small) == 1
            and isinstance(small[0], cst.Expr)
            and isinstance(small[0].value, (cst.SimpleString, cst.ConcatenatedString))
        ):
            stmts = stmts[1:]
    if stmts:
        # The first inserted statement must not carry the blank line that followed the docstring.
        first = stmts[0]
        lines = [line for line in first.leading_lines if line.comment is not None]
        stmts[0] = first.with_changes(leading_lines=lines)
    return stmts


@dataclass(frozen=True)
class CodeRef:
    recipe_file: Path  # the recipe.yaml that names it, for error messages
    file: Path
    qualname: str

    @classmethod
    def parse(cls, text: str, base: Path, recipe_file: Path, where: str | None = None) -> CodeRef:
        """`text` is FILE.py:QUALNAME; FILE is relative to `base` (the recipe's folder) and
        must stay inside it, symlinks resolved."""
        where = where or str(recipe_file)
        file, _, qual = text.partition(":") if isinstance(text, str) else ("", "", "")
        if not file.endswith(".py") or not _QUALNAME_RE.match(qual):
            raise RecipeError(
                f"{where}: code reference {text!r} must be 'FILE.py:QUALNAME' "
                "(a function or class in a .py file in the recipe's folder, e.g. 'code.py:Worker.twice')."
            )
        folder = base.resolve()
        path = (base / file).resolve()
        if folder not in path.parents:
            raise RecipeError(
                f"{where}: code file {file!r} (from {text!r}) is outside the recipe's folder {base}; "
                "a recipe may only use code files inside its own folder."
            )
        if not path.is_file():
            raise RecipeError(f"{where}: code file {file} (from {text!r}) does not exist in {base}.")
        return cls(recipe_file, path, qual)

    def module(self) -> cst.Module:
        return _parse_file(self.file, self.file.stat().st_mtime_ns)

    def definition(self):
        path = find_definition(self.module(), self.qualname)
        if path is None:
            raise RecipeError(f"{self.recipe_file}: {self.file.name} has no definition named {self.qualname!r}.")
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
