"""``spectool bench``: start every arm's engine (in parallel, each in its own process), then
measure the concurrency sweep arm by arm with the arm order rotated per repetition, and the
alternating low/high transition workload. Results are appended per cell, so a run cut short
by a time limit resumes where it stopped."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from ...errors import BadInputError
from ..engine_compat import server_arg_annotations
from . import analyze, engines, results
from .arms import DEFAULT_ARMS, step_tokens
from .arms import arms as make_arms
from .arms import variant as make_variant
from .models import DEFAULT_TARGET, TARGETS

MAX_ENGINES = TARGETS[DEFAULT_TARGET].max_engines  # the default target's engines per H200

DEFAULT_C = [1, 2, 4, 8, 16, 32, 64, 128, 256]
# Alternating low and high load (closed loop): switches must cost nothing visible. Each phase
# is compared with the same (C, n) run on its own, once right before the schedule and once
# right after (the reference is their mean, so an engine that drifts shows as a spread, not
# as a slow phase), so ramp and drain count alike on both sides. Low phases are 32 waves: shorter
# phases (8 or 16 waves) let identical engines' references differ by 7-17% on the H200, and
# other engines on the same GPU disturb them: a clean run has the GPU to itself.
LOW = {"C": 4, "n": 128}


def _alternating(high_C: int) -> list[dict]:
    """Five phases, C=4 and `high_C` in turn, the high load two waves."""
    high = {"C": high_C, "n": 2 * high_C}
    return [LOW, high, LOW, high, LOW]


HIGH_C = 192  # the high load, unless an engine switches at or above it
TRANSITION = _alternating(HIGH_C)


def switch_point(arm) -> int | None:
    """The largest batch at which an arm's engine still runs what it runs at small batches:
    its threshold, or its highest tier boundary where that is higher (above it the engine
    falls back, or drafts another number of steps); None for an engine that never switches."""
    threshold = arm.extra.get("speculative_disable_batch_size_threshold", arm.threshold)
    bounds = arm.extra.get("speculative_num_steps_tier_boundaries") or ()
    points = [b for b in (threshold, *bounds) if b is not None]
    return max(points) if points else None


def cannot_switch(arm, max_bs: int) -> bool:
    """Whether an arm's engine keeps one configuration at every batch up to max_bs: no
    threshold or tier boundary below it and no SGLang adaptive steps. Beside a switching
    engine in the transition, such an engine is a control (analyze.is_control)."""
    point = switch_point(arm)
    return (point is None or point >= max_bs) and not arm.extra.get("speculative_adaptive")


def transition_schedule(arms, max_bs: int) -> list[dict]:
    """The transition workload of a run, the same on every engine that runs it (a control runs
    the load it controls): C=4 and C=192 (TRANSITION), the high load raised to twice the
    highest switch point of `arms` where 192 is not above it, at most the engines' batch
    max_bs, so that every high phase crosses every switch point (one at or below it would
    measure no switch). Engines that cannot switch within max_bs (A1, A3: controls) set
    nothing. The high load's n is two waves, as at 192."""
    points = [p for a in arms if not cannot_switch(a, max_bs) and (p := switch_point(a)) is not None and p >= HIGH_C]
    return _alternating(min(max_bs, 2 * max(points))) if points else TRANSITION


# The comparisons the goals are about share a wave when the arms must be split: A2 and A4
# against A0 and A1 first, then the controls.
WAVE_ORDER = ("A0", "A1", "A2", "A4", "A3")  # then the variants


LOADS = ("lockstep", "staggered")  # the sweep's (`_requests_for`)
# The profile's: one wave of long requests, the sweep's lockstep waves, or the staggered load.
PROFILE_LOADS = ("wave", "lockstep", "staggered")


