"""Bench analysis on synthetic cells (no GPU): envelope, ratios, intervals, per-run ratios and
their sign tests, the threshold rule, tables, merges, the transition summary and the plot.
Every expected value is derived by hand from the cells below."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from spectool.harness.bench import analyze
from spectool.harness.bench.results import summarize
from spectool.harness.bench.sweep import DEFAULT_C

# A sweep whose medians are easy to divide: A0 serves 100 tokens/s per request, EAGLE-3 (A1)
# 150 up to C=32 and 80 from 64 on, the patch (A2, T=32) 147 and 99 (A2/E 0.98 and 0.99),
# the always-fallback arm (A4) 97 (A4/A0 0.97). Up to three reps: 1x, 0.99x, 1.01x the median.
PER_REQUEST = {
    "A0": lambda C: 100,
    "A1": lambda C: 150 if C <= 32 else 80,
    "A2": lambda C: 147 if C <= 32 else 99,
    "A4": lambda C: 97,
}
SPREAD = (1.0, 0.99, 1.01)


# ServerArgs fields as the bench reads them from the SGLang under test (field -> type).
SERVER_ARGS = {
    "speculative_disable_draft_decode_min_bs": "Optional[int]",
    "speculative_disable_kv_only_margin": "Optional[int]",
    "speculative_disable_kv_only_steps_per_replay": "int",
    "attention_backend": "Optional[str]",
}


def cell(arm, C, tok_s, rep=0, **fields):
    return {
        "arm": arm,
        "C": C,
        "rep": rep,
        "acc_len": 3.0,
        "output_tok_s": tok_s,
        "tpot_ms": 5.0,
        "ttft_ms": 100.0,
        "stagger": False,
        **fields,
    }


def _sweep(concurrencies=DEFAULT_C, arms=("A0", "A1", "A2", "A4"), reps=3):
    cells = []
    for rep in range(reps):
        for C in concurrencies:
            for arm in arms:
                extra = {"acceptance": 3.0} if arm == "A1" else {}
                if arm == "A2":
                    extra = {"spec_fraction": 1.0 if C <= 32 else 0.0}
                cells.append(cell(arm, C, PER_REQUEST[arm](C) * C * SPREAD[rep % 3], rep, **extra))
    return cells


def _transition(ratios, low=1000.0, high=10000.0, **phase_fields):
    """A transition result as the sweep records it: five phases at C = 4, 192, 4, 192, 4, each
    at `ratio` times its reference, the references run before and after at `low` and `high`."""
    refs = {"4": low, "192": high}
    phases = [{"C": C, "output_tok_s": r * refs[str(C)], **phase_fields} for C, r in zip((4, 192, 4, 192, 4), ratios)]
    return {
        "phases": phases,
        "reference_records": {C: [{"output_tok_s": v}, {"output_tok_s": v}] for C, v in refs.items()},
    }


def _folder(path: Path, cells, threshold=32, transition=None, **report):
    """A bench results folder: cells.jsonl, bench-results.json, transition.json if given."""
    path.mkdir(parents=True)
    if cells:
        (path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    (path / "bench-results.json").write_text(
        json.dumps({"sglang_version": "0.5.12", "gpu": "NVIDIA H200", "threshold": threshold, **report})
    )
    if transition:
        (path / "transition.json").write_text(json.dumps(transition))
    return path


def test_envelope_and_ratios():
    m = analyze.medians(_sweep())
    assert m[("A0", 64)] == {
        "median": 6400,
        "min": 6336,
        "max": 6464,
        "reps": 3,
        "tpot_ms": 5.0,
        "ttft_ms": 100.0,
        "acceptance": None,
        "spec_fraction": None,
    }
    env = analyze.envelope(m, DEFAULT_C)
    assert env == {C: (150 if C <= 32 else 100) * C for C in DEFAULT_C}, "E = max(A0, A1)"
    r = analyze.ratios(m, DEFAULT_C)
    for C in DEFAULT_C:
        assert r[C]["A2/E"] == pytest.approx(0.98 if C <= 32 else 0.99)
        assert r[C]["A2/A0"] == pytest.approx(1.47 if C <= 32 else 0.99)
        assert r[C]["A4/A0"] == pytest.approx(0.97) and r[C]["A1/A0"] == pytest.approx(1.5 if C <= 32 else 0.8)
        assert "A3/A1" not in r[C], "no A3 measured"
    assert analyze.ratios(analyze.medians(_sweep(arms=("A0", "A2"))), [64])[64] == {
        "E": None,
        "A2/A0": pytest.approx(0.99),
    }


def test_medians_keep_one_acceptance():
    """Cells of another acceptance are left out when one is asked for; cells without the field
    count as the one asked for."""
    cells = (
        _sweep([64], ("A0",))
        + [cell("A0", 64, 1.0, acc_len=2.0)]
        + [{"arm": "A0", "C": 64, "rep": 9, "output_tok_s": 6400}]
    )
    assert analyze.medians(cells, 3.0)[("A0", 64)]["reps"] == 4
    assert (analyze.medians(cells, 2.0)[("A0", 64)]["reps"], analyze.medians(cells, 2.0)[("A0", 64)]["min"]) == (2, 1.0)
    assert analyze.medians(cells)[("A0", 64)]["reps"] == 5


def test_threshold_rule():
    """EAGLE-3 wins up to C=32 and loses from 64: T=32, and the crossover between 32 and 64
    (more than 25% apart) is to be measured at 40, 48, 56."""
    s = analyze.suggest_threshold(analyze.medians(_sweep()), DEFAULT_C)
    assert (s["threshold"], s["wins"], s["loses"], s["refine"]) == (
        32,
        [1, 2, 4, 8, 16, 32],
        [64, 128, 256],
        [40, 48, 56],
    )
    assert s["why"].startswith("EAGLE-3 is at least as fast as plain decoding up to C=32 and slower above")


def test_synthetic_rule_cases():
    def mk(pairs):
        return {(a, C): {"median": v} for C, (x, y) in pairs.items() for a, v in (("A0", x), ("A1", y))}

    assert analyze.suggest_threshold(mk({1: (1, 2), 2: (1, 2), 4: (2, 1)}), [1, 2, 4])["threshold"] == 2
    assert analyze.suggest_threshold(mk({1: (2, 1), 2: (2, 1)}), [1, 2])["threshold"] == 0
    assert analyze.suggest_threshold(mk({1: (1, 2), 2: (1, 2)}), [1, 2])["threshold"] == 2
    always = analyze.suggest_threshold(mk({1: (1, 2), 2: (1, 2)}), [1, 2])
    assert "every C measured (up to 2): measure above C=2" in always["why"], "no loss measured: no 'slower above'"
    only_a0 = {("A0", C): {"median": 1.0} for C in (1, 2)}
    assert analyze.suggest_threshold(only_a0, [1, 2])["threshold"] is None, "one arm alone: no T, not 0"
    # A win after the first loss does not move T: the rule stops at the first loss.
    assert analyze.suggest_threshold(mk({1: (1, 2), 2: (2, 1), 4: (1, 2)}), [1, 2, 4])["threshold"] == 1


def test_the_rule_names_the_request_counts_to_measure_between_its_last_win_and_first_loss():
    """A grid step of more than 25% leaves the crossover unplaced: the rule lists three
    counts between (none once the two are within 25%, or where nothing was lost)."""

    def mk(pairs):
        return {(a, C): {"median": v} for C, (x, y) in pairs.items() for a, v in (("A0", x), ("A1", y))}

    wide = analyze.suggest_threshold(mk({16: (1, 2), 32: (1, 2), 64: (2, 1)}), [16, 32, 64])
    assert (wide["threshold"], wide["refine"]) == (32, [40, 48, 56])
    assert analyze.suggest_threshold(mk({16: (1, 2), 32: (1, 2), 64: (2, 1)}), [64, 16, 32]) == wide, "walks up C"
    assert "measure --concurrency 40,48,56 --arms A0,A1" in wide["why"]
    assert analyze.suggest_threshold(mk({48: (1, 2), 56: (2, 1)}), [48, 56])["refine"] == []
    assert analyze.suggest_threshold(mk({1: (1, 2), 2: (1, 2)}), [1, 2])["refine"] == []
    assert analyze.suggest_threshold(mk({1: (2, 1), 2: (2, 1)}), [1, 2])["refine"] == []
    assert analyze.refine_between(2, 4) == [3] and analyze.refine_between(1, 2) == []


def _configs(per_c):
    """Medians of fixed configurations: C -> (no spec, 1 step, 2 steps, 3 steps) tok/s."""
    arms = ("A0", "S1", "S2", "A1")
    return {(a, C): {"median": v} for C, vals in per_c.items() for a, v in zip(arms, vals)}


def test_the_tier_rule_takes_the_fastest_configuration_and_only_shortens_the_draft():
    """3 steps win up to C=8, 2 at 16, 1 from 32 to 48, no speculation from 64: tiers 3,2,1,0
    at the last C of each (8, 16, 48), as T is the last C at which speculation wins; the
    gaps of more than 25% between a boundary and the next C name the counts to measure."""
    m = _configs(
        {
            1: (100, 150, 180, 200),
            8: (100, 140, 170, 180),
            16: (100, 130, 150, 140),
            32: (100, 120, 110, 90),
            48: (100, 105, 100, 80),
            64: (100, 95, 90, 70),
            128: (100, 90, 80, 60),
        }
    )
    res = analyze.suggest_tiers(m, [128, 1, 8, 16, 32, 48, 64])
    assert (res["tiers"], res["boundaries"]) == ([3, 2, 1, 0], [8, 16, 48])
    assert res["flags"] == (
        "--speculative-num-steps 3 --speculative-num-steps-tiers 3,2,1,0 --speculative-num-steps-tier-boundaries 8,16,48"
    )
    assert [r["tier"] for r in res["rows"]] == [3, 3, 2, 1, 1, 0, 0]
    # The arm that measures these tiers: A2 (the fallback is the last tier, at threshold 48).
    assert (res["threshold"], res["variant"]) == (
        48,
        "TIER3-2-1-0_8-16-48=A2:speculative_num_steps=3;speculative_num_draft_tokens=4;"
        "speculative_num_steps_tiers=3,2,1,0;speculative_num_steps_tier_boundaries=8,16,48",
    )
    assert res["refine"] == {8: [10, 12, 14], 16: [20, 24, 28], 48: [52, 56, 60]} and res["against_the_rule"] == []
    assert res["why"].startswith(
        "3 draft steps up to C=8, 2 draft steps up to C=16, 1 draft step up to C=48, no speculation above"
    )
    table = analyze.tiers_markdown(res)
    assert table.splitlines()[0] == "| C | 3 steps (A1) | 2 steps (S2) | 1 step (S1) | 0 steps (A0) | fastest | tier |"
    assert "| 16 | 140 | 150 | 130 | 100 | 2 | 2 |" in table


def _upstream_adaptive_params(release: Path):
    """SGLang's own AdaptiveSpeculativeParams, from the release's source (its one SGLang
    import, a rank-0 logger, given here)."""
    path = release / "sglang/srt/speculative/adaptive_spec_params.py"
    source = path.read_text().replace("from sglang.srt.utils import log_info_on_rank0\n", "")
    ns = {"__name__": "adaptive_spec_params", "log_info_on_rank0": lambda *args: None}
    exec(compile(source, str(path), "exec"), ns)
    return ns["AdaptiveSpeculativeParams"]


@pytest.mark.parametrize("version", ["0.5.16", "0.5.17", "0.5.18"])
def test_upstreams_other_adaptive_states_capture_the_draft_extend_at_their_width_but_on_0517(cached_release, version):
    """Why --suggest-tiers says upstream's states other than the start-up one run their draft
    extend eagerly on 0.5.17 only: there the draft-extend graph runner sizes its capture from
    server_args, which the adaptive capture override leaves as it was; 0.5.16 overrides
    server_args itself, 0.5.18 sizes from the override."""
    spec = cached_release(version) / "sglang/srt/speculative"
    worker = (spec / "eagle_worker_v2.py").read_text()
    override = worker[worker.index("def _override_worker_state") :][:3000]
    runner = (spec / "eagle_draft_extend_cuda_graph_runner.py").read_text()
    utils = (spec / "spec_utils.py").read_text()
    resolve = utils[utils.index("def resolve_num_tokens_per_req") :][:1500]
    reads_server_args = "server_args=model_runner.server_args" in runner and (
        "return server_args.speculative_num_draft_tokens" in resolve
    )
    overrides_server_args = "sa.override(" in override
    eager_on_this_release = reads_server_args and not overrides_server_args
    assert eager_on_this_release == (version == "0.5.17")
    assert analyze.upstream_eager_draft_extend([2, 3, 2, 0]) == [3]
    assert analyze.upstream_eager_draft_extend([2, 0]) == []
    assert analyze.upstream_eager_draft_extend([3, 1, 0]) == [1]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.17"])
def test_the_tiers_as_upstreams_adaptive_config_route_every_batch_alike(cached_release, tmp_path, version):
    """--suggest-tiers also gives the schedule as SGLang's own adaptive steps take it: read by
    the release's own loader and router (batches padded to the CUDA-graph sizes), every batch size
    gets the step count of spectool's tier, the start-up count is a candidate, and the
    acceptance EMA has no other candidate to move to."""
    m = _configs({C: (100, 120, 150, 200) if C <= 16 else (100, 130, 90, 80) for C in (1, 16, 32, 48)})
    m.update(_configs({C: (100, 90, 80, 70) for C in (64, 256)}))
    res = analyze.suggest_tiers(m, [1, 16, 32, 48, 64, 256])
    assert (res["tiers"], res["boundaries"]) == ([3, 1, 0], [16, 48])
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(res["upstream_adaptive_config"]))
    params = _upstream_adaptive_params(cached_release(version))(initial_steps=res["tiers"][0], cfg_path=str(path))
    assert params.candidate_steps == [0, 1, 3]
    assert all(len(slot.candidate_steps) == 1 for slot in params._slots.values())
    expected = {bs: 3 if bs <= 16 else 1 if bs <= 48 else 0 for bs in range(1, 257)}
    # By the batch size (the engines' case: no --cuda-graph-bs-decode), and by the speculative
    # CUDA-graph size a batch pads to, where both boundaries are graph sizes.
    for graph_sizes in (None, [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8)]):
        params.set_cuda_graph_bs(graph_sizes)
        assert {bs: params.get_steps_for_batch(bs) for bs in range(1, 257)} == expected
    # A boundary between two graph sizes moves down to the smaller when batches pad (as documented).
    path.write_text(json.dumps(analyze.upstream_adaptive_config([3, 0], [36])))
    params = _upstream_adaptive_params(cached_release(version))(initial_steps=3, cfg_path=str(path))
    params.set_cuda_graph_bs([32, 40])
    assert [params.get_steps_for_batch(bs) for bs in (32, 33, 36, 37)] == [3, 0, 0, 0]
    # Tiers whose draft comes back longer (2,3,2,0): the release routes each batch to its tier's
    # count, starting in the first tier's.
    path.write_text(json.dumps(analyze.upstream_adaptive_config([2, 3, 2, 0], [16, 32, 48])))
    params = _upstream_adaptive_params(cached_release(version))(initial_steps=2, cfg_path=str(path))
    params.set_cuda_graph_bs(None)
    assert params.candidate_steps == [0, 2, 3]
    assert {bs: params.get_steps_for_batch(bs) for bs in range(1, 65)} == {
        bs: 2 if bs <= 16 else 3 if bs <= 32 else 2 if bs <= 48 else 0 for bs in range(1, 65)
    }
    assert analyze.upstream_adaptive_config([2], []) is None
    assert analyze.upstream_variant([2, 0], [48], "/tmp/up.json") == (
        "UP2-0_48=A1:speculative_num_steps=2;speculative_num_draft_tokens=3;"
        "speculative_adaptive=true;speculative_adaptive_config=/tmp/up.json"
    )


def test_the_tier_rule_on_ties_noise_and_missing_arms():
    # Ties keep the longer draft; a longer draft winning after a shorter one took over is
    # served (3 steps again at C=8); a draft winning after plain decoding took over is listed,
    # and the tier stays plain decoding, the fallback's, the last.
    m = _configs({1: (100, 120, 150, 150), 4: (100, 130, 120, 110), 8: (100, 110, 105, 130), 16: (120, 100, 90, 80)})
    res = analyze.suggest_tiers(m, [1, 4, 8, 16])
    assert (res["tiers"], res["boundaries"], res["against_the_rule"]) == ([3, 1, 3, 0], [1, 4, 8], [])
    assert res["flags"] == (
        "--speculative-num-steps 3 --speculative-num-steps-tiers 3,1,3,0 --speculative-num-steps-tier-boundaries 1,4,8"
    )
    assert res["longer_again"] == [{"C": 8, "steps": 3, "after": 1, "lead": pytest.approx(130 / 110 - 1)}]
    late = analyze.suggest_tiers({**m, **_configs({32: (100, 90, 120, 110)})}, [1, 4, 8, 16, 32])
    assert (late["tiers"], late["boundaries"], late["against_the_rule"]) == ([3, 1, 3, 0], [1, 4, 8], [32])
    # Only A0 and A1 measured: the threshold's rule (T = 32 on this sweep), as flags for tiers.
    only = {k: v for k, v in m.items() if k[0] in ("A0", "A1")}
    assert analyze.suggest_tiers(only, [1, 4, 8, 16])["arms"] == {3: "A1", 0: "A0"}
    sweep = analyze.medians(_sweep())
    both = analyze.suggest_tiers(sweep, DEFAULT_C)
    assert (both["tiers"], both["boundaries"]) == ([3, 0], [analyze.suggest_threshold(sweep, DEFAULT_C)["threshold"]])
    # One configuration fastest everywhere: no tiers, no flags; speculation never winning says so.
    one = analyze.suggest_tiers(_configs({1: (100, 110, 120, 130), 8: (100, 105, 110, 115)}), [1, 8])
    assert (one["tiers"], one["flags"]) == ([3], None) and one["why"].startswith("3 draft steps is the fastest")
    assert (one["threshold"], one["variant"]) == (None, None)
    # Tiers without the fallback are measured on A1, with no threshold.
    assert analyze.tier_variant([2, 1], [16]) == (
        None,
        "TIER2-1_16=A1:speculative_num_steps=2;speculative_num_draft_tokens=3;"
        "speculative_num_steps_tiers=2,1;speculative_num_steps_tier_boundaries=16",
    )
    never = analyze.suggest_tiers(_configs({1: (100, 90, 80, 70)}), [1])
    assert never["tiers"] == [0]
    assert never["why"] == "speculation is slower than plain decoding at every C measured: serve without speculation"
    # Plain decoding leads at C=1 and a draft at C=32: the rule keeps plain decoding (the
    # fallback is the last tier), and says that it is the rule, naming what is faster where
    # (never "speculation never wins").
    kept = analyze.suggest_tiers(_configs({1: (100, 90, 80, 70), 32: (100, 90, 120, 110)}), [1, 32])
    assert kept["tiers"] == [0] and kept["against_the_rule"] == [32]
    assert kept["why"] == (
        "the rule keeps no speculation at every C measured, since it leads at C=1 and the rule drafts no more "
        "after plain decoding: serve without speculation; faster there: 2 draft steps at C=32"
    )
    assert analyze.suggest_threshold(_configs({1: (100, 90, 80, 70), 32: (100, 90, 80, 120)}), [1, 32])["why"] == (
        "the rule keeps plain decoding at every C measured, since it leads at C=1 and the rule drafts no more "
        "after plain decoding: always fall back; faster there: EAGLE-3 at C=32"
    )
    # Other arm names, given.
    named = {
        ("base", 1): {"median": 1},
        ("two", 1): {"median": 2},
        ("base", 2): {"median": 2},
        ("two", 2): {"median": 1},
    }
    assert analyze.suggest_tiers(named, [1, 2], {0: "base", 2: "two"})["tiers"] == [2, 0]
    # A C where an arm is missing does not count.
    gap = _configs({1: (100, 120, 150, 150), 4: (100, 130, 120, 110)})
    del gap[("S2", 4)]
    assert [r["C"] for r in analyze.suggest_tiers(gap, [1, 4])["rows"]] == [1]


def _run_cells(speeds: dict, **tags) -> list[dict]:
    """Cells of one run: arm -> C -> the tok/s of its repetitions, each cell tagged (its
    `source` folder, or its --fresh-engines `engines`)."""
    return [
        {"arm": arm, "C": C, "rep": i, "acc_len": 3.0, "output_tok_s": v, **tags}
        for arm, by_c in speeds.items()
        for C, vs in by_c.items()
        for i, v in enumerate(vs)
    ]


def _disputes(cells, rows, arms, acc_len=None):
    """tier_disputes over `cells` with their pooled medians, as --suggest-tiers derives the tiers."""
    return analyze.tier_disputes(cells, analyze.medians(cells, acc_len), rows, arms, acc_len)


def test_runs_that_disagree_with_the_pooled_tiers_are_named():
    """Pooled, 3 steps lead at C=1 and plain decoding at 64; within run-02 two steps led at
    C=1. A dispute names the C, the configuration, and the runs that measured both arms."""
    one = {"A1": {1: [360, 364], 64: [100]}, "S2": {1: [300, 298], 64: [90]}, "A0": {1: [200], 64: [150]}}
    two = {"A1": {1: [300, 296], 64: [101]}, "S2": {1: [320, 330], 64: [95]}, "A0": {1: [201], 64: [160]}}
    cells = _run_cells(one, source="run-01") + _run_cells(two, source="run-02")
    arms = {3: "A1", 2: "S2", 0: "A0"}
    res = analyze.suggest_tiers(analyze.medians(cells), [1, 64], arms)
    assert [r["tier"] for r in res["rows"]] == [3, 0]
    assert _disputes(cells, res["rows"], arms) == {
        "runs": 2,
        "disputed": [{"C": 1, "tier": 3, "steps": 2, "led_in": ["run-02"], "compared": 2}],
        "compared_at": [1, 64],
    }
    # A configuration one run lacks is judged by the run that measured it beside the tier's.
    lacking = [c for c in cells if not (c["source"] == "run-01" and c["arm"] == "S2")]
    got = _disputes(lacking, res["rows"], arms)
    assert [(d["C"], d["steps"], d["compared"]) for d in got["disputed"]] == [(1, 2, 1)]
    # A longer draft ahead by the pooled medians is the rule's own exception, not a dispute.
    faster = {**one, "A1": {1: [360], 64: [170]}}, {**two, "A1": {1: [300], 64: [165]}}
    ahead = _run_cells(faster[0], source="a") + _run_cells(faster[1], source="b")
    rows = [{"C": 1, "tier": 3}, {"C": 64, "tier": 0}]
    assert [d["C"] for d in _disputes(ahead, rows, arms)["disputed"]] == [1]  # none at 64
    # --fresh-engines repetitions are runs too; runs at another acceptance are not counted.
    fresh = _run_cells(one, engines=0) + _run_cells(one, engines=1)
    assert _disputes(fresh, res["rows"], arms) == {"runs": 2, "disputed": [], "compared_at": [1, 64]}
    other = [{**c, "acc_len": 2.0} for c in _run_cells(two, source="run-02")]
    alone = _disputes(_run_cells(one, source="run-01") + other, res["rows"], arms, 3.0)
    assert alone == {"runs": 1, "disputed": [], "compared_at": []}


ACROSS = {
    3.0: _configs({1: (100, 120, 150, 200), 16: (100, 130, 160, 150), 64: (100, 90, 80, 70)}),
    2.0: _configs({1: (100, 110, 120, 115), 16: (100, 95, 90, 85), 64: (100, 80, 70, 60)}),
}


def test_one_schedule_for_several_acceptances_has_the_highest_worst_ratio():
    """At 3.0 the rule gives 3,2,0 at 1,16 and at 2.0 2,0 at 1; each loses at the other (3
    steps at C=16 read 0.85 at 2.0, plain decoding 0.625 at 3.0). One schedule for both: 3
    steps at C=1 (0.958 at 2.0 beats 2 steps' 0.75 at 3.0), 2 at 16 (worst 0.90), plain
    decoding at 64, its worst ratio the lowest over every C and acceptance."""
    assert analyze.suggest_tiers(ACROSS[3.0], [1, 16, 64])["tiers"] == [3, 2, 0]
    assert analyze.suggest_tiers(ACROSS[2.0], [1, 16, 64])["tiers"] == [2, 0]
    res = analyze.suggest_tiers_across(ACROSS, [1, 16, 64])
    assert (res["tiers"], res["boundaries"], res["acceptances"]) == ([3, 2, 0], [1, 16], [2.0, 3.0])
    assert res["worst"] == (pytest.approx(0.9), 16, 2.0)
    assert [round(r["ratios"][2.0], 3) for r in res["rows"]] == [0.958, 0.9, 1.0]
    assert res["variant"].startswith("TIER3-2-0_1-16=A2:") and res["threshold"] == 16
    assert "| 16 | 2 | 0.900 | 1.000 |" in analyze.tiers_across_markdown(res)
    # A C missing at one acceptance does not count; without a common C there is no schedule.
    gap = {3.0: ACROSS[3.0], 2.0: {k: v for k, v in ACROSS[2.0].items() if k[1] != 64}}
    assert [r["C"] for r in analyze.suggest_tiers_across(gap, [1, 16, 64])["rows"]] == [1, 16]
    none = analyze.suggest_tiers_across({3.0: ACROSS[3.0], 2.0: {}}, [1, 16, 64])
    assert none["tiers"] == [] and none["worst"] is None and none["flags"] is None
    # A configuration measured at one acceptance only is left out, not the whole schedule.
    no_s2 = {3.0: ACROSS[3.0], 2.0: {k: v for k, v in ACROSS[2.0].items() if k[0] != "S2"}}
    res = analyze.suggest_tiers_across(no_s2, [1, 16, 64])
    assert res["arms"] == {3: "A1", 1: "S1", 0: "A0"} and [r["C"] for r in res["rows"]] == [1, 16, 64]
    # Nothing measured faster than nothing: every configuration at zero reads 1.0, no division.
    zero = {acc: {k: {"median": 0.0} for k in m} for acc, m in ACROSS.items()}
    assert analyze.suggest_tiers_across(zero, [1, 16, 64])["worst"] == (1.0, 1, 2.0)


def _every_schedule_best(ratios: list[dict]) -> list[int]:
    """The schedule suggest_tiers_across wants, by trying every one the tiers serve (no draft
    after plain decoding): the highest lowest ratio, then the highest exact sum, then the
    longer drafts first."""
    from fractions import Fraction

    def key(sch):
        rs = [r for at_c, s in zip(ratios, sch) for r in at_c[s]]
        return min(rs), sum(map(Fraction, rs)), sch

    steps = sorted(ratios[0])
    served = (
        sch for sch in itertools.product(steps, repeat=len(ratios)) if all(a or not b for a, b in zip(sch, sch[1:]))
    )
    return list(max(served, key=key))


def test_one_schedule_is_the_best_of_every_schedule():
    """The dynamic programme picks what trying every schedule picks, ties included (ratios from
    a few values), for 1-6 C, 1-4 configurations and 1-3 acceptances; and it answers for 40 C
    and six configurations, where the schedules number over a million: the fastest at each C
    when the fastest draft only shortens as C grows."""
    rng = random.Random(7)
    for trial in range(400):
        n, steps, accs = rng.randint(1, 6), sorted(rng.sample(range(5), rng.randint(1, 4))), rng.randint(1, 3)
        pick = (lambda: rng.choice((0.5, 0.8, 1.0))) if trial % 2 else rng.random
        ratios = [{s: [pick() for _ in range(accs)] for s in steps} for _ in range(n)]
        assert analyze._most_even_schedule(ratios) == _every_schedule_best(ratios), ratios
    cs = list(range(1, 41))
    fastest = {C: 5 - (C - 1) // 8 for C in cs}  # 5 steps at C=1-8, 4 at 9-16, ... 1 at 33-40
    ms = {
        acc: {(f"S{s}", C): {"median": 100.0 * C * (2 if s == fastest[C] else acc / 4)} for s in range(6) for C in cs}
        for acc in (2.0, 3.0)
    }
    res = analyze.suggest_tiers_across(ms, cs, {s: f"S{s}" for s in range(6)})
    assert (res["tiers"], res["boundaries"], res["worst"]) == ([5, 4, 3, 2, 1], [8, 16, 24, 32], (1.0, 1, 2.0))


def test_the_band_measured_and_merged_moves_the_threshold(tmp_path):
    """The sweep's grid gives T=32 and asks for 40, 48, 56; a run of A0/A1 there in which
    EAGLE-3 still wins at 40 and 48 and loses at 56, merged beside the sweep, moves T to 48,
    with nothing left to refine (56 is within 25% of 48)."""
    from spectool.harness.bench.results import merge

    sweep = _folder(tmp_path / "sweep", _sweep())
    band = [cell("A0", C, 100 * C) for C in (40, 48, 56)] + [
        cell("A1", C, v * C) for C, v in ((40, 110), (48, 101), (56, 95))
    ]
    merge(tmp_path / "fine", [sweep, _folder(tmp_path / "band", band)], 3.0)
    m = analyze.load_medians(tmp_path / "fine", 3.0)
    rule = analyze.suggest_threshold(m, sorted({C for _, C in m}))
    assert (rule["threshold"], rule["loses"][0], rule["refine"]) == (48, 56, [])


def test_summary_files(tmp_path):
    rep = summarize(tmp_path, _sweep(), DEFAULT_C, 32, 3.0, {"A2": _transition([1.0, 0.99, 0.98, 1.0, 0.97])}, {})
    table = (tmp_path / "bench-table.md").read_text()
    assert table.startswith("| C |") and "| A4 TPOT ms | A4 TTFT ms |" in table, "throughput, then latency per arm"
    assert (
        "| 64 | 6400 (6336-6464) | 5120 (5069-5171) | 6336 (6273-6399) | 6208 (6146-6270) | 6400 | 0.990 | 0.970 | - | 0.00 | 3.00 |"
        in table
    )
    assert (tmp_path / "bench-plot.png").read_bytes()[:4] == b"\x89PNG"
    assert [round(r["ratio"], 3) for r in rep["transition"]["A2"]] == [1.0, 0.99, 0.98, 1.0, 0.97]
    assert "Lowest phase/steady: 0.970" in table
    saved = json.loads((tmp_path / "bench-results.json").read_text())
    assert saved["suggested_threshold"]["threshold"] == 32 and saved["ratios"]["64"]["A4/A0"] == pytest.approx(0.97)
    assert "per_run_ratios" not in saved, "one run on one set of engines"


def test_table_round_trip_and_the_comparison_table(tmp_path):
    """A printed table reads back to the same medians (a run whose cells were lost keeps its
    table, and its ratios are read from it), and the comparison of two runs' ratios lists
    each run's A2/E and A2/A0 per C."""
    from spectool.harness.bench.analyze import compare_markdown, load_medians, load_ratios, markdown, medians_from_table

    m = analyze.medians(_sweep())
    back = medians_from_table(markdown(m, DEFAULT_C, ["A0", "A1", "A2", "A4"]))
    assert {k: (round(v["median"]), round(v["min"]), round(v["max"])) for k, v in back.items()} == {
        k: (round(v["median"]), round(v["min"]), round(v["max"])) for k, v in m.items()
    }
    tables_only = tmp_path / "table"
    tables_only.mkdir()
    (tables_only / "bench-table.md").write_text(markdown(m, DEFAULT_C, ["A0", "A1", "A2", "A4"]))
    assert load_medians(tables_only)[("A1", 256)]["median"] == 80 * 256
    assert load_ratios(tables_only, [64])[64]["A2/E"] == pytest.approx(0.99)
    rat = {
        "ours": {64: {"A2/E": 0.976, "A2/A0": 0.976}, 4: {"A2/E": 1.013, "A2/A0": 1.856}},
        "upstream": {64: {"A2/E": 0.429, "A2/A0": 0.429}},
    }
    table = compare_markdown(rat, [4, 64])
    assert table.splitlines()[0] == "| C | A2/E ours | A2/E upstream | A2 vs A0 ours | A2 vs A0 upstream |"
    assert "| 64 | 0.976 | 0.429 | 0.976 | 0.429 |" in table and "| 4 | 1.013 | - | 1.856 | - |" in table


def test_runs_of_two_engines_compared_run_by_run():
    """Per C, each side's runs (median run, range, count) and the rank-sum p of the two sets:
    the same five runs on both sides are one distribution (p = 1); five runs all above the
    other five are 2 of the 252 ways to split ten (p = 0.0079)."""

    def runs(values, C):
        return [
            cell(arm, C, v, source=f"r{i}")
            for i, a2e in enumerate(values)
            for arm, v in (("A0", 1000.0), ("A1", 1000.0), ("A2", 1000.0 * a2e))
        ]

    same, low, high = [0.98, 0.99, 1.0, 1.01, 1.02], [0.95, 0.96, 0.97, 0.975, 0.978], [1.01, 1.02, 1.03, 1.04, 1.05]
    md = analyze.compare_runs_markdown(
        {"ours": runs(same, 4) + runs(high, 16), "upstream": runs(same, 4) + runs(low, 16)}, [4, 8, 16]
    )
    assert "| 4 | 1.000 (0.980-1.020, 5) | 1.000 (0.980-1.020, 5) | 1.00 |" in md
    assert "| 16 | 1.030 (1.010-1.050, 5) | 0.970 (0.950-0.978, 5) | 0.01 |" in md
    assert "| 8 |" not in md, "a C no run measured has no row"
    one = analyze.compare_runs_markdown({"ours": runs(same, 4)}, [4])
    assert "| 4 | 1.000 (0.980-1.020, 5) |" in one and "rank-sum" not in one


def test_a_pooled_tiers_folder_gives_the_goals_figure_as_the_median_of_runs(tmp_path, load_tool):
    """goals.md of a folder pooled from runs on fresh engines: per C, the median over the runs
    of the tiered arm over that run's fastest fixed configuration, and in how many runs it
    was below 1. A run that did not measure every fixed configuration there is left out of
    that figure (its fastest would be of fewer), not of its own column."""
    runs = {
        "r0": {"TIER": 990, "A0": 500, "A1": 950, "S2": 1000},
        "r1": {"TIER": 1020, "A0": 500, "A1": 990, "S2": 1000},
        "r2": {"TIER": 980, "A0": 500, "A1": 1000, "S2": 990},
        "r3": {"TIER": 1100, "A1": 1000},
    }
    cells = [cell(arm, 32, v, source=run) for run, arms in runs.items() for arm, v in arms.items()]
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    (tmp_path / "bench-results.json").write_text(json.dumps({"acc_len": 3.0}))
    md = load_tool("compare_upstream").tier_goals_markdown(tmp_path)
    assert "| C | r0 | r1 | r2 | r3 | median of runs | between runs |" in md
    row = next(line for line in md.splitlines() if line.startswith("| 32 | A0"))
    assert row.split(" | ")[4:6] == ["A1 1.100", "0.990 (2 of 3)"], row


def test_transition_phases_are_compared_with_their_own_reference(tmp_path):
    """A phase is judged against the same (C, n) run on its own, not against the sweep's
    median at another request count; results without a reference fall back to it."""
    trans = {
        "A2": {
            "phases": [{"C": 4, "output_tok_s": 950.0}, {"C": 192, "output_tok_s": 9000.0}],
            "reference": {"4": 1000.0, "192": 10000.0},
        }
    }
    rep = summarize(tmp_path, _sweep(), DEFAULT_C, 32, 3.0, trans, {})
    assert [round(r["ratio"], 3) for r in rep["transition"]["A2"]] == [0.95, 0.9]
    del trans["A2"]["reference"]
    rep = summarize(tmp_path, _sweep(), DEFAULT_C, 32, 3.0, trans, {})
    assert rep["transition"]["A2"][0]["steady"] == 147 * 4, "A2's median at C=4"
    # C=192 was not measured: the median between 128 and 256, interpolated (99 per request).
    assert rep["transition"]["A2"][1]["steady"] == pytest.approx(99 * 192)


def test_transition_reference_brackets_the_schedule(tmp_path, monkeypatch):
    """The transition's reference for each phase load is measured before and after the
    schedule (their mean; both kept, so drift shows), each run with prompts of its own, so no
    run finds another's prompts in the radix cache."""
    from spectool.harness.bench import engines, sweep

    sent = []

    def command(proc, arm, out, cmd):
        sent.append(cmd)
        if cmd["kind"] == "phases":
            return {
                "phases": [
                    {"C": ph["C"], "output_tok_s": 900.0, "ttft_ms": 40.0, "tpot_ms": 2.6, "host_busy_cpus": 9.0}
                    for ph in cmd["schedule"]
                ]
            }
        return {
            "output_tok_s": 1000.0 if len(sent) < 4 else 1200.0,
            "ttft_ms": 30.0 if len(sent) < 4 else 32.0,
            "tpot_ms": 2.5,
            "host_busy_cpus": 3.0 if len(sent) < 4 else 4.0,
        }

    monkeypatch.setattr(engines, "command", command)
    [res] = list(sweep._transition(None, "A2", tmp_path, 128, 128))
    assert [c["kind"] for c in sent] == ["point", "point", "phases", "point", "point"]
    assert [c["C"] for c in sent if c["kind"] == "point"] == [4, 192, 4, 192]
    assert all(c["n"] == {4: 128, 192: 384}[c["C"]] for c in sent if c["kind"] == "point")
    phase_seeds = {sent[2]["seed"] + i for i in range(len(sweep.TRANSITION))}  # phases() seeds seed + i
    ref_seeds = [c["seed"] for c in sent if c["kind"] == "point"]
    assert len(set(ref_seeds)) == 4 and not phase_seeds & set(ref_seeds)
    assert {C: [r["output_tok_s"] for r in recs] for C, recs in res["reference_records"].items()} == {
        "4": [1000.0, 1200.0],
        "192": [1000.0, 1200.0],
    }
    rows = summarize(tmp_path, _sweep(), DEFAULT_C, 32, 3.0, {"A2": res}, {})["transition"]["A2"]
    assert {r["C"]: r["steady"] for r in rows} == {4: 1100.0, 192: 1100.0}
    assert [round(r["ratio"], 3) for r in rows] == [0.818] * 5 and rows[0]["reference_runs"] == [1000.0, 1200.0]
    # The references' TTFT and TPOT are kept, so a slow phase shows which of the two it lost.
    assert rows[0]["ttft_ms"] == 40.0 and rows[0]["steady_ttft_ms"] == 31.0 and rows[0]["steady_tpot_ms"] == 2.5
    from spectool.harness.bench.analyze import transition_markdown

    assert "| A2 | 1 | 4 | 900 | 1100 (1000 / 1200) | 0.818 | 40 / 31 | 2.60 / 2.50 |" in transition_markdown(
        {"A2": rows}
    )
    # And how busy the host was: a phase beside other work on the host reads slow at C=4.
    assert rows[0]["host_busy_cpus"] == 9.0 and rows[0]["steady_host_busy_cpus"] == 3.5
    assert "| 2.60 / 2.50 | 9.0 / 3.5 |" in transition_markdown({"A2": rows})


def test_transition_rounds_share_the_references_between_them(tmp_path, monkeypatch):
    """--transition-rounds 3: references, then each round's schedule followed by references,
    so every round has references right before and after it, the ones between two rounds
    serving both; every schedule and reference run has prompts of its own."""
    from spectool.harness.bench import engines, sweep

    sent = []

    def command(proc, arm, out, cmd):
        sent.append(cmd)
        if cmd["kind"] == "phases":
            return {"phases": [{"C": ph["C"], "output_tok_s": 1000.0} for ph in cmd["schedule"]]}
        return {"output_tok_s": 1000.0 + len(sent)}  # each reference run reads its own

    monkeypatch.setattr(engines, "command", command)
    res = list(sweep._transition(None, "A2", tmp_path, 128, 128, rounds=range(3)))
    assert [c["kind"] for c in sent] == ["point", "point"] + ["phases", "point", "point"] * 3
    assert len(res) == 3
    refs = [[r["output_tok_s"] for r in rnd["reference_records"]["4"]] for rnd in res]
    assert refs == [[1001.0, 1004.0], [1004.0, 1007.0], [1007.0, 1010.0]]  # C=4's runs, bracketing each round
    seeds = [c["seed"] + i for c in sent for i in (range(len(c["schedule"])) if c["kind"] == "phases" else [0])]
    assert len(seeds) == len(set(seeds)), "no two runs share prompts"

    # A round starts only within the budget (the first always: the sweep checked it), and a
    # later call's rounds (numbered on) have prompts of their own, references of their own first.
    sent.clear()
    # A later round starts only if what the round before took is left: each check is asked
    # with that time (a clock that moves 40 s between two readings).
    checks, asked, clock = iter([False, True]), [], iter(range(0, 10**6, 40))

    def over_budget(needed_s):
        asked.append(needed_s)
        return next(checks)

    monkeypatch.setattr(sweep, "time", type("Clock", (), {"monotonic": staticmethod(lambda: next(clock))}))
    rounds = list(sweep._transition(None, "A2", tmp_path, 128, 128, range(3), over_budget=over_budget))
    assert len(rounds) == 2 and asked == [40, 40] and [r["round_s"] for r in rounds] == [40, 40]
    # Another engine's first round is checked against the last round any engine ran.
    asked.clear()
    checks = iter([True])
    assert list(sweep._transition(None, "A2X", tmp_path, 128, 128, range(3), over_budget, expect_s=40)) == []
    assert asked == [40]
    first_call = {c["seed"] + i for c in sent for i in (range(len(c["schedule"])) if c["kind"] == "phases" else [0])}
    sent.clear()
    [later] = list(sweep._transition(None, "A2", tmp_path, 128, 128, range(2, 3)))
    assert [c["kind"] for c in sent] == ["point", "point", "phases", "point", "point"]
    seeds = [c["seed"] + i for c in sent for i in (range(len(c["schedule"])) if c["kind"] == "phases" else [0])]
    assert not set(seeds) & first_call


def test_every_high_phase_of_the_transition_crosses_the_engines_switch_point(tmp_path, monkeypatch):
    """The high load is 192 while every engine switches below it; where a threshold or a
    highest tier boundary is 192 or more it is twice the highest, up to the engines' batch (at
    C=192 an engine switching above 192 requests would never switch). Controls (A1, A3: no
    switch within the batch) set nothing and run the same schedule. The references run each
    load of the schedule."""
    from spectool.harness.bench import engines, sweep
    from spectool.harness.bench.arms import arms, variant

    fields = {
        "speculative_num_steps_tiers": "Optional[List[int]]",
        "speculative_num_steps_tier_boundaries": "Optional[List[int]]",
    }

    def high(threshold, spec=None, max_bs=256, controls=()):
        every = arms(threshold, max_bs)
        arm = variant(spec, every, fields) if spec else every[2]  # A2
        return sweep.transition_schedule([arm, *(every[i] for i in controls)], max_bs)[1]["C"]

    assert high(48) == 192 and high(191) == 192
    assert high(192) == 256 and high(192, controls=(1, 3)) == 256, "A1 and A3 beside it run the same load"
    tiered = "T=A1:speculative_num_steps_tiers=3,2,1;speculative_num_steps_tier_boundaries=64,192"
    assert high(48, tiered) == 256, "the highest boundary counts"
    assert high(120, max_bs=512) == 192 and high(160, max_bs=512) == 192 and high(200, max_bs=512) == 400
    assert sweep.transition_schedule([arms(48)[1], arms(48)[3]], 256) == sweep.TRANSITION, "controls alone"
    schedule = sweep.transition_schedule([arms(192, 256)[2]], 256)
    assert [ph["C"] for ph in schedule] == [4, 256, 4, 256, 4] and schedule[1]["n"] == 512

    sent = []

    def command(proc, arm, out, cmd):
        sent.append(cmd)
        if cmd["kind"] == "phases":
            return {"phases": [{"C": ph["C"], "output_tok_s": 1000.0} for ph in cmd["schedule"]]}
        return {"output_tok_s": 1000.0}

    monkeypatch.setattr(engines, "command", command)
    [res] = list(sweep._transition(None, "A2", tmp_path, 128, 128, phases=schedule))
    assert [(c["C"], c["n"]) for c in sent if c["kind"] == "point"] == [(4, 128), (256, 512)] * 2
    assert sorted(res["reference_records"]) == ["256", "4"]
    rows = summarize(tmp_path, _sweep(), DEFAULT_C, 192, 3.0, {"A2": res}, {})["transition"]["A2"]
    assert [r["C"] for r in rows] == [4, 256, 4, 256, 4] and all(r["ratio"] == 1.0 for r in rows)
    assert "Transition workload (alternating C=4 and C=256, closed loop)" in (tmp_path / "bench-table.md").read_text()


def test_a_transition_of_several_rounds_reads_each_phase_as_the_median_of_its_rounds(tmp_path):
    """Each round's phases against the references bracketing that round, a round column in the
    table, and the goal line on the median of each phase's rounds: one slow phase in one round
    does not decide it, a phase slow in most rounds does."""
    rounds = [
        _transition([1.0, 0.99, 0.90, 1.01, 0.97]),  # one slow phase
        _transition([0.99, 1.0, 1.01, 0.98, 0.96], low=1200.0),
        _transition([1.01, 0.98, 0.99, 1.0, 0.94]),
    ]
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, {"A2": {"rounds": rounds}}, {})
    rows = rep["transition"]["A2"]
    assert [r["round"] for r in rows] == [1] * 5 + [2] * 5 + [3] * 5
    assert rows[5]["steady"] == 1200.0, "round 2 against its own references"
    table = (tmp_path / "bench-table.md").read_text()
    assert "| arm | round | phase | C |" in table and "| A2 | 2 | 1 | 4 | 1188 | 1200 (1200 / 1200) | 0.990 |" in table
    # Phase 3: 0.90, 1.01, 0.99 -> 0.99; phase 5: 0.97, 0.96, 0.94 -> 0.96, the lowest median.
    assert "Lowest phase/steady, each phase the median of its rounds: 0.960 (goal" in table
    from spectool.harness.bench.analyze import lowest_phase_ratios

    assert lowest_phase_ratios(rep["transition"]) == {"A2": pytest.approx(0.96, abs=1e-3)}


