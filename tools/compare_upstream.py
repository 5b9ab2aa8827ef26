"""Our fallback (SGLang 0.5.12 + recipes) against upstream's batch-size switch (0.5.17's
steps-0 adaptive tier, driven by the same flag through the threshold recipe), both measured
on the same H200 with the same bench: A2/E per C, run by run below T, table and plot. And
the draft-length tiers (0.5.12, `--suggest-tiers`' TIER arm) against both: each arm over its
own run's envelope max(no-spec, EAGLE-3 at 3 steps), runs of the same bench on one H200 kind.
And the tiers against upstream's adaptive steps with the same tiers, measured in one run.
And each tiers sweep against the goals of the tiers: the tiered arm over the fastest fixed
configuration, over the envelope, and over upstream's adaptive steps of the same run. And the
tiers derived at one acceptance, run at another (from the fixed configurations' cells).

    python tools/compare_upstream.py   # writes comparison.{md,png} beside upstream's runs,
                                       # comparison-tiers.{md,png} beside the tiers sweep,
                                       # comparison.md beside the same-run tiers sweep,
                                       # goals.md beside every tiers sweep,
                                       # cross-acceptance.md beside each acceptance-2.0 one
"""

from pathlib import Path
from statistics import median

from spectool.harness.bench import analyze

ROOT = Path(__file__).resolve().parent.parent
OURS = ROOT / "results/0.5.12/h200/bench-envelope"
UPSTREAM = ROOT / "results/0.5.17/h200/bench-upstream-tiers"
NAMES = {"0.5.12 + spectool fallback": OURS, "0.5.17 upstream steps-0 tier": UPSTREAM}
CS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TIERS = ROOT / "results/0.5.12/h200/bench-tiers"
TIER_CS = [1, 16, 32, 48, 64, 128, 256]
SAME_RUN = ROOT / "results/0.5.12/h200/bench-tiers-upstream"
# Each target's tiers sweeps at two acceptances (cross-acceptance.md beside the second).
ACCEPTANCE_PAIRS = {
    "8B": {3.0: TIERS, 2.0: ROOT / "results/0.5.12/h200/bench-tiers-acc2"},
    "MoE": {3.0: ROOT / "results/0.5.12/h200/bench-tiers-moe", 2.0: ROOT / "results/0.5.12/h200/bench-tiers-moe-acc2"},
}
# Every tiers sweep (goals.md beside each; tier_goals_markdown reads its arms from it).
TIER_SWEEPS = [
    TIERS,
    ROOT / "results/0.5.12/h200/bench-tiers-acc2",
    ROOT / "results/0.5.12/h200/bench-tiers-moe",
    ROOT / "results/0.5.12/h200/bench-tiers-moe-acc2",
    ROOT / "results/0.5.12/h200/bench-tiers-vs-fixed",
    ROOT / "results/0.5.12/h200/bench-tiers-moe-vs-fixed",
    ROOT / "results/0.5.17/h200/bench-tiers",
    ROOT / "results/0.5.17/h200/bench-tiers-vs-upstream-band",
    ROOT / "results/0.5.17/h200/bench-tiers-moe-vs-upstream",
    ROOT / "results/0.5.17/h200/bench-tiers-moe-ttft",
]


def tier_ratios(folder: Path = TIERS, arm: str = "TIER", concurrencies=TIER_CS) -> dict:
    """C -> {"A2/E": arm/E, "A2/A0": arm/A0} of the tiered arm, in the keys the A2 tables and
    plots read: arm/E = (arm/A0) / max(1, A1/A0), E being max(A0, A1) of the same run."""
    out = {}
    for C, r in analyze.load_ratios(folder, concurrencies, 3.0).items():
        if f"{arm}/A0" in r and "A1/A0" in r:
            out[C] = {"A2/E": r[f"{arm}/A0"] / max(1.0, r["A1/A0"]), "A2/A0": r[f"{arm}/A0"]}
    return out


