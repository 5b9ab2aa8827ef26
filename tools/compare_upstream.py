"""Our fallback (SGLang 0.5.12 + recipes) against upstream's batch-size switch (0.5.17's
steps-0 adaptive tier, driven by the same flag through the threshold recipe), both measured
on the same H200 with the same bench: A2/E per C, run by run below T, table and plot.

    python tools/compare_upstream.py   # writes comparison.{md,png} beside upstream's runs
"""

from pathlib import Path

from spectool.harness.bench import analyze

ROOT = Path(__file__).resolve().parent.parent
OURS = ROOT / "results/0.5.12/h200/bench-envelope"
UPSTREAM = ROOT / "results/0.5.17/h200/bench-upstream-tiers"
NAMES = {"0.5.12 + spectool fallback": OURS, "0.5.17 upstream steps-0 tier": UPSTREAM}
CS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def comparison_markdown(folders: dict = NAMES, concurrencies=CS) -> str:
    """The A2/E table of every folder (name -> folder), then each folder's runs side by side
    with the rank-sum p of the two sets (whether one engine's runs sit apart from the
    other's, or the gap between two medians is run-to-run noise)."""
    rat = {name: analyze.load_ratios(folder, concurrencies, 3.0) for name, folder in folders.items()}
    md = analyze.compare_markdown(rat, concurrencies)
    md += (
        "\nRun by run (each run's own A2/E; rank-sum p: the chance of runs this far apart if both engines' "
        "runs came from one distribution):\n\n"
    )
    return md + analyze.compare_runs_markdown(
        {name: analyze.read_cells(folder / "cells.jsonl") for name, folder in folders.items()}, concurrencies
    )


if __name__ == "__main__":
    md = comparison_markdown()
    (UPSTREAM / "comparison.md").write_text(md)
    analyze.plot_ratio(
        {name: analyze.load_ratios(folder, CS, 3.0) for name, folder in NAMES.items()},
        CS,
        UPSTREAM / "comparison.png",
        "H200, Llama-3.1-8B shape, acceptance 3.0: A2 / envelope",
    )
    print(md)
