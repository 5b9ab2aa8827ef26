"""0.5.19+, where the fallback is not ported: the threshold flag is mapped onto upstream's
adaptive batch-size tiers. The patched functions of the real 0.5.19 and 0.5.23 sources are
called with simulated server args, declaring their fields to the release's own resolution
pipeline (declare_resolution, read back through resolving_view), and the config they write is
read back with upstream's own loader logic (keys = batch lower bounds). On 0.5.19 the server
args are the patched release's own ServerArgs, so a declaration of a name that is not one of
its fields is refused as the release refuses it; 0.5.23 assembles its ServerArgs as a
msgspec Struct from the namespaces of arg_groups/fields, which needs msgspec, so there they
are a plain record holding the same values."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import tempfile
from types import SimpleNamespace

import pytest

from spectool.testing import load_function

from .sglang_source import server_args, server_args_class

pytestmark = pytest.mark.network
HOOK = "sglang/srt/arg_groups/speculative_hook.py"
RELEASES = ["0.5.19", "0.5.23"]


class Mapping:
    """The patched mapping of one release, and what the release decided after it ran."""

    def __init__(self, version, tree):
        self.version, self.tree = version, tree
        self.ns = {"json": json, "tempfile": tempfile, "logger": logging.getLogger("t")}
        # The release's own resolution pipeline.
        arg_groups = tree / "sglang/srt/arg_groups"
        view = load_function(arg_groups / "model_override_base.py", "ResolvingConfig", {})
        self.ns["resolving_view"] = load_function(
            arg_groups / "model_override_base.py", "resolving_view", {"ResolvingConfig": view}
        )
        # is_record (0.5.23) tells a record by msgspec.Struct (not installed here: a fake of the
        # library, which no record is an instance of) or dataclass. field_names is the release's
        # own: a dataclass ServerArgs is checked against its fields. No config is published
        # while the hooks run.
        utils = {
            "dataclasses": dataclasses,
            "functools": functools,
            "msgspec": SimpleNamespace(Struct=type("Struct", (), {})),
        }
        for name in ("is_record", "record_fields", "field_names"):
            if f"def {name}(" in (arg_groups / "arg_utils.py").read_text():
                utils[name] = load_function(arg_groups / "arg_utils.py", name, utils)
        # 0.5.19's ServerArgs is a dataclass of the release (0.5.23's a msgspec Struct).
        self.server_args_class = None
        if "@dataclasses.dataclass\nclass ServerArgs" in (tree / "sglang/srt/server_args.py").read_text():
            self.server_args_class = server_args_class(tree, {})

        def unpublished():
            raise ValueError("no runtime context yet")

        self.ns["declare_resolution"] = load_function(
            arg_groups / "overrides.py",
            "declare_resolution",
            {**utils, "get_context": unpublished},
        )
        self.ns["_spectool_adaptive_tiers"] = load_function(tree / HOOK, "_spectool_adaptive_tiers", self.ns)
        self.fn = load_function(tree / HOOK, "_spectool_threshold_to_adaptive", self.ns)

    def __call__(self, args):
        self.fn(args)

    def decided(self, args, name):
        return getattr(self.ns["resolving_view"](args), name)


@pytest.fixture(scope="module", params=RELEASES)
def mapping(request, patched_release):
    return Mapping(request.param, patched_release(request.param))


def _args(mapping, **kw):
    """The server args the hook is given: the release's ServerArgs where it is a dataclass
    (its defaults, and these values), else a record of these values."""
    base = dict(
        speculative_disable_batch_size_threshold=16,
        speculative_disable_batch_size_hysteresis=0,
        speculative_adaptive=False,
        speculative_adaptive_config=None,
        speculative_num_steps=3,
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=1,
    )
    base.update(kw)
    if mapping.server_args_class is not None:
        return server_args(mapping.server_args_class, **base)
    return SimpleNamespace(**base)


def _steps_for(cfg, bs):
    """Upstream's lookup: the largest batch key <= bs (after graph padding, which we skip)."""
    keys = sorted(int(k) for k in cfg if k.isdigit())
    return cfg[str(max(k for k in keys if k <= bs))]["candidate_steps"]


def test_threshold_becomes_steps_zero_tier(mapping):
    a = _args(mapping)
    mapping(a)
    assert mapping.decided(a, "speculative_adaptive") is True
    cfg = json.loads(open(mapping.decided(a, "speculative_adaptive_config")).read())
    assert _steps_for(cfg, 1) == [3] and _steps_for(cfg, 16) == [3]
    assert _steps_for(cfg, 17) == [0] and _steps_for(cfg, 256) == [0]


