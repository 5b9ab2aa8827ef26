"""Evaluate a golden GPU run again, on this machine, with the scenarios of this tree: the
engines' outputs in a results folder's verify-logs.tgz are compared by spectool's own
`evaluate()`, and the folder's verify-results.json is rewritten (the run's own report stays
in its verify.log), so that the published rows are what this tree's claims say of the data.

Usage: python tools/evaluate_verify_run.py RESULTS_FOLDER [--kept grammar,logprob,...]
(--kept: the request kinds the release keeps speculating, as `runner.kept_speculative`
reads them from the patched tree; none on 0.5.12 and from 0.5.16 on)."""

from __future__ import annotations

import argparse
import json
import re
import tarfile
from pathlib import Path

from spectool.harness.verify import runner, scenarios

ROOT = Path(__file__).resolve().parent.parent


def engine_outputs(folder: Path) -> tuple[dict, dict]:
    """(config -> the engine's recorded output, config -> its log lines): the .out.json and
    .log files in a results folder's verify-logs.tgz."""
    outs, logs = {}, {}
    with tarfile.open(folder / "verify-logs.tgz") as tar:
        for m in tar.getmembers():
            name = Path(m.name).name
            if m.isfile() and name.endswith(".out.json"):
                outs[name[: -len(".out.json")]] = json.loads(tar.extractfile(m).read())
            elif m.isfile() and name.endswith(".log"):
                text = tar.extractfile(m).read().decode(errors="replace")
                logs[name[: -len(".log")]] = text.replace("\r", "\n").splitlines()
    return outs, logs


def engine_skips(rows: list[dict], outs: dict) -> dict:
    """config -> why the run skipped that engine, from its report's skipped rows: a row skipped
    for its reference names the reference's reason ("its reference NAME: why"), not its own
    engine's, which ran. Engines with outputs ran, whatever a row says."""
    skipped = {}
    for row in rows:
        why = row.get("skipped")
        if not why:
            continue
        ref = re.fullmatch(r"its reference (\S+): (.*)", why, re.S)
        name, why = (ref[1], ref[2]) if ref else (row["config"], why)
        if name not in outs:
            skipped[name] = why
    return skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--kept", default="", help="request kinds the release keeps speculating")
    args = ap.parse_args()
    path = args.folder / "verify-results.json"
    old = json.loads(path.read_text())
    outs, _ = engine_outputs(args.folder)
    cfgs = [c for c in scenarios.configs() if c.name in outs]
    skipped = engine_skips(old["scenarios"], outs)
    models = {"meta": old["model"], **({"moe": {"meta": old["moe_model"]}} if old.get("moe_model") else {})}
    report = runner.evaluate(
        outs,
        cfgs,
        scenarios.workloads(),
        models,
        old["sglang_version"],
        old["gpu_arch"],
        old["gpu"],
        ROOT / "golden",
        False,
        skipped,
        recipe_counters=old["counters_from"] == "spectool stats file",
        kept_kinds=frozenset(k for k in args.kept.split(",") if k),
    )
    for key in ("tp_size", "counters_from", "wall_seconds", "model_build_log"):
        report[key] = old.get(key)
    report["engines"] = old["engines"]
    report["golden_file"] = str(Path(report["golden_file"]).relative_to(ROOT))  # as verify names it
    path.write_text(json.dumps(report, indent=2))
    print(f"{path}: ok={report['ok']}; failed: {[r['scenario'] for r in report['scenarios'] if not r['ok']]}")


if __name__ == "__main__":
    main()
