"""The verify harness without a GPU: scenario plan, comparisons, counter checks, golden files,
model building on CPU, and the GPU test itself (skipped, with the reason, without a GPU)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spectool.harness.verify import compare, scenarios
from spectool.harness.verify.golden_model import ModelSpec, copy_prompt

REPO = Path(__file__).resolve().parent.parent


def test_scenario_plan_is_consistent():
    assert scenarios.check_plan() == []
    names = {s.name for s in scenarios.scenarios()}
    T = scenarios.THRESHOLD
    for needed in (
        f"eagle3 bs=T-1={T - 1}",
        f"eagle3 bs=T={T}",
        f"eagle3 bs=T+1={T + 1}",
        "eagle3 always-fallback (T=0)",
        "eagle3 no CUDA graph",
        "eagle3 chunked prefill long prompt",
        "standalone spec-fallback-spec",
    ):
        assert needed in names
    assert any(s.expect.min_acceptance and s.expect.min_acceptance >= 2 for s in scenarios.scenarios())


def test_a_tier_walk_claim_names_each_step_count_once():
    """The counters name a tier by its step count, so a walk over 2,3,2,0 could not tell its
    two 2-step tiers apart: such a claim is refused where it is written; tiers of distinct
    counts in any order are claims (1,3,0)."""
    with pytest.raises(ValueError, match="names a tier by its step count"):
        scenarios.Expect("positive", tiers=(2, 3, 2, 0))
    assert scenarios.Expect("positive", tiers=(1, 3, 0)).tiers == (1, 3, 0)
    assert compare.tier_crossings([1, 3, 1, 0, 3, 1], [1, 3, 0]) == []
    assert compare.tier_crossings([1, 3, 0], [1, 3, 0]) == ["1|3 down", "3|0 down"]


def test_engine_flags_name_what_the_recipe_adds():
    """The golden engines force code paths through the fallback's server flags: each is a
    field the spec-disable-threshold recipe adds, and the paths chosen by batch size are
    forced away from their defaults (the draft decode sync at every size, one KV-only step
    per replay, a margin of 8), or asked for by name where a scenario claims the default."""
    import ast

    src = (REPO / "recipes/spec-disable-threshold/classic/server_args_patch.py").read_text()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgsFields")
    defaults = {n.target.id: ast.literal_eval(n.value) for n in cls.body if isinstance(n, ast.AnnAssign)}
    forced = {}
    for c in scenarios.configs():
        for k, v in c.fallback_args.items():
            forced.setdefault(k, set()).add(v)
    assert forced.get("speculative_disable_draft_decode_min_bs") == {1}
    # 0 (the default) on the KV-only engine, 8 on the engines whose scenarios claim the full
    # sync inside the margin: both asked for by name.
    assert forced.get("speculative_disable_kv_only_margin") == {0, 8}
    assert forced.get("speculative_disable_kv_only_steps_per_replay") == {1, 4}
    assert set(forced) <= set(defaults)
    assert {defaults[k] for k in forced} == {16, 0, 4}
    assert {c.name for c in scenarios.configs() if c.fallback_args} == {
        "eagle3-t0",
        "eagle3-t4",
        "eagle3-t4-eager",
        "eagle3-t4-chunked",
        "eagle3-t4-kv-only",
        "eagle3-tiers",
        "eagle3-tiers-1310",
    }
    assert all(c.threshold is not None for c in scenarios.configs() if c.fallback_args), "flags act with a threshold"


def test_engines_get_the_flags_only_where_the_fallback_is_the_recipes(tmp_path):
    """The engines' kwargs carry their config's fallback flags; where the switch is upstream's
    (0.5.19+), which has neither those paths nor those flags, none."""
    from spectool.harness.verify import runner
    from spectool.harness.verify.engine_worker import engine_kwargs

    models = {"target": "t", "eagle3_draft": "d", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {"key": "m"}}}
    for version, upstream in (("0.5.12", False), ("0.5.19", True)):
        jobs, _, _ = runner.plan_jobs(scenarios.configs(), scenarios.workloads(), models, tmp_path, version, upstream)
        for job in jobs:
            kw = engine_kwargs(job)
            flags = {k: v for k, v in kw.items() if k.startswith("speculative_disable_") and "batch_size" not in k}
            config = next(c for c in scenarios.configs() if c.name == job["config"]["name"])
            want = {} if upstream else config.fallback_args
            assert flags == want, (version, job["config"]["name"])


def test_prompts_are_copy_tasks():
    rng = random.Random(0)
    p = copy_prompt(rng, ModelSpec(), segment=10, repeats=2.5)
    assert p[:10] == p[10:20] and p[20:25] == p[:5] and len(p) == 25 and len(set(p[:10])) == 10


def test_compare_tokens_reports_first_difference_and_margin():
    base = [
        {"index": 0, "output_ids": [1, 2, 3, 4], "top2_margins": [5.0, 4.0, 0.01, 3.0]},
        {"index": 1, "output_ids": [7, 8], "top2_margins": [2.0, 2.0]},
    ]
    cand = [{"index": 0, "output_ids": [1, 2, 9, 4]}, {"index": 1, "output_ids": [7, 8]}]
    c = compare.compare_tokens(base, cand)
    assert not c.ok and c.equal == 1 and c.tokens == 6
    assert c.mismatches[0]["first_diff"] == 2 and c.mismatches[0]["baseline_top2_margin"] == 0.01
    assert compare.compare_tokens(base, [dict(b) for b in base]).ok


def _phase(i, mode, steps, reqs=0, drafts=0):
    return {"id": i, "mode": mode, "steps": steps, "reqs": reqs, "correct_drafts": drafts}


def test_stats_window_and_expectations():
    before = {
        "fallback_steps": 5,
        "spec_steps": 10,
        "phases": [_phase(1, "spec", 10, 10, 20), _phase(2, "fallback", 5)],
    }
    after = {
        "fallback_steps": 12,
        "spec_steps": 30,
        "phases": [_phase(1, "spec", 10, 10, 20), _phase(2, "fallback", 12), _phase(3, "spec", 20, 40, 100)],
    }
    w = compare.stats_window(before, after)
    assert w["fallback_steps"] == 7 and w["spec_steps"] == 20
    assert [(p["id"], p["steps"]) for p in w["phases"]] == [(2, 7), (3, 20)]
    assert compare.acceptance(w["phases"]) == 1 + 100 / 40
    assert compare.check_expectations({"fallback_steps": "positive", "spec_after_fallback": True}, w) == []
    fails = compare.check_expectations({"fallback_steps": "zero", "fallback_after_spec": True}, w)
    assert len(fails) == 2


def test_step_claims_need_counted_steps():
    """A claim of no fallback steps passed when the engine published no counters at all (a
    missing stats file reads as zero); now every step claim needs counted steps, and the
    patch without the flag must count none (its decision never runs). Upstream's log shows
    every decode step, flag or not, so there the no-count claim is dropped."""
    from spectool.harness.verify.scenarios import Expect, expectations

    nothing = compare.stats_window({}, {})
    assert compare.check_expectations(expectations(Expect("zero")), nothing) == [
        "the engine counted no decode step (no stats file?), so its step claims cannot be checked"
    ]
    unset = expectations(Expect(counted=False))
    assert compare.check_expectations(unset, nothing) == []
    spec = {"fallback_steps": 0, "spec_steps": 9, "phases": [_phase(1, "spec", 9)]}
    assert compare.check_expectations(unset, spec) == [
        "expected the fallback's decision never to run (no flag), but it counted 9 steps"
    ]
    assert compare.check_expectations(expectations(Expect("zero")), spec) == []
    assert "counted" not in expectations(Expect(counted=False), recipe_counters=False)
    assert expectations(Expect("zero"), recipe_counters=False)["counted"] is True


def test_resume_acceptance_check_catches_stale_draft():
    w = {
        "fallback_steps": 4,
        "spec_steps": 20,
        "phases": [_phase(1, "spec", 10, 20, 50), _phase(2, "fallback", 4), _phase(3, "spec", 10, 20, 10)],
    }
    fails = compare.check_expectations({"resume_acceptance_not_lower": True}, w)
    assert fails and "stale draft KV" in fails[0]
    w["phases"][2]["correct_drafts"] = 55
    assert compare.check_expectations({"resume_acceptance_not_lower": True}, w) == []


def test_golden_file_roundtrip_and_upgrade_detection():
    prompts = [[1, 2, 3], [4, 5]]
    reqs = [{"output_ids": [9, 9], "top2_margins": [3.0, 4.0]}, {"output_ids": [8], "top2_margins": [2.5]}]
    g = compare.make_golden("0.5.12", "sm90", {"key": "k"}, {"s": 1}, {"bs2": {"prompts": prompts, "requests": reqs}})
    assert compare.validate_golden(g) == []
    assert g["workloads"]["bs2"]["min_top2_margin"] == 2.5
    assert compare.compare_to_golden(g, "bs2", prompts, reqs) == []
    changed = [{"output_ids": [9, 7]}, {"output_ids": [8]}]
    assert "differs from golden" in compare.compare_to_golden(g, "bs2", prompts, changed)[0]
    assert "prompts differ" in compare.compare_to_golden(g, "bs2", [[1]], reqs)[0]


def test_committed_golden_files_are_valid():
    files = list((REPO / "golden").rglob("golden.json"))
    for f in files:
        data = json.loads(f.read_text())
        assert compare.validate_golden(data) == [], f
        assert data["sglang_version"] == f.parent.parent.name and data["gpu_arch"] == f.parent.name
        margins = [w["min_top2_margin"] for w in data["workloads"].values()]
        assert min(margins) > 1.0, "golden baselines must be far from ties"
        wl = scenarios.workloads()
        for key, w in data["workloads"].items():  # key: the workload, or model/backend/workload
            name = key.rsplit("/", 1)[-1]
            assert w["prompts_sha"] == compare.prompts_hash([r.prompt for r in wl[name].requests]), key


def test_golden_model_builds_on_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    from spectool.harness.verify.golden_model import save, train, write_eagle3_draft

    spec = ModelSpec(
        vocab=32,
        hidden=32,
        layers=8,
        heads=2,
        intermediate=64,
        seq_len=32,
        min_segment=4,
        max_segment=8,
        steps=30,
        batch=8,
    )
    model, loss, _ = train(spec, "cpu", log=None)
    assert loss == loss and loss < 4.0  # finite, near ln(32) = 3.47 after 30 steps (plumbing, not learning)
    save(model, spec, tmp_path / "t")
    sd = load_file(str(tmp_path / "t" / "model.safetensors"))
    assert sd["model.layers.7.mlp.down_proj.weight"].shape == (32, 64) and sd["lm_head.weight"].dtype == torch.bfloat16
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 8
    d = json.loads((write_eagle3_draft(spec, tmp_path / "d") / "config.json").read_text())
    assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["num_hidden_layers"] == 1


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(
    not _has_gpu(), reason="no CUDA GPU here: the golden GPU tests run on the H200 via tools/device/verify.sh"
)
def test_golden_gpu(tmp_path):
    """The real thing: `spectool verify` on this machine's SGLang (patched in a copy)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    site = tmp_path / "site"
    shutil.copytree(Path(spec.origin).parent, site / "sglang")
    r = subprocess.run(
        [sys.executable, "-m", "spectool.cli", "apply", "--sglang-dir", str(site)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spectool.cli",
            "verify",
            "--sglang-dir",
            str(site),
            "--out",
            str(tmp_path / "v"),
            "--golden-dir",
            str(REPO / "golden"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_tensor_parallel_reaches_every_engine(tmp_path):
    """`spectool verify --tp 2` runs every engine, baselines included, with tp_size 2 (a
    golden check at TP=2 is only meaningful if the baseline runs the same way)."""
    from spectool.harness.verify import runner, scenarios
    from spectool.harness.verify.engine_worker import engine_kwargs

    models = {"target": "t", "eagle3_draft": "d", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {"key": "m"}}}
    wls = scenarios.workloads()
    for tp in (1, 2):
        jobs, cfgs, _ = runner.plan_jobs(scenarios.configs(), wls, models, tmp_path, "0.5.12", False, tp)
        assert len(jobs) == len(cfgs) and {engine_kwargs(j)["tp_size"] for j in jobs} == {tp}


def test_every_engine_has_its_own_fixed_rendezvous_port(tmp_path):
    """SGLang picks the torch.distributed rendezvous port at start-up when none is given, and
    binds it later: ten TP=2 engines starting at once lost one to EADDRINUSE on the H200. Each
    engine of a verify run, and of a bench, with two runs of each at their documented port
    bases (one per GPU), now has its own, outside every other engine's ports and below
    Linux's ephemeral range. (Two benches once shared their bases: EADDRINUSE on 32129.)"""
    from spectool.harness.bench.arms import engine_kwargs as bench_kwargs
    from spectool.harness.bench.engines import PORT_BASE, arm_port
    from spectool.harness.bench.sweep import select_arms
    from spectool.harness.verify import runner, scenarios
    from spectool.harness.verify.engine_worker import engine_kwargs

    models = {"target": "t", "eagle3_draft": "d", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {"key": "m"}}}
    taken, rendezvous = set(), []
    for base in (31000, 29000):  # the default and the second run's (tools/device/README.md)
        jobs, _, _ = runner.plan_jobs(
            scenarios.configs(), scenarios.workloads(), models, tmp_path, "0.5.12", False, 2, base
        )
        for j in jobs:
            kw = engine_kwargs(j)
            taken.add(kw["port"])
            rendezvous.append(kw["nccl_port"])
    arms = select_arms(32, 256, None, ("A4L=A4:X=1", "A4C=A4:X=1", "A2P=A2:X=1"), server_args={"X": "int"})  # 8 engines
    for base in (PORT_BASE, 22000):  # the default and the second bench's (tools/device/README.md)
        for i, arm in enumerate(arms):
            kw = bench_kwargs(
                arm, {"target": "t", "draft": "d"}, max_bs=256, max_total_tokens=1000, port=arm_port(base, i)
            )
            taken.add(kw["port"])
            rendezvous.append(kw["nccl_port"])
    assert len(set(rendezvous)) == len(rendezvous) and not set(rendezvous) & taken
    assert max(rendezvous) < 32768


def test_golden_model_for_tensor_parallel():
    """TP=2 gets the nearest model its ranks can hold (each rank's MLP share in whole 16-byte
    vectors: 344 split in two failed CUDA graph capture on the H200); TP=1 keeps the model
    the golden files were recorded with; a TP the two heads cannot split is refused."""
    base = ModelSpec()
    assert base.for_tp(1) is base
    tp2 = base.for_tp(2)
    assert tp2.intermediate == 352 and (tp2.intermediate // 2) % 8 == 0 and tp2.key() != base.key()
    with pytest.raises(ValueError, match="2 attention heads"):
        base.for_tp(4)


def test_golden_files_speak_only_for_their_model(tmp_path):
    """A TP=2 run (its own model) is not failed against golden files of the TP=1 model; the
    report says which files it left out. With the recorded model both files are checked."""
    from pathlib import Path

    from spectool.harness.verify import runner

    root = Path(__file__).resolve().parent.parent / "golden"
    files = len(list(root.glob("*/sm90/golden.json")))
    for spec, skipped in ((ModelSpec(), 0), (ModelSpec().for_tp(2), files)):
        models = {"meta": {"key": spec.key()}}
        report = runner.evaluate({}, [], {}, models, "0.5.12", "sm90", "NVIDIA H200", root, False)
        assert report["ok"] and not report["golden_problems"], spec
        assert len(report["golden_skipped"]) == skipped, report["golden_skipped"]
    models = {"meta": {"key": ModelSpec().for_tp(2).key()}}
    report = runner.evaluate({}, [], {}, models, "0.5.99", "sm90", "NVIDIA H200", root, False)
    assert report["ok"] and any("no golden file" in p for p in report["golden_skipped"])
    report = runner.evaluate({}, [], {}, {"meta": {"key": ModelSpec().key()}}, "0.5.99", "sm90", "H200", root, False)
    assert not report["ok"] and "record one with --record" in report["golden_problems"][0]


# Synthetic engine outputs for runner.evaluate: every engine decodes the same tokens, and each
# scenario's engine counts the steps its claims ask for (derived from its Expect), so a test
# can break one claim at a time and see exactly that one fail.
SYNTHETIC_FALLBACK_STEPS = 20


def _tokens(workload):
    """Every engine's records of `workload`: tokens, the logprobs a baseline returns for every
    request and a candidate for those that ask, hidden states (one row per decode step) for
    the requests that ask."""
    out = []
    for i, r in enumerate(workload.requests):
        n = r.max_new_tokens
        rec = {
            "index": i,
            "output_ids": [(7 * i + k) % 256 for k in range(n)],
            "completion_tokens": n,
            "top2_margins": [5.0] * n,
            "asked_logprobs": r.return_logprob,
            "token_logprobs": [-0.001 * (k + 1) for k in range(n)],
            "top_logprobs": [[-0.001 * (k + 1), -5.0 - 0.01 * k] for k in range(n)],
        }
        if r.return_hidden_states:
            rec.update(asked_hidden_states=True, hidden_states=[[0.5 * i, -1.0 + 0.01 * k, 3.0] for k in range(n - 1)])
        out.append(rec)
    return out


def _counters(expect) -> dict:
    """A stats file snapshot that meets `expect`: the steps, phases and KV-only counts its
    claims name (acceptance 4 on every speculative step)."""
    if not expect.counted:
        return {}
    n = SYNTHETIC_FALLBACK_STEPS

    def phase(i, mode, steps, draft_steps=3):
        return {
            "id": i,
            "mode": mode,
            "draft_steps": draft_steps if mode == "spec" else 0,
            "steps": steps,
            "reqs": steps,
            "correct_drafts": draft_steps * steps if mode == "spec" else 0,
        }

    if expect.min_tier_acceptance:  # every tier entered from both sides, drafts accepted whole
        tiers = list(expect.tiers or scenarios.TIERS)
        walk = tiers + tiers[-2::-1]  # down to 0 and back: each boundary crossed both ways
        phases = [phase(i + 1, "spec" if d else "fallback", n, d) for i, d in enumerate(walk)]
    elif expect.fallback_steps == "all" or (
        expect.fallback_steps == "positive" and not (expect.spec_after_fallback or expect.fallback_after_spec)
    ):
        phases = [phase(1, "fallback", n)]
    elif expect.fallback_steps == "positive":
        phases = [phase(1, "spec", n), phase(2, "fallback", n), phase(3, "spec", n)]
    else:
        phases = [phase(1, "spec", n)]
    fb = sum(p["steps"] for p in phases if p["mode"] == "fallback")
    kv = fb if expect.kv_only in ("positive", "graph") else 0
    switches = [state for _, state in _switch_lines(phases)]
    return {
        "switches_to_fallback": switches.count("OFF"),
        "switches_to_spec": switches.count("ON"),
        "fallback_steps": fb,
        "spec_steps": sum(p["steps"] for p in phases if p["mode"] == "spec"),
        "phases": phases,
        "draft_kv_only_steps": kv,
        "draft_kv_only_graph_steps": kv,
        "draft_kv_only_prefills": 2 if expect.kv_only_prefill == "positive" else 0,
    }


def _switch_lines(phases):
    """A served engine's switch lines for `phases` (the engine starts speculative): drafting
    OFF at T+1 requests, ON at 1."""
    modes = ["spec"] + [p["mode"] for p in phases]
    return [
        (scenarios.THRESHOLD + 1, "OFF") if now == "fallback" else (1, "ON")
        for before, now in zip(modes, modes[1:])
        if now != before
    ]


def _served(requests, counters):
    """What a served engine shows of its counters: a log line per switch, and /metrics that
    count the steps, their tokens and the requests as the counters and outputs do."""
    phases = counters.get("phases", [])
    return {
        "switches": _switch_lines(phases),
        "metrics_before": {},
        "metrics_after": {
            "decode_passes": compare.counted_steps(counters),
            "decode_tokens": sum(p["reqs"] + p["correct_drafts"] for p in phases),
            "requests": len(requests),
            "generation_tokens": sum(r["completion_tokens"] for r in requests),
        },
    }


def _engine_results():
    wls = scenarios.workloads()
    claims = {(s.config, s.workload): s.expect for s in scenarios.scenarios()}
    results = {}
    for c in scenarios.configs():
        runs = {}
        for w in c.workloads:
            counters = _counters(claims[(c.name, w)]) if (c.name, w) in claims else {}
            runs[w] = {"requests": _tokens(wls[w]), "seconds": 0.5, "stats_before": {}, "stats_after": counters}
            if c.served:
                runs[w].update(_served(runs[w]["requests"], counters))
        results[c.name] = {"ok": True, "startup_s": 1.0, "total_s": 2.0, "workloads": runs}
    return results


def _evaluate(results, golden_root, record=False, **kw):
    from spectool.harness.verify import runner

    cfgs = kw.pop("cfgs", scenarios.configs())
    return runner.evaluate(
        results,
        cfgs,
        scenarios.workloads(),
        {"meta": {"key": ModelSpec().key()}},
        kw.pop("version", "0.5.12"),
        "sm90",
        "NVIDIA H200",
        golden_root,
        record,
        **kw,
    )


def _failed(report):
    return {r["scenario"]: r["failures"] for r in report["scenarios"] if not r["ok"]}


def test_a_run_that_meets_every_claim_passes_and_its_baselines_become_the_golden_file(tmp_path):
    """Every scenario token-exact with its claims met: the report passes, each row carries its
    counts (none where the patch runs without the flag: nothing was counted), and the
    baselines recorded as the golden file are what the next run is checked against."""
    assert len({(s.config, s.workload) for s in scenarios.scenarios()}) == len(scenarios.scenarios())
    recorded = _evaluate(_engine_results(), tmp_path, record=True)
    assert recorded["ok"] and (tmp_path / "0.5.12/sm90/golden.json").exists()
    report = _evaluate(_engine_results(), tmp_path)
    assert report["ok"] and not report["golden_problems"] and _failed(report) == {}
    assert len(report["scenarios"]) == len(scenarios.scenarios())
    for row, s in zip(report["scenarios"], scenarios.scenarios()):
        n = len(scenarios.workloads()[s.workload].requests)
        assert row["equal"] == row["requests"] == n and row["mismatches"] == [], s.name
        counted = SYNTHETIC_FALLBACK_STEPS if s.expect.fallback_steps in ("all", "positive") else 0
        assert row["fallback_steps"] == (counted if s.expect.counted else None), s.name
        assert row["min_baseline_margin"] == 5.0
    unset = [r for r in report["scenarios"] if r["fallback_steps"] is None]
    assert unset and {r["config"] for r in unset} == {"eagle3-unset", "eagle3-tiers-31"}


def test_each_path_claim_fails_by_name(tmp_path):
    """One broken claim at a time, the rest met: exactly that scenario fails, with a message
    that says what was expected and what was counted."""
    _evaluate(_engine_results(), tmp_path, record=True)

    def breaking(pick, change):
        s = next(s for s in scenarios.scenarios() if pick(s.expect))
        results = _engine_results()
        change(results[s.config]["workloads"][s.workload])
        report = _evaluate(results, tmp_path)
        assert not report["ok"]
        return s.name, _failed(report)

    def stats(update):
        return lambda w: w["stats_after"].update(update)

    n = SYNTHETIC_FALLBACK_STEPS
    name, failed = breaking(lambda e: e.kv_only == "graph", stats({"draft_kv_only_graph_steps": 0}))
    assert failed == {name: [f"expected every KV-only draft sync replayed from its CUDA graph, got 0 of {n}"]}
    name, failed = breaking(lambda e: e.kv_only_prefill == "positive", stats({"draft_kv_only_prefills": 0}))
    assert failed == {name: ["expected prefills on the KV-only draft path, got none"]}
    name, failed = breaking(lambda e: e.kv_only == "zero", stats({"draft_kv_only_steps": 5}))
    assert failed == {name: ["expected no KV-only draft sync (batch within the margin), got 5 steps"]}
    name, failed = breaking(
        lambda e: not e.counted,
        lambda w: w.update(stats_after={"fallback_steps": 0, "spec_steps": 9, "phases": [_phase(1, "spec", 9)]}),
    )
    assert failed == {name: ["expected the fallback's decision never to run (no flag), but it counted 9 steps"]}
    name, failed = breaking(
        lambda e: e.resume_acceptance_not_lower, lambda w: w["stats_after"]["phases"][2].update(correct_drafts=0)
    )
    assert failed == {
        name: ["acceptance after speculation resumed (1.00) is below before the fallback (4.00): stale draft KV?"]
    }

    def one_token_off(w):
        w["requests"][0]["output_ids"][3] += 1

    name, failed = breaking(lambda e: e.fallback_steps == "all", one_token_off)
    assert failed == {name: ["1 request(s) differ from the no-speculation baseline"]}


def test_a_failed_engine_fails_its_scenarios_and_is_named(tmp_path):
    """An engine that died fails the scenarios it serves (a baseline: every scenario compared
    with it), is listed with its log's tail, and the others are still evaluated."""
    _evaluate(_engine_results(), tmp_path, record=True)
    results = _engine_results()
    results["standalone-t4"] = {"ok": False, "error": "exited with 1", "log_tail": "RuntimeError: boom"}
    results["base-eager"] = {"ok": False, "error": "exited with -9", "log_tail": ""}
    report = _evaluate(results, tmp_path)
    assert not report["ok"] and set(report["engine_errors"]) == {"standalone-t4", "base-eager"}
    assert report["engine_errors"]["standalone-t4"] == {"error": "exited with 1", "log_tail": "RuntimeError: boom"}
    cfgs = {c.name: c for c in scenarios.configs()}
    eager = {s.name for s in scenarios.scenarios() if not cfgs[s.config].cuda_graph}
    standalone = {s.name for s in scenarios.scenarios() if s.config == "standalone-t4"}
    assert (
        eager
        and standalone
        and _failed(report)
        == {
            **{n: ["engine standalone-t4 failed"] for n in standalone},
            **{n: ["engine base-eager failed"] for n in eager},
        }
    )


def test_baselines_that_differ_from_the_golden_file_fail_the_run(tmp_path):
    """Every engine of a workload decoding other tokens than the recorded baselines: the
    scenarios still agree with their baselines, the golden check names the workload."""
    _evaluate(_engine_results(), tmp_path, record=True)
    results = _engine_results()
    for res in results.values():
        if "bs1" in res["workloads"]:
            res["workloads"]["bs1"]["requests"][0]["output_ids"][0] += 1
    report = _evaluate(results, tmp_path)
    assert not report["ok"] and _failed(report) == {}
    assert len(report["golden_problems"]) == 1 and "bs1" in report["golden_problems"][0]
    assert "differs from golden" in report["golden_problems"][0]


def test_counters_from_upstreams_log_check_only_what_the_log_shows(tmp_path):
    """Where the switch is upstream's, the counters come from its log, which has no KV-only
    path and counts every decode step, flag or not: the recipe's KV-only claims and the
    no-count claim are not checked there; the engines upstream refuses are skipped with the
    reason, not failed."""
    _evaluate(_engine_results(), tmp_path, record=True)
    results = _engine_results()
    for res in results.values():
        for w in res["workloads"].values():
            if w["stats_after"]:
                w["stats_after"].update(draft_kv_only_steps=0, draft_kv_only_graph_steps=0, draft_kv_only_prefills=0)
    for name in ("eagle3-unset", "eagle3-stock"):  # upstream's log counts every decode step
        for w in results[name]["workloads"].values():
            w["stats_after"] = {"fallback_steps": 0, "spec_steps": 9, "phases": [_phase(1, "spec", 9)]}
    skipped = {
        "standalone-t4": "upstream's batch-size switch supports EAGLE/EAGLE3 only",
        **{c.name: "no --speculative-num-steps-tiers" for c in scenarios.configs() if c.tiers},
    }
    cfgs = [c for c in scenarios.configs() if c.name not in skipped]
    report = _evaluate(results, tmp_path, cfgs=cfgs, skipped=skipped, recipe_counters=False)
    assert report["ok"], _failed(report)
    rows = [r for r in report["scenarios"] if r.get("skipped")]
    assert rows and {r["config"] for r in rows} == set(skipped)
    assert all(r["skipped"] == skipped[r["config"]] for r in rows)
    assert _failed(_evaluate(results, tmp_path, cfgs=cfgs, skipped=skipped)), "the recipe's own counters are checked"


def test_new_claims_fail_by_name(tmp_path):
    """The acceptance floor after a resume, and the logprobs and hidden states of the
    requests that ask for them: each broken alone fails exactly its scenario, saying what
    differed; within the tolerance (bf16 noise) they pass."""
    _evaluate(_engine_results(), tmp_path, record=True)

    def run(pick, change):
        s = next(s for s in scenarios.scenarios() if pick(s))
        results = _engine_results()
        change(results[s.config]["workloads"][s.workload])
        return s.name, _failed(_evaluate(results, tmp_path))

    after = lambda s: s.expect.min_acceptance_after is not None  # noqa: E731
    name, failed = run(after, lambda w: w["stats_after"]["phases"][2].update(correct_drafts=0))
    assert failed == {
        name: [
            f"expected acceptance >= {scenarios.HEAD_ACCEPTANCE} after speculation resumed, got 1.00: stale draft KV?"
        ]
    }

    lp = lambda s: s.expect.logprobs_within is not None and s.expect.hidden_states_within is None  # noqa: E731
    tol = scenarios.LOGPROB_TOL

    def shift_logprob(by):
        def change(w):
            req = next(r for r in w["requests"] if r["asked_logprobs"])
            req["token_logprobs"][5] += by

        return change

    name, failed = run(lp, shift_logprob(tol / 2))
    assert failed == {}, "within bf16 noise"
    name, failed = run(lp, shift_logprob(0.1))
    ((msg,),) = failed.values()
    assert "token_logprobs differ from the baseline's beyond 0.02 (first at token 5" in msg

    def top2(w):
        req = next(r for r in w["requests"] if r["asked_logprobs"])
        req["top_logprobs"][2][1] -= 1.0

    name, failed = run(lp, top2)
    assert "top_logprobs differ" in failed[name][0]

    def none_returned(w):
        req = next(r for r in w["requests"] if r["asked_logprobs"])
        req["token_logprobs"] = []

    name, failed = run(lp, none_returned)
    assert failed[name][0].endswith("0 token_logprobs for the baseline's 48")

    hs = lambda s: s.expect.hidden_states_within is not None  # noqa: E731

    def hidden(change_row):
        def change(w):
            req = next(r for r in w["requests"] if r.get("asked_hidden_states"))
            change_row(req["hidden_states"])

        return change

    name, failed = run(hs, hidden(lambda rows: rows[3].__setitem__(2, 3.0 + 0.02 * 3.0 / 2)))
    assert failed == {}, "within the tolerance of the row's largest value"
    name, failed = run(hs, hidden(lambda rows: rows[3].__setitem__(0, 1.0)))
    assert failed == {
        name: [
            f"request 0: hidden states differ from the baseline's at decode step 3 (width 3 vs 3; "
            f"beyond {scenarios.HIDDEN_TOL} of the row's largest value)"
        ]
    }
    name, failed = run(hs, hidden(lambda rows: rows.pop()))
    assert failed == {name: ["request 0: hidden states of 46 decode steps for the baseline's 47"]}


def test_a_served_engines_log_and_metrics_claims_fail_by_name(tmp_path):
    """The served engine's switch lines and /metrics, each broken: its scenario fails, saying
    what the log and the metrics showed against the counters."""
    _evaluate(_engine_results(), tmp_path, record=True)
    s = next(s for s in scenarios.scenarios() if s.expect.metrics_agree)
    results = _engine_results()
    run = results[s.config]["workloads"][s.workload]
    run["switches"] = run["switches"][:1]
    run["metrics_after"]["decode_passes"] -= 1
    assert _failed(_evaluate(results, tmp_path)) == {
        s.name: [
            "the server log shows 0 'drafting ON' line(s), the counters 1 switch(es)",
            f"/metrics counted {3 * SYNTHETIC_FALLBACK_STEPS - 1} decode passes (the counted steps), "
            f"expected {3 * SYNTHETIC_FALLBACK_STEPS}",
        ]
    }


def test_every_output_scenario_asks_for_what_it_compares():
    """A scenario that compares logprobs or hidden states runs a workload whose requests ask
    for them, on an engine (and baseline) that serves hidden states where it compares them."""
    cfgs = {c.name: c for c in scenarios.configs()}
    wls = scenarios.workloads()
    compared = [s for s in scenarios.scenarios() if s.expect.logprobs_within or s.expect.hidden_states_within]
    assert {s.config for s in compared} == {
        "eagle3-t4",
        "standalone-t4-hidden",
        "eagle3-moe-t4",
        "eagle3-t4-flashinfer",
    }
    for s in compared:
        reqs = wls[s.workload].requests
        assert any(r.return_logprob for r in reqs) and not all(r.return_logprob for r in reqs), s.name
        if s.expect.hidden_states_within:
            assert any(r.return_hidden_states for r in reqs) and cfgs[s.config].hidden_states
            assert scenarios.baseline_for(cfgs[s.config], list(cfgs.values()), s.workload).hidden_states
    floors = [s for s in scenarios.scenarios() if s.expect.min_acceptance_after]
    assert floors and all(cfgs[s.config].algorithm == "EAGLE3" and s.expect.spec_after_fallback for s in floors)


def test_engine_records_what_the_comparisons_read():
    """engine_worker.record over an SGLang output: the chosen tokens' logprobs, the top 2 per
    position and their margin, and only the decode steps' hidden-state rows (the prompt's
    come first, as one list of rows, when the prefill captured them)."""
    from spectool.harness.verify.engine_worker import engine_kwargs, record

    out = {
        "output_ids": [5, 6],
        "meta_info": {
            "output_token_logprobs": [(-0.01, 5, None), (-0.02, 6, None)],
            "output_top_logprobs": [[(-0.01, 5, None), (-6.0, 9, None)], [(-7.0, 3, None), (-0.02, 6, None)]],
            "hidden_states": [[[0.1, 0.2], [0.3, 0.4]], [1.0, 2.0]],
        },
    }
    rec = record(0, out, {"return_logprob": True, "return_hidden_states": True}, False, 0.0)
    assert rec["asked_logprobs"] and rec["token_logprobs"] == [-0.01, -0.02]
    assert rec["top_logprobs"] == [[-0.01, -6.0], [-0.02, -7.0]] and rec["top2_margins"] == [5.99, 6.98]
    assert rec["asked_hidden_states"] and rec["hidden_states"] == [[1.0, 2.0]]
    plain = record(1, out, {}, True, 0.0)
    assert plain["asked_logprobs"] is False and "token_logprobs" in plain and "hidden_states" not in plain
    assert "token_logprobs" not in record(2, out, {}, False, 0.0)
    job = {
        "config": {"name": "x", "cuda_graph": True, "chunked_prefill": None, "algorithm": None, "hidden_states": True},
        "target": "t",
        "eagle3_draft": "d",
    }
    assert engine_kwargs(job)["enable_return_hidden_states"] is True
    job["config"].update(algorithm="EAGLE3", threshold=None)
    kw = engine_kwargs(job)
    assert kw["speculative_draft_model_path"] == "d" and "speculative_draft_load_format" not in kw, "the trained head"


def test_recording_keeps_what_the_golden_file_holds(tmp_path):
    """--record adds the workloads a golden file lacks; a workload it holds whose baseline now
    decodes other tokens fails the run by name (plain decoding changed), the file is rewritten
    all the same."""
    _evaluate(_engine_results(), tmp_path, record=True)
    path = tmp_path / "0.5.12/sm90/golden.json"
    data = json.loads(path.read_text())
    del data["workloads"]["outputs"]
    path.write_text(json.dumps(data))
    # Without --record the workload it lacks is compared with its baseline only, and named.
    report = _evaluate(_engine_results(), tmp_path)
    assert report["ok"] and not report["golden_problems"]
    assert (
        f"{path} has no workload outputs (add it with --record); compared with its baseline only"
        in report["golden_skipped"]
    )
    report = _evaluate(_engine_results(), tmp_path, record=True)
    assert report["ok"] and "outputs" in json.loads(path.read_text())["workloads"]
    results = _engine_results()
    for res in results.values():
        if "bs1" in res["workloads"]:
            res["workloads"]["bs1"]["requests"][0]["output_ids"][0] += 1
    report = _evaluate(results, tmp_path, record=True)
    assert not report["ok"] and len(report["golden_problems"]) == 1 and "bs1" in report["golden_problems"][0]


def test_new_targets_and_backends_have_their_own_baselines_and_golden_keys(tmp_path):
    """The MoE target and the flashinfer engines are compared with a no-speculation engine of
    their own model and backend, and their tokens recorded under keys of their own (the dense
    triton workloads keep their names); MoE tokens are keyed by the weights that decoded them,
    so a retrained MoE model is compared with its baseline only, never failed by name."""
    cfgs = scenarios.configs()
    by_name = {c.name: c for c in cfgs}
    for name, base in (("eagle3-moe-t4", "base-moe"), ("eagle3-t4-flashinfer", "base-flashinfer")):
        for w in by_name[name].workloads:
            assert scenarios.baseline_for(by_name[name], cfgs, w).name == base
    assert by_name["base-moe"].golden_key("stagger") == "moe/stagger"
    assert by_name["base-flashinfer"].golden_key("stagger") == "flashinfer/stagger"
    assert by_name["base-graph"].golden_key("stagger") == "stagger"

    def run(sha, record=False, only=None):
        from spectool.harness.verify import runner

        models = {"meta": {"key": ModelSpec().key()}, "moe": {"meta": {"weights_sha": sha}}}
        run_cfgs = runner.select_configs(only)
        results = {k: v for k, v in _engine_results().items() if k in {c.name for c in run_cfgs}}
        return runner.evaluate(
            results, run_cfgs, scenarios.workloads(), models, "0.5.12", "sm90", "H200", tmp_path, record
        )

    assert run("aaaa", record=True)["ok"]
    held = json.loads((tmp_path / "0.5.12/sm90/golden.json").read_text())["workloads"]
    assert held["moe/arrive-logprobs"]["model_weights"] == "aaaa" and "model_weights" not in held["stagger"]
    assert "flashinfer/arrive-logprobs" in held and "arrive-logprobs" not in held
    report = run("aaaa")
    assert report["ok"] and not report["golden_skipped"]
    report = run("bbbb")
    assert report["ok"] and len(report["golden_skipped"]) == 2
    assert all("moe/" in why and "bbbb" in why for why in report["golden_skipped"])
    # Recording a few engines keeps what the file holds for the others.
    assert run("cccc", record=True, only=["eagle3-moe-t4"])["ok"]
    after = json.loads((tmp_path / "0.5.12/sm90/golden.json").read_text())["workloads"]
    assert set(after) == set(held) and after["moe/stagger"]["model_weights"] == "cccc"


def test_only_runs_the_named_engines_and_their_baselines():
    from spectool.harness.verify import runner

    new = ["eagle3-moe-t4", "eagle3-t4-flashinfer"]
    assert [c.name for c in runner.select_configs(new)] == [
        "base-flashinfer",
        "eagle3-t4-flashinfer",
        "base-moe",
        "eagle3-moe-t4",
    ]
    assert {c.name for c in runner.select_configs(["eagle3-t4"])} == {"base-graph", "eagle3-t4"}
    assert runner.select_configs(None) == scenarios.configs()


def test_flashinfer_starts_first_and_moe_engines_wait_for_their_training(tmp_path):
    """flashinfer compiles at first use, so its engines are launched first; the engines of a
    MoE model that the run trains start once that job is done, and never when it failed."""
    from spectool.harness.verify import runner
    from spectool.harness.verify.engine_worker import engine_kwargs

    models = {"target": "t", "eagle3_draft": "d", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {}}}
    jobs, cfgs, _ = runner.plan_jobs(
        runner.select_configs(None), scenarios.workloads(), models, tmp_path, "0.5.12", False
    )
    assert [j["config"]["attention"] for j in jobs[:2]] == ["flashinfer", "flashinfer"]
    assert {engine_kwargs(j)["attention_backend"] for j in jobs[2:]} == {"triton"}
    moe = [j for j in jobs if j["config"]["model"] == "moe"]
    assert {j["target"] for j in moe} == {"mt"} and {j["after"] for j in moe} == {runner.TRAIN_MOE}
    assert all("after" not in j and j["target"] == "t" for j in jobs if j["config"]["model"] == "dense")
    pending = [{"config": {"name": "a"}, "after": "train"}, {"config": {"name": "b"}}]
    assert runner.next_ready(pending, {})["config"]["name"] == "b" and len(pending) == 1
    assert runner.next_ready(pending, {}) is None
    results = {"train": {"ok": False}}
    assert runner.next_ready(pending, results) is None and results["a"]["error"] == "not started: train failed"


def test_tier_claims_fail_by_name(tmp_path):
    """The tiers scenarios: a boundary never crossed one way, or a tier whose acceptance after
    a switch fell (a stale draft KV cache), fails exactly that scenario, naming the boundary or
    the tier; a walk through every boundary with drafts accepted whole passes."""
    _evaluate(_engine_results(), tmp_path, record=True)
    s = next(s for s in scenarios.scenarios() if s.expect.tiers == scenarios.TIERS)

    def failed(change):
        results = _engine_results()
        change(results[s.config]["workloads"][s.workload]["stats_after"]["phases"])
        return _failed(_evaluate(results, tmp_path))

    assert failed(lambda phases: None) == {}
    # Walk 3, 1, 0, 1, 3 without the last phase: back down from 1 to 3 is never seen, and
    # the 3-step tier is never entered from another.
    ((missed, unmeasured),) = failed(lambda phases: phases.pop()).values()
    assert missed == (
        "expected every tier boundary of 3,1,0 crossed both ways, missed 3|1 down (draft steps per phase: [3, 1, 0, 1])"
    )
    assert unmeasured == "expected acceptance >= 2.50 in the 3-step tier after a switch (0.625 of 4), none measured"

    def stale_after_fallback(phases):
        phases[3].update(correct_drafts=0)  # the 1-step tier entered from the fallback

    ((msg,),) = failed(stale_after_fallback).values()
    want = 2 * scenarios.TIER_ACCEPTANCE
    assert msg == (
        f"expected acceptance >= {want:.2f} in the 1-step tier entered from 0 draft steps "
        f"({scenarios.TIER_ACCEPTANCE:g} of 2), got 1.00: stale draft KV?"
    )


def test_a_tier_floor_without_named_tiers_checks_every_tier_entered(tmp_path):
    """The shrinking walk claims no boundaries, only the acceptance of each tier it entered:
    a stale draft KV cache in the 3-step tier fails it by name."""
    _evaluate(_engine_results(), tmp_path, record=True)
    s = next(s for s in scenarios.scenarios() if s.expect.min_tier_acceptance and not s.expect.tiers)
    results = _engine_results()
    phases = results[s.config]["workloads"][s.workload]["stats_after"]["phases"]
    assert _failed(_evaluate(results, tmp_path)) == {}
    for p in phases:
        if p["draft_steps"] == 3:
            p["correct_drafts"] = 0
    ((msg,),) = _failed(_evaluate(results, tmp_path)).values()
    assert msg.startswith("expected acceptance >= 2.50 in the 3-step tier entered from 1 draft steps")


def test_tier_walk_crossings_and_acceptance():
    """The phases a stats file records, read as tiers: one entry per change of draft length,
    the boundaries crossed each way (a jump crosses every boundary between), and each tier's
    acceptance over the phases entered from another tier."""

    def p(mode, draft_steps, steps, correct):
        return {"mode": mode, "draft_steps": draft_steps, "steps": steps, "reqs": steps, "correct_drafts": correct}

    phases = [p("spec", 3, 4, 12), p("spec", 3, 2, 6), p("fallback", 0, 5, 0), p("spec", 1, 4, 2), p("spec", 3, 2, 6)]
    assert compare.tier_walk(phases) == [3, 0, 1, 3]
    assert compare.tier_crossings([3, 0, 1, 3], [3, 1, 0]) == []
    assert compare.tier_crossings([3, 0, 3], [3, 1, 0]) == []
    assert compare.tier_crossings([3, 1, 3], [3, 1, 0]) == ["1|0 up", "1|0 down"]
    # The first phase was entered before the window: only the later 3-step phase counts.
    assert compare.tier_acceptance(phases) == {(0, 1): 1.5, (1, 3): 4.0}


def test_a_releases_rule_that_keeps_a_request_kind_speculating_is_what_its_scenarios_check(tmp_path):
    """Where the release's fallback keeps logprob and hidden-state batches speculating (its
    documented rule), the scenarios whose requests ask for them claim every step speculative,
    their logprobs the speculative path's and no hidden-state rows; the row says so. Counted
    fallback steps there fail them; elsewhere nothing changes."""
    _evaluate(_engine_results(), tmp_path, record=True, version="0.5.14")
    kinds = {s.name: scenarios.request_kinds(scenarios.workloads()[s.workload]) for s in scenarios.scenarios()}
    asking = {name for name, k in kinds.items() if k & {"logprob", "hidden_states"}}
    assert {"eagle3 logprob requests fall back", "standalone hidden states and logprobs"} <= asking
    results = _engine_results()
    for s in scenarios.scenarios():
        if s.name in asking and results[s.config]["workloads"][s.workload]["stats_after"]:
            n = SYNTHETIC_FALLBACK_STEPS
            results[s.config]["workloads"][s.workload]["stats_after"] = {
                "fallback_steps": 0,
                "spec_steps": n,
                "phases": [_phase(1, "spec", n)],
            }
    kept = frozenset({"grammar", "logprob", "hidden_states"})
    report = _evaluate(results, tmp_path, kept_kinds=kept, version="0.5.14")
    assert report["ok"], _failed(report)
    row = next(r for r in report["scenarios"] if r["scenario"] == "eagle3 logprob requests fall back")
    assert row["what"].endswith("(SGLang 0.5.14 keeps logprob batches speculating: checked as such)")
    assert set(_failed(_evaluate(results, tmp_path, version="0.5.14"))) == {
        name for name in asking if next(s for s in scenarios.scenarios() if s.name == name).expect.counted
    }
    assert _failed(
        _evaluate(_engine_results(), tmp_path, kept_kinds=kept, version="0.5.14")
    )  # fallback steps where the rule has none


def test_a_scenario_with_a_reference_is_checked_against_the_release_as_published(tmp_path):
    """A stock reference makes the release's own tokens the claim: the patch without the flag
    passes when it decodes as the release does, even where both differ from plain decoding
    (that difference is reported), and fails, naming the reference, where it does not."""
    (s,) = [s for s in scenarios.scenarios() if s.reference]
    assert s.reference == "eagle3-stock" and scenarios.check_plan() == []
    results = _engine_results()
    for name in (s.config, s.reference):  # both leave plain decoding at the same token
        results[name]["workloads"][s.workload]["requests"][0]["output_ids"][436] += 5
    row = next(r for r in _evaluate(results, tmp_path)["scenarios"] if r["scenario"] == s.name)
    assert row["ok"] and row["reference"] == s.reference and row["mismatches"] == []
    assert [m["first_diff"] for m in row["baseline_mismatches"]] == [436]

    results[s.config]["workloads"][s.workload]["requests"][0]["output_ids"][100] += 1
    failed = _failed(_evaluate(results, tmp_path))
    assert failed == {s.name: [f"1 request(s) differ from {s.reference}'s"]}

    skipped = {s.reference: "no saved originals"}
    cfgs = [c for c in scenarios.configs() if c.name != s.reference]
    row = next(
        r for r in _evaluate(results, tmp_path, cfgs=cfgs, skipped=skipped)["scenarios"] if r["scenario"] == s.name
    )
    assert row["ok"] and row["skipped"] == f"its reference {s.reference}: no saved originals"
    # A run of the stock engine alone (--only) reports no row for the patch it did not run.
    only_stock = [c for c in scenarios.configs() if c.name not in (s.config, s.reference)]
    report = _evaluate(results, tmp_path, cfgs=only_stock, skipped=skipped)
    assert s.name not in {r["scenario"] for r in report["scenarios"]}
    # Outputs without the reference engine at all (an older run's): said so, not "failed".
    del results[s.reference]
    failed = _failed(_evaluate(results, tmp_path, cfgs=[c for c in scenarios.configs() if c.name != s.reference]))
    assert failed == {s.name: [f"engine {s.reference} did not run"]}


def test_a_request_joins_once_the_request_it_waits_for_has_made_its_tokens():
    """The tier walk's joins count tokens, not seconds: a follower starts when its leader's
    streamed output reaches the count, whatever the time that took, and one waiting for more
    tokens than the leader makes starts when the leader finishes."""
    import asyncio

    from spectool.harness.verify.engine_worker import Joins

    reqs = [{"delay": 0.0}, {"delay": 0.0, "after": [0, 3]}, {"delay": 0.0, "after": [0, 99]}, {"delay": 0.01}]
    joins = Joins(reqs)
    assert [joins.streamed(i) for i in range(4)] == [True, False, False, False]

    async def walk():
        started = []

        async def follower(i):
            await joins.start(i)
            started.append((i, joins.produced[0]))

        tasks = [asyncio.create_task(follower(i)) for i in (1, 2, 3)]
        for tokens in (1, 2, 3, 4):
            await asyncio.sleep(0.05)
            await joins.progress(0, tokens)
        await asyncio.sleep(0.01)
        assert [i for i, _ in started] == [3, 1]  # the delayed one at its delay, then the join
        await joins.finished(0)
        await asyncio.gather(*tasks)
        return started

    assert asyncio.run(walk()) == [(3, 0), (1, 3), (2, float("inf"))]


def test_the_tier_walk_joins_by_tokens_and_no_served_engine_runs_it():
    """Every join of the tier walk names an earlier request and a token count it makes; the
    HTTP clients send by delay only, so no served engine may run a workload that joins."""
    wls = scenarios.workloads()
    joins = [(i, r.after) for i, r in enumerate(wls["tier-walk"].requests) if r.after]
    assert len(joins) == 8 and all(
        j < i and tokens < wls["tier-walk"].requests[j].max_new_tokens for i, (j, tokens) in joins
    )
    served = [c for c in scenarios.configs() if c.served]
    assert served and not any(r.after for c in served for w in c.workloads for r in wls[w].requests)


def test_a_join_on_a_request_that_is_not_an_earlier_one_is_a_plan_problem():
    """A request waiting on itself, on a later request or on one the workload lacks would
    wait forever: the plan check names it; joins on earlier requests, chained, are fine."""

    def req(after=None):
        return scenarios.Request([1, 2, 3], 8, after=after)

    chained = scenarios.Workload("chained", [req(), req((0, 2)), req((1, 4))])
    assert scenarios.join_problems(chained) == []
    bad = scenarios.Workload("bad", [req((0, 2)), req((2, 2)), req(), req((7, 1))])
    assert scenarios.join_problems(bad) == [
        f"bad: request {i} joins after request {j}, which is not an earlier request"
        for i, j in ((0, 0), (1, 2), (3, 7))
    ]
