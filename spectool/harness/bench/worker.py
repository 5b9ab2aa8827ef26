"""One benchmark arm in its own process: start the engine, then serve load commands.

Commands arrive as JSON lines on stdin; each names a file where the result is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time

from ..verify.compare import stats_window  # the fallback's counters, read and differenced as verify does
from ..verify.engine_worker import settled_stats
from . import gpuclock, hostload
from .analyze import quantile  # the spreads' convention, shared with the intervals


async def closed_loop(
    engine,
    C: int,
    n: int,
    prompt_len: int,
    out_len: int,
    seed: int,
    vocab: int,
    stagger: bool = False,
    min_window_s: float = 0.5,
    on_steady=None,
) -> dict:
    """C requests in flight until n are done; throughput over a steady-state window.

    Lockstep (the default): with equal output lengths, C clients started together move in
    waves: a prefill of C prompts at once, then pure decode; completions and submissions
    coincide, so there is no steady window and the whole run is measured (on the H200 every
    cell from C=8 up). `stagger` breaks
    the lockstep: client k first serves an unmeasured ramp request cut to
    out_len * (k + 1) / C tokens, so the clients' full-length requests start spread over one
    request lifetime, as in serving with continuous arrivals (on SGLang 0.5.12 that puts a
    small eager prefill between nearly every two decode steps: docs/bench.md). The
    window then runs from the last ramp completion to the last submission (drain excluded);
    without `stagger`, from the first completion. Too short a window (under `min_window_s`)
    falls back to the whole run. `on_steady` (a coroutine function) is started once the load
    is steady: when the last ramp request completes, or without `stagger` when the first
    wave's prefills are done (each of its requests has its first token)."""
    rng = random.Random(seed)
    ramp = [max(1, out_len * (k + 1) // C) for k in range(C)] if stagger else []
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(prompt_len)] for _ in range(n + len(ramp))]
    nxt, recs, ramp_ends, steady = 0, [], [], []
    unprefilled = 0 if stagger else min(C, n)  # the first wave's requests still without a first token

    def steady_now():
        if on_steady is not None:
            steady.append(asyncio.ensure_future(on_steady()))

    cpu0 = hostload.cpu_times()
    gpu = gpuclock.Sampler().start()
    t0 = time.perf_counter()
    last_submit = [t0]

    async def request(prompt, max_new_tokens) -> dict:
        nonlocal unprefilled
        # Streamed with an interval past the output length, so SGLang sends exactly two
        # chunks: the first token (len(output_ids) % interval == 1) and the finished request.
        # TTFT and TPOT are then clocked here. (meta_info's decode_throughput times decode from
        # the first chunk SGLang happens to send; a request that is not streamed is first sent
        # at token SGLANG_FORCE_STREAM_INTERVAL, 50, so it read TPOT about 0.6x too short and
        # TTFT too long, and at a spec step's stride rather than per token.)
        start = time.perf_counter()
        chunks = await engine.async_generate(
            input_ids=prompt,
            stream=True,
            sampling_params={
                "temperature": 0.0,
                "max_new_tokens": max_new_tokens,
                "ignore_eos": True,
                "stream_interval": max_new_tokens + 1,
            },
        )
        first, out = None, {}
        async for out in chunks:  # noqa: B007 - the last chunk is read after the loop
            if first is None:
                first = time.perf_counter()
                if unprefilled:
                    unprefilled -= 1
                    if not unprefilled:
                        steady_now()
        end = time.perf_counter()
        m = out.get("meta_info", {})
        tokens = m.get("completion_tokens") or len(out.get("output_ids", []))
        ttft = (first or end) - start
        tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 and end > first else None
        return {
            "start": start,
            "end": end,
            "tokens": tokens,
            "tpot": tpot,
            "ttft": ttft,
            "accept": m.get("spec_accept_length"),
        }

    async def client(k):
        nonlocal nxt
        if stagger:
            r = await request(prompts[n + k], ramp[k])
            ramp_ends.append(r["end"])
            recs.append({**r, "ramp": True})
            if len(ramp_ends) == C:
                steady_now()
        while nxt < n:
            i = nxt
            nxt += 1
            last_submit[0] = time.perf_counter()
            recs.append(await request(prompts[i], out_len))

    try:
        await asyncio.gather(*(client(k) for k in range(C)))
    finally:  # a load that fails leaves no thread sampling behind it
        clocks = gpu.stop()
    t_end = time.perf_counter()
    cpu1 = hostload.cpu_times()
    await asyncio.gather(*steady)
    measured = [r for r in recs if not r.get("ramp")]
    w0 = max(ramp_ends) if stagger else min((r["end"] for r in measured), default=t0)
    w1 = last_submit[0]
    if w1 - w0 < min_window_s:  # too few requests for a window: use the whole run
        w0, w1 = t0, t_end
    produced = 0.0
    for r in recs:  # tokens spread evenly over each request's decode time
        a = r["start"] + (r["ttft"] or 0.0)
        b = r["end"]
        if b <= a:
            continue
        overlap = max(0.0, min(b, w1) - max(a, w0))
        produced += r["tokens"] * overlap / (b - a)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    accepts = [r["accept"] for r in measured if r["accept"]]
    ttfts = sorted(r["ttft"] for r in measured if r["ttft"] is not None)
    return {
        "C": C,
        "n": n,
        "output_tok_s": produced / (w1 - w0),
        "window_s": w1 - w0,
        "wall_s": t_end - t0,
        "overall_tok_s": sum(r["tokens"] for r in recs) / (t_end - t0),
        "tpot_ms": (med([r["tpot"] for r in measured if r["tpot"]]) or 0) * 1e3 or None,
        "ttft_ms": (med(ttfts) or 0) * 1e3 or None,
        # The spread of first tokens within the waves: a wave whose prompts reach the
        # scheduler in pieces shows it here (a late piece waits for the steps before it;
        # one of more than a tenth of the requests moves p90 or p10, any moves the max).
        **ttft_spread_ms(ttfts),
        "acceptance": statistics.mean(accepts) if accepts else None,
        "stagger": stagger,
        # The host's busy CPUs over the whole run, this engine's own processes included.
        "host_busy_cpus": hostload.busy_cpus(cpu0, cpu1),
        "host_cpus": os.cpu_count(),
        # The GPU's SM clock, power and temperature over the run (gpuclock; none without NVML).
        **clocks,
    }


