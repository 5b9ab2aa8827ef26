"""The published measurements (results/, see results/README.md) regenerate from their raw data
with the current code: each bench folder's table and report from its cells and transition,
the profile's table from its reduced windows, the comparison with upstream's switch from
the two sweeps, and each golden verify run's token comparisons and step counters from its
engines' outputs. No number is typed in here: a change to the analysis that would change a
published figure fails this test, and the folder is then regenerated or measured again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spectool.harness.bench import analyze, profile
from spectool.harness.bench.results import summarize
from spectool.harness.verify import compare, scenarios
from spectool.harness.verify.upstream_log import stats_at_decode_line

RESULTS = Path(__file__).resolve().parent.parent / "results"
BENCH = sorted(p.parent for p in RESULTS.glob("*/*/bench-*/bench-results.json"))
PROFILES = sorted(p.parent for p in RESULTS.glob("*/*/bench-*/profile.json"))
VERIFY = sorted(p.parent for p in RESULTS.glob("*/*/verify-*/verify-results.json"))
ANALYSIS = ("cells", "ratios", "ratio_intervals_90", "per_run_ratios", "suggested_threshold", "transition")


def _name(folder: Path) -> str:
    return str(folder.relative_to(RESULTS))


def test_the_published_folders_are_there():
    assert BENCH and PROFILES and VERIFY
    assert all(
        re.fullmatch(r"\d+\.\d+\.\d+/[a-z0-9]+/(bench|verify)-[a-z0-9-]+", _name(f)) for f in BENCH + PROFILES + VERIFY
    )


@pytest.mark.parametrize("folder", BENCH, ids=_name)
def test_a_bench_folder_regenerates_from_its_cells(folder, tmp_path):
    report = analyze.read_json(folder / "bench-results.json")
    cells = analyze.read_cells(folder / "cells.jsonl") if (folder / "cells.jsonl").exists() else []
    trans = analyze.read_json(folder / "transition.json") if (folder / "transition.json").exists() else None
    extra = {"merged_from": report["merged_from"]} if "merged_from" in report else {}
    new = summarize(
        tmp_path,
        cells,
        report["concurrencies"],
        report["threshold"],
        report["acc_len"],
        trans,
        report.get("startup_s") or {},
        report.get("sglang_version"),
        report.get("gpu"),
        load=report.get("load", "lockstep"),
        extra=extra,
    )
    assert json.loads(json.dumps({k: new.get(k) for k in ANALYSIS})) == {k: report.get(k) for k in ANALYSIS}
    assert (tmp_path / "bench-table.md").read_text() == (folder / "bench-table.md").read_text()


@pytest.mark.parametrize("folder", PROFILES, ids=_name)
def test_a_profiles_table_regenerates_from_its_reduced_windows(folder):
    rows = {}
    for key, row in json.loads((folder / "profile.json").read_text())["rows"].items():
        arm, C, wave = re.fullmatch(r"(\w+)@(\d+)(?:#(\d+))?", key).groups()
        rows[(arm, int(C), int(wave) - 1 if wave else 0)] = row
    assert profile.markdown(rows) == (folder / "profile.md").read_text()


def test_the_comparison_with_upstreams_switch_regenerates(load_tool):
    tool = load_tool("compare_upstream")
    assert all((folder / "cells.jsonl").exists() for folder in tool.NAMES.values())
    assert tool.comparison_markdown() == (tool.UPSTREAM / "comparison.md").read_text()
    assert tool.tiers_comparison()[0] == (tool.TIERS / "comparison-tiers.md").read_text()
    assert tool.same_run_markdown() == (tool.SAME_RUN / "comparison.md").read_text()


def test_the_tiers_across_acceptances_regenerate(load_tool):
    tool = load_tool("compare_upstream")
    for pair in tool.ACCEPTANCE_PAIRS.values():
        assert tool.cross_acceptance_markdown(pair) == (pair[2.0] / "cross-acceptance.md").read_text()


def test_every_tiers_sweeps_goals_table_regenerates(load_tool):
    tool = load_tool("compare_upstream")
    for folder in tool.TIER_SWEEPS:
        assert tool.tier_goals_markdown(folder) == (folder / "goals.md").read_text()


@pytest.mark.parametrize("folder", VERIFY, ids=_name)
def test_a_verify_runs_rows_regenerate_from_its_engines_outputs(folder, load_tool):
    """Every scenario of the run, passed or failed: its tokens compared again with the
    run's baseline engine of the same settings, its step counters taken again from the
    engine's snapshots (rebuilt from the engine's log where the switch is upstream's), and
    the baselines of the workloads the tables still define compared with the golden file."""
    report = json.loads((folder / "verify-results.json").read_text())
    outs, logs = load_tool("evaluate_verify_run").engine_outputs(folder)
    cfgs = {c.name: c for c in scenarios.configs()}
    from_log = report["counters_from"].startswith("engine log")
    wls = scenarios.workloads()
    assert report["scenarios"] and report["ok"] == all(row["ok"] for row in report["scenarios"])
    for row in report["scenarios"]:
        if row.get("skipped"):
            continue
        cfg, w = cfgs[row["config"]], row["workload"]
        base = next(
            b
            for b in cfgs.values()
            if b.algorithm is None
            and b.settings_key == cfg.settings_key
            and w in outs.get(b.name, {}).get("workloads", {})
        )
        cand = outs[cfg.name]["workloads"][w]
        ref = outs[row["reference"]] if row.get("reference") else outs[base.name]  # the release as published
        cmp = compare.compare_tokens(ref["workloads"][w]["requests"], cand["requests"])
        assert (cmp.requests, cmp.equal, cmp.tokens) == (row["requests"], row["equal"], row["tokens"]), row["scenario"]
        before, after = cand["stats_before"], cand["stats_after"]
        if from_log:
            before, after = (
                stats_at_decode_line(
                    logs[cfg.name], snap.get("fallback_steps", 0) + snap.get("spec_steps", 0), 3, cfg.threshold
                )
                for snap in (before, after)
            )
        window = compare.stats_window(before, after)
        counted = compare.counted_steps(window) > 0
        assert (window["fallback_steps"] if counted else None, window["spec_steps"] if counted else None) == (
            row["fallback_steps"],
            row["spec_steps"],
        ), row["scenario"]
        assert [window[k] for k in ("draft_kv_only_steps", "draft_kv_only_graph_steps", "draft_kv_only_prefills")] == [
            row["kv_only_steps"],
            row["kv_only_graph_steps"],
            row["kv_only_prefills"],
        ], row["scenario"]
    assert not Path(report["golden_file"]).is_absolute()  # the repository's file, wherever it is checked out
    golden_file = RESULTS.parent / report["golden_file"]
    golden = json.loads(golden_file.read_text())
    if golden["model"]["key"] != report["model"]["key"]:  # TP>1 runs their own model
        return
    baselines = {
        (cfgs[name].golden_key(w), w): out["workloads"][w]["requests"]
        for name, out in outs.items()
        if name in cfgs and cfgs[name].algorithm is None  # not the jobs that train a model
        for w in out["workloads"]
        if w in wls
    }
    for (key, w), requests in baselines.items():
        assert compare.compare_to_golden(golden, key, [r.prompt for r in wls[w].requests], requests) == [], key


def test_a_run_evaluated_again_skips_the_engines_its_report_skipped_and_only_those(load_tool):
    """The engines a run skipped, read back from its report's rows: a row skipped for its
    reference names the reference's reason, so the engine of that row (which ran) is
    evaluated, and an engine with outputs is never taken for skipped."""
    tool = load_tool("evaluate_verify_run")
    rows = [
        {"config": "eagle3-unset", "skipped": "its reference eagle3-stock: no saved originals"},
        {"config": "standalone-t4", "skipped": "SGLang 0.5.17 refuses the flag for STANDALONE"},
        {"config": "eagle3-t4", "skipped": "not run"},
        {"config": "eagle3-t0"},
    ]
    outs = {"eagle3-unset": {}, "eagle3-t4": {}, "eagle3-t0": {}}
    assert tool.engine_skips(rows, outs) == {
        "eagle3-stock": "no saved originals",
        "standalone-t4": "SGLang 0.5.17 refuses the flag for STANDALONE",
    }
