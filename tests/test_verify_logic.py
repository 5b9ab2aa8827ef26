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
    for needed in (f"eagle3 bs=T-1={T-1}", f"eagle3 bs=T={T}", f"eagle3 bs=T+1={T+1}", "eagle3 always-fallback (T=0)",
                   "eagle3 no CUDA graph", "eagle3 chunked prefill long prompt", "standalone spec-fallback-spec"):
        assert needed in names
    assert any(s.expect.min_acceptance and s.expect.min_acceptance >= 2 for s in scenarios.scenarios())


def test_engine_switches_name_what_the_recipes_read():
    """The golden engines force code paths through environment switches; a renamed switch in
    the recipes would silently leave the path untested, so each must be read by a recipe
    whose default differs from the forced value."""
    sources = "".join(p.read_text() for p in (REPO / "recipes").rglob("*.py"))
    forced = {}
    for c in scenarios.configs():
        for k, v in c.env.items():
            forced.setdefault(k, set()).add(v)
    assert forced.get("SPECTOOL_FALLBACK_DRAFT_DECODE_MIN_BS") == {"1"}
    # 0 (the default since session 21) on the KV-only engine, 8 (the default before) on the
    # engines whose scenarios claim the full sync inside the margin: both asked for by name.
    assert forced.get("SPECTOOL_FALLBACK_DRAFT_KV_ONLY_MARGIN") == {"0", "8"}
    for var in forced:
        assert f'"{var}"' in sources, var  # read through os.environ or _spec_fallback_env_count
    assert {c.name for c in scenarios.configs() if c.env} == {
        "eagle3-t0", "eagle3-t4", "eagle3-t4-eager", "eagle3-t4-chunked", "eagle3-t4-kv-only"}


def test_prompts_are_copy_tasks():
    rng = random.Random(0)
    p = copy_prompt(rng, ModelSpec(), segment=10, repeats=2.5)
    assert p[:10] == p[10:20] and p[20:25] == p[:5] and len(p) == 25 and len(set(p[:10])) == 10


def test_compare_tokens_reports_first_difference_and_margin():
    base = [{"index": 0, "output_ids": [1, 2, 3, 4], "top2_margins": [5.0, 4.0, 0.01, 3.0]},
            {"index": 1, "output_ids": [7, 8], "top2_margins": [2.0, 2.0]}]
    cand = [{"index": 0, "output_ids": [1, 2, 9, 4]}, {"index": 1, "output_ids": [7, 8]}]
    c = compare.compare_tokens(base, cand)
    assert not c.ok and c.equal == 1 and c.tokens == 6
    assert c.mismatches[0]["first_diff"] == 2 and c.mismatches[0]["baseline_top2_margin"] == 0.01
    assert compare.compare_tokens(base, [dict(b) for b in base]).ok


def _phase(i, mode, steps, reqs=0, drafts=0):
    return {"id": i, "mode": mode, "steps": steps, "reqs": reqs, "correct_drafts": drafts}


def test_stats_window_and_expectations():
    before = {"fallback_steps": 5, "spec_steps": 10, "phases": [_phase(1, "spec", 10, 10, 20), _phase(2, "fallback", 5)]}
    after = {"fallback_steps": 12, "spec_steps": 30,
             "phases": [_phase(1, "spec", 10, 10, 20), _phase(2, "fallback", 12), _phase(3, "spec", 20, 40, 100)]}
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
        "the engine counted no decode step (no stats file?), so its step claims cannot be checked"]
    unset = expectations(Expect(counted=False))
    assert compare.check_expectations(unset, nothing) == []
    spec = {"fallback_steps": 0, "spec_steps": 9, "phases": [_phase(1, "spec", 9)]}
    assert compare.check_expectations(unset, spec) == [
        "expected the fallback's decision never to run (no flag), but it counted 9 steps"]
    assert compare.check_expectations(expectations(Expect("zero")), spec) == []
    assert "counted" not in expectations(Expect(counted=False), recipe_counters=False)
    assert expectations(Expect("zero"), recipe_counters=False)["counted"] is True


def test_resume_acceptance_check_catches_stale_draft():
    w = {"fallback_steps": 4, "spec_steps": 20, "phases": [
        _phase(1, "spec", 10, 20, 50), _phase(2, "fallback", 4), _phase(3, "spec", 10, 20, 10)]}
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
        for name, w in data["workloads"].items():
            assert w["prompts_sha"] == compare.prompts_hash([r.prompt for r in wl[name].requests]), name


