"""Re-evaluate a recorded `spectool verify` run from its engine outputs and logs (no GPU).

For a release where the switch is upstream's, the fallback counters come from the engine
logs; this recomputes them with the current parser (spectool/verify/upstream_log.py) at the
workload bounds the run recorded, and re-runs the comparison and the path checks.

    python tools/reparse_verify.py results/verify-0.5.17   # writes verify-results-reparsed.json
"""

import io
import json
import sys
import tarfile
from pathlib import Path

from rich.console import Console

from spectool.verify import runner, scenarios
from spectool.verify.upstream_log import DECODE, stats_from_log

ROOT = Path(__file__).resolve().parent.parent


def main(folder: Path) -> int:
    report = json.loads((folder / "verify-results.json").read_text())
    with tarfile.open(folder / "verify-logs.tgz") as tar:
        files = {Path(m.name).name: tar.extractfile(m).read().decode(errors="replace") for m in tar.getmembers() if m.isfile()}
    skipped = {r["config"]: r["skipped"] for r in report["scenarios"] if r.get("skipped")}
    cfgs = [c for c in scenarios.configs() if c.name not in skipped]
    results = {}
    for c in cfgs:
        out = files.get(f"{c.name}.out.json")
        if out is None:
            results[c.name] = {"ok": False, "error": "engine failed in the recorded run", "log_tail": files.get(f"{c.name}.log", "")[-2000:]}
            continue
        res = json.loads(out)
        log = files.get(f"{c.name}.log", "").replace("\r", "\n").splitlines()
        if c.algorithm and report.get("counters_from", "").startswith("engine log"):
            decode_at = [i for i, ln in enumerate(log) if DECODE.search(ln)]

            def upto(n):
                return "\n".join(log[: decode_at[n - 1] + 1]) if n else ""

            for w in res["workloads"].values():
                b = sum(w["stats_before"].get(k, 0) for k in ("fallback_steps", "spec_steps"))
                a = sum(w["stats_after"].get(k, 0) for k in ("fallback_steps", "spec_steps"))
                w["stats_before"], w["stats_after"] = (stats_from_log(upto(b), 3, c.threshold), stats_from_log(upto(a), 3, c.threshold))
        results[c.name] = res
    wls = scenarios.workloads()
    models = {"meta": report["model"]}
    new = runner.evaluate(results, cfgs, wls, models, report["sglang_version"], report["gpu_arch"], report["gpu"],
                          ROOT / "golden", False, skipped)
    new["reparsed_from"] = "verify-results.json + verify-logs.tgz of the recorded run (tools/reparse_verify.py)"
    (folder / "verify-results-reparsed.json").write_text(json.dumps(new, indent=2))
    new.setdefault("wall_seconds", report.get("wall_seconds"))
    runner.print_report(new, Console(file=sys.stdout, width=160))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
