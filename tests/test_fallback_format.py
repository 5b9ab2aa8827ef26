"""The fallback's decode step on the real patched files, on objects of the patched release's
own classes (EAGLEWorkerV2, its TpModelWorker, EagleDraftWorker, model runners, pools, batches
and graph runners), with the target's forward and the draft's GPU work simulated:
the result must be exactly what that release's scheduler reads (0.5.8: stride from the
worker, padded; 0.5.12: stride 1 from the result), and the verify graph is never left
installed."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from types import SimpleNamespace

import pytest

from .sglang_source import (
    eagle_draft_input_class,
    fallback_state_class,
    forward_modes,
    generation_batch_result_class,
    logits_output_class,
    model_worker_batch,
    release_instance,
    release_type,
    request,
    server_args,
    server_args_class,
)

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"

pytestmark = pytest.mark.network


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


SHARED_STEPS = ("_spec_fallback_target_decode", "_spec_fallback_as_decode", "_spec_fallback_sync_draft")


def steps(version):
    """The methods a decode step calls on the worker (0.5.12 also takes its accept_lens from
    the constants cache)."""
    return SHARED_STEPS + (("_spec_fallback_constant",) if version == "0.5.12" else ())


def worker_of(tree, ns, **attrs):
    """The patched release's EAGLEWorkerV2 (its methods, the recipes' included, reading the
    globals `ns`) holding `attrs`; a fake of one of its methods may be among them."""
    return release_instance(release_type(tree, "EAGLEWorkerV2", ns, rel=WORKER), **attrs)


@functools.cache
def _release_class(tree: Path, name: str, rel: str | None = None) -> type:
    import torch

    return release_type(tree, name, {"torch": torch}, rel=rel)


def release_object(tree, name, rel=None, **attrs):
    """An object of the release's class `name` (a model runner, the draft worker, a pool, a
    graph runner) holding `attrs`: the state, or a fake of a method, that the step reads."""
    return release_instance(_release_class(tree, name, rel), **attrs)


def draft_worker(tree, **attrs):
    return release_object(tree, "EagleDraftWorker", WORKER, **attrs)


def target_worker(tree, model_runner, **attrs):
    """The target's TpModelWorker: its model_runner is a property over _model_runner."""
    return release_object(tree, "TpModelWorker", _model_runner=model_runner, **attrs)


def algorithm(tree, name):
    return getattr(_release_class(tree, "SpeculativeAlgorithm"), name)


def _types(tree):
    """The release's own data types that a decode step reads and returns."""
    forward_mode, capture = forward_modes(tree)
    return {
        "ForwardMode": forward_mode,
        "CaptureHiddenMode": capture,
        "GenerationBatchResult": generation_batch_result_class(tree),
        "EagleDraftInput": eagle_draft_input_class(tree),
        "LogitsProcessorOutput": logits_output_class(tree),
    }


def _step_worker(tree, version, torch, types, target_forward, name="EAGLE3", ndt=4):
    """The release's EAGLEWorkerV2 whose target forward and draft sync are simulated (its
    target TpModelWorker, draft EagleDraftWorker, model runners and req-to-token pool are
    the release's classes); returns (worker, the step function, the target's model runner,
    what the draft saw)."""
    events = SimpleNamespace(Event=lambda: SimpleNamespace(record=lambda: None), current_stream=lambda: None)
    fake_torch = SimpleNamespace(
        **{k: getattr(torch, k) for k in ("int32", "int64", "ones", "full", "softmax")},
        get_device_module=lambda device: events,
    )
    ns = {
        "torch": fake_torch,
        **types,
        "speculative_moe_backend_context": _null,
        "speculative_moe_a2a_backend_context": _null,
    }
    mr = release_object(tree, "ModelRunner", attn_backend="spec-backend", graph_runner="verify-graph")
    draft = {}
    worker = worker_of(
        tree,
        ns,
        device="cpu",
        speculative_num_draft_tokens=ndt,
        req_to_token_pool=release_object(
            tree, "ReqToTokenPool", req_to_token=torch.arange(100).reshape(5, 20).to(torch.int32)
        ),
        speculative_algorithm=algorithm(tree, name),
        _target_worker=target_worker(tree, mr, forward_batch_generation=target_forward),
        _spec_fallback=fallback_state_class(tree)(
            threshold=0, attn_backend="decode-backend", graph_runner="decode-graph"
        ),
        _draft_worker=draft_worker(
            tree,
            draft_tp_context=lambda group: _null(),
            draft_runner=release_object(tree, "ModelRunner", tp_group=None),
        ),
        _spec_fallback_draft_extend=lambda *a: draft.setdefault("args", a),
    )
    for step in steps(version):  # the decode step's methods are the patched release's
        assert callable(getattr(type(worker), step, None)), step
    return worker, type(worker)._spec_fallback_decode, mr, draft


