"""The 0.5.12 recipes on the real SGLang 0.5.12 sources (fetched from the package index):
apply, second apply is a no-op, revert, compile, no undefined names; and the patched
functions' logic, called on objects of the release's own classes (its workers, model runner,
model classes, batches, draft input and envs registry)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
import time
from typing import Optional

import pytest

from spectool import api
from spectool.testing import function_source, load_function

from .sglang_source import (
    disable_flags_parser,
    eagle_draft_input_class,
    fallback_state_class,
    forward_modes,
    model_worker_batch,
    release_envs,
    release_instance,
    release_type,
    request,
    server_args,
    server_args_class,
)

pytestmark = pytest.mark.network

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
ARGS = "sglang/srt/server_args.py"


def _hashes(root):
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (root / "sglang").rglob("*.py")
    }


@pytest.fixture(scope="module")
def patched(patched_release):
    return patched_release("0.5.12")


def test_apply_noop_revert(sglang_release):
    tree = sglang_release("0.5.12")
    before = _hashes(tree)
    out = api.apply(tree)
    assert out.ok and out.wrote
    assert {r.id: r.status for r in out.plan.results} == {
        "spec-disable-threshold": "applied",
        "spec-fallback": "applied",
        "sm120": "applied",
    }
    changed = {k for k, v in _hashes(tree).items() if before[k] != v}
    assert changed == {
        ARGS,
        WORKER,
        "sglang/srt/speculative/standalone_worker_v2.py",
        "sglang/srt/managers/overlap_utils.py",
        "sglang/srt/layers/deep_gemm_wrapper/configurer.py",
    }
    for rel in changed:
        compile((tree / rel).read_bytes(), rel, "exec")
    again = api.apply(tree)
    assert not again.wrote and {r.status for r in again.plan.results} == {"already-applied"}
    st = api.status(tree)
    assert st.ok and {f["state"] for f in st.files} == {"intact"}
    api.revert(tree)
    assert _hashes(tree) == before


def test_check_on_pristine_and_patched(cached_release, patched):
    assert api.check(cached_release("0.5.12")).ok
    chk = api.check(patched)
    assert chk.ok and {r.status for r in chk.plan.results} == {"already-applied"}


@pytest.fixture(autouse=True)
def spec_v2(monkeypatch):
    """The overlap (spec v2) worker the fallback needs, on in the release's envs registry."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "true")


@pytest.fixture(scope="module")
def server_args_cls(patched):
    """The patched release's own ServerArgs (its validation method included), reading the
    release's own envs registry."""
    return server_args_class(patched, {"envs": release_envs(patched), "logger": logging.getLogger("test")})


def _args(cls, **kw):
    """A ServerArgs as the validation sees it: EAGLE-3 with the fallback at 8 requests."""
    base = dict(
        speculative_disable_batch_size_threshold=8,
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=1,
        max_running_requests=64,
    )
    return server_args(cls, **{**base, **kw})


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(speculative_disable_batch_size_threshold=-1), "must be >= 0"),
        (dict(speculative_disable_batch_size_hysteresis=9), "hysteresis must be 0 or below the threshold (8), got 9"),
        (dict(speculative_disable_batch_size_hysteresis=8), "hysteresis must be 0 or below the threshold (8), got 8"),
        (dict(speculative_disable_batch_size_hysteresis=-1), "hysteresis must be 0 or below the threshold (8), got -1"),
        (
            dict(speculative_disable_batch_size_threshold=0, speculative_disable_batch_size_hysteresis=1),
            "below the threshold (0), got 1",
        ),
        (dict(speculative_disable_draft_decode_min_bs=0), "draft-decode-min-bs must be a whole number >= 1 or 'off'"),
        (dict(speculative_disable_kv_only_margin=-1), "kv-only-margin must be a whole number >= 0 or 'off'"),
        (dict(speculative_disable_kv_only_margin="8"), "kv-only-margin must be a whole number >= 0 or 'off'"),
        (dict(speculative_disable_kv_only_steps_per_replay=0), "steps-per-replay must be a whole number >= 1"),
        (dict(speculative_algorithm="NGRAM"), "needs --speculative-algorithm"),
        (dict(disable_overlap_schedule=True), "overlap (spec v2) worker only"),
        (dict(speculative_eagle_topk=4), "topk 1"),
        (dict(enable_dp_attention=True), "enable-dp-attention"),
        (dict(speculative_adaptive=True), "speculative-adaptive"),
        (dict(enable_multi_layer_eagle=True), "multi-layer-eagle"),
        (dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap"),
        (dict(enable_pdmux=True), "--enable-pdmux"),
        (dict(enable_lora=True), "LoRA (--enable-lora, --lora-paths)"),
        (dict(lora_paths=["adapter=/models/adapter"]), "LoRA (--enable-lora, --lora-paths)"),
        (
            dict(speculative_algorithm="EAGLE", model_path="/m/dsv3", speculative_draft_model_path="/m/dsv3"),
            "does not support NEXTN/MTP drafts",
        ),
        (
            dict(speculative_algorithm="EAGLE", model_path="/m/q3next", speculative_draft_model_path=None),
            "does not support NEXTN/MTP drafts",
        ),
    ],
)
def test_validation_refuses(server_args_cls, kw, msg):
    import re

    with pytest.raises(ValueError, match=re.escape(msg)):
        _args(server_args_cls, **kw)._validate_speculative_disable_threshold()


