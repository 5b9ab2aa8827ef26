"""A trained EAGLE-3 head for the golden model, so that EAGLE-3's acceptance means something.

Why: with a random head (``speculative_draft_load_format="dummy"``) EAGLE-3 accepts about 1.0
token per step whatever its draft KV cache holds, so a golden run cannot tell a draft cache
kept in sync by the fallback from a stale one: the target's verify keeps the tokens right
either way. A head trained on the copy task drafts the continuation from its own KV cache
(keys from the target's features at earlier positions, values from the token that followed
them), so a stale or missing draft K/V shows as lower acceptance after a switch.

The head is SGLang 0.5.12's ``LlamaForCausalLMEagle3`` (``models/llama_eagle3.py``) written
out in plain torch: the target's residual stream before layers 2, L/2 and L-3 (its
``set_eagle3_layers_to_capture`` default) concatenated and projected by ``fc``; one decoder
layer whose attention reads ``cat(input_layernorm(embed), hidden_norm(h))``; the embedding
is the target's (SGLang's ``set_embed``), the lm_head the head's own (``draft_vocab_size``).
Training follows EAGLE-3's training-time test: step 1 drafts from the target's features,
steps 2 and 3 from the head's own pre-norm output, each attending to the steps before it in
its chain the way SGLang's draft decode does.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .golden_model import ModelSpec, copy_sequence, eagle3_config_json, load, rms_norm, rope, save, train


@dataclass(frozen=True)
class HeadSpec:
    seed: int = 20261130
    chain: int = 3  # draft steps trained (the golden engines draft 3: num_steps)
    steps: int = 1500
    batch: int = 16
    seq_len: int = 192
    lr: float = 3e-3
    warmup: int = 50

    def key(self, target: ModelSpec) -> str:
        return hashlib.sha256(json.dumps([asdict(self), target.key()]).encode()).hexdigest()[:12]


def capture_layers(spec: ModelSpec) -> list[int]:
    """SGLang 0.5.12 Llama's default EAGLE-3 capture: the residual stream entering these layers."""
    return [2, spec.layers // 2, spec.layers - 3]


def target_features(target, ids, spec: ModelSpec):
    """The golden target's EAGLE-3 features (b, t, 3*hidden) for `ids`."""
    import torch

    pos = torch.arange(ids.shape[1], device=ids.device)
    x = target.embed_tokens(ids)
    aux = []
    for i, layer in enumerate(target.layers):
        if i in capture_layers(spec):
            aux.append(x)
        x = layer(x, pos)
    return torch.cat(aux, -1)


def _head(spec: ModelSpec):
    import torch
    from torch import nn

    hd = spec.hidden // spec.heads

    def rms(x, w):
        return rms_norm(x, w, spec.eps)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            H, I = spec.hidden, spec.intermediate  # noqa: E741 - the paper's names
            self.fc = nn.Linear(3 * H, H, bias=False)
            self.hidden_norm = nn.Parameter(torch.ones(H))
            self.input_layernorm = nn.Parameter(torch.ones(H))
            self.post_attention_layernorm = nn.Parameter(torch.ones(H))
            self.norm = nn.Parameter(torch.ones(H))
            self.q_proj = nn.Linear(2 * H, H, bias=False)
            self.k_proj = nn.Linear(2 * H, H, bias=False)
            self.v_proj = nn.Linear(2 * H, H, bias=False)
            self.o_proj = nn.Linear(H, H, bias=False)
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)
            self.lm_head = nn.Linear(H, spec.vocab, bias=False)

        def qkv(self, embeds, h, pos):
            """The layer's input and its (q, k, v) at positions `pos`; h is the residual."""
            b, t, _ = h.shape
            x = torch.cat([rms(embeds, self.input_layernorm), rms(h, self.hidden_norm)], -1)
            q, k, v = (p(x).view(b, t, spec.heads, hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
            return rope(q, pos, spec), rope(k, pos, spec), v

        def finish(self, attn, residual):
            """o_proj, the fused add-norms and the MLP: (logits, pre-norm output for the next step)."""
            b, _, t, _ = attn.shape
            residual = residual + self.o_proj(attn.transpose(1, 2).reshape(b, t, spec.hidden))
            hmid = rms(residual, self.post_attention_layernorm)
            out = residual + self.down_proj(torch.nn.functional.silu(self.gate_proj(hmid)) * self.up_proj(hmid))
            return self.lm_head(rms(out, self.norm)), out

        def chain(self, embed, feats, ids, steps):
            """Logits of every draft step at every position: step s at position i drafts token
            i+s+1 from the target's features at i (step 1) or the previous step's output, and
            attends to positions <= i of step 1 plus its own chain's earlier steps at i."""
            t = feats.shape[1]
            pos = torch.arange(t, device=ids.device)
            h = self.fc(feats)
            causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
            keys, vals, out_logits = [], [], []
            for s in range(steps):
                q, k, v = self.qkv(embed(ids[:, s + 1 : s + 1 + t]), h, pos + s)
                keys.append(k)
                vals.append(v)
                scale = 1.0 / math.sqrt(hd)
                scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
                scores += [((q * kk).sum(-1, keepdim=True) * scale) for kk in keys[1:]]
                w = torch.softmax(torch.cat(scores, -1), -1)
                attn = w[..., :t] @ vals[0]
                for j, vv in enumerate(vals[1:]):
                    attn = attn + w[..., t + j : t + j + 1] * vv
                logits, h = self.finish(attn, h)
                out_logits.append(logits)
            return out_logits

    return Head()


def chain_targets(ids, steps: int, t: int):
    """What step s at position i must draft: the token i+s+2 of the sequence."""
    return [ids[:, s + 2 : s + 2 + t] for s in range(steps)]


def train_head(target, spec: ModelSpec, head_spec: HeadSpec = HeadSpec(), device: str = "cpu", log=print):
    """Train the head on the frozen target's features; returns (head, per-step accuracy, seconds)."""
    import torch

    torch.manual_seed(head_spec.seed)
    rng = random.Random(head_spec.seed)
    target = target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    head = _head(spec).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=head_spec.lr, weight_decay=0.0)
    n = head_spec.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / head_spec.warmup) * 0.5 * (1 + math.cos(math.pi * s / n))
    )
    t0, acc = time.time(), []
    L, K = head_spec.seq_len, head_spec.chain
    for step in range(n):
        ids = torch.tensor([copy_sequence(rng, spec, L + K + 1) for _ in range(head_spec.batch)], device=device)
        t = L - 1
        with torch.no_grad():
            feats = target_features(target, ids[:, :L], spec)
        logits = head.chain(target.embed_tokens, feats[:, :t], ids, K)
        goals = chain_targets(ids, K, t)
        loss = (
            sum(
                torch.nn.functional.cross_entropy(lg.reshape(-1, spec.vocab), g.reshape(-1))
                for lg, g in zip(logits, goals)
            )
            / K
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        if step == n - 1 or (log and step % 100 == 0):  # the last step's always: it is saved with the head
            acc = [float((lg.argmax(-1) == g).float().mean()) for lg, g in zip(logits, goals)]
        if log and (step % 100 == 0 or step == n - 1):
            log(
                f"golden EAGLE-3 head: step {step}/{n} loss {float(loss.detach()):.4f} accuracy per draft step {[round(a, 3) for a in acc]}"
            )
    return head, acc, time.time() - t0


def sglang_names() -> dict:
    """SGLang's checkpoint name of each of the head's parameters (``LlamaForCausalLMEagle3.
    load_weights`` stacks q/k/v and gate/up itself) -> the name in this module's state dict."""
    p = "model.layers.0."
    names = {
        "model.fc.weight": "fc.weight",
        "model.norm.weight": "norm",
        "lm_head.weight": "lm_head.weight",
        p + "hidden_norm.weight": "hidden_norm",
        p + "input_layernorm.weight": "input_layernorm",
        p + "post_attention_layernorm.weight": "post_attention_layernorm",
    }
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        names[p + f"self_attn.{name}.weight"] = f"{name}.weight"
    for name in ("gate_proj", "up_proj", "down_proj"):
        names[p + f"mlp.{name}.weight"] = f"{name}.weight"
    return names


def save_head(head, spec: ModelSpec, out: Path, extra: dict | None = None) -> None:
    """The head in the layout SGLang loads (bf16), with the golden EAGLE-3 config."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    own = head.state_dict()
    save_file(
        {k: own[v].detach().to(torch.bfloat16).contiguous().cpu() for k, v in sglang_names().items()},
        str(out / "model.safetensors"),
    )
    (out / "config.json").write_text(json.dumps(eagle3_config_json(spec), indent=2))
    (out / "spectool-model.json").write_text(json.dumps(extra or {}, indent=2))


def greedy(target, prompt: list[int], new_tokens: int) -> list[int]:
    """The target's greedy continuation (what every golden engine must produce)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(target(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def chain_acceptance(
    target, head, prompt: list[int], new_tokens: int, spec: ModelSpec, steps: int = 3, unsynced: range | None = None
) -> float:
    """Mean tokens accepted per verify step (bonus included) when the head drafts `steps`
    tokens a step for this prompt, as SGLang's chain drafting would on the greedy output.
    `unsynced`: positions whose draft K/V were written from zeros (a draft cache the
    fallback did not keep in sync), to show what the golden tests would see."""
    import torch

    seq = list(prompt) + greedy(target, prompt, new_tokens + steps + 1)
    ids = torch.tensor([seq])
    with torch.no_grad():
        feats = target_features(target, ids, spec)
        t = len(seq) - steps - 1
        feats = feats[:, :t].clone()
        if unsynced is not None:
            feats[:, unsynced.start : unsynced.stop] = 0
        drafts = [lg.argmax(-1)[0] for lg in head.chain(target.embed_tokens, feats, ids, steps)]
    p, end, accepted = len(prompt) - 1, len(prompt) - 1 + new_tokens, []
    while p < end:  # at p the target has just produced token p+1; the head drafts p+2..
        n = 1
        while n <= steps and int(drafts[n - 1][p]) == seq[p + n + 1]:
            n += 1
        accepted.append(n)
        p += n
    return sum(accepted) / len(accepted)