def _decode_batch(tree, types, bonus, tokens, reqs, **values):
    """A real ModelWorkerBatch of three requests in a speculative decode step."""
    import torch

    return model_worker_batch(
        tree,
        forward_mode=types["ForwardMode"].DECODE,
        seq_lens=torch.tensor([3, 5, 10]),
        seq_lens_cpu=torch.tensor([3, 5, 10]),
        seq_lens_sum=18,
        req_pool_indices=torch.tensor([0, 2, 4]),
        spec_info=types["EagleDraftInput"](**{bonus: torch.tensor(tokens, dtype=torch.int32)}),
        reqs=reqs,
        **{"return_logprob": False, **values},
    )


@pytest.mark.parametrize("version", ["0.5.8", "0.5.12"])
def test_fallback_result_format(version, patched_release, monkeypatch):
    """The result is what the release's scheduler reads: 0.5.8 takes the stride from the
    worker (padded), 0.5.12 from the result (1). On 0.5.12 the result is the target's own
    plain-decode GenerationBatchResult, so what SGLang's decode returns for MoE models
    (routed experts, the indexer's top-k, expert-distribution metrics) reaches the scheduler
    as on the speculative path."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    tree = patched_release(version)
    types = _types(tree)
    seed = version == "0.5.8"
    bonus = "verified_id" if seed else "bonus_tokens"
    bs, ndt = 3, 4
    seen = {}
    moe = {"routed_experts_output": object(), "indexer_topk_output": object(), "expert_distribution_metrics": object()}

    def target_forward(batch):
        seen.update(
            input_ids=batch.input_ids.clone(),
            seq_lens=batch.seq_lens.clone(),
            out_cache_loc=batch.out_cache_loc.clone(),
            mode=batch.forward_mode,
            installed=(mr.attn_backend, mr.graph_runner),
            capture=batch.capture_hidden_mode,
        )
        out = types["GenerationBatchResult"](
            logits_output=types["LogitsProcessorOutput"](next_token_logits=None, hidden_states=torch.zeros(bs, 6)),
            next_token_ids=torch.tensor([7, 8, 9]),
            can_run_cuda_graph=True,
            **({} if seed else moe),
        )
        seen["target_result"] = out
        return out

    worker, decode, mr, draft = _step_worker(tree, version, torch, types, target_forward, ndt=ndt)
    reqs = [request(tree, return_hidden_states=False) for _ in range(bs)]
    batch = _decode_batch(tree, types, bonus, [1, 2, 3], reqs)
    res = decode(worker, batch)

    assert seen["input_ids"].tolist() == [1, 2, 3] and seen["seq_lens"].tolist() == [4, 6, 11]
    assert seen["out_cache_loc"].tolist() == [3, 45, 90]  # req_to_token[req, seq_len]: the bonus slot
    assert seen["mode"] == types["ForwardMode"].DECODE
    assert seen["capture"] == types["CaptureHiddenMode"].FULL, "EAGLE-3's draft needs the aux hidden states"
    assert seen["installed"] == ("decode-backend", "decode-graph"), "the target ran on its own decode graph"
    assert (mr.attn_backend, mr.graph_runner) == ("spec-backend", "verify-graph"), "verify graph restored"
    assert type(res) is types["GenerationBatchResult"]
    assert res.accept_lens.tolist() == [1, 1, 1] and res.accept_lens.dtype == torch.int32
    assert type(res.next_draft_input) is types["EagleDraftInput"]
    assert getattr(res.next_draft_input, bonus).tolist() == [7, 8, 9]
    assert res.next_draft_input.new_seq_lens.tolist() == [4, 6, 11]
    assert res.logits_output.hidden_states is None, "no request asked for hidden states: no copy to the host"
    assert batch.seq_lens.tolist() == [3, 5, 10], "the draft extend sees the pre-step lengths"
    assert draft["args"][1].tolist() == [7, 8, 9], "draft KV sync over the produced tokens"
    if seed:  # the 0.5.8 consumer: stride = draft_worker.speculative_num_draft_tokens
        stride = ndt
        assert not hasattr(res, "speculative_num_draft_tokens"), "0.5.8's result has no stride of its own"
    else:  # the 0.5.12 consumer: stride = result.speculative_num_draft_tokens
        stride = res.speculative_num_draft_tokens
        assert stride == 1
        assert res is seen["target_result"], "the target's own result, with the speculative fields added"
        for name, value in moe.items():
            assert getattr(res, name) is value, f"{name} passed through"
    ids, acc = res.next_token_ids.tolist(), res.accept_lens.tolist()
    assert len(ids) == bs * stride
    assert [ids[i * stride : i * stride + acc[i]] for i in range(bs)] == [[7], [8], [9]]
    if not seed:  # a second step takes its accept_lens from the same buffer, still all 1
        batch.spec_info = types["EagleDraftInput"](bonus_tokens=torch.tensor([4, 5, 6], dtype=torch.int32))
        again = decode(worker, batch)
        assert again.accept_lens.tolist() == [1, 1, 1]
        assert again.accept_lens.data_ptr() == res.accept_lens.data_ptr(), "no new fill kernel per step"


@pytest.mark.parametrize("algorithm", ["EAGLE3", "STANDALONE"])
def test_fallback_step_serves_hidden_states_and_logprobs(algorithm, patched_release, monkeypatch):
    """0.5.12: a fallback step serves logprob and hidden-state requests as SGLang's plain
    decode does. Requests that asked for hidden states get the target forward's rows, one
    per request (for STANDALONE only then captured; a STANDALONE draft reads none); logprobs
    come out in the layout the release's scheduler reads for a speculative result: one row
    per request of its accepted tokens' logprobs, top-k entries one per request."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    tree = patched_release("0.5.12")
    types = _types(tree)
    capture = types["CaptureHiddenMode"]
    consumer = (tree / "sglang/srt/managers/scheduler_output_processor_mixin.py").read_text()
    assert "accepted_logprobs = next_token_logprobs[i]" in consumer and "flat_idx = i * max_accept + j" in consumer
    bs, seen = 3, {}
    hidden = torch.arange(bs * 6, dtype=torch.float32).reshape(bs, 6)
    top_val = [torch.tensor([-0.5, -2.5]), torch.tensor([-0.25, -3.0]), torch.tensor([-0.125, -3.5])]

    def target_forward(batch):
        seen["capture"] = batch.capture_hidden_mode
        seen["return_logprob"] = batch.return_logprob
        return types["GenerationBatchResult"](
            logits_output=types["LogitsProcessorOutput"](
                next_token_logits=None,
                hidden_states=hidden if batch.capture_hidden_mode == capture.FULL else None,
                next_token_logprobs=torch.tensor([-0.5, -0.25, -0.125]) if batch.return_logprob else None,
                next_token_top_logprobs_val=top_val if batch.return_logprob else None,
            ),
            next_token_ids=torch.tensor([7, 8, 9]),
            can_run_cuda_graph=True,
        )

    worker, decode, _, draft = _step_worker(tree, "0.5.12", torch, types, target_forward, algorithm)
    for wants_hidden in (True, False):
        reqs = [request(tree, return_hidden_states=wants_hidden and i == 1, return_logprob=True) for i in range(bs)]
        batch = _decode_batch(
            tree, types, "bonus_tokens", [1, 2, 3], reqs, return_logprob=True, top_logprobs_nums=[2, 2, 2]
        )
        res = decode(worker, batch)
        assert seen["return_logprob"] is True
        assert res.logits_output.next_token_logprobs.tolist() == [[-0.5], [-0.25], [-0.125]]
        assert [v.tolist() for v in res.logits_output.next_token_top_logprobs_val] == [
            [-0.5, -2.5],
            [-0.25, -3.0],
            [-0.125, -3.5],
        ], "top-k: entry i * 1 + 0 is request i's"
        standalone = algorithm == "STANDALONE"
        assert seen["capture"] == (capture.NULL if standalone and not wants_hidden else capture.FULL)
        if wants_hidden:
            assert res.logits_output.hidden_states is hidden, "the target's rows, one per request"
        else:
            assert res.logits_output.hidden_states is None
        assert draft.pop("args")[2] is (None if standalone else hidden), "what the draft reads"


