"""Where a decode step's time goes: a torch-profiler trace of N steady-state steps, reduced to
what decides the fallback's remaining cost (docs/bench.md): per step, the wall time of
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
import re
from bisect import bisect_left
from collections import Counter
from pathlib import Path
from statistics import median

from .analyze import or_dash

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
FLOW_PHASES = {"s", "t", "f"}  # chrome-trace flow events (arrows), not activity
HOST_CATS = {"cpu_op", "user_annotation", "python_function"}


def trace_files(folder) -> list[Path]:
    """The traces SGLang's profiler wrote into `folder`, rank 0's first (`...-TP-0.trace.json.gz`;
    under tensor parallelism each rank writes one)."""
    return sorted(Path(folder).glob("*.trace.json*"), key=lambda p: ("TP-0" not in p.name, p.name))


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


def _gpu_events(events: list[dict]) -> list[dict]:
    """The trace's GPU work (kernels, copies, memsets), in time order."""
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"])


def _gpu_window(gpu: list[dict]) -> tuple[float, float]:
    """From the first GPU work's start to the last one's end (us), `gpu` in time order."""
    return gpu[0]["ts"], max(e["ts"] + e.get("dur", 0) for e in gpu)


def _largest_differences(
    a: dict, b: dict, value=lambda v: v, missing=0, top: int | None = None, at_least: float = 0.0
) -> list[str]:
    """The keys of `a` and `b` (one arm's figures against another's) by how much their values
    differ, the largest first and ties in name order (reproducible tables); a key one side
    lacks counts as `missing` there."""

    def diff(k):
        return abs(value(b.get(k, missing)) - value(a.get(k, missing)))

    names = sorted(set(a) | set(b), key=lambda k: (-diff(k), k))
    return [k for k in names if diff(k) >= at_least][:top]


def summarize(events: list[dict], steps: int, top: int = 8) -> dict:
    """Per-step figures of a trace covering `steps` decode steps."""
    # In time order, once: the idle attribution and the step anatomy walk it in that order.
    gpu = _gpu_events(events)
    if not gpu or steps <= 0:
        return {"steps": steps, "kernels": 0, "error": "no GPU activity in the trace"}
    t0, t1 = _gpu_window(gpu)
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
        **idle_gaps(events, gpu, steps),
        **step_anatomy(events, gpu),
        **prefill_anatomy(events, gpu),
    }


def _annotated_steps(events: list[dict], prefix: str = "step[") -> list[dict]:
    """The forwards SGLang annotates on the GPU (`step[MODE bs=N ...]`, each its GPU span) whose
    label starts with `prefix`, in time order."""
    return sorted(
        (
            e
            for e in events
            if e.get("cat") == "gpu_user_annotation" and e.get("ph") == "X" and e.get("name", "").startswith(prefix)
        ),
        key=lambda e: e["ts"],
    )


def step_anatomy(events: list[dict], gpu: list[dict], kind: str = "DECODE") -> dict:
    """A decode step taken apart on the GPU: the model's forward (SGLang annotates each step,
    `step[DECODE bs=N]`, and the trace carries its GPU span) and the kernels between two
    forwards (sampling, the scheduler's and the worker's bookkeeping, a fallback's draft
    sync). Where a fallback step is longer than a plain one at the same forward, the
    difference is in `between`: how many kernels, their busy time, and which
    (`between_kernels`, launches per step). Medians over consecutive annotated steps (the
    mean interval spreads work that comes every few steps, such as a KV-only replay)."""
    steps = _annotated_steps(events, f"step[{kind}")
    if len(steps) < 2:
        return {}
    starts = [e["ts"] for e in gpu]  # in time order (summarize)
    spans, intervals, counts, busy, names = [], [], [], [], Counter()
    for a, b in zip(steps, steps[1:]):
        end = a["ts"] + a.get("dur", 0)
        between = gpu[bisect_left(starts, end) : bisect_left(starts, b["ts"])]
        spans.append(a.get("dur", 0))
        intervals.append(b["ts"] - a["ts"])
        counts.append(len(between))
        busy.append(sum(e.get("dur", 0) for e in between))
        names.update(_short(e.get("name", "?")) for e in between)
    n = len(intervals)
    return {
        "anatomy": {
            "steps": n,
            "forward_ms": median(spans) / 1e3,
            "interval_ms": median(intervals) / 1e3,
            "interval_mean_ms": sum(intervals) / n / 1e3,
            "between_ms": median([i - s for i, s in zip(intervals, spans)]) / 1e3,
            "between_kernels": median(counts),
            "between_busy_ms": median(busy) / 1e3,
            "between_by_kernel": {k: v / n for k, v in names.most_common()},
        }
    }


