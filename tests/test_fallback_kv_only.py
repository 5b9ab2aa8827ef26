"""The KV-only draft sync (--speculative-disable-kv-only-margin) on the real patched files
of 0.5.12 to 0.5.18 (the same methods): the K and V it writes must be exactly those the
release's own EAGLE-3 draft forward computes for the same token, hidden states and position.
The reference runs SGLang's code itself (llama_eagle3's LlamaModel.forward and
LlamaDecoderLayer.forward, llama's LlamaAttention.forward_prepare_native) over small torch
modules, so a change in how the release builds the layer's input (norm order, fc_norm,
concatenation) fails this test."""

from __future__ import annotations

import abc
import ast
import functools
import logging
import typing
from types import SimpleNamespace

import pytest

from spectool.testing import load_function

from .sglang_source import (
    eagle_draft_input_class,
    fallback_state_class,
    forward_modes,
    logits_output_class,
    model_worker_batch,
    prefill_forward_batch,
    release_class,
    release_instance,
    release_type,
    request,
    server_args,
    server_args_class,
)

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
LLAMA, EAGLE3 = "sglang/srt/models/llama.py", "sglang/srt/models/llama_eagle3.py"

pytestmark = pytest.mark.network

# The releases whose fallback inserts these methods from v0_5_12/worker.py unchanged (0.5.11
# has no KV-only sync: its EAGLE-3 head keeps its layer as midlayer).
ERAS = ["0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18"]

BS, H, V, HEADS, KV_HEADS, HEAD_DIM = 3, 8, 50, 2, 1, 4


def _modules(torch, fc_norm: bool, sliced: bool = False):
    """A one-layer EAGLE-3 head in miniature; the attention records the K/V its forward makes.
    `sliced`: qkv_proj is an unquantized linear layer with a weight (the KV-only sync then
    multiplies only its K and V rows), else an opaque callable (it runs the whole projection)."""
    torch.manual_seed(0)

    class RMS(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(n) + 0.5)

        def forward(self, x, residual=None):
            if residual is not None:
                x = x + residual
                residual = x
            out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
            return out if residual is None else (out, residual)

    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    w_qkv = torch.randn(q_size + 2 * kv_size, 2 * H)

    def rope(positions, q, k):  # position-dependent, so a wrong position shows
        angle = positions[:, None].float() * 0.37
        return q * torch.cos(angle), k * torch.cos(angle) + torch.sin(angle)

    class QKV:  # a linear layer's call: the whole projection
        def __call__(self, x):
            return x @ w_qkv.T, None

    def attention(tree):
        """The release's LlamaAttention holding the miniature's projection (`sliced`: the
        release's QKVParallelLinear, unquantized, with its weight), RoPE and RadixAttention;
        its forward records the K/V the release's forward_prepare_native makes (in `seen`)."""
        qkv = QKV()
        if sliced:
            qkv = _module(
                _cls(tree, "QKVParallelLinear"),
                quant_method=release_instance(_cls(tree, "UnquantizedLinearMethod")),
                forward=QKV(),
            )
            # registered as the release's create_weights and linear layer register them
            qkv.register_parameter("weight", torch.nn.Parameter(w_qkv, requires_grad=False))
            qkv.register_parameter("bias", None)
        seen = {}

        def forward(positions, hidden_states, forward_batch):
            q, k, v = attn.forward_prepare_native(positions, hidden_states)
            seen.update(k=k, v=v, positions=positions)
            return torch.zeros(hidden_states.shape[0], H)

        radix = release_instance(
            _cls(tree, "RadixAttention"),
            tp_k_head_num=KV_HEADS,
            qk_head_dim=HEAD_DIM,
            tp_v_head_num=KV_HEADS,
            v_head_dim=HEAD_DIM,
            k_scale=None,
            v_scale=None,
        )
        attn = _module(
            _cls(tree, "LlamaAttention", LLAMA),
            q_size=q_size,
            kv_size=kv_size,
            qkv_proj=qkv,
            rotary_emb=rope,
            attn=radix,
            forward=forward,
        )
        return attn, seen

    return RMS, attention


@functools.cache
def _cls(tree, name, rel=None):
    """The release's class `name` (from `rel`, else the file defining it), its methods
    reading torch and the typing names they use; on its own bases (torch's nn.Module)."""
    if rel == EAGLE3 and name == "LlamaDecoderLayer":  # the EAGLE-3 layer, on llama's own
        return release_class(tree, rel, name, {**_names(tree, name), name: _cls(tree, name, LLAMA)})
    return release_type(tree, name, _names(tree, name), rel=rel)


def _names(tree, name):
    """The globals _cls gives the methods of the release's class `name`: torch, the typing
    names, and what its definition reads from its own module."""
    import torch

    ns = {"torch": torch, "nn": torch.nn, "abc": abc, "Optional": typing.Optional, "Tuple": tuple, "_is_npu": False}
    if name in ("EagleDraftInput", "ScheduleBatch"):  # their default capture mode
        ns["CaptureHiddenMode"] = _cls(tree, "CaptureHiddenMode")
    base = tree / "sglang/srt/speculative/base_spec_worker.py"
    if name in ("EAGLEWorkerV2", "EagleDraftWorker") and "class HiCacheDraftPlan" in base.read_text():
        # the workers' bases hold a default plan (0.5.18)
        rel_base = str(base.relative_to(tree))
        ns["HiCacheDraftMode"] = release_class(tree, rel_base, "HiCacheDraftMode", ns)
        ns["HiCacheDraftPlan"] = release_class(tree, rel_base, "HiCacheDraftPlan", ns)
    if name == "RadixAttention":  # its default attention type, from its own module
        ns["AttentionType"] = _cls(tree, "AttentionType", "sglang/srt/layers/radix_attention.py")
    return ns


