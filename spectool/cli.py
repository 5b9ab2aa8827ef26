"""Command line: parsing and printing only; the work is in spectool.api and friends."""

from __future__ import annotations

import functools
import math
import sys
import textwrap
import traceback
from pathlib import Path

import click

from . import __version__
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, BadInputError, SpectoolError
from .report import print_outcome, to_json


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
    if not values or min(values) < least or not all(math.isfinite(v) for v in values):
        raise BadInputError(f"{option} {text!r}: expected {example}.")
    return values


def _console():
    """A rich console for tables (rich is imported only by commands that print one)."""
    import shutil

    from rich.console import Console

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
            where = kwargs.get("sglang_dir") or "DIR"
            click.echo(
                "spectool: interrupted. Writes are all or nothing: one under way when the signal came was "
                f"finished first. 'spectool status --sglang-dir {where}' shows the tree's state (and names "
                "'spectool recover' if a killed run left anything unfinished).",
                err=True,
            )
            sys.exit(EXIT_FAILED)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except OSError as exc:  # the environment, not spectool: a permission, a full disk, a vanished file
            _fail(
                BadInputError(
                    f"cannot access {exc.filename or 'a file'}: {exc.strerror or exc}. Nothing was "
                    "written unless a note above says so."
                ),
                as_json,
            )
        except Exception as exc:  # a bug in spectool: say so, keep the details short
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            msg = (
                f"internal error {type(exc).__name__}: {exc} (at {Path(tb.filename).name}:{tb.lineno}). "
                "This is a bug in spectool; nothing was written unless a journal says so. Please report it."
            )
            if as_json:
                click.echo(to_json({"ok": False, "error": {"kind": "internal", "message": msg}}))
            else:
                click.echo(f"spectool: {msg}", err=True)
            sys.exit(EXIT_INTERNAL)

    return wrapper


def exit_codes(ok: str, failed: str, bad_input: str = "") -> str:
    """The 'Exit codes' block of a command's --help, from the constants in spectool.errors.
    `failed` says what exit 1 means for this command; Ctrl-C also exits 1."""
    rows = [
        (EXIT_OK, ok),
        (EXIT_FAILED, failed),
        (EXIT_BAD_INPUT, "bad input or usage: a one-paragraph error" + (f" ({bad_input})" if bad_input else "")),
        (EXIT_INTERNAL, "internal error: a bug in spectool, reported in one paragraph"),
    ]
    lines = [
        line
        for code, text in rows
        for line in textwrap.wrap(text, 74, initial_indent=f"{code}  ", subsequent_indent="   ")
    ]
    return "Exit codes:\n\n\b\n" + "\n".join(lines)


def recipes_opts(default: str = "the set pinned in spectool.toml; with --recipes-dir, every recipe there"):
    """--recipes and --recipes-dir, the same on every command that reads recipes."""

    def decorate(fn):
        fn = click.option(
            "--recipes-dir",
            type=click.Path(file_okay=False),
            default=None,
            help="Where recipes live (default: the shipped ones).",
        )(fn)
        fn = click.option(
            "--recipes",
            "select",
            default="",
            metavar="IDS",
            help=f"Comma-separated recipe ids, with the recipes they require (default: {default}).",
        )(fn)
        return fn

    return decorate


def _version_opt(fn):
    return click.option("--sglang-version", "version", default=None, help="Override the detected SGLang version.")(fn)


def _recipe_opts(fn):
    return recipes_opts()(_version_opt(fn))


def _json_opt(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON report (schema_version 1).")(fn)


def _dir_opt(required=True):
    return click.option(
        "--sglang-dir",
        type=click.Path(),
        required=required,
        help="A git checkout of SGLang, a folder holding the sglang package, or the package.",
    )


def _ids(select: str) -> list[str] | None:
    """--recipes as a list of ids (None: not given)."""
    return [s.strip() for s in select.split(",") if s.strip()] or None


def selection(select: str, recipes_dir=None):
    """(recipe ids, options): --recipes wins; else the pin file's set for the shipped recipes;
    else all in --recipes-dir."""
    from .pin import load_pin

    if _ids(select):
        return _ids(select), {}
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


class LazyGroup(click.Group):
    """A group whose GPU-harness commands (verify, bench) are imported only when invoked or
    listed, so `apply`, `check` and the pre-commit gate never load the harness."""

    lazy = {"verify": "spectool.harness.commands:verify", "bench": "spectool.harness.commands:bench"}

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx, name):
        if name in self.lazy:
            import importlib

            module, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=exit_codes(
        "ok", "the check failed: drift, conflict, a changed file, a mismatch (each command's --help says which)"
    ),
)
@click.version_option(__version__, prog_name="spectool")
def main():
    """Declarative, verified patches for SGLang: apply, check, status, revert, recover, upgrade,
    gate, port, fetch, verify, bench. Every command takes --json: one report on stdout (schema_version 1)."""


