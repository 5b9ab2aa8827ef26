"""A bench results folder: the cells a run resumes from and what may share a table with them
(load, TP size, target, one release per arm), the report, table and plot written from the
cells, and the merge of folders measured apart into one report."""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import BadInputError
from . import analyze
from .arms import arms as make_arms
from .models import DEFAULT_TARGET, TARGETS


def cell_load(cell: dict) -> str:
    """The load a recorded cell was measured with (cells from before the staggered load have
    no `stagger` field: lockstep)."""
    return "staggered" if cell.get("stagger") else "lockstep"


def cell_tp(cell: dict) -> int:
    """The tensor-parallel size a recorded cell was measured at (cells without `tp`: 1)."""
    return int(cell.get("tp", 1))


def cell_target(cell: dict) -> str:
    """The target shape a recorded cell was measured on (cells without `target`: the 8B Llama)."""
    return cell.get("target", DEFAULT_TARGET)


# Where the unmeasured wave runs (worker.handle): before every load, on every engine alike.
WARMUP = "before every load"


def cell_warmup(cell: dict) -> str:
    """Where the unmeasured wave ran before a recorded cell (cells without `warmup`: only at the
    engine's first visit of a C, before engines with a threshold waited for their counters)."""
    return cell.get("warmup", "at an engine's first visit of a C")


# What cells must share to make one table, resumed (load_cells) or merged (merge): the option,
# how a cell records it, and how an error names the values found. The warm-up is no option:
# a folder of cells measured otherwise takes no new cells (refuse_other_warmup).
CELL_SETUP = (
    ("load", cell_load, lambda vs: f"the {' and '.join(vs)} load"),
    ("tp", cell_tp, lambda vs: f"--tp {' and '.join(map(str, vs))}"),
    ("target", cell_target, lambda vs: f"--target {' and '.join(vs)}"),
    ("warm-up", cell_warmup, lambda vs: f"the warm-up wave {' and '.join(vs)}"),
)


def load_cells(
    cells_path: Path, acc_len: float, load: str = "lockstep", tp: int = 1, target: str = DEFAULT_TARGET
) -> tuple[list, set]:
    """The cells a results folder holds and their (arm, C, rep, acc_len) keys, so a run resumes;
    refused (a one-paragraph error) if they were measured with another setting of CELL_SETUP
    (the other load, another tensor-parallel size): such cells must not share a table."""
    if not cells_path.exists():
        return [], set()
    cells = analyze.read_cells(cells_path)
    done = {(c["arm"], c["C"], c["rep"], c.get("acc_len", acc_len)) for c in cells}
    asked = {"load": load, "tp": tp, "target": target}
    for name, read, describe in CELL_SETUP:
        if name not in asked:
            continue
        held = sorted({read(c) for c in cells})
        if set(held) - {asked[name]}:
            fix = f"Rerun with --{name} {held[0]}, or" if len(held) == 1 else "It cannot be resumed;"
            raise BadInputError(
                f"{cells_path} holds cells measured with {describe(held)}, and this run asks for --{name} {asked[name]}; "
                f"such cells must not share a table. {fix} measure into a new --out folder."
            )
    return cells, done


def refuse_other_warmup(cells: list, cells_path: Path) -> None:
    """A run that adds cells to a folder whose cells ran their warm-up wave elsewhere than
    WARMUP is refused (a one-paragraph error): the engines with a threshold met those loads
    idle and the others did not, so the two kinds of cell must not share a table. A run that
    adds only transition rounds may: each round is read against its own references."""
    held = sorted({cell_warmup(c) for c in cells} - {WARMUP})
    if held:
        raise BadInputError(
            f"{cells_path} holds cells measured with the warm-up wave {' and '.join(held)}, and this bench "
            f"runs it {WARMUP}; such cells must not share a table. Measure into a new --out folder."
        )


def earlier_startup(report: Path) -> dict:
    """The start-up times an earlier run of this folder reported, arm -> seconds ({} without a
    readable report: the cells, not the report, are what a run resumes from; a time that is no
    number is no record)."""
    try:
        held = analyze.read_json(report).get("startup_s") or {} if report.exists() else {}
    except BadInputError:
        return {}
    return {arm: s for arm, s in held.items() if isinstance(s, (int, float))}