def tiers_comparison() -> tuple[str, dict]:
    """The tiered arm, the binary switch and upstream's steps-0 tier over their envelopes per
    C, and tiered / upstream (the goal: at least 1 at every C)."""
    rat = {
        "0.5.12 + spectool tiers (TIER)": tier_ratios(),
        **{name: analyze.load_ratios(folder, TIER_CS, 3.0) for name, folder in NAMES.items()},
    }
    names = list(rat)
    lines = [
        "| C | " + " | ".join(f"{n}: arm/E" for n in names) + " | tiers / upstream |",
        "|" + "---|" * (2 + len(names)),
    ]
    for C in TIER_CS:
        vals = [rat[n].get(C, {}).get("A2/E") for n in names]
        ratio = vals[0] / vals[-1] if vals[0] and vals[-1] else None
        lines.append(f"| {C} | " + " | ".join(map(analyze.or_dash, vals)) + f" | {analyze.or_dash(ratio)} |")
    return "\n".join(lines) + "\n", rat


def same_run_markdown(
    folder: Path = SAME_RUN, ours: str = "TIER", theirs: str = "UP2-0_48", concurrencies=TIER_CS
) -> str:
    """Two arms of one run (cells interleaved on one GPU, each arm on its own release): per C
    each one's median tok/s with its repetitions' range, each over plain decoding (A0) of the
    same run, and ours / theirs."""
    cells = analyze.read_cells(folder / "cells.jsonl")
    m = analyze.medians(cells, 3.0)
    release = {c["arm"]: c.get("sglang") for c in cells}
    label = {a: f"{a} ({release.get(a)})" for a in ("A0", ours, theirs)}
    lines = [
        f"| C | {label['A0']} tok/s | {label[ours]} tok/s | {label[theirs]} tok/s "
        f"| {ours}/A0 | {theirs}/A0 | {ours}/{theirs} |",
        "|" + "---|" * 7,
    ]
    for C in concurrencies:
        if not all((a, C) in m for a in ("A0", ours, theirs)):
            continue
        a0, us, up = (m[(a, C)] for a in ("A0", ours, theirs))
        span = lambda r: f"{r['median']:.0f} ({r['min']:.0f}-{r['max']:.0f}, {r['reps']})"  # noqa: E731
        lines.append(
            f"| {C} | {span(a0)} | {span(us)} | {span(up)} | {us['median'] / a0['median']:.3f} "
            f"| {up['median'] / a0['median']:.3f} | {us['median'] / up['median']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def tier_goals_markdown(folder: Path) -> str:
    """Per C, the tiered arm's median over each goal's reference, all of the same run: the
    fastest of the fixed configurations (and which it is), the envelope max(A0, A1), and
    upstream's adaptive steps with the same tiers; `-` where the run lacks one of them. The
    folder names them: the tiered arm and upstream's as `--suggest-tiers` names them (TIER...,
    UP...), the fixed configurations in its suggested-tiers.json (else those of A0, A1, S2 and S1 it
    measured, if one of them speculates: a run of a few C against the configurations that win
    there; plain decoding alone is the envelope's, not a tier's), the acceptance in its
    bench-results.json. Where both arms of a ratio have three repetitions or more, its 90%
    bootstrap interval follows it, so a tie can be told from a loss. A folder pooled from
    several runs adds a run-by-run table (`_run_by_run`). Where the run has the
    transition workload, a last line gives its goal's figure: the lowest phase/steady, each
    phase the median of its rounds; a control's beside it (analyze.is_control) has a line of
    its own."""
    cells = analyze.read_cells(folder / "cells.jsonl")
    report = analyze.read_json(folder / "bench-results.json")
    acc_len = report["acc_len"]
    m = analyze.medians(cells, acc_len)
    reps = analyze.rep_values(cells, acc_len)
    names = list(dict.fromkeys(c["arm"] for c in cells))
    tiered = next(a for a in names if a.startswith("TIER"))
    upstream = next((a for a in names if a.startswith("UP")), None)
    suggested = folder / "suggested-tiers.json"
    if suggested.exists():
        fixed_arms = list(analyze.read_json(suggested)["arms"].values())
    else:
        fixed_arms = [a for a in ("A0", "A1", "S2", "S1") if a in names]
        fixed_arms = fixed_arms if set(fixed_arms) - {"A0"} else []

    def ratio(C, other):
        """The tiered arm's median over `other`'s at C, with its interval where both have it."""
        iv = analyze.median_ratio_interval(reps[(tiered, C)], reps[(other, C)], seed=f"{other}:{C}")
        text = analyze.or_dash(m[(tiered, C)]["median"] / m[(other, C)]["median"])
        return text + (f" ({iv[0]:.3f}-{iv[1]:.3f})" if iv else "")

    head = ["C", f"{tiered} tok/s", "fastest fixed", f"{tiered}/fixed", f"{tiered}/E"]
    if upstream:
        head.append(f"{tiered}/{upstream}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    concurrencies = sorted({c for a, c in m if a == tiered})
    env = analyze.envelope(m, concurrencies)
    for C in concurrencies:
        us = m[(tiered, C)]["median"]
        fixed = {a: m[(a, C)]["median"] for a in fixed_arms if (a, C) in m}
        best = max(fixed, key=fixed.get) if fixed and len(fixed) == len(fixed_arms) else None
        row = [
            str(C),
            f"{us:.0f}",
            f"{best} {fixed[best]:.0f}" if best else "-",
            ratio(C, best) if best else "-",
            analyze.or_dash(us / env[C] if C in env else None),
        ]
        if upstream:
            row.append(ratio(C, upstream) if (upstream, C) in m else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines += _run_by_run(cells, acc_len, tiered, fixed_arms, concurrencies)
    for arm, lowest in analyze.lowest_phase_ratios(report.get("transition") or {}).items():
        rounds = max((r.get("round", 1) for r in report["transition"][arm]), default=1)
        each = f"each phase the median of {rounds} rounds" if rounds > 1 else "one round"
        lines.append(f"\nTransition workload on {arm}: lowest phase/steady {lowest:.3f} ({each}).")
    for arm, lowest in analyze.lowest_phase_ratios(report.get("transition") or {}, controls=True).items():
        lines.append(f"\nThe same schedule on {arm}, a control that never switches: lowest phase/steady {lowest:.3f}.")
    for arm, rows in (report.get("transition") or {}).items():
        if analyze.never_switched(rows) and not analyze.is_control(arm, rows):
            lines.append(f"\nTransition workload on {arm}: no figure, the engine never switched in it.")
    return "\n".join(lines) + "\n"


def _run_by_run(cells, acc_len, tiered, fixed_arms, concurrencies) -> list[str]:
    """For a folder pooled from several runs: per C, the tiered arm's median over each fixed
    configuration's within each run; the goal's figure, the median over the runs of the
    tiered arm over that run's fastest fixed configuration, and in how many runs it was
    below 1; and how far each arm's median moved between the runs (highest over lowest):
    whether a gap to a fixed configuration outlasts fresh engines. The goal's figure counts
    only the runs that measured every fixed configuration at that C."""
    runs = {analyze.run_name(r): analyze.medians(cs, acc_len) for r, cs in analyze.cells_by_run(cells).items()}
    if len(runs) < 2:
        return []
    lines = [
        "",
        f"Run by run: {tiered} over each fixed configuration of the same run, the median over the runs of "
        f"{tiered} over the run's fastest (in how many runs it is below 1), and each arm's median between the "
        "runs (highest / lowest):",
        "",
        "| C | " + " | ".join(runs) + " | median of runs | between runs |",
        "|" + "---|" * (len(runs) + 3),
    ]
    arms = [tiered, *fixed_arms]
    for C in concurrencies:
        row, to_fastest = [str(C)], []
        for m in runs.values():
            own = {a: m[(tiered, C)]["median"] / m[(a, C)]["median"] for a in fixed_arms if (a, C) in m}
            row.append(", ".join(f"{a} {r:.3f}" for a, r in own.items()) if (tiered, C) in m and own else "-")
            if (tiered, C) in m and len(own) == len(fixed_arms):
                to_fastest.append(min(own.values()))  # over the fastest: the smallest ratio
        below = sum(r < 1 for r in to_fastest)
        row.append(f"{median(to_fastest):.3f} ({below} of {len(to_fastest)})" if to_fastest else "-")
        spread = []
        for a in arms:
            vals = [m[(a, C)]["median"] for m in runs.values() if (a, C) in m]
            if len(vals) > 1:
                spread.append(f"{a} {max(vals) / min(vals):.3f}")
        row.append(", ".join(spread) or "-")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def cross_acceptance_markdown(folders: dict) -> str:
    """Tiers derived at one acceptance, run at another: per C, the fixed configuration the
    tiers of each folder (acceptance -> folder, its suggested-tiers.json) pick, read from the
    other folder's medians over the fastest fixed configuration there. A prediction from the
    fixed configurations' cells, not a measurement of a tiered engine (at their own
    acceptance the measured tiered arm reads the goals.md ratios). A last line gives the one
    schedule whose worst ratio over both acceptances is highest (analyze.suggest_tiers_across)."""
    med, tiers = {}, {}
    for acc, folder in folders.items():
        med[acc] = analyze.medians(analyze.read_cells(folder / "cells.jsonl"), acc)
        sug = analyze.read_json(folder / "suggested-tiers.json")
        tiers[acc] = (sug["tiers"], sug["boundaries"], {int(k): v for k, v in sug["arms"].items()})
    arms = next(iter(tiers.values()))[2]
    every_c = {C for m in med.values() for _, C in m}
    concurrencies = sorted(C for C in every_c if all((a, C) in m for m in med.values() for a in arms.values()))

    def picks(acc, C):
        t, bounds, _ = tiers[acc]
        return t[sum(C > b for b in bounds)]

    accs = sorted(folders, reverse=True)
    fmt_tiers = lambda acc: f"{','.join(map(str, tiers[acc][0]))} at {','.join(map(str, tiers[acc][1]))}"  # noqa: E731
    head = ["C"] + [f"fastest at {a}" for a in accs]
    head += [f"tiers of {a} ({fmt_tiers(a)}) at {b}" for a in accs for b in accs if b != a]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for C in concurrencies:
        row = [str(C)]
        to_fastest = {acc: analyze.ratios_to_fastest(med[acc], arms, C) for acc in accs}
        for acc in accs:
            best = max(to_fastest[acc], key=to_fastest[acc].get)
            row.append(f"{arms[best]} ({best} steps)")
        for a in accs:
            for b in accs:
                if b != a:
                    steps = picks(a, C)
                    row.append(f"{to_fastest[b][steps]:.3f} ({arms[steps]})")
        lines.append("| " + " | ".join(row) + " |")
    across = analyze.suggest_tiers_across(med, concurrencies, arms)
    worst, C, acc = across["worst"]
    lines.append(
        f"\nOne schedule for both acceptances (spectool bench --suggest-tiers over both): "
        f"{across['flags'] or across['why']}; worst {worst:.3f} (C={C}, acceptance {acc})."
    )
    return "\n".join(lines) + "\n"


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
    md, rat = tiers_comparison()
    (TIERS / "comparison-tiers.md").write_text(md)
    same = same_run_markdown()
    (SAME_RUN / "comparison.md").write_text(same)
    print(same)
    for pair in ACCEPTANCE_PAIRS.values():
        cross = cross_acceptance_markdown(pair)
        (pair[2.0] / "cross-acceptance.md").write_text(cross)
        print(f"{pair[2.0].relative_to(ROOT)}:\n{cross}")
    for folder in TIER_SWEEPS:
        goals = tier_goals_markdown(folder)
        (folder / "goals.md").write_text(goals)
        print(f"{folder.relative_to(ROOT)}:\n{goals}")
    analyze.plot_ratio(
        rat, TIER_CS, TIERS / "comparison-tiers.png", "H200, Llama-3.1-8B shape, acceptance 3.0: arm / envelope"
    )
    print(md)
