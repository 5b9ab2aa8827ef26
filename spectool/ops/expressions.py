"""Replace or wrap every expression that matches a pattern inside a function."""

from __future__ import annotations

import ast

import libcst as cst

from .. import cstutil
from ..errors import RecipeError
from ..patterns import Pattern, parse_candidate
from .base import ALREADY, APPLIED, OpContext, Operation

# ast expression class -> libcst classes that can render to it (prefilter before parsing).
_KINDS = {
    "Call": (cst.Call,),
    "Compare": (cst.Comparison,),
    "Attribute": (cst.Attribute,),
    "Name": (cst.Name,),
    "BinOp": (cst.BinaryOperation,),
    "BoolOp": (cst.BooleanOperation,),
    "Subscript": (cst.Subscript,),
    "UnaryOp": (cst.UnaryOperation,),
    "IfExp": (cst.IfExp,),
    "Tuple": (cst.Tuple,),
    "List": (cst.List,),
    "Dict": (cst.Dict,),
    "Constant": (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString, cst.Name),
}


class ReplaceExpression(Operation):
    """``pattern`` → the expression returned by the code function; its parameters receive the
    pattern's ``$captures`` (a parameter named ``MATCH`` receives the whole match)."""

    kind = "replace_expr"
    required = {"target": str, "pattern": str, "code": str}
    optional = {"count": int, "when": str, "imports": list}

    def validate(self) -> None:
        super().validate()
        try:
            self.pattern = Pattern.parse(self.spec["pattern"], expression=True)
        except SyntaxError as exc:
            raise RecipeError(
                f"{self.where}: pattern {self.spec['pattern']!r} is not a Python expression pattern: {exc}."
            ) from None
        self.template, self.params = self.code["code"].returned_expression()
        unknown = [p for p in self.params if p != "MATCH" and p not in self.pattern.wildcards]
        if unknown:
            raise RecipeError(
                f"{self.where}: parameters {unknown} of {self.code['code']} are not "
                f"wildcards of the pattern (it has {self.pattern.wildcards})."
            )
        # The applied form, as a pattern: the template with its parameters as wildcards.
        src = cst.Module([]).code_for_node(self.template)
        tree = ast.parse(src, mode="eval").body
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in self.params:
                node.id = "__spectool_wild_" + node.id
        self.applied_pattern = Pattern(src, tree, False, self.params)

    def anchor_text(self) -> str:
        return self.spec.get("pattern", "")

    def _find(self, st, scope_node, pattern: Pattern, skip_inside: set[int] = frozenset()):
        want = _KINDS.get(type(pattern.tree).__name__)
        hits = []

        class Finder(cst.CSTVisitor):
            def on_visit(self, node):
                if id(node) in skip_inside:
                    return False
                if isinstance(node, cst.BaseExpression) and (want is None or isinstance(node, want)):
                    tree = parse_candidate(st.code(node), expression=True)
                    if tree is not None:
                        caps = pattern.match(tree)
                        if caps is not None:
                            hits.append((node, caps, st.code(node)))
                            return False
                return True

        scope_node.visit(Finder())
        return hits

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        spath = self.scope(ctx, st)
        scope_node = spath[-1]
        done = self._find(st, scope_node, self.applied_pattern)
        todo = self._find(st, scope_node, self.pattern, cstutil.collect_ids([d[0] for d in done]))
        for node, _, code in done:
            other = st.owner_in(node, ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"expression {code.strip()!r}")
        if not todo and len(done) == self.count:
            return ALREADY
        if len(todo) + len(done) != self.count or (done and todo):
            raise self.drift(
                ctx,
                st,
                f"pattern {self.anchor_text()!r} matched {len(todo)} expressions "
                f"(and {len(done)} already rewritten), expected {self.count}",
                self.nearest_statements(st, scope_node, self.anchor_text()),
            )
        mapping = {}
        for node, caps, code in todo:
            other = st.owner_in(node, ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"expression {code.strip()!r}")
            values = {}
            for name in self.params:
                if name == "MATCH":
                    values[name] = node
                else:
                    seg = ast.get_source_segment("(" + code.strip() + "\n)", caps[name])
                    values[name] = cst.parse_expression(seg) if seg else node
            new = self.template.visit(_Substitute(values))
            if isinstance(node, (cst.BooleanOperation, cst.Comparison, cst.BinaryOperation, cst.IfExp)) or isinstance(
                new, (cst.BooleanOperation, cst.IfExp)
            ):
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if not new.lpar else new
            mapping[id(node)] = new
            st.own(ctx.recipe_id, [new])
        st.module = cstutil.rebuild(spath, scope_node.visit(cstutil.ReplaceByIdentity(mapping)))
        return APPLIED


class WrapExpression(ReplaceExpression):
    """Wrap the matched expression: the code function takes one parameter, ``MATCH``."""

    kind = "wrap_expr"

    def validate(self) -> None:
        super().validate()
        if self.params != ["MATCH"]:
            raise RecipeError(f"{self.where}: {self.code['code']} must take exactly one parameter, MATCH.")


class _Substitute(cst.CSTTransformer):
    def __init__(self, values):
        super().__init__()
        self.values = values

    def leave_Name(self, original, updated):
        return self.values.get(original.value, updated)
