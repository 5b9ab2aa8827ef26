"""Comparison and counter logic of the golden tests, on recorded data (CPU-testable)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

GOLDEN_SCHEMA = 1


def stats_window(before: dict, after: dict) -> dict:
    """Counter deltas and the phases that ran between two snapshots of the stats file."""
    keys = (
        "fallback_steps",
        "spec_steps",
        "switches_to_fallback",
        "switches_to_spec",
        "fallback_requests",
        "draft_kv_only_steps",
        "draft_kv_only_graph_steps",
        "draft_kv_only_prefills",
        "tier_switches",
    )
    delta = {k: (after.get(k) or 0) - (before.get(k) or 0) for k in keys}
    prev = {p["id"]: p for p in before.get("phases", [])}
    phases = []
    for p in after.get("phases", []):
        q = prev.get(p["id"])
        if q is not None:
            p = {**p, **{k: p[k] - q[k] for k in ("steps", "reqs", "correct_drafts")}}
        if p["steps"] > 0 or p["reqs"] > 0:
            phases.append(p)
    delta["phases"] = phases
    return delta


def acceptance(phases: list[dict]) -> float | None:
    """Mean accepted tokens per speculative verify step per request (bonus included)."""
    reqs = sum(p["reqs"] for p in phases if p["mode"] == "spec")
    drafts = sum(p["correct_drafts"] for p in phases if p["mode"] == "spec")
    return None if reqs == 0 else 1.0 + drafts / reqs


def transitions(phases: list[dict]) -> dict:
    fallbacks = [i for i, p in enumerate(phases) if p["mode"] == "fallback" and p["steps"] > 0]
    first_fb = fallbacks[0] if fallbacks else None
    last_fb = fallbacks[-1] if fallbacks else None
    spec_before = [p for p in phases[:first_fb] if p["mode"] == "spec"] if first_fb is not None else []
    spec_after = [p for p in phases[last_fb + 1 :] if p["mode"] == "spec"] if last_fb is not None else []
    return {
        "spec_after_fallback": bool(spec_after) and sum(p["steps"] for p in spec_after) > 0,
        "fallback_after_spec": bool(spec_before) and sum(p["steps"] for p in spec_before) > 0,
        "acceptance_before": acceptance(spec_before),
        "acceptance_after": acceptance(spec_after),
    }


def counted_steps(window: dict) -> int:
    """Decode steps the engine's counters saw in the window, in either mode."""
    return window.get("fallback_steps", 0) + window.get("spec_steps", 0)


def tier_walk(phases: list[dict]) -> list[int]:
    """The draft length of each decode phase in order (0: the fallback's plain decode), one
    entry per change: the tiers of --speculative-num-steps-tiers a workload walked through."""
    walk = []
    for p in phases:
        if p["steps"] > 0:
            steps = 0 if p["mode"] == "fallback" else p.get("draft_steps")
            if not walk or walk[-1] != steps:
                walk.append(steps)
    return walk


def tier_crossings(walk: list[int], tiers: list[int]) -> list[str]:
    """The tier boundaries `walk` did not cross in both directions, as text ("3|1 up"); a
    boundary lies between neighbouring tiers of `tiers` (draft steps from the smallest
    batches up, each step count once, as the walk names a tier by its step count)."""
    order = {steps: i for i, steps in enumerate(tiers)}
    index = [order.get(steps) for steps in walk]
    seen = set()
    for a, b in zip(index, index[1:]):
        if a is None or b is None:
            continue
        for boundary in range(min(a, b), max(a, b)):
            seen.add((boundary, "up" if b > a else "down"))
    return [
        f"{tiers[i]}|{tiers[i + 1]} {way}"
        for i in range(len(tiers) - 1)
        for way in ("up", "down")
        if (i, way) not in seen
    ]


def tier_acceptance(phases: list[dict]) -> dict[tuple[int, int], float]:
    """(draft steps before, draft steps) -> acceptance of the phases of that tier entered from
    that one (0: the fallback; the first phase of a window, entered before it, is left out):
    what each kind of switch leaves of the draft KV cache. A head that drafts the copy task
    whole accepts steps + 1 per step."""
    groups = {}
    live = [p for p in phases if p["steps"] > 0 or p["reqs"] > 0]
    for prev, p in zip(live, live[1:]):
        steps, before = p.get("draft_steps"), prev.get("draft_steps")
        if p["mode"] == "spec" and steps and steps != before:
            groups.setdefault((before, steps), []).append(p)
    measured = {key: acceptance(group) for key, group in sorted(groups.items())}
    return {key: acc for key, acc in measured.items() if acc is not None}


