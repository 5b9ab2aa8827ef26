"""The draft length chosen per decode step (--speculative-num-steps-tiers) on the real patched
SGLang 0.5.12, 0.5.13, 0.5.14 and 0.5.17: the tier rule (SpecFallbackState.tier_for_batch) and the
tiers' batch ranges, the flags and their validation in the release's ServerArgs, and the
worker's start-up and per-step switch, run on the CPU through the release's own
build_adaptive_runtime_state, _override_worker_state and apply_runtime_state (GPU work: on
0.5.12 the stand-ins of test_rank_agreement, later the ones below; each logs what a capture
or forward would do)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import itertools
import logging
import re
import sys
import types

import pytest

from spectool.testing import function_source, load_function

from .sglang_source import (
    fallback_state_class,
    forward_modes,
    release_class,
    release_instance,
    release_type,
    server_args,
    server_args_class,
)
from .test_rank_agreement import (
    Rank,
    Release,
    args_for,
    assert_ranks_agree,
    load,
    run_ranks,
)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.network

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
ARGS = "sglang/srt/server_args.py"
RUNTIME_STATE = "sglang/srt/speculative/adaptive_runtime_state.py"


@pytest.fixture(scope="module")
def patched(patched_release):
    return patched_release("0.5.12")


@pytest.fixture(scope="module", params=["0.5.12", "0.5.13", "0.5.14", "0.5.17"])
def any_patched(request, patched_release):
    """Each era the tiers serve: 0.5.12, 0.5.13, 0.5.14 (to 0.5.15), 0.5.17 (0.5.16 to 0.5.18)."""
    return patched_release(request.param)


@pytest.fixture(scope="module")
def rule(any_patched):
    return fallback_state_class(any_patched).tier_for_batch


# -- the tier rule --------------------------------------------------------------------------


def test_the_rule_moves_up_at_once_and_down_past_the_hysteresis(rule):
    """Tiers 3,1,0 steps at boundaries 16 and 48, hysteresis 4: up as soon as the batch is above
    a boundary (from any tier, over several at once), down across a boundary only at
    boundary - 4 or below; inside a band the tier before stays."""
    bounds, h = (16, 48), 4
    # Up: each boundary, and both at once.
    assert [rule(bs, 0, bounds, h) for bs in (1, 16, 17, 48, 49, 500)] == [0, 0, 1, 1, 2, 2]
    assert [rule(bs, 1, bounds, h) for bs in (17, 48, 49)] == [1, 1, 2]
    # Down from the last tier: the band 45..48 keeps it, 44 crosses into tier 1, and a batch
    # at or below 12 crosses both boundaries in one step.
    assert [rule(bs, 2, bounds, h) for bs in (49, 48, 45, 44, 17, 13, 12, 1)] == [2, 2, 2, 1, 1, 1, 0, 0]
    # Down from the middle tier: the band 13..16 keeps it.
    assert [rule(bs, 1, bounds, h) for bs in (16, 13, 12, 1)] == [1, 1, 0, 0]
    # Without hysteresis the tier is the batch's own.
    for bs, tier in itertools.product(range(1, 60), range(3)):
        assert rule(bs, tier, bounds, 0) == sum(bs > b for b in bounds)


def test_the_rule_is_the_plain_tier_outside_the_bands_and_keeps_it_inside(rule):
    """Exhaustively over small settings: the result is the batch's own tier or, inside a
    hysteresis band below a boundary the tier before is above, a tier between the two; a
    second step at the same size stays (no flapping at a fixed batch)."""
    for bounds in ((1, 2), (3, 5), (4, 9, 10), (2, 8, 20, 21)):
        for h in range(0, bounds[0]):
            for tier in range(len(bounds) + 1):
                for bs in range(1, bounds[-1] + 5):
                    got = rule(bs, tier, bounds, h)
                    plain = sum(bs > b for b in bounds)
                    assert plain <= got <= max(plain, tier)
                    assert got == plain or bs > bounds[got - 1] - h  # kept inside a band
                    assert rule(bs, got, bounds, h) == got


def test_the_binary_switch_is_the_rule_with_one_boundary(rule):
    """The fallback's decision at threshold T and hysteresis H (fallback above T, drafting
    again at <= T - H) is tier 1 of the rule at the boundary T, for every batch, T and H;
    and with tiers, the last tier (0 steps) is chosen exactly when the fallback's own rule at
    the last boundary falls back, so the two decisions of a step agree."""
    for T in range(0, 12):
        for H in [0, *range(1, T)]:
            for active in (False, True):
                for bs in range(1, 16):
                    expected = bs > (T - H if active else T)
                    assert (rule(bs, int(active), (T,), H) == 1) == expected
    for bounds in ((4, 9), (2, 5, 11)):
        last = len(bounds)
        for h in range(bounds[0]):
            for tier in range(last + 1):
                for bs in range(1, bounds[-1] + 4):
                    tiered = rule(bs, tier, bounds, h) == last
                    assert tiered == (rule(bs, int(tier == last), (bounds[-1],), h) == 1)


@pytest.fixture(scope="module")
def tiers_class(any_patched):
    return load_function(any_patched / WORKER, "SpecTiers", {"dataclasses": dataclasses})


def test_each_tier_captures_the_graph_sizes_of_the_batches_it_serves(tiers_class):
    """Tier i serves batches from boundary[i-1] - H + 1 (kept, or entered downward) up to
    boundary[i]; its graphs are the sizes from there up to the first that holds its largest
    batch (a batch replays the smallest size that holds it)."""
    tiers = tiers_class(steps=(3, 2, 1, 0), boundaries=(8, 24, 64), hysteresis=3)
    assert [tiers.batch_range(t) for t in range(4)] == [(1, 8), (6, 24), (22, 64), (62, None)]
    sizes = [1, 2, 4, 8, 12, 16, 24, 32, 48, 80]
    assert [tiers.graph_sizes(sizes, t) for t in range(4)] == [
        [1, 2, 4, 8],
        [8, 12, 16, 24],
        [24, 32, 48, 80],
        [80],
    ]
    # No size holds 100: every size from the tier's smallest batch up (above: eager).
    assert tiers_class(steps=(3, 1), boundaries=(100,)).graph_sizes(sizes, 0) == sizes
    assert tiers_class(steps=(3, 1), boundaries=(100,), hysteresis=10).graph_sizes(sizes, 1) == []
    # A step count that serves two ranges (2,3,2,0: 2 steps up to 8 and again from 22 to 64)
    # has the graphs of both; one that serves one range has that range's.
    again = tiers_class(steps=(2, 3, 2, 0), boundaries=(8, 24, 64), hysteresis=3)
    assert again.step_graph_sizes(sizes, 2) == [1, 2, 4, 8, 24, 32, 48, 80]
    assert again.step_graph_sizes(sizes, 3) == [8, 12, 16, 24] == tiers.step_graph_sizes(sizes, 2)


# -- the flags ---------------------------------------------------------------------------------


class _Envs:
    class SGLANG_ENABLE_SPEC_V2:  # noqa: N801
        @classmethod
        def get(cls):
            return True


@pytest.fixture(scope="module")
def args_cls(any_patched):
    """The patched ServerArgs, its module holding the spec-fallback worker's marker."""
    marker = load_function(any_patched / ARGS, "spectool_fallback_worker", {})
    return server_args_class(
        any_patched, {"envs": _Envs, "logger": logging.getLogger("test"), "spectool_fallback_worker": marker}
    )