def ttft_spread_ms(ttfts: list[float]) -> dict:
    """10th and 90th percentile and maximum of the sorted TTFTs (seconds), in ms."""
    if not ttfts:
        return {}
    return {
        "ttft_p10_ms": quantile(ttfts, 0.1) * 1e3,
        "ttft_p90_ms": quantile(ttfts, 0.9) * 1e3,
        "ttft_max_ms": ttfts[-1] * 1e3,
    }


async def phases(engine, schedule: list[dict], prompt_len: int, out_len: int, seed: int, vocab: int) -> list[dict]:
    out = []
    for i, ph in enumerate(schedule):
        r = await closed_loop(engine, ph["C"], ph["n"], prompt_len, out_len, seed + i, vocab)
        out.append({**ph, **r})
    return out


async def profiled(
    engine,
    C: int,
    n: int,
    prompt_len: int,
    out_len: int,
    seed: int,
    vocab: int,
    steps: int,
    out_dir: str,
    stagger: bool = False,
) -> dict:
    """SGLang's own profiler records `steps` forward steps (CPU and GPU activity) into
    `out_dir`, during a closed loop of `n` requests, from the moment the load is steady
    (closed_loop's on_steady): in waves, once the first wave's prefills are done; staggered,
    from the end of its ramp (decode steps and the prefills of arriving requests in their
    serving mix). The load must outlast the steps (sweep.profile_requests sizes it):
    SGLang writes the trace at the first forward step past them, so a load that ends sooner
    leaves the profiler waiting. It is then stopped, which writes what it has, and the result
    says so (`profile_stopped_early`), so that no later load is profiled by accident. Only a
    trace this load wrote counts: SGLang names each by its start time."""
    from ..engine_compat import start_profile
    from .profile import trace_files

    def start():
        return start_profile(
            engine.tokenizer_manager,
            output_dir=out_dir,
            num_steps=steps,
            activities=["CPU", "GPU"],
            with_stack=False,
            record_shapes=False,
        )

    before = set(trace_files(out_dir))
    res = await closed_loop(engine, C, n, prompt_len, out_len, seed, vocab, stagger=stagger, on_steady=start)
    if not set(trace_files(out_dir)) - before:
        try:
            await engine.tokenizer_manager.stop_profile()
        except RuntimeError:  # not in progress: it never started
            pass
        res["profile_stopped_early"] = True
    return res


