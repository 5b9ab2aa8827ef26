"""Re-evaluate a recorded `spectool verify` run from its engine outputs and logs (no GPU).

For a release where the switch is upstream's, the fallback counters come from the engine
logs; this recomputes them with the current parser (spectool/harness/verify/upstream_log.py) at the
workload bounds the run recorded, and re-runs the comparison and the path checks.

    python tools/reparse_verify.py results/verify-0.5.17   # writes verify-results-reparsed.json

A run cut off before it wrote verify-results.json (the device call's time limit) still has
its finished engines' outputs in verify-logs.tgz: `--like REPORT` takes the release, GPU and
model from a complete run's report and evaluates the engines that finished:

    python tools/reparse_verify.py results/verify-0.5.17/session10-partial --like results/verify-0.5.17/verify-results.json
"""

import json
import sys
import tarfile
from pathlib import Path

from rich.console import Console

from spectool.harness.verify import runner, scenarios
from spectool.harness.verify.upstream_log import stats_at_decode_line

ROOT = Path(__file__).resolve().parent.parent


def _from_log(report: dict) -> bool:
    """Whether the run read its counters from the engine logs (upstream's switch)."""
    return report.get("counters_from", "").startswith("engine log")


def _engine_files(folder: Path) -> dict:
    with tarfile.open(folder / "verify-logs.tgz") as tar:
        return {Path(m.name).name: tar.extractfile(m).read().decode(errors="replace") for m in tar.getmembers() if m.isfile()}


def _result(files: dict, c, from_log: bool) -> dict:
    """One engine's recorded output; where the switch is upstream's, its counters re-read
    from its log at the workload bounds the run recorded."""
    res = json.loads(files[f"{c.name}.out.json"])
    if c.algorithm and from_log:
        log = files.get(f"{c.name}.log", "").replace("\r", "\n").splitlines()
        for w in res["workloads"].values():
            b, a = (sum(snap.get(k, 0) for k in ("fallback_steps", "spec_steps")) for snap in (w["stats_before"], w["stats_after"]))
            w["stats_before"] = stats_at_decode_line(log, b, 3, c.threshold)
            w["stats_after"] = stats_at_decode_line(log, a, 3, c.threshold)
    return res


def _evaluate(report: dict, cfgs, results: dict, skipped: dict) -> dict:
    new = runner.evaluate(results, cfgs, scenarios.workloads(), {"meta": report["model"]}, report["sglang_version"],
                          report["gpu_arch"], report["gpu"], ROOT / "golden", False, skipped,
                          recipe_counters=not _from_log(report))
    new["tp_size"] = report.get("tp_size", 1)
    return new


def main(folder: Path) -> int:
    report = json.loads((folder / "verify-results.json").read_text())
    files = _engine_files(folder)
    from_log = _from_log(report)
    skipped = {r["config"]: r["skipped"] for r in report["scenarios"] if r.get("skipped")}
    # The baselines and the speculative engines the recorded run had (added ones never ran there).
    recorded = {r["config"] for r in report["scenarios"]}
    cfgs = [c for c in scenarios.configs() if c.name not in skipped and (c.algorithm is None or c.name in recorded)]
    results = {}
    for c in cfgs:
        if f"{c.name}.out.json" not in files:
            results[c.name] = {"ok": False, "error": "engine failed in the recorded run", "log_tail": files.get(f"{c.name}.log", "")[-2000:]}
            continue
        results[c.name] = _result(files, c, from_log)
    new = _evaluate(report, cfgs, results, skipped)
    new["reparsed_from"] = "verify-results.json + verify-logs.tgz of the recorded run (tools/reparse_verify.py)"
    (folder / "verify-results-reparsed.json").write_text(json.dumps(new, indent=2))
    new.setdefault("wall_seconds", report.get("wall_seconds"))
    runner.print_report(new, Console(file=sys.stdout, width=160))
    return 0


def partial(folder: Path, like: Path) -> int:
    """A run cut off before its report: the engines that finished, evaluated as `like`'s run
    (same release, GPU, model and counters) into verify-results-partial.json."""
    report = json.loads(like.read_text())
    files = _engine_files(folder)
    from_log = _from_log(report)
    finished = sorted(n[: -len(".out.json")] for n in files if n.endswith(".out.json"))
    cfgs = [c for c in scenarios.configs() if c.name in finished]
    started = sorted(n[: -len(".log")] for n in files if n.endswith(".log"))
    new = _evaluate(report, cfgs, {c.name: _result(files, c, from_log) for c in cfgs}, {})
    new["partial"] = {"finished": finished, "not_finished": [n for n in started if n not in finished],
                      "evaluated_as": str(like)}
    (folder / "verify-results-partial.json").write_text(json.dumps(new, indent=2))
    runner.print_report(new, Console(file=sys.stdout, width=160))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--like" in args:
        i = args.index("--like")
        sys.exit(partial(Path(args[0]), Path(args[i + 1])))
    sys.exit(main(Path(args[0])))
