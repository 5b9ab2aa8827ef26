"""The undefined-name check: pyflakes on the file before and after, report what is new."""

from __future__ import annotations

import ast

from pyflakes import checker, messages


def _undefined(source: bytes, filename: str) -> set[str]:
    tree = ast.parse(source, filename=filename)
    w = checker.Checker(tree, filename=filename)
    return {m.message_args[0] for m in w.messages if isinstance(m, messages.UndefinedName)}


def new_undefined_names(before: bytes, after: bytes, filename: str) -> list[str]:
    try:
        old = _undefined(before, filename)
    except SyntaxError:
        old = set()
    return sorted(_undefined(after, filename) - old)