def _requests_for(C: int, load: str = "lockstep", waves: float | None = None) -> int:
    """Measured requests per cell: `waves` times C (--waves), at least 16, else the default.

    lockstep (the default): C clients start together, so with equal output lengths each wave
    of C requests prefills at once and decodes together; the whole run is measured, after an
    unmeasured warm-up wave (worker.handle). By default two waves up to C=64 and 1.5 above;
    at least 16 requests, so a cell at C=1 lasts long enough to time. More waves make longer
    cells whose medians move less from run to run, at the cost of device time.

    staggered: after worker.closed_loop's ramp, three requests per client by default, so the
    steady window spans about two request lifetimes."""
    if waves is not None:
        return max(16, math.ceil(waves * C))
    if load == "staggered":
        return max(16, 3 * C)
    return max(16, 2 * C) if C <= 64 else int(1.5 * C)


# Decode steps a profile's load keeps past the profiled ones: SGLang counts its steps from the
# forward count at its start request and writes the trace at the forward N (0.5.12-0.5.15) or
# N + 1 (0.5.16 on) steps later, so a load that ends before them leaves no trace
# (worker.profiled).
PROFILE_SPARE_STEPS = 16


def profile_out_len(
    load: str, steps: int, prompt_len: int, out_len: int, per_step: int, reserved: int, context: int
) -> int:
    """The output tokens of each request of a profile's load: `out_len`, and for the wave at
    least enough that one wave outlasts the profiled steps and the spare ones after its
    prefill, even at `per_step` tokens a step (the longest chain any arm drafts,
    arms.step_tokens: the same load for every arm). Refused (BadInputError) where the
    request would not fit the target's context as SGLang counts it (prompt, output and the
    `reserved` tokens for a step's drafts, arms.step_tokens), with the most that fits."""
    room = context - prompt_len - reserved  # the most output tokens SGLang takes
    if load != "wave":
        if out_len > room:
            raise BadInputError(
                f"--profile-load {load}: requests of {prompt_len} + {out_len} tokens do not fit the target's "
                f"context of {context} tokens with the {reserved} SGLang reserves for a step's drafts; give "
                f"--out-len {max(room, 0)} or less."
            )
        return out_len
    wanted = max(out_len, (steps + PROFILE_SPARE_STEPS) * per_step + 1)
    if wanted > room:
        most = max(0, (room - 1) // per_step - PROFILE_SPARE_STEPS)
        raise BadInputError(
            f"--profile {steps}: one wave must outlast {steps} + {PROFILE_SPARE_STEPS} spare decode steps at up "
            f"to {per_step} tokens a step ({wanted} output tokens), but the target's context of {context} tokens "
            f"holds {max(room, 0)} after the {prompt_len}-token prompt and the {reserved} tokens SGLang reserves "
            f"for a step's drafts: profile at most {most} steps in a wave, or use --profile-load lockstep."
        )
    return wanted


def profile_requests(C: int, load: str, steps: int, out_len: int, per_step: int) -> int:
    """Requests of a profile's load at C, so that it lasts the profiled steps and
    PROFILE_SPARE_STEPS more after the profiler starts (worker.profiled: once the first
    wave's prefills are done, or after the staggered ramp), even at `per_step` tokens a step
    (the longest chain any arm drafts), when a request takes fewest steps. wave: one wave
    (profile_out_len makes it long enough). lockstep: whole waves for the steps and one
    more, so the last profiled wave is not the drain. staggered: as many requests per client
    (at least the sweep's, `_requests_for`), about half a round of which has run by the end
    of the ramp."""
    if load == "wave":
        return C
    per_request = -(-(out_len - 1) // per_step)  # its fewest decode steps
    rounds = -(-(steps + PROFILE_SPARE_STEPS) // max(per_request, 1)) + 1
    if load == "staggered":
        return max(_requests_for(C, "staggered"), C * rounds)
    return C * rounds


def run(
    out: Path,
    *,
    threshold: int,
    concurrencies=DEFAULT_C,
    reps: int = 3,
    prompt_len: int = 128,
    out_len: int = 128,
    acc_len: float = 3.0,
    transition: bool = True,
    budget_s: float = 540,
    sglang_dir: str | None = None,
    arm_names: list[str] | None = None,
    variants=(),
    max_engines: int | None = None,
    load: str = "lockstep",
    waves: float | None = None,
    transition_arms=None,
    transition_rounds: int = 1,
    engine_log_level: str = "warning",
    port_base: int = engines.PORT_BASE,
    fresh_engines: bool = False,
    tp: int = 1,
    max_batch: int | None = None,
    target: str = DEFAULT_TARGET,
    arm_trees: dict | None = None,
    console=None,
) -> dict:
    """`arm_trees`: arm name -> the SGLang tree its engine runs instead of `sglang_dir` (an arm
    on another release, measured in the same run, its cells interleaved with the others')."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..verify.runner import gpu_info

    max_bs = engine_batch(concurrencies, max_batch)
    max_engines = engines_per_gpu(target, max_engines)
    arm_list = select_arms(threshold, max_bs, arm_names, variants, sglang_dir, arm_trees=arm_trees)
    # Named arms must be measured; the default (A2) just finds no engine in a run without it.
    unknown = sorted(set(transition_arms or ()) - {a.name for a in arm_list})
    transition_arms = transition_arms or ("A2",)
    if transition and unknown:
        raise BadInputError(
            f"--transition-arms {','.join(transition_arms)}: {unknown} not among the arms measured "
            f"({', '.join(a.name for a in arm_list)}); add them to --arms."
        )
    if transition and not any(a.runs_transition(transition_arms) for a in arm_list):
        transition = False  # no arm of this run takes the transition workload
    # A variant's label goes into its cells, so that a later run over the same folder (the
    # derived stage of bench-tiers.sh) still names it in the plot's legend.
    variant_labels = {a.name: a.label for a in arm_list if a.base is not None}
    cells_path = out / "cells.jsonl"
    if load not in LOADS:
        raise BadInputError(f"--load {load!r}: use {' or '.join(LOADS)}.")
    cells, done = results.load_cells(
        cells_path, acc_len, load, tp, target
    )  # a folder it must not extend is refused first
    envs = engines.environments(sglang_dir, arm_trees, acc_len)
    results.refuse_other_releases(cells, arm_list, envs, cells_path)
    _, gpu = gpu_info("bench")  # a clear error (exit 2) without a GPU, before any engine starts
    t_start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    tpath = out / "transition.json"
    trans = analyze.read_json(tpath) if tpath.exists() else None
    # A resumed run reports the whole folder: its engines' start-up times and every C held.
    startup = results.earlier_startup(out / "bench-results.json")
    # The engines whose transition still lacks rounds (a resumed run measures only those).
    pending = tuple(
        a.name
        for a in arm_list
        if a.runs_transition(transition_arms)
        and len(results.transition_rounds_of((trans or {}).get(a.name))) < transition_rounds
    )
    schedule = transition_schedule([a for a in arm_list if a.runs_transition(transition_arms)], max_bs)
    if transition:
        results.refuse_other_schedules(trans, pending, schedule, tpath)
    plan = plan_steps(
        arm_list,
        concurrencies,
        reps,
        acc_len,
        done,
        transition and bool(pending),
        max_engines,
        pending,
        fresh_engines,
    )
    if any(t is not None for _, steps in plan for t in steps):  # cells to add
        results.refuse_other_warmup(cells, cells_path)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("cells", total=sum(1 for _, steps in plan for t in steps if t is not None))

        def over_budget(needed_s: float = 0.0) -> bool:
            """Whether the budget is spent, or too little of it is left for a transition round
            that takes `needed_s` (as the round before it took); the cells go on then."""
            left = budget_s - (time.time() - t_start)
            if left >= needed_s and left > 0:
                return False
            if needed_s:
                bar.console.print(
                    f"time budget reached for the transition: {left:.0f} s left, less than a round "
                    f"took ({needed_s:.0f} s); the rounds left are skipped, rerun to run them"
                )
            else:
                bar.console.print("time budget reached: stopping; rerun to resume")
            return True

        stopped, failed = False, {}  # failed: arm -> why its engine could not run (engines.start)
        round_s = 0.0  # what the last transition round took, on any engine
        for wave, steps in plan:
            if over_budget():  # before starting engines that would measure nothing
                break
            left, needed = budget_s - (time.time() - t_start), startup_estimate([a.name for a in wave], startup)
            if not ready_in_time(left, budget_s, needed):
                bar.console.print(
                    f"time budget reached: {left:.0f} s left, less than these engines' start-up as this folder "
                    f"recorded it ({needed:.0f} s): stopping; rerun to resume"
                )
                stopped = True
                break
            wave = [a for a in wave if a.name not in failed]  # with --fresh-engines, not tried again
            if not wave:
                continue
            if len(plan) > 1:
                bar.console.print(
                    f"engines for {', '.join(a.name for a in wave)} (at most {max_engines} share the GPU)"
                )
            with engines.start(
                wave,
                out,
                envs,
                max_bs,
                engines.kv_pool_tokens(max_bs, prompt_len, out_len),
                log_level=engine_log_level,
                port_base=port_base,
                tp=tp,
                target=target,
                failed=failed,
            ) as (procs, started):
                startup.update(started)
                for step in steps:
                    stopped = over_budget()
                    if stopped:
                        break
                    if step is None:  # A2 and its variants (and any control), each on its own engine
                        trans = dict(trans or {})  # an earlier wave's transitions (arms beyond --max-engines) kept
                        for a in wave:
                            held = list(results.transition_rounds_of(trans.get(a.name)))
                            if a.name in pending and a.name in procs:
                                # Written after every round: a call cut off at its time
                                # limit keeps the rounds it finished, as it keeps its cells.
                                for rnd in _transition(
                                    procs[a.name],
                                    a.name,
                                    out,
                                    prompt_len,
                                    out_len,
                                    rounds=range(len(held), transition_rounds),
                                    over_budget=over_budget,
                                    phases=schedule,
                                    expect_s=round_s,
                                ):
                                    held.append({**rnd, "control": cannot_switch(a, max_bs)})
                                    round_s = rnd["round_s"]
                                    trans[a.name] = results.as_transition(held)
                                    tpath.write_text(json.dumps(trans, indent=1))
                        continue
                    rep, C, arm = step
                    if arm not in procs:
                        continue
                    res = engines.command(
                        procs[arm],
                        arm,
                        out,
                        {
                            "kind": "point",
                            "C": C,
                            "n": _requests_for(C, load, waves),
                            "prompt_len": prompt_len,
                            "out_len": out_len,
                            "seed": 1000 * rep + C,
                            "stagger": load == "staggered",
                        },
                    )
                    cell = {
                        "arm": arm,
                        "C": C,
                        "rep": rep,
                        "acc_len": acc_len,
                        **res,
                        "max_batch": max_bs,
                        "warmup": results.WARMUP,
                        **({"engines": f"rep{rep}"} if fresh_engines else {}),
                        **({"tp": tp} if tp > 1 else {}),
                        **({"target": target} if target != DEFAULT_TARGET else {}),
                        **({"sglang": envs.release(arm)} if envs.release(arm) else {}),
                        **({"label": variant_labels[arm]} if arm in variant_labels else {}),
                    }
                    cells.append(cell)
                    with open(cells_path, "a") as f:
                        f.write(json.dumps(cell) + "\n")
                    bar.advance(task)
            if stopped:
                break
    held = {c["C"] for c in cells if c.get("acc_len", acc_len) == acc_len}
    report = results.summarize(
        out,
        cells,
        sorted(held | set(concurrencies)),
        threshold,
        acc_len,
        trans,
        startup,
        envs.version,
        gpu,
        arm_list,
        load,
        target=target,
    )
    if failed:
        raise BadInputError(
            " ".join(failed.values()) + f" The other arms were measured: {out / 'bench-table.md'}. "
            "Run the same command again once the arm can start: it measures only the cells still missing."
        )
    return report


def engines_per_gpu(target: str, max_engines: int | None) -> int:
    """--max-engines, or as many of the target's engines as fit one H200 at once."""
    return TARGETS[target].max_engines if max_engines is None else max_engines


def engine_batch(concurrencies, max_batch: int | None = None) -> int:
    """The engines' batch capacity (CUDA graph max batch, running requests, KV pool): the
    largest C, or `max_batch` when given. Why: the fallback's KV-only queue holds the largest
    graph's rows, so a run of C=64 alone on engines sized for 64 defers fewer writes than the
    same cell in a sweep up to 256; --max-batch 256 measures it on the sweep's engines, so its
    runs pool with the sweep's."""
    largest = max(concurrencies)
    if max_batch is None:
        return largest
    if max_batch < largest:
        raise BadInputError(
            f"--max-batch {max_batch} is below the largest --concurrency ({largest}): the engines "
            f"could not run that many requests at once. Give at least {largest}, or leave it out."
        )
    return max_batch


def plan_steps(
    arm_list,
    concurrencies,
    reps: int,
    acc_len: float,
    done: set,
    transition: bool,
    max_engines: int = MAX_ENGINES,
    transition_arms=("A2",),
    fresh_engines: bool = False,
) -> list[tuple[list, list]]:
    """(wave, steps) for what is still to measure: cells (rep, C, arm) not in `done`, the arm
    order rotated per repetition, and None where A2's wave runs the transition workload on A2
    and its variants (after the first repetition, so a time budget rarely cuts it off). Waves
    with nothing left are dropped, so a resumed run starts no engine it does not need.
    `fresh_engines`: one entry per wave and repetition, so every repetition gets engines of
    its own (each entry starts its engines)."""
    plan = []
    for wave in plan_waves(arm_list, max_engines):
        steps = [
            (rep, C, arm.name)
            for rep in range(reps)
            for C in concurrencies
            for arm in _rotated(wave, rep)
            if (arm.name, C, rep, acc_len) not in done
        ]
        if transition and any(a.runs_transition(transition_arms) for a in wave):
            steps.insert(next((i for i, t in enumerate(steps) if t[0] >= min(1, reps - 1)), len(steps)), None)
        if not fresh_engines:
            plan += [(_busy(wave, steps, transition_arms), steps)] if steps else []
            continue
        groups = []  # (rep, steps); the transition (None) stays with the repetition before it
        for step in steps:
            rep = step[0] if step is not None else (groups[-1][0] if groups else None)
            if not groups or groups[-1][0] != rep:
                groups.append((rep, []))
            groups[-1][1].append(step)
        plan += [(_busy(wave, g, transition_arms), g) for _, g in groups]
    return plan


def startup_estimate(wave: list[str], startup_s: dict) -> float | None:
    """How long the wave's engines take to start, as this folder recorded it (arm -> seconds,
    results.earlier_startup): the slowest of its own arms, else, for arms never started here,
    the slowest of any; None with nothing recorded."""
    return max([startup_s[a] for a in wave if a in startup_s] or startup_s.values(), default=None)


def ready_in_time(left_s: float, budget_s: float, needed_s: float | None) -> bool:
    """Whether engines that take `needed_s` to start would be ready with `left_s` seconds of
    the budget left: a wave that would only start its engines before the budget ends does not
    start, and the device time its start-up would take goes to the next call. With nothing
    recorded the wave starts, and so does one that no call of this budget could start in
    time (refusing it would stop the sweep there call after call)."""
    return needed_s is None or left_s > needed_s or needed_s >= budget_s


def _busy(wave, steps, transition_arms) -> list:
    """The arms of `wave` that `steps` measure (or run the transition on): only their engines
    start, so a resumed run's finished arms idle nowhere and no start-up waits on them."""
    measured = {t[2] for t in steps if t is not None}
    return [a for a in wave if a.name in measured or (None in steps and a.runs_transition(transition_arms))]


def plan_waves(arm_list, max_engines: int = MAX_ENGINES) -> list[list]:
    """Arms in groups of at most `max_engines` engines on the GPU at once, run one after the
    other (each with its own rotation)."""
    if max_engines < 1:
        raise BadInputError(f"--max-engines {max_engines}: at least one engine must run")
    rank = {name: i for i, name in enumerate(WAVE_ORDER)}
    ordered = sorted(arm_list, key=lambda a: rank.get(a.name, len(rank)))
    return [ordered[i : i + max_engines] for i in range(0, len(ordered), max_engines)]


def _transition(
    proc,
    arm: str,
    out: Path,
    prompt_len: int,
    out_len: int,
    rounds=range(1),
    over_budget=lambda needed_s=0.0: False,
    phases=TRANSITION,
    expect_s: float = 0.0,
) -> Iterator[dict]:
    """The alternating schedule `phases` (transition_schedule) on one engine, once per round in
    `rounds` (their numbers, which seed their prompts), bracketed by standalone runs of each
    distinct phase (same C and n) before and after it: its steady-state reference is their
    mean, the references between two rounds serving both. Every run has prompts of its own
    (seeds), so none finds another's in the radix cache. A round starts only if the budget
    left holds what the round before it took (`expect_s`: another engine's, for the first; a
    call's time limit would cut it off half-way). Each round is yielded as it ends, with its
    references' whole records and its time (`round_s`: the schedule and the references after
    it, what a later round runs). Several rounds let each phase be read as the median of its
    rounds: one phase of one round moves by several points between identical engines."""

    def references(seed):
        return {
            str(ph["C"]): engines.command(
                proc,
                arm,
                out,
                {
                    "kind": "point",
                    "C": ph["C"],
                    "n": ph["n"],
                    "prompt_len": prompt_len,
                    "out_len": out_len,
                    "seed": seed + ph["C"],
                },
            )
            for ph in {ph["C"]: ph for ph in phases}.values()
        }

    # Round r's seeds are r * 100000 above the first round's: above any sweep cell's
    # (1000 * rep + C) from the second round on, so no round's prompts are another run's.
    schedule = {"kind": "phases", "schedule": phases, "prompt_len": prompt_len, "out_len": out_len}
    before, took = None, expect_s
    for r in rounds:
        if took and over_budget(took):
            break
        before = before or references(1077 + 100000 * r)
        tic = time.monotonic()  # a later round runs the schedule and the references after it
        res = engines.command(proc, arm, out, {**schedule, "seed": 77 + 100000 * r})
        after = references(2077 + 100000 * r)
        # The references' whole records (TTFT, TPOT, window): the steady state and its runs are
        # read from them (results._reference), and a phase that reads slow can be told apart as
        # slower steps or as a longer wait for the first token.
        took = time.monotonic() - tic
        yield {**res, "reference_records": {C: [before[C], after[C]] for C in before}, "round_s": round(took, 1)}
        before = after


def select_arms(
    threshold: int,
    max_bs: int,
    arm_names,
    variants=(),
    sglang_dir: str | None = None,
    server_args: dict[str, str] | None = None,
    arm_trees: dict | None = None,
) -> list:
    """The arms named (the default five when none are) plus every variant (see
    arms.variant), or a one-paragraph error naming what is wrong. A variant's fields are
    checked against `server_args` (field -> type), by default those of the SGLang its engine
    runs: its own tree in `arm_trees`, else --sglang-dir (else the installed one)."""
    every = make_arms(threshold, max_bs)
    extra = []
    arm_trees = arm_trees or {}
    fields = {}

    def server_fields(tree):  # read once per tree, for the first variant that is well-formed
        if tree not in fields:
            fields[tree] = server_args if server_args is not None else server_arg_annotations(tree)
        return fields[tree]

    for spec in variants or ():
        tree = arm_trees.get(spec.partition("=")[0].strip(), sglang_dir)
        try:
            arm = make_variant(spec, every, lambda tree=tree: server_fields(tree))
        except ValueError as exc:
            raise BadInputError(f"--variant {spec!r}: {exc}.") from None
        if arm.name in {a.name for a in every + extra}:
            raise BadInputError(f"--variant {spec!r}: arm {arm.name} already exists; give the variant its own name.")
        extra.append(arm)
    known = {a.name for a in every + extra}
    unknown = sorted(set(arm_names or ()) - known)
    if unknown:
        raise BadInputError(
            f"--arms {','.join(arm_names)}: unknown arm(s) {unknown}; the arms are A0 (no speculation), "
            "A1 (EAGLE-3), A2 (threshold T), A3 (threshold above any batch), A4 (threshold 0), "
            "and the --variant arms."
        )
    wanted = set(arm_names or DEFAULT_ARMS) | {a.name for a in extra}
    stray = sorted(set(arm_trees) - wanted)
    if stray:
        raise BadInputError(
            f"--arm-sglang-dir names {', '.join(stray)}, which this run does not measure; name an arm "
            f"of --arms or a --variant ({', '.join(sorted(wanted))})."
        )
    chosen = [a for a in every + extra if a.name in wanted]
    for arm in chosen:
        tree = arm_trees.get(arm.name)
        if tree and arm.threshold is not None and "speculative_disable_batch_size_threshold" not in server_fields(tree):
            raise BadInputError(
                f"--arm-sglang-dir {arm.name}={tree}: arm {arm.name} falls back at a threshold, but that SGLang has "
                "no --speculative-disable-batch-size-threshold. Apply the recipes to it (spectool apply "
                "--sglang-dir), or base the arm on A0 or A1."
            )
    return chosen


def profile(
    out: Path,
    *,
    threshold: int,
    concurrencies,
    arm_names=("A0", "A4"),
    variants=(),
    steps: int = 30,
    prompt_len: int = 128,
    out_len: int = 1024,
    acc_len: float = 3.0,
    sglang_dir: str | None = None,
    max_engines: int | None = None,
    load: str = "wave",
    port_base: int = engines.PORT_BASE,
    tp: int = 1,
    max_batch: int | None = None,
    target: str = DEFAULT_TARGET,
    arm_trees: dict | None = None,
    console=None,
) -> dict:
    """Profile `steps` steady-state steps per arm and C with SGLang's own profiler and reduce
    each trace (bench/profile.py): profile.json and profile.md in `out`. `load`: "wave" (decode
    steps of one wave of long requests), "lockstep" (the sweep's own waves of `out_len`, for
    `steps` that span whole waves: what a bench cell measures, prefills and wave ends included)
    or "staggered" (the sweep's steady load at `out_len`, prefills of arriving requests
    included). A C listed again is profiled again on the same
    engines, after the waves before it (with prompts of its own): whether a gap between arms
    stays as the engines age, e.g. `--concurrency 64,64,64`."""
    if load not in PROFILE_LOADS:
        raise BadInputError(f"--profile-load {load!r}: use {' or '.join(PROFILE_LOADS)}.")
    from ..verify.runner import gpu_info
    from . import profile as prof

    max_bs = engine_batch(concurrencies, max_batch)
    arm_list = select_arms(threshold, max_bs, arm_names, variants, sglang_dir, arm_trees=arm_trees)
    arm_tokens = [step_tokens(a) for a in arm_list]
    per_step = max(t.per_step for t in arm_tokens)
    reserved = max(t.reserved for t in arm_tokens)
    context = TARGETS[target].target["max_position_embeddings"]
    out_len = profile_out_len(load, steps, prompt_len, out_len, per_step, reserved, context)
    waves = plan_waves(arm_list, engines_per_gpu(target, max_engines))
    gpu_info("bench")
    out.mkdir(parents=True, exist_ok=True)
    envs = engines.environments(sglang_dir, arm_trees, acc_len)
    rows, raw = {}, {}
    # The arms that fit the GPU together are profiled side by side, C by C; more run in waves
    # of engines, one after the other, as the sweep's do (two MoE-shaped engines do not fit
    # one H200).
    for wave in waves:
        with engines.start(
            wave,
            out,
            envs,
            max_bs,
            engines.kv_pool_tokens(max_bs, prompt_len, out_len),
            port_base=port_base,
            tp=tp,
            target=target,
        ) as (procs, _):
            for i, C in enumerate(concurrencies):
                k = concurrencies[:i].count(C)  # how often this C was profiled before, on these engines
                tag = f"{C}" + (f"#{k + 1}" if k else "")
                for arm in wave:
                    tdir = out / "traces" / f"{arm.name}-C{tag}"
                    shutil.rmtree(tdir, ignore_errors=True)  # a folder profiled again: this run's trace only
                    n = profile_requests(C, load, steps, out_len, per_step)
                    res = engines.command(
                        procs[arm.name],
                        arm.name,
                        out,
                        {
                            "kind": "profile",
                            "C": C,
                            "n": n,
                            "prompt_len": prompt_len,
                            "out_len": out_len,
                            "seed": C + 1000 * k,
                            "steps": steps,
                            "dir": str(tdir),
                            "stagger": load == "staggered",
                        },
                    )
                    traces, events = prof.trace_files(tdir), []
                    if res.get("profile_stopped_early"):
                        summary = {"error": _no_trace(steps, C, n, out_len, tdir if traces else None)}
                    elif not traces:
                        summary = {"error": f"no trace written in {tdir} (the engine's log: {out / f'{arm.name}.log'})"}
                    else:
                        events = prof.load_events(traces[0])
                        summary = prof.summarize(events, steps)
                    if events:  # the middle two steps, every event: the idle attribution can be re-read
                        cut = out / "excerpts" / prof.excerpt_name(arm.name, C, k)
                        cut.parent.mkdir(exist_ok=True)
                        cut.write_bytes(
                            gzip.compress(json.dumps({"traceEvents": prof.excerpt(events, steps)}).encode())
                        )
                    summary["output_tok_s"] = res.get("output_tok_s")
                    rows[(arm.name, C, k)] = summary
                    raw[f"{arm.name}@{tag}"] = summary
                    # Written after every trace: an engine that dies later leaves what was measured.
                    (out / "profile.json").write_text(
                        json.dumps(
                            {
                                "sglang_version": envs.version,
                                "threshold": threshold,
                                "steps": steps,
                                "load": load,
                                "out_len": out_len,
                                **({"tp": tp} if tp > 1 else {}),
                                "rows": raw,
                            },
                            indent=1,
                        )
                    )
                    (out / "profile.md").write_text(prof.markdown(rows))
                    if console:
                        console.print(
                            f"profiled {arm.name} at C={tag}: {summary.get('step_ms', 0):.2f} ms/step, "
                            f"GPU busy {summary.get('gpu_busy_ms', 0):.2f} ms"
                        )
    return raw


def _no_trace(steps: int, C: int, n: int, out_len: int, partial: Path | None) -> str:
    """Why a profile has no trace although the engine ran its load: SGLang writes the trace at
    the first step past the profiled ones, and this load ended first."""
    kept = f"; what the stopped profiler wrote is in {partial}" if partial else ""
    return (
        f"no trace of {steps} steps: the load ({n} requests of {out_len} tokens at C={C}) ended before SGLang's "
        f"profiler had run them, so it was stopped without a full trace{kept}"
    )


def _rotated(arm_list, rep):
    k = rep % len(arm_list)
    return arm_list[k:] + arm_list[:k]
