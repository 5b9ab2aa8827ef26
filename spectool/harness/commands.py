"""The `verify` and `bench` commands: loaded by spectool.cli only when one of them runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..cli import _console, _csv, _dir_opt, _json_opt, _numbers, exit_codes, guarded, recipes_opts, selection
from ..errors import EXIT_FAILED, EXIT_OK, BadInputError
from ..report import to_json
from .bench.engines import PORT_BASE
from .bench.models import DEFAULT_TARGET, TARGETS
from .bench.sweep import LOADS, PROFILE_LOADS


@click.command(
    epilog=exit_codes(
        "every engine configuration gave the no-speculation tokens exactly",
        "tokens differ from the baseline, a step count is not as expected, an engine failed, or the golden "
        "file does not fit",
        "also: no CUDA GPU, a tree the recipes are not applied to",
    )
)
@_dir_opt(required=False)
@recipes_opts()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="results/verify",
    help="Where results, logs and the JSON report go.",
)
@click.option(
    "--golden-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Recorded golden files, per SGLang version and GPU arch (default: ./golden, else the shipped ones).",
)
@click.option("--record", is_flag=True, help="Record the baseline tokens as the golden file.")
@click.option("--parallel", type=click.IntRange(min=1), default=4, help="Engines run at once on the GPU.")
@click.option(
    "--only", default="", help="Comma-separated engine configs; the baselines they are compared with run too."
)
@click.option(
    "--tp",
    "tp_size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Tensor parallelism of every engine, baselines included (needs that many GPUs).",
)
@click.option(
    "--model-cache", type=click.Path(file_okay=False), default=None, help="Where the trained golden model is kept."
)
@click.option(
    "--port-base",
    type=click.IntRange(1024, 65000),
    default=31000,
    show_default=True,
    help="First engine port (engine i takes PORT_BASE + 50*i, its rendezvous port inside that block); two "
    "verify runs at once need their own, below 32768 (where Linux hands out ephemeral ports).",
)
@_json_opt
@guarded
def verify(
    sglang_dir,
    select,
    recipes_dir,
    out_dir,
    golden_dir,
    record,
    parallel,
    only,
    tp_size,
    model_cache,
    port_base,
    as_json,
):
    """Golden GPU tests: the patched SGLang must give the no-speculation tokens exactly. A tree
    given by --sglang-dir must have the recipes applied (checked before any GPU work); without
    it, the installed sglang runs as it is."""
    from .verify.runner import print_report
    from .verify.runner import verify as run_verify

    ids, options = selection(select, recipes_dir)

    if golden_dir is None:
        here = Path("golden")
        golden_dir = here if here.is_dir() else Path(__file__).resolve().parents[2] / "golden"
    report = run_verify(
        sglang_dir,
        Path(out_dir),
        golden_root=Path(golden_dir),
        record=record,
        parallel=parallel,
        only=_csv(only) or None,
        tp_size=tp_size,
        model_cache=Path(model_cache) if model_cache else None,
        port_base=port_base,
        recipes=dict(recipes_dir=recipes_dir, select=ids, options=options),
        console=_console(),
    )
    if as_json:
        click.echo(to_json(report))
    else:
        print_report(report, _console())
    sys.exit(EXIT_OK if report["ok"] else EXIT_FAILED)


def _tiers_text(res: dict) -> str:
    """The suggested tiers of `res` (analyze.suggest_tiers or suggest_tiers_across) as the
    flags that serve them, the bench arm that measures them and SGLang's own adaptive config."""
    from .bench import analyze

    text = f"suggested: {res['flags']} ({res['why']})" if res["flags"] else f"suggested: {res['why']}"
    if res["variant"]:
        threshold = f"--threshold {res['threshold']} " if res["threshold"] is not None else ""
        text += f"\nmeasure them: spectool bench {threshold}--variant '{res['variant']}' (and the same options)"
    if res["upstream_adaptive_config"]:
        up = analyze.upstream_variant(res["tiers"], res["boundaries"], "FILE")
        text += (
            "\non SGLang's own adaptive steps (0.5.14 and later, no hysteresis): "
            f"--speculative-num-steps {res['tiers'][0]} --speculative-adaptive "
            "--speculative-adaptive-config FILE, FILE holding "
            f"{json.dumps(res['upstream_adaptive_config'], separators=(',', ':'))}; measure it "
            f"beside them: --variant '{up}' --arm-sglang-dir {up.split('=', 1)[0]}=DIR (DIR: that SGLang)"
        )
        eager = res["upstream_eager_draft_extend"]
        if eager:
            text += (
                f"\non 0.5.17 upstream's draft extend at {' and '.join(map(analyze.steps_label, eager))} runs "
                "without a CUDA graph (captured at the start-up width): that arm measures the release, not the "
                "schedule alone"
            )
    return text