def test_validation_accepts_and_warns(server_args_cls, caplog):
    for kw in (
        {},
        dict(speculative_disable_batch_size_threshold=None, speculative_algorithm=None),
        dict(speculative_disable_batch_size_threshold=0),
        dict(speculative_disable_batch_size_hysteresis=7),
        dict(speculative_disable_draft_decode_min_bs=None, speculative_disable_kv_only_margin=None),
        dict(
            speculative_disable_draft_decode_min_bs=1,
            speculative_disable_kv_only_margin=8,
            speculative_disable_kv_only_steps_per_replay=1,
        ),
        dict(speculative_algorithm="EAGLE", model_path="/m/llama", speculative_draft_model_path="/m/eagle"),
        dict(speculative_disable_batch_size_threshold=None, enable_lora=True, enable_two_batch_overlap=True),
    ):
        _args(server_args_cls, **kw)._validate_speculative_disable_threshold()
    with caplog.at_level(logging.WARNING):
        _args(
            server_args_cls, speculative_disable_batch_size_threshold=64, max_running_requests=48
        )._validate_speculative_disable_threshold()
    assert "never be switched off" in caplog.text


FLAGS = {  # flag -> (field, default)
    "--speculative-disable-batch-size-threshold": ("speculative_disable_batch_size_threshold", None),
    "--speculative-disable-batch-size-hysteresis": ("speculative_disable_batch_size_hysteresis", 0),
    "--speculative-disable-draft-decode-min-bs": ("speculative_disable_draft_decode_min_bs", 16),
    "--speculative-disable-kv-only-margin": ("speculative_disable_kv_only_margin", 0),
    "--speculative-disable-kv-only-steps-per-replay": ("speculative_disable_kv_only_steps_per_replay", 4),
}


def test_the_fallback_settings_are_server_flags(patched, server_args_cls):
    """Every setting of the fallback is a ServerArgs field with a flag of the same name in the
    patched add_cli_args (from_cli_args reads each field from its flag's dest), shown in
    --help with its help text, its default the field's; 'off' is None."""
    import argparse

    parser = disable_flags_parser(patched, server_args_cls)
    assert {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings[0] != "-h"} == {
        flag: field for flag, (field, _) in FLAGS.items()
    }
    fields = {f.name: f.default for f in dataclasses.fields(server_args_cls)}
    assert {field: fields[field] for field, _ in FLAGS.values()} == dict(FLAGS.values())
    assert vars(parser.parse_args([])) == dict(FLAGS.values())
    text = parser.format_help()
    for action in parser._actions[1:]:
        assert action.option_strings[0] in text and len(action.help) > 40 and "Default:" in action.help
    got = parser.parse_args(
        [
            "--speculative-disable-batch-size-threshold",
            "32",
            "--speculative-disable-batch-size-hysteresis",
            "4",
            "--speculative-disable-draft-decode-min-bs",
            "off",
            "--speculative-disable-kv-only-margin",
            "8",
            "--speculative-disable-kv-only-steps-per-replay",
            "1",
        ]
    )
    assert vars(got) == {
        "speculative_disable_batch_size_threshold": 32,
        "speculative_disable_batch_size_hysteresis": 4,
        "speculative_disable_draft_decode_min_bs": None,
        "speculative_disable_kv_only_margin": 8,
        "speculative_disable_kv_only_steps_per_replay": 1,
    }
    assert parser.parse_args(["--speculative-disable-kv-only-margin", "OFF"]).speculative_disable_kv_only_margin is None
    with pytest.raises(argparse.ArgumentError, match="expected a whole number or 'off', got 'eight'"):
        parser.parse_args(["--speculative-disable-kv-only-margin", "eight"])


