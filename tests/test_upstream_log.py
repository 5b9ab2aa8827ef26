"""Counters rebuilt from upstream's own log lines (where the switch is upstream's: 0.5.19+):
the scenario path checks must see the same phases the recipe's stats file would report."""

from spectool.harness.verify import compare
from spectool.harness.verify.upstream_log import stats_from_log

# Lines as SGLang 0.5.17 prints them (eagle_worker_v2.apply_runtime_state, metrics_reporter).
SPEC = "[2026-11-29 10:00:00] Decode batch, #running-req: {n}, #token: 900, token usage: 0.03, accept len: {a:.2f}, accept rate: 0.50, cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0,"
SWITCH = "[2026-11-29 10:00:00] Switch adaptive runtime state: steps {a} -> {b}, draft_tokens {c} -> {d}"


def _log(*events):
    out = []
    for e in events:
        if e[0] == "switch":
            out.append(SWITCH.format(a=e[1], b=e[2], c=e[1] + 1, d=e[2] + 1))
        else:
            out.append(SPEC.format(n=e[1], a=e[2]))
    return "\n".join(out)


def test_spec_fallback_spec_is_seen_with_per_phase_acceptance():
    log = _log(
        *[("d", 2, 4.0)] * 5,
        ("switch", 3, 0),
        ("d", 2, 4.0),
        *[("d", 10, 1.0)] * 6,
        ("switch", 0, 3),
        ("d", 10, 1.0),
        ("d", 2, 1.0),
        *[("d", 2, 3.5)] * 5,
    )
    st = stats_from_log(log, initial_steps=3)
    assert st["switches_to_fallback"] == 1 and st["switches_to_spec"] == 1
    assert [p["mode"] for p in st["phases"]] == ["spec", "fallback", "spec"]
    assert st["fallback_steps"] == 7 and st["spec_steps"] == 12
    tr = compare.transitions(st["phases"])
    assert tr["fallback_after_spec"] and tr["spec_after_fallback"]
    # Boundary lines are left out of acceptance: 4.0 before, 3.5 after (not diluted by 1.0 lines).
    assert tr["acceptance_before"] == 4.0 and tr["acceptance_after"] == 3.5
    exp = {
        "fallback_steps": "positive",
        "fallback_after_spec": True,
        "spec_after_fallback": True,
        "resume_acceptance_not_lower": True,
    }
    assert compare.check_expectations(exp, st) == [
        "acceptance after speculation resumed (3.50) is below before the fallback (4.00): stale draft KV?"
    ]


def test_windows_between_snapshots_and_threshold_zero():
    first = _log(("switch", 3, 0), *[("d", 8, 1.0)] * 4)
    second = first + "\n" + _log(*[("d", 12, 1.0)] * 3)
    before, after = stats_from_log(first, 3), stats_from_log(second, 3)
    window = compare.stats_window(before, after)
    assert window["fallback_steps"] == 3 and window["spec_steps"] == 0
    assert compare.check_expectations({"fallback_steps": "all"}, window) == []
    assert compare.check_expectations({"fallback_steps": "zero"}, window) == ["expected no fallback steps, got 3"]


def test_no_switch_lines_means_no_fallback():
    st = stats_from_log(_log(*[("d", 3, 2.0)] * 4) + "\nunrelated line\n", 3)
    assert st["fallback_steps"] == 0 and st["spec_steps"] == 4
    assert compare.acceptance(st["phases"]) == 2.0


def test_real_0517_log_gives_the_recipes_counters():
    """The log of the H200 run (0.5.17, upstream's switch, T=4), cut at the workload bounds the
    run recorded: the rebuilt counters equal, workload by workload, what spectool's own stats
    file counted for the same scenarios on 0.5.12. Both orders of switch and decode line occur
    in it (after a prefill and mid-decode)."""
    import json
    from pathlib import Path

    from spectool.harness.verify.upstream_log import stats_at_decode_line

    fx = Path(__file__).parent / "fixtures" / "upstream-0.5.17"
    lines = (fx / "eagle3-t4.log").read_text().splitlines()
    meta = json.loads((fx / "eagle3-t4.json").read_text())

    got = {}
    for name, (b, a) in meta["decode_lines_at_workload_bounds"].items():
        w = compare.stats_window(
            stats_at_decode_line(lines, b, 3, threshold=4), stats_at_decode_line(lines, a, 3, threshold=4)
        )
        got[name] = [w["fallback_steps"], w["spec_steps"]]
    assert got == meta["recipe_counters_0.5.12"]


