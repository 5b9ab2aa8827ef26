"""Seed-era variants (0.5.6.post2 to 0.5.10) on the real fetched releases. These SGLang
versions pin torch 2.8/2.9 and cannot run on the project's H200 image, so they are checked
by applying, compiling, the undefined-name check (the plan does both), and by calling the
patched functions on objects of the release's own classes (its worker, ServerArgs and envs
registry), with fakes only for the GPU libraries (triton, DeepGEMM)."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import pytest

from spectool.testing import load_function

from .sglang_source import (
    WORKER,
    disable_flags_parser,
    release_envs,
    release_instance,
    release_type,
    server_args,
    server_args_class,
)

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def trees(patched_release):
    return {v: patched_release(v) for v in ("0.5.6.post2", "0.5.8", "0.5.10")}


EXT = "sglang/srt/layers/attention/triton_ops/extend_attention.py"


def _block_sizes(tree, cap, lq=128):
    triton = SimpleNamespace(next_power_of_2=lambda n: 1 << (n - 1).bit_length())
    fn = load_function(
        tree / EXT,
        "_get_block_sizes_for_extend_attention",
        {"CUDA_CAPABILITY": cap, "_is_cuda": True, "_is_hip": False, "triton": triton},
    )
    out = fn(lq, lq)
    return out[3], out[4]  # BLOCK_M, BLOCK_N


@pytest.mark.parametrize("lq,want", [(128, (64, 128)), (256, (64, 64)), (576, (32, 32))])
def test_sm120_block_sizes_fit_shared_memory(trees, cached_release, lq, want):
    assert _block_sizes(trees["0.5.8"], (12, 0), lq) == want
    assert _block_sizes(cached_release("0.5.8"), (12, 0), 128) == (128, 64), "unpatched: Hopper sizes (the bug)"


def test_other_archs_block_sizes_unchanged(trees, cached_release):
    for cap in ((9, 0), (8, 0), (8, 9), (10, 0)):
        assert _block_sizes(trees["0.5.8"], cap) == _block_sizes(cached_release("0.5.8"), cap)


def test_sm120_fp8_dispatch_uses_triton(trees):
    sentinel = {name: object() for name in ("deep", "fi", "cutlass", "aiter", "triton")}
    ns = {
        "deep_gemm_wrapper": SimpleNamespace(ENABLE_JIT_DEEPGEMM=False),
        "is_blackwell_supported": lambda: True,
        "is_flashinfer_available": lambda: True,
        "_check_cutlass_block_fp8_hardware_support": lambda: True,
        "_use_aiter": False,
        "deepgemm_w8a8_block_fp8_linear_with_fallback": sentinel["deep"],
        "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback": sentinel["fi"],
        "cutlass_w8a8_block_fp8_linear_with_fallback": sentinel["cutlass"],
        "aiter_w8a8_block_fp8_linear": sentinel["aiter"],
        "triton_w8a8_block_fp8_linear": sentinel["triton"],
    }
    path = trees["0.5.8"] / "sglang/srt/layers/quantization/fp8_utils.py"
    assert (
        load_function(path, "_dispatch_auto_backend", {**ns, "is_sm120_supported": lambda: True})()
        is sentinel["triton"]
    )
    # SM100 (Blackwell data center) keeps the FlashInfer TRT-LLM kernel
    assert (
        load_function(path, "_dispatch_auto_backend", {**ns, "is_sm120_supported": lambda: False})() is sentinel["fi"]
    )


@pytest.mark.parametrize("version", ["0.5.6.post2", "0.5.8", "0.5.10"])
def test_deepgemm_opt_out(trees, version, monkeypatch):
    """The release's own envs registry, with SGLANG_ENABLE_JIT_DEEPGEMM at its default (on):
    the patched configurer turns DeepGEMM off on SM120 only."""
    import sys
    import types

    sys.modules.setdefault("deep_gemm", types.ModuleType("deep_gemm"))
    monkeypatch.delenv("SGLANG_ENABLE_JIT_DEEPGEMM", raising=False)
    env = release_envs(trees[version])
    assert env.SGLANG_ENABLE_JIT_DEEPGEMM.get() is True
    path = trees[version] / "sglang/srt/layers/deep_gemm_wrapper/configurer.py"
    for sm, want in ((120, False), (90, True), (100, True), (80, False)):
        fn = load_function(
            path,
            "_compute_enable_deep_gemm",
            {"get_device_sm": lambda sm=sm: sm, "envs": env, "_is_cuda": True, "_is_musa": False},
        )
        assert fn() is want, (version, sm)


def test_seed_validation_tells_how_to_enable_spec_v2(trees, monkeypatch):
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "false")
    env = release_envs(trees["0.5.8"])
    cls = server_args_class(trees["0.5.8"], {"envs": env, "logger": logging.getLogger("t")})
    args = server_args(
        cls, speculative_disable_batch_size_threshold=8, speculative_algorithm="EAGLE3", speculative_eagle_topk=1
    )
    with pytest.raises(ValueError, match="SGLANG_ENABLE_SPEC_V2"):
        args._validate_speculative_disable_threshold()


@pytest.mark.parametrize("version", ["0.5.6.post2", "0.5.10"])
def test_seed_has_the_same_flags_and_refuses_the_same_values(trees, version, monkeypatch):
    """The era's ServerArgs takes every flag 0.5.12 has (a command line works on both) and
    refuses a hysteresis of the threshold or more."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "true")
    env = release_envs(trees[version])
    cls = server_args_class(trees[version], {"envs": env, "logger": logging.getLogger("t")})
    parser = disable_flags_parser(trees[version], cls)
    assert sorted(a.dest for a in parser._actions[1:]) == sorted(
        f.name for f in dataclasses.fields(cls) if f.name.startswith("speculative_disable_")
    )
    assert len(parser._actions) == 6
    args = server_args(
        cls,
        speculative_disable_batch_size_threshold=8,
        speculative_disable_batch_size_hysteresis=8,
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=1,
    )
    with pytest.raises(ValueError, match=r"hysteresis must be 0 or below the threshold \(8\), got 8"):
        args._validate_speculative_disable_threshold()


def test_seed_worker_says_the_draft_sync_flags_have_no_effect(trees, caplog):
    """This era's draft KV sync is always the one-token draft extend: a draft-sync flag set
    to anything but its default is named in a warning at start-up."""
    tree = trees["0.5.10"]
    cls = server_args_class(tree, {})
    worker_cls = release_type(tree, "EAGLEWorkerV2", {"ServerArgs": cls, "logger": logging.getLogger("t")}, rel=WORKER)
    target_cls = release_type(tree, "TpModelWorker")
    stop = RuntimeError("stop after the flags")  # the graph capture that follows needs a GPU
    both = ["--speculative-disable-draft-decode-min-bs", "--speculative-disable-kv-only-margin"]
    for values, named in (
        ({}, []),
        ({"speculative_disable_kv_only_margin": None, "speculative_disable_draft_decode_min_bs": 1}, both),
    ):
        caplog.clear()
        w = release_instance(
            worker_cls,
            _spec_fallback=None,
            _target_worker=release_instance(target_cls, _model_runner=None),
            _spec_fallback_plain_attn_backend=lambda runner: (_ for _ in ()).throw(stop),
        )
        with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="stop after"):
            w._spec_fallback_build(server_args(cls, speculative_disable_batch_size_threshold=8, **values))
        assert [m for m in caplog.messages if "has no effect" in m] == [
            f"spec-fallback: {flag} has no effect on this SGLang: its draft KV sync is always a one-token draft extend"
            for flag in named
        ]
