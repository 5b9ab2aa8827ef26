"""Envelope, ratios, the threshold rule, tables and the plot, from recorded cells (CPU-only)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import textwrap
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

from ...errors import BadInputError
from .arms import DEFAULT_ARMS as BUILT_IN  # the rest are variants


def quantile(sorted_xs: list[float], q: float) -> float:
    """The q-quantile of an ascending list (nearest rank): the one convention of the bench's
    spreads and intervals."""
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def _groups(cells: list[dict], acc_len: float | None) -> dict:
    """(arm, C) -> the cells at acceptance `acc_len` when given (cells without the field count
    as that one)."""
    groups = defaultdict(list)
    for c in cells:
        if acc_len is None or c.get("acc_len", acc_len) == acc_len:
            groups[(c["arm"], c["C"])].append(c)
    return groups


def medians(cells: list[dict], acc_len: float | None = None) -> dict:
    """(arm, C) -> {median, min, max, reps, tpot_ms, ttft_ms, acceptance, spec_fraction}, of the
    cells at acceptance `acc_len` when given (cells without the field count as that one)."""
    out = {}
    for key, cs in _groups(cells, acc_len).items():
        vals = [c["output_tok_s"] for c in cs]

        def med(field, cs=cs):
            xs = [c[field] for c in cs if c.get(field) is not None]
            return statistics.median(xs) if xs else None

        out[key] = {
            "median": statistics.median(vals),
            "min": min(vals),
            "max": max(vals),
            "reps": len(vals),
            "tpot_ms": med("tpot_ms"),
            "ttft_ms": med("ttft_ms"),
            "acceptance": med("acceptance"),
            "spec_fraction": med("spec_fraction"),
        }
    return out


def envelope(m: dict, concurrencies: list[int]) -> dict:
    """E(C) = max(A0, A1): the best of never and always speculating."""
    return {
        C: max(m[("A0", C)]["median"], m[("A1", C)]["median"])
        for C in concurrencies
        if ("A0", C) in m and ("A1", C) in m
    }


def or_dash(v: float | None, digits: int = 3) -> str:
    """A table cell: `v` to `digits` decimals, or '-' where there is none."""
    return "-" if v is None else f"{v:.{digits}f}"


def ratios(m: dict, concurrencies: list[int]) -> dict:
    env = envelope(m, concurrencies)
    out = {}
    for C in concurrencies:
        row = {"E": env.get(C)}
        if ("A2", C) in m and C in env:
            row["A2/E"] = m[("A2", C)]["median"] / env[C]
        if ("A2", C) in m and ("A0", C) in m:  # E itself above T; runs without A1 have only this
            row["A2/A0"] = m[("A2", C)]["median"] / m[("A0", C)]["median"]
        if ("A4", C) in m and ("A0", C) in m:
            row["A4/A0"] = m[("A4", C)]["median"] / m[("A0", C)]["median"]
        for a in sorted({a for a, _ in m} - set(BUILT_IN)):  # variants, against plain decoding
            if (a, C) in m and ("A0", C) in m:
                row[f"{a}/A0"] = m[(a, C)]["median"] / m[("A0", C)]["median"]
        if ("A1", C) in m and ("A0", C) in m:
            row["A1/A0"] = m[("A1", C)]["median"] / m[("A0", C)]["median"]
        if ("A3", C) in m and ("A1", C) in m:
            row["A3/A1"] = m[("A3", C)]["median"] / m[("A1", C)]["median"]
        out[C] = row
    return out


def rep_values(cells: list[dict], acc_len: float | None = None) -> dict:
    """(arm, C) -> the tokens/s of its repetitions, at acceptance `acc_len` when given: what
    the bootstrap intervals resample."""
    return {k: [c["output_tok_s"] for c in cs] for k, cs in _groups(cells, acc_len).items()}


def ratio_intervals(
    cells: list[dict],
    concurrencies: list[int],
    acc_len: float | None = None,
    level: float = 0.9,
    draws: int = 2000,
    seed: int = 0,
    min_reps: int = 3,
) -> dict:
    """C -> {ratio: [low, high]}: bootstrap intervals of `ratios`. Each arm's reps at a C are
    resampled with replacement, the medians and ratios recomputed, and the central `level`
    of the draws kept. Why: at C = 64-128 the same code's ratio moved by 1-2 points from run
    to run; a median and its range cannot say whether 0.975 misses a 0.98 goal or is noise,
    an interval over the reps can. Arms with fewer than `min_reps` reps at a C are left out
    (no interval for the ratios that need them), but for the envelope's losing arm when every
    one of its reps lies below every rep of the other (A0 at C=1): no resample can make it E,
    so it enters at its median and A2/E still has an interval."""
    import random

    groups = rep_values(cells, acc_len)
    out = {}
    for C in concurrencies:
        rng = random.Random(f"{seed}:{C}")  # per C: an interval does not depend on which other C a report holds
        here = {k: v for k, v in groups.items() if k[1] == C and len(v) >= min_reps}
        fixed = {}
        pair = [groups.get((a, C)) for a in ("A0", "A1")]
        if all(pair):
            for (few, many), arm in ((pair, "A0"), (pair[::-1], "A1")):
                if len(few) < min_reps <= len(many) and max(few) < min(many):
                    fixed[(arm, C)] = {"median": statistics.median(few)}
        samples = defaultdict(list)
        for _ in range(draws):
            m = {k: {"median": statistics.median(rng.choices(v, k=len(v)))} for k, v in here.items()}
            m.update(fixed)
            for name, value in ratios(m, [C])[C].items():
                # A ratio of a fixed arm itself (A1/A0 with A0 fixed) would be no interval.
                if name != "E" and value is not None and not {a for a, _ in fixed} & set(name.split("/")):
                    samples[name].append(value)
        cut = (1 - level) / 2
        out[C] = {}
        for name, values in samples.items():
            values.sort()
            out[C][name] = [quantile(values, cut), quantile(values, 1 - cut)]
    return out


def median_ratio_interval(
    a: list[float], b: list[float], level: float = 0.9, draws: int = 2000, seed: str = "", min_reps: int = 3
) -> list[float] | None:
    """[low, high]: the bootstrap interval of median(a) / median(b), each side's reps
    resampled with replacement as `ratio_intervals` does; None where either side has fewer
    than `min_reps` reps. For two arms that `ratios` does not pair (a tiered arm against the
    fastest fixed configuration, or against upstream's)."""
    import random

    if len(a) < min_reps or len(b) < min_reps:
        return None
    rng = random.Random(seed)
    values = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b))) for _ in range(draws)
    )
    cut = (1 - level) / 2
    return [quantile(values, cut), quantile(values, 1 - cut)]