def test_a_transition_that_never_switched_its_engine_gives_no_figure(tmp_path):
    """Rounds whose engine counted its switches list them under the table; an engine that
    counted none in every round (the schedule never crossed its switch point) gets no goal
    figure, and the table says so. Rounds without counters read as before."""
    switched = [dict(_transition([1.0, 0.96, 1.0, 0.99, 1.0]), switches={"fallback": 4, "tiers": 4})] * 3
    idle = [dict(_transition([1.0, 0.89, 1.0, 1.1, 1.0]), switches={"fallback": 0, "tiers": 0})] * 3
    trans = {"A2": {"rounds": switched}, "TIER": {"rounds": idle}, "OLD": _transition([0.97] * 5)}
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, trans, {})
    from spectool.harness.bench.analyze import lowest_phase_ratios, never_switched

    assert not never_switched(rep["transition"]["A2"]) and never_switched(rep["transition"]["TIER"])
    assert not never_switched(rep["transition"]["OLD"]), "no counters: nothing known"
    assert set(lowest_phase_ratios(rep["transition"])) == {"A2", "OLD"}
    table = (tmp_path / "bench-table.md").read_text()
    assert "per round (fallback in and out / between tiers): A2 4 / 4, 4 / 4, 4 / 4; TIER 0 / 0, 0 / 0, 0 / 0." in table
    assert "TIER never switched: the schedule did not cross its switch point" in table
    assert "Per transition: A2 0.960, OLD 0.970." in table