def releases_by_arm(cells, version: str | None) -> dict:
    """arm -> the SGLang releases its cells were measured on (a cell without `sglang` on
    `version`, its run's --sglang-dir release): one arm's cells must come from one."""
    out = {}
    for c in cells:
        out.setdefault(c["arm"], set()).add(c.get("sglang", version))
    return out


def _named(releases) -> str:
    return ", ".join(f"SGLang {v}" for v in sorted(releases, key=str))


def refuse_other_releases(cells, arm_list, envs, cells_path: Path) -> None:
    """A one-paragraph error when an arm of this run resumes cells that were measured on
    another release than the one it runs now (`envs`: engines.Environments): its table would
    mix two releases under one name."""
    held = releases_by_arm(cells, envs.version)
    for arm in arm_list:
        now = envs.release(arm.name)
        if held.get(arm.name, {now}) - {now}:
            raise BadInputError(
                f"{cells_path} holds cells of arm {arm.name} measured on {_named(held[arm.name])}, and this run "
                f"starts it on SGLang {now}; one arm's cells must come from one release. Give the arm the tree "
                "its cells were measured on, or another name (--variant), or measure into a new --out folder."
            )


def summarize(
    out: Path,
    cells,
    concurrencies,
    threshold,
    acc_len,
    trans,
    startup,
    version=None,
    gpu=None,
    arm_list=(),
    load="lockstep",
    extra=None,
    target=None,
) -> dict:
    m = analyze.medians(cells, acc_len)
    r = analyze.merged_ratios(cells, concurrencies, acc_len)
    intervals = analyze.merged_intervals(cells, concurrencies, acc_len)
    per_run = analyze.per_run_ratios(cells, concurrencies, acc_len)
    # The standard arms, then the others in the order the cells first name them: a folder
    # measured in several runs (variants of an earlier one) regenerates the same table.
    labels = {a.name: a.label for a in make_arms(threshold, max(concurrencies))}
    given = {a.name: a.label for a in arm_list}
    recorded = {c["arm"]: c["label"] for c in cells if "label" in c}  # a variant of an earlier run
    for arm in dict.fromkeys(c["arm"] for c in cells):
        labels.setdefault(arm, given.get(arm, recorded.get(arm, arm)))
    # Arms measured on another release than the report's (--arm-sglang-dir) name it, from their cells.
    releases = {arm: min(held, key=str) for arm, held in releases_by_arm(cells, version).items() if held != {version}}
    for arm, release in releases.items():
        labels[arm] = f"{labels.get(arm, arm)} (SGLang {release})"
    tp = max((cell_tp(c) for c in cells), default=1)  # one size per folder (load_cells, merge)
    target = target or next((cell_target(c) for c in cells), DEFAULT_TARGET)  # given, else the cells'

    report = {
        "sglang_version": version,
        "gpu": gpu,
        "threshold": threshold,
        "acc_len": acc_len,
        "concurrencies": concurrencies,
        "load": load,
        **({"tp": tp} if tp > 1 else {}),
        **({"target": target} if target != DEFAULT_TARGET else {}),
        "cells": {f"{a}@{C}": v for (a, C), v in sorted(m.items(), key=lambda kv: (kv[0][0], kv[0][1]))},
        "ratios": {str(C): v for C, v in r.items()},
        "ratio_intervals_90": {str(C): v for C, v in intervals.items()},
        **({"per_run_ratios": {str(C): v for C, v in per_run.items()}} if per_run else {}),
        "suggested_threshold": analyze.suggest_threshold(m, concurrencies),
        "transition": _transition_summary(trans, m) if trans else None,
        "startup_s": startup,
        **({"arm_sglang_versions": releases} if releases else {}),
        **(extra or {}),
    }
    (out / "bench-results.json").write_text(json.dumps(report, indent=1))
    parts = [analyze.markdown(m, concurrencies, [a for a in labels if any(k[0] == a for k in m)], r)] if m else []
    interval_table = analyze.interval_markdown(intervals, concurrencies)
    if interval_table:
        parts.append(interval_table)
    if per_run:
        parts.append(analyze.per_run_markdown(per_run, concurrencies))
    if report["transition"]:
        parts.append(
            f"Transition workload ({_transition_loads(report['transition'])}, closed loop):\n\n"
            + analyze.transition_markdown(report["transition"])
        )
    (out / "bench-table.md").write_text("\n".join(parts))
    sharded = f", TP={tp}" if tp > 1 else ""
    title = f"{TARGETS[target].title}, {gpu or '?'}{sharded}, SGLang {version or '?'}, acceptance {acc_len}, T={threshold}, {load} load"
    if m:  # a transition-only run (--reps 0) has no cells to plot
        try:
            analyze.plot(m, concurrencies, labels, out / "bench-plot.png", title)
        except ImportError:
            pass
    return report