def _module(cls, **attrs):
    """An object of a release class that is a torch module, made without its __init__ (which
    needs the model config and the parallel groups) but callable as a module: release_instance
    sets `attrs`, then torch's own Module.__init__ runs."""
    import torch

    obj = release_instance(cls, **attrs)
    torch.nn.Module.__init__(obj)
    return obj


def _eagle3_model(torch, tree, fc_norm: bool, sliced: bool = False, input_norm: bool = False, layers: int = 1):
    """The release's EAGLE-3 LlamaModel with one real LlamaDecoderLayer (`layers` times),
    holding the miniature's weights; its own forward; and the K/V that forward records."""
    RMS, attention = _modules(torch, fc_norm, sliced)
    self_attn, seen = attention(tree)
    layer = _module(
        _cls(tree, "LlamaDecoderLayer", EAGLE3),
        is_input_layer=True,
        hidden_norm=RMS(H),
        input_layernorm=RMS(H),
        post_attention_layernorm=RMS(H),
        self_attn=self_attn,
        mlp=lambda x: x,
    )
    values = dict(
        embed_tokens=torch.nn.Embedding(V, H),
        fc=torch.nn.Linear(3 * H, H, bias=False),
        fc_norm=torch.nn.ModuleList([RMS(H) for _ in range(3)]) if fc_norm else None,
        num_aux_hidden_states=3,
        layers=[layer] * layers,
        norm=RMS(H),
        norm_output=False,
        is_mrope_enabled=False,
    )
    if "self.input_norm" in (tree / EAGLE3).read_text():  # norm_before_fc heads (0.5.17+)
        values["input_norm"] = RMS(3 * H) if input_norm else None
    model = release_instance(_cls(tree, "LlamaModel", EAGLE3), **values)
    return model, model.forward, seen


def _draft_worker(tree, model, pool=None, runner=None, ns=None, **attrs):
    """The release's EagleDraftWorker (its methods' globals those of _cls and `ns`) whose
    draft model runner (a real ModelRunner, holding `runner`) runs the release's
    LlamaForCausalLMEagle3 around `model` and writes the draft KV into `pool`."""
    runner = release_instance(
        _cls(tree, "ModelRunner", "sglang/srt/model_executor/model_runner.py"),
        model=release_instance(_cls(tree, "LlamaForCausalLMEagle3"), model=model),
        **({} if pool is None else {"token_to_kv_pool": pool}),
        **(runner or {}),
    )
    if ns is None:
        cls = _cls(tree, "EagleDraftWorker", WORKER)
    else:
        cls = release_type(tree, "EagleDraftWorker", {**_names(tree, "EagleDraftWorker"), **ns}, rel=WORKER)
    return release_instance(cls, draft_runner=runner, **attrs)


def _batch_class(tree):
    """What the release's worker steps over: a ModelWorkerBatch, from 0.5.13 a ScheduleBatch."""
    try:
        return _cls(tree, "ModelWorkerBatch")
    except KeyError:
        return _cls(tree, "ScheduleBatch")


def _graph_runner_class(tree):
    """The release's decode graph runner, as the patched worker imports it (CudaGraphRunner;
    DecodeCudaGraphRunner from 0.5.14)."""
    for node in ast.parse((tree / WORKER).read_text()).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == "CudaGraphRunner":
                    return _cls(tree, alias.name, node.module.replace(".", "/") + ".py")
    raise AssertionError("the patched worker imports no CudaGraphRunner")


def _kv_pool(tree, set_kv_buffer):
    """The release's MHATokenToKVPool, its set_kv_buffer the test's."""
    return release_instance(_cls(tree, "MHATokenToKVPool"), set_kv_buffer=set_kv_buffer)


def _worker(tree, ns=None, **attrs):
    """The patched release's EAGLEWorkerV2 (the recipe's methods with it), its methods'
    globals those of _cls and `ns`, holding `attrs`."""
    if ns is None:
        cls = _cls(tree, "EAGLEWorkerV2", WORKER)
    else:
        cls = release_type(tree, "EAGLEWorkerV2", {**_names(tree, "EAGLEWorkerV2"), **ns}, rel=WORKER)
    return release_instance(cls, **attrs)