def test_an_engine_that_keeps_one_configuration_at_every_batch_is_a_control():
    """Plain decoding, EAGLE-3, A3 (threshold at the largest batch) and a variant of A1 with
    another draft length cannot switch; a threshold, tiers or SGLang's adaptive steps can."""
    from spectool.harness.bench import sweep
    from spectool.harness.bench.arms import arms, variant

    fields = {
        "speculative_num_steps": "int",
        "speculative_adaptive": "bool",
        "speculative_num_steps_tiers": "Optional[List[int]]",
        "speculative_num_steps_tier_boundaries": "Optional[List[int]]",
    }
    every = arms(48, 256)
    a0, a1, a2, a3, a4 = every
    s2 = variant("S2=A1:speculative_num_steps=2", every, fields)
    up = variant("UP=A1:speculative_adaptive=true", every, fields)
    tier = variant("T=A1:speculative_num_steps_tiers=3,0;speculative_num_steps_tier_boundaries=192", every, fields)
    assert [sweep.cannot_switch(a, 256) for a in (a0, a1, a3, s2)] == [True] * 4
    assert [sweep.cannot_switch(a, 256) for a in (a2, up, tier)] == [False] * 3
    assert sweep.cannot_switch(tier, 192), "its boundary at the largest batch: never crossed"


