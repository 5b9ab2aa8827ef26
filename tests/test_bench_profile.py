"""Reduction of a torch-profiler chrome trace to per-step wall vs GPU-busy time (bench --profile)."""

import gzip
import json

import pytest

from spectool.harness.bench import profile


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
    ((name, ms),) = r["top_host_ms_per_step"]
    assert name == "aten::index" and abs(ms - 0.35) < 1e-9
    md = profile.markdown({("A4", 64): r, ("A0", 64): {"error": "no trace written"}})
    assert "| A4 | 64 | 9.50 | 4.00 | 5.50 |" in md and "no trace written" in md


def test_empty_trace_is_reported_not_divided():
    assert profile.summarize([], steps=30)["error"] == "no GPU activity in the trace"


def test_kernel_diff_names_what_the_fallback_adds():
    """A4 against A0 at one C: the kernel only A4 launches comes first, with 0 for A0, and the
    markdown carries the difference table with the busy-time and kernel-count deltas."""
    base_ev = _trace()["traceEvents"]
    extra = [
        {"ph": "X", "cat": "kernel", "name": "draft_kv_store", "ts": s * 10_000 + 8000, "dur": 400} for s in range(2)
    ]
    slower = [dict(e, dur=e["dur"] + 100) if e.get("name") == "attention" else e for e in base_ev]
    a0 = profile.summarize(base_ev, steps=2)
    a4 = profile.summarize(slower + extra, steps=2)
    assert a4["kernels"]["draft_kv_store"] == [0.4, 1.0]
    (name, ms_a, ms_b, n_a, n_b), (name2, *_rest) = profile.kernel_diff(a4, a0, top=2)
    assert (name, ms_a, ms_b, n_a, n_b) == ("draft_kv_store", 0, 0.4, 0, 1.0)
    assert name2 == "attention" and abs(_rest[1] - _rest[0] - 0.1) < 1e-9
    md = profile.markdown({("A0", 64): a0, ("A4", 64): a4})  # busy: +0.4 store, +0.1 attention past the gemm
    assert "A4 against A0 at C=64: +0.500 ms GPU busy" in md and "+1 kernels per step" in md
    assert "| `draft_kv_store` | 0.000 | 0.400 | +0.400 | 0.0 | 1.0 |" in md
    # Without the base arm at that C there is nothing to diff against.
    assert "against" not in profile.markdown({("A4", 64): a4})


def test_a_repeated_c_is_a_later_wave_on_the_same_engines():
    """`--concurrency 64,64`: the second profile of C=64 is keyed (arm, 64, 1), shown as wave
    2, and diffed against A0's wave 2, not its wave 1."""
    ev = _trace()["traceEvents"]
    slow = [dict(e, dur=e["dur"] * 2) if e.get("name") == "gemm_bf16" else e for e in ev]
    a0, a0_late, a4_late = (profile.summarize(x, steps=2) for x in (ev, slow, slow))
    md = profile.markdown({("A0", 64, 0): a0, ("A0", 64, 1): a0_late, ("A4", 64, 1): a4_late})
    assert "| A0 | 64 | 9.50 |" in md and "| A0 | 64 (wave 2) |" in md and "| A4 | 64 (wave 2) |" in md
    assert "A4 against A0 at C=64 (wave 2): +0.000 ms GPU busy" in md
    assert md.count(" against ") == 1


def _frames_trace(extra_host_us: int):
    """Two steps of a scheduler loop as the torch profiler records it with stacks: Python
    frames (nested per thread), runtime launches and GPU work joined by correlation ids. Each
    step launches a 3 ms graph at t+100; then the host prepares the next step: result
    processing (400 us) and, in the slow arm, `extra_host_us` more in the fallback's
    prepare. The second step's kernel is launched only when the host is done: when the host
    takes longer than the GPU's 3 ms, the GPU waits for it."""
    ev, corr, t = [], 0, 0
    tid = 7

    def py(name, ts, dur):
        return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid}

    for _step in range(2):
        corr += 1
        host = 2900 + extra_host_us
        ev.append(py("sglang/srt/managers/scheduler.py(900): event_loop_overlap", t, 100 + host + 50))
        ev.append(py("sglang/srt/managers/scheduler.py(2996): run_batch", t + 10, 90))
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaGraphLaunch",
                "ts": t + 90,
                "dur": 5,
                "tid": tid,
                "args": {"correlation": corr},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "decode_graph_gemm",
                "ts": t + 100,
                "dur": 3000,
                "args": {"correlation": corr},
            }
        )
        gpu_end = t + 3100
        ev.append(
            py("sglang/srt/managers/scheduler_output_processor_mixin.py(400): process_batch_result", t + 100, 2900)
        )
        if extra_host_us:
            ev.append(py("sglang/srt/managers/schedule_batch.py(2286): prepare_for_decode", t + 3000, extra_host_us))
            ev.append(
                py("sglang/srt/speculative/eagle_info_v2.py(89): prepare_for_decode", t + 3010, extra_host_us - 20)
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::_local_scalar_dense",
                    "ts": t + 3020,
                    "dur": extra_host_us - 40,
                    "tid": tid,
                }
            )
        t += 100 + host
    # A queued copy: launched early, started after a gap (waits on another stream).
    corr += 1
    ev.append(
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaMemcpyAsync",
            "ts": 50,
            "dur": 3,
            "tid": tid,
            "args": {"correlation": corr},
        }
    )
    ev.append(
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoH",
            "ts": gpu_end + 50,
            "dur": 10,
            "args": {"correlation": corr},
        }
    )
    return ev