@pytest.mark.parametrize(
    "fc_norm,sliced,input_norm",
    [(False, False, False), (True, False, False), (False, True, False), (True, True, False), (True, True, True)],
)
@pytest.mark.parametrize("version", ERAS)
def test_kv_only_sync_writes_the_draft_forwards_kv(fc_norm, sliced, input_norm, version, patched_release):
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    if input_norm and "self.input_norm" not in (tree / "sglang/srt/models/llama_eagle3.py").read_text():
        pytest.skip("this release's EAGLE-3 head has no norm before fc")
    model, forward, ref = _eagle3_model(torch, tree, fc_norm, sliced, input_norm)
    tokens = torch.tensor([7, 8, 9], dtype=torch.int32)
    target_hidden = torch.randn(BS, 3 * H)
    pre_step = torch.tensor([3, 5, 10])

    # The release's own draft forward for these tokens: position = the pre-step length
    # (a decode step's position is seq_len - 1 after the step).
    fb = release_instance(
        _cls(tree, "ForwardBatch"),
        mm_input_embeds=None,
        forward_mode=forward_modes(tree)[0].DECODE,
        contains_mm_inputs=lambda: False,
        spec_info=release_instance(_cls(tree, "EagleDraftInput"), hidden_states=target_hidden),
    )
    with torch.no_grad():
        forward(tokens.to(torch.int64), pre_step, fb)
    assert ref["positions"] is pre_step

    writes = []
    worker = _worker(
        tree,
        device="cpu",
        topk=1,
        _spec_fallback=fallback_state_class(tree)(),  # no graphs: eager
        _draft_worker=_draft_worker(tree, model, _kv_pool(tree, lambda *a: writes.append(a))),
    )
    batch = release_instance(_batch_class(tree), seq_lens=pre_step.clone(), out_cache_loc=torch.tensor([3, 45, 90]))
    nxt = release_instance(_cls(tree, "EagleDraftInput"))
    with torch.no_grad():
        worker._spec_fallback_draft_kv_only(batch, tokens, target_hidden, nxt)

    ((layer, loc, k, v, k_scale, v_scale),) = writes
    attn = model.layers[0].self_attn.attn
    assert layer is attn and loc.tolist() == [3, 45, 90] and (k_scale, v_scale) == (None, None)
    assert k.shape == (BS, KV_HEADS, HEAD_DIM) and v.shape == (BS, KV_HEADS, HEAD_DIM)
    assert torch.allclose(k.reshape(BS, -1), ref["k"], atol=1e-6)
    assert torch.allclose(v.reshape(BS, -1), ref["v"], atol=1e-6)
    # The next draft input is zeros in the shapes and dtypes the FutureMap stores.
    assert nxt.topk_p.shape == (BS, 1) and nxt.topk_p.dtype == torch.float32 and not nxt.topk_p.any()
    assert nxt.topk_index.dtype == torch.int64 and not nxt.topk_index.any()
    assert nxt.hidden_states.shape == (BS, H) and not nxt.hidden_states.any()
    assert worker._spec_fallback.stats["draft_kv_only_steps"] == 1

    # A wrong position would write a different K: the comparison can fail.
    writes.clear()
    batch.seq_lens = pre_step + 1
    with torch.no_grad():
        worker._spec_fallback_draft_kv_only(
            batch, tokens, target_hidden, release_instance(_cls(tree, "EagleDraftInput"))
        )
    assert not torch.allclose(writes[0][2].reshape(BS, -1), ref["k"], atol=1e-6)


BUFS = ("tokens", "hidden", "positions", "loc")


def _stash_worker(tree, torch, graphs=(8, 16), defer=1, width=6, bufs=None, replay=None, pd_decode=False, **attrs):
    """The patched release's EAGLEWorkerV2 (its real stash, flush and last-write-wins
    methods) holding `attrs` and a KV-only queue over stand-in graphs. The capture stores
    torch's CUDAGraph objects, which need a GPU (`spectool verify` runs them): each stand-in
    is that torch type's replay(), which runs `replay(worker, bufs, size)`; by default it
    records the rows it would write."""
    size = max(graphs)
    if bufs is None:
        bufs = {
            "tokens": torch.full((size,), 9, dtype=torch.int32),
            "hidden": torch.ones(size, width),
            "positions": torch.full((size,), 9),
            "loc": torch.full((size,), 9),
        }
    seen = []
    if replay is None:

        def replay(worker, bufs, n):
            seen.append((n, {k: v[:n].clone() for k, v in bufs.items()}))

    worker = _worker(tree, _spec_fallback=fallback_state_class(tree)(kv_only_steps_per_replay=defer), **attrs)
    # torch.cuda.CUDAGraph stand-ins (a torch type, not SGLang's): replay() is all the queue calls.
    cuda_graphs = {n: SimpleNamespace(replay=lambda n=n: replay(worker, bufs, n)) for n in reversed(graphs)}
    worker._spec_fallback.kv_only_graphs = worker._spec_fallback_kv_only_queue(cuda_graphs, bufs, pd_decode)
    return worker, seen


def _step(torch, first, n, width=6):
    """One KV-only step's rows: n requests, tokens/positions/slots counting up from `first`."""
    rows = torch.arange(first, first + n)
    return rows.to(torch.int32), torch.full((n, width), float(first)), rows + 100, rows + 1000


