"""Command line: parsing and printing only; the work is in spectool.api and friends."""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console

from . import __version__, api
from .bench.arms import MAX_ENGINES
from .bench.sweep import LOADS, PORT_BASE, PROFILE_LOADS
from .errors import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, BadInputError, SpectoolError
from .report import print_outcome, to_json  # noqa: F401


def _csv(text: str) -> list[str]:
    """A comma-separated option's items (empty items dropped)."""
    return [x for x in text.split(",") if x]


def _numbers(option: str, text: str, kind, least, example: str) -> list:
    """A comma-separated option of numbers of `kind`, each at least `least`, or a one-paragraph
    error (exit 2) naming the option and an example."""
    try:
        values = [kind(x) for x in _csv(text)]
    except ValueError:
        values = []
    if not values or min(values) < least:
        raise BadInputError(f"{option} {text!r}: expected {example}.")
    return values


def _console() -> Console:
    import shutil

    width = shutil.get_terminal_size((160, 40)).columns if sys.stdout.isatty() else 160
    return Console(stderr=False, highlight=False, width=width)


def _fail(exc: SpectoolError, as_json: bool) -> None:
    if as_json:
        click.echo(to_json({"ok": False, "error": exc.to_json()}))
    else:
        click.echo(f"spectool: error: {exc.message}", err=True)
        for c in getattr(exc, "candidates", []) or []:
            click.echo(f"    candidate: {c}", err=True)
    sys.exit(exc.exit_code)


def guarded(fn):
    """Every command: user errors become one paragraph and an exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except SpectoolError as exc:
            _fail(exc, as_json)
        except KeyboardInterrupt:
            click.echo("spectool: interrupted", err=True)
            sys.exit(EXIT_FAILED)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as exc:  # a bug in spectool: say so, keep the details short
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            msg = (f"internal error {type(exc).__name__}: {exc} (at {Path(tb.filename).name}:{tb.lineno}). "
                   "This is a bug in spectool; nothing was written unless a journal says so. Please report it.")
            if as_json:
                click.echo(to_json({"ok": False, "error": {"kind": "internal", "message": msg}}))
            else:
                click.echo(f"spectool: {msg}", err=True)
            sys.exit(EXIT_INTERNAL)

    return wrapper


def _recipe_opts(fn):
    fn = click.option("--recipes", "select", default="", help="Comma-separated recipe ids (default: the pinned set).")(fn)
    fn = click.option("--recipes-dir", type=click.Path(file_okay=False), default=None, help="Where recipes live (default: the shipped ones).")(fn)
    fn = click.option("--sglang-version", "version", default=None, help="Override the detected SGLang version.")(fn)
    return fn


def _json_opt(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON report (schema_version 1).")(fn)


def _dir_opt(required=True):
    return click.option("--sglang-dir", type=click.Path(), required=required,
                        help="A git checkout of SGLang, a folder holding the sglang package, or the package.")


def _selection(select: str, recipes_dir=None):
    """--recipes wins; else the pin file's set for the shipped recipes; else all in --recipes-dir."""
    from .pin import load_pin

    if select:
        return [s.strip() for s in select.split(",") if s.strip()], {}
    if recipes_dir is not None:
        return None, {}
    pin = load_pin(required=False)
    return (pin.recipes if pin else None), (pin.options if pin else {})


def _emit(outcome, as_json: bool, show_diff=False, ok=None) -> None:
    ok = outcome.ok if ok is None else ok
    if as_json:
        payload = outcome.to_json()
        if show_diff and outcome.plan is not None:
            payload["diff"] = outcome.plan.diff()
        click.echo(to_json(payload))
    else:
        print_outcome(outcome, _console(), show_diff=show_diff)
    sys.exit(EXIT_OK if ok else EXIT_FAILED)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spectool")
def main():
    """Declarative, verified patches for SGLang: apply, check, status, revert, fetch, verify, bench."""


