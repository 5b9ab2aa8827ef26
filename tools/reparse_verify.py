"""Re-evaluate a recorded `spectool verify` run from its engine outputs and logs (no GPU).

For a release where the switch is upstream's, the fallback counters come from the engine
logs; this recomputes them with the current parser (spectool/verify/upstream_log.py) at the
workload bounds the run recorded, and re-runs the comparison and the path checks.

    python tools/reparse_verify.py results/verify-0.5.17   # writes verify-results-reparsed.json
"""

import json
import sys
import tarfile
from pathlib import Path

from rich.console import Console

from spectool.verify import runner, scenarios
from spectool.verify.upstream_log import stats_at_decode_line

ROOT = Path(__file__).resolve().parent.parent


def main(folder: Path) -> int:
    report = json.loads((folder / "verify-results.json").read_text())
    with tarfile.open(folder / "verify-logs.tgz") as tar:
        files = {Path(m.name).name: tar.extractfile(m).read().decode(errors="replace") for m in tar.getmembers() if m.isfile()}
    skipped = {r["config"]: r["skipped"] for r in report["scenarios"] if r.get("skipped")}
    # The baselines and the speculative engines the recorded run had (added ones never ran there).
    recorded = {r["config"] for r in report["scenarios"]}
    cfgs = [c for c in scenarios.configs() if c.name not in skipped and (c.algorithm is None or c.name in recorded)]
    results = {}
    for c in cfgs:
        out = files.get(f"{c.name}.out.json")
        if out is None:
            results[c.name] = {"ok": False, "error": "engine failed in the recorded run", "log_tail": files.get(f"{c.name}.log", "")[-2000:]}
            continue
        res = json.loads(out)
        log = files.get(f"{c.name}.log", "").replace("\r", "\n").splitlines()
        if c.algorithm and report.get("counters_from", "").startswith("engine log"):
            for w in res["workloads"].values():
                b, a = (sum(snap.get(k, 0) for k in ("fallback_steps", "spec_steps")) for snap in (w["stats_before"], w["stats_after"]))
                w["stats_before"] = stats_at_decode_line(log, b, 3, c.threshold)
                w["stats_after"] = stats_at_decode_line(log, a, 3, c.threshold)
        results[c.name] = res
    wls = scenarios.workloads()
    models = {"meta": report["model"]}
    new = runner.evaluate(results, cfgs, wls, models, report["sglang_version"], report["gpu_arch"], report["gpu"],
                          ROOT / "golden", False, skipped,
                          recipe_counters=not report.get("counters_from", "").startswith("engine log"),
                          tp_size=report.get("tp_size", 1))
    new["tp_size"] = report.get("tp_size", 1)
    new["reparsed_from"] = "verify-results.json + verify-logs.tgz of the recorded run (tools/reparse_verify.py)"
    (folder / "verify-results-reparsed.json").write_text(json.dumps(new, indent=2))
    new.setdefault("wall_seconds", report.get("wall_seconds"))
    runner.print_report(new, Console(file=sys.stdout, width=160))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
