"""Helpers for testing patched SGLang code without importing SGLang (which needs a GPU stack).

``load_function`` compiles one function of a (patched) source file into a namespace the test
provides, so a recipe's code is called as SGLang would call it, with the surroundings it
reads (device capability, environment, collaborators) simulated explicitly.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path


def function_source(path: Path, qualname: str) -> str:
    src = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(src)
    node = tree
    for part in qualname.split("."):
        found = None
        for child in ast.walk(node) if node is tree else node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child
                break
        if found is None:
            raise KeyError(f"{qualname} not found in {path}")
        node = found
    seg = ast.get_source_segment(src, node)
    if node.decorator_list:
        first = node.decorator_list[0]
        lines = src.splitlines()
        seg = "\n".join(lines[first.lineno - 1 : node.end_lineno])
    return textwrap.dedent(seg)


def load_function(path: Path, qualname: str, namespace: dict):
    """The function `qualname` of file `path`, with `namespace` as its globals."""
    ns = dict(namespace)
    exec(compile(function_source(path, qualname), f"{path}:{qualname}", "exec"), ns)
    return ns[qualname.split(".")[-1]]


def bind_methods(path: Path, cls: str, namespace: dict, obj, *names: str):
    """The methods `cls.NAME` of file `path`, bound to `obj` (a simulated instance): the code
    under test calls them as methods of its own object."""
    for name in names:
        fn = load_function(path, f"{cls}.{name}", namespace)
        setattr(obj, name, lambda *a, _fn=fn: _fn(obj, *a))