def test_switch_right_after_a_prefill_counts_the_next_line_as_the_new_tier():
    """T=0: the first decode step after the prefill already runs at steps 0 (no decode was in
    flight when it switched), so a workload is all fallback, as `Expect("all")` requires."""
    log = "\n".join(
        [SWITCH.format(a=3, b=0, c=4, d=1), "[x] Prefill batch, #new-seq: 8, #new-token: 300, #running-req: 0"]
        + [SPEC.format(n=8, a=1.0)] * 5
    )
    st = stats_from_log(log, 3, threshold=0)
    assert st["fallback_steps"] == 5 and st["spec_steps"] == 0
    assert compare.check_expectations({"fallback_steps": "all"}, st) == []


def test_log_counters_pass_the_scenarios_claims_on_the_real_0517_log(tmp_path, monkeypatch):
    """The 0.5.17 log excerpt, cut at the workload bounds the run recorded, as the snapshots
    of engine eagle3-t4's workloads: evaluated with counters from the log, every scenario of
    that engine's recorded workloads passes its path claims, with the recipe's step counts on
    0.5.12. That run drafted with a random EAGLE-3 head (acceptance about 1), so the floors
    the trained head is held to are left out here."""
    import dataclasses
    import json
    from pathlib import Path

    from spectool.harness.verify import runner, scenarios
    from spectool.harness.verify.upstream_log import stats_at_decode_line

    fx = Path(__file__).parent / "fixtures" / "upstream-0.5.17"
    lines = (fx / "eagle3-t4.log").read_text().splitlines()
    meta = json.loads((fx / "eagle3-t4.json").read_text())
    wls = scenarios.workloads()
    cfgs = [c for c in scenarios.configs() if c.name in ("base-graph", "eagle3-t4")]

    bounds = meta["decode_lines_at_workload_bounds"]
    cfgs = [dataclasses.replace(c, workloads=[w for w in c.workloads if w in bounds]) for c in cfgs]
    recorded = scenarios.scenarios()
    monkeypatch.setattr(
        scenarios,
        "scenarios",
        lambda: [
            dataclasses.replace(s, expect=dataclasses.replace(s.expect, min_acceptance=None, min_acceptance_after=None))
            for s in recorded
            if s.workload in bounds
        ],
    )
    snapshots = {
        w: {
            "stats_before": stats_at_decode_line(lines, b, 3, threshold=4),
            "stats_after": stats_at_decode_line(lines, a, 3, threshold=4),
        }
        for w, (b, a) in bounds.items()
    }
    results = {
        c.name: {
            "ok": True,
            "workloads": {
                w: {
                    "requests": [
                        {"index": i, "output_ids": [i] * r.max_new_tokens} for i, r in enumerate(wls[w].requests)
                    ],
                    "seconds": 1.0,
                    **(snapshots[w] if c.algorithm else {}),
                }
                for w in c.workloads
            },
        }
        for c in cfgs
    }
    report = runner.evaluate(
        results,
        cfgs,
        wls,
        {"meta": {"key": "stand-in"}},
        "0.5.17",
        "sm90",
        "H200",
        tmp_path,
        False,
        recipe_counters=False,
    )
    rows = {r["workload"]: r for r in report["scenarios"]}
    assert report["ok"] and set(rows) == set(bounds), [r["failures"] for r in report["scenarios"]]
    assert {w: [r["fallback_steps"], r["spec_steps"]] for w, r in rows.items()} == meta["recipe_counters_0.5.12"]


