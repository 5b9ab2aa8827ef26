"""Operations on definitions: add or replace methods, add dataclass fields, add a top-level
class or function to a module."""

from __future__ import annotations

import difflib

import libcst as cst

from .. import cstutil
from ..errors import RecipeError
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


def _is_docstring(stmt) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _with_blank_lines(node, n: int):
    """node with `n` blank lines before it (and the comment lines it had there)."""
    comments = [line for line in node.leading_lines if line.comment is not None]
    return node.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * n + comments)


class _ClassOp(Operation):
    def class_path(self, ctx: OpContext, st):
        path = self.scope(ctx, st)
        if not isinstance(path[-1], cst.ClassDef):
            raise self.drift(ctx, st, f"{self.target.qualname} is not a class")
        return path


class AddMethod(_ClassOp):
    """Add methods to a class, placed after the member named by ``after`` (else at the end).

    ``code`` names one function (``worker.py:Worker.step``) or a class (``worker.py:Worker``,
    whose body holds only methods and perhaps a docstring). A class adds all of its methods
    in source order, one after the other: a recipe lists one operation for a unit of methods
    instead of one per method, each placed after the one before. A method already there with
    the same code is left as it is, so a second apply changes nothing; one there with other
    code is drift, one that another recipe added is a conflict."""

    kind = "add_method"
    required = {"target": str, "code": str}
    optional = {"after": str, "when": str, "imports": list}
    replace = False
    _adding: str | None = None  # the method being added, for drift reports

    def validate(self) -> None:
        super().validate()
        self.methods()

    def methods(self) -> list[cst.FunctionDef]:
        """The definitions to add: the function `code` names, or every method of its class."""
        ref = self.code["code"]
        node = ref.definition()
        if isinstance(node, cst.FunctionDef):
            return [node]
        if isinstance(node, cst.ClassDef) and not self.replace:
            body = _class_body(node)
            if body and _is_docstring(body[0]):
                body = body[1:]
            others = [s for s in body if not isinstance(s, cst.FunctionDef)]
            if others or not body:
                raise RecipeError(
                    f"{self.where}: {ref} is a class, so it must hold only methods (and perhaps a "
                    "docstring): add_method adds each of them. Move other statements elsewhere."
                )
            return body
        what = "a function" if self.replace else "a function, or a class of methods"
        raise RecipeError(f"{self.where}: {ref} must be {what}.")

    def anchor_text(self) -> str:
        name = self._adding or self.code["code"].qualname.split(".")[-1]
        return f"{self.target.qualname}.{name}"

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        statuses = []
        after = self.spec.get("after")
        for new_def in self.methods():
            self._adding = new_def.name.value
            try:
                statuses.append(self._add(ctx, st, new_def, after))
            finally:
                self._adding = None
            after = new_def.name.value
        return APPLIED if APPLIED in statuses else ALREADY

    def _add(self, ctx: OpContext, st, new_def: cst.FunctionDef, after: str | None) -> str:
        path = self.class_path(ctx, st)
        cls_node = path[-1]
        ref = self.code["code"]
        name = new_def.name.value
        body = _class_body(cls_node)
        existing = [i for i, s in enumerate(body) if _def_name(s) == name]
        anchors = [s for s in body if after and (_def_name(s) == after or _field_name(s) == after)]
        key = ("member", self.target.qualname, after)  # the class is rebuilt by every edit: name it
        if existing:
            old = body[existing[0]]
            other = st.owner_in(old, ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"method {name!r} was added or changed")
            if self.same_code(st, [old], [new_def], ref.module()):
                if anchors and not self.replace:  # in place: it holds its spot at the anchor
                    self.queued_at(ctx, st, key, "after")
                    self.mark_inserted(ctx, st, key, "after", [old])
                st.own(ctx.recipe_id, [old])
                return ALREADY
            if not self.replace:
                raise self.drift(
                    ctx,
                    st,
                    f"class already has a different method {name!r} "
                    "(did upstream add it? then mark the variant 'upstreamed')",
                )
            body[existing[0]] = new_def
        else:
            if self.replace:
                names = [_def_name(s) for s in body if _def_name(s)]
                raise self.drift(
                    ctx,
                    st,
                    f"class has no method {name!r} to replace",
                    [f"{st.relpath}: {self.target.qualname}.{n}" for n in names][:8],
                )
            pos = len(body)
            if after:
                idx = [i for i, s in enumerate(body) if _def_name(s) == after or _field_name(s) == after]
                if not idx:
                    names = [n for n in (_def_name(s) or _field_name(s) for s in body) if n]
                    close = difflib.get_close_matches(after, names, n=4, cutoff=0.4)
                    moved = [f"{hit} (moved?)" for hit in ctx.tree.find_definition_elsewhere(after, st.relpath)]
                    raise self.drift(
                        ctx,
                        st,
                        f"no member {after!r} to place the method after",
                        moved + [f"{st.relpath}: {self.target.qualname}.{n}" for n in close],
                    )
                pos = idx[0] + 1 + self.queued_at(ctx, st, key, "after")
            new_def = _with_blank_lines(new_def, 1)
            body.insert(pos, new_def)
            if after:
                self.mark_inserted(ctx, st, key, "after", [new_def])
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
            raise RecipeError(f"{self.where}: {ref} must contain only annotated fields 'name: type = default'.")
        body = _class_body(cls_node)
        present = {(_field_name(s)): s for s in body if _field_name(s)}
        done = [n for n in names if n in present]
        for n in done:
            other = st.owner_in(present[n], ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"field {n!r} was added")
        if done:
            if len(done) == len(names) and self.same_code(st, [present[n] for n in names], new_fields, ref.module()):
                found = [present[n] for n in names]
                if self.spec["after"] in present:  # in place: they hold their spot at the anchor
                    key = ("member", self.target.qualname, self.spec["after"])
                    self.queued_at(ctx, st, key, "after")
                    self.mark_inserted(ctx, st, key, "after", found)
                st.own(ctx.recipe_id, found)
                return ALREADY
            raise self.drift(
                ctx,
                st,
                f"class already has field(s) {', '.join(done)} with other code "
                "(upstream added them? then mark the variant 'upstreamed')",
            )
        after = self.spec["after"]
        idx = [i for i, s in enumerate(body) if _field_name(s) == after]
        if not idx:
            close = difflib.get_close_matches(after, list(present), n=5, cutoff=0.5)
            raise self.drift(
                ctx,
                st,
                f"no field {after!r} to add after",
                [f"{st.relpath}:{st.line_of(present[c]) or '?'}: {self.target.qualname}.{c}" for c in close],
            )
        anchor = body[idx[0]]
        other = st.owner_in(anchor, ctx.recipe_id)
        if other:
            raise self.conflict(ctx, st, other, f"field {after!r} was added")
        key = ("member", self.target.qualname, after)  # the class is rebuilt by every edit: name it
        at = idx[0] + 1 + self.queued_at(ctx, st, key, "after")
        body[at:at] = new_fields
        st.own(ctx.recipe_id, new_fields)
        self.mark_inserted(ctx, st, key, "after", new_fields)
        new_cls = cls_node.with_changes(body=cls_node.body.with_changes(body=tuple(body)))
        st.module = cstutil.rebuild(path, new_cls)
        return APPLIED


