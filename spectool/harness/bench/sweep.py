"""``spectool bench``: start every arm's engine (in parallel, each in its own process), then
measure the concurrency sweep arm by arm with the arm order rotated per repetition, and the
alternating low/high transition workload. Results are appended per cell, so a run cut short
by a time limit resumes where it stopped."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ...errors import BadInputError
from ..engine_compat import server_arg_annotations
from . import analyze
from .arms import DEFAULT_ARMS, engine_kwargs
from .arms import arms as make_arms
from .arms import variant as make_variant
from .models import DEFAULT_TARGET, TARGETS, write_models

MAX_ENGINES = TARGETS[DEFAULT_TARGET].max_engines  # the default target's engines per H200

DEFAULT_C = [1, 2, 4, 8, 16, 32, 64, 128, 256]
# Alternating low and high load (closed loop): switches must cost nothing visible. Each phase
# is compared with the same (C, n) run on its own, once right before the schedule and once
# right after (the reference is their mean, so an engine that drifts shows as a spread, not
# as a slow phase), so ramp and drain count alike on both sides. Low phases are 32 waves: shorter
# phases (8 or 16 waves) let identical engines' references differ by 7-17% on the H200, and
# other engines on the same GPU disturb them: a clean run has the GPU to itself.
LOW, HIGH = {"C": 4, "n": 128}, {"C": 192, "n": 384}
TRANSITION = [LOW, HIGH, LOW, HIGH, LOW]

# The comparisons the goals are about share a wave when the arms must be split: A2 and A4
# against A0 and A1 first, then the controls.
WAVE_ORDER = ("A0", "A1", "A2", "A4", "A3")  # then the variants


LOADS = ("lockstep", "staggered")  # the sweep's (`_requests_for`)
# The profile's: one wave of long requests, the sweep's lockstep waves, or the staggered load.
PROFILE_LOADS = ("wave", "lockstep", "staggered")
# Engine ports: PORT_BASE + 100*i. Two benches on one host (one per GPU) need their own base,
# below 32768, where Linux hands out ephemeral ports: the rendezvous ports are fixed.
PORT_BASE = 32000


def arm_port(port_base: int, i: int) -> int:
    """The port of the i-th engine of a bench (its rendezvous port inside that block)."""
    return port_base + 100 * i


def cell_load(cell: dict) -> str:
    """The load a recorded cell was measured with (cells from before the staggered load have
    no `stagger` field: lockstep)."""
    return "staggered" if cell.get("stagger") else "lockstep"


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


def _profile_requests(C: int, load: str, steps: int, out_len: int) -> int:
    """Requests for a profile: one wave; the staggered sweep's; or for lockstep, waves enough
    for the profiler's warm-up (worker.profiled waits two seconds: two waves of 128 tokens at
    C=64 on the H200) and `steps` forward steps (out_len - 1 decode steps and about one
    prefill step per wave), and one more so the last profiled wave is not the drain."""
    if load == "staggered":
        return _requests_for(C, "staggered")
    if load == "lockstep":
        return C * (2 + -(-steps // out_len) + 1)
    return C


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
    engine_log_level: str = "warning",
    port_base: int = PORT_BASE,
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
    cells_path = out / "cells.jsonl"
    if load not in LOADS:
        raise BadInputError(f"--load {load!r}: use {' or '.join(LOADS)}.")
    cells, done = load_cells(cells_path, acc_len, load, tp, target)  # a folder it must not extend is refused first
    version, env = _environment(sglang_dir, acc_len)
    arm_versions, arm_envs = _arm_environments(arm_trees, acc_len, sglang_dir)
    refuse_other_releases(cells, arm_list, arm_versions, version, cells_path)
    _, gpu = gpu_info("bench")  # a clear error (exit 2) without a GPU, before any engine starts
    t_start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    tpath = out / "transition.json"
    trans = analyze.read_json(tpath) if tpath.exists() else None
    # A resumed run reports the whole folder: its engines' start-up times and every C held.
    startup = _earlier_startup(out / "bench-results.json")
    plan = plan_steps(
        arm_list,
        concurrencies,
        reps,
        acc_len,
        done,
        transition and trans is None,
        max_engines,
        transition_arms,
        fresh_engines,
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("cells", total=sum(1 for _, steps in plan for t in steps if t is not None))

        def over_budget() -> bool:
            if time.time() - t_start <= budget_s:
                return False
            bar.console.print("time budget reached: stopping; rerun to resume")
            return True

        stopped = False
        for wave, steps in plan:
            if over_budget():  # before starting engines that would measure nothing
                break
            if len(plan) > 1:
                bar.console.print(
                    f"engines for {', '.join(a.name for a in wave)} (at most {max_engines} share the GPU)"
                )
            with _engines(
                wave,
                out,
                env,
                max_bs,
                kv_pool_tokens(max_bs, prompt_len, out_len),
                log_level=engine_log_level,
                port_base=port_base,
                tp=tp,
                target=target,
                arm_envs=arm_envs,
            ) as (procs, started):
                startup.update(started)
                for step in steps:
                    stopped = over_budget()
                    if stopped:
                        break
                    if step is None:  # A2 and its variants (and any control), each on its own engine
                        trans = {  # an earlier wave's transitions (arms beyond --max-engines) kept
                            **(trans or {}),
                            **{
                                a.name: _transition(procs[a.name], a.name, out, prompt_len, out_len)
                                for a in wave
                                if a.runs_transition(transition_arms)
                            },
                        }
                        tpath.write_text(json.dumps(trans, indent=1))
                        continue
                    rep, C, arm = step
                    res = _command(
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
                        **({"engines": f"rep{rep}"} if fresh_engines else {}),
                        **({"tp": tp} if tp > 1 else {}),
                        **({"target": target} if target != DEFAULT_TARGET else {}),
                        **({"sglang": arm_versions.get(arm, version)} if arm_versions.get(arm, version) else {}),
                    }
                    cells.append(cell)
                    with open(cells_path, "a") as f:
                        f.write(json.dumps(cell) + "\n")
                    bar.advance(task)
            if stopped:
                break
    held = {c["C"] for c in cells if c.get("acc_len", acc_len) == acc_len}
    return summarize(
        out,
        cells,
        sorted(held | set(concurrencies)),
        threshold,
        acc_len,
        trans,
        startup,
        version,
        gpu,
        arm_list,
        load,
        target=target,
    )


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


def cell_tp(cell: dict) -> int:
    """The tensor-parallel size a recorded cell was measured at (cells without `tp`: 1)."""
    return int(cell.get("tp", 1))


def cell_target(cell: dict) -> str:
    """The target shape a recorded cell was measured on (cells without `target`: the 8B Llama)."""
    return cell.get("target", DEFAULT_TARGET)


# What cells must share to make one table, resumed (load_cells) or merged (merge): the option,
# how a cell records it, and how an error names the values found.
CELL_SETUP = (
    ("load", cell_load, lambda vs: f"the {' and '.join(vs)} load"),
    ("tp", cell_tp, lambda vs: f"--tp {' and '.join(map(str, vs))}"),
    ("target", cell_target, lambda vs: f"--target {' and '.join(vs)}"),
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
        held = sorted({read(c) for c in cells})
        if set(held) - {asked[name]}:
            fix = f"Rerun with --{name} {held[0]}, or" if len(held) == 1 else "It cannot be resumed;"
            raise BadInputError(
                f"{cells_path} holds cells measured with {describe(held)}, and this run asks for --{name} {asked[name]}; "
                f"such cells must not share a table. {fix} measure into a new --out folder."
            )
    return cells, done


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


def _transition(proc, arm: str, out: Path, prompt_len: int, out_len: int) -> dict:
    """The alternating schedule on one engine, bracketed by standalone runs of each distinct
    phase (same C and n) before and after it: the steady-state reference is their mean.
    Every run has prompts of its own (seeds), so none finds another's in the radix cache."""

    def references(seed):
        return {
            str(ph["C"]): _command(
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
            for ph in (LOW, HIGH)
        }

    before = references(1077)
    res = _command(
        proc,
        arm,
        out,
        {"kind": "phases", "schedule": TRANSITION, "prompt_len": prompt_len, "out_len": out_len, "seed": 77},
    )
    after = references(2077)
    # The references' whole records (TTFT, TPOT, window): the steady state and its runs are
    # read from them (_reference), and a phase that reads slow can be told apart as slower
    # steps or as a longer wait for the first token.
    return {**res, "reference_records": {C: [before[C], after[C]] for C in before}}


def _reference(res: dict, C: int) -> tuple[float | None, list | None, list]:
    """(steady tok/s, its runs, their records) of a transition phase load: the mean of the
    standalone runs before and after the schedule. Results without the records carry the mean and
    the runs themselves."""
    records = res.get("reference_records", {}).get(str(C)) or []
    runs = [r["output_tok_s"] for r in records] or res.get("reference_runs", {}).get(str(C))
    return (sum(runs) / len(runs) if runs else res.get("reference", {}).get(str(C))), runs, records


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


def _arm_environments(arm_trees: dict | None, acc_len: float, sglang_dir=None) -> tuple[dict, dict]:
    """(arm -> SGLang version, arm -> engine environment) for the arms on trees of their own.
    Their PYTHONPATH leaves out the --sglang-dir tree, so nothing of that release fills in for
    a module theirs lacks."""
    from ...source import locate

    under_test = str(locate(sglang_dir).root) if sglang_dir else None
    versions, envs = {}, {}
    for name, tree in (arm_trees or {}).items():
        versions[name], env = _environment(tree, acc_len)
        if under_test and env.get("PYTHONPATH"):
            kept = [p for p in env["PYTHONPATH"].split(os.pathsep) if p != under_test]
            env = {**env, "PYTHONPATH": os.pathsep.join(kept)}
        envs[name] = env
    return versions, envs


def _earlier_startup(report: Path) -> dict:
    """The start-up times an earlier run of this folder reported ({} without a readable report:
    the cells, not the report, are what a run resumes from)."""
    try:
        return dict(analyze.read_json(report).get("startup_s") or {}) if report.exists() else {}
    except BadInputError:
        return {}


def refuse_other_releases(cells, arm_list, arm_versions: dict, version: str | None, cells_path: Path) -> None:
    """A one-paragraph error when an arm of this run resumes cells that were measured on
    another release than the one it runs now (its --arm-sglang-dir tree's, else `version`,
    --sglang-dir's; a cell without `sglang` was measured on the --sglang-dir tree): its table
    would mix two releases under one name."""
    for arm in arm_list:
        now = arm_versions.get(arm.name, version)
        held = {c.get("sglang", version) for c in cells if c["arm"] == arm.name}
        if held - {now}:
            was = ", ".join(f"SGLang {v}" for v in sorted(held, key=str))
            runs = f"SGLang {now}"
            raise BadInputError(
                f"{cells_path} holds cells of arm {arm.name} measured on {was}, and this run starts it on {runs}; "
                "one arm's cells must come from one release. Give the arm the tree its cells were measured on, "
                "or another name (--variant), or measure into a new --out folder."
            )


def _environment(sglang_dir, acc_len):
    """(SGLang version, environment) for the engine processes: the tree first on PYTHONPATH."""
    env = dict(os.environ, SGLANG_SIMULATE_ACC_LEN=str(acc_len), PYTHONUNBUFFERED="1")
    version = None
    if sglang_dir:
        from ...source import locate

        tree = locate(sglang_dir)
        version = str(tree.version)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree.root), str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH", "")]
        )
    return version, env


