"""The arms of the benchmark: each runs in a fresh engine with identical settings."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..engine_compat import rendezvous_port, server_arg_value


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    spec: bool
    threshold: int | None = None
    extra: dict = field(default_factory=dict)  # server args of its own (a variant's)
    base: str | None = None  # a variant's base arm (a variant of A2 also runs the transition)

    def runs_transition(self, arms=("A2",)) -> bool:
        """Whether this engine runs the transition workload: the arms named (A2 by default;
        A1 or A0 beside it is a control that never switches) and their variants."""
        return bool({self.name, self.base} & set(arms))


def arms(threshold: int, max_bs: int = 256) -> list[Arm]:
    """A3's threshold is the largest batch the sweep can form, so it never falls back: it
    measures what the patch costs while speculating (against A1). Other settings of the
    fallback are compared through variants (`variant`)."""
    return [
        Arm("A0", "no speculation", False),
        Arm("A1", "EAGLE-3 (chain, topk 1)", True),
        Arm("A2", f"patched, threshold {threshold}", True, threshold),
        Arm("A3", f"patched, threshold {max_bs} (never falls back)", True, max_bs),
        Arm("A4", "patched, threshold 0 (fallback always)", True, 0),
    ]


DEFAULT_ARMS = ("A0", "A1", "A2", "A3", "A4")


def variant(spec: str, base_arms: list[Arm], server_args: dict[str, str] | Callable[[], dict[str, str]]) -> Arm:
    """`NAME=BASE:FIELD=VALUE[;FIELD=VALUE...]`: arm BASE with ServerArgs fields of its own,
    written as on the command line, e.g. `A4M=A4:speculative_disable_kv_only_margin=8` or
    `A4D=A4:speculative_disable_draft_decode_min_bs=off`. `server_args` maps the fields of the
    SGLang under test to their types (engine_compat.server_arg_annotations), or reads them
    when the spec is otherwise well-formed; a ValueError says what is wrong with the spec."""
    name, sep, rest = spec.partition("=")
    base_name, sep2, assigns = rest.partition(":")
    name, base_name = name.strip(), base_name.strip()
    if not (sep and sep2 and name and assigns.strip()):
        raise ValueError("expected NAME=BASE:FIELD=VALUE[;FIELD=VALUE]")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"arm name {name!r}: use letters, digits, - and _")
    base = {a.name: a for a in base_arms}.get(base_name)
    if base is None:
        raise ValueError(f"base arm {base_name!r} is not one of {', '.join(a.name for a in base_arms)}")
    assignments = []
    for item in assigns.split(";"):
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{item!r} is not FIELD=VALUE")
        assignments.append((key.strip(), text.strip()))
    if callable(server_args):
        server_args = server_args()
    values = {}
    for key, text in assignments:
        if key not in server_args:
            close = difflib.get_close_matches(key, list(server_args), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"{key!r} is not a ServerArgs field of this SGLang{hint}; give the field's name, "
                "as in speculative_disable_kv_only_margin=8"
            )
        values[key] = server_arg_value(key, text, server_args[key])
    label = f"{base.label}, " + ", ".join(f"{k}={text}" for k, text in assignments)
    return Arm(name, label, base.spec, base.threshold, {**base.extra, **values}, base.name)


def engine_kwargs(
    arm: Arm, models: dict, *, max_bs: int, max_total_tokens: int, port: int, log_level: str = "warning", tp: int = 1
) -> dict:
    """The engine's settings: the same for every arm but speculation and the threshold. `tp`
    > 1 shards each engine over that many GPUs (tensor parallelism; all engines share them)."""
    kw = dict(
        model_path=models["target"],
        load_format="dummy",
        skip_tokenizer_init=True,
        attention_backend="triton",
        sampling_backend="pytorch",
        grammar_backend="none",
        cuda_graph_max_bs=max_bs,
        max_running_requests=max_bs,
        disable_piecewise_cuda_graph=True,
        mem_fraction_static=0.9,
        max_total_tokens=max_total_tokens,
        random_seed=0,
        port=port,
        nccl_port=rendezvous_port(port),  # fixed, not picked at start-up: see rendezvous_port
        enable_metrics=True,
        log_level=log_level,
        # Up to four engines share the machine and are measured one at a time. An idle
        # SGLang scheduler polls its sockets without blocking (0.5.12 scheduler.py,
        # event_loop_overlap; IdleSleeper only with sleep_on_idle), pinning a core each, next
        # to the measured engine's host-bound steps at low C. Sleeping on idle wakes on the
        # next request, the same for every arm.
        sleep_on_idle=True,
    )
    if tp > 1:
        kw["tp_size"] = tp
    if arm.spec:
        kw.update(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=models["draft"],
            speculative_draft_load_format="dummy",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
        )
    if arm.threshold is not None:
        kw["speculative_disable_batch_size_threshold"] = arm.threshold
    kw.update(arm.extra)
    return kw


# What SGLang drafts where the bench leaves a setting to it: its auto-chosen steps, top-k and
# draft tokens for a Llama-architecture target with all three unset (server_args.py,
# auto_choose_speculative_params), and the most steps of its DEFAULT_ADAPTIVE_CONFIG
# (0.5.14 on: --speculative-adaptive without a config file).
SGLANG_AUTO_SPEC = {"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
SGLANG_DEFAULT_ADAPTIVE_MAX_STEPS = 7


def _speculative_settings(arm: Arm) -> dict | None:
    """The arm's speculative server args as its engine gets them (engine_kwargs), a setting
    left to SGLang at SGLang's choice; None for an arm without speculation."""
    if not arm.spec:
        return None
    kw = engine_kwargs(arm, {"target": "", "draft": ""}, max_bs=1, max_total_tokens=1, port=0)
    return {**kw, **{k: auto for k, auto in SGLANG_AUTO_SPEC.items() if kw.get(k) is None}}