def test_a_round_recorded_as_a_control_decides_over_the_arms_name(tmp_path):
    """Rounds that record whether their engine could switch are read by that record (a variant
    of A1 with two draft steps is a control; an A1 started with adaptive steps would not be);
    rounds without it by the arm's name."""
    from spectool.harness.bench.analyze import lowest_phase_ratios

    tier = [dict(_transition([0.94, 1.0, 0.93, 0.99, 0.95]), switches={"fallback": 5, "tiers": 5}, control=False)]
    s2 = [dict(_transition([0.97, 1.0, 1.0, 1.0, 1.0]), control=True)]
    a1 = [dict(_transition([0.96, 1.0, 1.0, 1.0, 1.0]), control=False)]
    trans = {"TIER": {"rounds": tier * 2}, "S2": {"rounds": s2 * 2}, "A1": {"rounds": a1 * 2}}
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, trans, {})
    assert set(lowest_phase_ratios(rep["transition"])) == {"TIER", "A1"}
    assert lowest_phase_ratios(rep["transition"], controls=True) == {"S2": pytest.approx(0.97, abs=1e-3)}


def test_a_control_beside_the_switching_engine_gets_its_own_line_not_the_goal(tmp_path):
    """A1 beside a tiered engine runs the same schedule without switching: its lowest phase is
    what the schedule costs any engine, listed apart, and never the goal's figure."""
    tier = [dict(_transition([0.94, 1.0, 0.93, 0.99, 0.95]), switches={"fallback": 5, "tiers": 5})] * 2
    control = [_transition([0.98, 1.04, 1.0, 1.03, 0.99])] * 2
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, {"TIER": {"rounds": tier}, "A1": {"rounds": control}}, {})
    from spectool.harness.bench.analyze import lowest_phase_ratios

    assert lowest_phase_ratios(rep["transition"]) == {"TIER": pytest.approx(0.93, abs=1e-3)}
    assert lowest_phase_ratios(rep["transition"], controls=True) == {"A1": pytest.approx(0.98, abs=1e-3)}
    table = (tmp_path / "bench-table.md").read_text()
    assert "each phase the median of its rounds: 0.930 (goal" in table
    assert "Controls, engines that never switch (what the schedule costs any engine): A1 0.980." in table