EXTEND_TOKENS = re.compile(r"toks=(\d+)")


def prefill_anatomy(events: list[dict], gpu: list[dict]) -> dict:
    """The prefills of the window taken apart on the GPU. SGLang annotates every forward of a
    model runner (`step[EXTEND bs=N toks=T]`, its GPU span), so an EAGLE engine's prefill is
    two such spans in a row with the same label: the target's forward over the prompts, then
    the draft model extending the same prompts (told from a second chunk of the target by
    being far shorter). Per prefill: the target's forward (and per token), the draft's, the
    whole from the first span's start to the last's end, and what runs from there to the
    next annotated step. Two engines whose first tokens differ at the
    same load differ here; the decode steps (step_anatomy) do not show it. Medians over the
    prefills that have a step after them."""
    annotated = _annotated_steps(events)
    groups = []  # [each prefill's spans, the annotated step after it]
    for e in annotated:
        extend = e["name"].startswith("step[EXTEND")
        if groups and groups[-1][1] is None:
            spans = groups[-1][0]
            # The draft extending the same prompts: the same label, and far shorter (one layer
            # against the target's dozens), where a second chunk of the target is as long.
            if (
                extend
                and len(spans) == 1
                and e["name"] == spans[0]["name"]
                and e.get("dur", 0) < spans[0].get("dur", 0) / 2
            ):
                spans.append(e)
                continue
            groups[-1][1] = e
        if extend:
            groups.append([[e], None])
    groups = [(spans, nxt) for spans, nxt in groups if nxt is not None]
    if not groups:
        return {}
    starts = [e["ts"] for e in gpu]  # in time order (summarize)
    forward, draft, whole, after, after_busy, tokens = [], [], [], [], [], []
    for spans, nxt in groups:
        end = spans[-1]["ts"] + spans[-1].get("dur", 0)
        found = EXTEND_TOKENS.search(spans[0]["name"])
        forward.append(spans[0].get("dur", 0))
        tokens.append(int(found.group(1)) if found else 0)
        if len(spans) > 1:
            draft.append(spans[1].get("dur", 0))
        whole.append(end - spans[0]["ts"])
        after.append(nxt["ts"] - end)
        after_busy.append(sum(e.get("dur", 0) for e in gpu[bisect_left(starts, end) : bisect_left(starts, nxt["ts"])]))
    return {
        "prefill": {
            "prefills": len(groups),
            "tokens": median(tokens),
            "forward_ms": median(forward) / 1e3,
            # the target's us per token, which is ms per thousand tokens
            "forward_ms_per_1k_tokens": sum(forward) / sum(tokens) if sum(tokens) else None,
            "draft_ms": median(draft) / 1e3 if draft else None,
            "prefill_ms": median(whole) / 1e3,
            "after_ms": median(after) / 1e3,
            "after_busy_ms": median(after_busy) / 1e3,
        }
    }


LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
STACK_CATS = {"python_function", "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"}


def _frame(name: str) -> str:
    """'sglang/srt/managers/scheduler.py(3040): run_batch' -> 'scheduler.py:run_batch'."""
    where, _, fn = name.partition("): ")
    return f"{where.rsplit('/', 1)[-1].split('(')[0]}:{fn}" if fn else name


def _stacks_at(events: list[dict], queries: list[tuple[int, float]]) -> list[list[str]]:
    """The host call stack (outermost first) open at each (tid, time) query: the trace's
    Python frames and the ops and runtime calls inside them, which nest per thread."""
    by_tid: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in STACK_CATS:
            by_tid.setdefault(e.get("tid"), []).append((e["ts"], -e.get("dur", 0), e.get("name", "?")))
    for spans in by_tid.values():
        spans.sort()
    result: list[list[str]] = [[] for _ in queries]
    order = sorted(range(len(queries)), key=lambda i: (str(queries[i][0]), queries[i][1]))
    tid, spans, pos, stack = object(), [], 0, []
    for i in order:
        qtid, t = queries[i]
        if qtid != tid:
            tid, spans, pos, stack = qtid, by_tid.get(qtid, []), 0, []
        while pos < len(spans) and spans[pos][0] <= t:
            ts, neg, name = spans[pos]
            while stack and stack[-1][0] <= ts:
                stack.pop()
            stack.append((ts - neg, name))
            pos += 1
        while stack and stack[-1][0] <= t:
            stack.pop()
        result[i] = [name for _, name in stack]
    return result


