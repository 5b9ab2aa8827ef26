"""How busy the host's CPUs were while a load ran.

A speculative step at low C and every transition phase at C=4 wait on Python (2.4-2.9 ms per
token with the GPU idle between kernels), so their throughput follows how busy the host is.
On a two-GPU host, C=4 phases run beside the other GPU's engine start-ups read several
percent below those run alone. Each cell and phase therefore records the host's busy
CPUs over its run, so a slow reading taken beside other work can be told from one taken on a
quiet host. Linux only (/proc/stat); elsewhere nothing is recorded.
"""

from __future__ import annotations

import os

STAT = "/proc/stat"


def cpu_times(path: str = STAT) -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs together since boot, from the aggregate "cpu"
    line of /proc/stat; idle and iowait count as not busy. None where the file is missing or
    not in that format."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    try:
        # user nice system idle iowait irq softirq steal (guest time is inside user already)
        ticks = [int(x) for x in fields[1:9]]
    except ValueError:
        return None
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


def busy_cpus(before, after, cpus: int | None = None) -> float | None:
    """How many CPUs were busy on average between two cpu_times() readings (0 to the CPU
    count); None without both readings or without time between them."""
    if before is None or after is None:
        return None
    total = after[1] - before[1]
    if total <= 0:
        return None
    return (after[0] - before[0]) / total * (cpus or os.cpu_count() or 1)
