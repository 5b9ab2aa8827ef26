"""The bench worker's load generator against engines that decode at a fixed rate (no GPU),
on an event loop with a virtual clock (the measurements do not depend on the machine's load):
closed-loop concurrency, the steady-state window, and the unmeasured warm-up wave at the
first visit of a concurrency."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from spectool.harness.bench import worker


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: when no callback is ready it moves its clock to the next
    live timer, so every sleep of the stand-in engines lasts exactly its nominal time, however
    busy the machine is, and takes none of it."""

    def __init__(self):
        super().__init__()
        self._now = 0.0

    def time(self):
        return self._now

    def _run_once(self):
        if not self._ready:
            live = [h.when() for h in self._scheduled if not h.cancelled()]
            if live:
                self._now = max(self._now, min(live))
        super()._run_once()


class LoopClock:
    """The worker's `time`: its clock read from the running loop's virtual time."""

    def perf_counter(self):
        return asyncio.get_running_loop().time()


@pytest.fixture(autouse=True)
def virtual_time(monkeypatch):
    monkeypatch.setattr(worker, "time", LoopClock())


def _loop():
    return VirtualClockLoop()


class TimedEngine:
    """Serves each request in ttft + tokens * tpot seconds; records concurrency and requests."""

    def __init__(self, tpot=0.002, ttft=0.01):
        self.tpot, self.ttft = tpot, ttft
        self.in_flight = self.peak = 0
        self.requests = []

    async def async_generate(self, input_ids, sampling_params, stream=False):
        """As SGLang streams with an interval past the output length: the first token after
        ttft, then the finished request (non-streamed requests are not what the worker sends)."""
        assert stream and sampling_params["stream_interval"] > sampling_params["max_new_tokens"]
        self.requests.append((len(input_ids), sampling_params["max_new_tokens"]))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        n = sampling_params["max_new_tokens"]

        async def chunks():
            await asyncio.sleep(self.ttft)
            yield {"output_ids": [1], "meta_info": {"completion_tokens": 1}}
            await asyncio.sleep((n - 1) * self.tpot)
            self.in_flight -= 1
            yield {"output_ids": [1] * n, "meta_info": {"completion_tokens": n}}

        return chunks()


def test_closed_loop_keeps_c_in_flight_and_measures_the_rate():
    eng = TimedEngine()
    loop = _loop()
    try:
        res = loop.run_until_complete(worker.closed_loop(eng, 4, 12, 8, 50, 0, 1000))
    finally:
        loop.close()
    assert eng.peak == 4 and len(eng.requests) == 12 and res["n"] == 12
    # Three waves of 4 requests, each 10 ms to the first token and 49 x 2 ms to the 50th:
    # lockstep leaves no window, so the whole run is measured, 600 tokens in 0.324 s.
    assert res["window_s"] == res["wall_s"] == pytest.approx(0.324), res
    assert res["output_tok_s"] == pytest.approx(600 / 0.324), res
    # Clocked from the two streamed chunks: 10 ms to the first token, then 2 ms per token.
    assert res["tpot_ms"] == pytest.approx(2.0) and res["ttft_ms"] == pytest.approx(10.0), res


def test_ttft_and_tpot_are_clocked_from_the_first_chunk():
    """A slow first token shows as TTFT, not as TPOT: SGLang's own decode_throughput (timed
    from whichever chunk it sent first) read TPOT 0.6x too short for non-streamed requests."""
    eng = TimedEngine(tpot=0.001, ttft=0.08)
    loop = _loop()
    try:
        res = loop.run_until_complete(worker.closed_loop(eng, 2, 4, 8, 40, 0, 1000))
    finally:
        loop.close()
    assert res["ttft_ms"] == pytest.approx(80.0) and res["tpot_ms"] == pytest.approx(1.0), res


class SplitWaveEngine(TimedEngine):
    """Every other request of a wave reaches its first token `late` seconds after the others,
    as when a wave's prompts reach the scheduler in two pieces."""

    def __init__(self, late, **kw):
        super().__init__(**kw)
        self.late, self.count = late, 0

    async def async_generate(self, input_ids, sampling_params, stream=False):
        self.count += 1
        late = self.late if self.count % 2 == 0 else 0.0
        n = sampling_params["max_new_tokens"]

        async def chunks():
            await asyncio.sleep(self.ttft + late)
            yield {"output_ids": [1], "meta_info": {"completion_tokens": 1}}
            await asyncio.sleep((n - 1) * self.tpot)
            yield {"output_ids": [1] * n, "meta_info": {"completion_tokens": n}}

        return chunks()