@main.command()
@_dir_opt(required=False)
@_recipe_opts
@click.option("--dry-run", is_flag=True, help="Print the unified diff, change nothing (exit 1 if anything would change).")
@click.option("--force", is_flag=True, help="Apply over files changed since the last apply.")
@_json_opt
@guarded
def apply(sglang_dir, select, recipes_dir, version, dry_run, force, as_json):
    """Apply the recipes to an SGLang tree (default: fetch the pinned release into ./build)."""
    if sglang_dir is None:
        from .fetch import prepare_pinned_tree

        sglang_dir = prepare_pinned_tree(progress=not as_json)
    ids, options = _selection(select, recipes_dir)
    out = api.apply(sglang_dir, recipes_dir=recipes_dir, select=ids, options=options, version=version,
                    dry_run=dry_run, force=force)
    ok = out.ok and not (dry_run and out.plan is not None and out.plan.changed)
    _emit(out, as_json, show_diff=dry_run, ok=ok)


@main.command()
@_dir_opt()
@_recipe_opts
@click.option("--against", default=None, help="Fetch this SGLang release and check the recipes against it instead.")
@_json_opt
@guarded
def check(sglang_dir, select, recipes_dir, version, against, as_json):
    """Would every recipe apply, or is it applied and intact? Exit 0 or 1."""
    ids, options = _selection(select, recipes_dir)
    if against:
        from .fetch import fetch

        sglang_dir = fetch(against, progress=not as_json)
    out = api.check(sglang_dir, recipes_dir=recipes_dir, select=ids, options=options, version=version)
    _emit(out, as_json)


@main.command()
@_dir_opt()
@click.option("--sglang-version", "version", default=None)
@_json_opt
@guarded
def status(sglang_dir, version, as_json):
    """What is applied (from spectool.lock), with hash checks of every patched file."""
    _emit(api.status(sglang_dir, version=version), as_json)


@main.command()
@_dir_opt()
@click.option("--sglang-version", "version", default=None)
@click.option("--force", is_flag=True, help="Revert even files changed since the apply.")
@_json_opt
@guarded
def revert(sglang_dir, version, force, as_json):
    """Restore every patched file byte for byte."""
    out = api.revert(sglang_dir, version=version, force=force)
    _emit(out, as_json)


def _upgrade(to, recipes_dir, as_json, from_version=None) -> int:
    """Plan every recipe against release `to` (fetched, nothing written); 1 if anything needs
    work. Recipes with no variant for `to` are also tried with the variant of `from_version`
    (default: the pinned release), which shows the real drift: missing anchors, candidates."""
    from .fetch import fetch as do_fetch
    from .pin import load_pin

    tree_dir = do_fetch(to, progress=not as_json)
    out = api.check(tree_dir, recipes_dir=recipes_dir)
    needs_work = [r for r in out.plan.results if r.status not in ("would-apply", "already-applied", "upstreamed")]
    retire = [r.id for r in out.plan.results if r.status == "upstreamed"]
    if from_version is None:
        pin = load_pin(required=False)
        from_version = pin.version if pin else None
    uncovered = [r.id for r in needs_work if r.status in ("unsupported", "blocked")]
    current = None
    if uncovered and from_version and from_version != to:
        current = api.check(tree_dir, recipes_dir=recipes_dir, select=uncovered, version=from_version)
    if as_json:
        payload = out.to_json()
        payload.update(command="upgrade", to=to, needs_work=[r.id for r in needs_work], retire=retire)
        if current is not None:
            payload["current_variants_on_new_release"] = [r.to_json() for r in current.plan.results]
        click.echo(to_json(payload))
    else:
        console = _console()
        print_outcome(out, console)
        if current is not None:
            console.print(f"\nThe variants you run today (SGLang {from_version}) against SGLang {to}:")
            print_outcome(current, console)
        for rid in retire:
            console.print(f"retire: {rid} is upstream in SGLang {to}; drop it from your pin's recipe set when you upgrade.")
        console.print(f"upgrade to SGLang {to}: " + ("[green]ready[/]" if not needs_work else
                      f"[red]{len(needs_work)} recipe(s) need work[/]: " + ", ".join(f"{r.id} ({r.status})" for r in needs_work)))
    return EXIT_FAILED if needs_work else EXIT_OK