def test_idle_gaps_name_where_the_host_was_when_the_gpu_ran_dry():
    """The arm whose host prepares longer than the GPU step leaves the GPU idle, and the idle
    goes to the frame that kept the host: the spec-v2 prepare, inside the op that blocked."""
    fast = profile.summarize(_frames_trace(0), steps=2)
    slow = profile.summarize(_frames_trace(500), steps=2)
    # Fast arm: the second graph is launched at 3090, the first ended at 3100: no host gap.
    assert "host" not in fast["idle_by_kind_ms_per_step"]
    # Slow arm: the GPU ran dry at 3100 and the next launch came at 3590 (gap 500 us, step 2).
    (where, ms, n), *_ = slow["idle_where_ms_per_step"]
    assert where == ("host: eagle_info_v2.py:prepare_for_decode < prepare_for_decode [aten::_local_scalar_dense]")
    assert abs(ms - 0.25) < 1e-9 and n == 0.5
    # The copy was launched at 50 but ran after the last graph: queued, at its launch.
    queued = [(w, ms) for w, ms, _ in slow["idle_where_ms_per_step"] if w.startswith("queued")]
    assert queued == [("queued: scheduler.py:run_batch < event_loop_overlap [cudaMemcpyAsync]", 0.025)]
    # A trace without launch records (older torch, or none kept) gives no attribution.
    assert "idle_where" not in profile.summarize(_trace()["traceEvents"], steps=2)
    md = profile.markdown({("A0", 64): fast, ("A4", 64): slow})
    assert "A4 against A0 at C=64: +0.250 ms GPU idle per step" in md
    assert (
        "| `host: eagle_info_v2.py:prepare_for_decode < prepare_for_decode [aten::_local_scalar_dense]` "
        "| 0.000 | 0.250 | +0.250 |"
    ) in md


def test_excerpt_keeps_the_middle_steps_whole():
    """The middle of the profiled window, every event overlapping it, thread names, and no
    flow arrows (the viewer's links; the correlation ids are in the events' args)."""
    ev = _frames_trace(500) + [
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "ts": 3000, "id": 1},
        {"ph": "M", "name": "thread_name", "tid": 7, "args": {"name": "scheduler"}},
    ]
    cut = profile.excerpt(ev, steps=2, keep=1)
    assert not [e for e in cut if e.get("ph") == "s"] and [e for e in cut if e.get("ph") == "M"]
    # GPU window 100..7060 (the queued copy ends it): the middle half is 1840..5320.
    kept = {(e["name"], e["ts"]) for e in cut if "ts" in e}
    assert ("decode_graph_gemm", 100) in kept and ("decode_graph_gemm", 3600) in kept  # overlap the cut
    assert ("Memcpy DtoH", 6650) not in kept and ("cudaMemcpyAsync", 50) not in kept
    assert profile.excerpt([], steps=2) == []


def _arms(*specs):
    """The bench's A0 and A1, and --variant arms of A1 from NAME=A1:FIELD=VALUE specs, with
    the fields' types as SGLang's ServerArgs declares them."""
    from spectool.harness.bench.arms import arms, variant

    base = arms(threshold=32)
    types = {
        "speculative_num_steps": "Optional[int]",
        "speculative_eagle_topk": "Optional[int]",
        "speculative_num_draft_tokens": "Optional[int]",
        "speculative_num_steps_tiers": "Optional[List[int]]",
        "speculative_num_steps_tier_boundaries": "Optional[List[int]]",
        "speculative_adaptive": "bool",
        "speculative_adaptive_config": "Optional[str]",
    }
    return {a.name: a for a in base[:2] + [variant(spec, base, types) for spec in specs]}


