"""Reduction of a torch-profiler chrome trace to per-step wall vs GPU-busy time (bench --profile)."""

import gzip
import json

from spectool.bench import profile


def _trace():
    ev = []
    # Two decode steps of 10 ms each; the GPU works 4 ms per step (two overlapping kernels
    # and one copy), the rest is idle: a host-bound step.
    for step in range(2):
        t = step * 10_000
        ev += [
            {"ph": "X", "cat": "kernel", "name": "gemm_bf16", "ts": t + 1000, "dur": 3000},
            {"ph": "X", "cat": "kernel", "name": "attention", "ts": t + 2000, "dur": 2000},  # overlaps gemm
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": t + 9000, "dur": 1000},
            {"ph": "X", "cat": "cpu_op", "name": "aten::index", "ts": t + 500, "dur": 700},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t + 900, "dur": 20},
        ]
    return {"traceEvents": ev}


def test_busy_idle_and_tops(tmp_path):
    path = tmp_path / "x-TP-0.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_trace()).encode()))
    r = profile.summarize(profile.load_events(path), steps=2)
    # Window: first kernel (1 ms) to the end of the last copy (20 ms) = 19 ms over 2 steps.
    assert round(r["step_ms"], 2) == 9.5
    assert round(r["gpu_busy_ms"], 2) == 4.0  # union: 3 ms gemm (attention inside it) + 1 ms copy
    assert round(r["gpu_idle_ms"], 2) == 5.5 and round(r["gpu_busy_fraction"], 3) == round(4 / 9.5, 3)
    assert r["kernels_per_step"] == 3 and r["graph_launches_per_step"] == 1
    assert r["top_kernels_ms_per_step"][0] == ("gemm_bf16", 3.0)
    # Host ops inside the window only (the first step's aten::index starts before the first kernel).
    (name, ms), = r["top_host_ms_per_step"]
    assert name == "aten::index" and abs(ms - 0.35) < 1e-9
    md = profile.markdown({("A4", 64): r, ("A0", 64): {"error": "no trace written"}})
    assert "| A4 | 64 | 9.50 | 4.00 | 5.50 |" in md and "no trace written" in md


def test_empty_trace_is_reported_not_divided():
    assert profile.summarize([], steps=30)["error"] == "no GPU activity in the trace"
