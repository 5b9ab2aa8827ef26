"""Our fallback (SGLang 0.5.12 + recipes) against upstream's batch-size switch (0.5.17's
steps-0 adaptive tier, driven by the same flag through the threshold recipe), both measured
on the same H200 with the same bench: A2/E per C, table and plot.

    python tools/compare_upstream.py   # writes results/upstream-comparison.{md,png}
"""

from pathlib import Path

from spectool.harness.bench import analyze
from spectool.harness.bench.arms import arms

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "0.5.12 + final recipes (T=32, sessions 17-20; no A1 at C=64)": ROOT / "results/bench-0.5.12-pooled-s17-s20",
    "0.5.12 + spectool fallback, final recipes (T=32, session 11)": ROOT / "results/bench-0.5.12-s11",
    "0.5.12 + final recipes, all runs since session 9 pooled": ROOT / "results/bench-0.5.12-pooled-s9-s20",
    "0.5.12 + spectool fallback (T=32, session 9)": ROOT / "results/bench-0.5.12-session9",
    "0.5.12 + fallback, KV-only sync graphs (session 6)": ROOT / "results/bench-0.5.12",
    "0.5.12 + fallback, eager KV-only sync (session 5)": ROOT / "results/bench-0.5.12-session5-85503b5",
    "0.5.12 + fallback, full draft decode sync (session 4)": ROOT / "results/bench-0.5.12-session4-89a1cd9",
    "0.5.12 + fallback, draft extend sync (session 3)": ROOT / "results/bench-0.5.12-session3-extend",
    "0.5.12 + fallback, late plan (session 2)": ROOT / "results/bench-0.5.12-late-rev94d8611",
    "0.5.17 upstream steps-0 tier (T=32, sessions 3 and 20)": ROOT / "results/bench-0.5.17-pooled-s3-s20",
}
# Run by run, below T (where both speculate) and above: ours against upstream's, each run's
# own ratio, and whether the two sets of runs differ beyond run-to-run noise.
OURS, UPSTREAM = list(RUNS)[0], list(RUNS)[-1]
CS = [1, 2, 4, 8, 16, 32, 64, 128, 256]

if __name__ == "__main__":
    for name, folder in RUNS.items():
        if not (folder / "bench-plot.png").exists():  # a run whose raw files did not come back
            labels = {a.name: a.label for a in arms(32) if a.name != "A3"}  # these runs predate A3
            analyze.plot(analyze.load_medians(folder), CS, labels, folder / "bench-plot.png",
                         f"{name}: H200, Llama-3.1-8B shape, acceptance 3.0 (from bench-table.md)")
    rat = {name: analyze.load_ratios(folder, CS, 3.0) for name, folder in RUNS.items()}
    md = analyze.compare_markdown(rat, CS)
    md += ("\nRun by run (each run's own A2/E; rank-sum p: the chance of runs this far apart if both engines' "
           "runs came from one distribution):\n\n")
    md += analyze.compare_runs_markdown(
        {name: analyze.read_cells(RUNS[name] / "cells.jsonl") for name in (OURS, UPSTREAM)}, CS)
    (ROOT / "results/upstream-comparison.md").write_text(md)
    analyze.plot_ratio(rat, CS, ROOT / "results/upstream-comparison.png",
                       "H200, Llama-3.1-8B shape, acceptance 3.0: A2 / envelope")
    print(md)