def _label(stack: list[str]) -> str:
    """Where the host was: the innermost SGLang frame (the recipes' code is inside SGLang's
    files) and its caller, and the op or runtime call open inside it, if any."""
    frames = [i for i, name in enumerate(stack) if "sglang/" in name and "): " in name]
    if not frames:
        return stack[-1] if stack else "(no host activity)"
    inner = frames[-1]
    label = _frame(stack[inner])
    if len(frames) > 1:
        label += f" < {_frame(stack[frames[-2]]).split(':', 1)[1]}"
    ops = [name for name in stack[inner + 1 :] if "): " not in name]
    return label + (f" [{ops[-1]}]" if ops else "")


def idle_gaps(events: list[dict], gpu: list[dict], steps: int, min_gap_us: float = 1.0, top: int = 10) -> dict:
    """Why the GPU was idle: each gap between busy spans, by the kernel (or copy) that ended
    it. If that work was launched after the GPU ran dry, the host was late ("host"), and
    the gap goes to where the host was when the GPU ran dry (_label); if it was launched
    before, it waited on another stream, an event or a graph's launch ("queued"), and goes
    to where it was launched. Extra time that the GPU spends idle shows up here; extra GPU
    work, such as small kernels between two forwards, in step_anatomy (on the H200 the
    fallback's extra time at C=64 is the latter)."""
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    if not launches:
        return {}  # nothing joins the GPU work to the host: no attribution
    gaps = []
    end = None
    for e in gpu:  # in time order (summarize)
        if end is not None and e["ts"] - end >= min_gap_us:
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is None:
                gaps.append(("unknown", None, end, e))
            elif launch["ts"] >= end:
                gaps.append(("host", (launch.get("tid"), end), end, e))
            else:
                gaps.append(("queued", (launch.get("tid"), launch["ts"]), end, e))
        stop = e["ts"] + e.get("dur", 0)
        end = stop if end is None else max(end, stop)
    asked = [g[1] for g in gaps if g[1] is not None]
    stacks = iter(_stacks_at(events, asked))
    per = 1e-3 / steps if steps > 0 else 0
    by_where, n_where, by_kind = Counter(), Counter(), Counter()
    for kind, query, start, e in gaps:
        ms = (e["ts"] - start) * per
        where = f"{kind}: " + (_label(next(stacks)) if query is not None else _short(e.get("name", "?"), 50))
        by_where[where] += ms
        n_where[where] += 1
        by_kind[kind] += ms
    return {
        "idle_by_kind_ms_per_step": dict(by_kind),
        "idle_where_ms_per_step": [(k, v, n_where[k] / steps) for k, v in by_where.most_common(top)],
        # Every place: ms per step, for idle_diff.
        "idle_where": {k: v for k, v in by_where.most_common()},
    }


def idle_diff(row: dict, base: dict, top: int = 10) -> list[tuple[str, float, float]]:
    """The places whose GPU-idle time per step differs most between `row` and `base`
    (summarize() results of two arms at one C): (place, base ms, row ms)."""
    a, b = base.get("idle_where", {}), row.get("idle_where", {})
    return [(k, a.get(k, 0), b.get(k, 0)) for k in _largest_differences(a, b, top=top)]


def kernel_diff(row: dict, base: dict, top: int = 12) -> list[tuple[str, float, float, float, float]]:
    """The kernels whose time per step differs most between `row` and `base` (summarize()
    results of two arms at one C): (name, base ms, row ms, base launches, row launches), the
    largest absolute difference first. Kernels of one arm only appear with 0 in the other."""
    a, b = base.get("kernels", {}), row.get("kernels", {})
    none = (0, 0)  # [ms, launches] of a kernel the arm does not run
    names = _largest_differences(a, b, value=lambda v: v[0], missing=none, top=top)
    return [(k, a.get(k, none)[0], b.get(k, none)[0], a.get(k, none)[1], b.get(k, none)[1]) for k in names]