@pytest.mark.parametrize("version", ["0.5.8", "0.5.12"])
def test_hidden_state_requests_are_seen_on_the_real_batch(version, patched_release):
    """SGLang marks a hidden-state request on the Req, not on the ModelWorkerBatch, whose
    capture mode a speculative decode batch sets to FULL whatever its requests want: the
    rule reads the requests. On 0.5.8 such batches stay on the speculative path; on 0.5.12
    they fall back like any other (the plain step serves them)."""
    tree = patched_release(version)
    types = _types(tree)
    fields = {f.name for f in dataclasses.fields(types["GenerationBatchResult"])}
    assert "routed_experts_output" in fields or version == "0.5.8"
    batch_fields = {f.name for f in dataclasses.fields(type(model_worker_batch(tree)))}
    assert "return_hidden_states" not in batch_fields and "reqs" in batch_fields
    assert types["EagleDraftInput"]().capture_hidden_mode == types["CaptureHiddenMode"].FULL
    worker = worker_of(tree, {})

    def batch(*hidden, **values):
        return model_worker_batch(
            tree,
            reqs=[request(tree, return_hidden_states=h) for h in hidden],
            **{"has_grammar": False, "return_logprob": False, **values},
        )

    assert worker._spec_fallback_returns_hidden_states(batch(False, True, False))
    assert not worker._spec_fallback_returns_hidden_states(batch(False, False))
    assert not worker._spec_fallback_returns_hidden_states(batch())
    seed = version == "0.5.8"
    for kind in (batch(False, True), batch(False, has_grammar=True), batch(False, return_logprob=True)):
        assert worker._spec_fallback_eligible(kind) is not seed
    assert worker._spec_fallback_eligible(batch(False, False)) is True


