"""Where a decode step's time goes: a torch-profiler trace of N steady-state steps, reduced to
what decides the fallback's remaining cost (docs/performance.md): per step, the wall time of
the profiled window, how much of it the GPU was busy, and the kernels and host work behind it.

If a fallback step (A4) is longer than a plain one (A0) while its GPU-busy time is about the
same, the gap is host-side (the GPU waits on Python); if the busy time grows by the gap, the
extra kernels are the cost. The traces are SGLang's own (``start_profile`` with num_steps),
so nothing in the measured path is instrumented by spectool.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cpu_op", "user_annotation", "python_function"}


def load_events(path: Path) -> list[dict]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    return data["traceEvents"] if isinstance(data, dict) else data


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _short(name: str, n: int = 70) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."


def summarize(events: list[dict], steps: int, top: int = 8) -> dict:
    """Per-step figures of a trace covering `steps` decode steps."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    if not gpu or steps <= 0:
        return {"steps": steps, "kernels": 0, "error": "no GPU activity in the trace"}
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e.get("dur", 0) for e in gpu)
    busy = _union_us([(e["ts"], e["ts"] + e.get("dur", 0)) for e in gpu])
    by_kernel = Counter()
    for e in gpu:
        by_kernel[_short(e.get("name", "?"))] += e.get("dur", 0)
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS and t0 <= e["ts"] <= t1]
    by_host = Counter()
    for e in host:
        by_host[_short(e.get("name", "?"))] += e.get("dur", 0)
    launches = sum(1 for e in events if e.get("cat") == "cuda_runtime" and "cudaGraphLaunch" in e.get("name", ""))
    per = 1e-3 / steps  # us per window -> ms per step
    return {
        "steps": steps,
        "step_ms": (t1 - t0) * per,
        "gpu_busy_ms": busy * per,
        "gpu_idle_ms": (t1 - t0 - busy) * per,
        "gpu_busy_fraction": busy / (t1 - t0) if t1 > t0 else None,
        "kernels_per_step": len(gpu) / steps,
        "graph_launches_per_step": launches / steps,
        "top_kernels_ms_per_step": [(k, v * per) for k, v in by_kernel.most_common(top)],
        "top_host_ms_per_step": [(k, v * per) for k, v in by_host.most_common(top)],
    }


def markdown(rows: dict) -> str:
    """rows: (arm, C) -> summarize() result."""
    lines = ["| arm | C | ms/step | GPU busy ms | GPU idle ms | busy | kernels/step | graph launches/step |",
             "|---|---|---|---|---|---|---|---|"]
    for (arm, C), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if r.get("error"):
            lines.append(f"| {arm} | {C} | {r['error']} |  |  |  |  |  |")
            continue
        lines.append(f"| {arm} | {C} | {r['step_ms']:.2f} | {r['gpu_busy_ms']:.2f} | {r['gpu_idle_ms']:.2f} | "
                     f"{r['gpu_busy_fraction']:.0%} | {r['kernels_per_step']:.0f} | {r['graph_launches_per_step']:.1f} |")
    for (arm, C), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if r.get("error"):
            continue
        lines.append(f"\n{arm} at C={C}: top kernels (ms/step): "
                     + "; ".join(f"{k} {v:.3f}" for k, v in r["top_kernels_ms_per_step"]))
        lines.append(f"{arm} at C={C}: top host ops (ms/step): "
                     + "; ".join(f"{k} {v:.3f}" for k, v in r["top_host_ms_per_step"]))
    return "\n".join(lines) + "\n"