def test_the_ttft_spread_shows_a_wave_served_in_two_pieces():
    """The median alone hides which requests waited: the percentiles show the late piece."""
    res = _run(worker.closed_loop(SplitWaveEngine(late=0.06, tpot=0.0005, ttft=0.01), 8, 16, 8, 20, 0, 1000))
    assert res["ttft_p10_ms"] == pytest.approx(10.0) and res["ttft_p90_ms"] == pytest.approx(70.0), res
    assert res["ttft_max_ms"] == pytest.approx(70.0) and res["ttft_ms"] == pytest.approx(40.0), res
    res = _run(worker.closed_loop(TimedEngine(tpot=0.0005, ttft=0.01), 8, 16, 8, 20, 0, 1000))
    assert res["ttft_p10_ms"] == pytest.approx(res["ttft_p90_ms"]) == pytest.approx(10.0), res


def test_every_load_follows_an_unmeasured_wave_on_every_engine_alike(tmp_path, monkeypatch):
    """The counters are read first (from writes of the stats file made after the read: the
    engine rewrites it periodically with the time of the write, a writer thread stands in for
    it here), then a wave of C short requests runs right before the load, so an engine whose
    counters take a second to settle meets the load as busy as one without counters. With no
    stats file the same wave runs. A transition's wave runs at its first phase's C."""
    import threading
    import time

    eng = TimedEngine(tpot=0.0005, ttft=0.001)
    stats = tmp_path / "stats.json"
    done = threading.Event()
    reads = []

    def write_stats():
        tmp = tmp_path / "stats.tmp"
        tmp.write_text(json.dumps({"fallback_steps": 5, "spec_steps": 7, "written_at": time.time()}))
        tmp.replace(stats)

    def keep_writing():
        while not done.wait(0.01):
            write_stats()

    real_settled = worker.settled_stats

    def settled(path):
        reads.append(len(eng.requests))  # requests sent when the counters were read
        return real_settled(path)

    monkeypatch.setattr(worker, "settled_stats", settled)

    write_stats()  # as the engine does before it is ready
    writer = threading.Thread(target=keep_writing)
    writer.start()
    loop = _loop()
    point = {"kind": "point", "C": 4, "n": 8, "prompt_len": 8, "out_len": 32, "seed": 1}
    try:
        first = worker.handle(eng, point, {"stats_path": str(stats)}, loop, 1000)
        assert reads == [0, 12], "read before the wave and after the load"
        assert [r[1] for r in eng.requests] == [worker.WARMUP_OUT_LEN] * 4 + [32] * 8
        assert first["n"] == 8 and first["spec_fraction"] is None  # the counters did not move
        eng.requests.clear()
        worker.handle(eng, {**point, "seed": 2}, {}, loop, 1000)  # no stats file: the same wave
        assert [r[1] for r in eng.requests] == [worker.WARMUP_OUT_LEN] * 4 + [32] * 8
        eng.requests.clear()
        schedule = [{"C": 2, "n": 4}, {"C": 4, "n": 8}]
        phases = {"kind": "phases", "schedule": schedule, "prompt_len": 8, "out_len": 32, "seed": 3}
        worker.handle(eng, phases, {}, loop, 1000)
        assert [r[1] for r in eng.requests[:3]] == [worker.WARMUP_OUT_LEN] * 2 + [32]
        # With counters, a schedule records the switches the engine counted over it.
        res = worker.handle(eng, phases, {"stats_path": str(stats)}, loop, 1000)
        assert res["switches"] == {"fallback": 0, "tiers": 0}
    finally:
        loop.close()
        done.set()
        writer.join()


class BatchEngine:
    """A continuous-batching server in miniature: arrivals wait for a prefill step (decode
    pauses for it, as in SGLang without mixed chunks), then every running request gains one
    token per decode step."""

    def __init__(self, step=0.002, prefill=0.003):
        self.step, self.prefill = step, prefill
        self.waiting, self.running, self.task = [], [], None
        self.finish_steps = []  # how many requests finished at each step that finished any

    async def async_generate(self, input_ids, sampling_params, stream=False):
        assert stream, "the worker streams: the first token and the finished request"
        loop = asyncio.get_running_loop()
        req = {
            "want": sampling_params["max_new_tokens"],
            "got": 0,
            "first": loop.create_future(),
            "fut": loop.create_future(),
        }
        self.waiting.append(req)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._serve())

        async def chunks():
            yield await req["first"]
            yield await req["fut"]

        return chunks()

    async def _serve(self):
        while self.waiting or self.running:
            if self.waiting:
                new, self.waiting = self.waiting, []
                await asyncio.sleep(self.prefill)
                self.running += new
            else:
                await asyncio.sleep(self.step)
            for r in self.running:
                r["got"] += 1
                if r["got"] == 1:
                    r["first"].set_result({"output_ids": [1], "meta_info": {"completion_tokens": 1}})
            done = [r for r in self.running if r["got"] >= r["want"]]
            self.running = [r for r in self.running if r["got"] < r["want"]]
            if done:
                self.finish_steps.append(len(done))
            for r in done:
                r["fut"].set_result({"output_ids": [1] * r["want"], "meta_info": {"completion_tokens": r["want"]}})
            await asyncio.sleep(0)