def test_flags_sit_with_the_speculative_ones(patched):
    """In --help they follow --speculative-adaptive-config, in the speculative group."""
    src = (patched / ARGS).read_text()
    at = src.index('"--speculative-adaptive-config"')
    assert [src.index(f'"{flag}"', at) for flag in FLAGS] == sorted(src.index(f'"{flag}"', at) for flag in FLAGS)
    assert src.index('"--speculative-disable-batch-size-threshold"') > at


def _worker_class(patched, name="EAGLEWorkerV2", state_cls=None):
    """The patched release's worker class (EAGLEWorkerV2 or StandaloneWorkerV2), the
    recipe's methods included."""
    namespace = {
        "logger": logging.getLogger("test"),
        "os": os,
        "SpecFallbackState": state_cls or fallback_state_class(patched),
    }
    return release_type(patched, name, namespace)


def _worker(patched, server_args_cls, threshold=4, hysteresis=0):
    """A real EAGLEWorkerV2 after the recipe's own _spec_fallback_init, given T and H as
    server args (the era's start-up, which captures CUDA graphs and checks the models, left
    out): its state and counters are the ones the engine starts with."""
    w = release_instance(
        _worker_class(patched),
        tp_rank=0,
        _spec_fallback_build=lambda server_args: None,
        _spec_fallback_refuse_unsupported_models=lambda: None,
    )
    w._spec_fallback_init(
        server_args(
            server_args_cls,
            speculative_disable_batch_size_threshold=threshold,
            speculative_disable_batch_size_hysteresis=hysteresis,
        )
    )
    return w


def _batch(tree, bs, hidden=False, idle=False, **values):
    """A real ModelWorkerBatch of the release in a speculative decode step: `bs` requests
    (the second asking for hidden states if `hidden`), or an idle batch."""
    forward_mode, _ = forward_modes(tree)
    reqs = [request(tree, return_hidden_states=hidden and i == 1) for i in range(bs)]
    return model_worker_batch(
        tree,
        **{
            "forward_mode": forward_mode.IDLE if idle else forward_mode.DECODE,
            "spec_info": object(),
            "seq_lens": [0] * bs,
            "reqs": reqs,
            "has_grammar": False,
            "return_logprob": False,
            **values,
        },
    )


def test_decision_threshold_and_hysteresis(patched, server_args_cls):
    w = _worker(patched, server_args_cls, threshold=4, hysteresis=2)
    seq = [1, 4, 5, 8, 4, 3, 2, 3, 5]
    got = [w._spec_fallback_should_run(_batch(patched, bs)) for bs in seq]
    # on above 4; stays on until the batch is <= 4 - 2 = 2; off again above 4
    assert got == [False, False, True, True, True, True, False, False, True]
    s = w._spec_fallback.stats
    assert s["fallback_steps"] == 5 and s["spec_steps"] == 4
    assert s["switches_to_fallback"] == 2 and s["switches_to_spec"] == 1
    assert [p["mode"] for p in s["phases"]] == ["spec", "fallback", "spec", "fallback"]


def test_every_decode_batch_may_fall_back(patched, server_args_cls):
    """0.5.12: grammar, logprob and hidden-state batches fall back like any other (the plain
    decode step serves them); a batch with no draft input yet and an idle batch stay on the
    speculative path."""
    w = _worker(patched, server_args_cls, threshold=0)
    assert w._spec_fallback_should_run(_batch(patched, 8)) is True
    for kw in (dict(has_grammar=True), dict(return_logprob=True), dict(hidden=True)):
        assert w._spec_fallback_should_run(_batch(patched, 8, **kw)) is True, kw
    for kw in (dict(spec_info=None), dict(idle=True)):
        assert w._spec_fallback_should_run(_batch(patched, 8, **kw)) is False, kw


