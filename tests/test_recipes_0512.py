"""The 0.5.12 recipes on the real SGLang 0.5.12 sources (fetched from the package index):
apply, second apply is a no-op, revert, compile, no undefined names; and the patched
functions' logic, called with simulated collaborators."""

from __future__ import annotations

import collections
import hashlib
import logging
from types import SimpleNamespace

import pytest

from spectool import api
from spectool.testing import bind_methods, load_function

pytestmark = pytest.mark.network

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
ARGS = "sglang/srt/server_args.py"


def _hashes(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (root / "sglang").rglob("*.py")}


@pytest.fixture(scope="module")
def patched(sglang_release):
    tree = sglang_release("0.5.12")
    out = api.apply(tree)
    assert out.ok, [r.to_json() for r in out.plan.results]
    return tree


def test_apply_noop_revert(sglang_release):
    tree = sglang_release("0.5.12")
    before = _hashes(tree)
    out = api.apply(tree)
    assert out.ok and out.wrote
    assert {r.id: r.status for r in out.plan.results} == {
        "spec-disable-threshold": "applied", "spec-fallback": "applied", "sm120": "applied"}
    changed = {k for k, v in _hashes(tree).items() if before[k] != v}
    assert changed == {ARGS, WORKER, "sglang/srt/speculative/standalone_worker_v2.py",
                       "sglang/srt/managers/overlap_utils.py", "sglang/srt/layers/deep_gemm_wrapper/configurer.py"}
    for rel in changed:
        compile((tree / rel).read_bytes(), rel, "exec")
    again = api.apply(tree)
    assert not again.wrote and {r.status for r in again.plan.results} == {"already-applied"}
    st = api.status(tree)
    assert st.ok and {f["state"] for f in st.files} == {"intact"}
    api.revert(tree)
    assert _hashes(tree) == before


def test_check_on_pristine_and_patched(sglang_release, patched):
    assert api.check(sglang_release("0.5.12")).ok
    chk = api.check(patched)
    assert chk.ok and {r.status for r in chk.plan.results} == {"already-applied"}


class _Envs:
    class SGLANG_ENABLE_SPEC_V2:  # noqa: N801
        value = True

        @classmethod
        def get(cls):
            return cls.value


def _args(**kw):
    base = dict(speculative_disable_batch_size_threshold=8, speculative_disable_batch_size_hysteresis=0,
                speculative_algorithm="EAGLE3", disable_overlap_schedule=False, speculative_eagle_topk=1,
                enable_dp_attention=False, speculative_adaptive=False, max_running_requests=64,
                enable_multi_layer_eagle=False)
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture(scope="module")
def validate(patched):
    return load_function(patched / ARGS, "ServerArgs._validate_speculative_disable_threshold",
                         {"envs": _Envs, "logger": logging.getLogger("test")})