def merge(out: Path, sources: list[Path], acc_len: float = 3.0) -> dict:
    """One report from result folders measured apart: a sweep split over GPUs (each its own C)
    or over calls, or repeated runs of the same cells pooled (CPU only). Their cells must share
    the SGLang version, GPU, threshold and CELL_SETUP (load, TP size); cells keep their folder
    (`source`) and medians pool every rep of an (arm, C). A transition is one engine's schedule
    against its own references, so transitions are never pooled: the first of an arm keeps the
    arm's name, a later one is listed beside it as "ARM (FOLDER)"."""
    if (out / "cells.jsonl").exists():
        raise BadInputError(f"--merge: {out} already holds cells.jsonl; merge into a new folder.")
    named = [src.resolve() for src in sources]
    twice = sorted({str(src) for src, r in zip(sources, named) if named.count(r) > 1})
    if twice:
        raise BadInputError(f"--merge: {', '.join(twice)} named more than once; its cells would count twice.")
    cells, trans, meta = [], {}, {}
    for src in sources:
        has_cells, tpath = (src / "cells.jsonl").exists(), src / "transition.json"
        if not has_cells and not tpath.exists():
            raise BadInputError(f"--merge: {src} has no cells.jsonl or transition.json (not a bench results folder).")
        report = analyze.read_json(src / "bench-results.json") if (src / "bench-results.json").exists() else {}
        src_cells = (
            [c for c in analyze.read_cells(src / "cells.jsonl") if c.get("acc_len", acc_len) == acc_len]
            if has_cells
            else []
        )
        held = [(name, v) for name, read, _ in CELL_SETUP for v in sorted({read(c) for c in src_cells})]
        held += [(k, report[k]) for k in ("sglang_version", "gpu", "threshold") if report.get(k) is not None]
        for key, value in held:
            if meta.setdefault(key, value) != value:
                raise BadInputError(
                    f"--merge: {src} was measured with {key} {value!r}, an earlier folder with "
                    f"{meta[key]!r}; only runs of the same setup make one table."
                )
        cells += [{**c, "source": c.get("source", src.name)} for c in src_cells]
        for key, res in (analyze.read_json(tpath) if tpath.exists() else {}).items():
            arm = res.get("arm", key)
            label = key if key not in trans else f"{arm} ({res.get('source', src.name)})"
            trans[label] = {**res, "arm": arm, "source": res.get("source", src.name)}
    if not cells:
        raise BadInputError(f"--merge: no cells at acceptance {acc_len:g} in {', '.join(map(str, sources))}.")
    for arm, releases in releases_by_arm(cells, meta.get("sglang_version")).items():
        if len(releases) > 1:
            raise BadInputError(
                f"--merge: arm {arm}'s cells were measured on {_named(releases)}; one arm's cells must come from "
                "one release. Merge the folders of one release, or give the arm another name in one of them."
            )
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cells.jsonl", "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in cells)
    if trans:
        (out / "transition.json").write_text(json.dumps(trans, indent=1))
    concurrencies = sorted({c["C"] for c in cells})
    return summarize(
        out,
        cells,
        concurrencies,
        meta.get("threshold", 0),
        acc_len,
        trans or None,
        {},
        meta.get("sglang_version"),
        meta.get("gpu"),
        load=meta.get("load", "lockstep"),
        extra={"merged_from": [src.name for src in sources]},
    )


def transition_rounds_of(res: dict | None) -> list[dict]:
    """The rounds of one engine's transition as transition.json holds it: one round as the
    result itself, several under "rounds"; none for an engine without one."""
    return [] if res is None else res.get("rounds") or [res]


def as_transition(rounds: list[dict]) -> dict:
    """transition.json's record of one engine's rounds (see transition_rounds_of)."""
    return rounds[0] if len(rounds) == 1 else {"rounds": rounds}


