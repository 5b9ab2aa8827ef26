"""Where a decode step's time goes: a torch-profiler trace of N steady-state steps, reduced to
what decides the fallback's remaining cost (docs/performance.md): per step, the wall time of
the profiled window, how much of it the GPU was busy, and the kernels and host work behind it.

If a fallback step (A4) is longer than a plain one (A0) while its GPU-busy time is about the
same, the gap is host-side (the GPU waits on Python); if the busy time grows by the gap, the
extra kernels are the cost, and `kernel_diff` names them: every kernel's time and count per
step in both arms, largest difference first. The traces are SGLang's own (``start_profile``
with num_steps), so nothing in the measured path is instrumented by spectool.
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
    by_kernel, n_kernel = Counter(), Counter()
    for e in gpu:
        name = _short(e.get("name", "?"))
        by_kernel[name] += e.get("dur", 0)
        n_kernel[name] += 1
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
        # Every kernel: [ms per step, launches per step], for kernel_diff.
        "kernels": {k: [v * per, n_kernel[k] / steps] for k, v in by_kernel.most_common()},
    }


def kernel_diff(row: dict, base: dict, top: int = 12) -> list[tuple[str, float, float, float, float]]:
    """The kernels whose time per step differs most between `row` and `base` (summarize()
    results of two arms at one C): (name, base ms, row ms, base launches, row launches), the
    largest absolute difference first. Kernels of one arm only appear with 0 in the other."""
    a, b = base.get("kernels", {}), row.get("kernels", {})
    none = (0, 0)  # [ms, launches] of a kernel the arm does not run
    names = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, none)[0] - a.get(k, none)[0]))
    return [(k, a.get(k, none)[0], b.get(k, none)[0], a.get(k, none)[1], b.get(k, none)[1]) for k in names[:top]]


def markdown(rows: dict, base_arm: str = "A0") -> str:
    """rows: (arm, C) or (arm, C, k) -> summarize() result, k counting the earlier profiles of
    that C on the same engines (shown as wave k+1). Every other arm is diffed against
    `base_arm` at its C and wave, kernel by kernel, where both traces hold the per-kernel
    table."""
    rows = {(key[0], key[1], key[2] if len(key) > 2 else 0): r for key, r in rows.items()}
    order = sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))

    def at(C, k):
        return f"{C}" + (f" (wave {k + 1})" if k else "")

    lines = ["| arm | C | ms/step | GPU busy ms | GPU idle ms | busy | kernels/step | graph launches/step |",
             "|---|---|---|---|---|---|---|---|"]
    for (arm, C, k), r in order:
        if r.get("error"):
            lines.append(f"| {arm} | {at(C, k)} | {r['error']} |  |  |  |  |  |")
            continue
        lines.append(f"| {arm} | {at(C, k)} | {r['step_ms']:.2f} | {r['gpu_busy_ms']:.2f} | {r['gpu_idle_ms']:.2f} | "
                     f"{r['gpu_busy_fraction']:.0%} | {r['kernels_per_step']:.0f} | {r['graph_launches_per_step']:.1f} |")
    for (arm, C, k), r in order:
        if r.get("error"):
            continue
        lines.append(f"\n{arm} at C={at(C, k)}: top kernels (ms/step): "
                     + "; ".join(f"{name} {v:.3f}" for name, v in r["top_kernels_ms_per_step"]))
        lines.append(f"{arm} at C={at(C, k)}: top host ops (ms/step): "
                     + "; ".join(f"{name} {v:.3f}" for name, v in r["top_host_ms_per_step"]))
    for (arm, C, k), r in order:
        base = rows.get((base_arm, C, k))
        if arm == base_arm or not base or "kernels" not in r or "kernels" not in base:
            continue
        lines += [f"\n{arm} against {base_arm} at C={at(C, k)}: {r['gpu_busy_ms'] - base['gpu_busy_ms']:+.3f} ms GPU busy, "
                  f"{r['step_ms'] - base['step_ms']:+.3f} ms per step, "
                  f"{r['kernels_per_step'] - base['kernels_per_step']:+.0f} kernels per step; "
                  "the kernels that differ most:\n",
                  f"| kernel | {base_arm} ms/step | {arm} ms/step | difference ms | {base_arm} launches/step | {arm} launches/step |",
                  "|---|---|---|---|---|---|"]
        for name, ms_a, ms_b, n_a, n_b in kernel_diff(r, base):
            lines.append(f"| `{name}` | {ms_a:.3f} | {ms_b:.3f} | {ms_b - ms_a:+.3f} | {n_a:.1f} | {n_b:.1f} |")
    return "\n".join(lines) + "\n"