def _disputes_text(res: dict) -> str:
    """What the runs pooled in the folder say of the suggested tiers (analyze.tier_disputes)."""
    from .bench import analyze

    if res["runs"] < 2:
        return (
            "\none run: its repetitions share their engines, and a configuration's median moves from engine to "
            "engine; merge two or three runs (--fresh-engines, or --merge) to see whether they agree"
        )
    rows = [r["C"] for r in res["rows"]]
    disputed = {d["C"] for d in res["disputed"]}
    alone = [C for C in rows if C not in res["compared_at"] and C not in disputed]
    text = ""
    if res["disputed"]:
        each = "; ".join(
            f"C={d['C']}: {analyze.steps_label(d['steps'])} led the tier's {analyze.steps_label(d['tier'])} "
            f"in {', '.join(d['led_in'])} ({len(d['led_in'])} of {d['compared']} runs that measured both)"
            for d in res["disputed"]
        )
        text += f"\nthe runs pooled here disagree with the tiers at {each}: measure more runs there before serving them"
    agree = [C for C in res["compared_at"] if C not in disputed]
    if agree:
        text += f"\nthe runs pooled here order the configurations as the tiers do at C={','.join(map(str, agree))}"
    if alone:
        text += f"\nat C={','.join(map(str, alone))} fewer than two runs measured the tier's configuration and another"
    return text


def _named_concurrencies_measured(option: str, folder: Path, m: dict, cs: list[int], by_steps: dict) -> None:
    """A one-paragraph error when --concurrency names a C at which `folder` (its medians `m`)
    lacks one of the configurations it holds (`by_steps`: draft steps -> arm); a suggestion
    that silently skipped it would answer a question the user did not ask."""
    held = [a for a in by_steps.values() if any(arm == a for arm, _ in m)]
    lacking = {C: [a for a in held if (a, C) not in m] for C in cs}
    lacking = {C: arms for C, arms in lacking.items() if arms}
    if lacking:
        every = sorted(C for C in {C for _, C in m} if held and all((a, C) in m for a in held))
        raise BadInputError(
            f"{option}: --concurrency names C that {folder} did not measure for every configuration: "
            + "; ".join(f"C={C} lacks {', '.join(arms)}" for C, arms in lacking.items())
            + f". It measured all of them at C={','.join(map(str, every)) or 'none'}: name C among those, "
            "or measure the missing cells there (spectool bench --out with the same folder resumes)."
        )


def _tiers_across_text(res: dict, medians: dict, measured: list[int], by_steps: dict, out_dir) -> str:
    """The one schedule of analyze.suggest_tiers_across as text, with what it left out; or a
    one-paragraph error when the acceptances share fewer than two configurations or no C."""
    from .bench import analyze

    accs = ", ".join(f"{a:g}" for a in res["acceptances"])
    held = {s: a for s, a in by_steps.items() if any(arm == a for m in medians.values() for arm, _ in m)}
    partial = {s: a for s, a in held.items() if s not in res["arms"]}
    if len(res["arms"]) < 2:
        raise BadInputError(
            f"--suggest-tiers: one schedule for every acceptance ({accs}) needs at least two configurations "
            f"measured at each of them; {out_dir} holds {', '.join(res['arms'].values()) or 'none'} at every "
            f"acceptance, and {', '.join(partial.values()) or 'none'} at some only. Measure the missing "
            "configurations at the other acceptances (spectool bench with the same --out and --acc-len resumes)."
        )
    if not res["rows"]:
        each = " and ".join(
            f"at acceptance {a:g} at C="
            + (",".join(str(C) for C in measured if all((arm, C) in m for arm in res["arms"].values())) or "none")
            for a, m in sorted(medians.items())
        )
        raise BadInputError(
            f"--suggest-tiers: one schedule for every acceptance ({accs}) needs a C at which every configuration "
            f"({', '.join(res['arms'].values())}) was measured at each of them, and none was: all of them were "
            f"measured {each}. Measure the same --concurrency at every acceptance."
        )
    text = f"every acceptance ({accs}), one schedule:\n{analyze.tiers_across_markdown(res)}" + _tiers_text(res)
    worst, C, acc = res["worst"]
    text += f"\nits worst: {worst:.3f} of the fastest fixed configuration, at C={C} and acceptance {acc:g}"
    skipped = [C for C in measured if C not in {r["C"] for r in res["rows"]}]
    left = [f"{', '.join(partial.values())} (not measured at every acceptance)"] if partial else []
    if skipped:
        left.append(f"C={','.join(map(str, skipped))} (not every configuration measured there at every acceptance)")
    return text + (f"\nleft out: {'; '.join(left)}" if left else "")