@main.command(
    epilog=exit_codes(
        "applied, or every recipe already in place (--dry-run: nothing would change)",
        "a recipe drifted, conflicts, is unsupported or blocked, or would leave invalid code: nothing "
        "was written (--dry-run: something would change)",
        "also: a patched file changed since the apply, without --force; a damaged lockfile",
    )
)
@_dir_opt(required=False)
@_recipe_opts
@click.option(
    "--dry-run", is_flag=True, help="Print the unified diff, change nothing (exit 1 if anything would change)."
)
@click.option("--force", is_flag=True, help="Apply over files changed since the last apply.")
@_json_opt
@guarded
def apply(sglang_dir, select, recipes_dir, version, dry_run, force, as_json):
    """Apply the recipes to an SGLang tree (default: fetch the pinned release into ./build)."""
    from . import api

    if sglang_dir is None:
        from .fetch import prepare_pinned_tree

        sglang_dir = prepare_pinned_tree(progress=not as_json)
    ids, options = selection(select, recipes_dir)
    out = api.apply(
        sglang_dir, recipes_dir=recipes_dir, select=ids, options=options, version=version, dry_run=dry_run, force=force
    )
    ok = out.ok and not (dry_run and out.plan is not None and out.plan.changed)
    _emit(out, as_json, show_diff=dry_run, ok=ok)


@main.command(
    epilog=exit_codes(
        "every recipe would apply or is applied, and every patched file is intact",
        "a recipe would not apply (drift, conflict, unsupported, blocked, invalid), a patched file "
        "changed since the apply, or spectool.lock is for another SGLang release",
        "also: a tree an interrupted run left unfinished (the message names recover), a damaged lockfile",
    )
)
@_dir_opt()
@_recipe_opts
@click.option("--against", default=None, help="Fetch this SGLang release and check the recipes against it instead.")
@_json_opt
@guarded
def check(sglang_dir, select, recipes_dir, version, against, as_json):
    """Would every recipe apply, or is it applied and intact? Writes nothing."""
    from . import api

    ids, options = selection(select, recipes_dir)
    if against:
        from .fetch import fetch

        sglang_dir = fetch(against, progress=not as_json)
    out = api.check(sglang_dir, recipes_dir=recipes_dir, select=ids, options=options, version=version)
    _emit(out, as_json)


@main.command(
    epilog=exit_codes(
        "every patched file is intact, or nothing is applied",
        "a patched file changed or is missing, the tree is another SGLang release than the lock's, an "
        "interrupted run left the tree unfinished (the note names recover), or the lockfile is damaged",
    )
)
@_dir_opt()
@_version_opt
@_json_opt
@guarded
def status(sglang_dir, version, as_json):
    """What is applied (from spectool.lock), with hash checks of every patched file and of the
    saved originals; never ok on a tree an interrupted run left unfinished."""
    from . import api

    _emit(api.status(sglang_dir, version=version), as_json)


@main.command(
    epilog=exit_codes(
        "restored, or nothing to revert",
        "interrupted (Ctrl-C; a write under way is finished first)",
        "also: a patched file changed since the apply, without --force, a saved original is damaged, or the "
        "lockfile and its copy are both unusable, without --force",
    )
)
@_dir_opt()
@_version_opt
@click.option(
    "--force",
    is_flag=True,
    help="Revert even files changed since the apply; with no trustworthy "
    "lockfile (nor its copy in .spectool), restore the saved originals alone.",
)
@_json_opt
@guarded
def revert(sglang_dir, version, force, as_json):
    """Restore every patched file byte for byte."""
    from . import api

    out = api.revert(sglang_dir, version=version, force=force)
    _emit(out, as_json)


@main.command(
    epilog=exit_codes(
        "nothing was unfinished, or the interrupted apply or revert was finished or rolled back",
        "the lockfile is still damaged (the note names the revert that repairs it)",
    )
)
@_dir_opt()
@_version_opt
@_json_opt
@guarded
def recover(sglang_dir, version, as_json):
    """Finish or roll back what a killed apply or revert left (its journal, temp files).
    apply and revert do this first on their own; status and check name this command."""
    from . import api

    _emit(api.recover(sglang_dir, version=version), as_json)


