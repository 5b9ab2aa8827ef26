"""Text and JSON reports. One JSON schema for every command, versioned."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .statuses import FileIntegrity, Status

if TYPE_CHECKING:  # pragma: no cover - rich is imported only when a table is printed
    from rich.console import Console

JSON_SCHEMA_VERSION = 1

_STYLE = {
    Status.APPLIED: "green",
    Status.WOULD_APPLY: "cyan",
    Status.ALREADY_APPLIED: "green",
    Status.UPSTREAMED: "blue",
    Status.DRIFT: "red",
    Status.CONFLICT: "red",
    Status.UNSUPPORTED: "yellow",
    Status.BLOCKED: "yellow",
    Status.INVALID: "red",
    FileIntegrity.INTACT: "green",
    FileIntegrity.ORIGINAL: "yellow",
    FileIntegrity.MODIFIED: "red",
    FileIntegrity.MISSING: "red",
    FileIntegrity.REVERTED: "green",
}


def schema() -> dict:
    """The JSON Schema of every --json report (spectool/schema/report-v1.json)."""
    from pathlib import Path

    return json.loads((Path(__file__).parent / "schema" / "report-v1.json").read_text())


def to_json(payload: dict) -> str:
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, **payload}, indent=2, sort_keys=True, default=str)


def print_outcome(outcome, console: Console, *, show_diff: bool = False, heading: str | None = None) -> None:
    """The outcome as tables; `heading` replaces the first line ('SGLang V at DIR')."""
    from rich.table import Table

    tree = outcome.tree
    if heading is not None:
        console.print(heading, markup=False, highlight=False)
    elif tree is not None:
        console.print(f"SGLang {tree.version} at {tree.dir} ({tree.kind})")
    plan = outcome.plan
    if plan is not None and plan.results:
        table = Table(show_header=True, header_style="bold")
        for col in ("recipe", "variant", "status", "details"):
            table.add_column(col, overflow="fold")
        for r in plan.results:
            style = _STYLE.get(r.status, "")
            table.add_row(r.id, r.variant or "-", f"[{style}]{r.status}[/]", r.message or "")
        console.print(table)
        for r in plan.results:
            if r.error is not None and getattr(r.error, "candidates", None):
                console.print(f"[bold]{r.id}[/]: nearest candidates in the new source:")
                for c in r.error.candidates:
                    console.print(f"    {c}", markup=False, highlight=False)
    if outcome.files:
        table = Table(show_header=True, header_style="bold")
        table.add_column("file")
        table.add_column("state")
        for f in outcome.files:
            table.add_row(f["file"], f"[{_STYLE.get(f['state'], '')}]{f['state']}[/]")
        console.print(table)
    for r in outcome.applied:
        console.print(f"  {r['id']} ({r.get('variant')}) {r.get('status', '')} hash {r.get('content_hash', '')}")
    for note in outcome.notes:
        console.print(f"note: {note}")
    if show_diff and plan is not None:
        console.print(plan.diff(), markup=False, highlight=False, end="")