def test_tokens_per_step_is_the_deepest_draft_any_tier_or_candidate_runs(tmp_path):
    """A step gives a request at most its deepest draft plus the target's token: 1 without
    speculation, steps + 1 on EAGLE-3 (its tiers never deeper), SGLang's own choice where
    the steps are left to it (5 for a Llama target), the largest candidate of an adaptive
    config (per batch-size slot, its file-wide keys skipped, or 0.5.12's one list), and
    SGLang's default config's 7 without one. The tokens SGLang reserves against the context
    are its rule at its largest over the releases: max(top-k x steps, draft tokens)."""
    from spectool.harness.bench.arms import step_tokens

    config = tmp_path / "adaptive.json"
    config.write_text('{"1": {"candidate_steps": [1, 5]}, "64": {"candidate_steps": [0]}, "warmup_batches": 3}')
    flat = tmp_path / "adaptive-0.5.12.json"  # 0.5.12 reads one list for every batch size
    flat.write_text('{"candidate_steps": [1, 2, 6], "warmup_batches": 3}')
    arms = _arms(
        "S2=A1:speculative_num_steps=2;speculative_num_draft_tokens=3",
        "TIER=A1:speculative_num_steps_tiers=3,1,0;speculative_num_steps_tier_boundaries=16,48",
        "AUTO=A1:speculative_num_steps=off;speculative_eagle_topk=off;speculative_num_draft_tokens=off",
        f"UP=A1:speculative_adaptive=true;speculative_adaptive_config={config}",
        "UPD=A1:speculative_adaptive=true",
        "BAD=A1:speculative_adaptive=true;speculative_adaptive_config=/nonexistent.json",
        f"FLAT=A1:speculative_adaptive=true;speculative_adaptive_config={flat}",
    )
    per_step = {name: step_tokens(a).per_step for name, a in arms.items()}
    assert per_step == {"A0": 1, "A1": 4, "S2": 3, "TIER": 4, "AUTO": 6, "UP": 6, "UPD": 8, "BAD": 8, "FLAT": 7}
    # From 0.5.14 SGLang reserves an adaptive engine's largest candidate + 1 draft tokens.
    reserved = {name: step_tokens(a).reserved for name, a in arms.items()}
    assert reserved == {"A0": 0, "A1": 4, "S2": 3, "TIER": 4, "AUTO": 20, "UP": 6, "UPD": 8, "BAD": 8, "FLAT": 7}


def test_a_profile_load_outlasts_its_steps_at_the_longest_chain():
    """One load for every arm, sized for the arm that finishes a request in fewest
    steps (EAGLE-3's 4 tokens a step), with 16 spare steps: a wave of 1024 tokens holds 30
    steps, 300 need 1265 tokens; lockstep waves of 128 tokens last 32 steps each, so 260
    steps take 9 waves and one more; the staggered load as many rounds per client. Plain
    decoding alone needs fewer."""
    from spectool.harness.bench.sweep import _requests_for, profile_out_len, profile_requests

    # EAGLE-3 beside plain decoding: 4 tokens a step, 4 reserved; plain decoding alone: 1, 0.
    assert profile_out_len("wave", 30, 128, 1024, 4, 4, 8192) == 1024
    assert profile_out_len("wave", 300, 128, 1024, 4, 4, 8192) == 316 * 4 + 1
    assert profile_out_len("lockstep", 260, 128, 128, 4, 4, 8192) == 128, "the given length elsewhere"
    assert profile_requests(64, "wave", 300, 1265, 4) == 64
    assert profile_requests(64, "lockstep", 260, 128, 4) == 64 * 10
    assert profile_requests(64, "lockstep", 260, 128, 1) == 64 * 4  # 127 steps a wave: 3 and one more
    assert profile_requests(64, "staggered", 260, 128, 4) == 64 * 10
    assert profile_requests(64, "staggered", 30, 128, 1) == _requests_for(64, "staggered"), "at least the sweep's"


