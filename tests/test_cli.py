"""The CLI through click's runner: exit codes, one-paragraph errors, the JSON schema."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from spectool.cli import main

from .conftest import FIXTURES, make_tree

TARGET = "sglang/srt/target.py"
RECIPES = str(FIXTURES / "add_method" / "recipe")


def _tree(tmp_path, src=None, version="0.5.12"):
    before = src if src is not None else (FIXTURES / "add_method" / "before.py").read_bytes()
    return make_tree(tmp_path / "tree", version, {TARGET: before})


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _json(result):
    """Parse a --json report and validate it against the published schema."""
    import jsonschema

    from spectool.report import schema

    data = json.loads(result.output)
    jsonschema.validate(data, schema())
    assert data["schema_version"] == 1
    return data


def test_apply_check_status_revert_json(tmp_path):
    tree = _tree(tmp_path)
    r = run("check", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--json")
    assert r.exit_code == 0
    d = _json(r)
    assert d["command"] == "check" and d["sglang_version"] == "0.5.12"
    assert d["recipes"][0]["status"] == "would-apply"

    r = run("apply", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--dry-run", "--json")
    assert r.exit_code == 1, "dry-run exits 1 when something would change"
    assert "+    def twice" in _json(r)["diff"]
    assert not (tree / "spectool.lock").exists()

    r = run("apply", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--json")
    assert r.exit_code == 0 and _json(r)["recipes"][0]["status"] == "applied"
    r = run("apply", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--json")
    assert r.exit_code == 0 and _json(r)["recipes"][0]["status"] == "already-applied"
    r = run("apply", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--dry-run")
    assert r.exit_code == 0

    r = run("status", "--sglang-dir", tree, "--json")
    d = _json(r)
    assert r.exit_code == 0 and d["files"][0]["state"] == "intact" and d["recipes"][0]["id"] == "fx-add-method"

    lock = json.loads((tree / "spectool.lock").read_text())
    assert lock["sglang_version"] == "0.5.12" and TARGET in lock["files"]
    assert set(lock["files"][TARGET]) == {"before", "after"}

    r = run("revert", "--sglang-dir", tree)
    assert r.exit_code == 0
    assert (tree / TARGET).read_bytes() == (FIXTURES / "add_method" / "before.py").read_bytes()


def test_drift_exit_1_with_candidates(tmp_path):
    src = (FIXTURES / "add_method" / "before.py").read_text().replace("class Worker:", "class WorkerV2:")
    tree = _tree(tmp_path, src.encode())
    r = run("apply", "--sglang-dir", tree, "--recipes-dir", RECIPES)
    assert r.exit_code == 1
    assert "drift" in r.output and "WorkerV2" in r.output
    d = _json(run("check", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--json"))
    err = d["recipes"][0]["error"]
    assert err["kind"] == "drift" and err["recipe"] == "fx-add-method" and err["file"] == TARGET
    assert err["operation"] == 1 and err["op"] == "add_method" and any("WorkerV2" in c for c in err["candidates"])


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p: p / "nothing-here", "is not a directory"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "does not hold SGLang"),
    ],
)
def test_bad_directory_exit_2(tmp_path, make, needle):
    r = run("check", "--sglang-dir", make(tmp_path), "--recipes-dir", RECIPES)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_broken_recipe_exit_2(tmp_path):
    tree = _tree(tmp_path)
    rdir = tmp_path / "r" / "x"
    shutil.copytree(RECIPES, rdir)
    y = (rdir / "recipe.yaml").read_text()
    (rdir / "recipe.yaml").write_text(y.replace('versions: ">=0.1"', "versions: 0.5"))
    r = run("check", "--sglang-dir", tree, "--recipes-dir", rdir.parent)
    assert r.exit_code == 2 and "must be str" in r.output and "quote version strings" in r.output
    (rdir / "recipe.yaml").write_text(y.replace("    operations:", "    flavour: x\n    operations:"))
    r = run("check", "--sglang-dir", tree, "--recipes-dir", rdir.parent)
    assert r.exit_code == 2 and "unknown key(s) ['flavour']" in r.output and "recipe.yaml" in r.output
    (rdir / "recipe.yaml").write_text(y)
    (rdir / "code.py").write_text("class Worker:\n    def twice(self, x:\n        pass\n")
    r = run("check", "--sglang-dir", tree, "--recipes-dir", rdir.parent)
    assert r.exit_code == 2 and "syntax error" in r.output and "code.py" in r.output


def test_errors_follow_the_schema(tmp_path):
    r = run("check", "--sglang-dir", tmp_path / "missing", "--recipes-dir", RECIPES, "--json")
    assert r.exit_code == 2
    assert _json(r)["error"]["kind"] == "source"
    r = run("revert", "--sglang-dir", _tree(tmp_path), "--json")
    assert r.exit_code == 0 and "nothing to revert" in _json(r)["notes"][0]


def test_unknown_version(tmp_path):
    tree = _tree(tmp_path, version="0.0.1")
    r = run("check", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--json")
    assert r.exit_code == 1
    assert _json(r)["recipes"][0]["status"] == "unsupported"
    r = run("check", "--sglang-dir", tree, "--recipes-dir", RECIPES, "--sglang-version", "not-a-version")
    assert r.exit_code == 2 and "not a PEP 440 version" in r.output


def test_select_unknown_recipe(tmp_path):
    r = run(
        "check", "--sglang-dir", _tree(tmp_path), "--recipes-dir", str(FIXTURES / "add_method"), "--recipes", "nope"
    )
    assert r.exit_code == 2 and "unknown recipe id" in r.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--arms", "A0,A9"], "unknown arm(s) ['A9']"),
        (["--acc-len", "high"], "expected numbers such as 3.0"),
        (["--concurrency", "64,abc"], "expected request counts of 1 or more"),
        (["--concurrency", "0,64"], "expected request counts of 1 or more"),
        (["--out-len", "1"], "1 is not in the range x>=2"),
        (["--max-engines", "0"], "0 is not in the range x>=1"),
        (["--variant", "A4D=A9:X=1"], "base arm 'A9' is not one of"),
        (["--arm-sglang-dir", "UP"], "expected NAME=DIR"),
        (["--arm-sglang-dir", "UP=/nonexistent/site"], "/nonexistent/site is not a directory"),
    ],
)
def test_bench_bad_input_is_one_paragraph_exit_2(tmp_path, args, needle):
    """Checked before any GPU probe, so the message is the same on a laptop and on the H200."""
    r = run("bench", "--out", tmp_path / "b", *args)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_bench_arm_sglang_dir_refuses_an_arm_the_run_does_not_measure(tmp_path):
    tree = tmp_path / "site"
    (tree / "sglang/srt").mkdir(parents=True)
    (tree / "sglang/__init__.py").write_text("")
    (tree / "sglang/version.py").write_text('__version__ = "0.5.17"\n')
    r = run("bench", "--out", tmp_path / "b", "--arms", "A0,A1", "--arm-sglang-dir", f"A2={tree}")
    assert r.exit_code == 2 and "--arm-sglang-dir names A2, which this run does not measure" in r.output
    assert "Traceback" not in r.output
    r = run("bench", "--out", tmp_path / "b", "--arm-sglang-dir", f"A1={tree}", "--arm-sglang-dir", f"A1={tree}")
    assert r.exit_code == 2 and "arm A1 is given twice" in r.output


def test_bench_suggest_threshold_per_acceptance(tmp_path):
    """--suggest-threshold reads recorded cells (no GPU); with several acceptances, one folder each."""
    for acc, loses_from in ((2.0, 16), (3.0, 64)):
        folder = tmp_path / f"acc-{acc:g}"
        folder.mkdir()
        cells = [
            {
                "arm": arm,
                "C": C,
                "rep": 0,
                "acc_len": acc,
                "output_tok_s": (100 * C if arm == "A0" else (150 * C if C < loses_from else 50 * C)),
            }
            for arm in ("A0", "A1")
            for C in (1, 4, 16, 64, 256)
        ]
        (folder / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))
    r = run("bench", "--out", tmp_path, "--acc-len", "2.0,3.0", "--suggest-threshold", "--concurrency", "1,4,16,64,256")
    assert r.exit_code == 0, r.output
    assert "acceptance 2: suggested threshold 4" in r.output and "acceptance 3: suggested threshold 16" in r.output
    # Without --concurrency, every C the folder measured counts (finer points merged in);
    # a grid step of more than 25% around the crossover names the counts to measure.
    folder = tmp_path / "acc-3"
    extra = [
        {"arm": arm, "C": 32, "rep": 0, "acc_len": 3.0, "output_tok_s": 100 * 32 if arm == "A0" else 150 * 32}
        for arm in ("A0", "A1")
    ]
    with (folder / "cells.jsonl").open("a") as f:
        f.write("\n" + "\n".join(json.dumps(c) for c in extra))
    r = run("bench", "--out", folder, "--suggest-threshold")
    assert r.exit_code == 0 and "suggested threshold 32" in r.output, r.output
    assert "between 32 and 64: measure --concurrency 40,48,56 --arms A0,A1" in r.output
    r = run("bench", "--out", folder, "--suggest-threshold", "--concurrency", "1,4,16,64")
    assert "suggested threshold 16" in r.output and "measure --concurrency 28,40,52" in r.output
    r = run("bench", "--out", tmp_path / "empty", "--suggest-threshold")
    assert r.exit_code == 2 and "has no cells.jsonl" in r.output and "Traceback" not in r.output


def test_bench_suggest_tiers(tmp_path):
    """--suggest-tiers reads the fixed configurations' cells (no GPU): the per-C table and the
    flags; bad --tier-arms and a folder with one configuration are refused (exit 2)."""
    speeds = {"A0": (100, 100, 100), "S1": (120, 130, 95), "A1": (150, 110, 90)}  # C = 1, 16, 64
    cells = [
        {"arm": arm, "C": C, "rep": 0, "acc_len": 3.0, "output_tok_s": v * C}
        for arm, vs in speeds.items()
        for C, v in zip((1, 16, 64), vs)
    ]
    (tmp_path / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))
    r = run("bench", "--out", tmp_path, "--suggest-tiers")
    assert r.exit_code == 0, r.output
    assert "| C | 3 steps (A1) | 1 step (S1) | 0 steps (A0) | fastest | tier |" in r.output
    assert (
        "suggested: --speculative-num-steps 3 --speculative-num-steps-tiers 3,1,0 "
        "--speculative-num-steps-tier-boundaries 1,16" in r.output
    )
    assert (
        "measure them: spectool bench --threshold 16 --variant 'TIER3-1-0_1-16=A2:speculative_num_steps=3;"
        "speculative_num_draft_tokens=4;speculative_num_steps_tiers=3,1,0;"
        "speculative_num_steps_tier_boundaries=1,16' (and the same options)" in r.output
    )
    assert (
        "on SGLang's own adaptive steps (0.5.14 and later, no hysteresis): "
        "--speculative-num-steps 3 --speculative-adaptive --speculative-adaptive-config FILE, FILE holding "
        '{"1":{"candidate_steps":[3]' in r.output
    )
    assert (
        "measure it beside them: --variant 'UP3-1-0_1-16=A1:speculative_num_steps=3;speculative_num_draft_tokens=4;"
        "speculative_adaptive=true;speculative_adaptive_config=FILE' --arm-sglang-dir UP3-1-0_1-16=DIR" in r.output
    )
    assert "on 0.5.17 upstream's draft extend at 1 draft step runs without a CUDA graph" in r.output
    assert "one run: its repetitions share their engines" in r.output
    r = run("bench", "--out", tmp_path, "--suggest-tiers", "--json")
    assert json.loads(r.output)["boundaries"] == [1, 16]
    assert (json.loads(r.output)["runs"], json.loads(r.output)["disputed"]) == (1, [])
    assert set(json.loads(r.output)["upstream_adaptive_config"]) == {"1", "2", "17"}
    assert json.loads(r.output)["upstream_eager_draft_extend"] == [1]
    for arms, needle in (("3=A1,x=A0", "'x=A0' is not STEPS=ARM"), ("3=A1,3=S1", "3 steps are named twice")):
        r = run("bench", "--out", tmp_path, "--suggest-tiers", "--tier-arms", arms)
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output
    r = run("bench", "--out", tmp_path, "--suggest-tiers", "--tier-arms", "3=A1,2=S2")
    assert r.exit_code == 2 and "holds 1 of the configurations 3=A1,2=S2" in r.output
    # 3 steps ahead again at C=64 after 1 step at 16: served, named with its lead, and the
    # engine started at the longest tier's steps; a draft ahead after plain decoding is named.
    speeds = {"A0": (100, 100, 100, 150, 100), "S1": (120, 130, 130, 100, 120), "A1": (150, 110, 140, 90, 90)}
    cells = [
        {"arm": arm, "C": C, "rep": 0, "acc_len": 3.0, "output_tok_s": v * C}
        for arm, vs in speeds.items()
        for C, v in zip((1, 16, 64, 128, 256), vs)
    ]
    (tmp_path / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))
    r = run("bench", "--out", tmp_path, "--suggest-tiers")
    assert (
        "--speculative-num-steps 3 --speculative-num-steps-tiers 3,1,3,0 --speculative-num-steps-tier-boundaries 1,16,64"
        in r.output
    )
    assert "at C=64 a longer draft comes back: 3 draft steps, 7.7% ahead of 1 draft step there (served" in r.output
    assert "at C=256 a draft is the fastest after plain decoding took over: the tiers keep plain decoding" in r.output


def test_bench_suggest_tiers_names_the_runs_that_disagree(tmp_path):
    """A folder pooled from two runs (--merge keeps each cell's `source`): where one run had
    another configuration ahead of the tier's, the suggestion says so."""
    speeds = {"run-01": {"A0": (100, 100), "A1": (150, 80)}, "run-02": {"A0": (100, 100), "A1": (95, 90)}}
    cells = [
        {"arm": arm, "C": C, "rep": 0, "acc_len": 3.0, "output_tok_s": v * C, "source": src}
        for src, arms in speeds.items()
        for arm, vs in arms.items()
        for C, v in zip((1, 64), vs)
    ]
    (tmp_path / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))
    r = run("bench", "--out", tmp_path, "--suggest-tiers")
    assert r.exit_code == 0, r.output
    assert (
        "the runs pooled here disagree with the tiers at C=1: no speculation led the tier's 3 draft steps "
        "in run-02 (1 of 2 runs that measured both): measure more runs there before serving them"
    ) in r.output
    assert "the runs pooled here order the configurations as the tiers do at C=64" in r.output
    # Agreement is claimed only where two runs measured both; elsewhere the C is named.
    cells = [c for c in cells if not (c["source"] == "run-02" and c["C"] == 1)]
    (tmp_path / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))
    r = run("bench", "--out", tmp_path, "--suggest-tiers")
    assert "the runs pooled here order the configurations as the tiers do at C=64" in r.output
    assert "at C=1 fewer than two runs measured the tier's configuration and another" in r.output