@main.command()
@click.option("--to", "to", required=True, help="The SGLang release to upgrade to.")
@click.option("--from", "from_version", default=None, help="The release you run today (default: the pin).")
@click.option("--recipes-dir", type=click.Path(file_okay=False), default=None)
@_json_opt
@guarded
def upgrade(to, from_version, recipes_dir, as_json):
    """The upgrade gate: would the recipes apply to release TO? Drift, candidates, what to retire."""
    sys.exit(_upgrade(to, recipes_dir, as_json, from_version))


@main.command()
@click.argument("files", nargs=-1, type=click.Path())
@click.option("--recipes-dir", type=click.Path(file_okay=False), default=None)
@guarded
def gate(files, recipes_dir):
    """pre-commit entry: read the SGLang pin from the changed files (spectool.toml or a
    requirements file with sglang==X) and run the upgrade gate against it."""
    from .pin import pinned_version_in

    versions = sorted({v for f in files for v in [pinned_version_in(Path(f))] if v})
    if not versions:
        click.echo("spectool gate: no SGLang pin in the changed files; nothing to check.")
        sys.exit(EXIT_OK)
    rc = max(_upgrade(v, recipes_dir, False) for v in versions)
    sys.exit(rc)


@main.command()
@click.argument("version", required=False)
@click.option("--dest", type=click.Path(file_okay=False), default=None, help="Copy the unpacked release here (default: print the cache path).")
@_json_opt
@guarded
def fetch(version, dest, as_json):
    """Download an SGLang release (no dependencies), check its sha256, unpack it."""
    from .fetch import fetch as do_fetch

    path = do_fetch(version, dest=dest, progress=not as_json)
    if as_json:
        click.echo(to_json({"ok": True, "command": "fetch", "path": str(path)}))
    else:
        click.echo(str(path))


@main.command()
@_dir_opt(required=False)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="results/verify", help="Where results, logs and the JSON report go.")
@click.option("--golden-dir", type=click.Path(file_okay=False), default=None, help="Recorded golden files, per SGLang version and GPU arch (default: ./golden, else the shipped ones).")
@click.option("--record", is_flag=True, help="Record the baseline tokens as the golden file.")
@click.option("--parallel", type=click.IntRange(min=1), default=4, help="Engines run at once on the GPU.")
@click.option("--only", default="", help="Comma-separated engine configs (baselines always run).")
@click.option("--tp", "tp_size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor parallelism of every engine, baselines included (needs that many GPUs).")
@click.option("--model-cache", type=click.Path(file_okay=False), default=None, help="Where the trained golden model is kept.")
@click.option("--port-base", type=click.IntRange(1024, 65000), default=31000, show_default=True,
              help="First engine port (engine i takes PORT_BASE + 50*i, its rendezvous port inside that block); two "
                   "verify runs at once need their own, below 32768 (where Linux hands out ephemeral ports).")
@_json_opt
@guarded
def verify(sglang_dir, out_dir, golden_dir, record, parallel, only, tp_size, model_cache, port_base, as_json):
    """Golden GPU tests: the patched SGLang must give the no-speculation tokens exactly."""
    from .verify.runner import print_report, verify as run_verify

    if golden_dir is None:
        here = Path("golden")
        golden_dir = here if here.is_dir() else Path(__file__).resolve().parent.parent / "golden"
    report = run_verify(sglang_dir, Path(out_dir), golden_root=Path(golden_dir), record=record, parallel=parallel,
                        only=_csv(only) or None, tp_size=tp_size,
                        model_cache=Path(model_cache) if model_cache else None, port_base=port_base,
                        console=_console())
    if as_json:
        click.echo(to_json(report))
    else:
        print_report(report, _console())
    sys.exit(EXIT_OK if report["ok"] else EXIT_FAILED)