def _suggest(folders: dict, tiers: bool, tier_arms: str, cs: list[int] | None, out_dir, as_json: bool) -> None:
    """--suggest-tiers (`tiers`) or --suggest-threshold: each acceptance's suggestion from the
    cells its folder (`folders`: acceptance -> folder) recorded, at the named C (`cs`; None:
    every C it measured), and with several acceptances the one schedule for all of them."""
    from .bench import analyze

    option = "--suggest-tiers" if tiers else "--suggest-threshold"
    by_steps = _tier_arms(tier_arms) if tiers else {1: "A1", 0: "A0"}
    medians, texts, docs = {}, [], {}  # per acceptance: its medians, its text, its JSON
    for a, folder in folders.items():
        if not (folder / "cells.jsonl").exists():
            raise BadInputError(
                f"{option}: {folder} has no cells.jsonl; measure there first "
                "(spectool bench --out with the same folder)."
            )
        cells = analyze.read_cells(folder / "cells.jsonl")
        m = analyze.medians(cells, a)
        if not m:
            present = sorted({c.get("acc_len") for c in cells} - {None})
            raise BadInputError(
                f"{option}: {folder} has no cells at acceptance {a:g}; it holds "
                f"{', '.join(f'{x:g}' for x in present) or 'none'} (pass --acc-len)."
            )
        if cs is not None:
            _named_concurrencies_measured(option, folder, m, cs, by_steps)
        measured = cs or sorted({C for _, C in m})
        medians[a] = m
        if tiers:
            res = analyze.suggest_tiers(m, measured, by_steps)
            if len(res["arms"]) < 2:
                raise BadInputError(
                    f"--suggest-tiers: {folder} holds {len(res['arms'])} of the configurations "
                    f"{tier_arms}; measure at least two, e.g. --arms A0,A1 --variant "
                    "'S1=A1:speculative_num_steps=1;speculative_num_draft_tokens=2'."
                )
            res.update(analyze.tier_disputes(cells, m, res["rows"], res["arms"], a))
            text = f"acceptance {a:g}:\n{analyze.tiers_markdown(res)}" + _tiers_text(res)
            if res["against_the_rule"]:
                text += (
                    f"\nat C={','.join(map(str, res['against_the_rule']))} a draft is the fastest after plain "
                    "decoding took over: the tiers keep plain decoding, the fallback's, the last tier (measure "
                    "again there)"
                )
            for back in res["longer_again"]:
                text += (
                    f"\nat C={back['C']} a longer draft comes back: {analyze.steps_label(back['steps'])}, "
                    f"{back['lead']:.1%} ahead of {analyze.steps_label(back['after'])} there (served; measure "
                    "again there if that is within the run-to-run spread)"
                )
            text += _disputes_text(res)
        else:
            res = analyze.suggest_threshold(m, measured)
            if res["threshold"] is None:
                raise BadInputError(f"--suggest-threshold: {folder}: {res['why']}.")
            text = f"acceptance {a:g}: suggested threshold {res['threshold']} ({res['why']})"
        texts.append(text)
        docs[f"{a:g}"] = res
    if tiers and len(medians) > 1:
        measured = cs or sorted({C for m in medians.values() for _, C in m})
        res = analyze.suggest_tiers_across(medians, measured, by_steps)
        texts.append(_tiers_across_text(res, medians, measured, by_steps, out_dir))
        docs["across"] = res
    # One JSON document, as a measuring run's: several acceptances key theirs by acceptance.
    click.echo(to_json(next(iter(docs.values())) if len(docs) == 1 else docs) if as_json else "\n".join(texts))


