"""Command line: parsing and printing only; the work is in spectool.api and friends."""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console

from . import __version__, api
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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


if __name__ == "__main__":  # pragma: no cover
    main()
