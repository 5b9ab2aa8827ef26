"""Operations on class members: add or replace a method, add a dataclass field."""

from __future__ import annotations

import libcst as cst

from .. import cstutil
from .base import ALREADY, APPLIED, OpContext, Operation


def _class_body(cls_node: cst.ClassDef) -> list:
    return list(cls_node.body.body)


def _def_name(stmt) -> str | None:
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return stmt.name.value
    return None


def _field_name(stmt) -> str | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
            return small.target.value
    return None


class _ClassOp(Operation):
    def class_path(self, ctx: OpContext, st):
        path = self.scope(ctx, st)
        if not isinstance(path[-1], cst.ClassDef):
            raise self.drift(ctx, st, f"{self.target.qualname} is not a class")
        return path


class AddMethod(_ClassOp):
    """Add a method to a class (``after`` places it behind a named member)."""

    kind = "add_method"
    required = {"target": str, "code": str}
    optional = {"after": str, "when": str, "imports": list}
    replace = False

    def anchor_text(self) -> str:
        return f"{self.target.qualname}.{self.code['code'].qualname.split('.')[-1]}"

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        path = self.class_path(ctx, st)
        cls_node = path[-1]
        ref = self.code["code"]
        new_def = ref.function()
        name = new_def.name.value
        body = _class_body(cls_node)
        existing = [i for i, s in enumerate(body) if _def_name(s) == name]
        if existing:
            old = body[existing[0]]
            other = st.owner_in(old, ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"method {name!r} was added or changed")
            if self.same_code(st, [old], [new_def], ref.module()):
                return ALREADY
            if not self.replace:
                raise self.drift(ctx, st, f"class already has a different method {name!r} "
                                 "(did upstream add it? then mark the variant 'upstreamed')")
            body[existing[0]] = new_def
        else:
            if self.replace:
                names = [_def_name(s) for s in body if _def_name(s)]
                raise self.drift(ctx, st, f"class has no method {name!r} to replace",
                                 [f"{st.relpath}: {self.target.qualname}.{n}" for n in names][:8])
            pos = len(body)
            after = self.spec.get("after")
            if after:
                idx = [i for i, s in enumerate(body) if _def_name(s) == after or _field_name(s) == after]
                if not idx:
                    names = [n for n in (_def_name(s) or _field_name(s) for s in body) if n]
                    import difflib

                    close = difflib.get_close_matches(after, names, n=4, cutoff=0.4)
                    moved = [f"{hit} (moved?)" for hit in ctx.tree.find_definition_elsewhere(after, st.relpath)]
                    raise self.drift(ctx, st, f"no member {after!r} to place the method after",
                                     moved + [f"{st.relpath}: {self.target.qualname}.{n}" for n in close])
                pos = idx[0] + 1
            new_def = new_def.with_changes(leading_lines=[cst.EmptyLine(indent=False)] + [
                l for l in new_def.leading_lines if l.comment is not None])
            body.insert(pos, new_def)
        st.own(ctx.recipe_id, [new_def])
        new_cls = cls_node.with_changes(body=cls_node.body.with_changes(body=tuple(body)))
        st.module = cstutil.rebuild(path, new_cls)
        return APPLIED


class ReplaceMethod(AddMethod):
    """Replace a method's whole definition (the recipe owns it afterwards)."""

    kind = "replace_method"
    replace = True


class AddField(_ClassOp):
    """Add dataclass fields after a named field; works for ``x: int = 0`` and ``x: A[int, "help"] = 0``."""

    kind = "add_field"
    required = {"target": str, "after": str, "code": str}
    optional = {"when": str}

    def anchor_text(self) -> str:
        return f"{self.target.qualname}.{self.spec['after']}"

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        path = self.class_path(ctx, st)
        cls_node = path[-1]
        ref = self.code["code"]
        new_fields = ref.body_statements()
        names = [_field_name(s) for s in new_fields]
        if None in names:
            from ..errors import RecipeError

            raise RecipeError(f"{self.where}: {ref} must contain only annotated fields 'name: type = default'.")
        body = _class_body(cls_node)
        present = {(_field_name(s)): s for s in body if _field_name(s)}
        done = [n for n in names if n in present]
        for n in done:
            other = st.owner_in(present[n], ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"field {n!r} was added")
        if done:
            if len(done) == len(names) and self.same_code(
                st, [present[n] for n in names], new_fields, ref.module()
            ):
                return ALREADY
            raise self.drift(ctx, st, f"class already has field(s) {', '.join(done)} with other code "
                             "(upstream added them? then mark the variant 'upstreamed')")
        after = self.spec["after"]
        idx = [i for i, s in enumerate(body) if _field_name(s) == after]
        if not idx:
            import difflib

            close = difflib.get_close_matches(after, list(present), n=5, cutoff=0.5)
            raise self.drift(ctx, st, f"no field {after!r} to add after",
                             [f"{st.relpath}:{st.line_of(st.code(present[c])) or '?'}: {self.target.qualname}.{c}" for c in close])
        anchor = body[idx[0]]
        other = st.owner_in(anchor, ctx.recipe_id)
        if other:
            raise self.conflict(ctx, st, other, f"field {after!r} was added")
        body[idx[0] + 1: idx[0] + 1] = new_fields
        st.own(ctx.recipe_id, new_fields)
        new_cls = cls_node.with_changes(body=cls_node.body.with_changes(body=tuple(body)))
        st.module = cstutil.rebuild(path, new_cls)
        return APPLIED