def test_ranks_decide_alike(patched, server_args_cls):
    """TP: every rank sees the same batches, so every rank takes the same branch."""
    import random

    rng = random.Random(0)
    batches = [_batch(patched, rng.randint(1, 12), has_grammar=rng.random() < 0.1) for _ in range(500)]
    a, b = _worker(patched, server_args_cls, 6, 2), _worker(patched, server_args_cls, 6, 2)
    assert [a._spec_fallback_should_run(x) for x in batches] == [b._spec_fallback_should_run(x) for x in batches]


def test_without_the_flag_nothing_is_counted_or_built(patched, server_args_cls):
    """The patch without the flag: no start-up work, the decision declines every step, the
    verify-complete hook counts nothing."""
    built = []
    w = release_instance(_worker_class(patched), tp_rank=0, _spec_fallback_build=built.append)
    w._spec_fallback_init(server_args(server_args_cls))
    assert w._spec_fallback_should_run(_batch(patched, 64)) is False
    w._spec_fallback_on_verify([1, 2])
    assert not built and w._spec_fallback.stats["spec_steps"] == 0 and w._spec_fallback.stats["phases"] == []


def test_one_rank_writes_the_stats_file(patched, server_args_cls, monkeypatch, tmp_path):
    """TP: only rank 0 publishes SPECTOOL_FALLBACK_STATS. StandaloneWorkerV2 sets no tp_rank
    of its own (0.5.12), so the rank comes from its target worker."""
    state_cls = fallback_state_class(patched)
    published = []
    monkeypatch.setattr(state_cls, "publish_stats", lambda self, path: published.append((self, path)))
    monkeypatch.setenv("SPECTOOL_FALLBACK_STATS", str(tmp_path / "stats.json"))
    eagle, standalone = (_worker_class(patched, name, state_cls) for name in ("EAGLEWorkerV2", "StandaloneWorkerV2"))
    target = release_type(patched, "TpModelWorker")
    args = server_args(server_args_cls, speculative_disable_batch_size_threshold=4)
    skipped = {
        "_spec_fallback_build": lambda server_args: None,
        "_spec_fallback_refuse_unsupported_models": lambda: None,
    }
    paths = {}
    for kind, rank in (("eagle", 0), ("eagle", 1), ("standalone", 0), ("standalone", 1)):
        w = (
            release_instance(eagle, tp_rank=rank, **skipped)
            if kind == "eagle"
            else release_instance(standalone, _target_worker=release_instance(target, tp_rank=rank), **skipped)
        )
        published.clear()
        w._spec_fallback_init(args)
        paths[kind, rank] = [(p, s is w._spec_fallback) for s, p in published]
    mine = [(str(tmp_path / "stats.json"), True)]
    assert paths == {("eagle", 0): mine, ("eagle", 1): [], ("standalone", 0): mine, ("standalone", 1): []}


def test_counters_read_after_a_workload_are_exact(patched, tmp_path):
    """The stats file as the harness reads it: the recipe writes it at start-up, then every
    STATS_INTERVAL_S from its own thread (no step is needed to flush a change), each write a
    consistent copy with its time; the harness's reader takes the writes made after the
    workload returned, so every change counted before then is in what it reads."""
    from spectool.harness.verify.engine_worker import settled_stats

    state_cls = fallback_state_class(patched)
    state = state_cls(threshold=4)
    state.STATS_INTERVAL_S = 0.02  # the engine's is 0.5 s; the protocol is the same
    path = str(tmp_path / "stats.json")
    before = set(threading.enumerate())
    state.publish_stats(path)
    (writer,) = set(threading.enumerate()) - before
    assert writer.daemon and writer.name == "spec-fallback-stats"
    try:
        first = json.loads(open(path).read())
        assert first["spec_steps"] == 0 and first["written_at"] > 0, "written before the engine is ready"
        for bs in (2, 2, 8):  # a workload's steps: the last one is never followed by another
            state.record_step(bs, bs > 4, False)
        stats = settled_stats(path, time.time())
        assert (stats["spec_steps"], stats["fallback_steps"], stats["fallback_requests"]) == (2, 1, 8)
        assert [(p["mode"], p["steps"], p["reqs"]) for p in stats["phases"]] == [("spec", 2, 0), ("fallback", 1, 0)]
        assert "written_at" not in stats
        state.record_verify([3, 3])  # the scheduler's report of the first step, then one more step
        state.record_step(9, True, False)
        state.count("draft_kv_only_flush_causes", "queued")
        stats = settled_stats(path, time.time())
        assert [(p["mode"], p["steps"], p["reqs"], p["correct_drafts"]) for p in stats["phases"]] == [
            ("spec", 2, 2, 6),
            ("fallback", 2, 0, 0),
        ]
        assert stats["draft_kv_only_flush_causes"] == {"queued": 1}
        assert settled_stats(str(tmp_path / "none.json"), time.time()) == {}, "no file: no counters kept"
    finally:
        state.stats_path = None  # the writer thread ends
    writer.join(5.0)
    assert not writer.is_alive()


