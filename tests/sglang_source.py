"""Real classes of a (patched) release's source, without importing SGLang (which needs its GPU
stack): ServerArgs itself, an instance with the release's defaults, the flags the
spec-disable-threshold recipe adds to add_cli_args in a real argparse parser, and the
fallback's SpecFallbackState."""

from __future__ import annotations
import __future__

import argparse
import ast
import collections
import dataclasses
import functools
import json
import os
import threading
import time
import typing
from pathlib import Path

from spectool.testing import function_source, load_function

ARGS = "sglang/srt/server_args.py"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
PREFIX = "--speculative-disable-"


def server_args_class(tree: Path, namespace: dict) -> type:
    """The release's ServerArgs dataclass, its methods' globals `namespace` (the names they
    read) plus the module's constants; annotations stay strings, as in the release."""
    path = tree / ARGS
    ns = {"dataclasses": dataclasses, "is_hip": lambda: False, "cached_property": functools.cached_property,
          **{name: getattr(typing, name) for name in typing.__all__}, **namespace}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):  # the CHOICES lists and other constants
            try:
                exec(compile(ast.Module([node], []), str(path), "exec"), ns)
            except NameError:  # built from an import: no field default reads those
                pass
    src = function_source(path, "ServerArgs")
    exec(compile(src, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True), ns)
    return ns["ServerArgs"]


def server_args(cls: type, **values):
    """An instance of the real `cls` holding its defaults and `values`, without
    __post_init__ (which probes the machine)."""
    args = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            setattr(args, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            setattr(args, f.name, f.default_factory())
        else:
            setattr(args, f.name, None)
    for name, value in values.items():
        if not hasattr(args, name):
            raise AttributeError(f"ServerArgs has no field {name!r}")
        setattr(args, name, value)
    return args


def disable_flags_parser(tree: Path, cls: type) -> argparse.ArgumentParser:
    """A parser holding the `--speculative-disable-*` add_argument calls of the patched
    ServerArgs.add_cli_args, run as written there (their defaults read from `cls`, their
    types from the patched module)."""
    path = tree / ARGS
    fn = ast.parse(function_source(path, "ServerArgs.add_cli_args")).body[0]
    calls = []
    for stmt in ast.walk(fn):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            first = call.args[0] if call.args else None
            if (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"
                    and isinstance(first, ast.Constant) and str(first.value).startswith(PREFIX)):
                calls.append(stmt)
    source = "def add(parser):\n" + "".join(f"    {ast.unparse(c)}\n" for c in calls)
    ns = {"ServerArgs": cls, "argparse": argparse,
          "int_or_off": load_function(path, "int_or_off", {"argparse": argparse, "Optional": typing.Optional})}
    exec(compile(source, f"{path}:ServerArgs.add_cli_args", "exec"), ns)
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ns["add"](parser)
    return parser


def fallback_state_class(tree: Path) -> type:
    """The patched worker module's SpecFallbackState dataclass."""
    ns = {"dataclasses": dataclasses, "collections": collections, "threading": threading, "json": json,
          "os": os, "time": time, "Optional": typing.Optional, "Any": typing.Any}
    return load_function(tree / WORKER, "SpecFallbackState", ns)
