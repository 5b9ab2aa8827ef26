"""Engine arguments are mapped onto each release's ServerArgs fields (read from the source)."""

import ast
from pathlib import Path

import pytest

from spectool.harness.engine_compat import adapt

pytestmark = pytest.mark.network


def _fields(tree):
    src = (tree / "sglang/srt/server_args.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


KW = {
    "cuda_graph_max_bs": 32,
    "disable_piecewise_cuda_graph": True,
    "attention_backend": "triton",
    "speculative_disable_batch_size_threshold": 4,
}


def test_0512_names_pass_through(patched_release):
    assert adapt(KW, _fields(patched_release("0.5.12"))) == KW


def test_0517_names_are_mapped(patched_release):
    out = adapt(KW, _fields(patched_release("0.5.17")))
    assert out == {
        "cuda_graph_max_bs_decode": 32,
        "cuda_graph_backend_prefill": "disabled",
        "attention_backend": "triton",
        "speculative_disable_batch_size_threshold": 4,
    }


def test_unknown_argument_is_an_error(cached_release):
    with pytest.raises(KeyError, match="does not exist"):
        adapt({"speculative_disable_batch_size_threshold": 4}, _fields(cached_release("0.5.17")))


def test_every_bench_arm_starts_on_both_releases(patched_release):
    """The bench's engine settings (sleep_on_idle included) exist, under some name, in the
    ServerArgs of both patched releases, for every arm."""
    from spectool.harness.bench.arms import engine_kwargs
    from spectool.harness.bench.sweep import select_arms

    for version in ("0.5.12", "0.5.17"):
        fields = _fields(patched_release(version))
        for arm in select_arms(32, 256, None):
            kw = engine_kwargs(arm, {"target": "t", "draft": "d"}, max_bs=256, max_total_tokens=1000, port=1)
            assert kw["sleep_on_idle"] is True and "tp_size" not in kw
            assert adapt(kw, fields)["sleep_on_idle"] is True, (version, arm.name)
            sharded = engine_kwargs(arm, {"target": "t", "draft": "d"}, max_bs=256, max_total_tokens=1000, port=1, tp=2)
            assert adapt(sharded, fields)["tp_size"] == 2, (version, arm.name)  # bench --tp 2


def test_server_arg_types_are_read_from_the_tree(cached_release, patched_release):
    """The bench checks its --variant fields against the tree under test, read without
    importing it: plain fields and (0.5.17) annotated ones give their types; the recipe's
    flags are there once it is applied."""
    from spectool.harness.engine_compat import server_arg_annotations

    assert "speculative_disable_kv_only_margin" not in server_arg_annotations(str(cached_release("0.5.12")))
    types = server_arg_annotations(str(patched_release("0.5.12")))
    assert types["speculative_disable_kv_only_margin"] == "Optional[int]"
    assert types["speculative_disable_kv_only_steps_per_replay"] == "int" and types["disable_cuda_graph"] == "bool"
    types = server_arg_annotations(str(patched_release("0.5.17")))
    assert types["speculative_disable_batch_size_threshold"] == "Optional[int]"
    assert types["cuda_graph_max_bs_decode"] in ("int", "Optional[int]")


@pytest.mark.parametrize(
    "text,annotation,value",
    [
        ("8", "Optional[int]", 8),
        ("off", "Optional[int]", None),
        ("None", "Optional[int]", None),
        ("0.5", "float", 0.5),
        ("true", "bool", True),
        ("0", "bool", False),
        ("fa3", "str", "fa3"),
        ("off", "str", "off"),
        ("3,1,0", "Optional[List[int]]", [3, 1, 0]),
        ("16", "Optional[List[int]]", [16]),
        ("off", "Optional[List[int]]", None),
    ],
)
def test_a_variant_value_is_read_as_its_fields_type(text, annotation, value):
    from spectool.harness.engine_compat import server_arg_value

    assert server_arg_value("f", text, annotation) == value


@pytest.mark.parametrize(
    "text,annotation,needle",
    [
        ("eight", "Optional[int]", "f (Optional[int]) takes a whole number or off, not 'eight'"),
        ("off", "int", "f (int) takes a whole number, not 'off'"),
        ("yes", "bool", "f (bool) takes true or false, not 'yes'"),
        ("3;1", "Optional[List[int]]", "f (Optional[List[int]]) takes comma-separated whole numbers or off, not '3;1'"),
    ],
)
def test_a_variant_value_its_field_cannot_take_is_refused(text, annotation, needle):
    import re

    from spectool.harness.engine_compat import server_arg_value

    with pytest.raises(ValueError, match=re.escape(needle)):
        server_arg_value("f", text, annotation)


def _config_reads(path) -> set[str]:
    """The `config.X` a model file reads without a getattr/hasattr guard naming X."""
    tree = ast.parse(path.read_text())
    guarded = {
        n.args[1].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) in ("getattr", "hasattr")
        and len(n.args) >= 2
        and isinstance(n.args[1], ast.Constant)
    }
    reads = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config"
    }
    return reads - guarded