def test_acceptance_is_counted_per_phase(patched, server_args_cls):
    w = _worker(patched, server_args_cls, threshold=4)
    for bs in (2, 2, 8, 8, 2):
        w._spec_fallback_should_run(_batch(patched, bs))
    for drafts in ([3, 3], [2, 3], [0] * 8, [0] * 8, [3, 2]):
        w._spec_fallback_on_verify(drafts)
    ph = w._spec_fallback.stats["phases"]
    assert [(p["mode"], p["reqs"], p["correct_drafts"]) for p in ph] == [
        ("spec", 4, 11),
        ("fallback", 16, 0),
        ("spec", 2, 5),
    ]


def test_future_map_reads_an_unfiltered_batch_as_views_and_gathers_the_rest(patched):
    """The patched 0.5.12 FutureMap, whole: a decode batch whose future indices are still the
    interval they were stored at gets views of the buffers (no gather kernels); a filtered
    batch (its interval kept, fewer indices) and a merged one (no interval) are gathered as
    the release does. Values equal the stored rows in every case."""
    torch = pytest.importorskip("torch")
    path = patched / "sglang/srt/managers/overlap_utils.py"
    ns = {"torch": torch, "dataclass": dataclasses.dataclass, "Optional": Optional}
    future_indices = load_function(path, "FutureIndices", ns)
    ns.update(FutureIndices=future_indices, spec_need_hidden_states=lambda: True, _resolve_future_token_ids=None)
    future_map = load_function(path, "FutureMap", ns)
    fm = future_map(
        max_running_requests=4,
        chunked_prefill_size=8,
        context_len=16,
        device="cpu",
        spec_algo=release_type(patched, "SpeculativeAlgorithm").EAGLE3,
    )
    torch.manual_seed(0)
    draft_input = eagle_draft_input_class(patched)

    def stored(bs):
        draft = draft_input(
            topk_p=torch.rand(bs, 1),
            topk_index=torch.randint(0, 99, (bs, 1)),
            bonus_tokens=torch.randint(0, 99, (bs,), dtype=torch.int32),
            new_seq_lens=torch.randint(1, 99, (bs,)),
            hidden_states=torch.randn(bs, 6),
        )
        fi = fm.alloc_future_indices(bs)
        fm.store_to_map_for_new_batch(fi, draft)
        return fi, draft

    (fi1, d1), (fi2, d2) = stored(3), stored(2)
    fields = ("topk_p", "topk_index", "bonus_tokens", "new_seq_lens", "hidden_states")

    class CpuIndices(torch.Tensor):  # the gather path records the indices on a CUDA stream
        def record_stream(self, stream):
            pass

    def resolve(indices, interval):
        got = draft_input(future_indices=future_indices(indices=indices.as_subclass(CpuIndices), interval=interval))
        fm.resolve_future(model_worker_batch(patched, spec_info=got))
        return got

    def is_view(t, name):
        buf = getattr(fm, f"{name}_buf")
        return t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()

    whole = resolve(fi1.indices, fi1.interval)
    for name in fields:
        assert torch.equal(getattr(whole, name), getattr(d1, name)) and is_view(getattr(whole, name), name), name
    keep = torch.tensor([0, 2])
    filtered = resolve(fi1.indices[keep], fi1.interval)  # what filter_batch leaves
    merged = resolve(torch.cat([fi1.indices, fi2.indices]), None)  # what merge_batch leaves
    for name in fields:
        assert torch.equal(getattr(filtered, name), getattr(d1, name)[keep]) and not is_view(
            getattr(filtered, name), name
        )
        assert torch.equal(getattr(merged, name), torch.cat([getattr(d1, name), getattr(d2, name)]))
        assert not is_view(getattr(merged, name), name)


RUNNER = "sglang/srt/model_executor/model_runner.py"


class PretrainedConfig:
    """transformers' base of every model config (transformers is not installed here): the
    text config of a plain model is the config itself."""

    def get_text_config(self):
        return self