def check_expectations(expect: dict, window: dict) -> list[str]:
    """What the scenario claims to test, checked against the counters."""
    fails = []
    fb, sp = window.get("fallback_steps", 0), window.get("spec_steps", 0)
    counted, steps = expect.get("counted", True), counted_steps(window)
    if counted is True and steps == 0:
        fails.append("the engine counted no decode step (no stats file?), so its step claims cannot be checked")
    if counted is False and steps:
        fails.append(f"expected the fallback's decision never to run (no flag), but it counted {steps} steps")
    want = expect.get("fallback_steps", "any")
    if want == "zero" and fb != 0:
        fails.append(f"expected no fallback steps, got {fb}")
    if want == "positive" and fb <= 0:
        fails.append("expected fallback steps, got none")
    if want == "all" and (fb <= 0 or sp != 0):
        fails.append(f"expected only fallback steps, got {fb} fallback and {sp} speculative")
    kv_only, want_kv = window.get("draft_kv_only_steps", 0), expect.get("kv_only", "any")
    if want_kv in ("positive", "graph") and kv_only <= 0:
        fails.append("expected fallback steps with the KV-only draft sync, got none")
    if want_kv == "zero" and kv_only != 0:
        fails.append(f"expected no KV-only draft sync (batch within the margin), got {kv_only} steps")
    graphed = window.get("draft_kv_only_graph_steps", 0)
    if want_kv == "graph" and kv_only > 0 and graphed != kv_only:
        fails.append(f"expected every KV-only draft sync replayed from its CUDA graph, got {graphed} of {kv_only}")
    prefills, want_pre = window.get("draft_kv_only_prefills", 0), expect.get("kv_only_prefill", "any")
    if want_pre == "positive" and prefills <= 0:
        fails.append("expected prefills on the KV-only draft path, got none")
    tr = transitions(window.get("phases", []))
    if expect.get("spec_after_fallback") and not tr["spec_after_fallback"]:
        fails.append("expected speculative steps after a fallback phase, saw none")
    if expect.get("fallback_after_spec") and not tr["fallback_after_spec"]:
        fails.append("expected a fallback phase after speculative steps, saw none")
    acc = acceptance(window.get("phases", []))
    if expect.get("min_acceptance") is not None and (acc is None or acc < expect["min_acceptance"]):
        fails.append(f"expected mean acceptance >= {expect['min_acceptance']}, got {acc}")
    floor = expect.get("min_acceptance_after")
    if floor is not None and (tr["acceptance_after"] is None or tr["acceptance_after"] < floor):
        got = "none measured" if tr["acceptance_after"] is None else f"{tr['acceptance_after']:.2f}"
        fails.append(f"expected acceptance >= {floor} after speculation resumed, got {got}: stale draft KV?")
    tiers = expect.get("tiers")
    if tiers:
        walk = tier_walk(window.get("phases", []))
        missed = tier_crossings(walk, list(tiers))
        if missed:
            fails.append(
                f"expected every tier boundary of {','.join(map(str, tiers))} crossed both ways, missed "
                f"{', '.join(missed)} (draft steps per phase: {walk})"
            )
    ratio = expect.get("min_tier_acceptance")
    if ratio is not None:
        # Every positive tier the claim names (else every one the workload entered).
        entered = tier_acceptance(window.get("phases", []))
        positive = [s for s in tiers if s > 0] if tiers else sorted({to for _, to in entered}, reverse=True)
        if not positive:
            fails.append("expected speculative tiers entered after a switch, none measured")
        for steps in positive:
            floor = ratio * (steps + 1)
            kinds = {before: acc_t for (before, to), acc_t in entered.items() if to == steps}
            if not kinds:
                fails.append(
                    f"expected acceptance >= {floor:.2f} in the {steps}-step tier after a switch "
                    f"({ratio:g} of {steps + 1}), none measured"
                )
            for before, acc_t in kinds.items():
                if acc_t < floor:
                    fails.append(
                        f"expected acceptance >= {floor:.2f} in the {steps}-step tier entered from {before} "
                        f"draft steps ({ratio:g} of {steps + 1}), got {acc_t:.2f}: stale draft KV?"
                    )
    if expect.get("resume_acceptance_not_lower"):
        a, b = tr["acceptance_before"], tr["acceptance_after"]
        if a is None or b is None:
            fails.append("acceptance before/after the fallback could not be measured")
        elif b < a - 0.05:
            fails.append(
                f"acceptance after speculation resumed ({b:.2f}) is below before the fallback ({a:.2f}): stale draft KV?"
            )
    return fails