def _run(coro):
    loop = _loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_lockstep_waves_leave_no_window_and_the_staggered_ramp_does():
    """Equal output lengths from C clients started together finish together: every wave's
    prefill at once and no steady window (the whole run is measured, as on the H200 from C=8
    up). The staggered ramp spreads completions, measures a window that excludes the ramp
    and the drain, and reaches the decode rate of C requests per step."""
    C, out_len, n = 8, 40, 48
    lock = BatchEngine()
    res = _run(worker.closed_loop(lock, C, 2 * C, 4, out_len, 0, 1000, min_window_s=0.05))
    assert res["window_s"] == res["wall_s"] and max(lock.finish_steps) == C, "lockstep: whole waves"
    stag = BatchEngine()
    res = _run(worker.closed_loop(stag, C, n, 4, out_len, 0, 1000, stagger=True, min_window_s=0.05))
    assert res["stagger"] and res["n"] == n
    assert res["window_s"] < 0.8 * res["wall_s"], "ramp and drain left out"
    assert max(stag.finish_steps[C:]) <= 2, "completions spread over the steps"
    ideal = C / stag.step
    assert 0.85 * ideal < res["output_tok_s"] <= ideal, (res["output_tok_s"], ideal)


def test_a_staggered_cell_measures_about_two_request_lifetimes():
    """--load staggered: the requests per cell give a steady window of about two request lifetimes at
    every C, ramp and drain left out (at 2C it was 1.2-1.6)."""
    from spectool.harness.bench.sweep import _requests_for

    out_len, step = 40, 0.002
    for C in (16, 64):
        res = _run(
            worker.closed_loop(
                BatchEngine(step=step),
                C,
                _requests_for(C, "staggered"),
                4,
                out_len,
                0,
                1000,
                stagger=True,
                min_window_s=0.05,
            )
        )
        lifetimes = res["window_s"] / (out_len * step)
        assert 1.8 < lifetimes < 4, (C, lifetimes)


def _tokenizer_manager(tree, on_send):
    """SGLang's TokenizerManager of the release `tree` with its own start_profile and the
    profile FanOutCommunicator it sends through: the scheduler side is a fake zmq socket
    that hands each sent request to `on_send` and answers it with a successful
    ProfileReqOutput, as a scheduler of one rank does. Its event-loop start-up (zmq and
    signal handlers) is shadowed on the object: there is no scheduler process."""
    import collections
    import copy
    import enum
    import os
    import socket
    import time
    import typing

    from spectool.testing import load_function

    from .sglang_source import release_class, release_instance, release_type

    io = "sglang/srt/managers/io_struct.py"
    ns = {"Enum": enum.Enum}
    profile_type = release_class(tree, io, "ProfileReqType", ns)
    base = release_class(tree, io, "BaseReq", ns)
    req_ns = {"BaseReq": base, "ProfileReqType": profile_type}
    profile_req = release_class(tree, io, "ProfileReq", req_ns)
    output = release_class(tree, io, "ProfileReqOutput", req_ns)
    communicator_cls = release_class(
        tree,
        "sglang/srt/managers/communicator.py",
        "FanOutCommunicator",
        {"T": typing.TypeVar("T"), "asyncio": asyncio, "copy": copy, "deque": collections.deque},
    )
    utils = tree / "sglang/srt/utils/common.py"
    manager_ns = {
        "time": time,
        "socket": socket,  # a default argument of one of its methods
        "ProfileReq": profile_req,
        "ProfileReqType": profile_type,
        "get_bool_env_var": load_function(utils, "get_bool_env_var", {"os": os, "_warned_bool_env_var_keys": set()}),
    }
    manager = release_instance(release_type(tree, "TokenizerManager", manager_ns), auto_create_handle_loop=lambda: None)

    class Socket:  # zmq's socket, to the scheduler
        def send_pyobj(self, req):
            on_send(req)
            asyncio.get_running_loop().call_soon(communicator.handle_recv, output(success=True, message=""))

    communicator = communicator_cls(Socket(), 1)
    # init_communicators sets one `NAME_communicator` per entry of the release's list.
    assert '("profile", ProfileReqOutput)' in (tree / "sglang/srt/managers/tokenizer_control_mixin.py").read_text()
    manager.profile_communicator = communicator
    return manager, profile_type