def markdown(rows: dict, base_arm: str = "A0") -> str:
    """rows: (arm, C) or (arm, C, k) -> summarize() result, k counting the earlier profiles of
    that C on the same engines (shown as wave k+1). Every other arm is diffed against
    `base_arm` at its C and wave, kernel by kernel, where both traces hold the per-kernel
    table."""
    rows = {(key[0], key[1], key[2] if len(key) > 2 else 0): r for key, r in rows.items()}
    order = sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))

    def at(C, k):
        return f"{C}" + (f" (wave {k + 1})" if k else "")

    lines = [
        "| arm | C | ms/step | GPU busy ms | GPU idle ms | busy | kernels/step | graph launches/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (arm, C, k), r in order:
        if r.get("error"):
            lines.append(f"| {arm} | {at(C, k)} | {r['error']} |  |  |  |  |  |")
            continue
        lines.append(
            f"| {arm} | {at(C, k)} | {r['step_ms']:.2f} | {r['gpu_busy_ms']:.2f} | {r['gpu_idle_ms']:.2f} | "
            f"{r['gpu_busy_fraction']:.0%} | {r['kernels_per_step']:.0f} | {r['graph_launches_per_step']:.1f} |"
        )
    anatomies = [(arm, C, k, r["anatomy"]) for (arm, C, k), r in order if r.get("anatomy")]
    if anatomies:
        lines += [
            "\nDecode steps taken apart on the GPU (medians over consecutive steps; `between`: from the end of "
            "one step's forward to the start of the next):\n",
            "| arm | C | steps | forward ms | step to step ms (mean) | between ms | kernels between | busy between ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for arm, C, k, a in anatomies:
            lines.append(
                f"| {arm} | {at(C, k)} | {a['steps']} | {a['forward_ms']:.3f} | {a['interval_ms']:.3f} "
                f"({a['interval_mean_ms']:.3f}) | {a['between_ms']:.3f} | {a['between_kernels']:g} | "
                f"{a['between_busy_ms']:.3f} |"
            )
    prefills = [(arm, C, k, r["prefill"]) for (arm, C, k), r in order if r.get("prefill")]
    if prefills:
        lines += [
            "\nPrefills taken apart on the GPU (medians over the window's prefills; target: its forward over the "
            "prompts; draft: EAGLE's draft extending them; prefill: from the first forward's start to the last's "
            "end; after: from there to the next step):\n",
            "| arm | C | prefills | tokens | target ms | target ms per 1k tokens | draft ms | prefill ms | after ms "
            "| busy after ms |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm, C, k, p in prefills:
            lines.append(
                f"| {arm} | {at(C, k)} | {p['prefills']} | {p['tokens']:.0f} | {p['forward_ms']:.3f} "
                f"| {or_dash(p['forward_ms_per_1k_tokens'])} | {or_dash(p['draft_ms'])} | {p['prefill_ms']:.3f} "
                f"| {p['after_ms']:.3f} | {p['after_busy_ms']:.3f} |"
            )
    for (arm, C, k), r in order:
        if r.get("error"):
            continue
        lines.append(
            f"\n{arm} at C={at(C, k)}: top kernels (ms/step): "
            + "; ".join(f"{name} {v:.3f}" for name, v in r["top_kernels_ms_per_step"])
        )
        lines.append(
            f"{arm} at C={at(C, k)}: top host ops (ms/step): "
            + "; ".join(f"{name} {v:.3f}" for name, v in r["top_host_ms_per_step"])
        )
        if r.get("idle_where_ms_per_step"):
            kinds = ", ".join(f"{kind} {ms:.3f}" for kind, ms in sorted(r["idle_by_kind_ms_per_step"].items()))
            lines.append(
                f"{arm} at C={at(C, k)}: GPU idle by cause (ms/step): {kinds}; where: "
                + "; ".join(f"{name} {v:.3f} ({n:.1f}x)" for name, v, n in r["idle_where_ms_per_step"])
            )
    for (arm, C, k), r in order:
        base = rows.get((base_arm, C, k))
        if arm == base_arm or not base or r.get("error") or base.get("error"):
            continue
        lines += [
            f"\n{arm} against {base_arm} at C={at(C, k)}: {r['gpu_busy_ms'] - base['gpu_busy_ms']:+.3f} ms GPU busy, "
            f"{r['step_ms'] - base['step_ms']:+.3f} ms per step, "
            f"{r['kernels_per_step'] - base['kernels_per_step']:+.0f} kernels per step; "
            "the kernels that differ most:\n",
            f"| kernel | {base_arm} ms/step | {arm} ms/step | difference ms | {base_arm} launches/step | {arm} launches/step |",
            "|---|---|---|---|---|---|",
        ]
        for name, ms_a, ms_b, n_a, n_b in kernel_diff(r, base):
            lines.append(f"| `{name}` | {ms_a:.3f} | {ms_b:.3f} | {ms_b - ms_a:+.3f} | {n_a:.1f} | {n_b:.1f} |")
        if r.get("anatomy") and base.get("anatomy"):
            a, b0 = r["anatomy"]["between_by_kernel"], base["anatomy"]["between_by_kernel"]
            diff = _largest_differences(b0, a, top=12, at_least=0.05)
            if diff:
                lines += [
                    f"\n{arm} against {base_arm} at C={at(C, k)}: the kernels between two forwards that differ "
                    "(launches per step):\n",
                    f"| kernel | {base_arm} | {arm} |",
                    "|---|---|---|",
                ]
                lines += [f"| `{name}` | {b0.get(name, 0):.2f} | {a.get(name, 0):.2f} |" for name in diff]
        if "idle_where" in r and "idle_where" in base:
            lines += [
                f"\n{arm} against {base_arm} at C={at(C, k)}: {r['gpu_idle_ms'] - base['gpu_idle_ms']:+.3f} ms "
                "GPU idle per step; where the GPU waits differently (host: launched after the GPU ran "
                "dry, at the host's place then; queued: launched earlier, at its launch):\n",
                f"| where | {base_arm} idle ms/step | {arm} idle ms/step | difference ms |",
                "|---|---|---|---|",
            ]
            for name, ms_a, ms_b in idle_diff(r, base):
                lines.append(f"| `{name}` | {ms_a:.3f} | {ms_b:.3f} | {ms_b - ms_a:+.3f} |")
    return "\n".join(lines) + "\n"


def excerpt(events: list[dict], steps: int, keep: int = 2) -> list[dict]:
    """The middle `keep` of `steps` profiled steps (by time), every event kept: small enough
    to commit beside profile.md, so the idle attribution can be re-read off the device."""
    gpu = _gpu_events(events)
    if not gpu or steps <= 0:
        return []
    t0, t1 = _gpu_window(gpu)
    span = (t1 - t0) * min(keep, steps) / steps
    a = t0 + ((t1 - t0) - span) / 2
    b = a + span
    # Metadata (thread names) whole; everything else inside the cut, but no flow arrows (the
    # viewer's CPU-to-GPU links: a lockstep trace has some 70 000 per step, and the
    # correlation ids that join launches to kernels are in the events' own args).
    return [
        e
        for e in events
        if e.get("ph") == "M"
        or (e.get("ph") not in FLOW_PHASES and "ts" in e and e["ts"] < b and e["ts"] + e.get("dur", 0) > a)
    ]


# Excerpt files, one per profiled (arm, C): ARM-C64.trace.json.gz, and ARM-C64-2... for the
# second profile of that C on the same engines (k counts the earlier ones).
_EXCERPT = re.compile(r"^(?P<arm>[A-Za-z0-9]+)-C(?P<C>\d+)(?:-(?P<wave>\d+))?\.trace\.json(?:\.gz)?$")


def excerpt_name(arm: str, C: int, k: int) -> str:
    """The file the excerpt of `arm`'s (k+1)-th profile at C is kept in, under excerpts/."""
    return f"{arm}-C{C}{f'-{k + 1}' if k else ''}.trace.json.gz"


def reread_excerpts(folder: Path) -> dict:
    """(arm, C, k) -> summarize() of each excerpt in `folder`/excerpts (two steps each): a
    recorded profile reduced again with the current code, off the device."""
    rows = {}
    for path in sorted((Path(folder) / "excerpts").glob("*.trace.json*")):
        m = _EXCERPT.match(path.name)
        if m:
            k = int(m["wave"]) - 1 if m["wave"] else 0
            rows[(m["arm"], int(m["C"]), k)] = summarize(load_events(path), steps=2)
    return rows