def check_switch_log(switches: list | None, window: dict, threshold: int, hysteresis: int) -> list[str]:
    """The server log's spec-fallback switch lines of a workload ((batch size, "OFF"|"ON") in
    log order) against the counters: one line per switch counted in each direction, drafting
    OFF above T and ON at or below T - H."""
    if switches is None:
        return ["the server log was not read, so its switch lines cannot be checked"]
    fails = []
    for state, key in (("OFF", "switches_to_fallback"), ("ON", "switches_to_spec")):
        logged, counted = sum(s == state for _, s in switches), window.get(key, 0)
        if logged != counted or not counted:
            fails.append(f"the server log shows {logged} 'drafting {state}' line(s), the counters {counted} switch(es)")
    off_low = [bs for bs, s in switches if s == "OFF" and bs <= threshold]
    on_high = [bs for bs, s in switches if s == "ON" and bs > threshold - hysteresis]
    if off_low or on_high:
        fails.append(
            f"the server log switches at batch sizes the rule forbids (OFF at {off_low}, ON at {on_high}; "
            f"T={threshold}, H={hysteresis})"
        )
    return fails


def check_metrics(before: dict, after: dict, window: dict, requests: list[dict]) -> list[str]:
    """SGLang's /metrics over a workload (server_worker.server_counters, before and after)
    against the fallback's counters and the requests' outputs: its decode passes are the
    counted steps, its decode tokens their requests plus the accepted drafts (a fallback step
    adds one token per request), and it counts every request and generated token once."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    phases = window.get("phases", [])
    want = {
        "decode_passes": counted_steps(window),
        "decode_tokens": sum(p["reqs"] + p["correct_drafts"] for p in phases),
        "requests": len(requests),
        "generation_tokens": sum(r.get("completion_tokens") or 0 for r in requests),
    }
    says = {
        "decode_passes": "decode passes (the counted steps)",
        "decode_tokens": "decode tokens (the steps' requests plus accepted drafts)",
        "requests": "finished requests",
        "generation_tokens": "generated tokens",
    }
    return [
        f"/metrics counted {delta.get(k, 0):g} {says[k]}, expected {v}"
        for k, v in want.items()
        if delta.get(k, 0) != v or not v
    ]


def check_server(expect: dict, window: dict, run: dict, threshold: int, hysteresis: int) -> list[str]:
    """The claims of a served engine (switches_logged, metrics_agree) on one workload's run."""
    fails = []
    if expect.get("switches_logged"):
        fails += check_switch_log(run.get("switches"), window, threshold, hysteresis)
    if expect.get("metrics_agree"):
        if "metrics_after" not in run:
            fails.append("no /metrics were read, so SGLang's counts cannot be checked")
        else:
            fails += check_metrics(run["metrics_before"], run["metrics_after"], window, run["requests"])
    return fails


@dataclass
class TokenComparison:
    requests: int = 0
    equal: int = 0
    tokens: int = 0
    mismatches: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.equal == self.requests


def compare_tokens(
    baseline: list[dict], candidate: list[dict], prompts: list[list[int]] | None = None
) -> TokenComparison:
    """Exact equality per request; on a mismatch, where and how close the baseline was."""
    out = TokenComparison()
    for b, c in zip(baseline, candidate):
        out.requests += 1
        bi, ci = b["output_ids"], c["output_ids"]
        out.tokens += len(bi)
        if bi == ci:
            out.equal += 1
            continue
        pos = next((i for i, (x, y) in enumerate(zip(bi, ci)) if x != y), min(len(bi), len(ci)))
        margins = b.get("top2_margins") or []
        out.mismatches.append(
            {
                "request": b.get("index"),
                "first_diff": pos,
                "baseline_token": bi[pos] if pos < len(bi) else None,
                "candidate_token": ci[pos] if pos < len(ci) else None,
                "baseline_top2_margin": margins[pos] if pos < len(margins) else None,
                "lengths": [len(bi), len(ci)],
                "prompt_len": len(prompts[b["index"]]) if prompts else None,
            }
        )
    if len(baseline) != len(candidate):
        out.mismatches.append(
            {"request": None, "error": f"{len(baseline)} baseline vs {len(candidate)} candidate requests"}
        )
    return out


def _far(got: float, want: float, tol: float) -> bool:
    return abs(got - want) > tol * max(1.0, abs(want))


def compare_logprobs(baseline: list[dict], candidate: list[dict], tol: float) -> list[str]:
    """The logprobs of the candidate's requests that asked for them (`token_logprobs`, and
    `top_logprobs`: the top 2 per position) against the baseline's (which always returns
    them), each within `tol` relative to max(1, |baseline|). A request that asked and got
    none, or a different number, fails too."""
    fails, asked = [], 0
    for b, c in zip(baseline, candidate):
        if not c.get("asked_logprobs"):
            continue
        asked += 1
        i = c.get("index")
        for key in ("token_logprobs", "top_logprobs"):
            want, got = b.get(key) or [], c.get(key) or []
            if len(got) != len(want) or not got:
                fails.append(f"request {i}: {len(got)} {key} for the baseline's {len(want)}")
                continue
            flat = [
                (pos, g, w)
                for pos, (gs, ws) in enumerate(zip(got, want))
                for g, w in (zip(gs, ws) if isinstance(gs, list) else [(gs, ws)])
            ]
            bad = [(pos, g, w) for pos, g, w in flat if g is None or w is None or _far(g, w, tol)]
            if bad:
                pos, g, w = bad[0]
                fails.append(
                    f"request {i}: {len(bad)} {key} differ from the baseline's beyond {tol} "
                    f"(first at token {pos}: {g} vs {w})"
                )
    if not asked:
        fails.append("no request asked for logprobs, so none were compared")
    return fails


