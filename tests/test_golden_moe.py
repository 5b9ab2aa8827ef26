"""The golden MoE target (spectool/harness/verify/golden_moe.py) is the model SGLang 0.5.12
serves: its checkpoint loads whole into ``Qwen3MoeForCausalLM`` (the release's own
load_weights and expert mapping), and its experts compute what SGLang's torch-native router
and fused-MoE reference compute over the loaded weights."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from spectool.harness.verify import golden_moe as g
from spectool.testing import load_function

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

SMALL = g.MoeSpec(
    vocab=32, hidden=32, layers=3, heads=2, intermediate=48, seq_len=24, min_segment=4, max_segment=8, steps=4, batch=4
)
MODELS = "sglang/srt/models"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    model, loss, _ = g.train_copy_task(SMALL, "cpu", log=None, build=g._model)
    out = tmp_path_factory.mktemp("moe") / "target"
    g.save(model, SMALL, out, {"final_loss": loss})
    return model.eval(), out


def sglang_parameters(spec: g.MoeSpec) -> dict:
    """The parameters Qwen3MoeForCausalLM creates (checked against its source below), with
    the shards its load_weights must fill: q/k/v stacked in qkv_proj, every expert's gate (w1)
    and up (w3) in the fused w13, its down (w2) in w2."""
    E = range(spec.experts)
    params = {"model.embed_tokens.weight": {None}, "model.norm.weight": {None}, "lm_head.weight": {None}}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        params[p + "self_attn.qkv_proj.weight"] = {"q", "k", "v"}
        for name in ("self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate"):
            params[p + f"{name}.weight"] = {None}
        for name in ("input_layernorm", "post_attention_layernorm"):
            params[p + f"{name}.weight"] = {None}
        params[p + "mlp.experts.w13_weight"] = {(e, s) for e in E for s in ("w1", "w3")}
        params[p + "mlp.experts.w2_weight"] = {(e, "w2") for e in E}
    return params


def test_the_parameters_are_the_ones_qwen3_moe_creates(cached_release):
    """The table above, read off the release: the attention's stacked qkv and per-head norms,
    the router and the fused experts of the sparse block, every layer sparse."""
    tree = cached_release("0.5.12")
    src = (tree / MODELS / "qwen3_moe.py").read_text()
    for attr in ("qkv_proj", "o_proj", "q_norm", "k_norm", "gate", "experts", "input_layernorm"):
        assert re.search(rf"self\.{attr} = ", src), attr
    assert "self.is_layer_sparse = True" in src and "shared_expert" not in src
    fused = (tree / "sglang/srt/layers/moe/fused_moe_triton/layer.py").read_text()
    assert '"experts.w13_"' in fused and '"experts.w2_"' in fused
    cfg = g.config_json(g.MoeSpec())
    for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "rms_norm_eps", "attention_bias"):
        assert f"config.{field}" in src, field
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"] and cfg["norm_topk_prob"] is True


def test_the_checkpoint_loads_whole_into_qwen3_moe(small, cached_release):
    """SGLang 0.5.12's Qwen3MoeForCausalLM.load_weights (the release's code, with its own
    expert mapping and layer-id parser) over the saved checkpoint: every tensor lands in a
    parameter the class creates, every parameter gets every shard it needs, exactly once,
    and the shapes are the ones those parameters hold. (load_weights skips a name it does not
    know silently, which would leave a layer of random weights.)"""
    from safetensors.torch import load_file

    tree = cached_release("0.5.12")
    _, folder = small
    calls = []

    class Param:
        def __init__(self, name):
            self.name = name

        def weight_loader(self, param, weight, *args, shard_id=None, expert_id=None):
            # (param, weight, shard) for a stacked one, (param, weight, name, shard_id=,
            # expert_id=) for an expert, (param, weight) for the rest
            shard = (expert_id, shard_id) if expert_id is not None else (args[0] if args else None)
            calls.append((self.name, shard, tuple(weight.shape)))

    mapping = load_function(
        tree / "sglang/srt/layers/moe/fused_moe_triton/layer.py", "FusedMoE.make_expert_params_mapping", {}
    )
    get_layer_id = load_function(tree / "sglang/srt/layers/utils/common.py", "get_layer_id", {"re": re})

    class Qwen3MoeLoader(torch.nn.Module):
        """The instance load_weights reads: its config, its layer range and its parameters."""

        def __init__(self):
            super().__init__()
            self.config = type("Qwen3MoeConfig", (), json.loads((folder / "config.json").read_text()))
            self.params = {name: Param(name) for name in sglang_parameters(SMALL)}
            self.model = torch.nn.Module()
            self.model.start_layer, self.model.end_layer = 0, self.config.num_hidden_layers
            self.routed_experts_weights_of_layer = None

        def named_parameters(self):
            return self.params.items()

    loader = Qwen3MoeLoader()
    ns = {
        "FusedMoE": type("FusedMoE", (), {"make_expert_params_mapping": classmethod(mapping)}),
        "get_layer_id": get_layer_id,
        "default_weight_loader": None,
        "logger": None,
        "Iterable": typing.Iterable,
        "Tuple": tuple,
    }
    load_weights = load_function(tree / MODELS / "qwen3_moe.py", "Qwen3MoeForCausalLM.load_weights", ns)
    saved = load_file(str(folder / "model.safetensors"))
    load_weights(loader, iter(saved.items()))
    assert len(calls) == len(saved), "every checkpoint tensor is loaded once"
    got = {}
    for name, shard, _ in calls:
        got.setdefault(name, []).append(shard)
    want = sglang_parameters(SMALL)
    assert set(got) == set(want)
    for name, shards in got.items():
        assert len(shards) == len(set(shards)) and set(shards) == want[name], name
    H, hd, E, I = SMALL.hidden, SMALL.hidden // SMALL.heads, SMALL.experts, SMALL.moe_intermediate  # noqa: E741
    shapes = {(n.split("layers.0.")[-1], s if not isinstance(s, tuple) else s[1]): shape for n, s, shape in calls}
    assert shapes[("self_attn.qkv_proj.weight", "q")] == (H, H)
    assert shapes[("self_attn.q_norm.weight", None)] == (hd,)
    assert shapes[("mlp.gate.weight", None)] == (E, H)
    assert shapes[("mlp.experts.w13_weight", "w1")] == (I, H) == shapes[("mlp.experts.w13_weight", "w3")]
    assert shapes[("mlp.experts.w2_weight", "w2")] == (H, I)


def test_the_experts_compute_what_sglangs_moe_reference_computes(small, cached_release):
    """One layer's sparse block, from the saved bf16 weights: this module's router and experts
    against SGLang 0.5.12's torch-native top-k (softmax, renormalised) and fused-MoE
    reference over w13 = [gate; up] and w2 stacked as its weight loader stacks them."""
    from safetensors.torch import load_file

    tree = cached_release("0.5.12")
    model, folder = small
    loaded = g.load(folder, SMALL).eval()
    saved = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    topk = load_function(tree / "sglang/srt/layers/moe/topk.py", "fused_topk_torch_native", {"torch": torch})
    native = load_function(
        tree / "sglang/srt/layers/moe/fused_moe_native.py",
        "fused_moe_forward_native",
        {"torch": torch, "F": torch.nn.functional, "StandardCombineInput": lambda hidden_states: hidden_states},
    )
    from tests.sglang_source import release_class

    runner_config = release_class(tree, "sglang/srt/layers/moe/moe_runner/base.py", "MoeRunnerConfig", {"torch": torch})
    p = "model.layers.1.mlp."
    experts = torch.nn.Module()
    experts.w13_weight = torch.nn.Parameter(
        torch.stack(
            [
                torch.cat([saved[p + f"experts.{e}.gate_proj.weight"], saved[p + f"experts.{e}.up_proj.weight"]])
                for e in range(SMALL.experts)
            ]
        )
    )
    experts.w2_weight = torch.nn.Parameter(
        torch.stack([saved[p + f"experts.{e}.down_proj.weight"] for e in range(SMALL.experts)])
    )
    experts.moe_runner_config = runner_config(num_experts=SMALL.experts, top_k=SMALL.top_k)
    h = torch.randn(20, SMALL.hidden, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = h @ saved[p + "gate.weight"].T
        weights, ids = topk(h, logits, SMALL.top_k, True)
        want = native(experts, (h, None, (weights, ids, None)))
        layer = loaded.layers[1]
        got = layer.experts(h[None], g.route(layer.gate(h[None]), SMALL))[0]
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    # The loaded model is the trained one in bf16: same logits up to bf16 rounding.
    ids_ = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(model(ids_), loaded(ids_), atol=0.1)


def test_the_moe_head_trains_on_the_layers_qwen3_moe_captures(small, cached_release, tmp_path):
    """Qwen3-MoE captures the residual stream entering layers 2, L/2 and L-3 by default, as
    Llama does, so the dense head's features and training apply unchanged; a head trains
    over the MoE target and saves in the layout SGLang's EAGLE-3 Llama head loads."""
    from spectool.harness.verify.golden_eagle3 import HeadSpec, capture_layers, ensure_head, load_head

    src = (cached_release("0.5.12") / MODELS / "qwen3_moe.py").read_text()
    body = src[src.index("def set_eagle3_layers_to_capture") :]
    assert re.search(r"\[\s*2,\s*num_layers // 2,\s*num_layers - 3,\s*\]", body[:800])
    assert capture_layers(g.MoeSpec()) == [2, 3, 4], "seven layers: three distinct captures"
    model, folder = small
    head_spec = HeadSpec(steps=2, batch=2, seq_len=16)
    out = ensure_head(tmp_path, SMALL, head_spec, log=None, target=model, out=tmp_path / "head")
    head = load_head(out, SMALL)
    assert head.fc.weight.shape == (SMALL.hidden, 3 * SMALL.hidden)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]


def test_the_run_finds_trains_or_reuses_the_moe_models(tmp_path):
    """The runner trains the MoE models in a job of its own when neither the committed folder
    nor the cache holds them, and reuses them when one does; the meta keys its golden tokens
    by the weights."""
    from spectool.harness.verify import runner

    spec = g.MoeSpec()
    models, job = runner.moe_models(tmp_path / "shipped", tmp_path / "cache", spec)
    assert job["module"] == "spectool.harness.verify.golden_moe" and job["spec"]["experts"] == spec.experts
    assert models["target"] == str(g.target_dir(tmp_path / "cache", spec)) and models["meta"] == {}
    assert Path(models["eagle3_draft"]).name.startswith("golden-moe-eagle3-head-")