def test_golden_model_builds_on_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    from spectool.harness.verify.golden_model import save, train, write_eagle3_draft

    spec = ModelSpec(vocab=32, hidden=32, layers=8, heads=2, intermediate=64, seq_len=32, min_segment=4, max_segment=8, steps=30, batch=8)
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
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU here: the golden GPU tests run on the H200 via tools/device/verify.sh")
def test_golden_gpu(tmp_path):
    """The real thing: `spectool verify` on this machine's SGLang (patched in a copy)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    site = tmp_path / "site"
    shutil.copytree(Path(spec.origin).parent, site / "sglang")
    r = subprocess.run([sys.executable, "-m", "spectool.cli", "apply", "--sglang-dir", str(site)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "spectool.cli", "verify", "--sglang-dir", str(site), "--out", str(tmp_path / "v"),
                        "--golden-dir", str(REPO / "golden")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_tensor_parallel_reaches_every_engine(tmp_path):
    """`spectool verify --tp 2` runs every engine, baselines included, with tp_size 2 (a
    golden check at TP=2 is only meaningful if the baseline runs the same way)."""
    from spectool.harness.verify import runner, scenarios
    from spectool.harness.verify.engine_worker import engine_kwargs

    models = {"target": "t", "eagle3_draft": "d"}
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
    from spectool.harness.bench.sweep import PORT_BASE, arm_port, select_arms
    from spectool.harness.verify import runner, scenarios
    from spectool.harness.verify.engine_worker import engine_kwargs

    models = {"target": "t", "eagle3_draft": "d"}
    taken, rendezvous = set(), []
    for base in (31000, 29000):  # the default and the second run's (tools/device/README.md)
        jobs, _, _ = runner.plan_jobs(scenarios.configs(), scenarios.workloads(), models, tmp_path, "0.5.12", False, 2, base)
        for j in jobs:
            kw = engine_kwargs(j)
            taken.add(kw["port"])
            rendezvous.append(kw["nccl_port"])
    arms = select_arms(32, 256, None, ("A4L=A4:X=1", "A4C=A4:X=1", "A2P=A2:X=1"))  # 8 engines
    for base in (PORT_BASE, 22000):  # the default and the second bench's (tools/device/README.md)
        for i, arm in enumerate(arms):
            kw = bench_kwargs(arm, {"target": "t", "draft": "d"}, max_bs=256, max_total_tokens=1000,
                              port=arm_port(base, i))
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
    for spec, skipped in ((ModelSpec(), 0), (ModelSpec().for_tp(2), 2)):
        models = {"meta": {"key": spec.key()}}
        report = runner.evaluate({}, [], {}, models, "0.5.12", "sm90", "NVIDIA H200", root, False)
        assert report["ok"] and not report["golden_problems"], spec
        assert len(report["golden_skipped"]) == skipped, report["golden_skipped"]
    models = {"meta": {"key": ModelSpec().for_tp(2).key()}}
    report = runner.evaluate({}, [], {}, models, "0.5.99", "sm90", "NVIDIA H200", root, False)
    assert report["ok"] and any("no golden file" in p for p in report["golden_skipped"])
    report = runner.evaluate({}, [], {}, {"meta": {"key": ModelSpec().key()}}, "0.5.99", "sm90", "H200", root, False)
    assert not report["ok"] and "record one with --record" in report["golden_problems"][0]


def test_kv_only_path_claims_are_checked_on_the_recorded_h200_runs(tmp_path, reparse_verify):
    """The scenarios that claim the KV-only draft paths (and those that claim the sync stays
    off) are checked against the recipe's counters. The runs on 12d88a3 (session 18, the final
    recipes), 70485dd (17), ee9a8cf (16), 1f22c7e (15), 54df3f6 (session 14: the T=4 KV-only engine writes
    four steps per graph replay), ea9ea95 (session 13),
    fdfb10d (session 10), 25f148c (session 9), f79ebae (session 8) and d7cba07 (KV-only prefill
    counted, on by default in all six) pass every claim. The earlier runs, re-evaluated, fail exactly what they lacked:
    no KV-only prefill before d7cba07 (0574c06, 80f522d); the sync not yet replayed from graphs (85503b5); the sync still opt-in (609b3ff, which fails
    the scenario that pins the default margin, 12 requests at T=0). So each check can fail."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    failed = {}
    runs = (".", "session17-70485dd", "session16-ee9a8cf", "session15-1f22c7e", "session14-54df3f6", "session13-ea9ea95", "session10-fdfb10d", "session9-25f148c", "session8-f79ebae", "session7-d7cba07", "session7-0574c06", "session6-80f522d", "session5-85503b5", "session5-609b3ff")
    reports = {}
    for run in runs:
        reports[run] = reparse_verify(root / "results/verify-0.5.12" / run, tmp_path / run.replace(".", "latest"))
        rows = reports[run]["scenarios"]
        failed[run] = {r["scenario"]: r["failures"] for r in rows if not r["ok"]}
        kv = {r["scenario"]: r["kv_only_steps"] for r in rows}
        if run != "session5-609b3ff":
            assert kv["eagle3 always-fallback (T=0)"] == 0 and kv["eagle3 always-fallback stagger (T=0)"] == 40, run
            assert kv["eagle3 KV-only draft sync"] == 63 and kv["eagle3 bs=T+1=5"] == 0, run
        if run != "session5-85503b5" and run != "session5-609b3ff":
            graphed = {r["scenario"]: r["kv_only_graph_steps"] for r in rows}
            assert graphed["eagle3 KV-only draft sync"] == 63 and graphed["eagle3 always-fallback stagger (T=0)"] == 40
    prefills = {r["scenario"]: r["kv_only_prefills"] for r in reports["."]["scenarios"]}
    assert prefills["eagle3 always-fallback stagger (T=0)"] == 2 and prefills["eagle3 KV-only transition down"] == 2
    # The prefill is on by default: an engine that does not ask for it used it in session 9's
    # run (and in 8's and 7's). Whether it does in that scenario depends on how the staggered
    # requests reach the scheduler (all at once, while the previous workload's fallback is
    # still on: yes; a few first, whose spec step turns it off: no), so it is not a claim, and
    # session 10's run (fdfb10d) has 0 there with every token and step count unchanged.
    session9 = {r["scenario"]: r["kv_only_prefills"] for r in reports["session9-25f148c"]["scenarios"]}
    assert session9["eagle3 transition down"] == 1 and prefills["eagle3 transition down"] in (0, 1)
    for run in (".", "session17-70485dd", "session16-ee9a8cf", "session15-1f22c7e", "session14-54df3f6", "session13-ea9ea95", "session10-fdfb10d", "session9-25f148c", "session8-f79ebae",
                "session7-d7cba07"):
        assert failed[run] == {}, run
    # Session 9 added the patch without the flag (the engine that crashed on its first prefill
    # before 25f148c): it ran, token-exact, and the fallback counted nothing.
    unset = [r for r in reports["."]["scenarios"] if r["config"] == "eagle3-unset"]
    assert len(unset) == 2 and all(r["ok"] and r["equal"] == r["requests"] > 0 and r["fallback_steps"] is None for r in unset)
    no_graph = "expected every KV-only draft sync replayed from its CUDA graph, got 0 of {}"
    no_prefill = "expected prefills on the KV-only draft path, got none"
    before_prefill = {"eagle3 always-fallback stagger (T=0)": [no_prefill], "eagle3 KV-only transition down": [no_prefill]}
    assert failed["session7-0574c06"] == before_prefill and failed["session6-80f522d"] == before_prefill
    assert failed["session5-85503b5"] == {"eagle3 always-fallback stagger (T=0)": [no_graph.format(40), no_prefill],
                                          "eagle3 KV-only draft sync": [no_graph.format(63)],
                                          "eagle3 KV-only transition down": [no_prefill]}
    assert failed["session5-609b3ff"] == {
        "eagle3 always-fallback stagger (T=0)": ["expected fallback steps with the KV-only draft sync, got none", no_prefill],
        "eagle3 KV-only draft sync": [no_graph.format(63)], "eagle3 KV-only transition down": [no_prefill]}