HYBRID_PROPERTIES = ("hybrid_gdn_config", "mamba2_config", "kimi_linear_config", "hybrid_lightning_config")


@functools.cache
def _runner_classes(tree):
    """The release's ModelRunner, ModelConfig and the model configs ModelRunner's
    mambaish_config tests a model's config against (through the hybrid properties it reads
    and the release's linear-attention registry, empty: no model registered itself)."""
    import ast

    names = {
        n.id
        for prop in HYBRID_PROPERTIES
        for n in ast.walk(ast.parse(function_source(tree / RUNNER, f"ModelRunner.{prop}")))
        if isinstance(n, ast.Name) and n.id.endswith("Config")
    }
    ns = {name: release_type(tree, name, {"PretrainedConfig": PretrainedConfig}) for name in names}
    ns["get_linear_attn_config"] = load_function(
        tree / "sglang/srt/configs/linear_attn_model_registry.py",
        "get_linear_attn_config",
        {"_LINEAR_ATTN_MODEL_REGISTRY": [], "Any": object, "Optional": Optional},
    )
    model_config = release_type(
        tree, "ModelConfig", {"ModelImpl": release_type(tree, "ModelImpl")}, rel="sglang/srt/configs/model_config.py"
    )
    return release_type(tree, "ModelRunner", ns, rel=RUNNER), model_config, ns


def _target_runner(tree, config):
    """A real ModelRunner of the release serving a model whose HF config is the release's own
    `config` class (None: a plain transformers config); its mambaish_config answers from
    that config."""
    runner, model_config, configs = _runner_classes(tree)
    hf_config = release_instance(configs[config]) if config else PretrainedConfig()
    return release_instance(
        runner, model_config=release_instance(model_config, hf_config=hf_config), is_draft_worker=False
    )


@functools.cache
def _model_class(tree, name):
    """The release's model class `name` (on its own bases, torch's nn.Module among them)."""
    import torch

    mapper = release_type(tree, "WeightsMapper", rel="sglang/srt/models/utils.py")
    return release_type(tree, name, {"torch": torch, "nn": torch.nn, "WeightsMapper": mapper})


@pytest.mark.parametrize(
    "target,draft,msg",
    [
        ("Qwen3NextConfig", "LlamaForCausalLMEagle3", "hybrid linear-attention targets"),
        ("FalconH1Config", "LlamaForCausalLMEagle3", "hybrid linear-attention targets"),
        ("KimiLinearConfig", "LlamaForCausalLMEagle3", "hybrid linear-attention targets"),
        ("BailingHybridConfig", "LlamaForCausalLMEagle3", "hybrid linear-attention targets"),
        (None, "DeepseekV3ForCausalLMNextN", "NEXTN/MTP drafts (the draft model is DeepseekV3ForCausalLMNextN"),
        (None, "Qwen3NextForCausalLMMTP", "NEXTN/MTP drafts"),
        (None, "LlamaForCausalLMEagle3", None),
        (None, "LlamaForCausalLM", None),
    ],
)
def test_start_up_refuses_models_the_fallback_cannot_serve(target, draft, msg, patched):
    """Hybrid linear-attention targets (a fallback step would not update the recurrent state
    that the speculative path updates after verify; here Qwen3-Next, Falcon-H1, Kimi-Linear and
    Bailing hybrid configs, every kind the release's mambaish_config names) and
    NEXTN/MTP drafts stop the server at start-up with one message each; EAGLE-3 heads and
    STANDALONE drafts start. The worker, its target and draft workers, their model runners
    and the draft model are objects of the release's own classes."""
    import re

    runner = _target_runner(patched, target)
    assert (runner.mambaish_config is not None) == (target is not None)
    draft_runner = release_instance(_runner_classes(patched)[0], model=release_instance(_model_class(patched, draft)))
    worker = release_instance(
        _worker_class(patched),
        _target_worker=release_instance(release_type(patched, "TpModelWorker"), _model_runner=runner),
        _draft_worker=release_instance(
            release_type(patched, "EagleDraftWorker", rel=WORKER), draft_runner=draft_runner
        ),
    )
    if msg is None:
        worker._spec_fallback_refuse_unsupported_models()
    else:
        with pytest.raises(ValueError, match=re.escape(msg)):
            worker._spec_fallback_refuse_unsupported_models()