@pytest.mark.parametrize("graph_fits", [True, False])
def test_draft_kv_sync_replays_its_one_token_graph(graph_fits, patched_release):
    """0.5.12: the draft KV sync replays the one-token draft-extend graph when it fits the batch
    (and copies its outputs out of the shared graph pool), else runs the draft eagerly; either
    way every request counts one accepted token and zero correct drafts."""
    torch = pytest.importorskip("torch")
    tree = patched_release("0.5.12")
    bs, H = 3, 6
    seen = {}
    draft_input_cls = eagle_draft_input_class(tree)
    logits_output = logits_output_class(tree)

    class DraftInput(draft_input_cls):
        """The release's EagleDraftInput, its preparation of the one-token forward simulated."""

        def prepare_for_extend_to_fill_draft_kvcache(self, batch, predict, n, runner_, graph_runner):
            seen["prepare"] = (predict.tolist(), n, graph_runner)
            return release_object(tree, "ForwardBatch", spec_info=self, batch_size=bs)

    # The graph's output as the release's replay returns it: a LogitsProcessorOutput that
    # also holds the draft's top-k.
    graph_out = logits_output(next_token_logits=None, hidden_states=torch.rand(8, H))
    graph_out.topk_p, graph_out.topk_index = torch.rand(8, 1), torch.arange(8).unsqueeze(1)

    def can_run(fb):
        return graph_fits

    def replay(fb):
        seen["replayed"] = (fb.spec_info.num_correct_drafts.tolist(), fb.spec_info.num_accept_tokens.tolist())
        return graph_out

    def eager_forward(fb, skip_attn_backend_init):
        seen["eager"] = skip_attn_backend_init
        logits = torch.zeros(bs, 10)
        logits[:, 4] = 5.0
        return release_object(
            tree,
            "ModelRunnerOutput",
            logits_output=logits_output(next_token_logits=logits, hidden_states=torch.ones(bs, H)),
            can_run_graph=False,
        )

    ns = {"torch": torch, "EagleDraftInput": DraftInput, "fast_topk": lambda p, k, dim: torch.topk(p, k, dim=dim)}
    runner = release_object(tree, "EAGLEDraftExtendCudaGraphRunner", can_run=can_run, replay=replay)
    worker = worker_of(
        tree,
        ns,
        device="cpu",
        topk=1,
        _spec_fallback=fallback_state_class(tree)(draft_extend_runner=runner),
        _draft_worker=draft_worker(tree, draft_runner=release_object(tree, "ModelRunner", forward=eager_forward)),
    )
    nxt = draft_input_cls()
    batch = model_worker_batch(tree, seq_lens=torch.tensor([3, 5, 10]))
    worker._spec_fallback_draft_extend(batch, torch.tensor([7, 8, 9]), torch.zeros(bs, H), nxt)

    assert seen["prepare"] == ([7, 8, 9], 1, runner), "one token per request, graph runner offered"
    if graph_fits:
        assert seen["replayed"] == ([0, 0, 0], [1, 1, 1]) and "eager" not in seen
        assert torch.equal(nxt.hidden_states, graph_out.hidden_states[:bs])
        assert nxt.hidden_states.data_ptr() != graph_out.hidden_states.data_ptr(), "copied out of the graph pool"
        assert nxt.topk_index.squeeze(1).tolist() == [0, 1, 2]
    else:
        assert "replayed" not in seen and seen["eager"] is True
        assert nxt.topk_index.squeeze(1).tolist() == [4, 4, 4] and nxt.hidden_states.shape == (bs, H)


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.14", "0.5.15"])
def test_draft_extend_graph_is_captured_at_one_token(version, patched_release):
    """The one-token graph is captured with the worker state overridden to steps 0 / 1 draft
    token; a capture that fails stops start-up with an error naming the graph and the cause
    (never a silent eager path: under TP the other ranks would wait in the capture)."""
    import contextlib

    tree = patched_release(version)
    state = {"steps": 3}
    seen = {}

    class Factory:
        def __init__(self, server_args, runner, topk, steps):
            seen["factory_steps"] = steps

        def create_draft_extend_backend(self):
            return "one-token-backend"

    def make_runner(fail):
        def runner(dw, draft_extend_attn_backend, speculative_num_steps):
            seen["capture"] = (draft_extend_attn_backend, speculative_num_steps, state["steps"])
            if fail:
                raise RuntimeError("CUDA out of memory. Tried to allocate 32.00 MiB")
            return "one-token-graph"

        return runner

    @contextlib.contextmanager
    def override(steps, draft_tokens):
        saved, state["steps"] = state["steps"], steps
        try:
            yield
        finally:
            state["steps"] = saved

    for fail in (False, True):
        ns = {"DraftBackendFactory": Factory, "EAGLEDraftExtendCudaGraphRunner": make_runner(fail)}
        worker = worker_of(
            tree,
            ns,
            topk=1,
            _override_worker_state=override,
            _spec_fallback=fallback_state_class(tree)(),
            _draft_worker=draft_worker(tree, cuda_graph_runner_for_draft_extend="spec-graph", draft_runner=None),
        )
        build = type(worker)._spec_fallback_build_draft_extend_graph
        if fail:
            with pytest.raises(
                RuntimeError,
                match=r"could not capture a one-token draft-extend CUDA graph "
                r"\(RuntimeError: CUDA out of memory\. Tried to allocate 32\.00 MiB\)",
            ):
                build(worker, server_args(server_args_class(tree, {})))
        else:
            build(worker, server_args(server_args_class(tree, {})))
        assert seen["factory_steps"] == 0 and seen["capture"] == ("one-token-backend", 0, 0)
        assert state["steps"] == 3, "worker state restored after capture"
        assert worker._spec_fallback.draft_extend_runner == (None if fail else "one-token-graph")
    # No spec-path draft-extend graph (backend without support, or --disable-cuda-graph): none built.
    seen.clear()
    worker = worker_of(
        tree,
        ns,
        topk=1,
        _override_worker_state=override,
        _spec_fallback=fallback_state_class(tree)(),
        _draft_worker=draft_worker(tree, cuda_graph_runner_for_draft_extend=None, draft_runner=None),
    )
    build(worker, server_args(server_args_class(tree, {})))
    assert worker._spec_fallback.draft_extend_runner is None and "capture" not in seen