def _tier_arms(text: str) -> dict[int, str]:
    """--tier-arms STEPS=ARM,...: draft steps -> arm, or a one-paragraph error."""
    out = {}
    for item in _csv(text):
        steps, eq, arm = item.partition("=")
        if not (eq and steps.strip().isdigit() and arm.strip()):
            raise BadInputError(
                f"--tier-arms {text!r}: {item!r} is not STEPS=ARM (draft steps, a whole number of 0 or more, "
                "then the arm measured with them), as in 3=A1,1=S1,0=A0."
            )
        if int(steps) in out:
            raise BadInputError(f"--tier-arms {text!r}: {int(steps)} steps are named twice.")
        out[int(steps)] = arm.strip()
    return out


def _arm_trees(items) -> dict[str, str]:
    """--arm-sglang-dir NAME=DIR (repeatable): arm -> the SGLang tree its engine runs (the run
    locates each tree as it does --sglang-dir's, before any GPU work)."""
    out = {}
    for item in items:
        name, eq, tree = item.partition("=")
        name, tree = name.strip(), tree.strip()
        if not (eq and name and tree):
            raise BadInputError(
                f"--arm-sglang-dir {item!r}: expected NAME=DIR, an arm of the run and the SGLang tree its engine "
                "runs, as in UP=/tmp/site-0.5.17."
            )
        if name in out:
            raise BadInputError(f"--arm-sglang-dir: arm {name} is given twice ({out[name]} and {tree}).")
        if not Path(tree).is_dir():
            raise BadInputError(f"--arm-sglang-dir {item!r}: {tree} is not a directory.")
        out[name] = tree
    return out