def refuse_other_schedules(trans: dict | None, pending, schedule: list[dict], tpath: Path) -> None:
    """Rounds a run adds are read beside the rounds the folder holds, phase by phase: refused
    (a one-paragraph error) where those were measured at other loads (another --max-batch,
    threshold or tiers)."""
    want = [ph["C"] for ph in schedule]
    for arm in pending:
        for rnd in transition_rounds_of((trans or {}).get(arm)):
            held = [ph["C"] for ph in rnd["phases"]]
            if held != want:
                raise BadInputError(
                    f"{tpath} holds transition rounds of {arm} at C = {', '.join(map(str, held))}, and this "
                    f"run's schedule is C = {', '.join(map(str, want))} (its engines' switch points and "
                    "--max-batch); rounds of two schedules must not share a table. Rerun with the settings "
                    "that measured them, or measure into a new --out folder."
                )


def _transition_loads(rows_by_arm: dict) -> str:
    """The table's title for the loads the transitions alternate: "alternating C=4 and C=192",
    with each high load an arm ran where they differ (sweep.transition_schedule)."""
    loads = sorted({row["C"] for rows in rows_by_arm.values() for row in rows})
    low, high = loads[0], loads[1:] or loads
    return f"alternating C={low} and C={' or '.join(map(str, high))}"


def _transition_summary(trans, m):
    """Per transition (keyed by arm, or "ARM (FOLDER)" in a merge), each phase against its
    steady state; a transition of several rounds (--transition-rounds) lists every round's
    phases, each against the references that bracket its round."""
    out = {}
    for label, res in trans.items():
        arm = res.get("arm", label)
        rounds = transition_rounds_of(res)
        rows = []
        for number, rnd in enumerate(rounds, 1):
            for ph in rnd["phases"]:
                ref, runs, records = _reference(rnd, ph["C"])
                steady = ref or m.get((arm, ph["C"]), {}).get("median") or _interp(m, arm, ph["C"])
                rows.append(
                    {
                        **({"round": number} if len(rounds) > 1 else {}),
                        "C": ph["C"],
                        "tok_s": ph["output_tok_s"],
                        "steady": steady,
                        "ratio": ph["output_tok_s"] / steady if steady else None,
                        "reference_runs": runs,
                        "ttft_ms": ph.get("ttft_ms"),
                        "tpot_ms": ph.get("tpot_ms"),
                        "steady_ttft_ms": _mean(r.get("ttft_ms") for r in records),
                        "steady_tpot_ms": _mean(r.get("tpot_ms") for r in records),
                        "host_busy_cpus": ph.get("host_busy_cpus"),
                        "steady_host_busy_cpus": _mean(r.get("host_busy_cpus") for r in records),
                        # The GPU's SM clock, where the run sampled it (gpuclock).
                        **_clocks(ph, records),
                        # Whether the engine could switch at all, where the round recorded it.
                        **({"control": rnd["control"]} if "control" in rnd else {}),
                        # The engine's switches over the round, where its counters recorded them.
                        **({"round_switches": rnd["switches"]} if "switches" in rnd else {}),
                    }
                )
        out[label] = rows
    return out


def _clocks(phase: dict, records: list[dict]) -> dict:
    """A phase's mean SM clock against its references', where either was sampled."""
    steady = _mean(r.get("gpu_sm_mhz") for r in records)
    if phase.get("gpu_sm_mhz") is None and steady is None:
        return {}
    return {"gpu_sm_mhz": phase.get("gpu_sm_mhz"), "steady_gpu_sm_mhz": steady}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _interp(m, arm, C):
    pts = sorted((c, v["median"]) for (a, c), v in m.items() if a == arm)
    for (c0, v0), (c1, v1) in zip(pts, pts[1:]):
        if c0 <= C <= c1:
            return v0 + (v1 - v0) * (C - c0) / (c1 - c0)
    return None


def _reference(res: dict, C: int) -> tuple[float | None, list | None, list]:
    """(steady tok/s, its runs, their records) of a transition phase load: the mean of the
    standalone runs before and after the schedule. Results without the records carry the mean and
    the runs themselves."""
    records = res.get("reference_records", {}).get(str(C)) or []
    runs = [r["output_tok_s"] for r in records] or res.get("reference_runs", {}).get(str(C))
    return (sum(runs) / len(runs) if runs else res.get("reference", {}).get(str(C))), runs, records