def _profile_calls(tree, on_send=lambda req: None, **kw):
    """worker.profiled on a BatchEngine of 8 clients, 16 requests of 40 tokens and 30 steps,
    its profiler started and stopped through the release's own TokenizerManager: what reached
    the scheduler's socket (the loop's time, the requests then running, the request), the
    result and the engine. `on_send` sees each request as the scheduler would."""
    eng = BatchEngine()
    calls = []

    def send(req):
        calls.append((asyncio.get_running_loop().time(), len(eng.running), req))
        on_send(req)

    eng.tokenizer_manager, profile_type = _tokenizer_manager(tree, send)
    loop = _loop()
    try:
        res = loop.run_until_complete(worker.profiled(eng, 8, 16, 4, 40, 0, 1000, 30, **kw))
    finally:
        loop.close()
    return calls, profile_type, res, eng


@pytest.mark.network
def test_staggered_profile_starts_when_the_ramp_is_done(cached_release, tmp_path):
    """`--profile-load staggered`: SGLang's profiler is started once, when the last ramp request
    completes, while the measured requests still run, so the profiled steps are the steady
    serving mix (decode steps and the prefills of arriving requests). The profiler is started
    through 0.5.12's own TokenizerManager.start_profile, whose START_PROFILE request reaches
    the scheduler's socket with the worker's settings."""
    calls, profile_type, res, _ = _profile_calls(cached_release("0.5.12"), out_dir=str(tmp_path), stagger=True)
    start = calls[0][2]
    assert start.num_steps == 30 and start.output_dir == str(tmp_path) and start.type == profile_type.START_PROFILE
    assert calls[0][1] >= 6, "started while the load is still at (about) C in flight"
    # No scheduler writes a trace here: the one other request is the stop after the load.
    assert [c[2].type.name for c in calls] == ["START_PROFILE", "STOP_PROFILE"] and res["profile_stopped_early"]
    assert res["stagger"] and res["n"] == 16


@pytest.mark.network
def test_a_wave_profile_starts_right_after_the_first_waves_prefill(cached_release, tmp_path):
    """The wave and lockstep loads: the profiler starts when the first wave's prefill is done
    (every request has its first token), before its first decode step, whatever the
    engine's speed (after a fixed wait of two seconds a fast engine has finished the wave, and
    SGLang writes no trace). A load that ends before the
    profiled steps (no trace in the folder, as SGLang leaves it) stops the profiler through
    the release's stop_profile, so the next load is not profiled, and says so."""
    calls, profile_type, res, eng = _profile_calls(cached_release("0.5.12"), out_dir=str(tmp_path))
    (t_start, running, start), (_, _, stop) = calls
    assert start.type == profile_type.START_PROFILE and start.num_steps == 30
    assert t_start == eng.prefill and running == 8, "right after the first wave's prefill, all 8 running"
    assert stop.type == profile_type.STOP_PROFILE and res["profile_stopped_early"]
    # A scheduler that writes the trace during the load (SGLang: at its 30th step), into a
    # folder that holds the stopped profile's: the load's own trace counts, no stop is sent.
    (tmp_path / "1.0-TP-0.trace.json.gz").write_bytes(b"")

    def write_trace(req):
        (tmp_path / "2.0-TP-0.trace.json.gz").write_bytes(b"")

    calls, _, res, _ = _profile_calls(cached_release("0.5.12"), write_trace, out_dir=str(tmp_path))
    assert [c[2].type.name for c in calls] == ["START_PROFILE"] and "profile_stopped_early" not in res
    # The stale trace alone: this load wrote none, so the profiler is stopped.
    (tmp_path / "2.0-TP-0.trace.json.gz").unlink()
    calls, _, res, _ = _profile_calls(cached_release("0.5.12"), out_dir=str(tmp_path))
    assert [c[2].type.name for c in calls] == ["START_PROFILE", "STOP_PROFILE"] and res["profile_stopped_early"]


def test_host_cpu_readings_parse_proc_stat(tmp_path):
    """The aggregate line of /proc/stat: idle and iowait are not busy; a missing file or
    another format gives no reading, and no reading gives no figure."""
    from spectool.harness.bench import hostload

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    assert hostload.cpu_times(str(stat)) == (150, 1000)
    later = (150 + 300, 1000 + 400)  # 300 of 400 ticks busy
    assert hostload.busy_cpus((150, 1000), later, cpus=8) == 6.0
    assert hostload.cpu_times(str(tmp_path / "missing")) is None
    stat.write_text("intr 1 2 3\n")
    assert hostload.cpu_times(str(stat)) is None
    assert hostload.busy_cpus(None, later) is None and hostload.busy_cpus(later, later) is None


