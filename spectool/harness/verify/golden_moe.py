"""The golden MoE target: a tiny Qwen3-MoE trained on the golden copy task, with its own
EAGLE-3 head.

Why a second architecture: production targets of the fallback are MoE models, whose decode
and verify run other kernels (the router's top-k, the fused experts) and whose SGLang class
captures the EAGLE-3 features through its own layer communicator. Trained on the copy task
like the dense target, its top-1 margins are large, so plain and speculative decoding must
give equal tokens, and its head drafts well enough that a stale draft cache shows.

The checkpoint is written in Hugging Face Qwen3-MoE layout (config.json + model.safetensors),
so SGLang 0.5.12 loads it as ``Qwen3MoeForCausalLM``: per-head q/k RMSNorm before the rotary
embedding, every layer sparse (softmax router, top-k renormalised: ``norm_topk_prob``, SiLU
experts), no shared expert. Its EAGLE-3 head is the dense one's (golden_eagle3.py), trained
on this target's features at the layers Qwen3-MoE captures (the same default: 2, L/2, L-3).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .golden_model import ModelSpec, rms_norm, rope
from .golden_model import train as train_copy_task


@dataclass(frozen=True)
class MoeSpec(ModelSpec):
    """The dense spec's fields (the head reads hidden, heads, intermediate, vocab) plus the
    experts. 7 layers keep the three captured layers distinct (2, 3, 4) and the bf16
    checkpoint under 2.5 MB."""

    seed: int = 20261201
    layers: int = 7
    experts: int = 4
    top_k: int = 2
    moe_intermediate: int = 64


def _model(spec: MoeSpec):
    import torch
    from torch import nn

    hd = spec.hidden // spec.heads

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return rms_norm(x, self.weight, spec.eps)

    class Experts(nn.Module):
        """Every expert's gate, up and down projections, stacked (computed densely: the
        model is tiny, and the routing weights are zero outside each token's top k)."""

        def __init__(self):
            super().__init__()
            lin = [nn.Linear(spec.hidden, spec.moe_intermediate, bias=False) for _ in range(2 * spec.experts)]
            down = [nn.Linear(spec.moe_intermediate, spec.hidden, bias=False) for _ in range(spec.experts)]
            self.gate_proj = nn.Parameter(torch.stack([m.weight.data for m in lin[: spec.experts]]))
            self.up_proj = nn.Parameter(torch.stack([m.weight.data for m in lin[spec.experts :]]))
            self.down_proj = nn.Parameter(torch.stack([m.weight.data for m in down]))

        def forward(self, h, weights):
            g = torch.einsum("bth,eih->btei", h, self.gate_proj)
            u = torch.einsum("bth,eih->btei", h, self.up_proj)
            out = torch.einsum("btei,ehi->bteh", torch.nn.functional.silu(g) * u, self.down_proj)
            return (out * weights.unsqueeze(-1).to(out.dtype)).sum(-2)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(spec.hidden)
            self.post_attention_layernorm = RMSNorm(spec.hidden)
            self.q_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.k_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.v_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.o_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.q_norm = RMSNorm(hd)
            self.k_norm = RMSNorm(hd)
            self.gate = nn.Linear(spec.hidden, spec.experts, bias=False)
            self.experts = Experts()

        def forward(self, x, pos):
            b, t, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_norm(self.q_proj(h).view(b, t, spec.heads, hd)).transpose(1, 2)
            k = self.k_norm(self.k_proj(h).view(b, t, spec.heads, hd)).transpose(1, 2)
            v = self.v_proj(h).view(b, t, spec.heads, hd).transpose(1, 2)
            q, k = rope(q, pos, spec), rope(k, pos, spec)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, spec.hidden))
            h = self.post_attention_layernorm(x)
            return x + self.experts(h, route(self.gate(h), spec))

    class Qwen3Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
            self.layers = nn.ModuleList([Layer() for _ in range(spec.layers)])
            self.norm = RMSNorm(spec.hidden)
            self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x, pos)
            return self.lm_head(self.norm(x))

    return Qwen3Moe()


def route(router_logits, spec: MoeSpec):
    """Each token's expert weights (..., experts): softmax over the router's logits in fp32,
    the top k kept and renormalised to sum 1 (SGLang's TopK with ``renormalize``), the rest 0."""
    import torch

    probs = torch.softmax(router_logits.float(), -1)
    top, idx = probs.topk(spec.top_k, -1)
    top = top / top.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, idx, top)