def _tiers(cls, **kw):
    base = dict(
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        speculative_num_steps_tiers=[3, 1, 0],
        speculative_num_steps_tier_boundaries=[16, 48],
        max_running_requests=64,
    )
    return server_args(cls, **{**base, **kw})


def _validate(args):
    """The patched _handle_speculative_decoding's order: the tiers, then the threshold."""
    args._validate_speculative_num_steps_tiers()
    args._validate_speculative_disable_threshold()


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(speculative_num_steps_tiers=None), "tier-boundaries needs --speculative-num-steps-tiers"),
        (dict(speculative_num_steps_tiers="3,1,0"), "takes whole numbers (on the command line: comma-separated"),
        (dict(speculative_num_steps_tier_boundaries=[16.0, 48]), "tier-boundaries takes whole numbers"),
        (
            dict(speculative_num_steps_tiers=[0, 1, 3]),
            "none below 0, and 0 (the fallback) only as the last (e.g. 3,1,0 or 2,3,2,0), got 0,1,3",
        ),
        (dict(speculative_num_steps_tiers=[3, 3, 0]), "each different from the one before"),
        (dict(speculative_num_steps_tiers=[3], speculative_num_steps_tier_boundaries=[]), "two or more step counts"),
        (dict(speculative_num_steps_tiers=[1, -1]), "none below 0"),
        (dict(speculative_num_steps_tiers=[1, 3, -1]), "none below 0"),
        (
            dict(speculative_num_steps_tiers=[4, 1, 0]),
            "at most --speculative-num-steps steps (the KV cache is allocated",
        ),
        (
            dict(speculative_num_steps_tiers=[2, 4, 0]),
            "got a tier of 4 with --speculative-num-steps 3",
        ),
        (
            dict(speculative_num_steps_tier_boundaries=[16]),
            "one batch size fewer than there are tiers (2 for 3,1,0), got 16",
        ),
        (
            dict(speculative_num_steps_tier_boundaries=None),
            "one batch size fewer than there are tiers (2 for 3,1,0), got none",
        ),
        (dict(speculative_num_steps_tier_boundaries=[48, 16]), "increasing batch sizes of 1 or more, got 48,16"),
        (dict(speculative_num_steps_tier_boundaries=[16, 16]), "increasing batch sizes"),
        (dict(speculative_num_steps_tier_boundaries=[0, 16]), "increasing batch sizes of 1 or more"),
        (dict(speculative_disable_batch_size_hysteresis=16), "below the smallest tier boundary (16), got 16"),
        (dict(speculative_disable_batch_size_hysteresis=-1), "below the smallest tier boundary (16), got -1"),
        (dict(speculative_adaptive=True), "cannot be combined with --speculative-adaptive"),
        (dict(speculative_algorithm="STANDALONE"), "needs --speculative-algorithm EAGLE or EAGLE3"),
        # No algorithm, so no step count either: the algorithm is the reason given.
        (
            dict(speculative_algorithm=None, speculative_num_steps=None),
            "needs --speculative-algorithm EAGLE or EAGLE3 (got None)",
        ),
        (dict(speculative_eagle_topk=2), "needs --speculative-eagle-topk 1"),
        (dict(disable_overlap_schedule=True), "overlap (spec v2) worker only"),
        (dict(enable_dp_attention=True), "--enable-dp-attention"),
        (dict(enable_multi_layer_eagle=True), "--enable-multi-layer-eagle"),
        (dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap"),
        (dict(enable_pdmux=True), "--enable-pdmux"),
        (
            dict(moe_runner_backend="triton", speculative_moe_runner_backend="flashinfer_trtllm"),
            "--speculative-moe-runner-backend flashinfer_trtllm different from the target's (triton)",
        ),
        (
            dict(moe_a2a_backend="none", speculative_moe_a2a_backend="deepep"),
            "--speculative-moe-a2a-backend deepep different from the target's (none)",
        ),
        (
            dict(speculative_disable_batch_size_threshold=32),
            "leave --speculative-disable-batch-size-threshold unset or give it the same value (got 32)",
        ),
        (
            dict(
                speculative_num_steps_tiers=[3, 1],
                speculative_num_steps_tier_boundaries=[16],
                speculative_disable_batch_size_threshold=48,
            ),
            "without a tier 0 cannot be combined with --speculative-disable-batch-size-threshold",
        ),
        # Tier 0 is the fallback: its own refusals follow with the threshold set.
        (dict(enable_lora=True), "--speculative-disable-batch-size-threshold cannot be combined with LoRA"),
    ],
)
def test_the_validation_refuses_with_one_reason(args_cls, kw, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        _validate(_tiers(args_cls, **kw))


def test_the_validation_reads_a_models_declared_overrides(any_patched, args_cls, monkeypatch):
    """From 0.5.15 a model override (an architecture that forces the non-overlap worker, say)
    is declared during resolution and reaches the fields only at its end: the tiers' and the
    threshold's validations read it through the release's own resolved_view, as SGLang's
    handlers do."""
    path = any_patched / "sglang/srt/arg_groups/overrides.py"
    if not path.exists() or "def resolved_view" not in path.read_text():
        pytest.skip("this release writes model overrides to the fields directly")
    module = types.ModuleType("sglang.srt.arg_groups.overrides")
    module.__dict__.update({"Any": object, "Dict": dict, "Optional": object})
    for name in ("ResolvedView", "_declaration_overlay", "resolved_view"):
        exec(compile(function_source(path, name), str(path), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    args = _tiers(args_cls)
    _validate(args)  # nothing declared: accepted
    for declared, msg in (
        ({"disable_overlap_schedule": True}, "overlap (spec v2) worker only"),
        ({"enable_dp_attention": True}, "--enable-dp-attention"),
        ({"moe_runner_backend": "triton"}, "--speculative-moe-runner-backend flashinfer_trtllm"),
    ):
        args = _tiers(
            args_cls, speculative_moe_runner_backend="flashinfer_trtllm", moe_runner_backend="flashinfer_trtllm"
        )
        object.__setattr__(args, "_resolved_overrides", [("model override", declared)])
        with pytest.raises(ValueError, match=re.escape(msg)):
            _validate(args)
    # The fallback's own validation (the threshold without tiers) reads them the same way.
    args = _tiers(
        args_cls,
        speculative_num_steps_tiers=None,
        speculative_num_steps_tier_boundaries=None,
        speculative_disable_batch_size_threshold=32,
    )
    _validate(args)
    object.__setattr__(args, "_resolved_overrides", [("model override", {"enable_dp_attention": True})])
    with pytest.raises(ValueError, match="threshold cannot be combined with --enable-dp-attention"):
        _validate(args)


def test_the_tiers_need_the_fallback_worker(any_patched):
    """Without the spec-fallback recipe's marker in the module (the threshold recipe alone
    applied), the flags are refused, naming the recipe."""
    cls = server_args_class(any_patched, {"envs": _Envs, "logger": logging.getLogger("test")})
    with pytest.raises(ValueError, match="needs the spec-fallback recipe's worker"):
        _validate(_tiers(cls))


def test_the_validation_accepts_and_sets_tier_zero_s_threshold(args_cls, caplog):
    args = _tiers(args_cls, speculative_disable_batch_size_hysteresis=15)
    _validate(args)
    assert args.speculative_disable_batch_size_threshold == 48
    args = _tiers(args_cls, speculative_disable_batch_size_threshold=48)
    _validate(args)
    for kw in (
        dict(speculative_num_steps_tiers=[3, 2, 1], speculative_num_steps_tier_boundaries=[8, 32]),
        dict(speculative_num_steps_tiers=[3, 0], speculative_num_steps_tier_boundaries=[1]),
        # A longer draft again at larger batches, and a step count serving two ranges.
        dict(speculative_num_steps_tiers=[2, 3, 2, 0], speculative_num_steps_tier_boundaries=[8, 16, 32]),
        dict(speculative_num_steps_tiers=[1, 3], speculative_num_steps_tier_boundaries=[8]),
    ):
        args = _tiers(args_cls, **kw)
        _validate(args)
        assert args.speculative_disable_batch_size_threshold == (
            kw["speculative_num_steps_tier_boundaries"][-1] if kw["speculative_num_steps_tiers"][-1] == 0 else None
        )
    # Unset: nothing checked, the threshold left alone.
    args = _tiers(
        args_cls, speculative_num_steps_tiers=None, speculative_num_steps_tier_boundaries=None, enable_lora=True
    )
    _validate(args)
    assert args.speculative_disable_batch_size_threshold is None
    with caplog.at_level(logging.WARNING):
        _validate(
            _tiers(args_cls, speculative_num_steps_tiers=[2, 3, 0], speculative_num_steps_tier_boundaries=[8, 16])
        )
    assert "no tier uses" not in caplog.text, "the start-up count is a tier, though not the first"
    with caplog.at_level(logging.WARNING):
        _validate(_tiers(args_cls, speculative_num_steps_tiers=[2, 0], speculative_num_steps_tier_boundaries=[16]))
    assert "no tier uses" in caplog.text


def _tier_flags_parser(patched, cls):
    """The --speculative-num-steps-tier* add_argument calls of the patched add_cli_args, run as
    written there."""
    path = patched / ARGS
    fn = ast.parse(function_source(path, "ServerArgs.add_cli_args")).body[0]
    calls = [
        ast.unparse(stmt)
        for stmt in ast.walk(fn)
        if isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and getattr(stmt.value.func, "attr", "") == "add_argument"
        and stmt.value.args
        and str(getattr(stmt.value.args[0], "value", "")).startswith("--speculative-num-steps-tier")
    ]
    ns = {
        "ServerArgs": cls,
        "int_list": load_function(path, "int_list", {"argparse": argparse, "List": list}),
    }
    exec("def add(parser):\n" + "".join(f"    {c}\n" for c in calls), ns)
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ns["add"](parser)
    return parser


def test_the_flags_are_in_help_and_parse_lists(any_patched, args_cls):
    parser = _tier_flags_parser(any_patched, args_cls)
    text = parser.format_help()
    assert "--speculative-num-steps-tiers" in text and "--speculative-num-steps-tier-boundaries" in text
    assert vars(parser.parse_args([])) == {
        "speculative_num_steps_tiers": None,
        "speculative_num_steps_tier_boundaries": None,
    }
    got = parser.parse_args(
        ["--speculative-num-steps-tiers", "3,1,0", "--speculative-num-steps-tier-boundaries", "16,48"]
    )
    assert got.speculative_num_steps_tiers == [3, 1, 0] and got.speculative_num_steps_tier_boundaries == [16, 48]
    with pytest.raises(argparse.ArgumentError, match="comma-separated whole numbers such as 3,1,0, got '3;1'"):
        parser.parse_args(["--speculative-num-steps-tiers", "3;1"])


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13"])
def test_tier_memory_is_reserved_for_the_tiers_sglang_does_not_capture(version, patched_release):
    """0.5.12 and 0.5.13: the graphs of each tier other than --speculative-num-steps are reserved
    for (512 MiB + 2 MiB per graph batch), tier 0's only when its threshold comes from the last
    boundary (the fallback's own reservation counts it otherwise); nothing without tiers. (From
    0.5.14 neither the fallback nor the tiers reserve, as SGLang does not for its adaptive
    states.)"""
    patched = patched_release(version)
    marker = load_function(patched / ARGS, "spectool_fallback_worker", {})
    args_cls = server_args_class(
        patched, {"envs": _Envs, "logger": logging.getLogger("test"), "spectool_fallback_worker": marker}
    )
    body = ast.parse(function_source(patched / ARGS, "ServerArgs._handle_gpu_memory_settings")).body[0]
    block = next(
        n.body
        for n in ast.walk(body)
        if any(isinstance(x, ast.For) and ast.unparse(x.target) == "tier_steps" for x in getattr(n, "body", []))
    )
    loop = next(i for i, x in enumerate(block) if isinstance(x, ast.For) and ast.unparse(x.target) == "tier_steps")
    code = compile(ast.Module(block[loop - 2 : loop + 1], []), "reserve", "exec")  # tiers, start, the loop

    def reserved(**kw):
        ns = {"self": _tiers(args_cls, cuda_graph_max_bs=64, **kw), "reserved_mem": 0}
        exec(code, ns)
        return ns["reserved_mem"]

    assert reserved() == 2 * 640  # tier 1's graphs and tier 0's (threshold from the boundary)
    assert reserved(speculative_disable_batch_size_threshold=48) == 640
    assert reserved(speculative_num_steps_tiers=None) == 0
    assert reserved(speculative_num_steps_tiers=[2, 1]) == 2 * 640
    # One state per step count: 2,3,2,0 reserves for the 2 steps once, and tier 0.
    assert (
        reserved(speculative_num_steps_tiers=[2, 3, 2, 0], speculative_num_steps_tier_boundaries=[8, 16, 48]) == 2 * 640
    )
    # --speculative-num-steps left to SGLang: the first tier's graphs are SGLang's own.
    assert reserved(speculative_num_steps=None) == 2 * 640


# -- the worker --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def release(patched):
    return Release(patched)


class TierRank(Rank):
    """A rank of test_rank_agreement whose worker also starts its tiers: the release's own
    build_adaptive_runtime_state runs against a draft worker whose backends and graphs are
    logged stand-ins, and a target graph runner that logs the sizes it captures."""

    def __init__(self, release, tp_rank, args, **kw):
        # The rank's start-up without tiers first; its tiers once the stand-ins of their GPU
        # work are in the worker's module.
        tiers = (args.speculative_num_steps_tiers, args.speculative_num_steps_tier_boundaries)
        args.speculative_num_steps_tiers = args.speculative_num_steps_tier_boundaries = None
        super().__init__(release, tp_rank, args, **kw)
        args.speculative_num_steps_tiers, args.speculative_num_steps_tier_boundaries = tiers
        w = self.worker
        ns = w._spec_tiers_init.__func__.__globals__
        load(release.tree, RUNTIME_STATE, "SpecRuntimeState", ns)
        load(release.tree, WORKER, "SpecTiers", ns)
        ns.update(
            log_info_on_rank0=lambda logger, msg: logger.info(msg),
            CudaGraphRunner=self._verify_graph_runner(ns),
        )
        dw = w._draft_worker
        dw.server_args = args
        dw.init_attention_backend = lambda: self._draft_backends(dw)
        dw.init_cuda_graphs = lambda: self._draft_graphs(dw, ns)
        self.verified = []  # (batch size, worker steps, target graph, draft graph) per verify
        verify = w.verify

        def logged_verify(batch):
            mr = w._target_worker.model_runner
            self.verified.append(
                (
                    len(batch.seq_lens),
                    w.speculative_num_steps,
                    getattr(mr.graph_runner, "name", mr.graph_runner),
                    getattr(dw.cuda_graph_runner, "name", dw.cuda_graph_runner),
                    args.speculative_num_steps,
                )
            )
            return verify(batch)

        w.verify = logged_verify
        start = len(self.log)
        w._spec_tiers_init(args)
        self.tiers, self.tier_startup = w._spec_tiers, self.log[start:]

    def _verify_graph_runner(self, ns):
        rank = self

        class VerifyGraphRunner:
            def __init__(
                self, model_runner, attn_backend=None, speculative_num_steps=None, speculative_num_draft_tokens=None
            ):
                self.name = f"target verify graph, {speculative_num_steps} steps"
                self.capture_bs, _ = ns["get_batch_sizes_to_capture"](model_runner)
                rank.log.append(
                    ("capture", self.name, tuple(self.capture_bs), speculative_num_draft_tokens, attn_backend.name)
                )

        return VerifyGraphRunner

    def _draft_backends(self, dw):
        dw.draft_attn_backend = self.release.AttentionOnCpu(f"draft {dw.speculative_num_steps} steps")
        dw.draft_extend_attn_backend = self.release.AttentionOnCpu(
            f"draft extend {dw.speculative_num_draft_tokens} tokens"
        )
        dw.draft_runner.draft_attn_backend = dw.draft_attn_backend

    def _draft_graphs(self, dw, ns):
        dw.cuda_graph_runner = dw.cuda_graph_runner_for_draft_extend = None
        if dw.server_args.disable_cuda_graph:
            return
        sizes, _ = ns["get_batch_sizes_to_capture"](dw.draft_runner)
        if dw.speculative_num_steps > 1:
            dw.cuda_graph_runner = f"draft graph, {dw.speculative_num_steps} steps"
            self.log.append(("capture", dw.cuda_graph_runner, tuple(sizes)))
        dw.cuda_graph_runner_for_draft_extend = f"draft extend graph, {dw.speculative_num_draft_tokens} tokens"
        self.log.append(("capture", dw.cuda_graph_runner_for_draft_extend, tuple(sizes)))


GRAPH_BS = (1, 2, 4, 8, 12, 16, 24, 32, 48)


def tier_args(release, tiers=(3, 2, 1, 0), bounds=(4, 12, 24), hysteresis=2, **more):
    """Validated as the server does: tier 0's threshold is the last boundary."""
    args = args_for(release, bounds[-1] if 0 in tiers else None, hysteresis, graph_bs=GRAPH_BS, **more)
    args.speculative_num_steps_tiers, args.speculative_num_steps_tier_boundaries = list(tiers), list(bounds)
    return args


def tier_captures(target_backend):
    """The graphs tier_args' tiers 3,2,1,0 at 4, 12, 24 (hysteresis 2) capture at start-up, in
    order: tier 2 for batches 3-12, tier 1 for 11-24 (GRAPH_BS' sizes that serve them), each
    target verify graph on `target_backend`, the release's name for the backend it is given."""
    return [
        ("capture", "draft graph, 2 steps", (4, 8, 12)),
        ("capture", "draft extend graph, 3 tokens", (4, 8, 12)),
        ("capture", "target verify graph, 2 steps", (4, 8, 12), 3, target_backend),
        ("capture", "draft extend graph, 2 tokens", (12, 16, 24)),
        ("capture", "target verify graph, 1 steps", (12, 16, 24), 2, target_backend),
    ]


def test_startup_builds_each_tier_for_its_batch_sizes(release):
    """Tiers 3,2,1,0 at 4, 12, 24 with hysteresis 2: SGLang's own state serves 3 steps; 2 and 1
    get the release's runtime state with graphs only at the sizes they serve (2: batches 3-12,
    1: 11-24), captured with the worker overridden to their step count and restored after;
    the worker starts in tier 3 steps, server_args untouched."""
    rank = TierRank(release, 0, tier_args(release))
    w, args = rank.worker, rank.server_args
    assert rank.tier_startup == tier_captures("target plain")
    assert sorted(rank.tiers.states) == [1, 2, 3]
    assert [s.speculative_num_steps for s in rank.tiers.states.values()] == [3, 2, 1]
    assert rank.tiers.states[3].target_graph_runner == "target verify graph"  # SGLang's own
    assert rank.tiers.states[1].cuda_graph_runner is None  # one step: no multi-step draft graph
    assert args.cuda_graph_bs == list(GRAPH_BS) and args.disable_cuda_graph is False
    assert (w.speculative_num_steps, w.speculative_num_draft_tokens) == (3, 4)
    assert (args.speculative_num_steps, args.speculative_num_draft_tokens) == (3, 4)
    assert w._draft_worker.cuda_graph_runner == "draft graph"
    assert w._target_worker.model_runner.graph_runner == "target verify graph"
    # The stand-in's free memory falls by 0.25 GiB at each reading: five readings apart (the
    # release's own before and after each of the two states it built).
    assert rank.state.stats["tiers_startup_memory_gib"] == 1.25


def test_startup_in_a_tier_below_the_servers_step_count(release):
    """Tiers 2,0 with --speculative-num-steps 3: the worker starts in the 2-step state (graphs
    for batches 1-16), and server_args keeps 3 steps, whose KV allocation holds every tier."""
    rank = TierRank(release, 0, tier_args(release, tiers=(2, 0), bounds=(16,), hysteresis=0))
    w, args = rank.worker, rank.server_args
    assert rank.tier_startup[-1] == ("capture", "target verify graph, 2 steps", (1, 2, 4, 8, 12, 16), 3, "target plain")
    assert (w.speculative_num_steps, w.speculative_num_draft_tokens) == (2, 3)
    assert w._draft_worker.speculative_num_steps == 2
    assert w._target_worker.model_runner.graph_runner.name == "target verify graph, 2 steps"
    assert (args.speculative_num_steps, args.speculative_num_draft_tokens) == (3, 4)


def test_startup_builds_a_step_count_of_two_tiers_once_for_both(release):
    """Tiers 2,3,2,0 at 4, 12, 24 (hysteresis 2) with --speculative-num-steps 3: SGLang's own
    state serves the 3 steps between 4 and 12; 2 steps serve batches up to 4 and again 11-24,
    so their state is built once, its graphs at the sizes of both ranges; the worker starts
    in it."""
    rank = TierRank(release, 0, tier_args(release, tiers=(2, 3, 2, 0)))
    both = (1, 2, 4, 12, 16, 24)
    assert rank.tier_startup == [
        ("capture", "draft graph, 2 steps", both),
        ("capture", "draft extend graph, 3 tokens", both),
        ("capture", "target verify graph, 2 steps", both, 3, "target plain"),
    ]
    assert sorted(rank.tiers.states) == [2, 3] and rank.tiers.states[3].target_graph_runner == "target verify graph"
    assert (rank.worker.speculative_num_steps, rank.server_args.speculative_num_steps) == (2, 3)


def test_each_step_runs_its_tier_when_a_longer_draft_comes_back(release):
    """The walk of test_each_step_runs_its_tier_on_every_rank with tiers 2,3,2,0: the same
    tier at every step (the rule reads the boundaries, not the step counts), each verified
    with its tier's state, and two ranks making the same calls."""
    steps = [("decode", bs, False, False) for bs in DECODES]
    ranks = [TierRank(release, r, tier_args(release, tiers=(2, 3, 2, 0)), noise=r) for r in range(2)]
    per_rank = run_ranks(ranks, steps)
    assert_ranks_agree(ranks, per_rank)
    tier = [1, 1, 2, 2, 1, 3, 3, 2, 2, 1, 0, 3, 0, 1, 2, 1]  # the tier indices of that walk
    expected = [(2, 3, 2, 0)[t] for t in tier]
    assert [s.mode for s in per_rank[0]] == ["fallback" if s == 0 else "spec" for s in expected]
    names = {3: ("target verify graph", "draft graph"), 2: ("target verify graph, 2 steps", "draft graph, 2 steps")}
    decode_sizes = [bs for bs, s in zip(DECODES, expected) if s]
    assert ranks[0].verified == [(bs, s, *names[s], 3) for bs, s in zip(decode_sizes, [s for s in expected if s])]
    assert ranks[0].state.stats["tier_steps"] == {s: expected.count(s) for s in (3, 2, 0)}


def test_without_graphs_every_tier_is_eager(release):
    args = tier_args(release)
    args.disable_cuda_graph = True
    rank = TierRank(release, 0, args)
    assert [c for c in rank.tier_startup if c[0] == "capture"] == []
    assert rank.tiers.states[2].target_graph_runner is None and rank.server_args.disable_cuda_graph is True


DECODES = [6, 3, 13, 11, 10, 25, 23, 22, 14, 4, 1, 30, 2, 12, 13, 5]


def test_each_step_runs_its_tier_on_every_rank(release):
    """Decode batches crossing every boundary both ways (tiers 3,2,1,0 at 4, 12, 24, hysteresis
    2), with idle batches and prefills between: each speculative step verifies with the
    state of its tier (worker steps, target graph, draft graph), tier 0 steps are the
    fallback's, server_args keeps 3 steps throughout, and two ranks make the same calls."""
    steps = []
    for bs in DECODES:
        steps += [("decode", bs, False, False)]
        if bs == 25:
            steps += [("prefill", 2, False, False), ("idle", 0, False, False)]
    ranks = [TierRank(release, r, tier_args(release), noise=r) for r in range(2)]
    per_rank = run_ranks(ranks, steps)
    assert_ranks_agree(ranks, per_rank)
    assert ranks[0].verified == ranks[1].verified
    decode_modes = [s.mode for s, step in zip(per_rank[0], steps) if step[0] == "decode"]
    # 6: 2 steps; 3: band (> 4 - 2) keeps 2; 13: 1 step; 11: band keeps 1; 10: <= 12 - 2: 2 steps;
    # 25: fallback; 23, 22: band keeps the fallback (22 = 24 - 2 leaves it); 14: 1; 4: 2 (in
    # the band of 4); 1: 3 steps; 30: fallback; 2: down three boundaries, 3 steps; 12: 2;
    # 13: 1; 5: 2 (past 12 - 2, not past 4 - 2).
    expected = [2, 2, 1, 1, 2, 0, 0, 1, 1, 2, 3, 0, 3, 2, 1, 2]
    # Where the fallback ran, the mode says so; the others verified with their tier's state.
    assert ["fallback" if s == 0 else "spec" for s in expected] == decode_modes
    spec_steps = [s for s in expected if s]
    names = {
        3: ("target verify graph", "draft graph"),
        2: ("target verify graph, 2 steps", "draft graph, 2 steps"),
        1: ("target verify graph, 1 steps", None),
    }
    decode_sizes = [bs for bs, s in zip(DECODES, expected) if s]
    verified = [v for v in ranks[0].verified if v[0]]  # the idle batch verifies 0 requests
    assert verified == [(bs, s, *names[s], 3) for bs, s in zip(decode_sizes, spec_steps)]
    # The idle batch (after 25, in the fallback) runs the speculative path in the state last
    # swapped in: tier 0 swaps none, so the 2 steps of the batch of 10.
    assert [v for v in ranks[0].verified if not v[0]] == [(0, 2, *names[2], 3)]
    stats = ranks[0].state.stats
    assert stats["tier_steps"] == {s: expected.count(s) for s in (3, 2, 1, 0)}
    assert stats["tier_switches"] == sum(a != b for a, b in zip([3, *expected], expected))
    assert stats["fallback_steps"] == expected.count(0)


def test_the_tiers_read_rank_local_values_only_for_logs(any_patched):
    """The tiers' methods read the rank-local free memory and clock only to report start-up:
    no branch depends on them; the choice reads the batch and the tier before."""
    tree = ast.parse((any_patched / WORKER).read_text())
    worker = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    methods = {n.name: n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_spec_tiers")}
    assert set(methods) == {
        "_spec_tiers_init",
        "_spec_tiers_build",
        "_spec_tiers_build_state",
        "_spec_tiers_select",
        "_spec_tiers_apply",
        "_spec_tiers_graph_sizes",
        "_spec_tiers_capturing_at",
        "_spec_tiers_keep_startup_counts",
    }
    local = {"tp_rank", "environ", "getenv", "time", "perf_counter", "get_available_gpu_memory", "random"}
    reads = {
        name: sorted(
            {x.attr for x in ast.walk(fn) if isinstance(x, ast.Attribute) and x.attr in local}
            | {x.id for x in ast.walk(fn) if isinstance(x, ast.Name) and x.id in local}
        )
        for name, fn in methods.items()
    }
    assert {k: v for k, v in reads.items() if v} == {
        "_spec_tiers_build": ["get_available_gpu_memory", "perf_counter", "time"],
    }
    build = methods["_spec_tiers_build"]
    tests = [ast.unparse(n.test) for n in ast.walk(build) if isinstance(n, (ast.If, ast.While, ast.IfExp))]
    assert not [t for t in tests if "before" in t or "used" in t], tests


# -- the worker on 0.5.13 to 0.5.18 --------------------------------------------------------------

# 0.5.13: 0.5.12's graph settings (server_args.cuda_graph_bs) and start-up in __init__, the
# ScheduleBatch step; 0.5.14: cuda_graph_config, server_args written in place; 0.5.17: the
# runtime context.
LATER = ["0.5.13", "0.5.14", "0.5.17"]
FLAT_GRAPH_ARGS = ("0.5.13",)  # capture sizes in server_args.cuda_graph_bs, as on 0.5.12
CUDA_GRAPH_CONFIG = "sglang/srt/model_executor/cuda_graph_config.py"
RUNTIME_CONTEXT = "sglang/srt/runtime_context.py"
BASE_SPEC_WORKER = "sglang/srt/speculative/base_spec_worker.py"


class GraphLog(list):
    """What the GPU would have done, in order: ("capture", graph, sizes) and backends made."""


@functools.cache
def _model_runner_class(tree):
    return release_type(tree, "ModelRunner")


@functools.cache
def _tp_model_worker_class(tree):
    return release_type(tree, "TpModelWorker")


@functools.cache
def model_runner_on_cpu(tree, name):
    """The release's ModelRunner of the target or draft (`name`), made without its __init__
    (the GPU): a new attention backend with its own workspace is a name."""

    class ModelRunnerOnCpu(_model_runner_class(tree)):
        def _get_attention_backend(self, init_new_workspace=False):
            assert init_new_workspace
            return f"{name} attention, own workspace"

    return ModelRunnerOnCpu


def model_runner(tree, name, args, per_phase_memory, graph_attr="decode_cuda_graph_runner"):
    """A model runner holding its server_args, attention backend and, for the target, the
    decode graph runner (`graph_attr`: graph_runner up to 0.5.13) and its graph memory
    record, under the release's own names."""
    memory = {"graph_memory_usage": {"decode": 1.0}} if per_phase_memory else {"graph_mem_usage": 1.0}
    return release_instance(
        model_runner_on_cpu(tree, name),
        server_args=args,
        tp_group="tp",
        attn_backend=f"{name} attention",
        init_new_workspace=False,
        **{graph_attr: f"{name} verify graph"},
        **memory,
    )


class LaterRank:
    """A worker of the real patched EAGLEWorkerV2 of 0.5.13, 0.5.14 or 0.5.17 (made without
    __init__, which loads models), its tiers started by the patched _spec_tiers_init through
    the release's own build_adaptive_runtime_state, _override_worker_state and
    apply_runtime_state; the release's ServerArgs, SpecRuntimeState, topk-1 chain buffers,
    from 0.5.14 its CudaGraphConfig and check_cuda_graph_backend, and (0.5.17) runtime
    context and config bags. The GPU work is logged by the stand-ins above."""

    def __init__(self, tree, version, monkeypatch, tiers=(3, 2, 1, 0), bounds=(4, 12, 24), hysteresis=2, graphs=True):
        self.log = GraphLog()
        self.flat = version in FLAT_GRAPH_ARGS
        self.graph_attr = "graph_runner" if self.flat else "decode_cuda_graph_runner"
        ns = {}
        if self.flat:
            graph_args = dict(cuda_graph_bs=list(GRAPH_BS), disable_cuda_graph=not graphs)
            ns["CudaGraphRunner"] = ns["NPUGraphRunner"] = self._verify_graph_runner()
        else:
            cfg_ns = {"field": dataclasses.field, "dataclass": dataclasses.dataclass}
            for name in ("Phase", "Backend", "PhaseConfig"):
                cfg_ns[name] = release_class(tree, CUDA_GRAPH_CONFIG, name, cfg_ns)
            # 0.5.17's prefill default asks the machine (CUDA: breakable graphs); decode is FULL.
            cfg_ns["default_prefill_backend"] = lambda: cfg_ns["Backend"].FULL
            for name in ("CudaGraphConfig", "check_cuda_graph_backend"):
                cfg_ns[name] = release_class(tree, CUDA_GRAPH_CONFIG, name, cfg_ns)
            config = cfg_ns["CudaGraphConfig"]()
            config.decode.backend = "full" if graphs else "disabled"
            config.decode.bs, config.decode.max_bs = list(GRAPH_BS), GRAPH_BS[-1]
            graph_args = dict(cuda_graph_config=config)
            ns.update(
                Phase=cfg_ns["Phase"],
                Backend=cfg_ns["Backend"],
                check_cuda_graph_backend=cfg_ns["check_cuda_graph_backend"],
                DecodeCudaGraphRunner=self._verify_graph_runner(),
            )
        args = self.server_args = server_args(
            server_args_class(tree, {}),
            speculative_algorithm="EAGLE3",
            speculative_eagle_topk=1,
            speculative_num_steps=3,
            speculative_num_draft_tokens=4,
            speculative_num_steps_tiers=list(tiers),
            speculative_num_steps_tier_boundaries=list(bounds),
            speculative_disable_batch_size_hysteresis=hysteresis,
            speculative_disable_batch_size_threshold=bounds[-1] if 0 in tiers else None,
            max_running_requests=64,
            device="cpu",
            **graph_args,
        )
        self.per_phase = version not in ("0.5.13", "0.5.14")
        ns.update(
            {
                "torch": torch,
                "time": __import__("time"),
                "contextlib": contextlib,
                "dataclasses": dataclasses,
                "logger": logging.getLogger("spec-tiers-test"),
                "log_info_on_rank0": lambda logger, msg: self.log.append(("sglang log", msg.split(":")[0])),
                "speculative_moe_backend_context": contextlib.nullcontext,
                "speculative_moe_a2a_backend_context": contextlib.nullcontext,
                "_is_npu": False,
            }
        )
        free = iter(80.0 - 0.25 * k for k in range(1000))
        ns["get_available_gpu_memory"] = lambda device, gpu_id: next(free)
        # The published server arguments check_cuda_graph_backend reads: 0.5.14's global
        # ServerArgs, from 0.5.16 the runtime context.
        published = types.ModuleType("sglang.srt.server_args")
        published.get_global_server_args = lambda: args
        monkeypatch.setitem(sys.modules, published.__name__, published)
        if self.per_phase:
            self._runtime_context(tree, args, ns, monkeypatch)
        ns["SpecRuntimeState"] = release_class(tree, RUNTIME_STATE, "SpecRuntimeState", {})
        ns["SpecTiers"] = load_function(tree / WORKER, "SpecTiers", {"dataclasses": dataclasses})
        base = release_class(tree, BASE_SPEC_WORKER, "BaseSpecWorker", {})
        cls = release_class(tree, WORKER, "EAGLEWorkerV2", {**ns, "BaseSpecWorker": base})
        w = self.worker = object.__new__(cls)
        if self.per_phase:
            base.__init__(w)
        w.server_args, w.topk, w.device, w.gpu_id = args, 1, "cpu", 0
        w.speculative_num_steps, w.speculative_num_draft_tokens = 3, 4
        w._target_worker = release_instance(
            _tp_model_worker_class(tree),
            _model_runner=model_runner(tree, "target", args, self.per_phase, self.graph_attr),
        )
        w._draft_worker = self._draft_worker(tree, args, ns)
        w.adaptive_controller = None
        w._spec_fallback = fallback_state_class(tree)(threshold=args.speculative_disable_batch_size_threshold)
        w._spec_tiers_init(args)
        self.tiers = w._spec_tiers

    def _draft_worker(self, tree, args, ns):
        """The release's EagleDraftWorker, its methods' globals `ns` (its own
        _rebuild_topk1_chain_buffers runs), holding the state the release's runtime states
        swap; what needs the GPU is overridden: its tensor-parallel context and the backends
        it makes are logged names, its graphs are captured by _capture_draft_graphs."""
        rank = self

        class DraftWorkerOnCpu(release_type(tree, "EagleDraftWorker", ns, rel=WORKER)):
            @contextlib.contextmanager
            def draft_tp_context(self, tp_group):
                rank.log.append(("draft tp context", tp_group))
                yield

            def init_attention_backend(self):
                self.draft_attn_backend = f"draft attention, {self.speculative_num_steps} steps"
                self.draft_extend_attn_backend = f"draft extend attention, {self.speculative_num_draft_tokens} tokens"

            # The release's capture: in init_cuda_graphs up to 0.5.13, from 0.5.14 in the
            # _capture_cuda_graphs it calls.
            if rank.flat:

                def init_cuda_graphs(self):
                    rank._capture_draft_graphs(self, ns)

            else:

                def _capture_cuda_graphs(self):
                    rank._capture_draft_graphs(self, ns)

        runner = model_runner(tree, "draft", args, self.per_phase, self.graph_attr)
        runner.draft_attn_backend = None  # an attribute the release's draft worker gives its runner
        return release_instance(
            DraftWorkerOnCpu,
            server_args=args,
            topk=1,
            device="cpu",
            speculative_num_steps=args.speculative_num_steps,
            speculative_num_draft_tokens=args.speculative_num_draft_tokens,
            draft_runner=runner,
            draft_attn_backend="draft attention",
            draft_extend_attn_backend="draft extend attention",
            cuda_graph_runner="draft graph",
            cuda_graph_runner_for_draft_extend="draft extend graph",
        )

    def graph_sizes(self, args):
        """The decode capture sizes in `args` where the release's graph runners read them:
        server_args.cuda_graph_bs up to 0.5.13, server_args.cuda_graph_config.decode.bs from
        0.5.14."""
        return tuple(args.cuda_graph_bs if self.flat else args.cuda_graph_config.decode.bs)

    def _capture_draft_graphs(self, dw, ns):
        """The draft's graphs for the step count `dw` holds: the sizes read where the release's
        graph runners read them (graph_sizes), no capture where they skip it
        (server_args.disable_cuda_graph up to 0.5.13, then check_cuda_graph_backend)."""
        dw.cuda_graph_runner = dw.cuda_graph_runner_for_draft_extend = None
        if self.flat:
            if dw.server_args.disable_cuda_graph:
                return
        elif ns["check_cuda_graph_backend"]("decode", "disabled"):
            return
        sizes = self.graph_sizes(dw.draft_runner.server_args)
        if dw.speculative_num_steps > 1:
            dw.cuda_graph_runner = f"draft graph, {dw.speculative_num_steps} steps"
            self.log.append(("capture", dw.cuda_graph_runner, sizes))
        # Its width: the release's draft-extend runner reads model_runner.server_args (0.5.14:
        # speculative_num_draft_tokens; 0.5.16-0.5.17: resolve_num_tokens_per_req of it).
        width = dw.draft_runner.server_args.speculative_num_draft_tokens
        dw.cuda_graph_runner_for_draft_extend = f"draft extend graph, {width} tokens"
        self.log.append(("capture", dw.cuda_graph_runner_for_draft_extend, sizes))

    def _runtime_context(self, tree, args, ns, monkeypatch):
        """0.5.17's runtime context, its config bags made from `args` by the release's own
        _build_config_bags; which bag each field lives in is the release's NS metadata, which
        needs all of SGLang: named here for the fields the worker writes and reads."""
        arg_utils = types.ModuleType("sglang.srt.arg_groups.arg_utils")
        arg_utils.namespace_of = lambda cls: {
            "speculative_num_steps": "spec",
            "speculative_num_draft_tokens": "spec",
            "cuda_graph_bs_decode": "exec.graph",
            "disable_cuda_graph": "exec.graph",
            "cuda_graph_config": "exec.graph",
            "max_running_requests": "schedule",
        }
        # ServerArgs.override files a field under the declared ones or the runtime mutations
        # by this whitelist (the same metadata): only which audit list it joins depends on it.
        arg_utils.resolvable_fields = lambda cls: frozenset()
        monkeypatch.setitem(sys.modules, arg_utils.__name__, arg_utils)
        rc = {"_ROLE_NS_MODE": "off", "contextmanager": contextlib.contextmanager}
        for name in ("_ConfigBag", "_build_config_bags", "RuntimeContext"):
            rc[name] = release_class(tree, RUNTIME_CONTEXT, name, rc)
        context = rc["_CONTEXT"] = object.__new__(rc["RuntimeContext"])
        context._server_args, context._overrides_log = args, []
        context._config_bags = rc["_build_config_bags"](args)
        for name in ("get_context", "get_spec", "get_exec", "get_schedule"):
            rc[name] = release_class(tree, RUNTIME_CONTEXT, name, rc)
        module = types.ModuleType("sglang.srt.runtime_context")
        module.get_context, module.get_exec = rc["get_context"], rc["get_exec"]
        monkeypatch.setitem(sys.modules, module.__name__, module)
        ns.update({name: rc[name] for name in ("get_context", "get_spec", "get_exec", "get_schedule")})
        self.context = context

    def _verify_graph_runner(self):
        log, rank = self.log, self

        class VerifyGraphRunner:
            def __init__(
                self, model_runner, attn_backend=None, speculative_num_steps=None, speculative_num_draft_tokens=None
            ):
                self.name = f"target verify graph, {speculative_num_steps} steps"
                sizes = rank.graph_sizes(model_runner.server_args)
                log.append(("capture", self.name, sizes, speculative_num_draft_tokens, attn_backend))

        return VerifyGraphRunner

    def counts(self):
        """The step counts the scheduler sizes each step's KV allocation from: server_args up
        to 0.5.17 (0.5.17 reads the start-up ServerArgs, which it never writes), the spec bag
        (get_spec()) that 0.5.17's apply_runtime_state writes and 0.5.18 reads."""
        args = self.server_args
        got = {"server_args": (args.speculative_num_steps, args.speculative_num_draft_tokens)}
        if self.per_phase:
            spec = self.context.config_bag("spec")
            got["spec"] = (spec.speculative_num_steps, spec.speculative_num_draft_tokens)
        return got

    def target_graph(self):
        """The target's decode graph runner, under the release's name for it."""
        return getattr(self.worker._target_worker.model_runner, self.graph_attr)

    def graphs_disabled(self):
        args = self.server_args
        return args.disable_cuda_graph if self.flat else args.cuda_graph_config.decode.backend == "disabled"


def test_later_releases_read_graph_sizes_where_the_tiers_set_them(patched_release):
    """The stand-ins capture where the releases' graph runners read their sizes: every
    release's get_batch_sizes_to_capture starts from the model runner's
    server_args.cuda_graph_bs (0.5.13), from 0.5.14 its server_args.cuda_graph_config.decode.bs
    (0.5.18: the published one)."""
    src = function_source(
        patched_release("0.5.13") / "sglang/srt/model_executor/cuda_graph_runner.py", "get_batch_sizes_to_capture"
    )
    assert "server_args = model_runner.server_args\n    capture_bs = server_args.cuda_graph_bs\n" in src
    for version in ("0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18"):
        src = function_source(
            patched_release(version) / "sglang/srt/model_executor/runner/base_cuda_graph_runner.py",
            "get_batch_sizes_to_capture",
        )
        assert re.search(r"capture_bs = list\((server_args|get_exec\(\)\.graph)\.cuda_graph_config\.decode\.bs\)", src)


@pytest.mark.parametrize("version", LATER)
def test_later_startup_builds_each_tier_for_its_batch_sizes(version, patched_release, monkeypatch):
    """As on 0.5.12: SGLang's own state serves 3 steps; 2 and 1 are the release's runtime
    states with graphs only at the sizes they serve, the capture sizes and the decode graph
    backend put back after; the worker starts in the 3-step state with the start-up counts
    where the scheduler reads them; the memory goes to the model runner's record up to
    0.5.16, while 0.5.17's build records its graphs per phase itself."""
    rank = LaterRank(patched_release(version), version, monkeypatch)
    w, args = rank.worker, rank.server_args
    captures = [c for c in rank.log if c[0] == "capture"]
    assert captures == tier_captures("target attention, own workspace")
    assert sorted(rank.tiers.states) == [1, 2, 3]
    assert rank.tiers.states[3].target_graph_runner == "target verify graph"  # SGLang's own
    assert rank.tiers.states[1].cuda_graph_runner is None
    assert rank.graph_sizes(args) == GRAPH_BS and not rank.graphs_disabled()
    assert (w.speculative_num_steps, w.speculative_num_draft_tokens) == (3, 4)
    assert w._draft_worker.cuda_graph_runner == "draft graph"
    assert rank.target_graph() == "target verify graph"
    assert set(rank.counts().values()) == {(3, 4)}
    mr = w._target_worker.model_runner
    # Free memory falls by 0.25 GiB at each reading: the tiers' two, and around each of the
    # two states the release built its own two (0.5.17: four, its target graph's too).
    readings = 2 + 2 * (4 if rank.per_phase else 2)
    assert w._spec_fallback.stats["tiers_startup_memory_gib"] == 0.25 * (readings - 1)
    if rank.per_phase:
        assert mr.graph_memory_usage == {"decode": 1.0}
        assert w._additional_graph_memory_usage["target_verify"] == 0.5  # the release's record
    else:
        assert mr.graph_mem_usage == 2.25


@pytest.mark.parametrize("version", LATER)
def test_later_startup_in_a_tier_below_the_servers_step_count(version, patched_release, monkeypatch):
    """Tiers 2,0 with --speculative-num-steps 3: the worker starts in the 2-step state, and
    the scheduler's counts stay 3 steps, 4 draft tokens (apply_runtime_state wrote 2 and 3)."""
    rank = LaterRank(patched_release(version), version, monkeypatch, tiers=(2, 0), bounds=(16,), hysteresis=0)
    w = rank.worker
    assert [c for c in rank.log if c[0] == "capture"][-1][:3] == (
        "capture",
        "target verify graph, 2 steps",
        (1, 2, 4, 8, 12, 16),
    )
    assert (w.speculative_num_steps, w.speculative_num_draft_tokens) == (2, 3)
    assert w._draft_worker.speculative_num_steps == 2
    assert rank.target_graph().name == "target verify graph, 2 steps"
    assert set(rank.counts().values()) == {(3, 4)}
    if rank.per_phase:  # written back through the runtime context, after the release's own write
        assert rank.context.overrides_log()[-2:] == [
            ("adaptive_spec.restore", {"speculative_num_steps": 2, "speculative_num_draft_tokens": 3}),
            ("spec_tiers.startup_counts", {"speculative_num_steps": 3, "speculative_num_draft_tokens": 4}),
        ]


@pytest.mark.parametrize("version", LATER)
def test_later_startup_builds_a_step_count_of_two_tiers_once_for_both(version, patched_release, monkeypatch):
    """Tiers 2,3,2,0 at 4, 12, 24 (hysteresis 2): as on 0.5.12, one 2-step state with the
    graphs of both its ranges, SGLang's own for 3 steps, and the worker in the 2-step state
    with the start-up counts where the scheduler reads them."""
    rank = LaterRank(patched_release(version), version, monkeypatch, tiers=(2, 3, 2, 0))
    both = (1, 2, 4, 12, 16, 24)
    assert [c[:3] for c in rank.log if c[0] == "capture"] == [
        ("capture", "draft graph, 2 steps", both),
        ("capture", "draft extend graph, 3 tokens", both),
        ("capture", "target verify graph, 2 steps", both),
    ]
    assert sorted(rank.tiers.states) == [2, 3] and rank.worker.speculative_num_steps == 2
    assert set(rank.counts().values()) == {(3, 4)}


@pytest.mark.parametrize("version", LATER)
def test_later_without_graphs_every_tier_is_eager(version, patched_release, monkeypatch):
    rank = LaterRank(patched_release(version), version, monkeypatch, graphs=False)
    assert [c for c in rank.log if c[0] == "capture"] == []
    assert rank.tiers.states[2].target_graph_runner is None
    assert rank.graphs_disabled()


@pytest.mark.parametrize("version", LATER)
def test_later_each_decode_step_runs_its_tier(version, patched_release, monkeypatch):
    """Decode batches crossing every boundary both ways (tiers 3,2,1,0 at 4, 12, 24,
    hysteresis 2), through the patched _spec_tiers_select: each step's state is its tier's
    (tier 0 keeps the last one: the fallback runs; a batch the fallback does not take runs the
    start-up state), idle batches keep the tier, and the scheduler's counts are the start-up
    ones after every step."""
    tree = patched_release(version)
    rank = LaterRank(tree, version, monkeypatch)
    w = rank.worker
    forward_mode, capture_mode = forward_modes(tree)
    mixin = release_class(
        tree, "sglang/srt/disaggregation/decode_schedule_batch_mixin.py", "ScheduleBatchDisaggregationDecodeMixin"
    )
    schedule_batch = release_class(
        tree,
        "sglang/srt/managers/schedule_batch.py",
        "ScheduleBatch",
        {"ScheduleBatchDisaggregationDecodeMixin": mixin, "CaptureHiddenMode": capture_mode},
    )

    def batch(mode, bs):
        """A real ScheduleBatch of the release as the worker's decode step receives it."""
        return schedule_batch(reqs=[], forward_mode=mode, seq_lens=torch.ones(bs, dtype=torch.int64), spec_info="d")

    states = []
    for bs in DECODES:
        w._spec_tiers_select(batch(forward_mode.DECODE, bs))
        states.append((w.speculative_num_steps, getattr(rank.target_graph(), "name", rank.target_graph())))
        assert set(rank.counts().values()) == {(3, 4)}, bs
        w._spec_tiers_select(batch(forward_mode.IDLE, 0))
        assert w.speculative_num_steps == states[-1][0]
    expected = [2, 2, 1, 1, 2, 0, 0, 1, 1, 2, 3, 0, 3, 2, 1, 2]
    graphs = {3: "target verify graph", 2: "target verify graph, 2 steps", 1: "target verify graph, 1 steps"}
    last = None
    for (steps, graph), want in zip(states, expected):
        last = want or last  # tier 0: the fallback's step, the state before kept
        assert (steps, graph) == (last, graphs[last])
    stats = w._spec_fallback.stats
    assert stats["tier_steps"] == {s: expected.count(s) for s in (3, 2, 1, 0)}
    assert stats["tier_switches"] == sum(a != b for a, b in zip([3, *expected], expected))
    # A batch in tier 0's range that the release's fallback keeps speculating (a grammar)
    # runs the start-up state, graphed at every size, not the last tier's.
    grammar = batch(forward_mode.DECODE, 30)
    grammar.has_grammar = True
    assert not w._spec_fallback_eligible(grammar)
    w._spec_tiers_select(grammar)
    assert (w.speculative_num_steps, rank.target_graph()) == (3, "target verify graph")
    assert stats["tier_steps"][3] == expected.count(3) + 1 and stats["tier_steps"][0] == expected.count(0)
    assert set(rank.counts().values()) == {(3, 4)}


@pytest.mark.parametrize("version", LATER)
def test_later_a_failed_tier_capture_stops_start_up_with_the_reason(version, patched_release, monkeypatch):
    """A capture that fails (out of memory on one rank) stops start-up, naming the tier."""

    def fail(self, dw, ns):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(LaterRank, "_capture_draft_graphs", fail)
    with pytest.raises(RuntimeError, match=r"could not build the tier of 2 draft steps \(RuntimeError: CUDA out"):
        LaterRank(patched_release(version), version, monkeypatch)
