"""The fallback's per-step code never makes the CPU wait for the GPU.

SGLang's overlap scheduler prepares the next batch and processes the previous one's results
while the GPU runs; a host sync inside a step serialises them (a blocking `.to(device)` of a
CPU tensor is a copy, then a stream sync). This scans the recipe code that runs per step for
the calls that wait: `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `synchronize()`, a `.to()`
towards a device without `non_blocking=True`, and `torch.tensor(..., device=...)`.
Start-up code (graph capture, init) may wait."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
CODE = sorted((RECIPES / "spec-fallback").rglob("*.py"))
STARTUP = re.compile(r"init|build|capture|unsupported|plain_attn_backend|publish_stats")
WAITS = {"item", "tolist", "cpu", "numpy", "synchronize"}


def host_waits(fn: ast.AST) -> list[str]:
    """The calls in `fn` (not in start-up functions nested in it) that make the host wait."""
    found = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and STARTUP.search(child.name):
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                name, text = child.func.attr, ast.unparse(child)
                blocking = not any(k.arg == "non_blocking" and ast.unparse(k.value) == "True" for k in child.keywords)
                towards_device = any(
                    "device" in ast.unparse(a) for a in [*child.args, *(k.value for k in child.keywords)]
                )
                if name in WAITS:
                    found.append(text)
                elif name == "to" and towards_device and blocking:
                    found.append(text)
                elif text.startswith("torch.tensor(") and any(k.arg == "device" for k in child.keywords):
                    found.append(text)
            visit(child)

    visit(fn)
    return found


def per_step_functions():
    for path in CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and not STARTUP.search(node.name):
                yield path, node


def test_the_scan_sees_the_recipe_code():
    names = {fn.name for _, fn in per_step_functions()}
    assert {
        "_spec_fallback_draft_prefill",
        "_spec_fallback_decode",
        "_spec_fallback_kv_only_write",
        "_spec_fallback_should_run",
        "record_step",
        "count",
    } <= names
    assert "_spec_fallback_build_kv_only_graphs" not in names, "start-up code may synchronise"


@pytest.mark.parametrize(
    "path,fn", [pytest.param(p, f, id=f"{p.parent.name}/{p.name}:{f.name}") for p, f in per_step_functions()]
)
def test_per_step_code_does_not_wait_for_the_gpu(path, fn):
    assert host_waits(fn) == [], f"{path.relative_to(RECIPES)}:{fn.lineno} {fn.name} waits for the GPU"


def test_the_scan_flags_every_kind_of_wait():
    """A blocking copy towards the device and the other kinds of wait; not their
    non-blocking forms, nor start-up code nested in a step."""
    bad = """
def step(self, ids, ends, lens, t):
    shifted[ends.to(ids.device)] = t
    n = t.sum().item()
    x = torch.tensor(lens, device=self.device)
    torch.cuda.synchronize()
"""
    good = """
def step(self, ids, ends, t):
    shifted[ends.to(ids.device, non_blocking=True)] = t.to(ids.dtype)
    def capture():
        torch.cuda.synchronize()
"""
    assert host_waits(ast.parse(bad)) == [
        "ends.to(ids.device)",
        "t.sum().item()",
        "torch.tensor(lens, device=self.device)",
        "torch.cuda.synchronize()",
    ]
    assert host_waits(ast.parse(good)) == []
