"""Small libcst helpers: find a definition by qualified name, walk statements, rebuild a path.

libcst trees are immutable. Every edit here replaces one node and rebuilds only the chain of
parents above it (``rebuild``), so an edit deep in an 8,000-line file touches a handful of
nodes instead of re-walking the whole module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import libcst as cst

Path = list  # [root, ..., node]: every node from the module down to the target

_BLOCK_FIELDS = ("body", "orelse", "handlers", "finalbody")


def _children_blocks(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The statement containers directly under a compound statement."""
    for name in _BLOCK_FIELDS:
        value = getattr(node, name, None)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def body_of(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """Statements of a module, a block, or a compound statement's block."""
    if isinstance(node, cst.Module):
        return node.body
    if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
        return node.body
    body = getattr(node, "body", None)
    if isinstance(body, cst.BaseSuite):
        return body.body
    return ()


def iter_statements(node: cst.CSTNode, path: Path, *, into_defs: bool = False) -> Iterator[tuple[cst.CSTNode, Path]]:
    """Every statement below node (in source order), with the path down to it."""
    containers: list[tuple[cst.CSTNode, Path]] = []
    if isinstance(node, (cst.Module, cst.IndentedBlock)):
        containers = [(node, path)]
    else:
        for child in _children_blocks(node):
            if isinstance(child, cst.BaseSuite):
                containers.append((child, path + [child]))
            else:  # ExceptHandler, Else, Finally, elif If: they own a body
                containers.append((child, path + [child]))
    for container, cpath in containers:
        if isinstance(container, (cst.Module, cst.IndentedBlock, cst.SimpleStatementSuite)):
            for stmt in container.body:
                spath = cpath + [stmt]
                yield stmt, spath
                if isinstance(stmt, cst.BaseCompoundStatement) and (
                    into_defs or not isinstance(stmt, (cst.FunctionDef, cst.ClassDef))
                ):
                    yield from iter_statements(stmt, spath, into_defs=into_defs)
        else:
            yield from iter_statements(container, cpath, into_defs=into_defs)


def find_definition(module: cst.Module, dotted: str) -> Path | None:
    """Path to the class/function named by ``Class.method`` (module-level ifs/trys included)."""
    parts = dotted.split(".") if dotted else []
    path: Path = [module]
    node: cst.CSTNode = module
    for part in parts:
        found = None
        for stmt, spath in iter_statements(node, path):
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == part:
                found = (stmt, spath)
                break
        if found is None:
            return None
        node, path = found
    return path


def replace_child(parent: cst.CSTNode, old: cst.CSTNode, new) -> cst.CSTNode:
    """parent with ``old`` (by identity) replaced by ``new`` (a node, or a list to splice)."""
    changes = {}
    for f in dataclasses.fields(parent):
        value = getattr(parent, f.name)
        if value is old:
            changes[f.name] = new
        elif isinstance(value, (list, tuple)) and any(v is old for v in value):
            out = []
            for v in value:
                if v is old:
                    out.extend(new if isinstance(new, list) else [new])
                else:
                    out.append(v)
            changes[f.name] = tuple(out)
    if not changes:
        raise ValueError("internal: child not found under parent")
    return parent.with_changes(**changes)


def rebuild(path: Path, new_leaf) -> cst.Module:
    """The root of path with its last node replaced by new_leaf."""
    new = new_leaf
    for i in range(len(path) - 1, 0, -1):
        new = replace_child(path[i - 1], path[i], new)
    return new


def all_definitions(module: cst.Module) -> list[str]:
    """Every qualified name (Class, Class.method, func) in a module, for 'did you mean'."""
    names: list[str] = []

    def walk(node, prefix):
        for stmt, _ in iter_statements(node, [node]):
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                q = prefix + stmt.name.value
                names.append(q)
                walk(stmt, q + ".")

    walk(module, "")
    return names


def collect_ids(nodes) -> set[int]:
    """ids of every node in these subtrees (used to know who inserted what)."""
    ids: set[int] = set()

    class V(cst.CSTVisitor):
        def on_visit(self, node):
            ids.add(id(node))
            return True

    for n in nodes:
        n.visit(V())
    return ids


class ReplaceByIdentity(cst.CSTTransformer):
    """Swap nodes found earlier (by identity) for their replacements."""

    def __init__(self, mapping: dict[int, cst.CSTNode]):
        super().__init__()
        self.mapping = mapping

    def on_leave(self, original_node, updated_node):
        return self.mapping.get(id(original_node), updated_node)