def test_a_control_whose_counters_recorded_no_switch_is_still_a_control(tmp_path):
    """A3 has a threshold, so its counters record its rounds, without a switch: it is listed
    as a control, not as a transition that never switched."""
    tier = [dict(_transition([0.94, 1.0, 0.93, 0.99, 0.95]), switches={"fallback": 5, "tiers": 5})] * 2
    control = [dict(_transition([0.97, 1.0, 0.99, 1.0, 0.98]), switches={"fallback": 0, "tiers": 0})] * 2
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, {"TIER": {"rounds": tier}, "A3": {"rounds": control}}, {})
    from spectool.harness.bench.analyze import lowest_phase_ratios

    assert lowest_phase_ratios(rep["transition"]) == {"TIER": pytest.approx(0.93, abs=1e-3)}
    assert lowest_phase_ratios(rep["transition"], controls=True) == {"A3": pytest.approx(0.97, abs=1e-3)}
    table = (tmp_path / "bench-table.md").read_text()
    assert "A3 never switched" not in table
    assert "Controls, engines that never switch (what the schedule costs any engine): A3 0.970." in table


def test_a_transition_lists_the_gpus_clock_where_it_was_sampled(tmp_path):
    """A run that sampled the GPU (gpuclock) lists each phase's mean SM clock against its
    references'; one that did not has no such column and no such fields."""
    sampled = _transition([0.9, 1.0, 1.0, 1.0, 1.0], gpu_sm_mhz=1500.0)
    for records in sampled["reference_records"].values():
        for r in records:
            r["gpu_sm_mhz"] = 1980.0
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, {"A2": sampled}, {})
    assert rep["transition"]["A2"][0]["gpu_sm_mhz"] == 1500.0
    table = (tmp_path / "bench-table.md").read_text()
    assert "GPU SM MHz phase / steady |" in table and "| 1500 / 1980 |" in table
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, {"A2": _transition([1.0] * 5)}, {})
    assert "gpu_sm_mhz" not in rep["transition"]["A2"][0]
    assert "GPU SM MHz" not in (tmp_path / "bench-table.md").read_text()


def test_a_median_ratio_has_an_interval_only_over_enough_repetitions():
    """The bootstrap interval of median(a) / median(b) for two arms `ratios` does not pair:
    None below three reps a side; around the ratio of the medians, narrower for tight reps
    than for spread ones, and the same for the same seed."""
    from spectool.harness.bench.analyze import median_ratio_interval

    assert median_ratio_interval([100, 101], [100, 99, 98]) is None
    tight = median_ratio_interval([100, 101, 99, 100], [100, 99, 101, 100], seed="x")
    wide = median_ratio_interval([80, 101, 120, 100], [100, 70, 130, 100], seed="x")
    assert tight[0] <= 1.0 <= tight[1] and tight[1] - tight[0] < 0.03
    assert wide[1] - wide[0] > 0.2
    assert median_ratio_interval([100, 101, 99, 100], [100, 99, 101, 100], seed="x") == tight


def test_a_transition_only_run_tables_its_phases(tmp_path):
    """--reps 0: no sweep table (no cells), the transition's phases against their bracketing
    references instead, one row per phase and engine, the lowest phase of each."""
    a2 = _transition([1.0, 0.99, 0.9, 1.01, 0.97], low=1250.0)
    a2["reference_records"]["4"] = [{"output_tok_s": 1300.0}, {"output_tok_s": 1200.0}]  # mean 1250
    trans = {"A2": a2, "A2B": _transition([0.96, 1.0, 1.02, 0.99, 0.98])}
    rep = summarize(tmp_path, [], DEFAULT_C, 32, 3.0, trans, {})
    table = (tmp_path / "bench-table.md").read_text()
    assert "A2/E" not in table and table.count("| A2 |") == 5 and table.count("| A2B |") == 5
    ratios = {arm: [round(r["ratio"], 3) for r in rows] for arm, rows in rep["transition"].items()}
    assert ratios == {"A2": [1.0, 0.99, 0.9, 1.01, 0.97], "A2B": [0.96, 1.0, 1.02, 0.99, 0.98]}
    assert "| A2 | 3 | 4 | 1125 | 1250 (1300 / 1200) | 0.900 |" in table
    assert "Lowest phase/steady: 0.900" in table and "Per transition: A2 0.900, A2B 0.960." in table
    assert not (tmp_path / "bench-plot.png").exists(), "no cells, no plot"


def test_arms_run_in_waves_that_fit_the_gpu():
    """Five 8B-shaped engines do not fit one H200: arms are split into waves of at most
    --max-engines, the goal comparisons (A2 and A4 against A0 and A1) together in the first,
    variants last."""
    from spectool.errors import BadInputError
    from spectool.harness.bench.sweep import plan_waves, select_arms

    names = lambda waves: [[a.name for a in w] for w in waves]  # noqa: E731
    assert [a.name for a in select_arms(32, 256, None)] == ["A0", "A1", "A2", "A3", "A4"]
    assert names(plan_waves(select_arms(32, 256, None))) == [["A0", "A1", "A2", "A4"], ["A3"]]
    late = ["A4M=A4:speculative_disable_kv_only_margin=8"]
    both = select_arms(32, 256, ["A0", "A4"], late, server_args=SERVER_ARGS)
    assert names(plan_waves(both)) == [["A0", "A4", "A4M"]]
    assert names(plan_waves(both, 2)) == [["A0", "A4"], ["A4M"]]
    with pytest.raises(BadInputError, match="max-engines"):
        plan_waves(both, 0)
    with pytest.raises(BadInputError, match="unknown arm"):
        select_arms(32, 256, ["A9"])


def test_variants_are_arms_with_their_own_server_args():
    """A setting of the fallback is compared as a variant arm: the base arm's engine settings
    plus ServerArgs fields of its own (values as on the command line), in the same rotation;
    bad specs are one-paragraph errors."""
    from spectool.errors import BadInputError
    from spectool.harness.bench.arms import engine_kwargs
    from spectool.harness.bench.sweep import select_arms

    arms = select_arms(
        32,
        256,
        ["A0", "A4"],
        ["A4D=A4:speculative_disable_draft_decode_min_bs=32;speculative_disable_kv_only_margin=off"],
        server_args=SERVER_ARGS,
    )
    a4, a4d = arms[1], arms[2]
    assert a4d.name == "A4D" and a4d.base == "A4" and a4.extra == {}
    assert a4d.extra == {"speculative_disable_draft_decode_min_bs": 32, "speculative_disable_kv_only_margin": None}
    models = {"target": "t", "draft": "d"}
    kw = dict(models=models, max_bs=256, max_total_tokens=1000, port=1)
    assert engine_kwargs(a4d, **kw) == {**engine_kwargs(a4, **kw), **a4d.extra}, "its base's settings, and its own"
    for bad, needle in (
        ("A4D", "expected NAME=BASE"),
        ("A4D=A9:X=1", "base arm 'A9'"),
        ("A4D=A4:X", "not FIELD=VALUE"),
        ("A4=A0:speculative_disable_kv_only_margin=1", "already exists"),
        ("A 4=A4:speculative_disable_kv_only_margin=1", "arm name"),
        ("A4D=A4:SPECTOOL_FALLBACK_DRAFT_DECODE_MIN_BS=32", "is not a ServerArgs field"),
        ("A4D=A4:speculative_disable_kv_only_margn=8", "did you mean speculative_disable_kv_only_margin"),
        ("A4D=A4:speculative_disable_kv_only_margin=eight", "takes a whole number or off"),
    ):
        with pytest.raises(BadInputError, match=needle):
            select_arms(32, 256, None, [bad], server_args=SERVER_ARGS)


def test_variant_columns_in_the_table():
    cells = _sweep()
    m = analyze.medians(
        cells + [dict(c, arm="A4D", output_tok_s=c["output_tok_s"] * 1.04) for c in cells if c["arm"] == "A4"]
    )
    table = analyze.markdown(m, DEFAULT_C, ["A0", "A1", "A2", "A4", "A4D"])
    assert "| A4D/A0 |" in table.splitlines()[0]
    r = analyze.ratios(m, DEFAULT_C)
    assert r[64]["A4D/A0"] == pytest.approx(0.97 * 1.04) and "| 0.970 | 1.009 | - |" in table


def test_an_arm_without_its_fallback_graphs_is_not_timed():
    """An engine that captured no fallback graphs (out of GPU memory) would be timed eagerly:
    its log line names it, and the arm is not measured."""
    from spectool.harness.bench.engines import degraded_engine

    line = (
        "[2026-11-29 11:41:50] spec-fallback: could not capture a one-token draft-extend CUDA graph (CUDA out of "
        "memory. Tried to allocate 32.00 MiB.); the draft KV sync will run eagerly"
    )
    msg = degraded_engine("A4", "Capturing batches\n" + line + "\n")
    assert msg.startswith("bench arm A4 started without its fallback CUDA graphs") and "CUDA out of memory" in msg
    assert "--max-engines" in msg
    assert degraded_engine("A0", "Capturing batches (bs=256)\nready\n") is None