# Each fixed configuration's tok/s per request at C = 1, 16, 64, at two acceptances.
ACROSS_SPEEDS = {
    3.0: {"A0": (100, 100, 100), "S1": (120, 130, 90), "S2": (150, 160, 80), "A1": (200, 150, 70)},
    2.0: {"A0": (100, 100, 100), "S1": (110, 95, 80), "S2": (120, 90, 70), "A1": (115, 85, 60)},
}


def _acceptance_folders(out, speeds=ACROSS_SPEEDS, cs=(1, 16, 64)):
    """A folder acc-N per acceptance, its cells.jsonl holding `speeds` (acceptance -> arm ->
    tok/s per request at each of `cs`; None: that cell not measured)."""
    for acc, arms in speeds.items():
        folder = out / f"acc-{acc:g}"
        folder.mkdir(parents=True)
        cells = [
            {"arm": arm, "C": C, "rep": 0, "acc_len": acc, "output_tok_s": v * C}
            for arm, vs in arms.items()
            for C, v in zip(cs, vs)
            if v is not None
        ]
        (folder / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))


def test_bench_suggest_tiers_over_several_acceptances(tmp_path):
    """With --acc-len naming several acceptances (a folder acc-N each), --suggest-tiers prints
    each one's tiers, then the one schedule whose worst ratio over all of them is highest;
    --json gives one document, keyed by acceptance as a measuring run's, the schedule under
    `across`. One acceptance prints no such schedule."""
    _acceptance_folders(tmp_path)
    r = run("bench", "--out", tmp_path, "--acc-len", "2.0,3.0", "--suggest-tiers")
    assert r.exit_code == 0, r.output
    assert "acceptance 2:" in r.output and "acceptance 3:" in r.output
    assert "every acceptance (2, 3), one schedule:\n| C | tier | at acceptance 2 | at acceptance 3 |" in r.output
    assert (
        "suggested: --speculative-num-steps 3 --speculative-num-steps-tiers 3,2,0 "
        "--speculative-num-steps-tier-boundaries 1,16" in r.output.split("one schedule")[1]
    )
    assert "its worst: 0.900 of the fastest fixed configuration, at C=16 and acceptance 2" in r.output
    assert "left out" not in r.output
    r = run("bench", "--out", tmp_path, "--acc-len", "2.0,3.0", "--suggest-tiers", "--json")
    doc = json.loads(r.output)
    assert set(doc) == {"schema_version", "2", "3", "across"}
    assert (doc["2"]["tiers"], doc["3"]["tiers"], doc["across"]["tiers"]) == ([2, 0], [3, 2, 0], [3, 2, 0])
    assert doc["across"]["worst"] == [pytest.approx(0.9), 16, 2.0]
    r = run("bench", "--out", tmp_path, "--acc-len", "2.0,3.0", "--suggest-threshold", "--json")
    assert r.exit_code == 0 and set(json.loads(r.output)) == {"schema_version", "2", "3"}
    for acc in ("2", "3"):
        r = run("bench", "--out", tmp_path / f"acc-{acc}", "--acc-len", acc, "--suggest-tiers")
        assert r.exit_code == 0 and "every acceptance" not in r.output, r.output
        r = run("bench", "--out", tmp_path / f"acc-{acc}", "--acc-len", acc, "--suggest-tiers", "--json")
        assert json.loads(r.output)["tiers"] == doc[acc]["tiers"]


