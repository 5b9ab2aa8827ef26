"""The arms of the benchmark: each runs in a fresh engine with identical settings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    spec: bool
    threshold: int | None = None
    extra: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # for the engine process (recipe switches)


def arms(threshold: int, max_bs: int = 256) -> list[Arm]:
    """A3's threshold is the largest batch the sweep can form, so it never falls back: it
    measures what the patch costs while speculating (against A1). A4L, not run by default, is
    A4 with the scheduler's next-step planning held until the target forward ends (the spec
    path's order): against A4 it measures what planning during the step gains."""
    return [
        Arm("A0", "no speculation", False),
        Arm("A1", "EAGLE-3 (chain, topk 1)", True),
        Arm("A2", f"patched, threshold {threshold}", True, threshold),
        Arm("A3", f"patched, threshold {max_bs} (never falls back)", True, max_bs),
        Arm("A4", "patched, threshold 0 (fallback always)", True, 0),
        Arm("A4L", "patched, threshold 0, late plan (SPECTOOL_FALLBACK_EARLY_PLAN=0)", True, 0,
            env={"SPECTOOL_FALLBACK_EARLY_PLAN": "0"}),
    ]


DEFAULT_ARMS = ("A0", "A1", "A2", "A3", "A4")


def engine_kwargs(arm: Arm, models: dict, *, max_bs: int, max_total_tokens: int, port: int) -> dict:
    kw = dict(
        model_path=models["target"], load_format="dummy", skip_tokenizer_init=True,
        attention_backend="triton", sampling_backend="pytorch", grammar_backend="none",
        cuda_graph_max_bs=max_bs, max_running_requests=max_bs, disable_piecewise_cuda_graph=True,
        mem_fraction_static=0.9, max_total_tokens=max_total_tokens, random_seed=0, port=port,
        enable_metrics=True, log_level="warning",
    )
    if arm.spec:
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=models["draft"],
                  speculative_draft_load_format="dummy", speculative_num_steps=3,
                  speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    if arm.threshold is not None:
        kw["speculative_disable_batch_size_threshold"] = arm.threshold
    kw.update(arm.extra)
    return kw
