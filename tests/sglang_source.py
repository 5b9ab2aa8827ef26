"""Real classes of a (patched) release's source, without importing SGLang (which needs its GPU
stack): ServerArgs itself, an instance with the release's defaults, the flags the
spec-disable-threshold recipe adds to add_cli_args in a real argparse parser, the fallback's
SpecFallbackState, and the data types a decode step passes around (ModelWorkerBatch, Req,
GenerationBatchResult, EagleDraftInput, ForwardMode, CaptureHiddenMode)."""

from __future__ import annotations
import __future__

import abc
import argparse
import ast
import collections
import contextlib
import dataclasses
import enum
import functools
import json
import logging
import math
import os
import threading
import time
import typing
from pathlib import Path

from spectool.testing import compiled, function_source, load_function, parsed_source

ARGS = "sglang/srt/server_args.py"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
BATCH = "sglang/srt/managers/schedule_batch.py"
RESULT = "sglang/srt/managers/utils.py"
FORWARD = "sglang/srt/model_executor/forward_batch_info.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
EAGLE_INFO = "sglang/srt/speculative/eagle_info.py"
EAGLE_INFO_V2 = "sglang/srt/speculative/eagle_info_v2.py"
PREFIX = "--speculative-disable-"


class Unprovided:
    """A name that a release class's definition reads (a base's type hint, a default) and
    that no test provides: any use of it fails, naming it, so a test never passes on it."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        raise AssertionError(f"the test used {self.name}.{attr}, which it did not provide")

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"the test called {self.name}, which it did not provide")


# The names a release class's definition may read that no test needs to give: the standard
# modules its decorators use, the enum, ABC and dataclass machinery, typing's names.
_DEFINITION_NAMES = {
    **{
        m.__name__: m
        for m in (collections, contextlib, dataclasses, enum, functools, logging, math, os, threading, time)
    },
    "dataclass": dataclasses.dataclass,
    "field": dataclasses.field,
    "IntEnum": enum.IntEnum,
    "Enum": enum.Enum,
    "auto": enum.auto,
    "ABC": abc.ABC,
    "abstractmethod": abc.abstractmethod,
    "total_ordering": functools.total_ordering,
    **{name: getattr(typing, name) for name in typing.__all__},
}


def release_class(tree: Path, rel: str, qualname: str, namespace: dict | None = None) -> type:
    """The class `qualname` of the release file `rel`, defined from its source in
    `namespace` (the names its methods use), annotations kept as strings as in the release.
    A name only the definition reads and `namespace` lacks becomes Unprovided."""
    path = tree / rel
    ns = {**_DEFINITION_NAMES, **(namespace or {})}
    code = compiled(function_source(path, qualname), f"{path}:{qualname}", __future__.annotations.compiler_flag)
    for _ in range(200):
        try:
            exec(code, ns)
            return ns[qualname.split(".")[-1]]
        except NameError as exc:
            if exc.name in ns:
                raise
            ns[exc.name] = Unprovided(exc.name)
    raise AssertionError(f"{qualname} of {path} reads too many names at its definition")


def release_type(tree: Path, name: str, namespace: dict | None = None, rel: str | None = None) -> type:
    """The release's class `name` (from `rel`, else the file that defines it), on its own
    bases: each base the release defines is the release's class too, recursively; a base from
    outside SGLang (torch's, a library's) that `namespace` does not give is an empty class of
    its name. The methods' globals are `namespace` (what they read), as in release_class."""
    rel = rel or _defined_in(tree, name)
    ns = dict(namespace or {})
    for base in _class_node(tree / rel, name).bases:
        if isinstance(base, ast.Name) and base.id not in ns and base.id not in _DEFINITION_NAMES:
            try:
                ns[base.id] = release_type(tree, base.id, namespace)
            except KeyError:
                ns[base.id] = type(base.id, (), {})
    return release_class(tree, rel, name, ns)


