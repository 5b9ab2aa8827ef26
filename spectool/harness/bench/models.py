"""The benchmark's targets and their EAGLE-3 heads as configs, loaded with dummy weights (no
downloads): an 8B-shaped Llama and a Qwen3-30B-A3B-shaped MoE."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

# The shape of public EAGLE-3 heads for Llama-3.1-8B: one layer, a 32k draft vocabulary.
EAGLE3_8B = {**LLAMA_8B, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": 32000}


# An MoE target of the kind production runs (Qwen3-30B-A3B: 48 layers, 128 experts of which 8
# per token), 61 GB of bf16 weights: one engine per H200 at a time.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# Its EAGLE-3 head: one Llama layer over the target's width, a 32k draft vocabulary.
EAGLE3_QWEN3_30B_A3B = {
    **{k: QWEN3_30B_A3B[k] for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads")},
    **{k: QWEN3_30B_A3B[k] for k in ("head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta")},
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "intermediate_size": 6144,
    "num_hidden_layers": 1,
    "draft_vocab_size": 32000,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Target:
    """A benchmark target: its config and its EAGLE-3 head's (dummy weights), and how many of
    its engines fit one H200 at once."""

    name: str
    title: str
    target: dict
    draft: dict
    max_engines: int


# Engines of the 8B shape (bf16, KV for 256 x 272 tokens, graphs) take about 28 GiB each: five
# do not fit one H200 (the fifth ran out of memory while capturing its graphs, and a fallback
# without its graphs would be measured eagerly). One of the MoE shape takes about 70 GiB.
TARGETS = {
    t.name: t
    for t in (
        Target("llama-8b", "Llama-3.1-8B shape", LLAMA_8B, EAGLE3_8B, 4),
        Target("qwen3-30b-a3b", "Qwen3-30B-A3B shape", QWEN3_30B_A3B, EAGLE3_QWEN3_30B_A3B, 1),
    )
}
DEFAULT_TARGET = "llama-8b"


def write_models(root: Path, target: str = DEFAULT_TARGET) -> dict:
    """The target's and its head's config.json under `root` (loaded with dummy weights)."""
    t = TARGETS[target]
    paths = {"target": Path(root) / f"{t.name}-shape", "draft": Path(root) / f"eagle3-{t.name}-shape"}
    for key, cfg in (("target", t.target), ("draft", t.draft)):
        paths[key].mkdir(parents=True, exist_ok=True)
        (paths[key] / "config.json").write_text(json.dumps(cfg, indent=2))
    return {k: str(v) for k, v in paths.items()}
