"""Golden models, built locally from a seed: a tiny Llama trained on a copy task.

Why trained: with random weights, speculative and plain decoding disagree on near ties
(the verify kernels differ from the decode kernels in the last bits). A model trained to
copy is confident (large top-1 margins), so equal tokens mean equal computation, and the
continuation needs attention over the whole context, so a corrupted KV cache (target or
draft) changes the output or the acceptance.

The checkpoint is written in Hugging Face Llama layout (config.json + model.safetensors),
so SGLang loads it as ``LlamaForCausalLM``. The EAGLE-3 engines draft with a head trained
for it (golden_eagle3.py), so their acceptance shows whether the draft cache was kept in
sync; the same checkpoint used as a STANDALONE draft gives high acceptance.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

VECTOR_ELEMS = 8  # bf16 values in one 16-byte vector of SGLang's elementwise kernels


@dataclass(frozen=True)
class ModelSpec:
    seed: int = 20261129
    vocab: int = 256
    hidden: int = 128
    layers: int = 8
    heads: int = 2
    intermediate: int = 344
    seq_len: int = 256
    min_segment: int = 8
    max_segment: int = 32
    steps: int = 2500
    batch: int = 32
    lr: float = 3e-3
    rope_theta: float = 10000.0
    eps: float = 1e-5
    init_std: float = 0.0  # 0: PyTorch's default init (learns the copy task much faster)
    warmup: int = 100

    def for_tp(self, tp_size: int) -> ModelSpec:
        """This spec, or the nearest one every rank of `tp_size` can hold: SGLang's fused
        activation kernel needs each rank's share of the MLP in whole 16-byte vectors (8 bf16
        values), and each rank whole attention heads. 344 splits for TP=1 only (172 per rank
        failed CUDA graph capture at TP=2 on the H200), so TP>1 trains a model of its own,
        with no golden file of its own: the run compares each engine with its baseline."""
        if tp_size < 1 or self.heads % tp_size:
            raise ValueError(f"the golden model has {self.heads} attention heads, which TP={tp_size} cannot split")
        unit = VECTOR_ELEMS * tp_size
        if self.intermediate % unit == 0:
            return self
        return replace(self, intermediate=-(-self.intermediate // unit) * unit)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def copy_sequence(rng: random.Random, spec: ModelSpec, length: int) -> list[int]:
    """A random segment (tokens 1..vocab-1) repeated to fill `length` tokens."""
    seg_len = rng.randint(spec.min_segment, spec.max_segment)
    seg = rng.sample(range(1, spec.vocab), seg_len)  # no repeats: every next token is unambiguous
    return (seg * (length // seg_len + 1))[:length]


def copy_prompt(rng: random.Random, spec: ModelSpec, *, segment: int | None = None, repeats: float = 2.5) -> list[int]:
    """A segment shown `repeats` times: greedy continuation must keep copying."""
    seg_len = segment or rng.randint(spec.min_segment, spec.max_segment)
    seg = rng.sample(range(1, spec.vocab), seg_len)
    n = max(seg_len + 1, int(seg_len * repeats))
    return (seg * (n // seg_len + 1))[:n]


def rms_norm(x, weight, eps: float):
    """Llama's RMSNorm, computed in fp32 (the golden target's and its EAGLE-3 head's)."""
    import torch

    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + eps)).type_as(x) * weight


def rope(x, pos, spec: ModelSpec):
    """Neox-style rotary embedding of x (..., positions, head_dim) at `pos`, as SGLang's Llama."""
    import torch

    hd = spec.hidden // spec.heads
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2, device=x.device).float() / hd))
    freqs = pos[..., None].float() * inv
    emb = torch.cat([freqs, freqs], -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()


def _model(spec: ModelSpec):
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return rms_norm(x, self.weight, spec.eps)

    hd = spec.hidden // spec.heads

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(spec.hidden)
            self.post_attention_layernorm = RMSNorm(spec.hidden)
            self.q_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.k_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.v_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.o_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
            self.gate_proj = nn.Linear(spec.hidden, spec.intermediate, bias=False)
            self.up_proj = nn.Linear(spec.hidden, spec.intermediate, bias=False)
            self.down_proj = nn.Linear(spec.intermediate, spec.hidden, bias=False)

        def forward(self, x, pos):
            b, t, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(b, t, spec.heads, hd).transpose(1, 2)
            k = self.k_proj(h).view(b, t, spec.heads, hd).transpose(1, 2)
            v = self.v_proj(h).view(b, t, spec.heads, hd).transpose(1, 2)
            q, k = rope(q, pos, spec), rope(k, pos, spec)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, spec.hidden))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
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

    return Llama()


def train(spec: ModelSpec, device: str = "cuda", steps: int | None = None, log=print, build=None):
    """Train the copy-task Llama (or the model `build(spec)` makes: the MoE target); returns
    (model, final loss, seconds)."""
    import torch

    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    model = (build or _model)(spec).to(device)
    if spec.init_std:
        for p in model.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=spec.init_std)
    steps = spec.steps if steps is None else steps
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, spec.warmup)) * 0.5 * (1 + math.cos(math.pi * s / max(1, steps)))
    )
    t0, loss_v = time.time(), float("nan")
    use_amp = device.startswith("cuda")
    for step in range(steps):
        batch = torch.tensor([copy_sequence(rng, spec, spec.seq_len + 1) for _ in range(spec.batch)], device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, spec.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_v = float(loss.detach())
        if log and (step % 250 == 0 or step == steps - 1):
            log(f"golden model: step {step}/{steps} loss {loss_v:.4f}")
    return model, loss_v, time.time() - t0


def config_json(spec: ModelSpec) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "max_position_embeddings": 4096,
        "rms_norm_eps": spec.eps,
        "rope_theta": spec.rope_theta,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 0,
    }


def load(folder: Path, spec: ModelSpec):
    """A saved target back in fp32 (the bf16 weights SGLang serves)."""
    from safetensors.torch import load_file

    model = _model(spec)
    names = target_names(spec)
    model.load_state_dict({names[k]: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()})
    return model


def eagle3_config_json(spec: ModelSpec) -> dict:
    cfg = config_json(spec)
    cfg.update({"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": spec.vocab})
    return cfg


def target_names(spec: ModelSpec) -> dict:
    """Hugging Face Llama's checkpoint name of each of the target's parameters -> its name in
    this module's state dict (save and load read the one table)."""
    names = {
        "model.embed_tokens.weight": "embed_tokens.weight",
        "model.norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[p + f"self_attn.{name}.weight"] = f"layers.{i}.{name}.weight"
        for name in ("gate_proj", "up_proj", "down_proj"):
            names[p + f"mlp.{name}.weight"] = f"layers.{i}.{name}.weight"
        for name in ("input_layernorm", "post_attention_layernorm"):
            names[p + f"{name}.weight"] = f"layers.{i}.{name}.weight"
    return names


def save(model, spec: ModelSpec, out: Path, extra: dict | None = None) -> None:
    """Hugging Face layout: config.json + model.safetensors (bf16)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    own = model.state_dict()
    save_file(
        {k: own[v].detach().to(torch.bfloat16).contiguous().cpu() for k, v in target_names(spec).items()},
        str(out / "model.safetensors"),
    )
    (out / "config.json").write_text(json.dumps(config_json(spec), indent=2))
    (out / "spectool-model.json").write_text(
        json.dumps({"spec": asdict(spec), "key": spec.key(), **(extra or {})}, indent=2)
    )


def write_eagle3_draft(spec: ModelSpec, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(eagle3_config_json(spec), indent=2))
    return out