def kv_pool_tokens(max_bs: int, prompt_len: int, out_len: int) -> int:
    """The engines' KV pool (max_total_tokens), the same for every arm of a bench or profile:
    every request of the largest load at its full length, with a few slots each to spare (the
    speculative arms allocate ahead of their verified length), and a fixed margin."""
    return max_bs * (prompt_len + out_len + 16) + 4096


@contextlib.contextmanager
def _engines(
    arm_list,
    out: Path,
    env: dict,
    max_bs: int,
    max_total_tokens: int,
    log_level: str = "warning",
    port_base: int = PORT_BASE,
    tp: int = 1,
    target: str = DEFAULT_TARGET,
    arm_envs: dict | None = None,
):
    """Start one engine process per arm (in parallel), yield (procs, startup seconds), stop them.
    Engine i owns the ports from port_base + 100*i (its rendezvous port among them). An arm in
    `arm_envs` starts with that environment (its own SGLang tree) instead of `env`."""
    models = write_models(out / "models", target)
    procs = {}
    for i, arm in enumerate(arm_list):
        job = {
            "engine": engine_kwargs(
                arm,
                models,
                max_bs=max_bs,
                max_total_tokens=max_total_tokens,
                port=arm_port(port_base, i),
                log_level=log_level,
                tp=tp,
            ),
            "ready_path": str(out / f"{arm.name}.ready.json"),
            "stats_path": str(out / f"{arm.name}.stats.json") if arm.threshold is not None else None,
        }
        Path(job["ready_path"]).unlink(missing_ok=True)
        log = open(out / f"{arm.name}.log", "w")
        procs[arm.name] = subprocess.Popen(
            [sys.executable, "-m", "spectool.harness.bench.worker", json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=(arm_envs or {}).get(arm.name, env),
            text=True,
            start_new_session=True,
        )
    try:
        _wait_ready(procs, out, timeout=420)
        for name in procs:
            degraded = degraded_engine(name, (out / f"{name}.log").read_text(errors="replace"))
            if degraded:
                raise BadInputError(degraded)
        yield procs, {a: json.loads((out / f"{a}.ready.json").read_text())["startup_s"] for a in procs}
    finally:
        for p in procs.values():
            try:
                p.stdin.write(json.dumps({"quit": True}) + "\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass


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
    port_base: int = PORT_BASE,
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
    max_engines = engines_per_gpu(target, max_engines)
    arm_list = select_arms(threshold, max_bs, arm_names, variants, sglang_dir, arm_trees=arm_trees)
    if len(arm_list) > max_engines:
        raise BadInputError(
            f"--profile runs its arms side by side: {len(arm_list)} arms are more than --max-engines "
            f"{max_engines}; profile fewer at a time."
        )
    gpu_info("bench")
    out.mkdir(parents=True, exist_ok=True)
    version, env = _environment(sglang_dir, acc_len)
    _, arm_envs = _arm_environments(arm_trees, acc_len, sglang_dir)
    rows, raw = {}, {}
    with _engines(
        arm_list,
        out,
        env,
        max_bs,
        kv_pool_tokens(max_bs, prompt_len, out_len),
        port_base=port_base,
        tp=tp,
        target=target,
        arm_envs=arm_envs,
    ) as (procs, _):
        for i, C in enumerate(concurrencies):
            k = concurrencies[:i].count(C)  # how often this C was profiled before, on these engines
            tag = f"{C}" + (f"#{k + 1}" if k else "")
            for arm in arm_list:
                tdir = out / "traces" / f"{arm.name}-C{tag}"
                n = _profile_requests(C, load, steps, out_len)
                res = _command(
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
                traces = sorted(tdir.glob("*TP-0*.trace.json*")) or sorted(tdir.glob("*.trace.json*"))
                events = prof.load_events(traces[0]) if traces else []
                summary = prof.summarize(events, steps) if traces else {"error": "no trace written"}
                if events:  # the middle two steps, every event: the idle attribution can be re-read
                    cut = out / "excerpts" / prof.excerpt_name(arm.name, C, k)
                    cut.parent.mkdir(exist_ok=True)
                    cut.write_bytes(gzip.compress(json.dumps({"traceEvents": prof.excerpt(events, steps)}).encode()))
                summary["output_tok_s"] = res.get("output_tok_s")
                rows[(arm.name, C, k)] = summary
                raw[f"{arm.name}@{tag}"] = summary
                # Written after every trace: an engine that dies later leaves what was measured.
                (out / "profile.json").write_text(
                    json.dumps(
                        {
                            "sglang_version": version,
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


def _rotated(arm_list, rep):
    k = rep % len(arm_list)
    return arm_list[k:] + arm_list[:k]


# What to change when the engines do not fit the GPU together (each arm's engine holds a KV
# pool for every request of its batch capacity at full length: engine_batch): degraded_engine,
# engine_failure.
MEMORY_ADVICE = (
    "Free GPU memory: fewer arms at once (--arms, --max-engines), a smaller largest C or --max-batch, "
    "or shorter requests (--out-len), and run again."
)


def degraded_engine(arm: str, log: str) -> str | None:
    """An engine that started but not as the bench asked, so that its timings would not be
    comparable: the reason, or None. Both cases are SGLang or the fallback making do with
    too little GPU memory, quietly: the fallback serves eagerly when its CUDA graphs cannot
    be captured, and SGLang shrinks a KV pool that does not fit (on the H200, a third engine
    with a pool for 256 requests of 1152 tokens got 34 038 tokens and ran its waves at 30
    requests, retracting)."""
    for line in log.splitlines():
        if "spec-fallback: could not capture" in line:
            return (
                f"bench arm {arm} started without its fallback CUDA graphs, so its timings would not be "
                f"the fallback's: {line.split('spec-fallback: ', 1)[1][:300]} {MEMORY_ADVICE}"
            )
        if "speculative_adaptive disabled:" in line:
            return (
                f"bench arm {arm} asked for SGLang's adaptive steps, which its engine turned off: "
                f"{line.split('speculative_adaptive disabled:', 1)[1].strip()[:300]}"
            )
        shrunk = re.search(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)", line)
        if shrunk:
            return (
                f"bench arm {arm}'s engine got a KV pool of {int(shrunk[2]):,} tokens, not the {int(shrunk[1]):,} "
                "the bench sizes every arm's for (every request of the largest C at full length), so it would "
                f"run smaller batches than the other arms. {MEMORY_ADVICE}"
            )
    return None


def _wait_ready(procs, out, timeout):
    t0 = time.time()
    while True:
        missing = [a for a in procs if not (out / f"{a}.ready.json").exists()]
        if not missing:
            return
        for a in missing:
            if procs[a].poll() is not None:
                raise BadInputError(engine_failure(a, procs[a].returncode, "its start", out / f"{a}.log"))
        if time.time() - t0 > timeout:
            raise BadInputError(f"bench arms {missing} did not start within {timeout} s")
        time.sleep(0.1)  # a file's existence: cheap to ask often, and the first command waits on it


def engine_failure(arm: str, returncode: int, during: str, log: Path) -> str:
    """Why an arm's engine died, in one paragraph: the error its log ends with (the exit code
    alone, -9 or 1, says nothing), and for CUDA out-of-memory what to change: every arm's
    engine shares the GPU and holds a KV pool sized for its batch capacity's whole requests."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [ln.strip() for ln in lines if re.match(r"^\s*[\w.]*(Error|Exception)\b.*:", ln)]
    msg = f"bench arm {arm}'s engine exited with {returncode} during {during}"
    if errors:
        msg += f": {errors[-1][:400].rstrip('.')}"
    msg += f". Its log: {log}."
    if any("out of memory" in e.lower() for e in errors):
        msg += " The arms' engines share the GPU. " + MEMORY_ADVICE
    elif not errors:
        msg += " Its last lines:\n" + "\n".join(lines[-30:])
    return msg


def _command(proc, arm: str, out, cmd):
    rp = out / f"result-{time.time_ns()}.json"
    cmd["result_path"] = str(rp)
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    while not rp.exists():
        if proc.poll() is not None:
            during = cmd["kind"] + (f" at C={cmd['C']}" if "C" in cmd else "")
            raise BadInputError(engine_failure(arm, proc.returncode, during, out / f"{arm}.log"))
        time.sleep(0.05)
    res = json.loads(rp.read_text())
    rp.unlink()
    return res


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
    for arm in dict.fromkeys(c["arm"] for c in cells):
        labels.setdefault(arm, given.get(arm, arm))
    # Arms measured on another release than the report's (--arm-sglang-dir) name it, from their cells.
    releases = {c["arm"]: c["sglang"] for c in cells if c.get("sglang", version) != version}
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
            "Transition workload (alternating C=4 and C=192, closed loop):\n\n"
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
    for arm in dict.fromkeys(c["arm"] for c in cells):
        releases = {c.get("sglang", meta.get("sglang_version")) for c in cells if c["arm"] == arm}
        if len(releases) > 1:
            named = ", ".join(f"SGLang {v}" for v in sorted(releases, key=str))
            raise BadInputError(
                f"--merge: arm {arm}'s cells were measured on {named}; one arm's cells must come from one "
                "release. Merge the folders of one release, or give the arm another name in one of them."
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


def _transition_summary(trans, m):
    """Per transition (keyed by arm, or "ARM (FOLDER)" in a merge), each phase against its
    steady state."""
    out = {}
    for label, res in trans.items():
        arm = res.get("arm", label)
        rows = []
        for ph in res["phases"]:
            ref, runs, records = _reference(res, ph["C"])
            steady = ref or m.get((arm, ph["C"]), {}).get("median") or _interp(m, arm, ph["C"])
            rows.append(
                {
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
                }
            )
        out[label] = rows
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _interp(m, arm, C):
    pts = sorted((c, v["median"]) for (a, c), v in m.items() if a == arm)
    for (c0, v0), (c1, v1) in zip(pts, pts[1:]):
        if c0 <= C <= c1:
            return v0 + (v1 - v0) * (C - c0) / (c1 - c0)
    return None