def test_an_arm_whose_engine_turned_adaptive_steps_off_is_not_timed():
    """SGLang turns --speculative-adaptive off with a warning for setups its tiers do not
    serve, and the engine then speculates at a fixed step count: not the arm asked for."""
    from spectool.harness.bench.engines import degraded_engine

    line = (
        "[2026-12-02 10:00:00] WARNING speculative_hook.py:764: speculative_adaptive disabled: adaptive "
        "speculative decoding does not support topk > 1. Falling back to static speculative params."
    )
    msg = degraded_engine("UPD", "Load weight end\n" + line + "\n")
    assert msg.startswith("bench arm UPD asked for SGLang's adaptive steps, which its engine turned off")
    assert "topk > 1" in msg


# An engine's start-up as SGLang 0.5.12 logs it when the KV pool asked for does not fit.
SHRUNK_POOL_LOG = """\
flashinfer.comm is not available, falling back to standard implementation
[2026-11-30 02:59:44] Ignore import error when loading sglang.srt.models.mimo_v2: Can not import FA3 in sgl_kernel.
[2026-11-30 02:59:45] max_total_tokens=303104 is larger than the profiled value 34038. Use the profiled value instead.
Capturing batches (bs=256 avail_mem=12.45 GB):   2%|         | 1/51 [02:20<1:56:52, 140.24s/it]
[2026-11-30 03:04:56] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 1007
"""


def test_an_arm_whose_kv_pool_sglang_shrank_is_not_timed():
    """SGLang shrinks a KV pool that does not fit without an error, and the engine then runs
    smaller batches than the other arms: the bench names the pool it got and what to change."""
    from spectool.harness.bench.engines import degraded_engine

    msg = degraded_engine("A4G", SHRUNK_POOL_LOG)
    assert msg.startswith("bench arm A4G's engine got a KV pool of 34,038 tokens, not the 303,104")
    assert "--max-engines" in msg and "--out-len" in msg
    assert (
        degraded_engine("A0", SHRUNK_POOL_LOG.replace("max_total_tokens=303104 is larger", "max_total_tokens=3 is"))
        is None
    )


def test_plan_resumes_and_places_the_transition_after_the_first_repetition():
    from spectool.harness.bench.sweep import plan_steps, select_arms

    arms = select_arms(32, 256, None)  # waves A0 A1 A2 A4, then A3
    plan = plan_steps(arms, [1, 64], 2, 3.0, set(), True)
    (w1, s1), (w2, s2) = plan
    assert [a.name for a in w1] == ["A0", "A1", "A2", "A4"] and [a.name for a in w2] == ["A3"]
    assert s1.index(None) == 8 and s1.count(None) == 1 and None not in s2, "after rep 0 of A2's wave"
    assert s1[:4] == [(0, 1, "A0"), (0, 1, "A1"), (0, 1, "A2"), (0, 1, "A4")]
    assert s1[9][2] == "A1", "arm order rotated in rep 1"
    done = {(a, C, r, 3.0) for r in range(2) for C in (1, 64) for a in ("A0", "A1", "A2", "A4")}
    assert [[a.name for a in w] for w, _ in plan_steps(arms, [1, 64], 2, 3.0, done, False)] == [["A3"]]
    # A finished sweep whose transition is missing still runs it, on A2's engine alone.
    only = plan_steps(arms, [1, 64], 2, 3.0, done | {("A3", C, r, 3.0) for r in range(2) for C in (1, 64)}, True)
    assert [([a.name for a in w], steps) for w, steps in only] == [(["A2"], [None])]
    # A resumed wave starts only the engines with cells left.
    partial = done - {("A1", 64, 1, 3.0)}
    assert [[a.name for a in w] for w, _ in plan_steps(arms, [1, 64], 2, 3.0, partial, False)] == [["A1"], ["A3"]]


def test_transition_runs_on_a2_and_its_variants_only():
    """A variant of A2 (e.g. a recipe switch turned off) runs the transition workload too, in
    A2's wave, as a same-run control; `--reps 0` plans the transition alone."""
    from spectool.harness.bench.sweep import plan_steps, select_arms

    arms = select_arms(
        32,
        256,
        ["A0", "A2"],
        ["A2X=A2:speculative_disable_kv_only_margin=off", "A4M=A4:speculative_disable_kv_only_margin=8"],
        server_args=SERVER_ARGS,
    )
    assert [a.name for a in arms if a.runs_transition()] == ["A2", "A2X"]
    a2x = next(a for a in arms if a.name == "A2X")
    assert a2x.base == "A2" and a2x.extra == {"speculative_disable_kv_only_margin": None}
    [(wave, steps)] = plan_steps([a for a in arms if a.name in ("A2", "A2X")], [4, 192], 0, 3.0, set(), True)
    assert [a.name for a in wave] == ["A2", "A2X"] and steps == [None]


def test_transition_control_arms_are_named():
    """--transition-arms A2,A1 adds a control that never switches (A1 speculates at every
    batch), planned in the same wave; an arm named there but not measured is a one-paragraph
    error; the default (A2) in a run without A2 plans no transition and no error."""
    from spectool.errors import BadInputError
    from spectool.harness.bench.sweep import plan_steps, run, select_arms

    arms = select_arms(32, 256, ["A0", "A1", "A2"])
    assert [a.name for a in arms if a.runs_transition(("A2", "A1"))] == ["A1", "A2"]
    [(wave, steps)] = plan_steps(arms, [4], 0, 3.0, set(), True, 4, ("A2", "A1"))
    assert steps == [None]
    with pytest.raises(BadInputError, match="A3"):
        run(Path("/nonexistent"), threshold=32, arm_names=["A0", "A2"], transition_arms=("A2", "A3"))


def test_a_results_folder_is_never_extended_with_the_other_load(tmp_path):
    """Lockstep cells and staggered cells must not share a table: `spectool bench --out` on a
    folder of the other kind is refused with a one-paragraph error and exit code 2, before any
    GPU probe; a folder of the same kind resumes."""
    from click.testing import CliRunner

    from spectool.cli import main
    from spectool.harness.bench.results import load_cells

    old = _folder(tmp_path / "old", _sweep())
    res = CliRunner().invoke(main, ["bench", "--out", str(old), "--load", "staggered"])
    assert res.exit_code == 2 and "lockstep load" in res.output and "Traceback" not in res.output
    cells, done = load_cells(old / "cells.jsonl", 3.0)  # the default load resumes it
    assert ("A2", 256, 2, 3.0) in done and len(done) == 4 * 9 * 3
    new = _folder(tmp_path / "new", [dict(c, stagger=True) for c in _sweep(reps=1)])
    res = CliRunner().invoke(main, ["bench", "--out", str(new)])
    assert res.exit_code == 2 and "staggered load" in res.output and "Traceback" not in res.output
    cells, done = load_cells(new / "cells.jsonl", 3.0, "staggered")
    assert len(cells) == 36 and ("A0", 256, 0, 3.0) in done
    from spectool.errors import BadInputError

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text((new / "cells.jsonl").read_text() + (old / "cells.jsonl").read_text())
    with pytest.raises(BadInputError, match="lockstep and staggered load.*cannot be resumed"):
        load_cells(mixed, 3.0, "staggered")


def test_cells_of_another_tensor_parallel_size_never_share_a_table(tmp_path):
    """`bench --tp 2` on a folder of TP=1 cells is refused, exit 2, before any GPU probe; so is
    a merge of TP=1 and TP=2 folders. Cells measured at TP=2 carry `tp` and resume at --tp 2."""
    from click.testing import CliRunner

    from spectool.cli import main
    from spectool.errors import BadInputError
    from spectool.harness.bench.results import load_cells

    old = _folder(tmp_path / "old", _sweep([64, 128]))
    res = CliRunner().invoke(main, ["bench", "--out", str(old), "--tp", "2"])
    assert res.exit_code == 2 and "--tp 1" in res.output and "Traceback" not in res.output
    cells = analyze.read_cells(old / "cells.jsonl")
    sharded = _folder(tmp_path / "tp2", [{**c, "tp": 2} for c in cells])
    _, done = load_cells(sharded / "cells.jsonl", 3.0, tp=2)
    assert len(done) == len(cells)
    with pytest.raises(BadInputError, match="--tp 2"):
        load_cells(sharded / "cells.jsonl", 3.0)
    r = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "m"), "--merge", str(old), "--merge", str(sharded)])
    assert r.exit_code == 2 and "tp" in r.output and not (tmp_path / "m").exists()
    assert summarize(tmp_path, analyze.read_cells(sharded / "cells.jsonl"), [64], 32, 3.0, None, {})["tp"] == 2
    assert "tp" not in summarize(old, cells, [64], 32, 3.0, None, {})


def test_merge_makes_one_sweep_of_runs_split_over_two_gpus(tmp_path):
    """A sweep measured as C = 1, 2, 4 on one GPU and C = 8..256 (with the transition) on the
    other, then A0 / A2 / A4 at 64..256 again: merged, every C of the sweep has its row, the
    split C keep their own run's medians, the repeated C pool both runs' reps, and the CLI
    writes the files without a GPU."""
    from click.testing import CliRunner

    from spectool.cli import main

    low = _folder(tmp_path / "low", _sweep([1, 2, 4]))
    high = _folder(
        tmp_path / "high",
        _sweep([8, 16, 32, 64, 128, 256], reps=1),
        transition={"A1": _transition([1.0] * 5), "A2": _transition([0.99] * 5)},
    )
    again = _folder(
        tmp_path / "again",
        [cell(a, C, v * C) for C in (64, 128, 256) for a, v in (("A0", 102), ("A2", 100), ("A4", 99))],
    )
    out = tmp_path / "merged"
    r = CliRunner().invoke(
        main, ["bench", "--out", str(out), "--merge", str(low), "--merge", str(high), "--merge", str(again)]
    )
    assert r.exit_code == 0, r.output
    cells = analyze.read_cells(out / "cells.jsonl")
    parts = [analyze.read_cells(p / "cells.jsonl") for p in (low, high, again)]
    assert len(cells) == sum(map(len, parts)) == 36 + 24 + 9 and {c["source"] for c in cells} == {
        "low",
        "high",
        "again",
    }
    m, m_low = analyze.medians(cells), analyze.medians(parts[0])
    assert sorted({C for _, C in m}) == DEFAULT_C
    assert m[("A2", 4)] == m_low[("A2", 4)], "a C measured in one run only keeps that run's median"
    assert m[("A0", 128)]["reps"] == 2 and m[("A0", 128)]["median"] == (100 + 102) / 2 * 128
    report = json.loads((out / "bench-results.json").read_text())
    assert report["merged_from"] == ["low", "high", "again"] and report["threshold"] == 32
    assert report["sglang_version"] == "0.5.12" and report["gpu"] == "NVIDIA H200"
    assert set(report["transition"]) == {"A1", "A2"} and (out / "bench-plot.png").exists()
    assert "| 128 |" in r.output


def test_merge_refuses_runs_of_another_setup(tmp_path):
    """Folders of another threshold, one folder named twice, a folder that is no results
    folder, or a target that already holds cells: one paragraph, exit 2, nothing written."""
    from click.testing import CliRunner

    from spectool.cli import main

    high = _folder(tmp_path / "high", _sweep([64]))
    t12 = _folder(tmp_path / "t12", _sweep([64]), threshold=12)
    other_t = _folder(tmp_path / "acc2", [dict(c, acc_len=2.0) for c in _sweep([64])], threshold=16)
    cases = [
        (["--merge", str(high), "--merge", str(t12)], "threshold"),
        (["--acc-len", "2.0", "--merge", str(other_t), "--merge", str(high)], "threshold"),
        (["--merge", str(high), "--merge", str(high)], "named more than once"),
        (["--merge", str(tmp_path)], "has no cells.jsonl or transition.json"),
    ]
    # Cells whose warm-up wave ran only at an engine's first visit of a C (no `warmup` field)
    # and cells whose wave ran before every load do not pool.
    every_load = _folder(tmp_path / "every", [dict(c, warmup="before every load") for c in _sweep([64])])
    cases.append((["--merge", str(high), "--merge", str(every_load)], "warm-up"))
    for i, (args, needle) in enumerate(cases):
        out = tmp_path / f"m{i}"
        r = CliRunner().invoke(main, ["bench", "--out", str(out), *args])
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, (args, r.output)
        assert not out.exists()
    r = CliRunner().invoke(main, ["bench", "--out", str(high), "--merge", str(high)])
    assert r.exit_code == 2 and "already holds cells.jsonl" in r.output
    # One arm's cells from two releases (--arm-sglang-dir runs) do not pool.
    up14 = _folder(tmp_path / "up14", [dict(c, sglang="0.5.14") for c in _sweep([64])])
    up17 = _folder(tmp_path / "up17", [dict(c, sglang="0.5.17") for c in _sweep([64])])
    r = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "mix"), "--merge", str(up14), "--merge", str(up17)])
    assert r.exit_code == 2 and "cells were measured on SGLang 0.5.14, SGLang 0.5.17" in r.output
    assert not (tmp_path / "mix").exists()