def _upgrade(to, recipes_dir, select, as_json, from_version=None) -> tuple[int, dict | None]:
    """Plan the recipes against release `to` (fetched, nothing written); exit 1 if anything
    needs work. Recipes with no variant for `to` are also tried with the variant of
    `from_version` (default: the pinned release), which shows the real drift: missing anchors,
    candidates. With as_json the report is returned, else printed."""
    from . import api
    from .fetch import fetch as do_fetch
    from .pin import load_pin
    from .statuses import Status

    tree_dir = do_fetch(to, progress=not as_json)
    out = api.check(tree_dir, recipes_dir=recipes_dir, select=select)
    needs_work = [
        r for r in out.plan.results if r.status not in (Status.WOULD_APPLY, Status.ALREADY_APPLIED, Status.UPSTREAMED)
    ]
    retire = [r.id for r in out.plan.results if r.status == Status.UPSTREAMED]
    if from_version is None:
        pin = load_pin(required=False)
        from_version = pin.version if pin else None
    uncovered = [r.id for r in needs_work if r.status in (Status.UNSUPPORTED, Status.BLOCKED)]
    current = None
    if uncovered and from_version and from_version != to:
        current = api.check(tree_dir, recipes_dir=recipes_dir, select=uncovered, version=from_version)
    rc = EXIT_FAILED if needs_work else EXIT_OK
    if as_json:
        payload = out.to_json()
        payload.update(command="upgrade", to=to, needs_work=[r.id for r in needs_work], retire=retire)
        if current is not None:
            payload["current_variants_on_new_release"] = [r.to_json() for r in current.plan.results]
        return rc, payload
    console = _console()
    print_outcome(out, console)
    if current is not None:
        console.print(f"\nThe variants you run today (SGLang {from_version}) planned on SGLang {to}:")
        print_outcome(
            current, console, heading=f"SGLang {to} at {tree_dir}, planned with the variants for {from_version}"
        )
    for rid in retire:
        console.print(f"retire: {rid} is upstream in SGLang {to}; drop it from your pin's recipe set when you upgrade.")
    console.print(
        f"upgrade to SGLang {to}: "
        + (
            "[green]ready[/]"
            if not needs_work
            else f"[red]{len(needs_work)} recipe(s) need work[/]: "
            + ", ".join(f"{r.id} ({r.status})" for r in needs_work)
        )
    )
    return rc, None


_UPGRADE_FAILED = "a recipe needs work on the new release: drift, conflict, unsupported, blocked or invalid"


@main.command(
    epilog=exit_codes(
        "every recipe applies to release TO or is upstream there",
        _UPGRADE_FAILED,
        "also: a release that is not on the index, a failed download",
    )
)
@click.option("--to", "to", required=True, help="The SGLang release to upgrade to.")
@click.option("--from", "from_version", default=None, help="The release you run today (default: the pin).")
@recipes_opts(default="every recipe in --recipes-dir or the shipped ones")
@_json_opt
@guarded
def upgrade(to, from_version, select, recipes_dir, as_json):
    """The upgrade gate: would the recipes apply to release TO? Drift, candidates, what to retire."""
    rc, payload = _upgrade(to, recipes_dir, _ids(select), as_json, from_version)
    if payload is not None:
        click.echo(to_json(payload))
    sys.exit(rc)


@main.command(
    epilog=exit_codes(
        "no SGLang requirement in the changed files, or every recipe is ready for each release they pin",
        _UPGRADE_FAILED,
        "also: a requirement that names no release (sglang, sglang<X), a changed file that "
        "is not valid TOML, a release that is not on the index",
    )
)
@click.argument("files", nargs=-1, type=click.Path())
@click.option(
    "--from",
    "from_version",
    default=None,
    help="The release you run today (default: the file's pin in git HEAD, else a spectool.lock here or "
    "in ./build, else spectool.toml).",
)
@recipes_opts(default="every recipe in --recipes-dir or the shipped ones")
@_json_opt
@guarded
def gate(files, from_version, select, recipes_dir, as_json):
    """pre-commit entry: read the SGLang requirement of the changed files (spectool.toml, or a
    requirements file: sglang==X, any spelling PEP 503 folds to sglang, extras, markers) and
    run the upgrade gate against it, with the drift of the variants you run today. A range
    (sglang>=X,<Y) is checked at its lowest allowed release. --json prints one report, its
    'upgrades' holding the upgrade report of each pinned release."""
    from .fetch import releases
    from .pin import applied_version, load_pin, lowest_allowed, previous_pin, requirement_in

    checks, notes = [], []
    for f in files:
        req = requirement_in(Path(f))
        if req is None:
            continue
        version = req.exact or lowest_allowed(req, releases)
        if not req.exact:
            notes.append(f"{f}: {req.text!r} is a range: checked at its lowest allowed release, {version}")
        old = from_version or previous_pin(Path(f)) or applied_version()
        if old is None:
            pin = load_pin(required=False)
            old = pin.version if pin else None
        if (version, old) not in [(c["version"], c["from"]) for c in checks]:
            checks.append({"file": f, "requirement": req.text, "version": version, "from": old})
    if not checks:
        note = "no SGLang requirement in the changed files; nothing to check."
        if as_json:
            click.echo(to_json({"ok": True, "command": "gate", "notes": [note], "upgrades": []}))
        else:
            click.echo(f"spectool gate: {note}")
        sys.exit(EXIT_OK)
    for note in notes:
        if not as_json:
            click.echo(f"spectool gate: {note}")
    results = []
    for c in checks:
        if not as_json:
            came = f" (from {c['from']})" if c["from"] and c["from"] != c["version"] else ""
            click.echo(f"spectool gate: {c['file']} pins SGLang {c['version']}{came}")
        results.append(_upgrade(c["version"], recipes_dir, _ids(select), as_json, c["from"]))
    rc = max(code for code, _ in results)
    if as_json:
        click.echo(
            to_json(
                {
                    "ok": rc == EXIT_OK,
                    "command": "gate",
                    "notes": notes,
                    "checked": checks,
                    "upgrades": [payload for _, payload in results],
                }
            )
        )
    sys.exit(rc)


