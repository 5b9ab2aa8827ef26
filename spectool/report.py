"""Text and JSON reports. One JSON schema for every command, versioned."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

JSON_SCHEMA_VERSION = 1

_STYLE = {
    "applied": "green", "would-apply": "cyan", "already-applied": "green", "upstreamed": "blue",
    "drift": "red", "conflict": "red", "unsupported": "yellow", "blocked": "yellow", "invalid": "red",
    "intact": "green", "original": "yellow", "modified": "red", "missing": "red", "reverted": "green",
}


def schema() -> dict:
    """The JSON Schema of every --json report (spectool/schema/report-v1.json)."""
    from pathlib import Path

    return json.loads((Path(__file__).parent / "schema" / "report-v1.json").read_text())


def to_json(payload: dict) -> str:
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, **payload}, indent=2, sort_keys=True, default=str)


def print_outcome(outcome, console: Console, *, show_diff: bool = False) -> None:
    tree = outcome.tree
    if tree is not None:
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