def test_damaged_results_files_are_named_not_tracebacks(tmp_path):
    """A results folder damaged by hand or by a run cut while writing (a cut cells.jsonl line,
    a half-written transition.json or bench-results.json): --merge, --suggest-threshold and a
    resumed run stop with one paragraph naming the file (and line), exit 2, nothing written;
    a bug report (exit 3) would blame spectool for the user's file."""
    import shutil

    from click.testing import CliRunner

    from spectool.cli import main
    from spectool.errors import BadInputError
    from spectool.harness.bench.results import load_cells

    src = _folder(tmp_path / "src", _sweep([4, 64, 256]), transition={"A2": _transition([1.0] * 5)})  # 36 cells
    cases = [
        ("cells.jsonl", '{"arm": "A0", "C": 64, ', "cells.jsonl, line 37: not valid JSON"),
        ("cells.jsonl", "[1, 2]", "cells.jsonl, line 37: a cell is a JSON object, not list"),
        ("transition.json", "{not json", "transition.json: not valid JSON"),
        ("bench-results.json", '{"threshold": ', "bench-results.json: not valid JSON"),
    ]
    for i, (name, damage, needle) in enumerate(cases):
        run = tmp_path / f"run{i}"
        shutil.copytree(src, run)
        f = run / name
        f.write_text(f.read_text() + damage + "\n" if name == "cells.jsonl" else damage)
        for args in (
            ["--out", str(tmp_path / f"m{i}"), "--merge", str(run)],
            ["--suggest-threshold", "--out", str(run)],
        ):
            if name != "cells.jsonl" and "--suggest-threshold" in args:
                continue  # the threshold is read from the cells alone
            r = CliRunner().invoke(main, ["bench", *args])
            assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, (name, args, r.output)
        assert not (tmp_path / f"m{i}").exists()
        if name == "cells.jsonl":
            with pytest.raises(BadInputError, match="mend or delete that line"):
                load_cells(f, 3.0)


def test_merge_lists_each_runs_transition_beside_the_others(tmp_path):
    """Runs that each ran the transition merge: a transition is one engine's schedule against
    its own references, so each is kept and listed, the later ones under "ARM (FOLDER)", with
    the lowest phase of each; runs without host readings leave that column out."""
    from spectool.harness.bench.results import merge

    sweep = _folder(
        tmp_path / "sweep",
        _sweep([4, 64]),
        transition={"A1": _transition([1.0, 0.997, 1.01, 1.0, 1.02]), "A2": _transition([0.968, 1.0, 0.99, 1.0, 0.98])},
    )
    alone = _folder(tmp_path / "alone", [], transition={"A2": _transition([1.05, 1.01, 1.008, 1.02, 1.03])})
    report = merge(tmp_path / "m", [sweep, alone], 3.0)
    trans = report["transition"]
    assert list(trans) == ["A1", "A2", "A2 (alone)"]
    lowest = {k: round(min(r["ratio"] for r in rows), 3) for k, rows in trans.items()}
    assert lowest == {"A1": 0.997, "A2": 0.968, "A2 (alone)": 1.008}
    kept = json.loads((tmp_path / "m" / "transition.json").read_text())
    assert kept["A2 (alone)"]["arm"] == "A2" and kept["A2 (alone)"]["source"] == "alone"
    assert kept["A2"]["source"] == "sweep"
    table = (tmp_path / "m" / "bench-table.md").read_text()
    assert "| A2 (alone) | 5 | 4 |" in table and "Per transition: A2 0.968, A2 (alone) 1.008." in table
    assert "Controls, engines that never switch (what the schedule costs any engine): A1 0.997." in table


def test_merge_keeps_a_transitions_rounds(tmp_path):
    """A run whose transition has several rounds merges beside a run of one round: each keeps
    its own, the table has the round column (one round reads as round 1), and each
    transition's goal figure is the median of its rounds per phase."""
    from spectool.harness.bench.results import merge

    rounds = {"rounds": [_transition([1.0, 0.9, 1.0, 1.0, 1.0]), _transition([1.0, 0.98, 1.0, 1.0, 0.97])] * 2}
    sweep = _folder(tmp_path / "sweep", _sweep([4, 64]), transition={"A2": rounds})
    alone = _folder(tmp_path / "alone", [], transition={"A2": _transition([1.05, 1.01, 1.008, 1.02, 1.03])})
    report = merge(tmp_path / "m", [sweep, alone], 3.0)
    assert [len(rows) for rows in report["transition"].values()] == [20, 5]
    assert len(json.loads((tmp_path / "m" / "transition.json").read_text())["A2"]["rounds"]) == 4
    table = (tmp_path / "m" / "bench-table.md").read_text()
    assert "| A2 | 4 | 5 | 4 |" in table and "| A2 (alone) | 1 | 5 | 4 |" in table
    # Phase 2 of A2: 0.9, 0.98, 0.9, 0.98 -> 0.94; phase 5: 1.0, 0.97 twice -> 0.985.
    assert "Per transition: A2 0.940, A2 (alone) 1.008." in table
    assert "host CPUs busy" not in table
    hosted = _folder(tmp_path / "hosted", [], transition={"A2": _transition([1.0] * 5, host_busy_cpus=2.0)})
    merge(tmp_path / "h", [sweep, hosted], 3.0)
    assert "host CPUs busy" in (tmp_path / "h" / "bench-table.md").read_text()


def test_ratio_intervals_resample_each_arms_reps():
    """Bootstrap intervals of the ratios: a point where every rep agrees, an interval around
    the median ratio where they spread, the same numbers for the same seed, and nothing for
    an arm with fewer than three reps."""

    def cells(arm, C, values):
        return [{"arm": arm, "C": C, "rep": i, "output_tok_s": v} for i, v in enumerate(values)]

    flat = cells("A0", 64, [100] * 4) + cells("A4", 64, [97] * 4)
    assert analyze.ratio_intervals(flat, [64])[64]["A4/A0"] == [0.97, 0.97]
    spread = (
        cells("A0", 64, [100, 101, 99, 100, 102]) + cells("A4", 64, [90, 95, 97, 99, 100]) + cells("A2", 64, [98, 99])
    )
    iv = analyze.ratio_intervals(spread, [64])
    lo, hi = iv[64]["A4/A0"]
    point = analyze.ratios(analyze.medians(spread), [64])[64]["A4/A0"]
    assert 0.88 < lo < point < hi < 1.01, (lo, point, hi)
    assert analyze.ratio_intervals(spread, [64]) == iv, "seeded: the same report twice"
    assert "A2/A0" not in iv[64], "two reps are too few for an interval"
    md = analyze.interval_markdown(iv, [64])
    assert "| 64 | " in md and f"{lo:.3f}-{hi:.3f}" in md


def test_an_envelope_arm_that_always_loses_does_not_need_three_reps():
    """At C=1 EAGLE-3 beats plain decoding in every rep: A0's two reps cannot make it E in any
    resample, so A2/E gets its interval from A1's and A2's reps, while the ratios of A0 itself
    get none; where A0's reps reach A1's, they could, and A2/E gets none."""

    import statistics

    def cells(arm, values):
        return [{"arm": arm, "C": 1, "rep": i, "output_tok_s": v} for i, v in enumerate(values)]

    a1, a2 = [200, 180, 190, 210, 195], [185, 205, 190, 200, 178]
    both = cells("A1", a1) + cells("A2", a2)
    iv = analyze.ratio_intervals(cells("A0", [100, 110]) + both, [1])[1]
    assert set(iv) == {"A2/E"}
    low, high = iv["A2/E"]
    assert min(a2) / max(a1) < low < statistics.median(a2) / statistics.median(a1) < high < max(a2) / min(a1)
    assert analyze.ratio_intervals(cells("A0", [100, 190]) + both, [1])[1] == {}


def test_ratio_intervals_of_variants_at_one_acceptance():
    """A variant arm gets its interval against A0 like A4; cells of another acceptance are
    left out of the resampling, and an interval does not depend on which other C the report
    holds (each C draws from its own seed)."""

    def cells(arm, values, acc=3.0, C=64):
        return [{"arm": arm, "C": C, "rep": i, "acc_len": acc, "output_tok_s": v} for i, v in enumerate(values)]

    base = cells("A0", [100, 101, 99, 100]) + cells("A4", [97, 98, 96, 97]) + cells("A4C", [96, 97, 95, 96])
    iv = analyze.ratio_intervals(base, [64], 3.0)[64]
    point = analyze.ratios(analyze.medians(base, 3.0), [64])[64]
    for name in ("A4/A0", "A4C/A0"):
        lo, hi = iv[name]
        assert lo <= point[name] <= hi and hi - lo < 0.04, (name, lo, hi)
    noisy = base + cells("A4", [10, 20, 30], acc=2.0) + cells("A0", [1, 2, 3], C=128)
    assert analyze.ratio_intervals(noisy, [64], 3.0)[64] == iv


def test_per_run_ratios_take_each_runs_own_medians():
    """Two runs whose A0 differ by 10%: pooled cell by cell, A2's and A0's medians come from
    different runs and the ratio lands near neither run's; per run, each run's A2/A0 is its
    own (0.99 and 0.97), and the median run sits between them. One run has no per-run table."""

    def cells(src, a0, a2):
        return [
            {"arm": arm, "C": 64, "rep": i, "output_tok_s": v * (1 + 0.001 * i), "source": src}
            for arm, v in (("A0", a0), ("A2", a2))
            for i in range(3)
        ]

    pooled = cells("run1", 10000, 9900) + cells("run2", 9000, 8730) + cells("run3", 9500, 9310)
    per = analyze.per_run_ratios(pooled, [64])
    runs = per[64]["A2/A0"]["runs"]
    assert {k: round(v, 3) for k, v in runs.items()} == {"run1": 0.99, "run2": 0.97, "run3": 0.98}
    assert round(per[64]["A2/A0"]["median"], 3) == 0.98 and "A4/A0" not in per[64]
    md = analyze.per_run_markdown(per, [64])
    assert "| 64 | A2/A0 | 0.980 | 0.970-0.990 | 3 |" in md
    assert analyze.per_run_ratios(cells("run1", 10000, 9900), [64]) == {}
    assert analyze.per_run_markdown({}, [64]) == ""


def test_a_merge_reports_each_runs_ratio_and_its_sign_test(tmp_path):
    """Three runs merged: the report and its table carry each run's own ratio, the median run,
    its range, and against a goal the runs at or above it with the one-sided sign test (A4/A0
    0.985, 0.975, 0.960 against 0.98: 1 of 3, p = 7/8)."""
    from spectool.harness.bench.results import merge

    runs = [
        _folder(tmp_path / f"r{i}", [cell("A0", 64, 10000.0), cell("A2", 64, a2), cell("A4", 64, a4)])
        for i, (a2, a4) in enumerate(((9900.0, 9850.0), (9700.0, 9750.0), (9800.0, 9600.0)))
    ]
    report = merge(tmp_path / "pooled", runs, 3.0)
    per = report["per_run_ratios"]["64"]
    assert {k: round(v, 3) for k, v in per["A2/A0"]["runs"].items()} == {"r0": 0.99, "r1": 0.97, "r2": 0.98}
    a4 = per["A4/A0"]
    assert (round(a4["median"], 3), a4["goal"], a4["at_or_above"], a4["p_above"]) == (0.975, 0.98, 1, 0.875)
    table = (tmp_path / "pooled" / "bench-table.md").read_text()
    assert "| 64 | A2/A0 | 0.980 | 0.970-0.990 | 3 | - | - | - |" in table
    assert "| 64 | A4/A0 | 0.975 | 0.960-0.985 | 3 | 0.98 | 1 of 3 | 0.875 |" in table


