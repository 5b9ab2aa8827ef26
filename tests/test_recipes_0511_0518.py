"""The recipes on SGLang 0.5.11 and 0.5.13 to 0.5.18 (fetched from the package index): apply, second apply is a no-op, revert, compile; every fallback method the patched
worker calls is there; the hooks sit where those releases run them; the decode step's result
goes through the release's own consumer; the draft sync and the KV-only prefill follow the
release's draft extend; the threshold flags are validated where the release validates its
speculative arguments, and the fallback's memory reserved where 0.5.12 and 0.5.13 reserve
SGLang's graphs."""

from __future__ import annotations

import abc
import ast
import contextlib
import dataclasses
import functools
import hashlib
import logging
import re
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version

from spectool import api
from spectool.testing import function_source, load_function

from .sglang_source import (
    disable_flags_parser,
    fallback_state_class,
    forward_modes,
    generation_batch_result_class,
    logits_output_class,
    model_worker_batch,
    prefill_forward_batch,
    release_class,
    release_envs,
    release_instance,
    release_type,
    server_args,
    server_args_class,
)
from .test_fallback_kv_only import H, V, _eagle3_model

pytestmark = pytest.mark.network

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
BATCH = "sglang/srt/managers/schedule_batch.py"
STANDALONE = "sglang/srt/speculative/standalone_worker_v2.py"
ARGS = "sglang/srt/server_args.py"
HOOK = "sglang/srt/arg_groups/speculative_hook.py"
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RELEASES = ["0.5.11", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18"]
# The ScheduleBatch worker: 0.5.13.post1's differs from 0.5.13's only in drafting; 0.5.15
# runs 0.5.14's variant (its scheduler no longer pre-claims the bonus KV slot).
ERAS = ["0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18"]
LATER = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18")  # graphs built after the workers
ARGUMENT_CAPTURE = ("0.5.16", "0.5.17", "0.5.18")  # the capture passed to the forwards
BASE_SPEC = "sglang/srt/speculative/base_spec_worker.py"
CUDA_GRAPH_CONFIG = "sglang/srt/model_executor/cuda_graph_config.py"


@functools.cache
def _sglang(tree, name):
    """The release's class `name` (a pool, a batch, a model runner, an enum), its methods'
    globals the libraries and enums they read."""
    import torch

    forward_mode, capture = forward_modes(tree)
    ns = {"torch": torch, "nn": torch.nn, "abc": abc, "ForwardMode": forward_mode, "CaptureHiddenMode": capture}
    return release_type(tree, name, ns)


def _new(tree, name, **attrs):
    """An object of the release's class `name` holding `attrs` (release_instance)."""
    return release_instance(_sglang(tree, name), **attrs)


def _worker(tree, ns, cls="EAGLEWorkerV2", **attrs):
    """An object of the patched release's worker class `cls` (EAGLEWorkerV2 or the draft
    worker EagleDraftWorker of eagle_worker_v2.py), its methods, the recipes' inserted ones
    among them, reading `ns` as their globals; `attrs` are its state (a method given there
    shadows the class's)."""
    ns = dict(ns)
    base = tree / BASE_SPEC
    if base.exists() and "class HiCacheDraftPlan" in base.read_text():  # BaseSpecWorker makes one
        mode = release_type(tree, "HiCacheDraftMode", {"str": str}, rel=BASE_SPEC)
        ns["HiCacheDraftPlan"] = release_type(tree, "HiCacheDraftPlan", {"HiCacheDraftMode": mode}, rel=BASE_SPEC)
    return release_instance(release_type(tree, cls, ns, rel=WORKER), **attrs)


def _decode_draft_worker(tree, ns):
    """The release's EagleDraftWorker as a fallback decode step uses it: its TP context and
    its runner's (absent) TP group; the draft sync itself is the test's."""
    return _worker(
        tree,
        ns,
        "EagleDraftWorker",
        draft_tp_context=lambda group: _null(),
        draft_runner=_new(tree, "ModelRunner", tp_group=None),
    )


def _target(tree, runner, **attrs):
    """The release's TpModelWorker holding model runner `runner` (its model_runner property
    reads _model_runner)."""
    return _new(tree, "TpModelWorker", _model_runner=runner, **attrs)


def _algorithm(tree, standalone=False):
    """The release's SpeculativeAlgorithm member: STANDALONE or EAGLE3."""
    algorithm = _sglang(tree, "SpeculativeAlgorithm")
    return algorithm.STANDALONE if standalone else algorithm.EAGLE3


def _at_least(version, floor):
    return Version(version) >= Version(floor)


def _hashes(root):
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (root / "sglang").rglob("*.py")
    }


@pytest.mark.parametrize("version", RELEASES)
def test_apply_noop_revert(version, sglang_release):
    tree = sglang_release(version)
    before = _hashes(tree)
    out = api.apply(tree)
    assert out.ok and out.wrote, [r.to_json() for r in out.plan.results]
    sm120 = "upstreamed" if _at_least(version, "0.5.15") else "applied"  # DeepGEMM opt-out upstream
    assert {r.id: r.status for r in out.plan.results} == {
        "spec-disable-threshold": "applied",
        "spec-fallback": "applied",
        "sm120": sm120,
    }
    changed = {k for k, v in _hashes(tree).items() if before[k] != v}
    # 0.5.14 starts the fallback in init_cuda_graphs, which StandaloneWorkerV2 inherits;
    # 0.5.11 validates in ServerArgs itself.
    standalone = {STANDALONE} if version not in LATER else set()
    hook = {HOOK} if version != "0.5.11" else set()
    deepgemm = {"sglang/srt/layers/deep_gemm_wrapper/configurer.py"} if sm120 == "applied" else set()
    assert changed == {ARGS, WORKER} | deepgemm | standalone | hook
    for rel in changed:
        compile((tree / rel).read_bytes(), rel, "exec")
    again = api.apply(tree)
    assert not again.wrote and {r.status for r in again.plan.results} <= {"already-applied", "upstreamed"}
    api.revert(tree)
    assert _hashes(tree) == before