def _adaptive_max_steps(config) -> int:
    """The most draft steps SGLang's adaptive steps may pick: the largest candidate of the
    config file, whether one list (`candidate_steps`, as 0.5.12 reads it) or one per
    batch-size slot (keys of digits, 0.5.14 on; other keys are file-wide settings), else
    of SGLang's default config. A file that cannot be read counts as the default's."""
    if not config:
        return SGLANG_DEFAULT_ADAPTIVE_MAX_STEPS
    try:
        cfg = json.loads(Path(config).read_text())
        lists = [cfg.get("candidate_steps") or ()] + [
            slot.get("candidate_steps") or () for key, slot in cfg.items() if key.isdigit()
        ]
        steps = [int(s) for candidates in lists for s in candidates]
    except (OSError, ValueError, TypeError, AttributeError):
        return SGLANG_DEFAULT_ADAPTIVE_MAX_STEPS
    return max(steps, default=SGLANG_DEFAULT_ADAPTIVE_MAX_STEPS)


def _deepest_draft(kw: dict) -> int:
    """The most draft steps one decode step of an engine with these speculative settings can
    run: its step count, its tiers', SGLang's adaptive candidates."""
    return max(
        kw["speculative_num_steps"],
        *(kw.get("speculative_num_steps_tiers") or ()),
        _adaptive_max_steps(kw.get("speculative_adaptive_config")) if kw.get("speculative_adaptive") else 0,
    )


class StepTokens(NamedTuple):
    """What one decode step of an arm's engine can take of a request's context (step_tokens)."""

    per_step: int  # the most output tokens one step gives a request
    reserved: int  # the tokens SGLang counts against the context on top of prompt and output


def step_tokens(arm: Arm) -> StepTokens:
    """`per_step`: 1 without speculation; else its deepest draft, all accepted, plus the
    target's own token. A load that must last N steps is sized with this: at full acceptance
    a request finishes in that many times fewer steps than it has tokens. `reserved`: at
    least what SGLang counts on top of a request's prompt and output
    (TokenizerManager.num_reserved_tokens: EAGLE keeps a step's drafts in output slots),
    top-k times the steps, or the draft tokens, whichever is more, both at their largest over
    the releases: the deepest draft (0.5.14 on counts adaptive candidates as draft tokens)
    and, with top-k 1, its chain's steps + 1 (SGLang sets the draft tokens so); 0 without
    speculation. Both from one reading of the arm's settings (its adaptive config file
    included)."""
    kw = _speculative_settings(arm)
    if kw is None:
        return StepTokens(1, 0)
    depth = _deepest_draft(kw)
    reserved = max(kw["speculative_eagle_topk"] * depth, kw["speculative_num_draft_tokens"], depth + 1)
    return StepTokens(depth + 1, reserved)