def compare_hidden_states(baseline: list[dict], candidate: list[dict], tol: float) -> list[str]:
    """The decode steps' hidden states of the candidate's requests that asked for them against
    the baseline's (an engine that serves them too), row by row within `tol` relative to the
    baseline row's largest value. Missing rows fail."""
    fails, asked = [], 0
    for b, c in zip(baseline, candidate):
        if not c.get("asked_hidden_states"):
            continue
        asked += 1
        i, want, got = c.get("index"), b.get("hidden_states") or [], c.get("hidden_states") or []
        if len(got) != len(want) or not got:
            fails.append(f"request {i}: hidden states of {len(got)} decode steps for the baseline's {len(want)}")
            continue
        for pos, (g, w) in enumerate(zip(got, want)):
            scale = max(abs(x) for x in w) or 1.0
            if len(g) != len(w) or max(abs(x - y) for x, y in zip(g, w)) > tol * scale:
                fails.append(
                    f"request {i}: hidden states differ from the baseline's at decode step {pos} "
                    f"(width {len(g)} vs {len(w)}; beyond {tol} of the row's largest value)"
                )
                break
    if not asked:
        fails.append("no request asked for hidden states, so none were compared")
    return fails


def compare_outputs(baseline: list[dict], candidate: list[dict], expect: dict) -> list[str]:
    """The output checks a scenario claims (logprobs_within, hidden_states_within)."""
    fails = []
    if expect.get("logprobs_within") is not None:
        fails += compare_logprobs(baseline, candidate, expect["logprobs_within"])
    if expect.get("hidden_states_within") is not None:
        fails += compare_hidden_states(baseline, candidate, expect["hidden_states_within"])
    return fails


def min_margin(requests: list[dict]) -> float | None:
    vals = [m for r in requests for m in (r.get("top2_margins") or []) if m is not None]
    return min(vals) if vals else None


def prompts_hash(prompts: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]


def golden_path(root: Path, sglang_version: str, arch: str) -> Path:
    return Path(root) / sglang_version / arch / "golden.json"


def make_golden(sglang_version: str, arch: str, model_meta: dict, settings: dict, baselines: dict) -> dict:
    """baselines: golden key -> {prompts, requests (with output_ids, top2_margins), and the
    model_weights its tokens are keyed by where the spec alone does not fix them}."""
    return {
        "schema": GOLDEN_SCHEMA,
        "sglang_version": sglang_version,
        "gpu_arch": arch,
        "model": model_meta,
        "settings": settings,
        "workloads": {
            name: {
                "prompts_sha": prompts_hash(b["prompts"]),
                "min_top2_margin": min_margin(b["requests"]),
                "output_ids": [r["output_ids"] for r in b["requests"]],
                **({"model_weights": b["model_weights"]} if b.get("model_weights") else {}),
            }
            for name, b in sorted(baselines.items())
        },
    }


def validate_golden(data: dict) -> list[str]:
    problems = []
    for key in ("schema", "sglang_version", "gpu_arch", "model", "settings", "workloads"):
        if key not in data:
            problems.append(f"missing key {key}")
    if data.get("schema") != GOLDEN_SCHEMA:
        problems.append(f"schema {data.get('schema')} != {GOLDEN_SCHEMA}")
    for name, w in (data.get("workloads") or {}).items():
        if not isinstance(w.get("output_ids"), list) or not all(isinstance(x, list) for x in w["output_ids"]):
            problems.append(f"workload {name}: output_ids must be a list of token lists")
        if not isinstance(w.get("prompts_sha"), str):
            problems.append(f"workload {name}: prompts_sha missing")
    return problems


def compare_to_golden(golden: dict, name: str, prompts: list[list[int]], requests: list[dict]) -> list[str]:
    """An SGLang upgrade that changes plain outputs is caught before any recipe is involved."""
    w = golden.get("workloads", {}).get(name)
    if w is None:
        return [f"golden file has no workload {name}"]
    if w["prompts_sha"] != prompts_hash(prompts):
        return [f"workload {name}: prompts differ from the golden file (different seed or generator)"]
    cmp = compare_tokens([{"output_ids": o, "index": i} for i, o in enumerate(w["output_ids"])], requests)
    return [
        f"workload {name}: baseline differs from golden in request {m.get('request')} at token {m.get('first_diff')}"
        for m in cmp.mismatches
    ]