# What today's rule (every KV-only step replayed from a graph, at every TP) says of the TP=2
# runs of the trees before session 12, which ran that sync eagerly at TP>1.
EAGER_KV_ONLY_AT_TP2 = {
    "eagle3 always-fallback stagger (T=0)": ["expected every KV-only draft sync replayed from its CUDA graph, got 0 of 40"],
    "eagle3 KV-only draft sync": ["expected every KV-only draft sync replayed from its CUDA graph, got 0 of 63"],
}


def test_the_first_tensor_parallel_run_found_the_stats_file_race(tmp_path, reparse_verify):
    """The first TP=2 run (H200 x2, f79ebae): every EAGLE-3 scenario token-exact. What fails
    is the real bug it found, STANDALONE's engine crashing when both ranks wrote the stats
    file (fixed since; test_recipes_0512.test_one_rank_writes_the_stats_file), and, by
    today's rule, the KV-only sync that tree ran eagerly at TP>1 (graphs at TP=2 since
    session 12: eager, the fallback kept 0.92 of plain decoding at C=64, with them 0.97)."""
    import json
    from pathlib import Path

    run = Path(__file__).resolve().parent.parent / "results/verify-0.5.12-tp2/session8-f79ebae"
    recorded = json.loads((run / "verify-results.json").read_text())
    assert recorded["tp_size"] == 2 and recorded["model"]["key"] == ModelSpec().for_tp(2).key()
    new = reparse_verify(run, tmp_path)
    failed = {r["scenario"]: r["failures"] for r in new["scenarios"] if not r["ok"]}
    assert failed == {**EAGER_KV_ONLY_AT_TP2, **{name: ["engine standalone-t4 failed"] for name in (
        "standalone bs=1 (high acceptance)", "standalone transition down", "standalone spec-fallback-spec")}}
    exact = [r for r in new["scenarios"] if r["config"].startswith("eagle3")]
    assert len(exact) == 14 and all(r["equal"] == r["requests"] for r in exact)
    kv = {r["scenario"]: (r["kv_only_steps"], r["kv_only_graph_steps"]) for r in new["scenarios"] if r.get("kv_only_steps")}
    assert kv["eagle3 KV-only draft sync"] == (63, 0)
    assert not new["golden_problems"] and len(new["golden_skipped"]) == 2