@pytest.mark.parametrize("version", ERAS)
def test_kv_only_graph_replay_pads_to_a_captured_size(version, patched_release):
    """One step at a time (--speculative-disable-kv-only-steps-per-replay 1): a batch replays the smallest
    captured size that holds it, its inputs copied into the static buffers and the padding
    rows sent to the KV pool's dummy slot 0 at position 0 with token 0; a larger batch, or
    hidden states of another width, are refused (False: they run eagerly)."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    worker, seen = _stash_worker(tree, torch)
    tokens, hidden = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32), torch.full((5, 6), 2.0)
    positions, loc = torch.tensor([10, 11, 12, 13, 14]), torch.tensor([40, 41, 42, 43, 44])
    assert worker._spec_fallback_kv_only_stash(tokens, hidden, positions, loc) is True
    ((size, b),) = seen
    assert size == 8
    assert b["tokens"].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert b["positions"].tolist() == [10, 11, 12, 13, 14, 0, 0, 0]
    assert b["loc"].tolist() == [40, 41, 42, 43, 44, 0, 0, 0]
    bufs = worker._spec_fallback.kv_only_graphs["bufs"]
    assert (b["hidden"][:5] == 2).all() and bufs["loc"][8:].tolist() == [9] * 8, "rows past the size untouched"
    assert worker._spec_fallback_kv_only_stash(*_step(torch, 0, 17)) is False
    assert worker._spec_fallback_kv_only_stash(tokens, torch.zeros(5, 4), positions, loc) is False
    empty = _worker(tree, _spec_fallback=fallback_state_class(tree)())
    assert empty._spec_fallback_kv_only_stash(tokens, hidden, positions, loc) is False
    empty._spec_fallback_kv_only_flush("spec")  # nothing stashed, no graphs: nothing to do
    assert len(seen) == 1 and worker._spec_fallback.stats["draft_kv_only_flush_causes"] == {"queued": 1}


@pytest.mark.parametrize("version", ERAS)
def test_deferred_kv_only_steps_share_one_replay(version, patched_release):
    """Three steps per replay: three steps' rows queue in the static buffers, one
    after another, and one replay writes them all; a step that would not fit behind the
    queued rows writes them first; a flush asked for (before a speculative step, a full sync
    or a prefill) writes what is queued, and nothing when nothing is."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    worker, seen = _stash_worker(tree, torch, graphs=(8, 16, 24), defer=3)
    stash, flush = worker._spec_fallback_kv_only_stash, worker._spec_fallback_kv_only_flush
    for first in (0, 5, 10):
        assert stash(*_step(torch, first, 5))
        assert len(seen) == (first == 10), "written at the third step, not before"
    ((size, b),) = seen
    assert size == 16
    assert b["tokens"].tolist() == list(range(15)) + [0]
    assert b["positions"].tolist() == list(range(100, 115)) + [0]
    assert b["loc"].tolist() == list(range(1000, 1015)) + [0]
    assert [float(h) for h in b["hidden"][:15, 0]] == [0.0] * 5 + [5.0] * 5 + [10.0] * 5
    assert not any(worker._spec_fallback.kv_only_graphs["pending"].values()), "the replay empties the queue"

    seen.clear()
    assert stash(*_step(torch, 0, 13))  # 13 rows queued; 13 more would not fit in 24
    ((size, b),) = seen
    assert size == 16 and b["loc"].tolist()[:13] == list(range(1000, 1013)), "written at once: the next would not fit"
    seen.clear()
    assert stash(*_step(torch, 0, 7)) and stash(*_step(torch, 7, 5)) and not seen
    assert stash(*_step(torch, 12, 13)), "12 queued + 13 > 24: the queue is written first"
    assert [s for s, _ in seen] == [16, 16], "then the 13 at once: 13 more would not fit"
    assert seen[0][1]["loc"].tolist() == list(range(1000, 1012)) + [0] * 4
    assert seen[1][1]["loc"].tolist() == list(range(1012, 1025)) + [0] * 3
    seen.clear()
    assert stash(*_step(torch, 0, 4)) and not seen
    flush("spec")
    ((size, b),) = seen
    assert size == 8 and b["loc"].tolist() == [1000, 1001, 1002, 1003, 0, 0, 0, 0]
    flush("prefill")
    assert len(seen) == 1, "nothing queued, nothing replayed"
    stats = worker._spec_fallback.stats
    assert stats["draft_kv_only_flush_causes"] == {"queued": 1, "full": 3, "spec": 1}, "each replay counted by cause"
    assert "draft_kv_only_flushes" not in stats, "the total is the causes' sum"


