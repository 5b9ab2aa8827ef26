"""Insert statements before or after an anchor statement inside a function."""

from __future__ import annotations

import libcst as cst

from .. import cstutil
from ..errors import RecipeError
from ..patterns import Pattern, is_ellipsis, parse_candidate
from .base import ALREADY, APPLIED, OpContext, Operation

_COMPOUND = {
    "If": cst.If,
    "For": cst.For,
    "While": cst.While,
    "With": cst.With,
    "Try": cst.Try,
    "FunctionDef": cst.FunctionDef,
    "AsyncFunctionDef": cst.FunctionDef,
    "ClassDef": cst.ClassDef,
}


def statement_matches(st, scope_node, pattern: Pattern) -> list[cstutil.Path]:
    """Paths of the statements under scope_node that match pattern (compound statements are
    compared by their header: the pattern's body is ``...``)."""
    want = type(pattern.tree).__name__
    kind = _COMPOUND.get(want)
    body = getattr(pattern.tree, "body", None)
    header_only = isinstance(body, list) and len(body) == 1 and is_ellipsis(body[0])
    found = []
    for stmt, path in cstutil.iter_statements(scope_node, [scope_node]):
        if kind is not None and not header_only:
            if not isinstance(stmt, kind):
                continue
            code = st.code(stmt)  # the pattern spells out (part of) the body: compare it all
        elif kind is not None:
            if not isinstance(stmt, kind):
                continue
            head = stmt.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Expr(cst.Ellipsis())])]))
            if hasattr(head, "orelse"):
                head = head.with_changes(orelse=None)
            if isinstance(head, cst.Try):
                head = head.with_changes(handlers=(), finalbody=cst.Finally(body=head.body))
            code = st.module.code_for_node(head)
        elif isinstance(stmt, cst.SimpleStatementLine):
            code = st.code(stmt)
        else:
            continue
        node = parse_candidate(code, expression=False)
        if node is not None and pattern.match(node) is not None:
            found.append(path)
    return found


class InsertStatements(Operation):
    """Insert the body of a code function next to each statement matching ``anchor``."""

    kind = "insert_after"
    required = {"target": str, "anchor": str, "code": str}
    optional = {"count": int, "when": str, "imports": list}
    before = False

    def validate(self) -> None:
        super().validate()
        try:
            self.pattern = Pattern.parse(self.spec["anchor"], expression=False)
        except SyntaxError as exc:
            raise RecipeError(
                f"{self.where}: anchor {self.spec['anchor']!r} is not a Python statement pattern: {exc}."
            ) from None

    def anchor_text(self) -> str:
        return self.spec.get("anchor", "")

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        spath = self.scope(ctx, st)
        scope_node = spath[-1]
        hits = statement_matches(st, scope_node, self.pattern)
        if len(hits) != self.count:
            what = f"anchor {self.anchor_text()!r} matched {len(hits)} statements, expected {self.count}"
            raise self.drift(ctx, st, what, self.nearest_statements(st, scope_node, self.anchor_text()))
        ref = self.code["code"]
        new = ref.body_statements()
        applied = False
        side = "before" if self.before else "after"
        # Insert from the last hit to the first, re-locating after each edit (paths go stale).
        for k in range(len(hits) - 1, -1, -1):
            spath = cstutil.find_definition(st.module, self.target.qualname)
            hit = statement_matches(st, spath[-1], self.pattern)[k]
            stmt, block = hit[-1], hit[-2]
            other = st.owner_in(stmt, ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"anchor {self.anchor_text()!r} matches code")
            queued = self.queued_at(ctx, st, stmt, side)
            body = list(cstutil.body_of(block))
            i = next(j for j, s in enumerate(body) if s is stmt)
            at = i - queued if self.before else i + 1 + queued
            lo, hi = (at - len(new), at) if self.before else (at, at + len(new))
            if lo >= 0 and hi <= len(body) and self.same_code(st, body[lo:hi], new, ref.module()):
                for node in body[lo:hi]:
                    other = st.owner_in(node, ctx.recipe_id)
                    if other:
                        raise self.conflict(ctx, st, other, "the same statements were inserted")
                st.own(ctx.recipe_id, body[lo:hi])
                self.mark_inserted(ctx, st, stmt, side, body[lo:hi])
                continue
            body[at:at] = new
            st.own(ctx.recipe_id, new)
            self.mark_inserted(ctx, st, stmt, side, new)
            st.module = cstutil.rebuild(spath + hit[1:-1], _with_body(block, body))
            applied = True
        return APPLIED if applied else ALREADY


class InsertBefore(InsertStatements):
    kind = "insert_before"
    before = True


class InsertAfter(InsertStatements):
    kind = "insert_after"


class AddArgument(InsertStatements):
    """Add argparse ``add_argument`` calls right after the one that defines ``after_flag``."""

    kind = "add_argument"
    required = {"target": str, "after_flag": str, "code": str}
    optional = {"when": str}

    def validate(self) -> None:
        Operation.validate(self)
        flags = []
        for stmt in self.code["code"].body_statements():
            flag = _flag_of(stmt)
            if flag is None:
                raise RecipeError(
                    f"{self.where}: {self.code['code']} must hold only parser.add_argument('--flag', ...) calls."
                )
            flags.append(flag)
        self.flags = flags

    def anchor_text(self) -> str:
        return f"parser.add_argument({self.spec.get('after_flag')!r}, ...)"

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        spath = self.scope(ctx, st)
        scope_node = spath[-1]
        by_flag = {}
        for stmt, path in cstutil.iter_statements(scope_node, [scope_node]):
            flag = _flag_of(stmt)
            if flag:
                by_flag.setdefault(flag, path)
        ref = self.code["code"]
        new = ref.body_statements()
        present = [f for f in self.flags if f in by_flag]
        after = self.spec["after_flag"]
        if present:
            olds = [by_flag[f][-1] for f in self.flags if f in by_flag]
            if len(present) == len(self.flags) and self.same_code(st, olds, new, ref.module()):
                if after in by_flag:
                    self.queued_at(ctx, st, by_flag[after][-1], "after")
                    self.mark_inserted(ctx, st, by_flag[after][-1], "after", olds)
                st.own(ctx.recipe_id, olds)
                return ALREADY
            raise self.drift(
                ctx,
                st,
                f"flag(s) {', '.join(present)} already defined with other code "
                "(upstream added them? then mark the variant 'upstreamed')",
            )
        if after not in by_flag:
            import difflib

            close = difflib.get_close_matches(after, list(by_flag), n=5, cutoff=0.6)
            raise self.drift(
                ctx,
                st,
                f"no add_argument call for {after!r}",
                [f"{st.relpath}:{st.line_of(by_flag[c][-1]) or '?'}: {c}" for c in close],
            )
        hit = by_flag[after]
        stmt, block = hit[-1], hit[-2]
        body = list(cstutil.body_of(block))
        at = next(k for k, s in enumerate(body) if s is stmt) + 1 + self.queued_at(ctx, st, stmt, "after")
        body[at:at] = new
        st.own(ctx.recipe_id, new)
        self.mark_inserted(ctx, st, stmt, "after", new)
        st.module = cstutil.rebuild(spath + hit[1:-1], _with_body(block, body))
        return APPLIED


def _flag_of(stmt) -> str | None:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return None
    call = stmt.body[0].value
    if not (
        isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"
    ):
        return None
    for arg in call.args:
        if arg.keyword is None and isinstance(arg.value, cst.SimpleString):
            value = arg.value.evaluated_value
            if isinstance(value, str) and value.startswith("--"):
                return value
    return None


def _with_body(block, body):
    return block.with_changes(body=tuple(body))