@main.command(
    epilog=exit_codes(
        "every operation carried over or re-anchored, and check passes on release TO",
        "an operation needs a human (nothing written), or check fails on release TO with the new variant",
        "also: an unknown recipe, a release that is not on the index, variant ranges that are not '>=A,<B'",
    )
)
@click.argument("recipe")
@click.option("--to", "to", required=True, help="The SGLang release to port the recipe to (fetched).")
@click.option(
    "--sglang-dir",
    type=click.Path(),
    default=None,
    help="Use this tree of release TO instead of fetching it (its version must be TO).",
)
@click.option(
    "--recipes-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where recipes live (default: the shipped ones); the recipe's recipe.yaml there is rewritten.",
)
@click.option("--dry-run", is_flag=True, help="Report what would be ported and the ranges; write nothing.")
@_json_opt
@guarded
def port(recipe, to, sglang_dir, recipes_dir, dry_run, as_json):
    """Port RECIPE to SGLang release TO: start from the nearest variant, re-anchor what drifted
    where one candidate fits (renamed or moved definitions, moved anchors), write the new
    variant into recipe.yaml for review, then check it."""
    from .port import port as do_port

    if sglang_dir is None:
        from .fetch import fetch as do_fetch

        sglang_dir = do_fetch(to, progress=not as_json)
    else:
        from .source import locate

        found = locate(sglang_dir).version
        if str(found) != to:
            raise BadInputError(f"--sglang-dir {sglang_dir} holds SGLang {found}, not {to}.")
    res = do_port(recipe, sglang_dir, recipes_dir=recipes_dir, dry_run=dry_run)
    if as_json:
        click.echo(to_json(res.to_json()))
    else:
        _print_port(res)
    sys.exit(EXIT_OK if res.ok else EXIT_FAILED)


def _print_port(res) -> None:
    console = _console()
    say = functools.partial(console.print, markup=False, highlight=False)
    start = f"from variant {res.source}" if res.source else f"variant {res.covered_by}"
    say(f"spectool port {res.recipe} --to {res.version}: {start}")
    for o in res.ops:
        head = f"  #{o.index} {o.kind} {o.target}"
        if o.outcome == "carried":
            say(f"{head}: carried over unchanged")
        elif o.outcome == "re-anchored":
            say(f"{head}: re-anchored")
            for c in o.changes:
                say(f"      {c}")
        else:
            say(f"{head}: NEEDS A HUMAN: {o.reason}")
            for c in o.changes:
                say(f"      re-anchored first: {c}")
            for c in o.candidates:
                say(f"      candidate: {c}")
    for r in res.ranges:
        say(f"range: {r}")
    if res.variant and res.wrote:
        say(f"variant {res.variant} ({res.versions}) written for review:")
    for w in res.wrote:
        say(f"  wrote {w}")
    for n in res.notes:
        say(f"note: {n}")
    if res.check is not None:
        console.print(f"\ncheck against SGLang {res.version}:")
        print_outcome(res.check, console)
    carried = sum(o.outcome == "carried" for o in res.ops)
    moved = sum(o.outcome == "re-anchored" for o in res.ops)
    human = len(res.needs_human)
    verdict = "ported" if res.ok else "needs a human" if human else "check failed"
    say(
        f"port {res.recipe} to SGLang {res.version}: {verdict} ({carried} carried over, {moved} re-anchored, "
        f"{human} need a human)"
    )


@main.command(
    epilog=exit_codes(
        "fetched; the path is printed",
        "interrupted (Ctrl-C)",
        "also: a release that is not on the index, a hash mismatch, a failed download",
    )
)
@click.argument("version", required=False)
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    default=None,
    help="Copy the unpacked release here (default: print the cache path).",
)
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


if __name__ == "__main__":  # pragma: no cover
    main()