def test_verify_plans_log_counters_and_skips_only_on_upstream_switch_releases(
    cached_release, patched_release, tmp_path
):
    """On the real releases: 0.5.12 and 0.5.17 (spectool's fallback) read their stats files and
    run every configuration; 0.5.19 (upstream's switch) reads the engine logs, passes the threshold to the
    parser, and skips STANDALONE with the reason. An unpatched tree is refused before any GPU probe."""
    import pytest as _pytest

    from spectool.errors import BadInputError
    from spectool.harness.verify import runner, scenarios

    models = {"target": "t", "eagle3_draft": "d", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {"key": "m"}}}
    wls = scenarios.workloads()
    assert runner.kept_speculative(str(patched_release("0.5.14"))) == {"grammar", "logprob", "hidden_states"}
    for version, upstream in (("0.5.12", False), ("0.5.17", False), ("0.5.19", True)):
        with _pytest.raises(BadInputError, match="is not patched"):
            runner.inspect_tree(str(cached_release(version)), {})
        tree = patched_release(version)
        env = {}
        got_version, switch = runner.inspect_tree(str(tree), env)
        assert (got_version, switch) == (version, upstream) and env["PYTHONPATH"].startswith(str(tree))
        # The request kinds each release's fallback keeps speculating, read from its rule (the
        # seed era's, which 0.5.13-0.5.15 keep, below).
        assert runner.kept_speculative(str(tree)) == {"0.5.12": set(), "0.5.17": {"grammar"}, "0.5.19": set()}[version]
        tiers = runner.has_tiers(str(tree))
        assert tiers == (version != "0.5.19")  # the recipes add --speculative-num-steps-tiers up to 0.5.18
        jobs, cfgs, skipped = runner.plan_jobs(scenarios.configs(), wls, models, tmp_path, version, switch, tiers=tiers)
        spec_jobs = [j for j in jobs if j["config"]["algorithm"]]
        assert "needs --sglang-dir" in skipped.pop("eagle3-stock")  # no stock copy was made
        tier_engines = [c.name for c in scenarios.configs() if c.tiers]
        assert len(tier_engines) == 3
        if not tiers:
            for name in tier_engines:
                assert "no --speculative-num-steps-tiers" in skipped.pop(name)
            assert all(not c.tiers for c in cfgs)
        if upstream:
            assert set(skipped) == {"standalone-t4", "standalone-t4-hidden"}
            assert all("EAGLE/EAGLE3 only" in why for why in skipped.values())
            assert all(
                j["observe"] == "log" and j["log_path"].endswith(f"{j['config']['name']}.log") for j in spec_jobs
            )
        else:
            assert skipped == {} and len(cfgs) == len(scenarios.configs()) - 1 - len(tier_engines) * (not tiers)
            assert all("observe" not in j and j["stats_path"] for j in spec_jobs)


def test_a_stock_engine_imports_the_release_as_published(cached_release, patched_release, tmp_path):
    """The stock copy of a patched 0.5.12 holds every patched file as the release published it
    (the patched tree keeps its patches), and its engine imports that copy first, without a
    counters file; a tree spectool never patched is refused in one paragraph."""
    import pytest as _pytest

    from spectool import lockfile
    from spectool.errors import BadInputError
    from spectool.harness.verify import runner, scenarios
    from spectool.harness.verify.stock import stock_copy

    tree, release = patched_release("0.5.12"), cached_release("0.5.12")
    stock = stock_copy(str(tree), tmp_path / "stock")
    patched = lockfile.read(tree).lock.files
    assert patched
    for rel in patched:
        assert (stock / rel).read_bytes() == (release / rel).read_bytes() != (tree / rel).read_bytes(), rel
    with _pytest.raises(BadInputError, match="was never patched by spectool"):
        stock_copy(str(release), tmp_path / "other")
    models = {"target": "t", "eagle3_draft": "d", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {"key": "m"}}}
    cfgs = runner.select_configs(["eagle3-stock"])
    jobs, _, skipped = runner.plan_jobs(
        cfgs, scenarios.workloads(), models, tmp_path, "0.5.12", False, stock_root=stock
    )
    (job,) = [j for j in jobs if j["config"]["name"] == "eagle3-stock"]
    assert skipped == {} and job["python_path"] == str(stock) and job["stats_path"] is None