@main.command()
@_dir_opt(required=False)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="results/bench", help="Results folder (resumes from cells.jsonl).")
@click.option("--threshold", type=click.IntRange(min=0), default=12, help="T for arm A2 (see --suggest-threshold).")
@click.option("--concurrency", default="1,2,4,8,16,32,64,128,256", help="Comma-separated C values.")
@click.option("--reps", type=click.IntRange(min=0), default=3,
              help="Repetitions per arm and C (arm order rotated); 0 runs only the transition workload.")
@click.option("--acc-len", default="3.0",
              help="SGLANG_SIMULATE_ACC_LEN for the spec arms; several (e.g. 2.0,3.0) sweep each into OUT/acc-X.")
@click.option("--prompt-len", type=click.IntRange(min=1), default=128)
@click.option("--out-len", type=click.IntRange(min=2), default=128, help="Output tokens per request (2 or more: TPOT needs two).")
@click.option("--budget", type=click.FloatRange(min=0), default=540, help="Stop measuring after this many seconds (resume later).")
@click.option("--no-transition", is_flag=True,
              help="Skip the transition workload (alternating C=4 and C=192 on A2 and its variants).")
@click.option("--transition-arms", default="",
              help="Arms whose engines (with their variants) run the transition workload (default A2); A1 or A0 beside A2 is a "
                   "control that never switches, so what a phase loses to the engine's own state shows there too.")
@click.option("--arms", "arm_names", default="A0,A1,A2,A3,A4",
              help="Comma-separated arms (A0 no spec, A1 EAGLE-3, A2 threshold T, A3 threshold above any batch, A4 T=0).")
@click.option("--variant", "variants", multiple=True, metavar="NAME=BASE:VAR=VALUE[;VAR=VALUE]",
              help="An extra arm: BASE with environment for its engine, e.g. A4L=A4:SPECTOOL_FALLBACK_EARLY_PLAN=0 "
                   "(a variant of A2 also runs the transition workload, as a same-run control). Repeatable.")
@click.option("--max-engines", type=click.IntRange(min=1), default=MAX_ENGINES, show_default=True,
              help="Engines on the GPU at once; more arms run in waves (an 8B-shaped engine takes ~28 GiB).")
@click.option("--suggest-threshold", "suggest", is_flag=True,
              help="Only print T from the recorded results in --out (every C measured there, or --concurrency), and "
                   "which C to measure between the last win and the first loss to place it more finely.")
@click.option("--profile", "profile_steps", type=click.IntRange(min=0), default=0,
              help="Instead of the sweep: profile this many steady-state decode steps per arm and C (SGLang's profiler), "
                   "and report ms/step against GPU-busy ms/step (profile.md).")
@click.option("--load", type=click.Choice(LOADS), default="lockstep", show_default=True,
              help="lockstep: C clients start together (waves of C); staggered: an unmeasured ramp spreads their "
                   "starts over one request lifetime (docs/performance.md says why lockstep is the default).")
@click.option("--profile-load", type=click.Choice(PROFILE_LOADS), default="wave", show_default=True,
              help="wave: decode steps of one wave of 1024-token requests; lockstep: the sweep's own waves at "
                   "--out-len, prefills and wave ends included (profile enough steps for whole waves, e.g. 260 at "
                   "128); staggered: the sweep's steady load at --out-len, the prefills of arriving requests included.")
@click.option("--merge", "merge_from", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Instead of measuring (no GPU): one table, JSON and plot in --out from these result folders, e.g. "
                   "a sweep split over two GPUs or calls. Repeatable.")
@click.option("--engine-log-level", type=click.Choice(["warning", "info", "debug"]), default="warning", show_default=True,
              help="SGLang's log level in each engine's ARM.log: info logs every prefill batch (its requests, the running "
                   "and queued ones) and every 40th decode step, to see how a wave reaches the scheduler.")
@click.option("--port-base", type=click.IntRange(1024, 65000), default=PORT_BASE, show_default=True,
              help="First engine port (engine i takes PORT_BASE + 100*i, its rendezvous port inside that block); two "
                   "benches at once (one per GPU) need their own, e.g. 22000.")