@pytest.mark.parametrize("version", ["0.5.12", "0.5.8", "0.5.11"])
def test_verify_done_fires_only_after_the_new_lengths_exist(version, patched_release, monkeypatch):
    """0.5.12's scheduler plans the next step once verify_done fires, reading new_seq_lens: the
    event must be recorded after the lengths are computed. In 0.5.12 it is recorded before the
    target forward (the lengths do not depend on it), so the next step is planned while this
    one runs; in the seed era after the target forward, as in spec."""
    early_plan = version == "0.5.12"
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    tree = patched_release(version)
    bonus = "bonus_tokens" if early_plan else "verified_id"
    order = []

    class SeqLens(torch.Tensor):
        """Pre-step lengths that log every `+ k` result they produce (by identity)."""

        def __add__(self, k):
            out = torch.Tensor.__add__(self.as_subclass(torch.Tensor), k)
            order.append(("lengths", id(out)))
            return out

    types = _types(tree)

    def target_forward(batch):
        order.append("target")
        return types["GenerationBatchResult"](
            logits_output=types["LogitsProcessorOutput"](next_token_logits=None, hidden_states=torch.zeros(2, 4)),
            next_token_ids=torch.tensor([5, 6]),
            can_run_cuda_graph=True,
        )

    worker, decode, _, _ = _step_worker(tree, version, torch, types, target_forward)
    worker._spec_fallback_draft_extend = lambda *a: order.append("draft")
    worker.req_to_token_pool.req_to_token = torch.arange(40).reshape(2, 20)
    events = SimpleNamespace(
        Event=lambda: SimpleNamespace(record=lambda: order.append("verify_done")), current_stream=lambda: None
    )
    decode.__globals__["torch"].get_device_module = lambda device: events
    lens = torch.tensor([3, 7])
    batch = model_worker_batch(
        tree,
        forward_mode=types["ForwardMode"].DECODE,
        seq_lens=lens.clone().as_subclass(SeqLens),
        seq_lens_cpu=lens.clone(),
        seq_lens_sum=10,
        req_pool_indices=torch.tensor([0, 1]),
        spec_info=types["EagleDraftInput"](**{bonus: torch.tensor([1, 2])}),
        reqs=[request(tree, return_hidden_states=False)] * 2,
        return_logprob=False,
    )
    res = decode(worker, batch)
    assert res.next_draft_input.new_seq_lens.tolist() == [4, 8]
    made = order.index(("lengths", id(res.next_draft_input.new_seq_lens)))
    assert made < order.index("verify_done"), f"verify_done recorded before the new lengths exist: {order}"
    if early_plan:
        assert order.index("verify_done") < order.index("target"), order
    else:
        assert order.index("verify_done") > order.index("target"), order


