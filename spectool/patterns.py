"""Code patterns with wildcards, matched structurally (formatting and comments ignored).

A pattern is ordinary Python with two kinds of holes:

* ``$NAME`` matches any expression (or name) and captures it; the same ``$NAME`` twice
  must match equal code; ``$_`` matches anything without capturing.
* ``...`` matches any run of call arguments, list items or statements:
  ``self.draft_worker.draft(...)`` matches the call whatever its arguments, and a
  compound pattern ``if self.speculative_adaptive:\n    ...`` matches the header only.

Matching is done on Python's ``ast`` of the candidate's code, so whitespace, comments and
line breaks never make an anchor drift; renamed names and changed calls do.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

WILD = "__spectool_wild_"
_WILD_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_IGNORED_FIELDS = {"ctx", "type_comment", "kind", "lineno", "col_offset", "end_lineno", "end_col_offset"}


def _prepare(text: str) -> str:
    return _WILD_RE.sub(lambda m: WILD + m.group(1), text.strip("\n"))


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


@dataclass
class Pattern:
    """A parsed pattern: a single statement or a single expression."""

    text: str
    tree: ast.AST
    is_statement: bool
    wildcards: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str, *, expression: bool | None = None) -> Pattern:
        """SyntaxError for anything that is not one statement or expression (null bytes and
        nesting too deep for the parser included)."""
        try:
            return cls._parse(text, expression)
        except (ValueError, RecursionError, MemoryError) as exc:
            raise SyntaxError(f"cannot be parsed ({type(exc).__name__}: {str(exc)[:100]})") from None

    @classmethod
    def _parse(cls, text: str, expression: bool | None) -> Pattern:
        src = _prepare(_dedent(text))
        wild = _WILD_RE.findall(text)
        if expression is not False:
            try:
                return cls(text, ast.parse(src, mode="eval").body, False, wild)
            except SyntaxError:
                if expression:
                    raise
        mod = ast.parse(src, mode="exec")
        if len(mod.body) != 1:
            raise SyntaxError(f"a pattern must be one statement, got {len(mod.body)}")
        return cls(text, mod.body[0], True, wild)

    def match(self, node: ast.AST) -> dict[str, ast.AST] | None:
        caps: dict[str, ast.AST] = {}
        return caps if _match(self.tree, node, caps) else None


def is_ellipsis(node) -> bool:
    """`...` as an expression or an expression statement: the pattern wildcard for 'any run'."""
    if isinstance(node, ast.Expr):
        node = node.value
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _wild_name(node) -> str | None:
    if isinstance(node, ast.Name) and node.id.startswith(WILD):
        return node.id[len(WILD) :]
    if isinstance(node, ast.Expr):
        return _wild_name(node.value)
    return None


def _match(pat, node, caps) -> bool:
    name = _wild_name(pat)
    if name is not None and not isinstance(pat, ast.Expr):
        if name == "_":
            return True
        if name in caps:
            return ast.dump(caps[name]) == ast.dump(node)
        caps[name] = node
        return True
    if type(pat) is not type(node):
        return False
    if isinstance(pat, ast.AST):
        for fname in pat._fields:
            if fname in _IGNORED_FIELDS:
                continue
            pv, nv = getattr(pat, fname, None), getattr(node, fname, None)
            if isinstance(pat, ast.Call) and fname == "keywords" and any(is_ellipsis(a) for a in pat.args):
                # f(..., k=v) : the named keywords must be present, others may be too.
                if not _keywords_subset(pv, nv, caps):
                    return False
                continue
            if isinstance(pv, list):
                if not isinstance(nv, list) or not _match_list(pv, nv, caps):
                    return False
            elif isinstance(pv, ast.AST):
                if not isinstance(nv, ast.AST) or not _match(pv, nv, caps):
                    return False
            elif pv != nv:
                return False
        return True
    return pat == node


def _keywords_subset(pkw, nkw, caps) -> bool:
    by_name = {k.arg: k for k in nkw}
    for k in pkw:
        if k.arg not in by_name or not _match(k.value, by_name[k.arg].value, caps):
            return False
    return True


def _match_list(pats: list, nodes: list, caps) -> bool:
    if not pats:
        return not nodes
    head, rest = pats[0], pats[1:]
    if is_ellipsis(head):
        for i in range(len(nodes), -1, -1):
            trial = dict(caps)
            if _match_list(rest, nodes[i:], trial):
                caps.clear()
                caps.update(trial)
                return True
        return False
    if not nodes:
        return False
    trial = dict(caps)
    if _match(head, nodes[0], trial) and _match_list(rest, nodes[1:], trial):
        caps.clear()
        caps.update(trial)
        return True
    return False


def parse_candidate(code: str, *, expression: bool) -> ast.AST | None:
    """The ast of one candidate node's code (None when it is not standalone Python)."""
    try:
        if expression:
            return ast.parse("(" + code.strip() + "\n)", mode="eval").body
        body = ast.parse(_dedent(code)).body
        return body[0] if len(body) == 1 else None
    except SyntaxError:
        return None


def normalized(code: str) -> str:
    """A formatting-independent fingerprint of some code (for 'already applied' checks)."""
    try:
        return ast.dump(ast.parse(_dedent(code)))
    except SyntaxError:
        return code.strip()