class AddDefinition(Operation):
    """Add a top-level class or function to a module, placed right ``before`` or ``after`` a
    named top-level definition: for instance a dataclass that inserted methods use, or a
    helper that an inserted flag names as its argparse ``type``. ``target`` names the module
    alone (``sglang.srt.server_args``), ``code`` a top-level class or function (decorators
    included). A definition of that name already there with the same code is left as it is;
    with other code it is drift, added by another recipe a conflict."""

    kind = "add_definition"
    required = {"target": str, "code": str}
    optional = {"before": str, "after": str, "when": str, "imports": list}

    def validate(self) -> None:
        super().validate()
        if self.target.qualname:
            raise RecipeError(
                f"{self.where}: add_definition adds to a module: 'target' must name the module "
                f"alone ({self.target.module!r}), not {str(self.target)!r}."
            )
        if ("before" in self.spec) == ("after" in self.spec):
            raise RecipeError(
                f"{self.where}: add_definition needs exactly one of 'before' or 'after' "
                "(a top-level class or function of the target module)."
            )
        ref = self.code["code"]
        if "." in ref.qualname or not isinstance(ref.definition(), (cst.ClassDef, cst.FunctionDef)):
            raise RecipeError(f"{self.where}: {ref} must be a top-level class or function of its file.")

    def anchor_text(self) -> str:
        where = "before" if "before" in self.spec else "after"
        return f"{self.code['code'].qualname} {where} {self.spec.get(where)}"

    def run(self, ctx: OpContext) -> str:
        st = self.state(ctx)
        ref = self.code["code"]
        new = ref.definition()
        name = new.name.value
        body = list(st.module.body)
        existing = [s for s in body if _def_name(s) == name]
        if existing:
            other = st.owner_in(existing[0], ctx.recipe_id)
            if other:
                raise self.conflict(ctx, st, other, f"definition {name!r} was added")
            if self.same_code(st, existing[:1], [new], ref.module()):
                side = "before" if "before" in self.spec else "after"
                if any(_def_name(s) == self.spec[side] for s in body):  # in place: it holds its spot
                    self.queued_at(ctx, st, ("definition", self.spec[side]), side)
                    self.mark_inserted(ctx, st, ("definition", self.spec[side]), side, existing[:1])
                st.own(ctx.recipe_id, existing[:1])
                return ALREADY
            raise self.drift(
                ctx,
                st,
                f"module already has a different definition {name!r} "
                "(did upstream add it? then mark the variant 'upstreamed')",
            )
        before = "before" in self.spec
        anchor = self.spec["before" if before else "after"]
        idx = [i for i, s in enumerate(body) if _def_name(s) == anchor]
        if not idx:
            names = [n for n in map(_def_name, body) if n]
            close = difflib.get_close_matches(anchor, names, n=4, cutoff=0.4)
            moved = [f"{hit} (moved?)" for hit in ctx.tree.find_definition_elsewhere(anchor, st.relpath)]
            raise self.drift(
                ctx,
                st,
                f"no top-level definition {anchor!r} to place {name!r} {'before' if before else 'after'}",
                moved + [f"{st.relpath}: {n}" for n in close],
            )
        new = _with_blank_lines(new, 2)
        side, key = ("before" if before else "after"), ("definition", anchor)  # rebuilt by edits: named
        queued = self.queued_at(ctx, st, key, side)
        body.insert(idx[0] - queued if before else idx[0] + 1 + queued, new)
        st.own(ctx.recipe_id, [new])
        self.mark_inserted(ctx, st, key, side, [new])
        st.module = st.module.with_changes(body=tuple(body))
        return APPLIED
