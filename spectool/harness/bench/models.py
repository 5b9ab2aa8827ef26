"""An 8B-shaped Llama target and an EAGLE-3 draft config, with dummy weights (no downloads)."""

from __future__ import annotations

import json
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


def write_models(root: Path) -> dict:
    target, draft = Path(root) / "llama-8b-shape", Path(root) / "eagle3-8b-shape"
    for d, cfg in ((target, LLAMA_8B), (draft, EAGLE3_8B)):
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return {"target": str(target), "draft": str(draft)}