def test_a_profile_that_cannot_fit_the_targets_context_is_refused_with_what_fits():
    """SGLang refuses a request whose prompt, output and reserved draft tokens pass the
    context: such a profile is refused before any engine starts, with the most steps a wave
    holds (8192 - 128 - 4 = 8060 output tokens: 2014 steps at 4 tokens, less 16 spare) or
    the longest --out-len of the other loads."""
    from spectool.errors import BadInputError
    from spectool.harness.bench.sweep import profile_out_len

    with pytest.raises(BadInputError, match="profile at most 1998 steps in a wave, or use --profile-load lockstep"):
        profile_out_len("wave", 2100, 128, 1024, 4, 4, 8192)
    assert profile_out_len("wave", 1998, 128, 1024, 4, 4, 8192) <= 8192 - 128 - 4
    with pytest.raises(BadInputError, match="give --out-len 8060 or less"):
        profile_out_len("staggered", 30, 128, 8100, 4, 4, 8192)


COPY, INDEX = "Memcpy DtoD (Device -> Device)", "void at::native::index_elementwise_kernel<128, 4>"


def _decode_steps(between: list[str], steps: int = 4, forward_us: int = 5000) -> list[dict]:
    """`steps` decode steps as SGLang annotates them on the GPU (`step[DECODE bs=64]`, the
    forward's span), one graph kernel filling each forward, and after it the kernels named in
    `between`, 4 us each, one every 10 us; the next step starts 20 us after the last."""
    ev, t = [], 0
    period = forward_us + 10 * len(between) + 20
    for _ in range(steps):
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": "step[DECODE bs=64]", "ts": t, "dur": forward_us})
        ev.append({"ph": "X", "cat": "kernel", "name": "decode_graph_gemm", "ts": t, "dur": forward_us})
        for j, name in enumerate(between):
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            ev.append({"ph": "X", "cat": cat, "name": name, "ts": t + forward_us + 10 * j, "dur": 4})
        t += period
    return ev


def test_step_anatomy_takes_a_decode_step_apart_between_two_forwards():
    """Between two forwards of the model plain decoding runs 5 small kernels, the fallback 14
    (7 more copies, 2 more index kernels): the forward is the same, the step longer by the
    kernels between; the markdown names the kernels that differ."""
    a0 = profile.summarize(_decode_steps([COPY] + ["fill"] * 4), steps=4)["anatomy"]
    a4_ev = _decode_steps([COPY] * 8 + [INDEX] * 2 + ["fill"] * 4)
    a4 = profile.summarize(a4_ev, steps=4)["anatomy"]
    assert (a0["steps"], a0["between_kernels"], a4["between_kernels"]) == (3, 5, 14)
    assert a0["forward_ms"] == a4["forward_ms"] == 5.0
    assert (a0["interval_ms"], a4["interval_ms"]) == (5.07, 5.16) and a0["interval_mean_ms"] == 5.07
    assert (a0["between_ms"], a4["between_ms"]) == (0.07, 0.16)
    assert (a0["between_busy_ms"], a4["between_busy_ms"]) == (0.02, 0.056)
    assert a4["between_by_kernel"] == {COPY: 8, INDEX: 2, "fill": 4} and a0["between_by_kernel"] == {COPY: 1, "fill": 4}
    assert "anatomy" not in profile.summarize(a4_ev[:3], steps=1), "one annotated step has no interval"
    md = profile.markdown(
        {
            ("A0", 64, 1): profile.summarize(_decode_steps([COPY] + ["fill"] * 4), steps=4),
            ("A4", 64, 1): profile.summarize(a4_ev, steps=4),
        }
    )
    assert "| A0 | 64 (wave 2) | 3 | 5.000 | 5.070 (5.070) | 0.070 | 5 | 0.020 |" in md
    assert "A4 against A0 at C=64 (wave 2): the kernels between two forwards that differ" in md
    assert f"| `{COPY}` | 1.00 | 8.00 |" in md and f"| `{INDEX}` | 0.00 | 2.00 |" in md


def _prefills(target_us: int, draft_us: int | None, chunks=(8192, 4096), gap_us: int = 20) -> list[dict]:
    """Prefills as SGLang annotates every model runner's forward on the GPU (`step[EXTEND bs=N
    toks=T]`): per chunk the target's forward, then (`draft_us` given) the draft's extend of the
    same prompts under the same label, `gap_us` later; then a decode step 20 us after."""
    ev, t = [], 0

    def span(name, dur):
        nonlocal t
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "ts": t, "dur": dur})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t, "dur": dur})
        t += dur + gap_us

    for toks in chunks:
        span(f"step[EXTEND bs=64 toks={toks}]", target_us)
        if draft_us:
            span(f"step[EXTEND bs=64 toks={toks}]", draft_us)
        span("step[DECODE bs=64]", 5000)
    return ev