@click.option("--fresh-engines", is_flag=True,
              help="Start every arm's engine anew for each repetition (1-4 minutes per start on the H200), "
                   "so one run averages over engine instances; the table then lists each repetition's own ratios.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor parallelism: each engine shards over this many GPUs (the first TP visible ones, "
                   "shared by all arms); a folder holds cells of one TP size only.")
@click.option("--max-batch", type=click.IntRange(min=1), default=None,
              help="The engines' batch capacity (CUDA graph max batch, running requests, KV pool); default the "
                   "largest --concurrency. Give the full sweep's (256) to measure or profile some of its C on the "
                   "same engines, so the runs pool with it.")
@_json_opt
@guarded
def bench(sglang_dir, out_dir, threshold, concurrency, reps, acc_len, prompt_len, out_len, budget, no_transition, transition_arms, arm_names,
          variants, max_engines, suggest, load, profile_steps, profile_load, merge_from, engine_log_level, port_base,
          fresh_engines, tp, max_batch, as_json):
    """Throughput sweep (GPU): no-spec, EAGLE-3, and the patched fallback, per concurrency."""
    from .bench import analyze
    from .bench.sweep import merge, run

    cs = _numbers("--concurrency", concurrency, int, 1, "request counts of 1 or more, such as 64 or 1,4,16,64,256")
    accs = _numbers("--acc-len", acc_len, float, 1.0, "numbers such as 3.0 or 2.0,3.0 (1.0 or more)")
    arms_measured, transition_named = _csv(arm_names), tuple(_csv(transition_arms)) or None
    folders = {a: Path(out_dir) if len(accs) == 1 else Path(out_dir) / f"acc-{a:g}" for a in accs}
    if suggest:
        for a, folder in folders.items():
            if not (folder / "cells.jsonl").exists():
                raise BadInputError(f"--suggest-threshold: {folder} has no cells.jsonl; measure there first "
                                    "(spectool bench --out with the same folder).")
            m = analyze.load_medians(folder, a)
            # Every C the folder measured (a merge with finer points included), unless named.
            named = click.get_current_context().get_parameter_source("concurrency") != click.core.ParameterSource.DEFAULT
            res = analyze.suggest_threshold(m, cs if named else [C for _, C in m])
            click.echo(to_json(res) if as_json else f"acceptance {a:g}: suggested threshold {res['threshold']} ({res['why']})")
        return
    if merge_from:
        report = merge(Path(out_dir), [Path(m) for m in merge_from], accs[0])
        click.echo(to_json(report) if as_json else (Path(out_dir) / "bench-table.md").read_text())
        return
    if profile_steps:
        from .bench.sweep import profile

        rows = profile(Path(out_dir), threshold=threshold, concurrencies=cs, arm_names=arms_measured,
                       variants=variants, steps=profile_steps, prompt_len=prompt_len, acc_len=accs[0], sglang_dir=sglang_dir,
                       max_engines=max_engines, load=profile_load, port_base=port_base, tp=tp, max_batch=max_batch,
                       console=_console(),
                       **({"out_len": out_len} if profile_load != "wave" else {}))
        click.echo(to_json(rows) if as_json else (Path(out_dir) / "profile.md").read_text())
        return
    reports = {}
    for a, folder in folders.items():
        reports[a] = run(folder, threshold=threshold, concurrencies=cs, reps=reps, prompt_len=prompt_len, out_len=out_len,
                         acc_len=a, transition=not no_transition, budget_s=budget, sglang_dir=sglang_dir,
                         arm_names=arms_measured, variants=variants, max_engines=max_engines,
                         load=load, transition_arms=transition_named,
                         engine_log_level=engine_log_level, port_base=port_base, fresh_engines=fresh_engines,
                         tp=tp, max_batch=max_batch, console=_console())
    if as_json:
        click.echo(to_json(reports[accs[0]] if len(accs) == 1 else {f"{a:g}": r for a, r in reports.items()}))
    else:
        for a, folder in folders.items():
            click.echo(f"acceptance {a:g} ({folder}):")
            click.echo((folder / "bench-table.md").read_text())
            click.echo(f"suggested threshold: {reports[a]['suggested_threshold']}")


if __name__ == "__main__":  # pragma: no cover
    main()