def test_one_schedule_leaves_out_what_one_acceptance_lacks(tmp_path):
    """A configuration, or a C, measured at one acceptance only is left out of the one
    schedule (and said so), as a folder's tiers leave out what it lacks."""
    speeds = {3.0: ACROSS_SPEEDS[3.0], 2.0: {a: v for a, v in ACROSS_SPEEDS[2.0].items() if a != "S2"}}
    speeds[2.0]["S1"] = (110, None, 80)
    _acceptance_folders(tmp_path, speeds)
    r = run("bench", "--out", tmp_path, "--acc-len", "2.0,3.0", "--suggest-tiers")
    assert r.exit_code == 0, r.output
    across = r.output.split("one schedule:")[1]
    assert "| 1 | 3 | 1.000 | 1.000 |\n| 64 | 0 | 1.000 | 1.000 |\n" in across
    assert (
        "left out: S2 (not measured at every acceptance); C=16 (not every configuration measured there at "
        "every acceptance)" in across
    )


@pytest.mark.parametrize(
    "speeds, cs, args, needle",
    [
        (  # no C measured at both acceptances
            ACROSS_SPEEDS,
            {3.0: (1, 16, 64), 2.0: (2, 8, 32)},
            [],
            "none was: all of them were measured at acceptance 2 at C=2,8,32 and at acceptance 3 at C=1,16,64",
        ),
        (  # no two configurations measured at both
            {3.0: {"A1": (200, 150, 70), "S2": (150, 160, 80)}, 2.0: {"S1": (110, 95, 80), "A0": (100, 100, 100)}},
            None,
            [],
            "holds none at every acceptance, and A1, S2, S1, A0 at some only",
        ),
        (  # --concurrency naming a C not measured
            ACROSS_SPEEDS,
            None,
            ["--concurrency", "1,5"],
            "did not measure for every configuration: C=5 lacks A1, S2, S1, A0. It measured all of them at C=1,16,64",
        ),
        (  # --concurrency naming a C one configuration lacks
            {3.0: ACROSS_SPEEDS[3.0], 2.0: {**ACROSS_SPEEDS[2.0], "S1": (110, None, 80)}},
            None,
            ["--concurrency", "1,16"],
            "acc-2 did not measure for every configuration: C=16 lacks S1",
        ),
        (ACROSS_SPEEDS, None, ["--acc-len", "2.0,3.0,2.5"], "acc-2.5 has no cells.jsonl"),
        (ACROSS_SPEEDS, None, ["--acc-len", "2.0,nan"], "--acc-len '2.0,nan': expected numbers"),
    ],
    ids=["no-common-C", "no-common-configurations", "C-not-measured", "C-one-lacks", "no-folder", "nan"],
)
def test_one_schedule_refuses_acceptances_it_cannot_join(tmp_path, speeds, cs, args, needle):
    """What one schedule for every acceptance cannot be derived from is refused in a paragraph
    (exit 2), text and --json alike, never a traceback nor an empty schedule."""
    for acc, arms in speeds.items():
        _acceptance_folders(tmp_path, {acc: arms}, (cs or {}).get(acc, (1, 16, 64)))
    (tmp_path / "acc-2.5").mkdir()
    for json_flag in ([], ["--json"]):
        r = run("bench", "--out", tmp_path, "--acc-len", "2.0,3.0", "--suggest-tiers", *args, *json_flag)
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tp", "4"], "2 attention heads, which TP=4 cannot split"),
        (["--tp", "2", "--record"], "record at --tp 1"),
        (["--only", "eagle3-t4,eagle3-kv"], "no engine config named eagle3-kv; the configs are base-graph"),
    ],
)
def test_verify_bad_input_is_one_paragraph_exit_2(tmp_path, args, needle):
    """Refused before any tree or GPU is looked at: a TP the golden model cannot be split for,
    recording golden files with the TP>1 model (their tokens would not be the TP=1 ones), an
    and an --only name that is no engine config (a typo would run the baselines alone and
    pass)."""
    r = CliRunner().invoke(main, ["verify", "--out", str(tmp_path / "v"), *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "v").exists()


def test_importing_the_cli_loads_neither_harness_nor_libcst_nor_rich():
    """`spectool --version`, status, fetch and the pre-commit gate's start stay light: the GPU
    harness is loaded by the verify and bench commands, libcst by planning, rich by tables."""
    import subprocess
    import sys

    code = (
        "import spectool.cli, sys; "
        "print(sorted(m for m in sys.modules if m.startswith(('spectool.harness', 'libcst', 'rich'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


def _help(*command):
    r = run(*command, "--help")
    assert r.exit_code == 0, r.output
    return r.output


READS_RECIPES = {"apply", "check", "upgrade", "gate", "verify"}


@pytest.mark.parametrize("command", sorted(main.list_commands(None)))
def test_every_command_states_its_exit_codes_and_takes_json(command):
    from spectool.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERNAL, EXIT_OK

    text = _help(command)
    block = text[text.index("Exit codes:") :]
    lines = [line.strip() for line in block.splitlines()[1:] if line.strip()]
    codes = [int(line.split()[0]) for line in lines if line.split()[0].isdigit()]
    assert codes == [EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL], block
    assert f"{EXIT_BAD_INPUT}  bad input or usage" in block and f"{EXIT_INTERNAL}  internal error" in block
    assert "exit 0 or 1" not in text.lower()
    assert "--json" in text
    assert ("--recipes IDS" in text and "--recipes-dir" in text) == (command in READS_RECIPES), text


def test_exit_codes_in_help_are_what_the_commands_return(tmp_path):
    """check's help says 1 for a recipe that would not apply and 2 for bad input; it does."""
    text = " ".join(_help("check").split())
    assert "1 a recipe would not apply" in text and "2 bad input or usage" in text
    tree = _tree(tmp_path, version="0.0.1")
    assert run("check", "--sglang-dir", tree, "--recipes-dir", RECIPES).exit_code == 1
    assert run("check", "--sglang-dir", tmp_path / "none", "--recipes-dir", RECIPES).exit_code == 2
    assert run("check", "--no-such-option").exit_code == 2


def test_gate_json_without_a_pin(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.11\n")
    r = run("gate", req, "--json")
    d = _json(r)
    assert r.exit_code == 0 and d["command"] == "gate" and d["ok"] and d["upgrades"] == []
    assert "no SGLang requirement in the changed files" in d["notes"][0]


@pytest.mark.network
def test_gate_json_reports_each_pinned_release(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("sglang==0.5.12\n")
    r = run("gate", req, "--json", "--recipes", "sm120")
    d = _json(r)
    assert r.exit_code == 0 and d["command"] == "gate" and d["ok"], r.output
    [up] = d["upgrades"]
    assert up["command"] == "upgrade" and up["to"] == "0.5.12" and up["needs_work"] == []
    assert [x["id"] for x in up["recipes"]] == ["sm120"] and up["recipes"][0]["status"] == "would-apply"


def test_suggest_threshold_refuses_a_folder_without_cells_at_that_acceptance(tmp_path):
    import json

    from click.testing import CliRunner

    from spectool.cli import main

    cell = {"arm": "A0", "C": 1, "acc_len": 2.0, "output_tok_s": 100.0}
    (tmp_path / "cells.jsonl").write_text(json.dumps(cell) + "\n")
    res = CliRunner().invoke(main, ["bench", "--suggest-threshold", "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "no cells at acceptance 3" in res.output and "holds 2 (pass --acc-len)" in res.output


def test_bench_suggest_threshold_refuses_a_folder_without_both_arms(tmp_path):
    """A run cut off before A1 measured anything holds A0 alone: no T is suggested (exit 2,
    naming the arms to measure), where "never wins" would turn speculation off."""
    cells = [{"arm": "A0", "C": C, "rep": 0, "acc_len": 3.0, "output_tok_s": 100.0 * C} for C in (1, 16, 64)]
    (tmp_path / "cells.jsonl").write_text("\n".join(json.dumps(c) for c in cells))
    r = run("bench", "--out", tmp_path, "--suggest-threshold", "--json")
    assert r.exit_code == 2 and "A0 and A1 were not both measured" in r.output and "--arms A0,A1" in r.output
