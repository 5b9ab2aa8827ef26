"""Helpers for testing patched SGLang code without importing SGLang (which needs a GPU stack).

``load_function`` compiles one function of a (patched) source file into a namespace the test
provides, so a recipe's code is called as SGLang would call it, with the surroundings it
reads (device capability, environment, collaborators) simulated explicitly.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# The parser's lines: split at \r\n, \r and \n only (not at form feeds), ends kept.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass
class ParsedSource:
    """A Python file's text, its lines and its syntax tree (shared: read it, never modify it)."""

    text: str
    lines: list[str]
    tree: ast.Module
    definitions: dict[str, ast.AST] = field(default_factory=dict)  # name -> first def in ast.walk order

    def definition(self, name: str):
        if not self.definitions:
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.definitions.setdefault(node.name, node)
        return self.definitions.get(name)

    def segment(self, node) -> str:
        """The node's source, as ast.get_source_segment gives it (offsets are in UTF-8 bytes)."""
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return self.lines[first].encode()[node.col_offset : node.end_col_offset].decode()
        head = self.lines[first].encode()[node.col_offset :].decode()
        tail = self.lines[last].encode()[: node.end_col_offset].decode()
        return "".join([head, *self.lines[first + 1 : last], tail])


_PARSED: dict[tuple, ParsedSource] = {}
_PARSED_MAX = 96


def parsed_source(path: Path) -> ParsedSource:
    """The file parsed once while it is unchanged: known by inode, size and modification time,
    so the hard-linked copies of one release share a parse and a replaced file is parsed again.
    Tests load many functions of a few large release files."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _PARSED.get(key)
    if hit is None:
        text = Path(path).read_text(encoding="utf-8")
        hit = ParsedSource(text, _LINE.findall(text), ast.parse(text))
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[key] = hit
    return hit


def function_source(path: Path, qualname: str) -> str:
    src = parsed_source(path)
    node = None
    for part in qualname.split("."):
        if node is None:
            found = src.definition(part)
        else:
            found = next(
                (
                    child
                    for child in node.body
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part
                ),
                None,
            )
        if found is None:
            raise KeyError(f"{qualname} not found in {path}")
        node = found
    if node.decorator_list:
        first = node.decorator_list[0]
        seg = "\n".join(line.rstrip("\r\n") for line in src.lines[first.lineno - 1 : node.end_lineno])
    else:
        seg = src.segment(node)
    return textwrap.dedent(seg)


def load_function(path: Path, qualname: str, namespace: dict):
    """The function `qualname` of file `path`, with `namespace` as its globals."""
    ns = dict(namespace)
    exec(compiled(function_source(path, qualname), f"{path}:{qualname}"), ns)
    return ns[qualname.split(".")[-1]]


@functools.lru_cache(maxsize=1024)
def compiled(source: str, filename: str, flags: int = 0):
    """`source` compiled once: tests define the same release functions and classes in many
    namespaces, and a code object serves every one of them."""
    return compile(source, filename, "exec", flags=flags, dont_inherit=bool(flags))


def bind_methods(path: Path, cls: str, namespace: dict, obj, *names: str):
    """The methods `cls.NAME` of file `path`, bound to `obj` (a simulated instance): the code
    under test calls them as methods of its own object."""
    for name in names:
        fn = load_function(path, f"{cls}.{name}", namespace)
        setattr(obj, name, lambda *a, _fn=fn: _fn(obj, *a))