def test_threshold_zero_never_drafts(mapping):
    a = _args(mapping, speculative_disable_batch_size_threshold=0)
    mapping(a)
    cfg = json.loads(open(mapping.decided(a, "speculative_adaptive_config")).read())
    assert _steps_for(cfg, 1) == [0] and _steps_for(cfg, 1 << 20) == [0]
    # Upstream's start-up check (speculative_hook): the configured steps must be a
    # candidate somewhere, or the server refuses to start (seen on the H200 run).
    assert 3 in {s for e in cfg.values() for s in e["candidate_steps"]}


def test_unset_flag_changes_nothing_and_conflicts_are_refused(mapping):
    a = _args(mapping, speculative_disable_batch_size_threshold=None)
    mapping(a)
    assert mapping.decided(a, "speculative_adaptive") is False
    assert mapping.decided(a, "speculative_adaptive_config") is None
    with pytest.raises(ValueError, match="do not combine"):
        mapping(_args(mapping, speculative_adaptive_config="/tmp/mine.json"))
    with pytest.raises(ValueError, match=">= 0"):
        mapping(_args(mapping, speculative_disable_batch_size_threshold=-2))


@pytest.mark.parametrize("hysteresis", [-1, 16, 17])
def test_a_hysteresis_the_recipe_refuses_is_refused_here_too(mapping, hysteresis):
    """Upstream's tiers have no hysteresis (it is ignored with a warning), but a value the
    0.5.12 validation refuses is refused here too: a command line means the same on both."""
    a = _args(mapping, speculative_disable_batch_size_hysteresis=hysteresis)
    with pytest.raises(ValueError, match=rf"hysteresis must be 0 or below the threshold \(16\), got {hysteresis}"):
        mapping(a)
    assert mapping.decided(a, "speculative_adaptive") is False


@pytest.mark.parametrize("algo,topk", [("STANDALONE", 1), ("EAGLE3", 4)])
def test_setups_upstream_cannot_switch_are_refused_loudly(mapping, algo, topk):
    """Upstream turns its tiers off for these (with a warning): the flag would do nothing."""
    a = _args(mapping, speculative_algorithm=algo, speculative_eagle_topk=topk)
    with pytest.raises(ValueError, match="support only EAGLE/EAGLE3"):
        mapping(a)
    assert mapping.decided(a, "speculative_adaptive") is False
    assert mapping.decided(a, "speculative_adaptive_config") is None


@pytest.mark.parametrize("threshold", [0, 1, 32])
def test_written_config_passes_upstreams_own_startup_check(threshold, monkeypatch, mapping):
    """Upstream's own loader and start-up check (the release's source, not a
    re-implementation) accept the config: the H200 run found that T=0 once failed this check."""
    import sys
    import types

    params = mapping.tree / "sglang/srt/speculative/adaptive_spec_params.py"
    ns = {"json": json, "DEFAULT_ADAPTIVE_CONFIG": {}}
    ns["_load_adaptive_config"] = load_function(params, "_load_adaptive_config", ns)
    resolve = load_function(params, "resolve_candidate_steps_from_config", ns)
    # The hook imports the function from its module: a module of that name holding the
    # release's own function (the rest of the module needs SGLang's runtime).
    module = types.ModuleType("sglang.srt.speculative.adaptive_spec_params")
    module.resolve_candidate_steps_from_config = resolve
    monkeypatch.setitem(sys.modules, module.__name__, module)
    init = load_function(mapping.tree / HOOK, "_init_adaptive_speculative_params", mapping.ns)
    a = _args(mapping, speculative_disable_batch_size_threshold=threshold)
    mapping(a)
    init(a)  # raises ValueError if --speculative-num-steps is not a candidate
    assert mapping.decided(a, "speculative_num_steps") == 3
    assert mapping.decided(a, "speculative_num_draft_tokens") == 4


def test_the_mapping_runs_where_upstream_settles_adaptive_decoding(mapping):
    """The call sits right before the release's adaptive block, which then sees the tiers
    through the live resolving view."""
    import ast

    fn = next(
        n
        for n in ast.parse((mapping.tree / HOOK).read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name == "handle_speculative_decoding"
    )
    text = [ast.unparse(s) for s in fn.body]
    at = text.index("_spectool_threshold_to_adaptive(server_args)")
    assert text[at + 1].startswith("if cfg.speculative_adaptive:\n    _maybe_disable_adaptive(server_args)")