def release_instance(cls: type, **attrs):
    """An object of the release's class `cls` holding `attrs`, made without running __init__
    (which needs the GPU, the model and the distributed groups): the state a test gives the
    code under test lives on the release's own type, and an attribute the release does not
    have (a name `cls` and its bases neither define nor assign as `self.NAME`) is refused, so
    a test cannot pass on a field the release renamed."""
    known = _attributes(cls)
    for name in attrs:
        if name not in known:
            raise AttributeError(f"{cls.__name__} of the release has no attribute {name!r}")
    obj = object.__new__(cls)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def _attributes(cls: type) -> frozenset:
    """What an instance of `cls` can hold: its and its bases' class attributes, dataclass
    fields and annotations, and every `self.NAME` their source assigns."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        names.update(getattr(klass, "__dataclass_fields__", {}))
        names.update(vars(klass).get("__annotations__", {}))
        names.update(_assigned_in(klass))
    return frozenset(names)


def _assigned_in(klass: type) -> frozenset:
    """The `self.NAME`s the release source of a class release_class defined assigns (its
    methods' file name is `PATH:QUALNAME`); nothing for any other class."""
    for fn in vars(klass).values():
        filename = getattr(getattr(fn, "__code__", None), "co_filename", "")
        path, _, qualname = filename.rpartition(":")
        if qualname == klass.__qualname__ and path:
            st = os.stat(path)
            return _assigned_in_file(path, qualname, (st.st_ino, st.st_size, st.st_mtime_ns))
    return frozenset()


@functools.lru_cache(maxsize=4096)
def _assigned_in_file(path: str, qualname: str, stamp: tuple) -> frozenset:
    """_self_assignments of `qualname` in the file as `stamp` (inode, size, mtime) knows it:
    a test builds the same classes from the same files many times."""
    return _self_assignments(function_source(Path(path), qualname))


@functools.cache
def _self_assignments(source: str) -> frozenset:
    """The NAMEs of `self.NAME = ...` (augmented and annotated too) and of
    `setattr(self, "NAME", ...)` in `source`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        found.add(t.attr)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1:
            owner, name = node.args[:2]
            if getattr(owner, "id", None) == "self" and isinstance(name, ast.Constant):
                found.add(name.value)
    return frozenset(found)


@functools.cache
def forward_modes(tree: Path) -> tuple[type, type]:
    """The release's (ForwardMode, CaptureHiddenMode) enums."""
    return release_class(tree, FORWARD, "ForwardMode"), release_class(tree, FORWARD, "CaptureHiddenMode")


@functools.cache
def prefill_forward_batch(tree: Path, release: type, spans) -> type:
    """A subclass of the release's ForwardBatch `release` whose init_new is the real one in
    miniature (which plans the GPU's attention metadata): the batch's ids, slots and draft
    input, no multimodal inputs, positions continuing each request's cached prefix, in an
    EXTEND forward batch. `spans(batch)`: each request's (cached prefix, new tokens), read
    from the batch type the caller passes (a ScheduleBatch's or a ModelWorkerBatch's fields)."""
    import torch

    extend = forward_modes(tree)[0].EXTEND

    class ForwardBatch(release):
        @classmethod
        def init_new(cls, batch, runner, **kwargs):
            return release_instance(
                cls,
                input_ids=batch.input_ids,
                positions=torch.cat([torch.arange(p, p + e) for p, e in spans(batch)]),
                out_cache_loc=batch.out_cache_loc,
                spec_info=batch.spec_info,
                mm_inputs=None,
                mm_input_embeds=None,
                forward_mode=extend,
            )

    return ForwardBatch


def _model_worker_batch_class(tree: Path) -> type:
    return release_class(tree, BATCH, "ModelWorkerBatch")


def model_worker_batch(tree: Path, **values):
    """A real ModelWorkerBatch of the release: `values`, every other field its default or
    None (the fields without a default)."""
    cls = _model_worker_batch_class(tree)
    required = {
        f.name: None
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return cls(**{**required, **values})


def request(tree: Path, **values):
    """A request of the release's own Req class, holding `values`, which must be arguments
    that Req.__init__ stores under their own name (return_hidden_states, return_logprob,
    ...): the object has them as the scheduler's Req has them. Made without running
    __init__, which starts timers and metrics this test has no use for."""
    cls, stored = _req_class(tree)
    for name in values:
        if name not in stored:
            raise AttributeError(f"Req.__init__ does not store its argument {name!r} as Req.{name}")
    req = object.__new__(cls)
    for name, value in values.items():
        setattr(req, name, value)
    return req


@functools.cache
def _req_class(tree: Path) -> tuple[type, frozenset]:
    """The release's Req class, and the arguments its __init__ stores under their own name."""
    path = tree / BATCH
    init = ast.parse(function_source(path, "Req.__init__")).body[0]
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    stored = {
        t.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and t.attr == node.value.id
        and t.attr in params
    }
    bases = {
        base.id: release_class(tree, _defined_in(tree, base.id), base.id)
        for base in _class_node(path, "Req").bases
        if isinstance(base, ast.Name)
    }
    return release_class(tree, BATCH, "Req", bases), frozenset(stored)


def _class_node(path: Path, name: str) -> ast.ClassDef:
    return next(n for n in parsed_source(path).tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _defined_in(tree: Path, name: str) -> str:
    """The file of the release that defines the top-level class `name`: searched once per
    release and name, since a patched copy of a release keeps its classes where they were."""
    key = ((tree / "sglang" / "version.py").read_text(), name)
    if key not in _CLASS_FILES:
        _CLASS_FILES[key] = _search_class(tree, name)
    rel = _CLASS_FILES[key]
    try:
        _class_node(tree / rel, name)
    except (StopIteration, FileNotFoundError):
        del _CLASS_FILES[key]
        raise KeyError(f"no class {name} in {tree / rel}") from None
    return rel


_CLASS_FILES: dict[tuple[str, str], str] = {}


def _search_class(tree: Path, name: str) -> str:
    for path in sorted((tree / "sglang" / "srt").rglob("*.py")):
        if f"class {name}" in path.read_text(encoding="utf-8", errors="replace"):
            try:
                _class_node(path, name)
            except StopIteration:
                continue
            return str(path.relative_to(tree))
    raise KeyError(f"no class {name} in {tree}")


@functools.cache
def generation_batch_result_class(tree: Path) -> type:
    """The release's GenerationBatchResult dataclass (what a worker step returns)."""
    import torch

    return release_class(tree, RESULT, "GenerationBatchResult", {"torch": torch})


@functools.cache
def eagle_draft_input_class(tree: Path) -> type:
    """The release's EagleDraftInput dataclass, on its real SpecInput base and V2 mixin."""
    import torch

    spec_type = release_class(tree, SPEC_INFO, "SpecInputType")
    base = release_class(tree, SPEC_INFO, "SpecInput", {"SpecInputType": spec_type})
    _, capture = forward_modes(tree)
    mixin = release_class(tree, EAGLE_INFO_V2, "EagleDraftInputV2Mixin", {"torch": torch})
    return release_class(
        tree,
        EAGLE_INFO,
        "EagleDraftInput",
        {
            "SpecInput": base,
            "SpecInputType": spec_type,
            "EagleDraftInputV2Mixin": mixin,
            "CaptureHiddenMode": capture,
            "torch": torch,
        },
    )


def server_args_class(tree: Path, namespace: dict) -> type:
    """The release's ServerArgs dataclass, its methods' globals `namespace` (the names they
    read) plus the module's constants; annotations stay strings, as in the release. Without a
    namespace of the test's own, one class serves every copy of the same server_args.py (the
    dataclass of some 400 fields takes a while to build)."""
    path = tree / ARGS
    if namespace:
        return _server_args_class(path, namespace)
    text = parsed_source(path).text
    if text not in _SHARED_SERVER_ARGS:
        _SHARED_SERVER_ARGS[text] = _server_args_class(path, {})
    return _SHARED_SERVER_ARGS[text]


_SHARED_SERVER_ARGS: dict[str, type] = {}  # server_args.py's text -> its ServerArgs


def _server_args_class(path: Path, namespace: dict) -> type:
    ns = {
        "dataclasses": dataclasses,
        "is_hip": lambda: False,
        "cached_property": functools.cached_property,
        **{name: getattr(typing, name) for name in typing.__all__},
        **namespace,
    }
    for code in _module_constants(path, parsed_source(path).text):  # the CHOICES lists and others
        try:
            exec(code, ns)
        except NameError:  # built from an import: no field default reads those
            pass
    src = function_source(path, "ServerArgs")
    exec(compiled(src, str(path), __future__.annotations.compiler_flag), ns)
    return ns["ServerArgs"]


@functools.lru_cache(maxsize=16)
def _module_constants(path: Path, text: str) -> list:
    """The module-level assignments of the file (as it reads `text`), each compiled on its own
    and once: server_args_class runs them in a fresh namespace for every test."""
    body = parsed_source(path).tree.body
    return [compile(ast.Module([node], []), str(path), "exec") for node in body if isinstance(node, ast.Assign)]


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
            if (
                isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"
                and isinstance(first, ast.Constant)
                and str(first.value).startswith(PREFIX)
            ):
                calls.append(stmt)
    source = "def add(parser):\n" + "".join(f"    {ast.unparse(c)}\n" for c in calls)
    ns = {
        "ServerArgs": cls,
        "argparse": argparse,
        "int_or_off": load_function(path, "int_or_off", {"argparse": argparse, "Optional": typing.Optional}),
    }
    exec(compile(source, f"{path}:ServerArgs.add_cli_args", "exec"), ns)
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ns["add"](parser)
    return parser


def fallback_state_class(tree: Path) -> type:
    """The patched worker module's SpecFallbackState dataclass."""
    ns = {
        "dataclasses": dataclasses,
        "collections": collections,
        "threading": threading,
        "json": json,
        "os": os,
        "time": time,
        "Optional": typing.Optional,
        "Any": typing.Any,
    }
    return load_function(tree / WORKER, "SpecFallbackState", ns)


@functools.cache
def logits_output_class(tree: Path) -> type:
    """The release's LogitsProcessorOutput dataclass (a forward's logits, logprobs, hidden states)."""
    import torch

    return release_class(tree, "sglang/srt/layers/logits_processor.py", "LogitsProcessorOutput", {"torch": torch})


ENVIRON = "sglang/srt/environ.py"


def release_envs(tree: Path):
    """The release's own `envs` registry (an Envs() of sglang/srt/environ.py, its entry
    classes the release's): an entry's get() reads its environment variable as SGLang does,
    so a test sets the variable (monkeypatch.setenv) to give it a value."""
    import subprocess
    import warnings

    ns = {"os": os, "warnings": warnings, "subprocess": subprocess, "json": json}
    ns["contextmanager"] = contextlib.contextmanager
    for node in parsed_source(tree / ENVIRON).tree.body:
        if isinstance(node, ast.ClassDef):
            ns[node.name] = release_class(tree, ENVIRON, node.name, ns)
    return ns["Envs"]()