def _class(path, name):
    return next(n for n in ast.parse(Path(path).read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)


def _methods(node):
    return {n.name for n in node.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("version", RELEASES)
def test_every_fallback_method_the_worker_calls_is_inserted(version, patched_release):
    """The era's variant lists 0.5.12's methods one by one: every method of
    v0_5_12/worker.py must be in the patched worker (inserted, or the era's own), and every
    self._spec_fallback_* the patched module reads must be defined there (0.5.11 takes its
    decode step from the seed era)."""
    tree = patched_release(version)
    worker = _class(tree / WORKER, "EAGLEWorkerV2")
    have = _methods(worker)
    wanted = _methods(_class(RECIPES / "spec-fallback/v0_5_12/worker.py", "EAGLEWorkerV2"))
    if version == "0.5.11":  # no KV-only sync there: none of its methods, nor the KV-only prefill
        wanted = {
            "_spec_fallback_build",
            "_spec_fallback_init_draft_decode",
            "_spec_fallback_init_draft_kv_only",
            "_spec_fallback_build_kv_only_graphs",
            "_spec_fallback_draft_decode",
            "_spec_fallback_next_draft_input",
            "_spec_fallback_kv_only_unsupported",
            "_spec_fallback_build_draft_extend_graph",
            "_spec_fallback_draft_extend",
            "_spec_fallback_decode",
            "_spec_fallback_kv_only_flush",
        }
    assert wanted <= have, sorted(wanted - have)
    assert _methods(_class(RECIPES / "spec-fallback/common.py", "EAGLEWorkerV2")) <= have
    used = {
        n.attr
        for path in (tree / WORKER, tree / STANDALONE)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and n.attr.startswith("_spec_fallback")
        and n.attr != "_spec_fallback"
    }
    assert used and used <= have, sorted(used - have)


def _fits(fn: ast.FunctionDef, call: ast.Call) -> bool:
    """Whether `call` (self.method(...)) binds to method `fn`'s parameters, self excluded."""
    params = fn.args.posonlyargs + fn.args.args
    positional = [p.arg for p in params[1:]]
    required = positional[: len(positional) - len(fn.args.defaults)]
    kwonly = {a.arg for a in fn.args.kwonlyargs}
    kwonly_required = {a.arg for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is None}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True  # *args / **kwargs: not decidable from the source
    if len(call.args) > len(positional) and fn.args.vararg is None:
        return False
    named = {k.arg for k in call.keywords}
    bound = set(positional[: len(call.args)])
    if named & bound or not named <= set(positional) | kwonly and fn.args.kwarg is None:
        return False
    return set(required) <= bound | named and kwonly_required <= named


@pytest.mark.parametrize("version", RELEASES)
def test_every_fallback_call_fits_the_inserted_method(version, patched_release):
    """Methods of several eras meet in one worker: every self._spec_fallback_*(...) call of
    the patched module passes arguments the inserted method accepts (a mismatch would stop
    the engine at start-up or at its first fallback step, on the GPU only)."""
    tree = patched_release(version)
    module = ast.parse((tree / WORKER).read_text())
    worker = _class(tree / WORKER, "EAGLEWorkerV2")
    methods = {n.name: n for n in worker.body if isinstance(n, ast.FunctionDef)}
    calls = [
        n
        for n in ast.walk(module)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
        and n.func.attr.startswith("_spec_fallback_")
    ]
    assert calls
    bad = [ast.unparse(c) for c in calls if not _fits(methods[c.func.attr], c)]
    assert not bad, bad


def _calls(fn):
    return [(n.lineno, ast.unparse(n)) for n in ast.walk(fn) if isinstance(n, ast.Call)]


@pytest.mark.parametrize("version", RELEASES)
def test_hooks_sit_where_the_release_runs_them(version, patched_release):
    """Decode: after the adaptive controller's batch-size step and before the idle input is
    made, passing on_publish on. Start-up: 0.5.13 at the end of each worker's __init__ (the
    target's graphs exist by then); 0.5.14 at the end of init_cuda_graphs, after the target's
    and the draft's graphs, which the workers' __init__ no longer build, the tiers after it."""
    tree = patched_release(version)
    worker = _class(tree / WORKER, "EAGLEWorkerV2")
    fn = {n.name: n for n in worker.body if isinstance(n, ast.FunctionDef)}
    calls = _calls(fn["forward_batch_generation"])
    line = {text: ln for ln, text in calls}
    batch = "model_worker_batch" if version == "0.5.11" else "batch"
    hook = line[f"self._spec_fallback_should_run({batch})"]
    if version == "0.5.11":
        assert line["self._spec_fallback_decode(model_worker_batch)"] > hook
    else:
        assert line["self._spec_fallback_decode(batch, on_publish)"] > hook
        assert line["self.activate_step_by_batch(batch.seq_lens.shape[0])"] < hook
    idle = next(
        n.lineno
        for n in ast.walk(fn["forward_batch_generation"])
        if isinstance(n, ast.If) and ast.unparse(n.test) == f"{batch}.spec_info is None"
    )
    assert hook < idle
    standalone = _class(tree / STANDALONE, "StandaloneWorkerV2")
    if version in LATER:
        # The tiers (--speculative-num-steps-tiers) start after the fallback, and each decode
        # step chooses its tier before the fallback decides.
        assert [ast.unparse(s) for s in fn["init_cuda_graphs"].body[-2:]] == [
            "self._spec_fallback_init(self.server_args)",
            "self._spec_tiers_init(self.server_args)",
        ]
        assert line["self.activate_step_by_batch(batch.seq_lens.shape[0])"] < line["self._spec_tiers_select(batch)"]
        assert line["self._spec_tiers_select(batch)"] < hook
        assert "_spec_fallback_init" not in ast.unparse(fn["__init__"]) + ast.unparse(standalone)
        assert "init_cuda_graphs" not in _methods(standalone), "StandaloneWorkerV2 inherits the start-up"
        imported = {
            (a.asname, n.module, a.name)
            for n in ast.parse((tree / WORKER).read_text()).body
            if isinstance(n, ast.ImportFrom)
            for a in n.names
        }
        assert (
            "CudaGraphRunner",
            "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
            "DecodeCudaGraphRunner",
        ) in imported
    else:
        for init in (fn["__init__"], next(n for n in standalone.body if getattr(n, "name", "") == "__init__")):
            text = [ast.unparse(s) for s in init.body]
            at = text.index("self._spec_fallback_init(server_args)")
            assert text[at - 1] == "self.plan_stream, self.plan_stream_ctx = _get_plan_stream(self.device)"


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@functools.cache
def _draft_inputs(tree):
    """The release's EagleDraftInput and (0.5.13 on) EagleDraftExtendInput, on their real
    bases."""
    import torch

    from .sglang_source import EAGLE_INFO, SPEC_INFO

    ns = {
        "torch": torch,
        "CaptureHiddenMode": forward_modes(tree)[1],
        "SpecInputType": release_class(tree, SPEC_INFO, "SpecInputType"),
    }
    draft = release_type(tree, "EagleDraftInput", ns, rel=EAGLE_INFO)
    if "class EagleDraftExtendInput" not in (tree / EAGLE_INFO).read_text():
        return draft, None
    return draft, release_type(tree, "EagleDraftExtendInput", ns, rel=EAGLE_INFO)


def _running(tree, n):
    """`n` running requests of the release's Req as its result consumer finds them: 10
    tokens committed, no grammar, not finished, nothing verified yet (0.5.11 counts accepted
    drafts into spec_acceptance_histogram, later releases correct ones into
    spec_correct_drafts_histogram)."""
    old = "self.spec_acceptance_histogram" in (tree / BATCH).read_text()
    drafts, histogram = (
        ("spec_accepted_drafts", "spec_acceptance_histogram")
        if old
        else ("spec_num_correct_drafts", "spec_correct_drafts_histogram")
    )
    return [
        _new(
            tree,
            "Req",
            is_retracted=False,
            grammar=None,
            finished_reason=None,
            kv_committed_len=10,
            spec_verify_ct=0,
            return_hidden_states=False,
            **{drafts: 0, histogram: []},
        )
        for _ in range(n)
    ]


def _consume(tree, result, bs):
    """The release's own SchedulerBatchResultProcessor._resolve_spec_v2_tokens on `result`,
    for a ScheduleBatch of `bs` running requests; what it reports to the worker's
    on_verify_complete_cpu is recorded."""
    import torch

    reported = []
    worker = _worker(
        tree,
        {},
        on_verify_complete_cpu=lambda drafts, batch_size: reported.append((drafts, batch_size)),
    )
    processor = release_instance(
        release_type(tree, "SchedulerBatchResultProcessor", {"torch": torch}), model_worker=worker
    )
    reqs = _running(tree, bs)
    batch = _new(tree, "ScheduleBatch", reqs=reqs, has_grammar=False, spec_algorithm=_algorithm(tree))
    return processor._resolve_spec_v2_tokens(result, batch), reqs, reported


@pytest.mark.parametrize("version", ERAS)
@pytest.mark.parametrize("host_lengths", [True, False])
def test_decode_step_publishes_its_lengths_first_and_returns_stride_one(
    version, host_lengths, patched_release, monkeypatch
):
    """One fallback step: the new lengths are published through on_publish before the target
    runs (every request gains one token, so the scheduler can plan the next step meanwhile),
    the target runs one token per request on the fallback's backend and decode graph
    (0.5.14: the model runner's decode_cuda_graph_runner) which are put back after, and the
    result is the release's GenerationBatchResult that its own consumer reads as one token
    per request, with the bonus slot it pre-claimed kept. A batch without host lengths (no
    attention backend of the engine needs them) keeps none."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    tree = patched_release(version)
    result_cls = generation_batch_result_class(tree)
    forward_mode, capture = forward_modes(tree)
    draft_input, _ = _draft_inputs(tree)
    ns = {
        "torch": torch,
        "GenerationBatchResult": result_cls,
        "EagleDraftInput": draft_input,
        "ForwardMode": forward_mode,
        "CaptureHiddenMode": capture,
        "speculative_moe_backend_context": _null,
        "speculative_moe_a2a_backend_context": _null,
    }
    graph_attr = "graph_runner" if version == "0.5.13" else "decode_cuda_graph_runner"
    order, seen = [], {}
    # The model runner's attributes the step swaps, under this release's names.
    mr = _new(tree, "ModelRunner", attn_backend="spec-backend", **{graph_attr: "verify-graph"})

    def target_forward(batch, **kwargs):
        order.append("target")
        seen.update(
            capture=kwargs.get("capture_hidden_mode", getattr(batch, "capture_hidden_mode", None)),
            ids=batch.input_ids.tolist(),
            lens=batch.seq_lens.tolist(),
            host=batch.seq_lens_cpu,
            total=batch.seq_lens_sum,
            slots=batch.out_cache_loc.tolist(),
            mode=batch.forward_mode,
            installed=(mr.attn_backend, getattr(mr, graph_attr)),
        )
        return result_cls(
            logits_output=logits_output_class(tree)(
                next_token_logits=None,
                hidden_states=torch.zeros(3, 6),
                next_token_logprobs=torch.tensor([-0.5, -1.0, -2.0]),
            ),
            next_token_ids=torch.tensor([7, 8, 9]),
            can_run_cuda_graph=True,
            routed_experts_output="experts",
            indexer_topk_output="indexer",
        )

    worker = _worker(
        tree,
        ns,
        device="cpu",
        req_to_token_pool=_new(tree, "ReqToTokenPool", req_to_token=torch.arange(100).reshape(5, 20)),
        speculative_algorithm=_algorithm(tree),
        _target_worker=_target(tree, mr, forward_batch_generation=target_forward),
        _spec_fallback=fallback_state_class(tree)(
            threshold=0, attn_backend="decode-backend", graph_runner="decode-graph"
        ),
        _draft_worker=_decode_draft_worker(tree, ns),
        _spec_fallback_draft_extend=lambda batch, tokens, hidden, nxt: order.append(("draft", tokens.tolist())),
    )
    lens = torch.tensor([3, 5, 10])
    running = _running(tree, 3)  # none asks for hidden states (Req.return_hidden_states)
    batch = _new(
        tree,
        "ScheduleBatch",
        reqs=running,
        return_logprob=False,
        seq_lens=lens.clone(),
        seq_lens_cpu=lens.clone() if host_lengths else None,
        seq_lens_sum=18 if host_lengths else None,
        req_pool_indices=torch.tensor([0, 2, 4]),
        spec_info=draft_input(bonus_tokens=torch.tensor([1, 2, 3], dtype=torch.int32)),
    )
    decode = worker._spec_fallback_decode
    res = decode(batch, lambda new: order.append(("publish", new.tolist(), new)))

    (_, published, published_tensor), target = order[0], order.index("target")
    assert published == [4, 6, 11] and target == 1, order
    assert order[2] == ("draft", [7, 8, 9]), "the draft KV sync over the tokens the target produced"
    assert seen["ids"] == [1, 2, 3] and seen["lens"] == [4, 6, 11] and seen["slots"] == [3, 45, 90]
    assert seen["mode"] == forward_mode.DECODE and seen["installed"] == ("decode-backend", "decode-graph")
    assert seen["capture"] == capture.FULL, "EAGLE-3's draft reads the target's auxiliary hidden states"
    assert (mr.attn_backend, getattr(mr, graph_attr)) == ("spec-backend", "verify-graph"), "the verify graph is back"
    if host_lengths:
        assert seen["host"].tolist() == [4, 6, 11] and seen["total"] == 21
        assert batch.seq_lens_cpu.tolist() == [3, 5, 10] and batch.seq_lens_sum == 18
    else:
        assert seen["host"] is None and seen["total"] is None and batch.seq_lens_cpu is None
    assert batch.seq_lens.tolist() == [3, 5, 10], "the batch holds its pre-step lengths again"
    assert isinstance(res, result_cls) and res.new_seq_lens is published_tensor
    assert res.speculative_num_draft_tokens == 1 and res.accept_lens.dtype == torch.int32
    assert res.next_draft_input.bonus_tokens.tolist() == [7, 8, 9]
    assert (res.routed_experts_output, res.indexer_topk_output) == ("experts", "indexer")

    tokens, reqs, reported = _consume(tree, res, 3)
    assert tokens == [[7], [8], [9]]
    if _at_least(version, "0.5.15"):  # nothing pre-claimed: the step commits its one token
        assert [r.kv_committed_len for r in reqs] == [11, 11, 11]
    else:
        assert [r.kv_committed_len for r in reqs] == [10, 10, 10], "the pre-claimed bonus slot is the token's"
    assert reported == [([0, 0, 0], 3)] and [r.spec_verify_ct for r in reqs] == [1, 1, 1]

    # The non-overlap scheduler passes no on_publish; it reads the lengths from the result.
    batch.spec_info = draft_input(bonus_tokens=torch.tensor([4, 5, 6], dtype=torch.int32))
    again = decode(batch, None)
    assert again.new_seq_lens.tolist() == [4, 6, 11] and again.accept_lens.data_ptr() == res.accept_lens.data_ptr()

    if version in ARGUMENT_CAPTURE:  # from 0.5.16 logprob and hidden-state batches fall back too
        batch.spec_info = draft_input(bonus_tokens=torch.tensor([4, 5, 6], dtype=torch.int32))
        batch.return_logprob = True
        running[1].return_hidden_states = True
        worker.speculative_algorithm = _algorithm(tree, standalone=True)
        served = decode(batch, None)
        assert seen["capture"] == capture.FULL, "STANDALONE captures hidden states for the requests that ask"
        # One row of accepted tokens per request, as the scheduler reads a speculative result.
        assert served.logits_output.next_token_logprobs.tolist() == [[-0.5], [-1.0], [-2.0]]
        assert tuple(served.logits_output.hidden_states.shape) == (3, 6), "one row per request"


@pytest.mark.parametrize("version", ERAS)
@pytest.mark.parametrize("graph_fits", [True, False])
def test_draft_sync_replays_its_one_token_graph(version, graph_fits, patched_release):
    """The one-token draft extend: prepared at one token per request with zero correct drafts
    and one accepted token each (0.5.14: an EagleDraftExtendInput the draft worker prepares,
    the tokens as int64); the graph's output is the draft's logits and hidden states, views
    of its buffers, so the hidden states are copied out; without a fitting graph, the draft
    forward runs eagerly on the metadata the preparation planned."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    bs = 3
    seen = {}
    logits_output = logits_output_class(tree)
    buffer = logits_output(next_token_logits=torch.zeros(8, 10), hidden_states=torch.rand(8, H))
    buffer.next_token_logits[:, 5] = 4.0
    graph_out = logits_output(next_token_logits=buffer.next_token_logits[:bs], hidden_states=buffer.hidden_states[:bs])

    def prepare(draft_input, batch, predict, n, runner_, graph_runner):
        seen["prepare"] = (predict.tolist(), predict.dtype, n, graph_runner)
        return _new(tree, "ForwardBatch", spec_info=draft_input, batch_size=bs)

    def counts(fb):  # what the forward reads: zero correct drafts, one accepted token each
        seen["counts"] = (fb.spec_info.num_correct_drafts.tolist(), fb.spec_info.num_accept_tokens.tolist())

    def eager(fb, **kw):
        counts(fb)
        seen["eager"] = kw
        logits = torch.zeros(bs, 10)
        logits[:, 2] = 3.0
        return _new(
            tree,
            "ModelRunnerOutput",
            logits_output=logits_output(next_token_logits=logits, hidden_states=torch.ones(bs, H)),
            can_run_graph=False,
        )

    draft_input, extend_input = _draft_inputs(tree)

    class DraftInput(draft_input):  # 0.5.13: the draft input prepares itself
        def prepare_for_extend_to_fill_draft_kvcache(self, *a):
            return prepare(self, *a)

    # The release's draft-extend graph runner, its fit test and replay (0.5.13: can_run and
    # replay, then can_run_graph and execute) logged.
    runner_cls = _sglang(tree, "EAGLEDraftExtendCudaGraphRunner")
    fit, run = ("can_run_graph", "execute") if hasattr(runner_cls, "can_run_graph") else ("can_run", "replay")
    runner = release_instance(
        runner_cls,
        **{fit: lambda fb: graph_fits, run: lambda fb: counts(fb) or seen.setdefault("replayed", graph_out)},
    )
    ns = {
        "torch": torch,
        "EagleDraftInput": DraftInput,
        "EagleDraftExtendInput": extend_input,
        "fast_topk": lambda p, k, dim: torch.topk(p, k, dim=dim),
        # 0.5.16 on: eagle_worker_common's, which takes return_hidden_states_before_norm too
        "prepare_for_draft_extend": lambda ext, batch, predict, n, r, g, **kw: prepare(ext, batch, predict, n, r, g),
    }
    draft_worker = {"draft_runner": _new(tree, "ModelRunner", forward=eager)}
    if version in ("0.5.14", "0.5.15"):  # the draft worker prepares the extend
        draft_worker["prepare_for_draft_extend"] = prepare
    worker = _worker(
        tree,
        ns,
        device="cpu",
        topk=1,
        _spec_fallback=fallback_state_class(tree)(draft_extend_runner=runner),
        _draft_worker=_worker(tree, ns, "EagleDraftWorker", **draft_worker),
    )
    nxt = draft_input()
    worker._spec_fallback_draft_extend(
        _new(tree, "ScheduleBatch", seq_lens=torch.tensor([3, 5, 10])),
        torch.tensor([7, 8, 9], dtype=torch.int32),
        torch.zeros(bs, 3 * H),
        nxt,
    )

    ids, dtype, n, offered = seen["prepare"]
    assert ids == [7, 8, 9] and n == 1 and offered is runner and seen["counts"] == ([0, 0, 0], [1, 1, 1])
    if version != "0.5.13":
        assert dtype == torch.int64
    if graph_fits:
        assert "eager" not in seen and nxt.topk_index.squeeze(1).tolist() == [5, 5, 5]
        assert torch.equal(nxt.hidden_states, buffer.hidden_states[:bs])
        assert nxt.hidden_states.data_ptr() != buffer.hidden_states.data_ptr(), "copied out of the graph's buffer"
    else:
        assert "replayed" not in seen and seen["eager"] == {}, "planned by the preparation, not skipped by a flag"
        assert nxt.topk_index.squeeze(1).tolist() == [2, 2, 2] and nxt.hidden_states.shape == (bs, H)


def _schedule_prefill(torch, tree, chunked):
    """Three prompts as the release's ScheduleBatch carries them: 4 new tokens, 2 after a
    cached prefix of 3, 5 new; with `chunked`, the third is a prompt's non-final chunk whose
    next prompt token is 47. Each request's slots, and the tokens the target produced."""
    torch.manual_seed(1)
    ext, prefix = [4, 2, 5], [0, 3, 0]
    reqs = [_new(tree, "Req") for _ in range(3)]
    batch = _new(
        tree,
        "ScheduleBatch",
        input_ids=torch.randint(1, V, (sum(ext),), dtype=torch.int64),
        extend_lens=ext,
        prefix_lens=prefix,
        seq_lens=torch.tensor([p + e for p, e in zip(prefix, ext)]),
        out_cache_loc=torch.arange(20, 20 + sum(ext)),
        forward_mode=forward_modes(tree)[0].EXTEND,
        has_grammar=False,
        return_logprob=False,
        return_hidden_states=False,
        multimodal_inputs=[None, None, None],
        spec_info=None,
        reqs=reqs,
        chunked_req=reqs[2] if chunked else None,
        chunked_req_next_prompt_token=47 if chunked else None,
        sampling_info=None,
    )
    if "capture_hidden_mode" in {f.name for f in dataclasses.fields(batch)}:  # up to 0.5.15
        batch.capture_hidden_mode = None
    return batch, torch.tensor([41, 42, 43])


def _schedule_forward_batch(tree):
    """The release's ForwardBatch, its init_new in miniature on a ScheduleBatch."""
    return prefill_forward_batch(tree, _sglang(tree, "ForwardBatch"), lambda b: zip(b.prefix_lens, b.extend_lens))


def _spec_settings(tree, **values):
    """0.5.17's get_spec(): the runtime context's spec config bag (the release's _ConfigBag)
    holding `values`; None where the release has none."""
    path = tree / "sglang/srt/runtime_context.py"
    if not path.exists() or "class _ConfigBag" not in path.read_text():
        return None
    bag = release_class(tree, str(path.relative_to(tree)), "_ConfigBag", {"contextmanager": contextlib.contextmanager})(
        "spec"
    )
    for name, value in values.items():
        bag._set(name, value)
    return bag


@pytest.mark.parametrize("version", ERAS)
@pytest.mark.parametrize("chunked", [False, True])
def test_kv_only_prefill_writes_what_the_release_prefill_writes(version, chunked, patched_release):
    """The KV-only draft prefill against the release's own _draft_extend_for_prefill over the
    same miniature EAGLE-3 head: the same shifted ids (a non-final chunk ends with the next
    prompt token, _eagle_prefill_tail_tokens), the same K/V at the same slots, and the next
    draft input in the release's shapes, zeros, with the sampled tokens as bonus tokens."""
    torch = pytest.importorskip("torch")

    tree = patched_release(version)
    model, forward, ref = _eagle3_model(torch, tree, fc_norm=False, sliced=True)
    tails = load_function(
        tree / "sglang/srt/speculative/eagle_utils.py", "_eagle_prefill_tail_tokens", {"torch": torch}
    )
    forward_mode, capture = forward_modes(tree)
    draft_input, extend_input = _draft_inputs(tree)
    spec = _spec_settings(tree, speculative_use_rejection_sampling=False)
    ns = {
        "torch": torch,
        "EagleDraftInput": draft_input,
        "EagleDraftExtendInput": extend_input,
        "ForwardBatch": _schedule_forward_batch(tree),
        "ForwardMode": forward_mode,
        "CaptureHiddenMode": capture,
        "contextlib": contextlib,
        "context_tuple": None,
        "maybe_detect_nan": lambda *a: None,
        "maybe_detect_inf": lambda *a: None,
        "fast_topk": lambda p, k, dim: torch.topk(p, k, dim=dim),
        "_eagle_prefill_tail_tokens": tails,
        "renorm_draft_probs": lambda logits, info, rejection: torch.softmax(logits, -1),
        # 0.5.17 reads the speculative settings from the runtime context
        "get_spec": lambda: spec,
    }
    target_hidden = torch.randn(11, 3 * H)
    logits_output = logits_output_class(tree)

    def runner_forward(fb):
        forward(fb.input_ids, fb.positions, fb)
        return _new(
            tree,
            "ModelRunnerOutput",
            logits_output=logits_output(next_token_logits=torch.rand(3, V), hidden_states=torch.rand(3, H)),
            can_run_graph=False,
        )

    draft_state = dict(
        topk=1,
        speculative_algorithm=_algorithm(tree),
        server_args=server_args(server_args_class(tree, {})),  # rejection sampling off, its default
        draft_runner=_new(tree, "ModelRunner", forward=runner_forward, canary_manager=None),
    )
    if _at_least(version, "0.5.15"):
        draft_state["seed_dsa_topk_from_draft_extend"] = False  # DSA drafts only
    ref_batch, tokens = _schedule_prefill(torch, tree, chunked)
    with torch.no_grad():
        ref_out = _worker(tree, ns, "EagleDraftWorker", **draft_state)._draft_extend_for_prefill(
            ref_batch, target_hidden, tokens
        )

    writes = []
    # The release's KV pool and EAGLE-3 draft model, the pool's writes logged.
    pool = _new(tree, "MHATokenToKVPool", set_kv_buffer=lambda *a: writes.append(a))
    dw = _worker(
        tree,
        ns,
        "EagleDraftWorker",
        draft_runner=_new(
            tree, "ModelRunner", model=_new(tree, "LlamaForCausalLMEagle3", model=model), token_to_kv_pool=pool
        ),
        _draft_extend_for_prefill=lambda *a: pytest.fail("the full draft prefill ran"),
    )
    worker = _worker(
        tree, ns, device="cpu", topk=1, _draft_worker=dw, _spec_fallback=fallback_state_class(tree)(kv_only_above=2)
    )
    batch, _ = _schedule_prefill(torch, tree, chunked)
    with torch.no_grad():
        out = worker._spec_fallback_draft_prefill(batch, target_hidden, tokens, None)

    assert batch.input_ids.tolist() == ref_batch.input_ids.tolist(), "ids shifted as the release shifts them"
    assert (batch.input_ids[-1] == 47) == chunked
    ((layer, loc, k, v, _, _),) = writes
    assert loc.tolist() == list(range(20, 31))
    assert torch.allclose(k.reshape(11, -1), ref["k"], atol=1e-6) and torch.allclose(
        v.reshape(11, -1), ref["v"], atol=1e-6
    )
    assert out.bonus_tokens is tokens and batch.spec_info is out
    for name in ("topk_p", "topk_index", "hidden_states"):
        got, want = getattr(out, name), getattr(ref_out, name)
        assert got.shape == want.shape and got.dtype == want.dtype and not got.any(), name
    assert worker._spec_fallback.stats["draft_kv_only_prefills"] == 1


def _validate(tree, version, spec_v2=True, **kw):
    envs = release_envs(tree)
    cls = server_args_class(tree, {"envs": envs, "logger": logging.getLogger("test")})
    base = dict(
        speculative_disable_batch_size_threshold=8,
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=1,
        max_running_requests=64,
    )
    args = server_args(cls, **{**base, **kw})
    if version in LATER:
        assert not hasattr(envs, "SGLANG_ENABLE_SPEC_V2")
        args._validate_speculative_disable_threshold()
        return
    with envs.SGLANG_ENABLE_SPEC_V2.override(spec_v2):
        args._validate_speculative_disable_threshold()


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.13.post1"])
def test_the_fallback_memory_is_reserved_where_sglang_reserves_its_graphs(version, patched_release, monkeypatch):
    """With --mem-fraction-static left to SGLang, its _handle_gpu_memory_settings reserves
    memory for activations and CUDA graphs before it derives the fraction; with the flag set,
    the fallback's decode graphs and attention backend are reserved there too (what SGLang
    reserves for its own: 512 MB of backend metadata and 2 MB per graph batch size), and
    nothing changes without the flag. 0.5.13 keeps 0.5.12's heuristics; from 0.5.14 nothing is
    reserved, as SGLang reserves nothing for its own adaptive states."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "true")
    patched = patched_release(version)
    server_args_cls = server_args_class(patched, {"envs": release_envs(patched), "logger": logging.getLogger("test")})
    method = ast.parse(function_source(patched / ARGS, "ServerArgs._handle_gpu_memory_settings")).body[0]
    auto = next(
        n
        for n in ast.walk(method)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "self.mem_fraction_static is None"
    )
    body = [ast.unparse(n) for n in auto.body]
    ours = next(i for i, text in enumerate(body) if "speculative_disable_batch_size_threshold" in text)
    assert body[ours - 1].startswith("if self.speculative_algorithm is not None:"), "after SGLang's draft reserve"
    assert any(t.startswith("self.mem_fraction_static = ") for t in body[ours + 1 :]), "before the fraction is derived"
    for threshold, want in ((8, 1000 + 512 + 2 * 256), (None, 1000)):
        scope = {
            "self": server_args(
                server_args_cls, speculative_disable_batch_size_threshold=threshold, cuda_graph_max_bs=256
            ),
            "reserved_mem": 1000,
        }
        exec(compile(ast.Module([auto.body[ours]], []), "reserve", "exec"), scope)
        assert scope["reserved_mem"] == want


@pytest.mark.parametrize("version", RELEASES)
def test_the_flags_are_validated_where_the_release_validates(version, patched_release):
    """The classic validation, called once the release has settled the speculative arguments:
    at the end of ServerArgs._handle_speculative_decoding (0.5.11), of speculative_hook's
    handle_speculative_decoding (0.5.13; from 0.5.14 after the algorithm's own handler, which
    settles top-k, steps and max_running_requests), from 0.5.13 just after the tiers'; the
    refusals hold (0.5.14: spec v2 is always on,
    and rejection sampling keeps draft probabilities the fallback's sync does not make)."""
    tree = patched_release(version)
    if version == "0.5.11":
        fn = next(
            n
            for n in _class(tree / ARGS, "ServerArgs").body
            if isinstance(n, ast.FunctionDef) and n.name == "_handle_speculative_decoding"
        )
        call, adaptive = "self._validate_speculative_disable_threshold()", "if self.speculative_adaptive:"
    else:
        fn = next(
            n
            for n in ast.parse((tree / HOOK).read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "handle_speculative_decoding"
        )
        call = "server_args._validate_speculative_disable_threshold()"
        adaptive = "if server_args.speculative_adaptive:\n    _maybe_disable_adaptive(server_args)"
        if version in LATER:  # after the algorithm's handler, which settles top-k and steps
            adaptive = "if algo is not None:\n    algo.handle_server_args(server_args)"
    text = [ast.unparse(s) for s in fn.body]
    at = text.index(call)
    if version != "0.5.11":  # the tiers' validation first: tier 0 sets the threshold
        assert text[at - 1] == "server_args._validate_speculative_num_steps_tiers()"
        at -= 1
    assert text[at - 1].startswith(adaptive)
    _validate(tree, version)
    _validate(tree, version, speculative_disable_batch_size_threshold=None, speculative_algorithm=None)
    refusals = [
        (dict(speculative_adaptive=True), "speculative-adaptive"),
        (dict(disable_overlap_schedule=True), "overlap (spec v2) worker only"),
        (dict(speculative_eagle_topk=4), "topk 1"),
        (dict(enable_dp_attention=True), "enable-dp-attention"),
        (dict(speculative_disable_batch_size_hysteresis=8), "below the threshold (8), got 8"),
    ]
    if version in LATER:
        refusals.append((dict(speculative_use_rejection_sampling=True), "rejection-sampling"))
    else:
        refusals.append(({"spec_v2": False}, "overlap (spec v2) worker only"))
    for kw, msg in refusals:
        with pytest.raises(ValueError, match=re.escape(msg)):
            _validate(tree, version, **kw)


@pytest.mark.parametrize("version", RELEASES)
def test_the_fallback_settings_are_server_flags(version, patched_release):
    """Every setting is a plain ServerArgs field with a hand-written flag of the same name
    (0.5.14 derives flags from annotated fields only: these are not derived twice), parsed
    with the release's argparse; 'off' is None."""
    tree = patched_release(version)
    cls = server_args_class(tree, {})
    parser = disable_flags_parser(tree, cls)
    got = parser.parse_args(
        ["--speculative-disable-batch-size-threshold", "32", "--speculative-disable-draft-decode-min-bs", "off"]
    )
    assert vars(got) == {
        "speculative_disable_batch_size_threshold": 32,
        "speculative_disable_batch_size_hysteresis": 0,
        "speculative_disable_draft_decode_min_bs": None,
        "speculative_disable_kv_only_margin": 0,
        "speculative_disable_kv_only_steps_per_replay": 4,
    }
    src = (tree / ARGS).read_text()
    after = '"--tool-call-parser"' if version in LATER else '"--speculative-adaptive-config"'
    assert src.index(after) < src.index('"--speculative-disable-batch-size-threshold"')
    if version in LATER:
        arg_utils = "sglang/srt/arg_groups/arg_utils.py"
        unwrap = load_function(
            tree / arg_utils,
            "_unwrap_annotated",
            {
                "get_origin": typing.get_origin,
                "get_args": typing.get_args,
                "Annotated": typing.Annotated,
                "Arg": release_class(tree, arg_utils, "Arg"),
            },
        )
        fields = ast.unparse(_class(tree / ARGS, "ServerArgs"))
        for name in vars(got):
            annotation = re.search(rf"{name}: (.+?) =", fields).group(1)
            assert unwrap(eval(annotation, vars(typing)))[1] is None, f"{name} would get a second, derived flag"


def test_the_test_releases_cover_the_era_variants():
    """The worker eras this file parametrises over are the variants' own ranges."""
    from packaging.version import Version

    from spectool.recipe import load_recipes

    fallback = next(r for r in load_recipes() if r.id == "spec-fallback")
    assert {fallback.variant_for(Version(v)).name for v in RELEASES} == {
        "v2-0.5.11",
        "v2-0.5.13",
        "v2-0.5.14",
        "v2-0.5.16",
    }
    assert fallback.variant_for(Version("0.5.13.post1")).name == "v2-0.5.13"


def test_0511_decode_step_is_the_padded_one_its_consumer_reads(patched_release, monkeypatch):
    """0.5.11 reads the stride from the worker and pre-claims the bonus KV slot: the seed's
    padded result (the token at i * num_draft_tokens, accept_lens all 1) gives its own
    consumer one token per request, each in the slot it claimed; verify_done fires after
    the target ran, and the next draft input carries verified_id and the new lengths."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    tree = patched_release("0.5.11")
    result_cls = generation_batch_result_class(tree)
    order = []
    # torch's device-event API, the event's record logged; the rest is torch's own.
    events = SimpleNamespace(
        Event=lambda: SimpleNamespace(record=lambda: order.append("verify_done")), current_stream=lambda: None
    )
    fake_torch = SimpleNamespace(
        **{k: getattr(torch, k) for k in ("int32", "int64", "ones")}, get_device_module=lambda device: events
    )
    forward_mode, capture = forward_modes(tree)
    draft_input, _ = _draft_inputs(tree)
    ns = {
        "torch": fake_torch,
        "GenerationBatchResult": result_cls,
        "EagleDraftInput": draft_input,
        "ForwardMode": forward_mode,
        "CaptureHiddenMode": capture,
        "speculative_moe_backend_context": _null,
        "speculative_moe_a2a_backend_context": _null,
    }

    def target_forward(batch):
        order.append("target")
        return result_cls(
            logits_output=logits_output_class(tree)(next_token_logits=None, hidden_states=torch.zeros(3, 6)),
            next_token_ids=torch.tensor([7, 8, 9]),
            can_run_cuda_graph=True,
        )

    mr = _new(tree, "ModelRunner", attn_backend="spec-backend", graph_runner="verify-graph")
    worker = _worker(
        tree,
        ns,
        device="cpu",
        speculative_num_draft_tokens=4,
        req_to_token_pool=_new(tree, "ReqToTokenPool", req_to_token=torch.arange(100).reshape(5, 20)),
        speculative_algorithm=_algorithm(tree),
        _target_worker=_target(tree, mr, forward_batch_generation=target_forward),
        _spec_fallback=fallback_state_class(tree)(threshold=0, attn_backend="d", graph_runner="dg"),
        _draft_worker=_decode_draft_worker(tree, ns),
        _spec_fallback_draft_extend=lambda batch, tokens, hidden, nxt: order.append("draft"),
    )
    lens = torch.tensor([3, 5, 10])
    batch = model_worker_batch(
        tree,
        seq_lens=lens.clone(),
        seq_lens_cpu=lens.clone(),
        seq_lens_sum=18,
        req_pool_indices=torch.tensor([0, 2, 4]),
        spec_info=draft_input(verified_id=torch.tensor([1, 2, 3], dtype=torch.int32)),
    )
    res = worker._spec_fallback_decode(batch)
    assert order == ["target", "verify_done", "draft"]
    assert res.next_draft_input.verified_id.tolist() == [7, 8, 9]
    assert res.next_draft_input.new_seq_lens.tolist() == [4, 6, 11]

    # The release's Scheduler (its grad-mode decorator aside), the stride from its worker.
    scheduler_cls = release_type(
        tree,
        "Scheduler",
        {"torch": torch, "DynamicGradMode": lambda *a, **kw: lambda fn: fn},
        rel="sglang/srt/managers/scheduler.py",
    )
    scheduler = release_instance(scheduler_cls, draft_worker=worker)
    reqs = _running(tree, 3)
    tokens = scheduler._resolve_spec_overlap_token_ids(res, _new(tree, "ScheduleBatch", reqs=reqs))
    assert tokens == [[7], [8], [9]]
    assert [r.kv_committed_len for r in reqs] == [10, 10, 10], "the pre-claimed bonus slot is the token's"
    assert [r.spec_acceptance_histogram for r in reqs] == [[1], [1], [1]], "one step of no accepted drafts"


@pytest.mark.parametrize("draft_decode", [False, True])
def test_0511_draft_sync_below_the_kv_only_margin(draft_decode, patched_release):
    """0.5.11's draft KV sync: from the draft-decode batch size a plain draft decode (0.5.12's),
    below it a one-token draft extend run eagerly with the release's accept counters (no
    correct drafts, one accepted token each). No one-token draft-extend graph is built."""
    torch = pytest.importorskip("torch")
    tree = patched_release("0.5.11")
    bs = 3
    seen = []
    draft_input, _ = _draft_inputs(tree)
    logits_output = logits_output_class(tree)

    class DraftInput(draft_input):
        def prepare_for_extend_to_fill_draft_kvcache(self, batch, predict, n, runner, graph_runner):
            seen.append(("prepare", predict.tolist(), n, graph_runner))
            return _new(tree, "ForwardBatch", spec_info=self)

    def forward(fb, skip_attn_backend_init):
        seen.append(
            (
                "forward",
                skip_attn_backend_init,
                fb.spec_info.num_accepted_drafts.tolist(),
                fb.spec_info.num_accepted_tokens.tolist(),
            )
        )
        logits = torch.zeros(bs, 10)
        logits[:, 3] = 2.0
        return _new(
            tree,
            "ModelRunnerOutput",
            logits_output=logits_output(next_token_logits=logits, hidden_states=torch.ones(bs, H)),
            can_run_graph=False,
        )

    ns = {"torch": torch, "EagleDraftInput": DraftInput, "fast_topk": lambda p, k, dim: torch.topk(p, k, dim=dim)}
    worker = _worker(
        tree,
        ns,
        device="cpu",
        topk=1,
        _spec_fallback=fallback_state_class(tree)(draft_decode_min_bs=2 if draft_decode else None),
        _draft_worker=_worker(tree, ns, "EagleDraftWorker", draft_runner=_new(tree, "ModelRunner", forward=forward)),
        _spec_fallback_draft_decode=lambda *a: seen.append(("decode",)),
    )
    nxt = draft_input()
    worker._spec_fallback_draft_extend(
        model_worker_batch(tree, seq_lens=torch.tensor([3, 5, 10])),
        torch.tensor([7, 8, 9]),
        torch.zeros(bs, 3 * H),
        nxt,
    )
    if draft_decode:
        assert seen == [("decode",)]
    else:
        assert seen == [("prepare", [7, 8, 9], 1, None), ("forward", True, [0, 0, 0], [1, 1, 1])]
        assert nxt.topk_index.squeeze(1).tolist() == [3, 3, 3] and nxt.hidden_states.shape == (bs, H)
    assert worker._spec_fallback_build_draft_extend_graph(None) is None
    assert worker._spec_fallback.draft_extend_runner is None


def test_0511_has_no_kv_only_sync_and_says_why(patched_release):
    """0.5.11's EAGLE-3 head keeps its one layer as midlayer (the release's own model file),
    not in the layers list the KV-only write reads: the sync stays off whatever the margin,
    with the reason at info level; the release's draft prefill is not replaced and the
    queue's flush is the seed's no-op."""
    tree = patched_release("0.5.11")
    model = _class(tree / "sglang/srt/models/llama_eagle3.py", "LlamaModel")
    assert "self.midlayer = " in ast.unparse(model) and "self.layers = " not in ast.unparse(model)
    path = tree / WORKER
    informed = []
    logger = logging.getLogger("spec-fallback-0511-test")
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: informed.append((record.levelno, record.getMessage()))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    ns = {"logger": logger}
    worker = _worker(tree, ns, _spec_fallback=fallback_state_class(tree)(threshold=32))
    worker._spec_fallback_init_draft_kv_only(
        server_args(server_args_class(tree, {}), speculative_disable_kv_only_margin=8)
    )
    logger.removeHandler(handler)
    assert worker._spec_fallback.kv_only_above is None
    assert informed[-1][0] == logging.INFO and "midlayer" in informed[-1][1]
    text = path.read_text()
    assert "_spec_fallback_draft_prefill" not in text and "_spec_fallback_kv_only_stash" not in text
    assert worker._spec_fallback_kv_only_flush("spec") is None


@pytest.mark.parametrize("version", RELEASES)
def test_batches_whose_outputs_the_era_does_not_serve_stay_speculative(version, patched_release):
    """0.5.12's step serves grammar, logprob and hidden-state batches; 0.5.11 and 0.5.13 to
    0.5.15 serve none of them, 0.5.16 to 0.5.18 logprobs and hidden states: the others stay
    on the speculative path, every other batch may fall back."""
    tree = patched_release(version)
    worker = _worker(tree, {})

    def batch(grammar=False, logprob=False, hidden=False):
        """The worker's batch (0.5.11: a ModelWorkerBatch, then a ScheduleBatch), its second
        request asking for hidden states with `hidden` (Req.return_hidden_states)."""
        reqs = _running(tree, 2)
        reqs[1].return_hidden_states = hidden
        values = dict(has_grammar=grammar, return_logprob=logprob, reqs=reqs)
        return model_worker_batch(tree, **values) if version == "0.5.11" else _new(tree, "ScheduleBatch", **values)

    assert worker._spec_fallback_eligible(batch()) is True
    # From 0.5.16 the step serves logprobs and hidden states as 0.5.12's does.
    served = (dict(logprob=True), dict(hidden=True)) if version in ARGUMENT_CAPTURE else ()
    for kw in served:
        assert worker._spec_fallback_eligible(batch(**kw)) is True, kw
    for kw in (dict(grammar=True), dict(logprob=True), dict(hidden=True)):
        if kw not in served:
            assert worker._spec_fallback_eligible(batch(**kw)) is False, kw


def _graph_config(tree, sizes):
    """The release's own CudaGraphConfig (0.5.14 on: cuda_graph_config.py), its decode phase
    (a PhaseConfig) capturing batch sizes `sizes` with the full backend."""
    ns = {}
    for name in ("Phase", "Backend", "PhaseConfig"):
        ns[name] = release_class(tree, CUDA_GRAPH_CONFIG, name, ns)
    ns["default_prefill_backend"] = lambda: ns["Backend"].FULL  # 0.5.17: asks the machine
    config = release_class(tree, CUDA_GRAPH_CONFIG, "CudaGraphConfig", ns)()
    config.decode.backend, config.decode.bs = "full", list(sizes)
    return config


def _decode_graph_runner(tree, init):
    """The release's DecodeCudaGraphRunner, its __init__ (which captures on the GPU) `init`."""
    return type("DecodeCudaGraphRunner", (_sglang(tree, "DecodeCudaGraphRunner"),), {"__init__": init})


def _graph_builder(tree, args, ns, seen, decode, threshold, hysteresis, standalone=False):
    """(worker, model runner): the patched worker, its target's and draft's model runners
    holding `args`, the GPU work of its graph builder logged: the draft-extend and KV-only
    captures record into `seen`."""
    mr = _new(tree, "ModelRunner", server_args=args, spec_algorithm=_algorithm(tree))
    w = _worker(
        tree,
        ns,
        _target_worker=_target(tree, mr),
        _spec_fallback=fallback_state_class(tree)(threshold=threshold, hysteresis=hysteresis, attn_backend="b"),
        speculative_algorithm=_algorithm(tree, standalone),
        _draft_worker=_worker(tree, ns, "EagleDraftWorker", draft_runner=_new(tree, "ModelRunner", server_args=args)),
        _spec_fallback_build_draft_extend_graph=lambda a: seen.setdefault("draft", list(decode.bs)),
        _spec_fallback_build_kv_only_graphs=lambda a: seen.setdefault("kv_only", True),
    )
    return w, mr


@pytest.mark.parametrize("version", [v for v in LATER if v not in ARGUMENT_CAPTURE])
@pytest.mark.parametrize("threshold,hysteresis,want", [(4, 2, [4, 8, 12, 16, 24, 32]), (32, 0, [])])
def test_graph_sizes_go_through_the_releases_cuda_graph_config(version, threshold, hysteresis, want, patched_release):
    """From 0.5.14 the graph runners read their capture sizes from
    server_args.cuda_graph_config.decode.bs (the release's own CudaGraphConfig): the
    fallback's graphs are captured only above threshold - hysteresis, and the list is put
    back after, also when a capture fails."""
    tree = patched_release(version)
    sizes = [1, 2, 4, 8, 12, 16, 24, 32]
    config = _graph_config(tree, sizes)
    decode = config.decode
    args = server_args(server_args_class(tree, {}), cuda_graph_config=config, enable_return_hidden_states=False)
    seen = {}

    def capture(runner, mr, attn_backend):
        seen["decode"] = (
            list(mr.server_args.cuda_graph_config.decode.bs),
            mr.spec_algorithm,
            mr.server_args.enable_return_hidden_states,
        )
        if seen.get("fail"):
            raise RuntimeError("CUDA out of memory")
        runner.capture_bs = list(mr.server_args.cuda_graph_config.decode.bs)

    algorithm = _sglang(tree, "SpeculativeAlgorithm")
    ns = {"CudaGraphRunner": _decode_graph_runner(tree, capture), "SpeculativeAlgorithm": algorithm}
    w, mr = _graph_builder(tree, args, ns, seen, decode, threshold, hysteresis)
    what = w._spec_fallback_build_graphs(args)
    assert decode.bs == sizes and args.enable_return_hidden_states is False and mr.spec_algorithm == algorithm.EAGLE3
    if not want:
        assert "decode" not in seen and what.startswith("none")
        return
    assert seen["decode"] == (want, algorithm.NONE, True) and seen["draft"] == want and what == f"batch sizes {want}"
    seen.clear()
    seen["fail"] = True
    with pytest.raises(RuntimeError, match="could not capture a decode CUDA graph"):
        w._spec_fallback_build_graphs(args)
    assert decode.bs == sizes and args.enable_return_hidden_states is False


@pytest.mark.parametrize("version", ARGUMENT_CAPTURE)
@pytest.mark.parametrize("standalone", [False, True], ids=["eagle3", "standalone"])
def test_0516_decode_graph_captures_hidden_states_without_writing_server_args(version, standalone, patched_release):
    """From 0.5.16 ServerArgs is read-only once resolved (0.5.17 on: always; the release's
    own __setattr__ raises): the fallback's decode graph takes its capture mode from its own
    runner class (FULL for EAGLE-3, the release's NULL for STANDALONE), captured only above
    threshold - hysteresis, with the release's real ServerArgs left untouched."""
    tree = patched_release(version)
    _, capture_mode = forward_modes(tree)
    sizes = [1, 2, 4, 8, 12, 16, 24, 32]
    config = _graph_config(tree, sizes)
    decode = config.decode
    args = server_args(server_args_class(tree, {}), enable_return_hidden_states=False, cuda_graph_config=config)
    if version != "0.5.16":  # 0.5.16 raises only under SGLANG_STRICT_CONFIG_MUTATION
        object.__setattr__(args, "_declarations_materialized", True)
        with pytest.raises(AttributeError, match="read-only"):
            args.enable_return_hidden_states = True
    seen = {}

    def capture(runner, mr, attn_backend):
        """The release's runner as far as the capture mode goes: BaseRunner.__init__ sets it
        from the server arguments, then the graphs are captured with it."""
        on = mr.server_args.enable_return_hidden_states
        runner.return_hidden_states_mode = capture_mode.FULL if on else capture_mode.NULL
        runner.enable_return_hidden_states = runner.return_hidden_states_mode.need_capture()
        runner.capture_hidden_mode = runner.return_hidden_states_mode
        seen["decode"] = (
            list(decode.bs),
            mr.spec_algorithm,
            runner.capture_hidden_mode,
            runner.enable_return_hidden_states,
        )

    algorithm = _sglang(tree, "SpeculativeAlgorithm")
    ns = {
        "CudaGraphRunner": _decode_graph_runner(tree, capture),
        "CaptureHiddenMode": capture_mode,
        "SpeculativeAlgorithm": algorithm,
    }
    w, mr = _graph_builder(tree, args, ns, seen, decode, 4, 2, standalone)
    assert w._spec_fallback_build_graphs(args) == "batch sizes [4, 8, 12, 16, 24, 32]"
    want_mode = capture_mode.NULL if standalone else capture_mode.FULL
    assert seen["decode"] == ([4, 8, 12, 16, 24, 32], algorithm.NONE, want_mode, not standalone)
    assert seen["draft"] == [4, 8, 12, 16, 24, 32] and seen["kv_only"]
    assert decode.bs == sizes and args.enable_return_hidden_states is False and mr.spec_algorithm == algorithm.EAGLE3
    # Decode graphs switched off by backend alone (--cuda-graph-backend-decode disabled):
    # the fallback captures none either.
    seen.clear()
    decode.backend = "disabled"
    assert w._spec_fallback_build_graphs(args) == "none (decode CUDA graphs are disabled)" and not seen


@pytest.mark.parametrize("version", ARGUMENT_CAPTURE)
def test_0516_draft_decode_passes_the_capture_to_init_new(version, patched_release):
    """From 0.5.16 the draft decode passes the capture (FULL: the next draft input takes the
    draft's hidden states) and return_hidden_states_before_norm to ForwardBatch.init_new,
    plans the plain draft backend's metadata and marks it ready (the forward then does not
    plan again); the batch and the draft runner's backend are put back."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    bs = 3
    seen = {}
    forward_mode, capture = forward_modes(tree)
    draft_input, _ = _draft_inputs(tree)
    logits_output = logits_output_class(tree)

    class ForwardBatch(_sglang(tree, "ForwardBatch")):
        @classmethod
        def init_new(cls, batch, runner, **kwargs):
            seen["init_new"] = (runner.attn_backend, kwargs)
            return release_instance(
                cls,
                spec_info=batch.spec_info,
                seq_lens=batch.seq_lens.clone(),
                input_ids=batch.input_ids,
                batch_size=len(batch.seq_lens),
            )

    def draft_forward(fb, **kw):
        seen["forward"] = (kw, fb.spec_info.hidden_states, fb.input_ids.tolist(), fb.forward_metadata_ready)
        logits = torch.zeros(bs, 10)
        logits[:, 6] = 3.0
        return _new(
            tree,
            "ModelRunnerOutput",
            logits_output=logits_output(next_token_logits=logits, hidden_states=torch.ones(bs, H)),
            can_run_graph=False,
        )

    ns = {
        "torch": torch,
        "EagleDraftInput": draft_input,
        "ForwardBatch": ForwardBatch,
        "ForwardMode": forward_mode,
        "CaptureHiddenMode": capture,
        "fast_topk": lambda p, k, dim: torch.topk(p, k, dim=dim),
    }
    # The release's attention backend (its kernel-call logging decorator aside), its
    # metadata planning logged.
    plain = release_instance(
        release_type(tree, "AttentionBackend", {"torch": torch, "debug_kernel_api": lambda fn: fn}),
        init_forward_metadata=lambda fb: seen.setdefault("planned", (fb.spec_info, fb.seq_lens.tolist())),
    )
    dr = _new(tree, "ModelRunner", attn_backend="draft-extend-backend", forward=draft_forward)
    worker = _worker(
        tree,
        ns,
        topk=1,
        _spec_fallback=fallback_state_class(tree)(draft_attn_backend=plain),
        speculative_algorithm=_algorithm(tree),
        _draft_worker=_worker(tree, ns, "EagleDraftWorker", draft_runner=dr),
    )
    target_hidden = torch.rand(bs, 3 * H)
    batch = _new(
        tree,
        "ScheduleBatch",
        seq_lens=torch.tensor([3, 5, 10]),
        seq_lens_cpu=None,
        seq_lens_sum=None,
        spec_info=draft_input(),  # the speculative step's, stale for this forward
        forward_mode=forward_mode.DECODE,
    )
    nxt = draft_input()
    worker._spec_fallback_draft_decode(batch, torch.tensor([7, 8, 9], dtype=torch.int32), target_hidden, nxt)

    backend, kwargs = seen["init_new"]
    assert backend is plain
    assert kwargs == {"capture_hidden_mode": capture.FULL, "return_hidden_states_before_norm": False}
    assert seen["planned"] == (None, [4, 6, 11])
    assert seen["forward"][0] == {} and seen["forward"][1] is target_hidden and seen["forward"][2] == [7, 8, 9]
    assert seen["forward"][3] is True, "the forward batch is marked planned (ForwardBatch.mark_forward_metadata_ready)"
    assert nxt.topk_index.squeeze(1).tolist() == [6, 6, 6] and nxt.hidden_states.shape == (bs, H)
    assert dr.attn_backend == "draft-extend-backend" and batch.seq_lens.tolist() == [3, 5, 10]
    assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None


@pytest.mark.parametrize("version", ARGUMENT_CAPTURE)
def test_0516_one_token_draft_extend_graph_is_built_as_upstreams_steps_0_tier(version, patched_release, monkeypatch):
    """From 0.5.16 the one-token draft-extend graph is the draft worker's own, captured under
    the worker state of steps 0 / one draft token (whose exit puts the spec path's backends
    and graphs back) inside the draft's TP context; a failed capture stops start-up; without
    a spec-path draft-extend graph none is built."""
    tree = patched_release(version)
    state = {"steps": 3, "tp": False}
    seen = []

    @contextlib.contextmanager
    def override(steps, draft_tokens):
        saved = (state["steps"], dw.cuda_graph_runner_for_draft_extend)
        state["steps"] = steps
        try:
            yield
        finally:
            state["steps"], dw.cuda_graph_runner_for_draft_extend = saved

    @contextlib.contextmanager
    def tp_context(group):
        state["tp"] = True
        try:
            yield
        finally:
            state["tp"] = False

    # The release's real ServerArgs, resolved (read-only from 0.5.17 but through override,
    # whose whitelist of re-resolvable fields lives in a module that needs all of SGLang).
    import types

    arg_utils = types.ModuleType("sglang.srt.arg_groups.arg_utils")
    arg_utils.resolvable_fields = lambda cls: set()
    monkeypatch.setitem(sys.modules, arg_utils.__name__, arg_utils)
    args = server_args(server_args_class(tree, {}), speculative_num_draft_tokens=4)
    if version != "0.5.16":
        object.__setattr__(args, "_declarations_materialized", True)

    class DraftExtendRunner(_sglang(tree, "EAGLEDraftExtendCudaGraphRunner")):
        """The release's draft-extend graph runner, sized as the release sizes it: 0.5.16 and
        0.5.17 from server_args.speculative_num_draft_tokens, 0.5.18 from the runtime
        context, which the worker state sets to one draft token."""

        def __init__(self, steps):
            self.steps = steps
            self.captured_req_width = args.speculative_num_draft_tokens if version != "0.5.18" else 1

    def capture_graphs():
        seen.append(("capture", state["steps"], state["tp"]))
        if state.get("fail"):
            raise RuntimeError("CUDA out of memory")
        dw.cuda_graph_runner_for_draft_extend = DraftExtendRunner(state["steps"])

    ns = {
        "contextlib": contextlib,
        "speculative_moe_backend_context": _null,
        "speculative_moe_a2a_backend_context": _null,
    }
    # The draft worker's state the worker-state override swaps, its TP context, backends
    # and capture logged.
    dw = _worker(
        tree,
        ns,
        "EagleDraftWorker",
        cuda_graph_runner_for_draft_extend="spec-graph",
        draft_runner=_new(tree, "ModelRunner", tp_group="g", server_args=args),
        draft_tp_context=tp_context,
        init_attention_backend=lambda: seen.append(("backends", state["steps"])),
        _capture_cuda_graphs=capture_graphs,
    )
    worker = _worker(
        tree, ns, _draft_worker=dw, _override_worker_state=override, _spec_fallback=fallback_state_class(tree)()
    )
    worker._spec_fallback_build_draft_extend_graph(None)
    assert seen == [("backends", 0), ("capture", 0, True)]
    runner = worker._spec_fallback.draft_extend_runner
    assert (runner.steps, runner.captured_req_width) == (0, 1)
    assert dw.cuda_graph_runner_for_draft_extend == "spec-graph" and state == {"steps": 3, "tp": False}
    assert args.speculative_num_draft_tokens == 4
    state["fail"] = True
    with pytest.raises(RuntimeError, match="could not capture a one-token draft-extend CUDA graph"):
        worker._spec_fallback_build_draft_extend_graph(None)
    assert dw.cuda_graph_runner_for_draft_extend == "spec-graph" and state["steps"] == 3
    assert args.speculative_num_draft_tokens == 4
    seen.clear()
    dw.cuda_graph_runner_for_draft_extend = None
    worker._spec_fallback = fallback_state_class(tree)()
    worker._spec_fallback_build_draft_extend_graph(None)
    assert not seen and worker._spec_fallback.draft_extend_runner is None


@pytest.mark.parametrize("version", LATER)
def test_startup_memory_goes_where_the_release_records_graph_memory(version, patched_release):
    """The fallback's start-up memory is added to the model runner's graph memory record, in
    the form the release's ModelRunner keeps it: a float (graph_mem_usage) up to 0.5.16,
    GiB per graph phase (graph_memory_usage) from 0.5.17, where it counts as decode."""
    tree = patched_release(version)
    runner_source = (tree / "sglang/srt/model_executor/model_runner.py").read_text()
    per_phase = "self.graph_memory_usage" in runner_source
    assert per_phase != ("self.graph_mem_usage =" in runner_source)
    free = iter([10.0, 9.25])
    ns = {
        "get_available_gpu_memory": lambda device, gpu_id: next(free),
        "time": __import__("time"),
        "logger": logging.getLogger("spec-fallback-test"),
    }
    record = {"decode": 1.0, "prefill": 0.5} if per_phase else 1.5
    mr = _new(tree, "ModelRunner", **{"graph_memory_usage" if per_phase else "graph_mem_usage": record})
    state = fallback_state_class(tree)(threshold=8)
    worker = _worker(
        tree,
        ns,
        _spec_fallback=state,
        _target_worker=_target(tree, mr),
        device="cuda",
        gpu_id=0,
        _spec_fallback_plain_attn_backend=lambda runner: "backend",
        _spec_fallback_init_draft_decode=lambda args: None,
        _spec_fallback_init_draft_kv_only=lambda args: None,
        _spec_fallback_build_graphs=lambda args: "batch sizes [16]",
    )
    worker._spec_fallback_build(server_args(server_args_class(tree, {}), disable_cuda_graph=False))
    assert state.stats["startup_memory_gib"] == 0.75 and state.attn_backend == "backend"
    if per_phase:
        assert mr.graph_memory_usage == {"decode": 1.75, "prefill": 0.5} and record == {"decode": 1.0, "prefill": 0.5}
    else:
        assert mr.graph_mem_usage == 2.25


@pytest.mark.parametrize("version", ARGUMENT_CAPTURE)
@pytest.mark.parametrize("hybrid", [False, True])
def test_0516_hybrid_targets_are_told_by_the_releases_mambaish_config(version, hybrid, patched_release, monkeypatch):
    """From 0.5.16 ModelRunner no longer answers hybrid_gdn_config / mamba2_config; SGLang
    tells a hybrid linear-attention target by configs.hybrid_arch.mambaish_config(model_config),
    and so does the fallback's start-up refusal."""
    import types

    tree = patched_release(version)
    runner_src = (tree / "sglang/srt/model_executor/model_runner.py").read_text()
    assert "def hybrid_gdn_config" not in runner_src and "def mamba2_config" not in runner_src
    arch = ast.parse((tree / "sglang/srt/configs/hybrid_arch.py").read_text())
    fn = next(n for n in arch.body if isinstance(n, ast.FunctionDef) and n.name == "mambaish_config")
    assert [a.arg for a in fn.args.args] == ["model_config"]
    # The target's ModelConfig (the release's) and the release's EAGLE-3 draft model; the
    # hybrid-arch module, which needs all of SGLang, answers for the target's config only.
    model_config_cls = release_type(
        tree,
        "ModelConfig",
        {"ModelImpl": release_type(tree, "ModelImpl"), "cached_property": functools.cached_property},
    )
    model_config = release_instance(model_config_cls)
    linear = object() if hybrid else None
    module = types.ModuleType("sglang.srt.configs.hybrid_arch")
    module.mambaish_config = lambda config: linear if config is model_config else pytest.fail("not the target's")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    worker = _worker(
        tree,
        {},
        _target_worker=_target(tree, _new(tree, "ModelRunner", model_config=model_config)),
        _draft_worker=_worker(
            tree,
            {},
            "EagleDraftWorker",
            draft_runner=_new(tree, "ModelRunner", model=_new(tree, "LlamaForCausalLMEagle3")),
        ),
    )
    if hybrid:
        with pytest.raises(ValueError, match="hybrid linear-attention targets"):
            worker._spec_fallback_refuse_unsupported_models()
    else:
        worker._spec_fallback_refuse_unsupported_models()


@pytest.mark.parametrize("version", ARGUMENT_CAPTURE)
def test_0516_capture_mode_never_asks_more_than_the_standalone_graph_captured(version, patched_release):
    """EAGLE-3 fallback forwards capture FULL (the draft reads the target's hidden states);
    STANDALONE ones NULL, or, for requests asking for hidden states, what the release's own
    decode graph captured (the server's mode, LAST with --return-hidden-states-mode last):
    the runner refuses a replay that asks more than it captured."""
    tree = patched_release(version)
    _, capture_mode = forward_modes(tree)

    def mode(standalone, graph_mode, **kw):
        """The patched worker's capture mode, STANDALONE or not, its fallback decode graph
        (the release's DecodeCudaGraphRunner) captured with `graph_mode` (None: no graph)."""
        state = fallback_state_class(tree)()
        state.graph_runner = (
            None
            if graph_mode is None
            else release_instance(_sglang(tree, "DecodeCudaGraphRunner"), capture_hidden_mode=graph_mode)
        )
        worker = _worker(
            tree,
            {"CaptureHiddenMode": capture_mode},
            speculative_algorithm=_algorithm(tree, standalone),
            _spec_fallback=state,
        )
        return worker._spec_fallback_capture_mode(**kw)

    assert mode(False, capture_mode.FULL) == capture_mode.FULL
    assert mode(False, capture_mode.FULL, hidden=True) == capture_mode.FULL
    assert mode(True, capture_mode.LAST) == capture_mode.NULL
    assert mode(True, capture_mode.LAST, hidden=True) == capture_mode.LAST
    assert mode(True, None, hidden=True) == capture_mode.FULL  # eager: whatever the request asks