@pytest.mark.parametrize("version", ERAS)
def test_a_slot_given_again_keeps_the_latest_write(version, patched_release):
    """Two queued steps that write one slot (freed by a request that left the batch, handed
    to another): the earlier row goes to the dummy slot 0, so the later write is the one
    that stays, as it would one step at a time. A slot is freed only when a request leaves,
    which shrinks the batch, so a queue of one batch size is written as it is (no sort);
    on a PD-disaggregated decode server (requests join without a prefill) every queue is
    deduplicated."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    tokens, hidden, positions, _ = _step(torch, 0, 4)

    def queue(worker, second):
        worker._spec_fallback_kv_only_stash(tokens, hidden, positions, torch.tensor([50, 51, 52, 53]))
        n = len(second)
        worker._spec_fallback_kv_only_stash(tokens[:n], hidden[:n], positions[:n], torch.tensor(second))

    worker, seen = _stash_worker(tree, torch, graphs=(8, 16), defer=2)
    queue(worker, [60, 52, 50])  # a request left: 4 then 3 rows, slots 52 and 50 given again
    ((size, b),) = seen
    assert b["loc"].tolist() == [0, 51, 0, 53, 60, 52, 50, 0]
    assert worker._spec_fallback.stats["draft_kv_only_dedups"] == 1
    queue(worker, [60, 61, 62, 63])  # the next queue has one batch size: not deduplicated
    assert seen[1][1]["loc"].tolist() == [50, 51, 52, 53, 60, 61, 62, 63]
    assert worker._spec_fallback.stats["draft_kv_only_dedups"] == 1, "the next queue starts with no sizes"

    worker, seen = _stash_worker(tree, torch, graphs=(8, 16), defer=2)
    queue(worker, [60, 61, 62, 63])  # one batch size: every slot is new, written as queued
    assert seen[0][1]["loc"].tolist() == [50, 51, 52, 53, 60, 61, 62, 63]
    assert "draft_kv_only_dedups" not in worker._spec_fallback.stats

    worker, seen = _stash_worker(tree, torch, graphs=(8, 16), defer=2, pd_decode=True)
    queue(worker, [60, 52, 61, 50])  # PD decode: a request may have joined as another left
    assert seen[0][1]["loc"].tolist() == [0, 51, 0, 53, 60, 52, 61, 50]

    loc = torch.tensor([7, 3, 7, 7, 3, 9])
    worker._spec_fallback_last_write_wins(loc)
    assert loc.tolist() == [0, 0, 0, 7, 3, 9]


@pytest.mark.parametrize("version", ERAS)
def test_every_other_draft_forward_writes_the_queue_first(version, patched_release):
    """Queued KV-only rows land before anything reads or writes the draft KV: the prefill's
    draft half (the release's or the KV-only one) and, in the patched
    forward_batch_generation, the speculative path's draft() after the decode hook declines.
    (The full draft sync below the KV-only threshold: test_kv_only_switch_and_dispatch.)"""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    order = []
    draft_worker = release_instance(
        _cls(tree, "EagleDraftWorker", WORKER),
        _draft_extend_for_prefill=lambda *a: order.append(("release prefill", len(seen))),
    )
    worker, seen = _stash_worker(tree, torch, defer=4, _draft_worker=draft_worker)
    assert worker._spec_fallback_kv_only_stash(*_step(torch, 0, 3)) and not seen
    # No KV-only threshold: the real _spec_fallback_kv_only_prefill_applies declines.
    worker._spec_fallback_draft_prefill(release_instance(_batch_class(tree)), None, None, None)
    assert order == [("release prefill", 1)], "the queue was written before the draft prefill"

    fn = next(
        n
        for n in ast.walk(ast.parse((tree / WORKER).read_text()))
        if isinstance(n, ast.FunctionDef)
        and n.name == "forward_batch_generation"
        and "_spec_fallback_should_run" in ast.unparse(n)
    )
    calls = [(n.lineno, ast.unparse(n.func)) for n in ast.walk(fn) if isinstance(n, ast.Call)]
    flush = [line for line, name in calls if name == "self._spec_fallback_kv_only_flush"]
    draft = [line for line, name in calls if name == "self.draft_worker.draft"]
    decline = [line for line, name in calls if name == "self._spec_fallback_should_run"]
    assert len(flush) == 1 and len(draft) == 1 and decline[0] < flush[0] < draft[0]


@pytest.mark.parametrize("version", ERAS)
def test_deferred_kv_only_writes_equal_the_step_by_step_ones(version, patched_release):
    """End to end over the miniature EAGLE-3 head in the release's draft worker and model
    runner, its KV pool the release's MHATokenToKVPool writing tensors indexed by slot: four steps of changing batches, one slot handed on, written through the real
    _spec_fallback_kv_only_write as the graphs' body, four steps per replay against one step
    per replay. The pools must be equal, and differ from a run that drops a step."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    model, _, _ = _eagle3_model(torch, tree, fc_norm=True, sliced=True)
    torch.manual_seed(3)
    steps = []
    for n, first in ((5, 0), (4, 5), (6, 9), (3, 15)):
        loc = torch.arange(first, first + n) + 10
        steps.append(
            (torch.randint(1, V, (n,), dtype=torch.int32), torch.randn(n, 3 * H), torch.randint(0, 40, (n,)), loc)
        )
    steps[3][3][0] = steps[0][3][1]  # a slot of step 0 given again at step 3

    def run(defer, drop=None):
        pool = {"k": torch.zeros(40, KV_HEADS, HEAD_DIM), "v": torch.zeros(40, KV_HEADS, HEAD_DIM)}

        def set_kv_buffer(layer, loc, k, v, *scales):
            pool["k"][loc], pool["v"][loc] = k, v

        bufs = {
            "tokens": torch.zeros(24, dtype=torch.int32),
            "hidden": torch.zeros(24, 3 * H),
            "positions": torch.zeros(24, dtype=torch.int64),
            "loc": torch.zeros(24, dtype=torch.int64),
        }
        worker, _ = _stash_worker(
            tree,
            torch,
            graphs=(8, 16, 24),
            defer=defer,
            bufs=bufs,  # the graph's body
            replay=lambda w, b, n: w._spec_fallback_kv_only_write(*(b[k][:n] for k in BUFS)),
            _draft_worker=_draft_worker(tree, model, _kv_pool(tree, set_kv_buffer)),
        )
        with torch.no_grad():
            for i, step in enumerate(steps):
                if i != drop:
                    assert worker._spec_fallback_kv_only_stash(*step)
            worker._spec_fallback_kv_only_flush("prefill")
        pool["k"][0] = pool["v"][0] = 0  # the dummy slot takes padding and superseded rows
        return pool, sum(worker._spec_fallback.stats["draft_kv_only_flush_causes"].values())

    (one, n1), (four, n4) = run(1), run(4)
    assert (n1, n4) == (4, 1)
    assert one["k"][10:28].abs().sum() > 0
    assert torch.allclose(one["k"], four["k"], atol=1e-6) and torch.allclose(one["v"], four["v"], atol=1e-6)
    dropped, _ = run(4, drop=2)
    assert not torch.allclose(one["k"], dropped["k"], atol=1e-6), "the comparison can fail"


@pytest.mark.parametrize("version", ERAS)
def test_kv_only_switch_and_dispatch(version, patched_release):
    """On by default on every step above the threshold (margin 0);
    --speculative-disable-kv-only-margin sets the margin or None ('off'); refused, with the
    reason at info level, for drafts whose K/V need more than the input layer (a STANDALONE
    draft, a two-layer head, an MLA runner); used only more than the margin above the
    threshold, the full draft forward below. On the release's EAGLEWorkerV2, SpeculativeAlgorithm,
    draft worker, ModelRunner and EAGLE-3 model, and its batch class."""
    torch = pytest.importorskip("torch")

    tree = patched_release(version)
    informed = []
    ns = {"torch": torch, "logger": SimpleNamespace(info=lambda *a: informed.append(a))}  # a logger's recorder
    cls = server_args_class(tree, {})
    algorithm = _cls(tree, "SpeculativeAlgorithm", "sglang/srt/speculative/spec_info.py")

    def worker(eagle3=True, layers=1, mla=False):
        model, _, _ = _eagle3_model(torch, tree, fc_norm=False, layers=layers)
        return _worker(
            tree,
            ns,
            _spec_fallback=fallback_state_class(tree)(threshold=32),
            speculative_algorithm=algorithm.EAGLE3 if eagle3 else algorithm.STANDALONE,
            _draft_worker=_draft_worker(tree, model, runner={"use_mla_backend": mla}),
        )

    for flags, expect in (
        ({}, 32),
        ({"speculative_disable_kv_only_margin": None}, None),
        ({"speculative_disable_kv_only_margin": 3}, 35),
        ({"speculative_disable_kv_only_margin": 8, "speculative_disable_kv_only_steps_per_replay": 2}, 40),
    ):
        w = worker()
        w._spec_fallback_init_draft_kv_only(server_args(cls, **flags))
        assert w._spec_fallback.kv_only_above == expect, flags
        want_steps = flags.get("speculative_disable_kv_only_steps_per_replay", 4) if expect is not None else 1
        assert w._spec_fallback.kv_only_steps_per_replay == want_steps
    for kw, reason in (({"eagle3": False}, "not EAGLE-3"), ({"layers": 2}, "one layer"), ({"mla": True}, "MLA")):
        informed.clear()
        w = worker(**kw)
        w._spec_fallback_init_draft_kv_only(server_args(cls, speculative_disable_kv_only_margin=8))
        assert w._spec_fallback.kv_only_above is None and reason in informed[-1][1]

    taken = []
    w = _worker(
        tree,
        ns,
        _draft_worker=None,
        _spec_fallback=fallback_state_class(tree)(kv_only_above=40, draft_decode_min_bs=16),
        _spec_fallback_draft_kv_only=lambda *a: taken.append("kv_only"),
        _spec_fallback_kv_only_flush=lambda cause: taken.append(f"flush:{cause}"),
        _spec_fallback_draft_decode=lambda *a: taken.append("decode"),
    )
    for bs in (41, 40, 33):
        w._spec_fallback_draft_extend(release_instance(_batch_class(tree), seq_lens=torch.zeros(bs)), None, None, None)
    assert taken == ["kv_only", "flush:sync", "decode", "flush:sync", "decode"], (
        "stashed K/V written before the draft reads"
    )


@pytest.mark.parametrize("version", ERAS)
def test_kv_only_graphs_are_built_only_where_they_can_replay(version, patched_release):
    """Graphs are captured for the decode-graph batch sizes above the KV-only threshold, at
    every TP size (inside SGLang's graph_capture(): the draft's embedding all-reduces under
    TP), with buffers of the width and dtype of the draft's fc input; none without the
    KV-only sync, or without the decode graph runner. On the release's worker, draft worker,
    EAGLE-3 model, decode graph runner and ServerArgs; the capture itself is recorded.
    The capture itself needs a GPU (`spectool verify` checks that every KV-only step replayed
    a graph, at TP=1 and TP=2)."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    ns = {"logger": logging.getLogger("test")}
    # The capture's graph_capture() is the release's own, imported into the patched module.
    assert "from sglang.srt.distributed.parallel_state import graph_capture" in (tree / WORKER).read_text()
    assert "def graph_capture(" in (tree / WORKER).parents[1].joinpath("distributed/parallel_state.py").read_text()
    fc = torch.nn.Linear(3 * H, H, bias=False).to(torch.bfloat16)
    captured = []

    runner_class = _graph_runner_class(tree)
    model = release_instance(_cls(tree, "LlamaModel", EAGLE3), fc=fc)
    args_class = server_args_class(tree, {})

    def worker(above=12, runner=True):
        graph_runner = release_instance(runner_class, capture_bs=[1, 2, 4, 8, 12, 16, 24, 32]) if runner else None
        return _worker(
            tree,
            ns,
            _spec_fallback=fallback_state_class(tree)(kv_only_above=above, graph_runner=graph_runner),
            device="cpu",
            _draft_worker=_draft_worker(tree, model),
            _spec_fallback_capture=lambda what, fn: captured.append((what, fn)) or "graphs",
        )

    args = server_args(args_class, disaggregation_mode="null")
    w = worker()
    w._spec_fallback_build_kv_only_graphs(args)
    assert w._spec_fallback.kv_only_graphs == "graphs" and len(captured) == 1
    cells = captured[0][1].__closure__
    sizes = next(c.cell_contents for c in cells if isinstance(c.cell_contents, list))
    bufs = next(c.cell_contents for c in cells if isinstance(c.cell_contents, dict))
    pd_decode = next(c.cell_contents for c in cells if isinstance(c.cell_contents, bool))
    assert sizes == [16, 24, 32], "only sizes above the KV-only threshold"
    assert bufs["hidden"].shape == (32, 3 * H) and bufs["hidden"].dtype == torch.bfloat16
    assert bufs["tokens"].shape == bufs["positions"].shape == bufs["loc"].shape == (32,)
    assert pd_decode is False
    captured.clear()
    worker()._spec_fallback_build_kv_only_graphs(server_args(args_class, disaggregation_mode="decode"))
    assert next(c.cell_contents for c in captured[0][1].__closure__ if isinstance(c.cell_contents, bool)) is True, (
        "a PD-disaggregated decode server deduplicates every queue"
    )
    for kw in ({"above": None}, {"runner": False}, {"above": 32}):
        captured.clear()
        w = worker(**kw)
        w._spec_fallback_build_kv_only_graphs(args)
        assert w._spec_fallback.kv_only_graphs is None and not captured, kw


def _prefill_batch(torch, tree):
    """Three prompts as the release's ModelWorkerBatch carries them: 4 new tokens, 2 after a
    cached prefix of 3, 5 new; each request's slots and the token the target produced."""
    torch.manual_seed(1)
    ext, prefix = [4, 2, 5], [0, 3, 0]
    forward_mode, _ = forward_modes(tree)
    batch = model_worker_batch(
        tree,
        input_ids=torch.randint(1, V, (sum(ext),), dtype=torch.int32),
        extend_seq_lens=ext,
        extend_prefix_lens=prefix,
        seq_lens=torch.tensor([p + e for p, e in zip(prefix, ext)]),
        out_cache_loc=torch.arange(20, 20 + sum(ext)),
        forward_mode=forward_mode.EXTEND,
        has_grammar=False,
        return_logprob=False,
        multimodal_inputs=[None, None, None],
        spec_info=None,
        reqs=[request(tree, return_hidden_states=False) for _ in ext],
    )
    return batch, torch.tensor([41, 42, 43])


def _forward_batch_class(tree):
    """The release's ForwardBatch, its init_new in miniature on a ModelWorkerBatch."""
    return prefill_forward_batch(
        tree, _cls(tree, "ForwardBatch"), lambda b: zip(b.extend_prefix_lens, b.extend_seq_lens)
    )


@pytest.mark.parametrize("sliced", [False, True])
def test_kv_only_prefill_writes_what_the_release_prefill_writes(sliced, patched_release):
    """The KV-only draft prefill against the release's own _draft_extend_for_prefill (run over
    the same miniature EAGLE-3 head): the same shifted ids, the same K/V at the same slots, and
    the next draft input in the release's shapes, zeros. Both run on the release's classes
    (worker, draft worker, ModelRunner, EagleDraftInput, ForwardBatch, LogitsProcessorOutput),
    the draft runner's forward being the LlamaModel's own. (0.5.13 on: test_recipes_0511_0514.)"""
    torch = pytest.importorskip("torch")
    tree = patched_release("0.5.12")
    model, forward, ref = _eagle3_model(torch, tree, fc_norm=False, sliced=sliced)
    ns = {
        "EagleDraftInput": eagle_draft_input_class(tree),
        "ForwardBatch": _forward_batch_class(tree),
        "ForwardMode": forward_modes(tree)[0],
        "maybe_detect_nan": lambda *a: None,
        "fast_topk": load_function(tree / "sglang/srt/utils/common.py", "fast_topk", {"torch": torch}),
    }
    target_hidden = torch.randn(11, 3 * H)
    logits_output = logits_output_class(tree)
    runner_output = _cls(tree, "ModelRunnerOutput", "sglang/srt/model_executor/model_runner.py")

    def runner_forward(fb):
        forward(fb.input_ids.to(torch.int64), fb.positions, fb)
        out = logits_output(next_token_logits=torch.rand(3, V), hidden_states=torch.rand(3, H))
        return runner_output(logits_output=out, can_run_graph=False)

    release = _draft_worker(tree, model, runner={"forward": runner_forward}, ns=ns, topk=1)
    ref_batch, tokens = _prefill_batch(torch, tree)
    with torch.no_grad():
        ref_out = release._draft_extend_for_prefill(ref_batch, target_hidden, tokens)

    writes = []
    dw = _draft_worker(
        tree,
        model,
        _kv_pool(tree, lambda *a: writes.append(a)),
        _draft_extend_for_prefill=lambda *a: pytest.fail("the full draft prefill ran"),
    )
    worker = _worker(
        tree, ns, device="cpu", topk=1, _draft_worker=dw, _spec_fallback=fallback_state_class(tree)(kv_only_above=2)
    )
    batch, _ = _prefill_batch(torch, tree)
    with torch.no_grad():
        out = worker._spec_fallback_draft_prefill(batch, target_hidden, tokens, None)

    assert batch.input_ids.tolist() == ref_batch.input_ids.tolist(), "ids shifted as the release shifts them"
    ((layer, loc, k, v, _, _),) = writes
    assert loc.tolist() == list(range(20, 31))
    assert torch.allclose(k.reshape(11, -1), ref["k"], atol=1e-6) and torch.allclose(
        v.reshape(11, -1), ref["v"], atol=1e-6
    )
    assert out.bonus_tokens is tokens and out.new_seq_lens is batch.seq_lens and batch.spec_info is out
    for name in ("topk_p", "topk_index", "hidden_states"):
        got, want = getattr(out, name), getattr(ref_out, name)
        assert got.shape == want.shape and got.dtype == want.dtype and not got.any(), name
    assert worker._spec_fallback.stats["draft_kv_only_prefills"] == 1


# 0.5.13 moved ModelWorkerBatch out of schedule_batch.py, where the real-class loader reads it.
@pytest.mark.parametrize("version", ["0.5.12"])
def test_kv_only_prefill_only_when_the_steps_after_it_fall_back(version, patched_release):
    """More than the margin above T, counting the running batch only while the fallback is
    on; grammar, logprob and hidden-state prefills too (the decode steps after them fall
    back as well, and the target's own prefill serves those outputs); never for multimodal
    inputs, a batch that is not a plain EXTEND, or without the KV-only sync. On real
    ModelWorkerBatches of the release, asked of its EAGLEWorkerV2."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    forward_mode, _ = forward_modes(tree)
    w = _worker(tree, {"ForwardMode": forward_mode})

    def case(n=3, above=2, active=False, last=0, mm=None, hidden=False, **values):
        batch = model_worker_batch(
            tree,
            **{
                "seq_lens": torch.zeros(n),
                "forward_mode": forward_mode.EXTEND,
                "multimodal_inputs": [None] * n,
                "reqs": [request(tree, return_hidden_states=hidden) for _ in range(n)],
                **values,
            },
        )
        w._spec_fallback = fallback_state_class(tree)(kv_only_above=above, active=active)
        w._spec_fallback.stats["last_batch_size"] = last
        return w._spec_fallback_kv_only_prefill_applies(batch, mm)

    assert case() and not case(n=2)
    assert case(n=2, active=True, last=1) and not case(n=2, active=False, last=9)
    assert not case(above=None) and not case(mm=object())
    assert case(has_grammar=True) and case(return_logprob=True) and case(hidden=True)
    assert not case(forward_mode=forward_mode.MIXED) and not case(multimodal_inputs=[None, object(), None])


# 0.5.13 moved ModelWorkerBatch out of schedule_batch.py, where the real-class loader reads it.
@pytest.mark.parametrize("version", ["0.5.12"])
def test_an_engine_without_the_flag_runs_the_release_prefill(version, patched_release):
    """Patched but with no threshold set (every engine whose user has not opted in, and the
    bench's A1): the prefill hook hands the draft's half to the release's own
    _draft_extend_for_prefill, the decode hook declines, the verify-complete hook counts
    nothing. The worker (the release's EAGLEWorkerV2, its draft worker's prefill recorded)
    runs its real _spec_fallback_init first, with the release's default server args: the
    hooks must read only what it sets for such an engine. The decode batch is the release's."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    forward_mode = forward_modes(tree)[0]
    ns = {
        "logger": logging.getLogger("test"),
        "ForwardMode": forward_mode,
        "SpecFallbackState": fallback_state_class(tree),
    }
    calls = []
    worker = _worker(
        tree,
        ns,
        _target_worker=release_instance(_cls(tree, "TpModelWorker"), tp_rank=0),
        _draft_worker=release_instance(
            _cls(tree, "EagleDraftWorker", WORKER),
            _draft_extend_for_prefill=lambda *a: calls.append(a) or "the release's draft input",
        ),
    )
    worker._spec_fallback_init(server_args(server_args_class(tree, {})))
    batch, tokens = _prefill_batch(torch, tree)
    hidden = torch.zeros(11, 3 * H)

    assert worker._spec_fallback_draft_prefill(batch, hidden, tokens, None) == "the release's draft input"
    assert calls == [(batch, hidden, tokens, None)]
    decode = release_instance(
        _batch_class(tree),
        forward_mode=forward_mode.DECODE,
        spec_info=release_instance(_cls(tree, "EagleDraftInput")),
        seq_lens=torch.zeros(64),
    )
    assert worker._spec_fallback_should_run(decode) is False
    worker._spec_fallback_on_verify([1, 2])  # the verify-complete hook: nothing pending, nothing counted
    assert worker._spec_fallback.stats["spec_steps"] == 0 and worker._spec_fallback.stats["phases"] == []


@pytest.mark.parametrize("version", ERAS)
def test_zero_draft_inputs_come_from_one_buffer_per_engine(version, patched_release):
    """The zeros a KV-only step hands the scheduler (the next draft input) are views of
    buffers filled once, reused while batches fit and made again, larger, for a larger batch,
    with the values, shapes and dtypes the FutureMap copies (into the release's
    EagleDraftInput; the hidden size and dtype are those of the draft's embedding)."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    model = release_instance(
        _cls(tree, "LlamaModel", EAGLE3), embed_tokens=torch.nn.Embedding(V, H, dtype=torch.bfloat16)
    )
    worker = _worker(
        tree,
        device="cpu",
        topk=1,
        _spec_fallback=fallback_state_class(tree)(),
        _draft_worker=_draft_worker(tree, model),
    )
    first, second, bigger = (release_instance(_cls(tree, "EagleDraftInput")) for _ in range(3))
    worker._spec_fallback_zero_draft_input(first, 4)
    worker._spec_fallback_zero_draft_input(second, 3)
    worker._spec_fallback_zero_draft_input(bigger, 9)
    for nxt, bs in ((first, 4), (second, 3), (bigger, 9)):
        assert nxt.topk_p.shape == (bs, 1) and nxt.topk_p.dtype == torch.float32 and not nxt.topk_p.any()
        assert nxt.topk_index.shape == (bs, 1) and nxt.topk_index.dtype == torch.int64 and not nxt.topk_index.any()
        assert nxt.hidden_states.shape == (bs, H) and nxt.hidden_states.dtype == torch.bfloat16
        assert not nxt.hidden_states.any()
    assert second.hidden_states.data_ptr() == first.hidden_states.data_ptr(), "a batch that fits reuses the buffer"
    assert bigger.hidden_states.data_ptr() != first.hidden_states.data_ptr()
    assert first.hidden_states.shape == (4, H) and not first.hidden_states.any(), "earlier views stay valid"
    ones = worker._spec_fallback_constant("accept_lens", 5, (), torch.int32, 1)
    assert ones.tolist() == [1] * 5 and ones.dtype == torch.int32


@pytest.mark.parametrize("version", ERAS)
def test_queued_rows_are_kept_by_reference_and_written_once_per_replay(version, patched_release):
    """Tokens, positions and slots of the queued steps are the steps' own tensors until the
    replay, which concatenates them into the static buffers (hidden states are copied at
    once: the target graph's next replay overwrites them); a dtype the buffer must cast
    (tokens as int64 into the int32 buffer) is copied part by part."""
    torch = pytest.importorskip("torch")
    tree = patched_release(version)
    worker, seen = _stash_worker(tree, torch, graphs=(8, 16), defer=2)
    tokens, hidden, positions, loc = _step(torch, 0, 3)
    assert worker._spec_fallback_kv_only_stash(tokens.to(torch.int64), hidden, positions, loc) and not seen
    captured = worker._spec_fallback.kv_only_graphs
    assert captured["pending"]["loc"][0] is loc and (captured["bufs"]["hidden"][:3] == 0).all()
    assert captured["bufs"]["loc"][:3].tolist() == [9, 9, 9], "the slots wait for the replay"
    worker._spec_fallback_kv_only_stash(*_step(torch, 3, 3))
    ((size, b),) = seen
    assert b["tokens"].tolist() == [0, 1, 2, 3, 4, 5, 0, 0] and b["loc"].tolist()[:6] == list(range(1000, 1006))
    assert not any(captured["pending"].values()), "the queue starts empty again"