def test_prefill_anatomy_tells_the_targets_forward_from_the_drafts_extend():
    """An EAGLE prefill is the target's forward then the draft's extend under the same label:
    per prefill both, the whole, and the wait before the next step. An engine whose draft
    extend takes 9 ms more shows it there, with the same target forward; one without a draft
    (plain decoding) has none, and two chunks of one label are two prefills, not a target and
    its draft."""
    fast = profile.summarize(_prefills(40_000, 3_000), steps=2)["prefill"]
    slow = profile.summarize(_prefills(40_000, 12_000), steps=2)["prefill"]
    assert (fast["prefills"], fast["tokens"], fast["forward_ms"]) == (2, 6144, 40.0)
    assert fast["forward_ms_per_1k_tokens"] == slow["forward_ms_per_1k_tokens"] == 80_000 / 12288
    assert (fast["draft_ms"], slow["draft_ms"]) == (3.0, 12.0)
    assert (fast["prefill_ms"], slow["prefill_ms"]) == (43.02, 52.02)
    assert fast["after_ms"] == slow["after_ms"] == 0.02 and fast["after_busy_ms"] == 0.0
    plain = profile.summarize(_prefills(40_000, None, chunks=(8192, 8192)), steps=2)["prefill"]
    assert (plain["prefills"], plain["draft_ms"], plain["prefill_ms"]) == (2, None, 40.0)
    chunked = _prefills(40_000, None, chunks=(8192,))[:2] + [
        dict(e, ts=e["ts"] + 40_020) for e in _prefills(40_000, None, chunks=(8192,))
    ]  # two chunks of one label back to back, then a decode step
    assert profile.summarize(chunked, steps=1)["prefill"]["prefills"] == 2
    assert "prefill" not in profile.summarize(_decode_steps(["fill"]), steps=4)
    md = profile.markdown(
        {
            ("A1", 128): profile.summarize(_prefills(40_000, 3_000), steps=2),
            ("TIER", 128): profile.summarize(_prefills(40_000, 12_000), steps=2),
        }
    )
    assert "| TIER | 128 | 2 | 6144 | 40.000 | 6.510 | 12.000 | 52.020 | 0.020 | 0.000 |" in md


def test_excerpts_are_read_back_by_arm_c_and_wave(tmp_path):
    """The excerpts a profile leaves (ARM-C64 for the first profile of a C, ARM-C64-2 for the
    second on the same engines) are reduced again by the current code, keyed like the run's
    own rows; other files in the folder are not excerpts."""
    import gzip
    import json

    cuts = tmp_path / "excerpts"
    cuts.mkdir()
    for arm, k, between in (("A0", 0, [COPY]), ("A0", 1, [COPY] * 2), ("A4", 1, [COPY] * 9)):
        name = profile.excerpt_name(arm, 64, k)
        (cuts / name).write_bytes(gzip.compress(json.dumps({"traceEvents": _decode_steps(between, steps=2)}).encode()))
    (cuts / "notes.txt").write_text("not a trace")
    rows = profile.reread_excerpts(tmp_path)
    assert sorted(rows) == [("A0", 64, 0), ("A0", 64, 1), ("A4", 64, 1)]
    assert profile.excerpt_name("A4", 64, 1) == "A4-C64-2.trace.json.gz"
    assert [rows[key]["anatomy"]["between_kernels"] for key in sorted(rows)] == [1, 2, 9]


def test_the_engines_of_a_bench_and_a_profile_share_one_kv_pool_size():
    """One function sizes the KV pool for the sweep and the profile alike, and the engines'
    lifecycle stays a context manager (a helper placed under its decorator once took it)."""
    import contextlib
    import inspect

    from spectool.harness.bench import engines, sweep

    assert engines.kv_pool_tokens(64, 128, 128) == 64 * (128 + 128 + 16) + 4096
    assert isinstance(engines.kv_pool_tokens(1, 1, 1), int)
    assert inspect.isgeneratorfunction(engines.start.__wrapped__)
    assert isinstance(engines.start([], None, {}, 1, 1), contextlib.AbstractContextManager)
    src = inspect.getsource(sweep)
    assert src.count("kv_pool_tokens(max_bs, prompt_len, out_len)") == 2 and "+ 16) + 4096" not in src.replace(
        inspect.getsource(engines.kv_pool_tokens), ""
    )