def test_bench_targets_give_every_field_their_model_classes_read(cached_release, tmp_path):
    """Each --target's configs, as written for the engines, name a model class of SGLang 0.5.12
    (the target's with EAGLE-3 capture) and give every config field its model file reads
    unguarded; the MoE target routes 8 of 128 experts."""
    import json

    from spectool.harness.bench.models import TARGETS, write_models

    models = cached_release("0.5.12") / "sglang" / "srt" / "models"
    files = {
        "LlamaForCausalLM": "llama.py",
        "Qwen3MoeForCausalLM": "qwen3_moe.py",
        "LlamaForCausalLMEagle3": "llama_eagle3.py",
    }
    for name in TARGETS:
        paths = write_models(tmp_path / name, name)
        for key in ("target", "draft"):
            cfg = json.loads((Path(paths[key]) / "config.json").read_text())
            (arch,) = cfg["architectures"]
            source = models / files[arch]
            assert "EntryClass" in source.read_text() and arch in source.read_text()
            needed = _config_reads(source) | (_config_reads(models / "llama.py") if "Eagle3" in arch else set())
            # Fields every transformers config has, and the one read for llama4_text heads only.
            assert needed <= set(cfg) | {"pad_token_id", "rope_scaling", "intermediate_size_mlp"}, (
                name,
                key,
                needed - set(cfg),
            )
            if key == "target":
                assert "set_eagle3_layers_to_capture" in source.read_text(), arch
    moe = TARGETS["qwen3-30b-a3b"].target
    assert (moe["num_experts"], moe["num_experts_per_tok"], TARGETS["qwen3-30b-a3b"].max_engines) == (128, 8, 1)


@pytest.mark.parametrize(
    "version,request_style", [("0.5.12", False), ("0.5.14", False), ("0.5.15", True), ("0.5.17", True)]
)
def test_the_profiler_is_started_as_each_release_takes_it(cached_release, version, request_style):
    """The bench profiles through the tokenizer manager's start_profile: keyword settings up
    to 0.5.14, one ProfileReq from 0.5.15, told apart by the release's own method; the
    ProfileReq of those releases has a field for every setting the bench passes."""
    from spectool.harness.engine_compat import profile_takes_request

    managers = cached_release(version) / "sglang/srt/managers"
    method = next(
        n
        for n in ast.walk(ast.parse((managers / "tokenizer_control_mixin.py").read_text()))
        if isinstance(n, ast.AsyncFunctionDef) and n.name == "start_profile"
    )
    assert profile_takes_request([a.arg for a in method.args.args]) is request_style
    if request_style:
        req = next(
            n
            for n in ast.parse((managers / "io_struct.py").read_text()).body
            if isinstance(n, ast.ClassDef) and n.name == "ProfileReq"
        )
        fields = {s.target.id for s in req.body if isinstance(s, ast.AnnAssign)}
        assert {"output_dir", "num_steps", "activities", "with_stack", "record_shapes"} <= fields