@click.command(
    epilog=exit_codes(
        "measured (or merged, profiled, a threshold suggested); the table is printed",
        "interrupted (Ctrl-C); a rerun with the same --out resumes from its cells.jsonl",
        "also: no CUDA GPU, an engine that failed to start",
    )
)
@_dir_opt(required=False)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="results/bench",
    help="Results folder (resumes from cells.jsonl).",
)
@click.option("--threshold", type=click.IntRange(min=0), default=12, help="T for arm A2 (see --suggest-threshold).")
@click.option("--concurrency", default="1,2,4,8,16,32,64,128,256", help="Comma-separated C values.")
@click.option(
    "--reps",
    type=click.IntRange(min=0),
    default=3,
    help="Repetitions per arm and C (arm order rotated); 0 runs only the transition workload.",
)
@click.option(
    "--acc-len",
    default="3.0",
    help="SGLANG_SIMULATE_ACC_LEN for the spec arms; several (e.g. 2.0,3.0) sweep each into OUT/acc-X.",
)
@click.option("--prompt-len", type=click.IntRange(min=1), default=128)
@click.option(
    "--out-len", type=click.IntRange(min=2), default=128, help="Output tokens per request (2 or more: TPOT needs two)."
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0),
    default=540,
    help="Stop measuring after this many seconds (resume later). Engines that would not be ready within it, by the start-up the folder recorded for them, do not start.",
)
@click.option(
    "--no-transition",
    is_flag=True,
    help="Skip the transition workload (alternating C=4 and a load above the engine's threshold and tier boundaries, C=192 or twice the highest, on A2 and its variants).",
)
@click.option(
    "--transition-arms",
    default="",
    help="Arms whose engines (with their variants) run the transition workload (default A2); A1 or A0 beside A2 is a "
    "control that never switches, so what a phase loses to the engine's own state shows there too. Every engine runs "
    "the same schedule.",
)
@click.option(
    "--transition-rounds",
    type=click.IntRange(min=1),
    default=1,
    help="Run the transition schedule this many times on each engine, standalone references between "
    "rounds, and read each phase as the median of its rounds (one phase of one round moves by "
    "several points between identical engines).",
)
@click.option(
    "--arms",
    "arm_names",
    default="A0,A1,A2,A3,A4",
    help="Comma-separated arms (A0 no spec, A1 EAGLE-3, A2 threshold T, A3 threshold above any batch, A4 T=0).",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="NAME=BASE:FIELD=VALUE[;FIELD=VALUE]",
    help="An extra arm: BASE with server args of its own (ServerArgs field names, values as on the command "
    "line), e.g. A4M=A4:speculative_disable_kv_only_margin=8 (a variant of A2 also runs the transition "
    "workload, as a same-run control). Repeatable.",
)
@click.option(
    "--arm-sglang-dir",
    "arm_sglang_dirs",
    multiple=True,
    metavar="NAME=DIR",
    help="Run arm NAME's engine on the SGLang tree at DIR instead of --sglang-dir: an arm on another release "
    "(as it is, or with the recipes applied), its cells interleaved with the others' in the same run, e.g. "
    "UP=/tmp/site-0.5.17 with --variant 'UP=A1:speculative_adaptive=true'. Its --variant fields are those "
    "of that tree's ServerArgs. Repeatable.",
)
@click.option(
    "--max-engines",
    type=click.IntRange(min=1),
    default=None,
    help="Engines on the GPU at once; more arms run in waves. Default: as many of the --target's as fit "
    f"one H200 ({', '.join(f'{t.name} {t.max_engines}' for t in TARGETS.values())}; an 8B-shaped engine "
    "takes ~28 GiB, a Qwen3-30B-A3B-shaped one ~70 GiB).",
)
@click.option(
    "--target",
    type=click.Choice(list(TARGETS)),
    default=DEFAULT_TARGET,
    show_default=True,
    help="The target shape (dummy weights) with its EAGLE-3 head: the 8B Llama, or the MoE of "
    "Qwen3-30B-A3B (48 layers, 128 experts, 8 per token). A folder holds cells of one target only.",
)
@click.option(
    "--suggest-threshold",
    "suggest",
    is_flag=True,
    help="Only print T from the recorded results in --out (every C measured there, or --concurrency), and "
    "which C to measure between the last win and the first loss to place it more finely.",
)
@click.option(
    "--suggest-tiers",
    is_flag=True,
    help="Only print the draft length per batch size (--speculative-num-steps-tiers and its boundaries) from "
    "the recorded fixed configurations in --out (--tier-arms), the tier the rule picks at each C, and the same "
    "tiers as SGLang's own --speculative-adaptive-config (0.5.14 and later). With several --acc-len (a folder "
    "acc-N each), also the one schedule whose worst ratio to the fastest fixed configuration over all of them "
    "is highest.",
)
@click.option(
    "--tier-arms",
    default="3=A1,2=S2,1=S1,0=A0",
    show_default=True,
    metavar="STEPS=ARM,...",
    help="For --suggest-tiers: the arm measured at each number of draft steps (0: no speculation); S1 and S2 "
    "are --variant arms of A1 at 1 and 2 steps. Arms the folder lacks are left out.",
)
@click.option(
    "--profile",
    "profile_steps",
    type=click.IntRange(min=0),
    default=0,
    help="Instead of the sweep: profile this many steady-state decode steps per arm and C (SGLang's profiler), "
    "and report ms/step against GPU-busy ms/step (profile.md).",
)
@click.option(
    "--load",
    type=click.Choice(LOADS),
    default="lockstep",
    show_default=True,
    help="lockstep: C clients start together (waves of C); staggered: an unmeasured ramp spreads their "
    "starts over one request lifetime (docs/bench.md says why lockstep is the default).",
)
@click.option(
    "--waves",
    type=click.FloatRange(min=0.5),
    default=None,
    help="Measured requests per cell in waves of C (at least 16 requests): longer cells, steadier "
    "medians. Default: 2 up to C=64, 1.5 above (3 per client with --load staggered).",
)
@click.option(
    "--profile-load",
    type=click.Choice(PROFILE_LOADS),
    default="wave",
    show_default=True,
    help="wave: decode steps of one wave of requests of 1024 tokens or as many as the steps need; lockstep: the "
    "sweep's own waves at "
    "--out-len, prefills and wave ends included (profile enough steps for whole waves, e.g. 260 at "
    "128); staggered: the sweep's steady load at --out-len, the prefills of arriving requests included.",
)
@click.option(
    "--merge",
    "merge_from",
    multiple=True,
    type=click.Path(file_okay=False, exists=True),
    help="Instead of measuring (no GPU): one table, JSON and plot in --out from these result folders, e.g. "
    "a sweep split over two GPUs or calls. Repeatable.",
)
@click.option(
    "--engine-log-level",
    type=click.Choice(["warning", "info", "debug"]),
    default="warning",
    show_default=True,
    help="SGLang's log level in each engine's ARM.log: info logs every prefill batch (its requests, the running "
    "and queued ones) and every 40th decode step, to see how a wave reaches the scheduler.",
)
@click.option(
    "--port-base",
    type=click.IntRange(1024, 65000),
    default=PORT_BASE,
    show_default=True,
    help="First engine port (engine i takes PORT_BASE + 100*i, its rendezvous port inside that block); two "
    "benches at once (one per GPU) need their own, e.g. 22000.",
)
@click.option(
    "--fresh-engines",
    is_flag=True,
    help="Start every arm's engine anew for each repetition (1-4 minutes per start on the H200), "
    "so one run averages over engine instances; the table then lists each repetition's own ratios.",
)
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Tensor parallelism: each engine shards over this many GPUs (the first TP visible ones, "
    "shared by all arms); a folder holds cells of one TP size only.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=None,
    help="The engines' batch capacity (CUDA graph max batch, running requests, KV pool); default the "
    "largest --concurrency. Give the full sweep's (256) to measure or profile some of its C on the "
    "same engines, so the runs pool with it.",
)
@_json_opt
@guarded
def bench(
    sglang_dir,
    out_dir,
    threshold,
    concurrency,
    reps,
    acc_len,
    prompt_len,
    out_len,
    budget,
    no_transition,
    transition_arms,
    transition_rounds,
    arm_names,
    variants,
    arm_sglang_dirs,
    max_engines,
    suggest,
    suggest_tiers,
    tier_arms,
    load,
    waves,
    profile_steps,
    profile_load,
    merge_from,
    engine_log_level,
    port_base,
    fresh_engines,
    tp,
    max_batch,
    target,
    as_json,
):
    """Throughput sweep (GPU): no-spec, EAGLE-3, and the patched fallback, per concurrency."""
    from .bench.results import merge
    from .bench.sweep import run

    cs = _numbers("--concurrency", concurrency, int, 1, "request counts of 1 or more, such as 64 or 1,4,16,64,256")
    accs = _numbers("--acc-len", acc_len, float, 1.0, "numbers such as 3.0 or 2.0,3.0 (1.0 or more)")
    arms_measured, transition_named = _csv(arm_names), tuple(_csv(transition_arms)) or None
    arm_trees = _arm_trees(arm_sglang_dirs)
    folders = {a: Path(out_dir) if len(accs) == 1 else Path(out_dir) / f"acc-{a:g}" for a in accs}
    if suggest or suggest_tiers:
        # Every C the folder measured (a merge with finer points included), unless named.
        named = click.get_current_context().get_parameter_source("concurrency") != click.core.ParameterSource.DEFAULT
        _suggest(folders, suggest_tiers, tier_arms, cs if named else None, out_dir, as_json)
        return
    if merge_from:
        report = merge(Path(out_dir), [Path(m) for m in merge_from], accs[0])
        click.echo(to_json(report) if as_json else (Path(out_dir) / "bench-table.md").read_text())
        return
    if profile_steps:
        from .bench.sweep import profile

        rows = profile(
            Path(out_dir),
            threshold=threshold,
            concurrencies=cs,
            arm_names=arms_measured,
            variants=variants,
            steps=profile_steps,
            prompt_len=prompt_len,
            acc_len=accs[0],
            sglang_dir=sglang_dir,
            max_engines=max_engines,
            load=profile_load,
            port_base=port_base,
            tp=tp,
            max_batch=max_batch,
            target=target,
            arm_trees=arm_trees,
            console=_console(),
            **({"out_len": out_len} if profile_load != "wave" else {}),
        )
        click.echo(to_json(rows) if as_json else (Path(out_dir) / "profile.md").read_text())
        return
    reports = {}
    for a, folder in folders.items():
        reports[a] = run(
            folder,
            threshold=threshold,
            concurrencies=cs,
            reps=reps,
            prompt_len=prompt_len,
            out_len=out_len,
            acc_len=a,
            transition=not no_transition,
            budget_s=budget,
            sglang_dir=sglang_dir,
            arm_names=arms_measured,
            variants=variants,
            max_engines=max_engines,
            load=load,
            waves=waves,
            transition_arms=transition_named,
            transition_rounds=transition_rounds,
            engine_log_level=engine_log_level,
            port_base=port_base,
            fresh_engines=fresh_engines,
            tp=tp,
            max_batch=max_batch,
            target=target,
            arm_trees=arm_trees,
            console=_console(),
        )
    if as_json:
        click.echo(to_json(reports[accs[0]] if len(accs) == 1 else {f"{a:g}": r for a, r in reports.items()}))
    else:
        for a, folder in folders.items():
            click.echo(f"acceptance {a:g} ({folder}):")
            click.echo((folder / "bench-table.md").read_text())
            click.echo(f"suggested threshold: {reports[a]['suggested_threshold']}")