@pytest.mark.parametrize(
    "flags,min_bs,above,steps",
    [
        ({}, 16, 32, 4),
        ({"speculative_disable_draft_decode_min_bs": None, "speculative_disable_kv_only_margin": None}, None, None, 1),
        (
            {
                "speculative_disable_draft_decode_min_bs": 1,
                "speculative_disable_kv_only_margin": 8,
                "speculative_disable_kv_only_steps_per_replay": 1,
            },
            1,
            40,
            1,
        ),
    ],
)
@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16"])
def test_start_up_takes_the_draft_sync_from_server_args(version, flags, min_bs, above, steps, patched_release):
    """The start-up of 0.5.12 (and of 0.5.11 and 0.5.13 to 0.5.16, which insert it unchanged): a decode
    attention backend for the target, then the draft sync's settings from the server args
    (None: 'off'): a plain draft backend from the min batch size, the KV-only sync above
    threshold + margin with its steps per replay; without CUDA graphs nothing is captured. The
    GPU memory it took (free memory before minus after, as SGLang measures its graphs') is
    logged, added to the runner's graph_mem_usage and counted."""

    tree = patched_release(version)
    cls = server_args_class(tree, {})
    free = iter([40.0, 39.25])
    logs = []
    ns = {
        "logger": SimpleNamespace(info=lambda *a: logs.append(a[0] % a[1:])),
        "get_available_gpu_memory": lambda device, gpu_id: next(free),
        "time": __import__("time"),
    }
    backends = []
    mr = release_object(
        tree,
        "ModelRunner",
        init_new_workspace=False,
        _get_attention_backend=lambda init_new_workspace: "decode-backend",
        graph_mem_usage=1.5,
    )
    draft_runner = release_object(
        tree,
        "ModelRunner",
        init_new_workspace=False,
        _get_attention_backend=lambda init_new_workspace: backends.append(1) or "plain",
    )
    worker = worker_of(
        tree,
        ns,
        _target_worker=target_worker(tree, mr),
        device="cuda",
        gpu_id=0,
        _spec_fallback=fallback_state_class(tree)(threshold=32),
        _draft_worker=draft_worker(tree, draft_runner=draft_runner),
        _spec_fallback_kv_only_unsupported=lambda: None,
    )
    worker._spec_fallback_build(
        server_args(cls, speculative_disable_batch_size_threshold=32, disable_cuda_graph=True, **flags)
    )
    state = worker._spec_fallback
    assert state.attn_backend == "decode-backend" and state.graph_runner is None
    assert state.draft_decode_min_bs == min_bs and state.draft_attn_backend == ("plain" if min_bs else None)
    assert state.kv_only_above == above and state.kv_only_steps_per_replay == steps
    assert len(backends) == (1 if min_bs else 0), "a draft backend only for the decode sync"
    assert mr.graph_mem_usage == 2.25 and state.stats["startup_memory_gib"] == 0.75
    assert (
        logs[-1].startswith("spec-fallback: start-up took 0.75 GiB of GPU memory")
        and "--disable-cuda-graph" in logs[-1]
    )