# An engine's first load at a concurrency often runs slower: on the H200, A1's rep 0 was
# 0.64-0.92 of its reps 1-2 at every C up to 64, with TTFTs up to 1.8x; a short unmeasured wave absorbs it.
WARMUP_OUT_LEN = 16
# Warm-up waves draw their prompts from seeds above every measured load's (sweep._requests_for,
# the transition's rounds), so none puts a measured prompt in the radix cache.
WARMUP_SEEDS = 10**9


def handle(engine, cmd: dict, job: dict, loop, vocab: int) -> dict:
    """One load command: the fallback counters read (once the engine's steps before are all in
    the stats file), an unmeasured short wave at the load's first concurrency, the
    measurement, and the counters' difference over both.

    The wave runs right before every load, after the counters are read: reading them waits up
    to a second on engines with a stats file (the arms with a threshold) and on no other, so
    without it those engines alone would meet each load idle. The counters include the
    wave's steps, which run at the load's concurrency."""
    before = settled_stats(job.get("stats_path"))
    C = cmd["C"] if "C" in cmd else cmd["schedule"][0]["C"]
    loop.run_until_complete(
        closed_loop(engine, C, C, cmd["prompt_len"], WARMUP_OUT_LEN, WARMUP_SEEDS + cmd["seed"], vocab)
    )
    if cmd["kind"] == "profile":
        res = loop.run_until_complete(
            profiled(
                engine,
                cmd["C"],
                cmd["n"],
                cmd["prompt_len"],
                cmd["out_len"],
                cmd["seed"],
                vocab,
                cmd["steps"],
                cmd["dir"],
                stagger=cmd.get("stagger", False),
            )
        )
    elif cmd["kind"] == "point":
        res = loop.run_until_complete(
            closed_loop(
                engine,
                cmd["C"],
                cmd["n"],
                cmd["prompt_len"],
                cmd["out_len"],
                cmd["seed"],
                vocab,
                stagger=cmd.get("stagger", False),
            )
        )
    else:
        res = {
            "phases": loop.run_until_complete(
                phases(engine, cmd["schedule"], cmd["prompt_len"], cmd["out_len"], cmd["seed"], vocab)
            )
        }
    after = settled_stats(job.get("stats_path"))
    if before or after:
        window = stats_window(before, after)
        fb, sp = window["fallback_steps"], window["spec_steps"]
        res["fallback_steps"], res["spec_steps"] = fb, sp
        res["spec_fraction"] = sp / (fb + sp) if fb + sp else None
        if cmd["kind"] == "phases":  # whether the schedule switched the engine at all
            res["switches"] = {
                "fallback": window["switches_to_fallback"] + window["switches_to_spec"],
                "tiers": window["tier_switches"],
            }
    return res


def main() -> int:
    job = json.loads(sys.argv[1])
    if job.get("stats_path"):
        # A file left by an earlier run must not be read as this engine's counters.
        if os.path.exists(job["stats_path"]):
            os.remove(job["stats_path"])
        os.environ["SPECTOOL_FALLBACK_STATS"] = job["stats_path"]
    import sglang

    t = time.perf_counter()
    from ..engine_compat import adapt, server_arg_fields

    engine = sglang.Engine(**adapt(job["engine"], server_arg_fields()))
    ready = {"ready": True, "startup_s": time.perf_counter() - t}
    # Written whole, then renamed: the sweep reads the file as soon as it exists.
    partial = job["ready_path"] + ".partial"
    with open(partial, "w") as f:
        json.dump(ready, f)
    os.replace(partial, job["ready_path"])
    loop = asyncio.get_event_loop()
    vocab = job.get("vocab", 128256)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        res = handle(engine, cmd, job, loop, vocab)
        tmp = cmd["result_path"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, cmd["result_path"])
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