@pytest.mark.parametrize("kw,msg", [
    (dict(speculative_disable_batch_size_threshold=-1), "must be >= 0"),
    (dict(speculative_disable_batch_size_hysteresis=9), "hysteresis must be between"),
    (dict(speculative_algorithm="NGRAM"), "needs --speculative-algorithm"),
    (dict(disable_overlap_schedule=True), "overlap (spec v2) worker only"),
    (dict(speculative_eagle_topk=4), "topk 1"),
    (dict(enable_dp_attention=True), "enable-dp-attention"),
    (dict(speculative_adaptive=True), "speculative-adaptive"),
    (dict(enable_multi_layer_eagle=True), "multi-layer-eagle"),
])
def test_validation_refuses(validate, kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        validate(_args(**kw))


def test_validation_accepts_and_warns(validate, caplog):
    validate(_args())
    validate(_args(speculative_disable_batch_size_threshold=None, speculative_algorithm=None))
    validate(_args(speculative_disable_batch_size_threshold=0))
    with caplog.at_level(logging.WARNING):
        validate(_args(speculative_disable_batch_size_threshold=64, max_running_requests=48))
    assert "never be switched off" in caplog.text


class _Mode:
    def __init__(self, idle=False):
        self._idle = idle

    def is_idle(self):
        return self._idle


def _worker(patched, threshold=4, hysteresis=0):
    """A worker after the recipe's own _spec_fallback_init (run without a threshold, so it
    builds no graphs), then given T and H: its counters are the ones the engine starts with."""
    ns = {"logger": logging.getLogger("test"), "os": __import__("os"), "json": __import__("json"),
          "time": __import__("time"), "collections": collections}
    w = SimpleNamespace()
    bind_methods(patched / WORKER, "EAGLEWorkerV2", ns, w, "_spec_fallback_init", "_spec_fallback_eligible",
                 "_spec_fallback_should_run", "_spec_fallback_on_verify")
    w._spec_fallback_init(SimpleNamespace())
    w._fallback_threshold, w._fallback_hysteresis, w._fallback_stats_path = threshold, hysteresis, None
    w.should, w.on_verify = w._spec_fallback_should_run, w._spec_fallback_on_verify
    return w


def _batch(bs, **kw):
    d = dict(forward_mode=_Mode(), spec_info=object(), seq_lens=[0] * bs, has_grammar=False,
             return_logprob=False, return_hidden_states=False)
    d.update(kw)
    return SimpleNamespace(**d)


def test_decision_threshold_and_hysteresis(patched):
    w = _worker(patched, threshold=4, hysteresis=2)
    seq = [1, 4, 5, 8, 4, 3, 2, 3, 5]
    got = [w.should(_batch(bs)) for bs in seq]
    # on above 4; stays on until the batch is <= 4 - 2 = 2; off again above 4
    assert got == [False, False, True, True, True, True, False, False, True]
    s = w._fallback_stats
    assert s["fallback_steps"] == 5 and s["spec_steps"] == 4
    assert s["switches_to_fallback"] == 2 and s["switches_to_spec"] == 1
    assert [p["mode"] for p in s["phases"]] == ["spec", "fallback", "spec", "fallback"]


def test_stated_rule_keeps_unsupported_batches_on_spec_path(patched):
    w = _worker(patched, threshold=0)
    assert w.should(_batch(8)) is True
    for kw in (dict(has_grammar=True), dict(return_logprob=True), dict(return_hidden_states=True),
               dict(spec_info=None), dict(forward_mode=_Mode(idle=True))):
        assert w.should(_batch(8, **kw)) is False, kw


def test_ranks_decide_alike(patched):
    """TP: every rank sees the same batches, so every rank takes the same branch."""
    import random

    rng = random.Random(0)
    batches = [_batch(rng.randint(1, 12), has_grammar=rng.random() < 0.1) for _ in range(500)]
    a, b = _worker(patched, 6, 2), _worker(patched, 6, 2)
    assert [a.should(x) for x in batches] == [b.should(x) for x in batches]


def test_one_rank_writes_the_stats_file(patched, monkeypatch):
    """TP: only rank 0 writes SPECTOOL_FALLBACK_STATS. StandaloneWorkerV2 sets no tp_rank
    of its own (0.5.12), so the rank comes from its target worker; at TP=2 on the H200 both
    ranks once wrote the file and one crashed renaming it (results/verify-0.5.12-tp2)."""
    monkeypatch.setenv("SPECTOOL_FALLBACK_STATS", "/tmp/stats.json")
    ns = {"logger": logging.getLogger("test"), "os": __import__("os"), "collections": collections}
    init = load_function(patched / WORKER, "EAGLEWorkerV2._spec_fallback_init", ns)
    args = SimpleNamespace(speculative_disable_batch_size_threshold=None)
    paths = {}
    for kind, rank in (("eagle", 0), ("eagle", 1), ("standalone", 0), ("standalone", 1)):
        w = (SimpleNamespace(tp_rank=rank) if kind == "eagle"
             else SimpleNamespace(_target_worker=SimpleNamespace(tp_rank=rank)))
        init(w, args)
        paths[kind, rank] = w._fallback_stats_path
    assert paths == {("eagle", 0): "/tmp/stats.json", ("eagle", 1): None,
                     ("standalone", 0): "/tmp/stats.json", ("standalone", 1): None}


def test_acceptance_is_counted_per_phase(patched):
    w = _worker(patched, threshold=4)
    for bs in (2, 2, 8, 8, 2):
        w.should(_batch(bs))
    for drafts in ([3, 3], [2, 3], [0] * 8, [0] * 8, [3, 2]):
        w.on_verify(drafts)
    ph = w._fallback_stats["phases"]
    assert [(p["mode"], p["reqs"], p["correct_drafts"]) for p in ph] == [
        ("spec", 4, 11), ("fallback", 16, 0), ("spec", 2, 5)]


def test_future_map_reads_an_unfiltered_batch_as_views_and_gathers_the_rest(patched, monkeypatch):
    """The patched 0.5.12 FutureMap, whole: a decode batch whose future indices are still the
    interval they were stored at gets views of the buffers (no gather kernels); a filtered
    batch (its interval kept, fewer indices) and a merged one (no interval) are gathered as
    the release does. Values equal the stored rows in every case."""
    torch = pytest.importorskip("torch")
    import dataclasses
    from typing import Optional

    path = patched / "sglang/srt/managers/overlap_utils.py"
    import os

    ns = {"torch": torch, "dataclass": dataclasses.dataclass, "Optional": Optional, "os": os}
    future_indices = load_function(path, "FutureIndices", ns)
    ns.update(FutureIndices=future_indices, spec_need_hidden_states=lambda: True,
              _resolve_future_token_ids=None)
    future_map = load_function(path, "FutureMap", ns)
    fm = future_map(max_running_requests=4, chunked_prefill_size=8, context_len=16, device="cpu",
                    spec_algo=SimpleNamespace(is_none=lambda: False))
    torch.manual_seed(0)

    def stored(bs):
        draft = SimpleNamespace(topk_p=torch.rand(bs, 1), topk_index=torch.randint(0, 99, (bs, 1)),
                                bonus_tokens=torch.randint(0, 99, (bs,), dtype=torch.int32),
                                new_seq_lens=torch.randint(1, 99, (bs,)), hidden_states=torch.randn(bs, 6))
        fi = fm.alloc_future_indices(bs)
        fm.store_to_map_for_new_batch(fi, draft)
        return fi, draft

    (fi1, d1), (fi2, d2) = stored(3), stored(2)
    fields = ("topk_p", "topk_index", "bonus_tokens", "new_seq_lens", "hidden_states")

    class CpuIndices(torch.Tensor):  # the gather path records the indices on a CUDA stream
        def record_stream(self, stream):
            pass

    def resolve(indices, interval):
        got = SimpleNamespace(future_indices=future_indices(indices=indices.as_subclass(CpuIndices), interval=interval))
        fm.resolve_future(SimpleNamespace(spec_info=got))
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
        assert torch.equal(getattr(filtered, name), getattr(d1, name)[keep]) and not is_view(getattr(filtered, name), name)
        assert torch.equal(getattr(merged, name), torch.cat([getattr(d1, name), getattr(d2, name)]))
        assert not is_view(getattr(merged, name), name)
    # SPECTOOL_FUTURE_MAP_VIEWS=0 (a same-run control), read at a map's first resolve.
    monkeypatch.setenv("SPECTOOL_FUTURE_MAP_VIEWS", "0")
    fm = future_map(max_running_requests=4, chunked_prefill_size=8, context_len=16, device="cpu",
                    spec_algo=SimpleNamespace(is_none=lambda: False))
    fi1, d1 = stored(3)
    control = resolve(fi1.indices, fi1.interval)
    for name in fields:
        assert torch.equal(getattr(control, name), getattr(d1, name)) and not is_view(getattr(control, name), name)