def test_tensor_parallel_reruns_are_token_exact_and_their_eager_sync_is_named(tmp_path, reparse_verify):
    """The TP=2 runs on 25f148c (session 9, the stats file written by rank 0 only) and on
    fdfb10d (session 10): every scenario, STANDALONE included, token-exact and passing,
    except today's graph claim on the two KV-only scenarios, whose sync those trees ran
    eagerly at TP>1."""
    from pathlib import Path

    for name in ("session9-25f148c", "session10-fdfb10d"):
        run = Path(__file__).resolve().parent.parent / "results/verify-0.5.12-tp2" / name
        new = reparse_verify(run, tmp_path / name)
        assert new["tp_size"] == 2 and len(new["scenarios"]) == 19
        assert all(r["equal"] == r["requests"] > 0 for r in new["scenarios"]), name
        assert {r["scenario"]: r["failures"] for r in new["scenarios"] if not r["ok"]} == EAGER_KV_ONLY_AT_TP2, name
        standalone = [r for r in new["scenarios"] if r["config"] == "standalone-t4"]
        assert len(standalone) == 3 and sum(r["fallback_steps"] for r in standalone) > 0


def test_the_kv_only_sync_replays_its_graphs_at_tp2(tmp_path, reparse_verify):
    """Session 12's TP=2 run of the KV-only engines on 34e13b3 (graphs captured inside
    graph_capture()): token-exact against the TP=2 baselines, and every KV-only step of
    each scenario that claims it replayed from a CUDA graph."""
    from pathlib import Path

    run = Path(__file__).resolve().parent.parent / "results/verify-0.5.12-tp2/session12-34e13b3-kv-only"
    new = reparse_verify(run, tmp_path)
    assert new["tp_size"] == 2 and new["ok"] and len(new["scenarios"]) == 5
    assert all(r["ok"] and r["equal"] == r["requests"] > 0 for r in new["scenarios"])
    kv = {r["scenario"]: (r["kv_only_steps"], r["kv_only_graph_steps"]) for r in new["scenarios"] if r.get("kv_only_steps")}
    assert kv == {"eagle3 always-fallback stagger (T=0)": (40, 40), "eagle3 KV-only draft sync": (63, 63),
                  "eagle3 KV-only transition down": (73, 73), "eagle3 KV-only transition up": (32, 32)}