def config_json(spec: MoeSpec) -> dict:
    """Hugging Face Qwen3-MoE config: every field Qwen3MoeForCausalLM reads, set explicitly."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,  # read only by dense layers; every layer is sparse
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "head_dim": spec.hidden // spec.heads,
        "num_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": 4096,
        "rms_norm_eps": spec.eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "output_router_logits": False,
        "bos_token_id": 1,
        "eos_token_id": 0,
    }


def checkpoint_names(spec: MoeSpec) -> dict:
    """Hugging Face Qwen3-MoE's checkpoint name of each saved tensor -> (its parameter in this
    module's state dict, the expert it is a slice of or None). SGLang's load_weights stacks
    q/k/v into qkv_proj and each expert's gate/up/down into the fused w13/w2 itself."""
    names = {
        "model.embed_tokens.weight": ("embed_tokens.weight", None),
        "model.norm.weight": ("norm.weight", None),
        "lm_head.weight": ("lm_head.weight", None),
    }
    for i in range(spec.layers):
        p, own = f"model.layers.{i}.", f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            names[p + f"self_attn.{name}.weight"] = (own + f"{name}.weight", None)
        for name in ("input_layernorm", "post_attention_layernorm"):
            names[p + f"{name}.weight"] = (own + f"{name}.weight", None)
        names[p + "mlp.gate.weight"] = (own + "gate.weight", None)
        for e in range(spec.experts):
            for name in ("gate_proj", "up_proj", "down_proj"):
                names[p + f"mlp.experts.{e}.{name}.weight"] = (own + f"experts.{name}", e)
    return names


def state_dict_for_sglang(model, spec: MoeSpec) -> dict:
    """The checkpoint's tensors (bf16) by their Hugging Face names."""
    import torch

    own = model.state_dict()
    return {
        k: (own[name] if e is None else own[name][e]).detach().to(torch.bfloat16).contiguous().cpu()
        for k, (name, e) in checkpoint_names(spec).items()
    }


def save(model, spec: MoeSpec, out: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state_dict_for_sglang(model, spec), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config_json(spec), indent=2))
    meta = {"spec": asdict(spec), "key": spec.key(), "weights_sha": weights_sha(out), **(extra or {})}
    (out / "spectool-model.json").write_text(json.dumps(meta, indent=2))


def weights_sha(folder: Path) -> str:
    """The saved weights' identity: a model trained on a GPU differs from run to run in the
    last bits, so its golden tokens are keyed by this, not by the spec."""
    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()[:16]


def load(folder: Path, spec: MoeSpec):
    """A saved target back in fp32 (the bf16 weights SGLang serves)."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(Path(folder) / "model.safetensors"))
    model = _model(spec)
    state, experts = {}, {}
    for k, (name, e) in checkpoint_names(spec).items():
        if e is None:
            state[name] = saved[k].float()
        else:
            experts.setdefault(name, {})[e] = saved[k].float()
    for name, by_expert in experts.items():
        state[name] = torch.stack([by_expert[e] for e in range(spec.experts)])
    model.load_state_dict(state)
    return model


def target_dir(cache: Path, spec: MoeSpec) -> Path:
    return Path(cache) / f"golden-moe-target-{spec.key()}"


def head_dir(cache: Path, spec: MoeSpec) -> Path:
    from .golden_eagle3 import HeadSpec

    return Path(cache) / f"golden-moe-eagle3-head-{HeadSpec().key(spec)}"


def paths(cache: Path, spec: MoeSpec = MoeSpec()) -> dict:  # noqa: B008 - frozen
    """Where the MoE target and its head are (or will be, once trained)."""
    return {"target": str(target_dir(cache, spec)), "eagle3_draft": str(head_dir(cache, spec))}


def trained(cache: Path, spec: MoeSpec = MoeSpec()) -> bool:  # noqa: B008 - frozen
    return all((Path(p) / "model.safetensors").exists() for p in paths(cache, spec).values())


def ensure_models(cache: Path, spec: MoeSpec = MoeSpec(), device: str = "cuda", log=print) -> dict:  # noqa: B008
    """The MoE target and its EAGLE-3 head, each trained once and cached by its key; the
    meta carries the target's weights hash (its golden tokens' key)."""
    from .golden_eagle3 import HeadSpec, ensure_head

    target = target_dir(cache, spec)
    if not (target / "model.safetensors").exists():
        model, loss, secs = train_copy_task(spec, device, log=log, build=_model)
        save(model, spec, target, {"final_loss": loss, "train_seconds": round(secs, 1)})
    ensure_head(cache, spec, HeadSpec(), device=device, log=log, target=load(target, spec), out=head_dir(cache, spec))
    meta = json.loads((target / "spectool-model.json").read_text())
    return {**paths(cache, spec), "meta": meta}


def main(job_path: str, out_path: str) -> int:
    """Train both on the GPU as a job of the verify runner, next to the engines that need
    neither: the job names the cache folder; the result says where they are."""
    job = json.loads(Path(job_path).read_text())
    result = {"config": job["config"]["name"], "ok": False}
    try:
        lines = []
        spec = MoeSpec(**job["spec"])
        models = ensure_models(Path(job["cache"]), spec, log=lambda s: (lines.append(s), print(s, flush=True)))
        result.update(ok=True, models=models, log=lines)
    except Exception as exc:  # the runner reports it, with this process's log tail
        result["error"] = f"training the MoE golden models failed: {exc!r}"
        raise
    finally:
        Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