@pytest.mark.parametrize(
    "threshold,hysteresis,want",
    [(4, 2, [4, 8, 12, 16, 24, 32]), (4, 0, [8, 12, 16, 24, 32]), (0, 0, [1, 2, 4, 8, 12, 16, 24, 32]), (32, 0, [])],
)
def test_graphs_only_for_the_batch_sizes_a_fallback_step_can_have(threshold, hysteresis, want, patched_release):
    """0.5.12: the fallback's decode graph and one-token draft-extend graph are captured only
    for batch sizes above threshold - hysteresis (a smaller batch never falls back); the
    release's runners read them from server_args.cuda_graph_bs, which holds its own list
    again afterwards, also when a capture fails. The KV-only graphs take their sizes from the
    decode graph's."""
    tree = patched_release("0.5.12")
    cls = server_args_class(tree, {})
    sizes = [1, 2, 4, 8, 12, 16, 24, 32]
    seen = {}

    def runner(mr, attn_backend):
        seen["decode"] = (
            list(mr.server_args.cuda_graph_bs),
            attn_backend,
            mr.spec_algorithm,
            mr.server_args.enable_return_hidden_states,
        )
        if seen.get("fail"):
            raise RuntimeError("CUDA out of memory")
        return release_object(tree, "CudaGraphRunner", capture_bs=list(mr.server_args.cuda_graph_bs))

    args = server_args(cls, speculative_disable_batch_size_threshold=threshold, cuda_graph_bs=sizes)
    spec = _release_class(tree, "SpeculativeAlgorithm")
    ns = {"CudaGraphRunner": runner, "SpeculativeAlgorithm": spec}

    def worker():
        mr = release_object(tree, "ModelRunner", server_args=args, spec_algorithm=spec.EAGLE3)
        w = worker_of(
            tree,
            ns,
            _target_worker=target_worker(tree, mr),
            _spec_fallback=fallback_state_class(tree)(
                threshold=threshold, hysteresis=hysteresis, attn_backend="decode-backend"
            ),
            speculative_algorithm=spec.EAGLE3,
            _draft_worker=draft_worker(tree, draft_runner=release_object(tree, "ModelRunner", server_args=args)),
            _spec_fallback_build_draft_extend_graph=lambda a: seen.setdefault("draft", list(a.cuda_graph_bs)),
            _spec_fallback_build_kv_only_graphs=lambda a: seen.setdefault("kv_only", w._spec_fallback.graph_runner),
        )
        return w, mr

    w, mr = worker()
    what = w._spec_fallback_build_graphs(args)
    assert (
        args.cuda_graph_bs == sizes and args.enable_return_hidden_states is False and mr.spec_algorithm == spec.EAGLE3
    )
    if not want:
        assert "decode" not in seen and w._spec_fallback.graph_runner is None and what.startswith("none")
        return
    assert seen["decode"] == (want, "decode-backend", spec.NONE, True), "plain decode graphs with EAGLE-3's capture"
    assert seen["draft"] == want and seen["kv_only"].capture_bs == want and what == f"batch sizes {want}"
    seen.clear()
    seen["fail"] = True
    w, mr = worker()
    with pytest.raises(RuntimeError, match="could not capture a decode CUDA graph"):
        w._spec_fallback_build_graphs(args)
    assert (
        args.cuda_graph_bs == sizes and args.enable_return_hidden_states is False and mr.spec_algorithm == spec.EAGLE3
    )


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15"])
def test_draft_kv_sync_as_a_plain_decode_step(version, patched_release):
    """From --speculative-disable-draft-decode-min-bs requests up (default 16), the draft KV
    sync is a DECODE forward of the draft on its own plain attention backend: same slots and
    positions as the draft extend, metadata planned without spec_info (so triton's decode path
    reads req_to_token, not a draft tree), the target's hidden states given to the model, and
    the batch and the draft runner left as they were."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    bs, H = 3, 6
    seen = {}
    forward_mode, capture_mode = forward_modes(tree)
    # The release's EagleDraftInput and its bases (0.5.15 has no V2 mixin file).
    spec_names = {
        "torch": torch,
        "CaptureHiddenMode": capture_mode,
        "SpecInputType": release_type(tree, "SpecInputType", rel="sglang/srt/speculative/spec_info.py"),
    }
    draft_input_cls = release_type(tree, "EagleDraftInput", spec_names, rel="sglang/srt/speculative/eagle_info.py")
    logits_output = logits_output_class(tree)
    forward_batch_cls = _release_class(tree, "ForwardBatch")

    class Reached(Exception):
        """The draft extend's preparation was reached (its GPU work is not simulated)."""

    class DraftInput(draft_input_cls):
        """The release's EagleDraftInput; up to 0.5.13 it prepares the draft extend."""

        def prepare_for_extend_to_fill_draft_kvcache(self, *args):
            raise Reached("prepare_for_extend_to_fill_draft_kvcache")

    class ForwardBatch(forward_batch_cls):
        """The release's ForwardBatch, made by init_new from the batch without its GPU work:
        the fields the draft decode reads."""

        @classmethod
        def init_new(cls, batch, runner):
            seen["attn_backend_at_init"] = runner.attn_backend
            return release_instance(
                forward_batch_cls,
                spec_info=batch.spec_info,
                forward_mode=batch.forward_mode,
                seq_lens=batch.seq_lens.clone(),
                input_ids=batch.input_ids,
                out_cache_loc=batch.out_cache_loc,
                capture_hidden_mode=batch.capture_hidden_mode,
            )

    def draft_forward(fb, skip_attn_backend_init):
        seen["forward"] = dict(
            skip=skip_attn_backend_init,
            hidden=fb.spec_info.hidden_states,
            ids=fb.input_ids.tolist(),
            dtype=fb.input_ids.dtype,
            backend=dr.attn_backend,
            slots=fb.out_cache_loc.tolist(),
            capture=fb.capture_hidden_mode,
        )
        logits = torch.zeros(bs, 10)
        logits[:, 6] = 3.0
        return release_object(
            tree,
            "ModelRunnerOutput",
            logits_output=logits_output(next_token_logits=logits, hidden_states=torch.ones(bs, H)),
            can_run_graph=False,
        )

    ns = {
        "torch": torch,
        "EagleDraftInput": DraftInput,
        "ForwardBatch": ForwardBatch,
        "ForwardMode": forward_mode,
        "CaptureHiddenMode": capture_mode,
        "fast_topk": lambda p, k, dim: torch.topk(p, k, dim=dim),
    }
    extend_input = version in ("0.5.14", "0.5.15")  # from 0.5.14 the draft worker prepares it
    if extend_input:
        ns["EagleDraftExtendInput"] = release_type(
            tree, "EagleDraftExtendInput", spec_names, rel="sglang/srt/speculative/eagle_info.py"
        )

    def prepare_for_draft_extend(*args):
        raise Reached("prepare_for_draft_extend")

    # The release's triton attention backend (its kernel-call debug logging left out), its
    # planning simulated.
    backend_cls = release_type(tree, "TritonAttnBackend", {"torch": torch, "debug_kernel_api": lambda fn: fn})
    plain = release_instance(
        backend_cls,
        init_forward_metadata=lambda fb: seen.update(planned=(fb.spec_info, fb.forward_mode, fb.seq_lens.tolist())),
    )
    dr = release_object(tree, "ModelRunner", attn_backend="draft-extend-backend", forward=draft_forward)
    worker = worker_of(
        tree,
        ns,
        device="cpu",
        topk=1,
        _spec_fallback=fallback_state_class(tree)(draft_decode_min_bs=2, draft_attn_backend=plain),
        speculative_algorithm=algorithm(tree, "EAGLE3"),
        _draft_worker=draft_worker(
            tree,
            draft_runner=dr,
            **({"prepare_for_draft_extend": prepare_for_draft_extend} if extend_input else {}),
        ),
    )
    extend = type(worker)._spec_fallback_draft_extend
    target_hidden = torch.rand(bs, 3 * H)
    # The batch the worker is given: a ModelWorkerBatch up to 0.5.12, from 0.5.13 (which
    # has none) the ScheduleBatch itself.
    batch_values = dict(
        seq_lens=torch.tensor([3, 5, 10]),
        seq_lens_cpu=torch.tensor([3, 5, 10]),
        seq_lens_sum=18,
        out_cache_loc=torch.tensor([3, 45, 90]),
        spec_info="stale",
        forward_mode=forward_mode.DECODE,
    )
    if "class ModelWorkerBatch" in (tree / "sglang/srt/managers/schedule_batch.py").read_text():
        batch = model_worker_batch(tree, **batch_values)
    else:
        modes = {"torch": torch, "ForwardMode": forward_mode, "CaptureHiddenMode": capture_mode}
        batch = release_instance(release_type(tree, "ScheduleBatch", modes), **batch_values)
    nxt = draft_input_cls()
    extend(worker, batch, torch.tensor([7, 8, 9], dtype=torch.int32), target_hidden, nxt)

    assert seen["attn_backend_at_init"] is plain and seen["planned"] == (None, forward_mode.DECODE, [4, 6, 11])
    f = seen["forward"]
    assert f["skip"] is True and f["backend"] is plain and f["hidden"] is target_hidden
    assert f["ids"] == [7, 8, 9] and f["dtype"] == torch.int64 and f["slots"] == [3, 45, 90]
    assert f["capture"] == capture_mode.FULL
    assert nxt.topk_index.squeeze(1).tolist() == [6, 6, 6] and nxt.hidden_states.shape == (bs, H)
    assert dr.attn_backend == "draft-extend-backend", "the draft runner's backend restored"
    assert batch.seq_lens.tolist() == [3, 5, 10] and batch.seq_lens_sum == 18

    # Below the batch size it names, the draft extend path runs (its preparation is reached:
    # from 0.5.14 the draft worker prepares it).
    worker._spec_fallback.draft_decode_min_bs = 4
    prepare = (
        "prepare_for_draft_extend" if version in ("0.5.14", "0.5.15") else "prepare_for_extend_to_fill_draft_kvcache"
    )
    with pytest.raises(Reached, match=prepare):
        extend(worker, batch, torch.tensor([7, 8, 9]), target_hidden, draft_input_cls())

    # The flag: on from 16 requests by default, None ('off') turns it off, a number sets the
    # batch size.
    runner = release_object(
        tree, "ModelRunner", init_new_workspace=False, _get_attention_backend=lambda init_new_workspace: "plain"
    )
    cls = server_args_class(tree, {})
    for flags, expect in (
        ({}, 16),
        ({"speculative_disable_draft_decode_min_bs": None}, None),
        ({"speculative_disable_draft_decode_min_bs": 64}, 64),
        ({"speculative_disable_draft_decode_min_bs": 1}, 1),
    ):
        w = worker_of(
            tree, {}, _draft_worker=draft_worker(tree, draft_runner=runner), _spec_fallback=fallback_state_class(tree)()
        )
        w._spec_fallback_init_draft_decode(server_args(cls, **flags))
        assert w._spec_fallback.draft_decode_min_bs == expect
        assert w._spec_fallback.draft_attn_backend == ("plain" if expect else None)