def test_fresh_engines_start_engines_for_every_repetition():
    """--fresh-engines: each wave's steps split by repetition, so each repetition starts its
    own engines; the transition stays with repetition 0's engines, the rotation is kept, and
    a resumed run plans only the repetitions still missing."""
    from spectool.harness.bench.sweep import plan_steps, select_arms

    arms = select_arms(32, 256, ["A0", "A2", "A4"])
    plan = plan_steps(arms, [1, 64], 3, 3.0, set(), True, fresh_engines=True)
    assert len(plan) == 3 and all([a.name for a in w] == ["A0", "A2", "A4"] for w, _ in plan)
    reps = [{s[0] for s in steps if s is not None} for _, steps in plan]
    assert reps == [{0}, {1}, {2}]
    assert plan[0][1][-1] is None and all(None not in steps for _, steps in plan[1:])
    assert plan[1][1][0] == (1, 1, "A2"), "arm order rotated in rep 1"
    assert sum(len(s) for _, s in plan) == len(plan_steps(arms, [1, 64], 3, 3.0, set(), True)[0][1])
    done = {(a, C, r, 3.0) for r in (0, 1) for C in (1, 64) for a in ("A0", "A2", "A4")}
    [(wave, steps)] = plan_steps(arms, [1, 64], 3, 3.0, done, False, fresh_engines=True)
    assert {s[0] for s in steps} == {2}
    # Each repetition starts only the engines with cells left in it.
    gaps = {(a, C, r, 3.0) for r in range(3) for C in (1, 64) for a in ("A0", "A2", "A4")}
    gaps -= {("A0", 1, 0, 3.0), ("A4", 64, 1, 3.0)}
    plan = plan_steps(arms, [1, 64], 3, 3.0, gaps, False, fresh_engines=True)
    assert [([a.name for a in w], steps) for w, steps in plan] == [(["A0"], [(0, 1, "A0")]), (["A4"], [(1, 64, "A4")])]


def test_per_run_ratios_count_each_fresh_engine_set_as_a_run():
    """Cells of one run measured with --fresh-engines carry their engine set: each repetition
    is a run of its own in the per-run table, and merged folders keep them apart by source."""
    cells = [
        {"arm": arm, "C": 64, "rep": r, "output_tok_s": v * f, "engines": f"rep{r}"}
        for r, f in enumerate((1.0, 0.98, 1.01))
        for arm, v in (("A0", 10000), ("A4", 9800 if r else 9700))
    ]
    per = analyze.per_run_ratios(cells, [64])[64]["A4/A0"]
    assert sorted(per["runs"]) == ["rep0", "rep1", "rep2"] and round(per["median"], 3) == 0.98
    merged = cells + [{**c, "source": "other"} for c in cells]
    assert len(analyze.per_run_ratios(merged, [64])[64]["A4/A0"]["runs"]) == 6


def test_the_sign_test_says_when_a_median_run_clears_its_goal_beyond_noise():
    """3 of 4 runs over the bar is a median run over it by chance one time in three; 7 of 8
    or 5 of 5 is not chance at the 5% level. Ratios without a goal (A2/A0) carry none."""
    assert analyze.sign_test_above([0.970, 0.986, 0.986, 0.983], 0.98) == (3, 4, 5 / 16)
    assert analyze.sign_test_above([0.99] * 7 + [0.97], 0.98)[2] == 9 / 256
    assert analyze.sign_test_above([0.981] * 5, 0.98) == (5, 5, 1 / 32)
    cells = [
        {"arm": arm, "C": 64, "rep": 0, "output_tok_s": v, "source": src}
        for src, a4 in (("r1", 9850), ("r2", 9700))
        for arm, v in (("A0", 10000), ("A2", 9900), ("A4", a4))
    ]
    per = analyze.per_run_ratios(cells, [64])[64]
    assert per["A4/A0"]["at_or_above"] == 1 and per["A4/A0"]["p_above"] == 0.75 and "goal" not in per["A2/A0"]
    md = analyze.per_run_markdown({64: per}, [64])
    assert "| 64 | A4/A0 | 0.978 | 0.970-0.985 | 2 | 0.98 | 1 of 2 | 0.750 |" in md
    assert "| 64 | A2/A0 | 0.990 | 0.990-0.990 | 2 | - | - | - |" in md


def test_a_merge_divides_each_ratio_within_the_runs_that_measured_both_sides(tmp_path):
    """An A1/A3 run merged beside an A0/A1/A2 run: pooling medians arm by arm would divide
    the first run's A2 by both runs' A1 (A1 at C=4 is 1400 in one and 1540 in the other, the
    pooled median 1540: A2/E 1436/1540 = 0.932); each ratio comes from the runs that measured
    its arms instead: A2/E = 1436/1400 = 1.026 as in the first run, A3/A1 = 1.010 as in the
    second. The arm columns still pool every run's reps."""
    from spectool.harness.bench.results import merge

    first = _folder(
        tmp_path / "a0a1a2",
        [
            cell(arm, C, v * C / 4, rep)
            for rep in range(2)
            for C in (1, 4)
            for arm, v in (("A0", 800.0), ("A1", 1400.0), ("A2", 1436.0))
        ],
    )
    second = _folder(
        tmp_path / "a1a3",
        [
            cell(arm, C, v * C / 4, rep)
            for rep in range(4)
            for C in (1, 4)
            for arm, v in (("A1", 1540.0), ("A3", 1555.4))
        ],
    )
    alone = {src: analyze.ratios(analyze.load_medians(src), [1, 4]) for src in (first, second)}
    report = merge(tmp_path / "pooled", [first, second], 3.0)
    for C in ("1", "4"):
        assert report["ratios"][C]["A2/E"] == pytest.approx(alone[first][int(C)]["A2/E"]) == pytest.approx(1436 / 1400)
        assert report["ratios"][C]["A3/A1"] == pytest.approx(alone[second][int(C)]["A3/A1"]) == pytest.approx(1.01)
    assert report["cells"]["A1@4"]["reps"] == 6 and report["cells"]["A1@4"]["median"] == 1540.0
    row = next(
        line for line in (tmp_path / "pooled" / "bench-table.md").read_text().splitlines() if line.startswith("| 4 |")
    )
    assert "| 1.026 |" in row and "| 0.932 |" not in row


def test_rank_sum_p_is_the_exact_mann_whitney_p():
    """Five runs all above five others: 2 of the 252 splits are that far apart (p = 0.0079);
    identical runs: p = 1; large samples use the normal approximation."""
    assert analyze.rank_sum_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(2 / 252)
    assert analyze.rank_sum_p([1, 2, 3], [1, 2, 3]) == 1.0
    assert analyze.rank_sum_p([1.0, 2.0], [1.5]) == 1.0
    assert analyze.rank_sum_p(range(20), range(20)) > 0.9 and analyze.rank_sum_p(range(20), range(30, 50)) < 1e-6
    with pytest.raises(ValueError):
        analyze.rank_sum_p([], [1])


def test_plots_label_the_measured_concurrencies_even_in_a_band_without_a_power_of_two(tmp_path):
    """A log2 axis labels only powers of two, which would leave a band such as C = 40, 48, 56
    bare: the axis names each measured C, once, in order, where the labels have room."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([40, 48, 56], [1, 2, 3], label="a run")
    analyze._finish(fig, ax, "y", "t", tmp_path / "p.png", [56, 40, 48, 40])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["40", "48", "56"]
    assert list(ax.get_xticks(minor=True)) == [] and (tmp_path / "p.png").stat().st_size > 0
    # Beside the sweep the band's labels would print over each other: 40 keeps one, 48 and
    # 56 a bare tick, and every power of two its label.
    assert analyze.tick_labels([1, 2, 4, 8, 16, 32, 40, 48, 56, 64, 128, 256]) == [
        "1",
        "2",
        "4",
        "8",
        "16",
        "32",
        "40",
        "",
        "",
        "64",
        "128",
        "256",
    ]
    m = analyze.medians(_sweep([40, 48, 56], ("A0", "A1", "A2")))
    analyze.plot(m, [40, 48, 56], {"A0": "no speculation", "A2": "patched"}, tmp_path / "band.png", "band")
    assert (tmp_path / "band.png").stat().st_size > 0


def test_a_folder_holds_one_target(tmp_path):
    """Cells of the MoE target carry `target`: a folder of 8B cells is refused at --target
    qwen3-30b-a3b (and the reverse), before any GPU is looked for, and cannot be merged with
    one of the other target; the report and its plot title name the target."""
    from click.testing import CliRunner

    from spectool.cli import main
    from spectool.errors import BadInputError
    from spectool.harness.bench.results import load_cells

    dense = _folder(tmp_path / "dense", _sweep([64, 128]))
    res = CliRunner().invoke(main, ["bench", "--out", str(dense), "--target", "qwen3-30b-a3b"])
    assert res.exit_code == 2 and "--target llama-8b" in res.output and "Traceback" not in res.output
    cells = analyze.read_cells(dense / "cells.jsonl")
    moe = _folder(tmp_path / "moe", [{**c, "target": "qwen3-30b-a3b"} for c in cells])
    _, done = load_cells(moe / "cells.jsonl", 3.0, target="qwen3-30b-a3b")
    assert len(done) == len(cells)
    with pytest.raises(BadInputError, match="--target qwen3-30b-a3b"):
        load_cells(moe / "cells.jsonl", 3.0)
    r = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "m"), "--merge", str(dense), "--merge", str(moe)])
    assert r.exit_code == 2 and "target" in r.output and not (tmp_path / "m").exists()
    assert summarize(tmp_path, analyze.read_cells(moe / "cells.jsonl"), [64], 32, 3.0, None, {})["target"] == (
        "qwen3-30b-a3b"
    )
    assert "target" not in summarize(dense, cells, [64], 32, 3.0, None, {})


def test_a_plot_puts_long_variant_labels_below_its_axes_and_wraps_them(tmp_path, monkeypatch):
    """A variant's label lists its overrides (hundreds of characters): inside the axes it would
    cover the curves or run off the figure, so the legend goes below them, each label wrapped;
    short labels stay inside. A run without A1 draws no envelope."""
    long_label = "patched, " + ", ".join(f"field_{i}=value_{i}" for i in range(12))
    drawn = []
    finish = analyze._finish
    monkeypatch.setattr(analyze, "_finish", lambda fig, ax, *a: (drawn.append(ax), finish(fig, ax, *a)))
    m = analyze.medians(_sweep([1, 16, 64], ("A0", "A2")))
    analyze.plot(m, [1, 16, 64], {"A0": "no speculation", "A2": long_label}, tmp_path / "p.png", "t")
    analyze.plot(m, [1, 16, 64], {"A0": "no speculation", "A2": "patched"}, tmp_path / "q.png", "t")
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "q.png").stat().st_size > 0
    long, short = ([t.get_text() for t in ax.get_legend().get_texts()] for ax in drawn)
    assert long[0] == short[0] == "A0: no speculation" and short[1] == "A2: patched"
    assert "\n" in long[1] and long[1].replace("\n    ", " ") == f"A2: {long_label}"
    below, inside = (ax.get_legend().get_bbox_to_anchor().y0 < ax.get_window_extent().y0 for ax in drawn)
    assert below and not inside
    assert not any("envelope" in label for label in long + short)


def test_a_variant_measured_in_an_earlier_run_keeps_its_label(tmp_path, monkeypatch):
    """A variant's cells carry its label: a later run over the same folder that does not
    define it (the derived stage of a tiers sweep) still names it in the legend, not by its
    bare name."""
    legends = []
    monkeypatch.setattr(analyze, "plot", lambda m, cs, arms, path, title: legends.append(dict(arms)))
    cells = _sweep([1, 16], ("A0", "A1"))
    cells += [
        {**c, "arm": "S2", "label": "EAGLE-3 (chain, topk 1), speculative_num_steps=2"}
        for c in _sweep([1, 16], ("A1",))
    ]
    summarize(tmp_path, cells, [1, 16], 32, 3.0, None, {})
    assert legends[0]["S2"] == "EAGLE-3 (chain, topk 1), speculative_num_steps=2"
