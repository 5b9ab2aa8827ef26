"""Fallback counters for releases where the switch is upstream's (0.5.19+), read from the log.

There the spec-fallback recipe is retired and nothing writes SPECTOOL_FALLBACK_STATS, but the
scheduler says what it does: upstream's adaptive worker logs every tier change ("Switch
adaptive runtime state: steps 3 -> 0") and, with ``decode_log_interval=1``, every decode step
("Decode batch, #running-req: N, ..., accept len: X"). This rebuilds the same counters the
recipe publishes (steps, switches, per-phase requests and correct drafts), so the scenarios'
path checks run unchanged on both kinds of release.

Which tier a decode line belongs to: a step's decode line is printed when its result is
processed, which under the overlap scheduler happens after the next step was launched. A
switch printed at that launch therefore comes one decode line *before* the last line of the
old tier, except after a prefill (no decode in flight), where the next line is already the
new tier's (both orders are in the 0.5.17 log of the H200 run, tests/fixtures/upstream-0.5.17).
With the threshold known, the line after a switch goes to the tier its batch size belongs
to (tiers are disjoint in batch size); without it, to the old tier. The two decode lines
after a switch stay out of the acceptance sums either way.
"""

from __future__ import annotations

import re

SWITCH = re.compile(r"Switch adaptive runtime state: steps (\d+) -> (\d+)")
DECODE = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (\d+),.*?accept len: ([0-9.]+)")


def stats_from_log(text: str, initial_steps: int, threshold: int | None = None) -> dict:
    """Counters in the schema of the recipe's stats file, from the start of `text`.

    `threshold`: the T the engine ran with (drafting off above T requests), used to place
    the decode line that follows a switch."""
    stats = {
        "fallback_steps": 0,
        "spec_steps": 0,
        "switches_to_fallback": 0,
        "switches_to_spec": 0,
        "fallback_requests": 0,
        "phases": [],
        "phase_count": 0,
    }
    steps = initial_steps  # tier in force for the next decode line
    pending = None  # tier switched to since the previous decode line (takes effect one line later)
    since_switch = 2  # decode lines since the last switch line
    for line in text.splitlines():
        m = SWITCH.search(line)
        if m:
            old, new = int(m.group(1)), int(m.group(2))
            if (old == 0) != (new == 0):
                stats["switches_to_fallback" if new == 0 else "switches_to_spec"] += 1
            pending = new
            since_switch = 0
            continue
        m = DECODE.search(line)
        if not m:
            continue
        bs, acc = int(m.group(1)), float(m.group(2))
        if pending is not None and threshold is not None and (bs > threshold) == (pending == 0):
            steps, pending = pending, None  # this line already ran on the new tier
        mode = "fallback" if steps == 0 else "spec"
        phases = stats["phases"]
        if not phases or phases[-1]["mode"] != mode:
            stats["phase_count"] += 1
            phases.append({"id": stats["phase_count"], "mode": mode, "steps": 0, "reqs": 0, "correct_drafts": 0})
        phases[-1]["steps"] += 1
        if mode == "fallback":
            stats["fallback_steps"] += 1
            stats["fallback_requests"] += bs
        else:
            stats["spec_steps"] += 1
            if since_switch >= 2:
                phases[-1]["reqs"] += bs
                phases[-1]["correct_drafts"] += round((acc - 1.0) * bs)
        since_switch += 1
        if pending is not None:
            steps, pending = pending, None
    return stats


def stats_at_decode_line(lines: list[str], n: int, initial_steps: int, threshold: int | None = None) -> dict:
    """The counters as they stood right after the n-th decode line of a log: the snapshot a
    recorded run took at a workload bound (its counters then held n decode steps)."""
    end, seen = (0 if n == 0 else len(lines)), 0
    for i, line in enumerate(lines):
        if n and DECODE.search(line):
            seen += 1
            if seen == n:
                end = i + 1
                break
    return stats_from_log("\n".join(lines[:end]), initial_steps, threshold)