def interval_markdown(intervals: dict, concurrencies: list[int], level: float = 0.9) -> str:
    """The intervals of `ratio_intervals` as a table (ratios with none at any C are left out)."""
    names = [n for n in ("A2/E", "A2/A0", "A4/A0") if any(n in intervals.get(C, {}) for C in concurrencies)]
    names += sorted({n for C in concurrencies for n in intervals.get(C, {})} - set(names) - {"A1/A0"})
    if not names:
        return ""
    lines = [
        f"{level:.0%} intervals of the ratios (each arm's reps resampled, arms with 3 reps or more; an envelope "
        "arm whose every rep is below the other's enters at its median):",
        "",
        "| C | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for C in concurrencies:
        iv = intervals.get(C, {})
        if any(n in iv for n in names):
            lines.append(
                f"| {C} | " + " | ".join(f"{iv[n][0]:.3f}-{iv[n][1]:.3f}" if n in iv else "-" for n in names) + " |"
            )
    return "\n".join(lines) + "\n"


PER_RUN_RATIOS = ("A2/E", "A2/A0", "A4/A0", "A3/A1")
# Issue #5's bars: A2 within 2% of the envelope, A4 within 2% of plain decoding, A3 within 1%
# of EAGLE-3.
GOALS = {"A2/E": 0.98, "A4/A0": 0.98, "A3/A1": 0.99}


def sign_test_above(values, goal: float) -> tuple[int, int, float]:
    """(runs at or above `goal`, runs, one-sided sign-test p): the chance of at least that many
    runs at or above if the median run were at the goal. Why: the runs' spread (about a point
    at C=64 on the H200) is not normal and a handful of runs has no variance to speak of; a
    median run over the bar with p < 0.05 is over it beyond run-to-run noise (7 of 8 runs,
    or 5 of 5), a median run over it with p = 0.31 (3 of 4) is not."""
    n, k = len(values), sum(v >= goal for v in values)
    return k, n, sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def rank_sum_p(xs, ys) -> float:
    """Two-sided exact Mann-Whitney p: the chance, if both samples came from one distribution,
    of a rank sum at least as far from its expectation as the one observed (every split of
    the pooled values enumerated; ties count half). Why: per-run ratios of two engines (ours
    against upstream's, on different engines) cannot be paired, a handful of runs is not normal,
    and a one-run sweep's 3-point gap must not read as a difference when the runs overlap.
    Exact up to a few thousand splits, the normal approximation beyond."""
    xs, ys = list(xs), list(ys)
    pooled, n, m = xs + ys, len(xs), len(ys)
    if not n or not m:
        raise ValueError("rank_sum_p needs runs on both sides")

    def u(a, b):
        return sum((p > q) + 0.5 * (p == q) for p in a for q in b)

    centre, observed = n * m / 2, abs(u(xs, ys) - n * m / 2)
    if math.comb(n + m, n) > 20000:
        sd = math.sqrt(n * m * (n + m + 1) / 12)
        return math.erfc(max(observed - 0.5, 0) / sd / math.sqrt(2))
    as_far = total = 0
    for idx in itertools.combinations(range(n + m), n):
        chosen = set(idx)
        a = [pooled[i] for i in idx]
        b = [pooled[i] for i in range(n + m) if i not in chosen]
        total += 1
        as_far += abs(u(a, b) - centre) >= observed - 1e-9
    return as_far / total


def cells_by_run(cells: list[dict]) -> dict:
    """run -> its cells, runs in the cells' order: a run is a source folder (as --merge keeps
    it), or one repetition of --fresh-engines (its own engines); one run, keyed None, for the
    cells of one run on one set of engines."""
    by_run = defaultdict(list)
    for c in cells:
        key = "/".join(str(x) for x in (c.get("source"), c.get("engines")) if x is not None)
        by_run[key or None].append(c)
    return dict(by_run)


def _each_run(cells: list[dict], concurrencies: list[int], acc_len: float | None) -> dict:
    """run (`cells_by_run`) -> (its cells, its own `ratios`)."""
    return {run: (cs, ratios(medians(cs, acc_len), concurrencies)) for run, cs in cells_by_run(cells).items()}


def tier_disputes(
    cells: list[dict], pooled: dict, rows: list[dict], arms: dict[int, str], acc_len: float | None = None
) -> dict:
    """Whether the runs pooled in a folder (`cells`; `pooled`, their medians at `acc_len`, as
    the tiers were derived from) order the configurations as the suggested tiers (`rows`, as
    suggest_tiers gives them; `arms`: draft steps -> arm) do. Why: a run's
    repetitions share its engines, and a configuration's median moves from engine to engine
    (on the H200's MoE-shaped target 2 and 3 draft steps swapped places between runs), so
    pooled medians alone can hide that two configurations are not told apart.

    `runs`: the runs with cells at this acceptance. `disputed`: per C, each configuration
    behind the tier's in the pooled medians whose own median beat the tier's within some run
    (`led_in`, of the `compared` runs that measured both there; pooled medians can take the
    two from different runs); a draft ahead of plain decoding's tier by the pooled medians is
    the rule's own exception (`against_the_rule`), not a dispute. `compared_at`: the C at which
    two runs or more measured the tier's configuration and another one, where their agreement
    means something."""
    runs = {run: m for run, cs in cells_by_run(cells).items() if (m := medians(cs, acc_len))}
    disputed, compared_at = [], []
    for row in rows if len(runs) > 1 else []:
        C, mine = row["C"], arms[row["tier"]]
        for steps, arm in arms.items():
            both = {run: m for run, m in runs.items() if (arm, C) in m and (mine, C) in m}
            if steps == row["tier"] or not both:
                continue
            if len(both) > 1 and C not in compared_at:
                compared_at.append(C)
            led = [run_name(run) for run, m in both.items() if m[(arm, C)]["median"] > m[(mine, C)]["median"]]
            if led and pooled[(arm, C)]["median"] <= pooled[(mine, C)]["median"]:
                disputed.append({"C": C, "tier": row["tier"], "steps": steps, "led_in": led, "compared": len(both)})
    return {"runs": len(runs), "disputed": disputed, "compared_at": compared_at}


def run_name(run) -> str:
    """A run's name as the reports print it (cells without a source or engines: "untagged")."""
    return "untagged" if run is None else str(run)


def within_runs(compute, cells: list[dict], concurrencies: list[int], acc_len: float | None = None) -> dict:
    """`compute(cells, [C])` (C -> {ratio: value}: `ratios` of the medians, or `ratio_intervals`)
    with each ratio taken over the runs that measured every arm it needs, pooled. Why: a
    merge of runs that measured different arms (an A1/A3 run beside an A0/A1/A2 run) would
    otherwise divide one run's A2 by another run's A1, and the same engine's throughput moves
    by several percent from run to run. `compute` runs once per C and set of runs, not per
    ratio (a bootstrap is thousands of draws)."""
    runs = _each_run(cells, concurrencies, acc_len)
    if len(runs) < 2:
        return compute(cells, concurrencies)
    out = {}
    for C in concurrencies:
        names = dict.fromkeys(n for _, r in runs.values() for n, v in r[C].items() if v is not None)
        by_subset = defaultdict(list)  # the runs that measured a ratio's arms -> those ratios
        for name in names:
            by_subset[tuple(run for run, (_, r) in runs.items() if r[C].get(name) is not None)].append(name)
        got = {}
        for subset, subset_names in by_subset.items():
            values = compute([c for run in subset for c in runs[run][0]], [C]).get(C, {})
            got.update({name: values.get(name) for name in subset_names})
        out[C] = {name: got[name] for name in names if got[name] is not None}
    return out


def merged_ratios(cells: list[dict], concurrencies: list[int], acc_len: float | None = None) -> dict:
    """`ratios` of a report's cells, each within the runs that measured its arms."""
    return within_runs(lambda cs, Cs: ratios(medians(cs, acc_len), Cs), cells, concurrencies, acc_len)


def merged_intervals(cells: list[dict], concurrencies: list[int], acc_len: float | None = None) -> dict:
    """`ratio_intervals` of a report's cells, each within the runs that measured its arms."""
    return within_runs(lambda cs, Cs: ratio_intervals(cs, Cs, acc_len), cells, concurrencies, acc_len)


def per_run_ratios(cells: list[dict], concurrencies: list[int], acc_len: float | None = None) -> dict:
    """C -> {ratio: {"runs": {source: value}, "median": value}}, for cells pooled from several
    runs (`source`, as --merge keeps it): each run's ratio of its own medians, and the median
    run. Why: one engine per arm per run, and the same code's A2/A0 moves by several percent
    between runs, more than a reps-only interval sees; the runs,
    each with its own engines, are the units that vary. A run with --fresh-engines counts
    each repetition (its own engines, `engines` in its cells) as a run. Empty for cells of
    one run on one set of engines."""
    per = {src: r for src, (_, r) in sorted(_each_run(cells, concurrencies, acc_len).items(), key=str)}
    if len(per) < 2:
        return {}
    out = {}
    for C in concurrencies:
        row = {}
        for name in PER_RUN_RATIOS:
            runs = {src: r[C][name] for src, r in per.items() if r.get(C, {}).get(name) is not None}
            if len(runs) >= 2:
                row[name] = {"runs": runs, "median": statistics.median(runs.values())}
                if name in GOALS:
                    k, n, p = sign_test_above(runs.values(), GOALS[name])
                    row[name].update(goal=GOALS[name], at_or_above=k, p_above=p)
        if row:
            out[C] = row
    return out


def per_run_markdown(per_run: dict, concurrencies: list[int]) -> str:
    """The table of `per_run_ratios`: per C and ratio, the median run, the range and count."""
    if not per_run:
        return ""
    lines = [
        "Per run (a source folder, or one repetition of --fresh-engines: each run's ratio of its own medians; "
        "the median run, its range, the runs; against the goal, the runs at or above it and a one-sided sign "
        "test: p < 0.05 puts the median run above the goal beyond run-to-run noise):",
        "",
        "| C | ratio | median run | range | runs | goal | at or above | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for C in concurrencies:
        for name, v in per_run.get(C, {}).items():
            xs = sorted(v["runs"].values())
            test = (
                f"{v['goal']:.2f} | {v['at_or_above']} of {len(xs)} | {v['p_above']:.3f}"
                if "goal" in v
                else "- | - | -"
            )
            lines.append(f"| {C} | {name} | {v['median']:.3f} | {xs[0]:.3f}-{xs[-1]:.3f} | {len(xs)} | {test} |")
    return "\n".join(lines) + "\n"


def suggest_threshold(m: dict, concurrencies: list[int]) -> dict:
    """The rule: speculate while it wins. Walking up the measured concurrencies, T is the
    last C at which EAGLE-3 (A1) is at least as fast as no speculation (A0) before the first
    C where it loses; a decode batch of more than T requests then falls back. 0 when it
    loses at the smallest C (`why` names any larger C where it wins); None when A0 and A1
    share no measured C (a run cut off before
    one of them measured anything), which says nothing about who wins.

    The crossover lies somewhere between T and that first loss, and the rule places T at its
    low end, which on a coarse grid can be far below it. `refine` lists request counts between
    the two to measure (A0 and A1 only) and merge, so the rule can place T on a finer grid;
    none once the two are within 25% of each other, where run-to-run noise is as large as the
    step."""
    # The tiers' rule with two configurations: EAGLE-3's chain and no speculation.
    tiers = suggest_tiers(m, concurrencies, {1: "A1", 0: "A0"})
    if len(tiers["arms"]) < 2 or not tiers["rows"]:  # nothing to compare: no T, not 0
        return {
            "threshold": None,
            "wins": [],
            "loses": [],
            "refine": [],
            "why": "A0 and A1 were not both measured at any C: measure them (--arms A0,A1) to place T",
        }
    measured = [row["C"] for row in tiers["rows"]]
    T = 0
    if tiers["tiers"] and tiers["tiers"][0]:
        T = tiers["boundaries"][0] if tiers["boundaries"] else measured[-1]
    wins = [row["C"] for row in tiers["rows"] if row["fastest"]]
    first_loss = next((C for C in measured if C > T), None)
    refine = refine_between(T, first_loss) if T and first_loss and first_loss > 1.25 * T else []
    why = (
        _rule_keeps(tiers["rows"], "always fall back", lambda s: "EAGLE-3" if s else "plain decoding")
        if T == 0
        else f"EAGLE-3 is at least as fast as plain decoding up to C={T} and slower above"
        if first_loss
        else f"EAGLE-3 is at least as fast as plain decoding at every C measured (up to {T}): measure above "
        f"C={T} to find where it stops winning"
    )
    if refine:
        why += (
            f"; the crossover lies between {T} and {first_loss}: measure --concurrency "
            f"{','.join(map(str, refine))} --arms A0,A1 and merge to place T more finely"
        )
    return {"threshold": T, "wins": wins, "loses": [C for C in measured if C not in wins], "refine": refine, "why": why}


# The fixed configurations --suggest-tiers compares by default: draft steps -> arm. A1 is the
# bench's EAGLE-3 chain (3 steps); S1 and S2 are its variants at 1 and 2 steps (docs/bench.md).
TIER_ARMS = {3: "A1", 2: "S2", 1: "S1", 0: "A0"}


def _may_follow(before: int, steps: int) -> bool:
    """Whether a tier of `steps` draft steps may serve the batches above a tier of `before`:
    any draft length after a draft (the tiers need not shorten: 2,3,2,0 is served), and only
    plain decoding after plain decoding, whose tier is the fallback's, the last."""
    return before != 0 or steps == 0


def suggest_tiers(m: dict, concurrencies: list[int], arms: dict[int, str] | None = None) -> dict:
    """The draft length per batch size (--speculative-num-steps-tiers), by the threshold's
    rule generalised: walking up the measured concurrencies, each C runs the fastest
    configuration (ties keep the longer draft), except that once plain decoding is the
    fastest every larger C keeps it (the fallback is the last tier, _may_follow); a boundary
    is the last C of a tier, as T is the last C at which speculation wins. `arms` maps draft
    steps (0: no speculation) to the arm measured with them; those the folder lacks are left
    out, and only the C at which every remaining one was measured count.

    `rows` gives each C's medians, the fastest configuration and the tier chosen; where a
    draft is the fastest after plain decoding took over (noise, or a curve the tiers cannot
    serve) the C is listed in `against_the_rule`. `longer_again` names each tier that drafts
    more steps than the tier below it, at its first C, with its lead there over the steps it
    took over from: served, and worth measuring again where that lead is small (a curve whose
    best draft length comes back, or noise). `refine` lists request counts to measure
    between a boundary and the next C when they are more than 25% apart, as for T."""
    arms = TIER_ARMS if arms is None else arms
    present = {s: a for s, a in sorted(arms.items(), reverse=True) if any((a, C) in m for C in concurrencies)}
    measured = sorted(C for C in set(concurrencies) if present and all((a, C) in m for a in present.values()))
    rows = []
    for C in measured:
        speed = {s: m[(a, C)]["median"] for s, a in present.items()}
        fastest = max(speed, key=lambda s: (speed[s], s))
        allowed = [s for s in speed if not rows or _may_follow(rows[-1]["tier"], s)]
        tier = max(allowed, key=lambda s: (speed[s], s))
        rows.append({"C": C, "tok_s": speed, "fastest": fastest, "tier": tier})
    spans, by_c = _spans(rows), {r["C"]: r for r in rows}
    fastest_everywhere = (
        "no C at which every configuration was measured"
        if not spans
        else _rule_keeps(rows, "no tiers" if spans[0][0] else "serve without speculation")
    )
    return {
        "arms": present,
        "rows": rows,
        **_schedule(spans, fastest_everywhere),
        "against_the_rule": [r["C"] for r in rows if r["fastest"] > r["tier"]],
        "longer_again": [
            {
                "C": first,
                "steps": steps,
                "after": before,
                "lead": by_c[first]["tok_s"][steps] / by_c[first]["tok_s"][before] - 1,
            }
            for (before, _, _), (steps, first, _) in zip(spans, spans[1:])
            if steps > before
        ],
    }


def _rule_keeps(rows: list[dict], then: str, label=None) -> str:
    """Why the tier rule keeps one configuration at every C (`rows` of suggest_tiers, all in
    one tier), and `then`, what follows: that configuration is the fastest at every C, or
    plain decoding leads at the smallest C and the rule, which drafts no more after plain
    decoding (_may_follow), leaves out a draft that is faster at a larger C (named with
    where). Never "speculation never wins" where it does win somewhere. `label` names a
    step count (steps_label by default)."""
    label = label or steps_label
    kept = rows[0]["tier"]
    faster = [r for r in rows if r["fastest"] != kept]
    if not faster:
        if kept == 0:
            return f"speculation is slower than plain decoding at every C measured: {then}"
        return f"{label(kept)} is the fastest at every C measured: {then}"
    where = ", ".join(f"{label(r['fastest'])} at C={r['C']}" for r in faster)
    return (
        f"the rule keeps {label(kept)} at every C measured, since it leads at C={rows[0]['C']} and the rule drafts "
        f"no more after plain decoding: {then}; faster there: {where}"
    )


def suggest_tiers_across(ms: dict, concurrencies: list[int], arms: dict[int, str] | None = None) -> dict:
    """One draft length per batch size for several acceptances (`ms`: acceptance -> medians of
    the fixed configurations measured at it): among the schedules the tiers serve (no draft
    after plain decoding, _may_follow), the one whose worst ratio to the fastest fixed
    configuration, over every C and acceptance, is highest (then the highest mean, then the
    longer drafts). Tiers derived at one acceptance can lose far more at another than any tie
    costs, and a server sees its traffic's acceptance move. Only the configurations measured
    at every acceptance, and the C at which all of them were, count. `rows` gives each C's
    tier and its ratio at each acceptance; `worst` the lowest (ratio, C, acceptance)."""
    arms = TIER_ARMS if arms is None else arms
    present = {
        s: a
        for s, a in sorted(arms.items(), reverse=True)
        if all(any((a, C) in m for C in concurrencies) for m in ms.values())
    }
    measured = sorted(
        C for C in set(concurrencies) if present and all((a, C) in m for m in ms.values() for a in present.values())
    )

    to_fastest = {(acc, C): ratios_to_fastest(m, present, C) for acc, m in ms.items() for C in measured}
    ratios = [{s: {acc: to_fastest[(acc, C)][s] for acc in ms} for s in present} for C in measured]
    best = _most_even_schedule([{s: list(by_acc.values()) for s, by_acc in at_c.items()} for at_c in ratios])
    rows = [{"C": C, "tier": k, "ratios": at_c[k]} for C, k, at_c in zip(measured, best, ratios)]
    spans = _spans(rows)
    worst = min(((r["ratios"][acc], r["C"], acc) for r in rows for acc in ms), default=None)
    return {
        "arms": present,
        "acceptances": sorted(ms),
        "rows": rows,
        "worst": worst,
        **_schedule(
            spans,
            f"{steps_label(best[0])} at every C measured: no tiers"
            if best
            else "no C at which every configuration was measured at every acceptance",
        ),
    }


def ratios_to_fastest(m: dict, arms: dict[int, str], C: int) -> dict[int, float]:
    """Draft steps -> its configuration's median at C over the fastest one's (`arms`: draft
    steps -> arm, each measured at C in medians `m`); 1.0 for all where none made progress."""
    speed = {s: m[(a, C)]["median"] for s, a in arms.items()}
    fastest = max(speed.values())
    return {s: v / fastest if fastest > 0 else 1.0 for s, v in speed.items()}


def _most_even_schedule(ratios: list[dict[int, list[float]]]) -> list[int]:
    """The draft steps per C (`ratios`: per C, draft steps -> its ratios to the fastest fixed
    configuration, one per acceptance) whose lowest ratio is highest, among the schedules the
    tiers serve (_may_follow); of those, the highest sum of ratios (exact), then the
    longer drafts first. Two dynamic programmes over (C, steps), not the schedules themselves,
    whose number grows as C to the power of the configurations."""
    if not ratios:
        return []
    steps = sorted(ratios[0])
    low = [{s: min(rs) for s, rs in at_c.items()} for at_c in ratios]
    # The highest worst ratio of a schedule, by the steps it ends on at each C.
    reach = dict(low[0])
    for at_c in low[1:]:
        reach = {s: min(at_c[s], max(reach[t] for t in steps if _may_follow(t, s))) for s in steps}
    floor = max(reach.values())
    # From the last C down: the best (sum, schedule) of what follows each step count, among
    # the schedules with no ratio below the floor.
    after: dict[int, tuple] = {}
    for i in reversed(range(len(ratios))):
        here = {}
        for s in steps:
            if low[i][s] < floor:
                continue
            nexts = [after[t] for t in steps if _may_follow(s, t) and t in after] if i + 1 < len(ratios) else [(0, [])]
            if nexts:
                total, rest = max(nexts)
                here[s] = (sum(map(Fraction, ratios[i][s])) + total, [s, *rest])
        after = here
    return max(after.values())[1]


def _spans(rows: list[dict]) -> list[list]:
    """[draft steps, first C, last C] of each run of one tier in `rows` (each a C and its tier)."""
    spans = []
    for r in rows:
        if spans and spans[-1][0] == r["tier"]:
            spans[-1][2] = r["C"]
        else:
            spans.append([r["tier"], r["C"], r["C"]])
    return spans


def _schedule(spans: list, one_tier: str) -> dict:
    """A schedule of tiers (`spans`: [draft steps, first C, last C] per tier, from the smallest
    batches up) as the flags that serve it, the bench arm that measures it, SGLang's own
    adaptive config, the C to measure between boundaries more than 25% apart, and why
    (`one_tier` where there is a single tier)."""
    tiers = [s for s, _, _ in spans]
    boundaries = [last for _, _, last in spans[:-1]]
    refine = {}
    for (_, _, last), (_, first, _) in zip(spans, spans[1:]):
        if first > 1.25 * last:
            refine[last] = refine_between(last, first)
    flags = (
        f"--speculative-num-steps {max(tiers)} --speculative-num-steps-tiers {','.join(map(str, tiers))} "
        f"--speculative-num-steps-tier-boundaries {','.join(map(str, boundaries))}"
        if len(tiers) > 1
        else None
    )
    if len(tiers) > 1:
        parts = [f"{steps_label(s)} up to C={last}" for s, _, last in spans[:-1]]
        why = ", ".join(parts) + f", {steps_label(tiers[-1])} above"
    else:
        why = one_tier
    if refine:
        why += (
            "; measure "
            + "; ".join(
                f"--concurrency {','.join(map(str, cs))} (between {low} and the next C)" for low, cs in refine.items()
            )
            + " for these arms and merge to place the boundaries more finely"
        )
    threshold, variant = tier_variant(tiers, boundaries)
    return {
        "tiers": tiers,
        "boundaries": boundaries,
        "flags": flags,
        "threshold": threshold,
        "variant": variant,
        "upstream_adaptive_config": upstream_adaptive_config(tiers, boundaries),
        "upstream_eager_draft_extend": upstream_eager_draft_extend(tiers),
        "refine": refine,
        "why": why,
    }


def tier_variant(tiers: list[int], boundaries: list[int], name: str | None = None) -> tuple[int | None, str | None]:
    """(--threshold, --variant) of the arm that measures these tiers: A2 with the tiers when
    the last is the fallback (its threshold is the last boundary), else A1 with them; the
    longest tier's step count is the engine's own (its KV allocation holds every tier's).
    The arm is named after its tiers
    (TIER3-1-0_16-48), so other tiers measured into the same folder are another arm. (None,
    None) without tiers."""
    if len(tiers) < 2:
        return None, None
    fields = (
        f"{_engine_steps(max(tiers))};speculative_num_steps_tiers={','.join(map(str, tiers))};"
        f"speculative_num_steps_tier_boundaries={','.join(map(str, boundaries))}"
    )
    threshold = boundaries[-1] if tiers[-1] == 0 else None
    return (
        threshold,
        f"{name or _tiers_name('TIER', tiers, boundaries)}={'A2' if threshold is not None else 'A1'}:{fields}",
    )


def _tiers_name(prefix: str, tiers: list[int], boundaries: list[int]) -> str:
    """An arm named after its tiers (TIER3-1-0_16-48), so other tiers are another arm."""
    return f"{prefix}{'-'.join(map(str, tiers))}_{'-'.join(map(str, boundaries))}"


def _engine_steps(steps: int) -> str:
    """An engine's own step count as --variant fields, with its chain's draft tokens."""
    return f"speculative_num_steps={steps};speculative_num_draft_tokens={steps + 1}"


def upstream_adaptive_config(tiers: list[int], boundaries: list[int]) -> dict | None:
    """The same schedule as SGLang's own adaptive steps take it (0.5.14 and later:
    `--speculative-adaptive --speculative-adaptive-config FILE`, FILE holding this JSON): one
    batch-size slot per tier, keyed by its smallest batch, with that tier's step count as its
    only candidate, so the acceptance EMA never moves it. Upstream picks the slot by the batch
    size (padded to a CUDA-graph size only when --cuda-graph-bs-decode is given, which moves a
    boundary between two graph sizes down to the smaller), has no batch-size hysteresis, and
    needs the first tier's step count as --speculative-num-steps. None without tiers."""
    if len(tiers) < 2:
        return None
    fixed = {"up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0}
    lows = [1] + [b + 1 for b in boundaries]
    return {str(low): {"candidate_steps": [steps], **fixed} for low, steps in zip(lows, tiers)}


def upstream_eager_draft_extend(tiers: list[int]) -> list[int]:
    """The step counts whose draft extend SGLang 0.5.17's own adaptive steps run without a
    CUDA graph, given these tiers as its config: its states other than the start-up one (the
    first tier's) capture the draft-extend graph at the start-up width, read from server_args,
    which their capture override leaves as it was, so a step of another width cannot replay it
    and runs eagerly (0.5.14-0.5.16 write the width to server_args, 0.5.18 reads it from the
    override). Steps 0 run no draft extend. Such an arm measures the release, not the
    schedule alone."""
    return sorted({s for s in tiers if s and s != tiers[0]})


def upstream_variant(tiers: list[int], boundaries: list[int], config_path: str) -> str | None:
    """The --variant of the arm that measures these tiers on SGLang's own adaptive steps (run
    with --arm-sglang-dir on a release of 0.5.14 or later), `config_path` holding
    upstream_adaptive_config; named after its tiers (UP2-0_48), as tier_variant names ours."""
    if len(tiers) < 2:
        return None
    return (
        f"{_tiers_name('UP', tiers, boundaries)}=A1:{_engine_steps(tiers[0])};"
        f"speculative_adaptive=true;speculative_adaptive_config={config_path}"
    )


def steps_label(n: int) -> str:
    """A step count as the tables and suggestions say it."""
    return "no speculation" if n == 0 else f"{n} draft step{'s' if n > 1 else ''}"


def tiers_markdown(res: dict) -> str:
    """The per-C table of `suggest_tiers`: each configuration's median tok/s, the fastest and
    the tier the rule chose."""
    arms = res["arms"]
    head = (
        "| C | " + " | ".join(f"{s} step{'' if s == 1 else 's'} ({a})" for s, a in arms.items()) + " | fastest | tier |"
    )
    lines = [head, "|" + "---|" * (len(arms) + 3)]
    for r in res["rows"]:
        cells = " | ".join(f"{r['tok_s'][s]:.0f}" for s in arms)
        lines.append(f"| {r['C']} | {cells} | {r['fastest']} | {r['tier']} |")
    return "\n".join(lines) + "\n"


def tiers_across_markdown(res: dict) -> str:
    """The per-C table of `suggest_tiers_across`: the tier chosen and, at each acceptance, its
    configuration's median over the fastest fixed configuration's there."""
    accs = res["acceptances"]
    lines = ["| C | tier | " + " | ".join(f"at acceptance {a:g}" for a in accs) + " |", "|" + "---|" * (len(accs) + 2)]
    for r in res["rows"]:
        lines.append(f"| {r['C']} | {r['tier']} | " + " | ".join(f"{r['ratios'][a]:.3f}" for a in accs) + " |")
    return "\n".join(lines) + "\n"


def refine_between(low: int, high: int) -> list[int]:
    """Up to three request counts evenly between two measured ones (32, 64 -> 40, 48, 56)."""
    return sorted({round(low + k * (high - low) / 4) for k in (1, 2, 3)} - {low, high})


def markdown(m: dict, concurrencies: list[int], arms: list[str], r: dict | None = None) -> str:
    """The main table; `r` the ratios when not those of `m` (a merge's, `within_runs`)."""
    r = ratios(m, concurrencies) if r is None else r
    variants = [a for a in arms if a not in BUILT_IN]
    head = (
        "| C | "
        + " | ".join(f"{a} tok/s" for a in arms)
        + " | E=max(A0,A1) | A2/E | A4/A0 | "
        + "".join(f"{a}/A0 | " for a in variants)
        + "A3/A1 | A2 spec frac | A1 accept |"
    )
    lines = [head, "|" + "---|" * (len(arms) + 7 + len(variants))]
    for C in concurrencies:
        cells = []
        for a in arms:
            x = m.get((a, C))
            cells.append("-" if x is None else f"{x['median']:.0f} ({x['min']:.0f}-{x['max']:.0f})")
        row = r.get(C, {})

        def f(v, fmt="{:.3f}"):
            return "-" if v is None else fmt.format(v)

        sf = m.get(("A2", C), {}).get("spec_fraction")
        acc = m.get(("A1", C), {}).get("acceptance")
        lines.append(
            f"| {C} | " + " | ".join(cells) + f" | {f(row.get('E'), '{:.0f}')} | {f(row.get('A2/E'))} | "
            f"{f(row.get('A4/A0'))} | "
            + "".join(f"{f(row.get(f'{a}/A0'))} | " for a in variants)
            + f"{f(row.get('A3/A1'))} | {f(sf, '{:.2f}')} | {f(acc, '{:.2f}')} |"
        )
    return "\n".join(lines) + "\n\n" + latency_markdown(m, concurrencies, arms)


def latency_markdown(m: dict, concurrencies: list[int], arms: list[str]) -> str:
    """Per arm and C, the medians of the per-request decode time per token (TPOT) and of the
    time to first token, clocked from the first and last streamed chunk: where a throughput
    gap comes from (decode steps or prefill)."""
    head = "| C | " + " | ".join(f"{a} TPOT ms | {a} TTFT ms" for a in arms) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(arms))]
    for C in concurrencies:
        cols = []
        for a in arms:
            x = m.get((a, C)) or {}
            cols += ["-" if x.get(k) is None else f"{x[k]:.{d}f}" for k, d in (("tpot_ms", 2), ("ttft_ms", 0))]
        lines.append(f"| {C} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def _phases(rows: list[dict]):
    """(round, phase, row) of one transition's rows (results._transition_summary): phases are
    numbered from 1 within each round, rows of a one-round transition being round 1."""
    for number, group in itertools.groupby(rows, key=lambda r: r.get("round", 1)):
        for phase, r in enumerate(group, 1):
            yield number, phase, r


def switches_by_round(rows: list[dict]) -> list[dict] | None:
    """One transition's switches per round as its engine counted them ({"fallback": in and
    out, "tiers": between tiers}); None where its rounds recorded no counters."""
    counted = {number: r["round_switches"] for number, _, r in _phases(rows) if "round_switches" in r}
    return [counted[n] for n in sorted(counted)] or None


def never_switched(rows: list[dict]) -> bool:
    """Whether an engine's counters recorded every round of its transition without a switch:
    the schedule never crossed its switch point, so its phases measure no transition."""
    counted = switches_by_round(rows)
    return counted is not None and not any(c["fallback"] or c["tiers"] for c in counted)


# The standard arms that cannot switch within any batch the sweep forms (A3's threshold is
# its largest batch). Beside a switching engine in the transition they are controls: what
# their phases lose, the schedule costs any engine (its loads' order, the GPU's state).
# Rounds record whether their engine was one (sweep.cannot_switch); these names decide for
# rounds measured without that record.
CONTROLS = frozenset({"A0", "A1", "A3"})


def is_control(arm: str, rows: list[dict] = ()) -> bool:
    """Whether a transition's engine is a control: as its rounds recorded it, else by the
    arm's name (its label, "A1 (RUN)" where runs were merged)."""
    recorded = {r["control"] for r in rows if "control" in r}
    return True in recorded if recorded else arm.split(" (")[0] in CONTROLS


def lowest_phase_ratios(summary: dict, controls: bool = False) -> dict:
    """Per transition of `summary` (bench-results.json's "transition"), its lowest
    phase/steady, each phase read as the median of its rounds: the transition goal's figure.
    A transition whose engine never switched has none, and neither has a control's;
    `controls`: the controls' figures instead."""
    phase_ratios = {}  # arm -> phase -> its ratios, one per round
    for arm, rows in summary.items():
        # A control never switches (A3's counters say so): its figure is listed all the same.
        if is_control(arm, rows) != controls or (not controls and never_switched(rows)):
            continue
        for _, i, r in _phases(rows):
            if r.get("ratio") is not None:
                phase_ratios.setdefault(arm, {}).setdefault(i, []).append(r["ratio"])
    return {arm: min(statistics.median(v) for v in phases.values()) for arm, phases in phase_ratios.items()}


def transition_markdown(summary: dict) -> str:
    """The transition workload per arm: each phase's throughput against its steady state (the
    mean of the standalone runs before and after the schedule, both listed), its TTFT and
    TPOT against theirs, the host's busy CPUs during it against theirs (a C=4 phase is
    host-bound), and the GPU's mean SM clock against theirs (gpuclock: a phase slowed by lower
    clocks, not by the switch). '-' where a run did not record them. A transition of several rounds has a
    round column, and its goal line reads each phase as the median of its rounds."""
    host = any(r.get("host_busy_cpus") is not None for rows in summary.values() for r in rows)
    clocks = any(r.get("gpu_sm_mhz") is not None for rows in summary.values() for r in rows)
    rounds = any("round" in r for rows in summary.values() for r in rows)
    lines = [
        "| arm |" + (" round |" if rounds else "") + " phase | C | tok/s | steady tok/s (runs) | phase/steady "
        "| TTFT ms phase / steady | TPOT ms phase / steady |"
        + (" host CPUs busy phase / steady |" if host else "")
        + (" GPU SM MHz phase / steady |" if clocks else ""),
        "|---|---|---|---|---|---|---|---|"
        + ("---|" if rounds else "")
        + ("---|" if host else "")
        + ("---|" if clocks else ""),
    ]

    def pair(r, key, digits):
        return " / ".join(or_dash(x, digits) for x in (r.get(key), r.get("steady_" + key)))

    for arm, rows in summary.items():
        for number, i, r in _phases(rows):
            runs = r.get("reference_runs")
            steady = or_dash(r.get("steady"), 0)
            if runs:
                steady += " (" + " / ".join(f"{x:.0f}" for x in runs) + ")"
            lines.append(
                f"| {arm} |"
                + (f" {number} |" if rounds else "")
                + f" {i} | {r['C']} | {r['tok_s']:.0f} | {steady} | {or_dash(r.get('ratio'))} "
                f"| {pair(r, 'ttft_ms', 0)} | {pair(r, 'tpot_ms', 2)} |"
                + (f" {pair(r, 'host_busy_cpus', 1)} |" if host else "")
                + (f" {pair(r, 'gpu_sm_mhz', 0)} |" if clocks else "")
            )
    counted = {arm: c for arm, rows in summary.items() if (c := switches_by_round(rows))}
    if counted:
        lines.append(
            "\nSwitches the engine counted per round (fallback in and out / between tiers): "
            + "; ".join(
                f"{arm} " + ", ".join(f"{c['fallback']} / {c['tiers']}" for c in rounds_)
                for arm, rounds_ in counted.items()
            )
            + "."
        )
    for arm, rows in summary.items():
        if never_switched(rows) and not is_control(arm, rows):
            lines.append(
                f"{arm} never switched: the schedule did not cross its switch point, so it measures no transition."
            )
    lowest = lowest_phase_ratios(summary)
    if lowest:
        what = "phase/steady, each phase the median of its rounds" if rounds else "phase/steady"
        lines.append(f"\nLowest {what}: {min(lowest.values()):.3f} (goal: no phase more than 5% below, >= 0.950).")
        if len(lowest) > 1:
            lines.append("Per transition: " + ", ".join(f"{arm} {v:.3f}" for arm, v in lowest.items()) + ".")
    control = lowest_phase_ratios(summary, controls=True)
    if control:
        lines.append(
            "Controls, engines that never switch (what the schedule costs any engine): "
            + ", ".join(f"{arm} {v:.3f}" for arm, v in control.items())
            + "."
        )
    return "\n".join(lines) + "\n"


def plot(m: dict, concurrencies: list[int], arms: dict, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    env = envelope(m, concurrencies)
    xs = sorted(env)
    if xs:  # a run without both A0 and A1 has no envelope
        ax.plot(xs, [env[c] for c in xs], color="black", lw=6, alpha=0.15, label="envelope max(A0, A1)")
    for a, label in arms.items():
        pts = [(C, m[(a, C)]) for C in concurrencies if (a, C) in m]
        if not pts:
            continue
        ax.errorbar(
            [p[0] for p in pts],
            [p[1]["median"] for p in pts],
            yerr=[[p[1]["median"] - p[1]["min"] for p in pts], [p[1]["max"] - p[1]["median"] for p in pts]],
            marker="o",
            capsize=3,
            label=f"{a}: {label}",
        )
    ax.set_yscale("log")
    _finish(fig, ax, "output tokens/s (median of reps)", title, path, [C for _, C in m if C in concurrencies])


def tick_labels(ticks: list[int], min_gap: float = 0.04) -> list[str]:
    """Labels of the measured C on a log axis: every power of two, and any other C at least
    `min_gap` of the axis away from each label already placed (the band's 40, 48, 56 between
    32 and 64 of a 1-256 sweep would print over each other); the rest keep a bare tick."""
    span = math.log2(max(ticks) / min(ticks)) or 1.0
    shown = {C for C in ticks if C & (C - 1) == 0}
    for C in ticks:
        if all(abs(math.log2(C / k)) / span >= min_gap for k in shown):
            shown.add(C)
    return [str(C) if C in shown else "" for C in ticks]


LEGEND_INSIDE_CHARS = 60  # longer legend labels go below the axes


def _finish(fig, ax, ylabel: str, title: str, path, ticks) -> None:
    """Shared axes of the bench plots: concurrency on a log2 axis labelled at the measured C
    (a narrow band such as 40-56 holds no power of two, so log ticks would leave it bare),
    grid, legend, save."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(ticks))
    ax.set_xticks(ticks, tick_labels(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("concurrent requests C (closed loop)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if any(len(label) > LEGEND_INSIDE_CHARS for label in labels):
        # A variant's label lists its overrides: below the axes, wrapped, so that it
        # neither covers the curves nor runs off the figure.
        labels = [textwrap.fill(label, 110, subsequent_indent="    ") for label in labels]
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.2))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def medians_from_table(text: str) -> dict:
    """(arm, C) -> {median, min, max}: read back from a bench-table.md (for a run whose raw
    cells did not survive; per-cell fields such as TPOT are then unknown)."""
    lines = []
    for ln in text.splitlines():  # the first table only (the latency table follows it)
        if ln.startswith("|"):
            lines.append(ln)
        elif lines:
            break
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    arms = [h.split()[0] for h in head if h.endswith("tok/s") and h.startswith("A")]
    out = {}
    for ln in lines[2:]:
        cols = [c.strip() for c in ln.strip("|").split("|")]
        C = int(cols[0])
        for a, col in zip(arms, cols[1 : 1 + len(arms)]):
            if col == "-":
                continue
            med, rng = col.split(" ", 1)
            lo, hi = rng.strip("()").split("-")
            out[(a, C)] = {
                "median": float(med),
                "min": float(lo),
                "max": float(hi),
                "reps": None,
                "tpot_ms": None,
                "ttft_ms": None,
                "acceptance": None,
                "spec_fraction": None,
            }
    return out


def read_cells(path) -> list[dict]:
    """The cells of a cells.jsonl (one JSON object per line, as the sweep appends them); a line
    that is not one is the user's file to mend, named with its line (exit 2, no traceback)."""
    cells, fix = [], "mend or delete that line (a cut run measures that cell again)."
    for i, ln in enumerate(Path(path).read_text().splitlines(), 1):
        if ln.strip():
            cell = _parse(ln, f"{path}, line {i}", fix)
            if not isinstance(cell, dict):
                raise BadInputError(f"{path}, line {i}: a cell is a JSON object, not {type(cell).__name__}; {fix}")
            cells.append(cell)
    return cells


def read_json(path):
    """A bench results file (bench-results.json, transition.json), or a one-paragraph error
    naming it when it is not JSON."""
    return _parse(
        Path(path).read_text(),
        str(path),
        "the file is damaged (perhaps a run cut while writing it): mend or remove it.",
    )


def _parse(text: str, where: str, fix: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); {fix}"
        ) from None


def load_medians(folder, acc_len: float | None = None) -> dict:
    """Medians of a results folder: from its cells.jsonl (at `acc_len` when given), else from
    its bench-table.md."""
    folder = Path(folder)
    cells = folder / "cells.jsonl"
    if cells.exists():
        return medians(read_cells(cells), acc_len)
    return medians_from_table((folder / "bench-table.md").read_text())


def load_ratios(folder, concurrencies: list[int], acc_len: float | None = None) -> dict:
    """C -> {ratio: value} of a results folder, as its report computes them: from its cells,
    each ratio within the runs that measured its arms (`within_runs`: a merge of several), else
    from its bench-table.md's medians."""
    folder = Path(folder)
    if not (folder / "cells.jsonl").exists():
        return ratios(load_medians(folder), concurrencies)
    return merged_ratios(read_cells(folder / "cells.jsonl"), concurrencies, acc_len)


def compare_markdown(rat: dict, concurrencies: list[int]) -> str:
    """A2/E and A2/A0 per C for several runs (name -> `load_ratios`), e.g. ours vs upstream's
    switch."""
    names = list(rat)
    lines = [
        "| C | " + " | ".join(f"A2/E {n}" for n in names) + " | " + " | ".join(f"A2 vs A0 {n}" for n in names) + " |",
        "|" + "---|" * (1 + 2 * len(names)),
    ]
    for C in concurrencies:
        a2e = [rat[n].get(C, {}).get("A2/E") for n in names]
        a2a0 = [rat[n].get(C, {}).get("A2/A0") for n in names]
        lines.append(f"| {C} | " + " | ".join(map(or_dash, a2e)) + " | " + " | ".join(map(or_dash, a2a0)) + " |")
    return "\n".join(lines) + "\n"


def compare_runs_markdown(cells_by_name: dict, concurrencies: list[int], ratio: str = "A2/E") -> str:
    """Per C, each source's per-run `ratio` (median run, range, runs) and, for two sources, the
    exact rank-sum p of their runs (`rank_sum_p`): whether one engine's runs sit apart from the
    other's, or the gap between two medians is run-to-run noise. name -> merged cells."""
    per = {n: per_run_ratios(cs, concurrencies) for n, cs in cells_by_name.items()}
    names = list(per)
    pair = len(names) == 2
    lines = [
        "| C | "
        + " | ".join(f"{ratio} {n}: median run (range, runs)" for n in names)
        + (" | rank-sum p |" if pair else " |"),
        "|" + "---|" * (1 + len(names) + pair),
    ]
    for C in concurrencies:
        runs = [list(per[n].get(C, {}).get(ratio, {}).get("runs", {}).values()) for n in names]
        if not any(runs):
            continue
        cols = [f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f}, {len(r)})" if r else "-" for r in runs]
        test = [f"{rank_sum_p(*runs):.2f}" if all(runs) else "-"] if pair else []
        lines.append(f"| {C} | " + " | ".join(cols + test) + " |")
    return "\n".join(lines) + "\n"


def plot_ratio(rat: dict, concurrencies: list[int], path, title: str) -> None:
    """A2/E against C, one line per run (name -> `load_ratios`), with the 0.98 goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in rat.items():
        xs = [C for C in concurrencies if "A2/E" in r.get(C, {})]
        ax.plot(xs, [r[C]["A2/E"] for C in xs], marker="o", label=name)
    ax.axhline(0.98, color="red", ls="--", lw=1, label="goal 0.98")
    ax.axhline(1.0, color="black", lw=0.5)
    _finish(fig, ax, "A2 / max(A0, A1)", title, path, [C for r in rat.values() for C in r if C in concurrencies])