def load_head(folder: Path, spec: ModelSpec):
    """A saved head back in fp32 (the bf16 weights SGLang serves)."""
    from safetensors.torch import load_file

    head = _head(spec)
    names = sglang_names()
    head.load_state_dict({names[k]: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()})
    return head


def ensure_head(
    cache: Path,
    spec: ModelSpec = ModelSpec(),  # noqa: B008 - frozen
    head_spec: HeadSpec = HeadSpec(),
    device: str = "cpu",
    log=print,
    target=None,
    out: Path | None = None,
) -> Path:
    """The trained head of the cached target `spec`, trained once and cached by its key
    (`target`, `out`: another architecture's loaded target and the head's folder)."""
    out = Path(out) if out is not None else Path(cache) / f"golden-eagle3-head-{head_spec.key(spec)}"
    if not (out / "model.safetensors").exists():
        if target is None:
            target = load(Path(cache) / f"golden-target-{spec.key()}", spec)
        head, acc, secs = train_head(target, spec, head_spec, device, log)
        save_head(
            head,
            spec,
            out,
            {
                "target": spec.key(),
                "head_spec": asdict(head_spec),
                "key": head_spec.key(spec),
                "final_accuracy_per_step": acc,
                "train_seconds": round(secs, 1),
            },
        )
    return out


def ensure_models(cache: Path, spec: ModelSpec = ModelSpec(), device: str = "cuda", log=print) -> dict:  # noqa: B008
    """The dense golden target (golden_model.py) and its trained EAGLE-3 head, each trained
    once per spec and cached by its key (the committed ones in golden/models are used as
    they are)."""
    target = cache / f"golden-target-{spec.key()}"
    if not (target / "model.safetensors").exists():
        model, loss, secs = train(spec, device, log=log)
        save(model, spec, target, {"final_loss": loss, "train_seconds": round(secs, 1)})
    draft = ensure_head(cache, spec, device=device, log=log)
    meta = json.loads((target / "spectool-model.json").read_text())
    return {"target": str(target), "eagle3_draft": str(draft), "meta": meta}
