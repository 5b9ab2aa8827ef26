"""0.5.15+: the threshold flag is mapped onto upstream's adaptive batch-size tiers. The
patched function of the real 0.5.17 source is called with simulated server args, and the
config it writes is read back with upstream's own loader logic (keys = batch lower bounds)."""

from __future__ import annotations

import json
import logging
import tempfile
from types import SimpleNamespace

import pytest

from spectool.testing import load_function

pytestmark = pytest.mark.network
HOOK = "sglang/srt/arg_groups/speculative_hook.py"


@pytest.fixture(scope="module")
def mapping(patched_release):
    return load_function(
        patched_release("0.5.17") / HOOK,
        "_spectool_threshold_to_adaptive",
        {"json": json, "tempfile": tempfile, "logger": logging.getLogger("t")},
    )


def _args(**kw):
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
    return SimpleNamespace(**base)


def _steps_for(cfg, bs):
    """Upstream's lookup: the largest batch key <= bs (after graph padding, which we skip)."""
    keys = sorted(int(k) for k in cfg if k.isdigit())
    return cfg[str(max(k for k in keys if k <= bs))]["candidate_steps"]


def test_threshold_becomes_steps_zero_tier(mapping):
    a = _args()
    mapping(a)
    assert a.speculative_adaptive is True
    cfg = json.loads(open(a.speculative_adaptive_config).read())
    assert _steps_for(cfg, 1) == [3] and _steps_for(cfg, 16) == [3]
    assert _steps_for(cfg, 17) == [0] and _steps_for(cfg, 256) == [0]


def test_threshold_zero_never_drafts(mapping):
    a = _args(speculative_disable_batch_size_threshold=0)
    mapping(a)
    cfg = json.loads(open(a.speculative_adaptive_config).read())
    assert _steps_for(cfg, 1) == [0] and _steps_for(cfg, 1 << 20) == [0]
    # Upstream's start-up check (0.5.17 speculative_hook): the configured steps must be a
    # candidate somewhere, or the server refuses to start (seen on the H200 run).
    assert 3 in {s for e in cfg.values() for s in e["candidate_steps"]}


def test_unset_flag_changes_nothing_and_conflicts_are_refused(mapping):
    a = _args(speculative_disable_batch_size_threshold=None)
    mapping(a)
    assert a.speculative_adaptive is False and a.speculative_adaptive_config is None
    with pytest.raises(ValueError, match="do not combine"):
        mapping(_args(speculative_adaptive_config="/tmp/mine.json"))
    with pytest.raises(ValueError, match=">= 0"):
        mapping(_args(speculative_disable_batch_size_threshold=-2))


@pytest.mark.parametrize("hysteresis", [-1, 16, 17])
def test_a_hysteresis_the_recipe_refuses_is_refused_here_too(mapping, hysteresis):
    """Upstream's tiers have no hysteresis (it is ignored with a warning), but a value the
    0.5.12 validation refuses is refused here too: a command line means the same on both."""
    a = _args(speculative_disable_batch_size_hysteresis=hysteresis)
    with pytest.raises(ValueError, match=rf"hysteresis must be 0 or below the threshold \(16\), got {hysteresis}"):
        mapping(a)
    assert a.speculative_adaptive is False


@pytest.mark.parametrize("algo,topk", [("STANDALONE", 1), ("EAGLE3", 4)])
def test_setups_upstream_cannot_switch_are_refused_loudly(mapping, algo, topk):
    """Upstream turns its tiers off for these (with a warning): the flag would do nothing."""
    a = _args(speculative_algorithm=algo, speculative_eagle_topk=topk)
    with pytest.raises(ValueError, match="support only EAGLE/EAGLE3"):
        mapping(a)
    assert a.speculative_adaptive is False and a.speculative_adaptive_config is None


@pytest.mark.parametrize("threshold", [0, 1, 32])
def test_written_config_passes_upstreams_own_startup_check(threshold, cached_release, monkeypatch, mapping):
    """Upstream's own loader and start-up check (0.5.17 source, not a re-implementation)
    accept the config: the H200 run found that T=0 once failed this check."""
    import sys

    tree = cached_release("0.5.17")
    params = tree / "sglang/srt/speculative/adaptive_spec_params.py"
    ns = {"json": json, "DEFAULT_ADAPTIVE_CONFIG": {}}
    ns["_load_adaptive_config"] = load_function(params, "_load_adaptive_config", ns)
    resolve = load_function(params, "resolve_candidate_steps_from_config", ns)
    monkeypatch.setitem(
        sys.modules,
        "sglang.srt.speculative.adaptive_spec_params",
        SimpleNamespace(resolve_candidate_steps_from_config=resolve),
    )
    init = load_function(tree / HOOK, "_init_adaptive_speculative_params", {})
    a = _args(speculative_disable_batch_size_threshold=threshold)
    mapping(a)
    init(a)  # raises ValueError if --speculative-num-steps is not a candidate
    assert a.speculative_num_steps == 3 and a.speculative_num_draft_tokens == 4