def test_a_cell_records_how_busy_the_host_was(monkeypatch):
    """closed_loop reads the host's CPU ticks when its load starts and when it ends and
    records the busy CPUs between them (here 300 of 400 ticks busy on 8 CPUs: 6), with the
    host's CPU count; a host without the readings records none."""
    from spectool.harness.bench import hostload

    readings = iter([(1000, 5000), (1300, 5400)])
    monkeypatch.setattr(hostload, "cpu_times", lambda path=hostload.STAT: next(readings))
    monkeypatch.setattr(hostload.os, "cpu_count", lambda: 8)

    def measure():
        return _run(worker.closed_loop(TimedEngine(tpot=0.001, ttft=0.005), 2, 4, 4, 10, 0, 1000))

    res = measure()
    assert (res["host_busy_cpus"], res["host_cpus"]) == (6.0, 8)
    monkeypatch.setattr(hostload, "cpu_times", lambda path=hostload.STAT: None)
    res = measure()
    assert res["host_busy_cpus"] is None and res["n"] == 4


def test_gpu_clock_samples_reduce_to_a_loads_record():
    """Mean and lowest SM clock, mean power, highest temperature and the reasons the driver
    held the clocks for (idle left out: waves have gaps); no samples, no record."""
    from spectool.harness.bench import gpuclock

    samples = [(1980, 400.0, 60, 0x1), (1500, 700.0, 71, 0x4), (1740, None, None, 0x4 | 0x20)]
    assert gpuclock.summarize(samples) == {
        "gpu_sm_mhz": 1740.0,
        "gpu_sm_mhz_min": 1500,
        "gpu_power_w": 550.0,
        "gpu_temp_c": 71,
        "gpu_clock_reasons": ["sw_power_cap", "sw_thermal"],
    }
    assert gpuclock.summarize([]) == {}


def test_the_gpu_sampler_runs_on_its_own_thread_and_skips_failed_reads(monkeypatch):
    """Samples taken between start() and stop(), a failed read (None) skipped; without NVML
    (no NVIDIA driver) the sampler starts nothing and records nothing."""
    from spectool.harness.bench import gpuclock

    reads = iter([None, (1800, 500.0, 65, 0)] + [(1900, 600.0, 66, 0)] * 1000)
    enough = threading.Event()
    taken = []

    def read():
        taken.append(next(reads))
        if len(taken) >= 4:
            enough.set()
        return taken[-1]

    sampler = gpuclock.Sampler(read=read, interval_s=0.001).start()
    assert enough.wait(10)
    record = sampler.stop()
    assert record["gpu_sm_mhz_min"] == 1800 and 1800 < record["gpu_sm_mhz"] <= 1900
    assert gpuclock.nvml_reader("0", library="libspectool-no-such-nvml.so.1") is None

    def broken():
        raise RuntimeError("driver gone")

    assert gpuclock.Sampler(read=broken, interval_s=0.001).start().stop() == {}
    monkeypatch.setattr(gpuclock, "nvml_reader", lambda: None)  # as where no driver is found
    assert gpuclock.Sampler().start().stop() == {}


def test_the_gpu_is_the_first_visible_one(monkeypatch):
    from spectool.harness.bench import gpuclock

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gpuclock.first_visible_gpu() == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f3a,GPU-11aa")
    assert gpuclock.first_visible_gpu() == "GPU-8f3a"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpuclock.first_visible_gpu() == "0"


def test_a_cell_records_the_gpus_clocks_where_nvml_reads_them(monkeypatch):
    """closed_loop samples the GPU over its run and records the reduced clocks beside the
    host's CPUs; where NVML is missing the cell has no GPU fields."""
    from spectool.harness.bench import gpuclock

    monkeypatch.setattr(gpuclock, "nvml_reader", lambda: lambda: (1755, 650.0, 70, 0x4))
    res = _run(worker.closed_loop(TimedEngine(tpot=0.001, ttft=0.005), 2, 4, 4, 10, 0, 1000))
    assert res["gpu_sm_mhz"] == 1755 and res["gpu_clock_reasons"] == ["sw_power_cap"]
    monkeypatch.setattr(gpuclock, "nvml_reader", lambda: None)
    res = _run(worker.closed_loop(TimedEngine(tpot=0.001, ttft=0.005), 2, 4, 4, 10, 0, 1000))
    assert not any(k.startswith("gpu_") for k in res)