def test_deferred_kv_only_writes_ran_token_exact_on_the_h200(tmp_path, reparse_verify):
    """Session 22's runs of the margin-0 default (081e841: the engines that claim the full
    sync inside a margin of 8 ask for it by name), session 18's of 12d88a3 (the queue's
    counts derived from its pending lists) at TP=1 and TP=2, session 17's of 70485dd, and session 16's of ee9a8cf
    before the FutureMap views and the queue kept by reference: every scenario
    token-exact and passing; the KV-only engine wrote its 168 KV-only steps in far fewer
    replays (4 steps per replay by default), counted by cause, two of them the queue written
    before a speculative step's draft (the switch back to speculation, tokens exact), and
    deduplicated only the few queues whose steps had different batch sizes (requests
    finishing); the T=0 engine, pinned to one step per replay, replayed once per step and
    never deduplicated. Session 15's run (1f22c7e) deduplicated every queue of two or more
    steps and counted no deduplications, session 14's no causes, so this can fail."""
    root = Path(__file__).resolve().parent.parent / "results"

    def engine_stats(run, engine):  # the fallback's counters as the engine left them
        return json.loads(reparse_verify.engine_files(run)[f"{engine}.stats.json"])

    runs = (("verify-0.5.12/session22-081e841", 1), ("verify-0.5.12-tp2/session22-081e841", 2),
            ("verify-0.5.12", 1), ("verify-0.5.12-tp2/session18-12d88a3", 2),
            ("verify-0.5.12/session17-70485dd", 1), ("verify-0.5.12-tp2/session17-70485dd", 2),
            ("verify-0.5.12/session16-ee9a8cf", 1), ("verify-0.5.12-tp2/session16-ee9a8cf", 2))
    for name, tp in runs:
        run = root / name
        new = reparse_verify(run, tmp_path / name.replace("/", "-"))
        assert new["tp_size"] == tp and new["ok"] and len(new["scenarios"]) == 19
        assert all(r["ok"] and r["equal"] == r["requests"] > 0 for r in new["scenarios"]), tp
        deferred, single = engine_stats(run, "eagle3-t4-kv-only"), engine_stats(run, "eagle3-t0")
        causes = deferred["draft_kv_only_flush_causes"]
        replays = sum(causes.values())
        assert deferred["draft_kv_only_graph_steps"] == deferred["draft_kv_only_steps"] == 168
        assert replays <= 168 / 3 and causes.get("spec", 0) >= 1, (tp, causes)
        assert 1 <= deferred["draft_kv_only_dedups"] < replays / 4, "only queues of mixed batch sizes"
        assert single["draft_kv_only_flush_causes"] == {"queued": single["draft_kv_only_steps"]} == {"queued": 40}
        assert "draft_kv_only_dedups" not in single
    assert "draft_kv_only_dedups" not in engine_stats(root / "verify-0.5.12/session15-1f22c7e", "eagle3-t4-kv-only")
    assert "draft_kv_only_flush_causes" not in engine_stats(root / "verify-0.5.12/session14-54df3f6", "eagle3-t4-kv-only")


def test_a_run_cut_off_before_its_report_is_evaluated_for_its_finished_engines(tmp_path, load_tool):
    """Session 10's 0.5.17 run reached the device call's time limit after 7 of 9 engines had
    finished: their outputs, evaluated as the complete 0.5.17 run's (counters from upstream's
    log), pass the 11 scenarios they serve; the two unfinished engines are named, not failed."""
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    mod = load_tool("reparse_verify")
    shutil.copy(root / "results/verify-0.5.17/session10-partial/verify-logs.tgz", tmp_path / "verify-logs.tgz")
    assert mod.partial(tmp_path, root / "results/verify-0.5.17/verify-results.json") == 0
    rep = json.loads((tmp_path / "verify-results-partial.json").read_text())
    assert rep["ok"] and len(rep["scenarios"]) == 11 and all(r["ok"] for r in rep["scenarios"])
    assert rep["partial"]["not_finished"] == ["eagle3-t4-kv-only", "eagle3-unset"]
    transition = next(r for r in rep["scenarios"] if r["scenario"] == "eagle3 transition up")
    assert transition["fallback_steps"] == 32 and transition["spec_steps"] == 168, transition
