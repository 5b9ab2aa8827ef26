"""The bench worker's load generator against an engine that decodes at a fixed rate (no GPU):
closed-loop concurrency, the steady-state window, and the unmeasured warm-up wave at the
first visit of a concurrency."""

from __future__ import annotations

import asyncio
import json

from spectool.bench import worker


class TimedEngine:
    """Serves each request in ttft + tokens * tpot seconds; records concurrency and requests."""

    def __init__(self, tpot=0.002, ttft=0.01):
        self.tpot, self.ttft = tpot, ttft
        self.in_flight = self.peak = 0
        self.requests = []

    async def async_generate(self, input_ids, sampling_params):
        self.requests.append((len(input_ids), sampling_params["max_new_tokens"]))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        n = sampling_params["max_new_tokens"]
        await asyncio.sleep(self.ttft + n * self.tpot)
        self.in_flight -= 1
        return {"output_ids": [1] * n, "meta_info": {"completion_tokens": n, "decode_throughput": 1 / self.tpot}}

    def generate(self, input_ids, sampling_params):
        self.requests.append(("flush", sampling_params["max_new_tokens"]))


def test_closed_loop_keeps_c_in_flight_and_measures_the_rate():
    eng = TimedEngine()
    loop = asyncio.new_event_loop()
    try:
        res = loop.run_until_complete(worker.closed_loop(eng, 4, 12, 8, 50, 0, 1000))
    finally:
        loop.close()
    assert eng.peak == 4 and len(eng.requests) == 12 and res["n"] == 12
    # 4 streams of one token per 2 ms: about 2000 tokens/s, whatever the window.
    assert 1500 < res["output_tok_s"] < 2100, res
    assert abs(res["tpot_ms"] - 2.0) < 1e-6


def test_first_visit_of_a_concurrency_is_warmed_up_unmeasured(tmp_path):
    eng = TimedEngine(tpot=0.0005, ttft=0.001)
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"fallback_steps": 5, "spec_steps": 7}))
    job = {"stats_path": str(stats)}
    loop = asyncio.new_event_loop()
    warmed: set = set()
    try:
        point = {"kind": "point", "C": 4, "n": 8, "prompt_len": 8, "out_len": 32, "seed": 1}
        first = worker.handle(eng, point, job, loop, 1000, warmed)
        warm = [r for r in eng.requests if r[1] == worker.WARMUP_OUT_LEN]
        assert len(warm) == 4 and eng.requests[:4] == warm, "one unmeasured wave of C short requests first"
        assert eng.requests[4] == ("flush", 3) and len(eng.requests) == 4 + 1 + 8
        assert first["n"] == 8 and first["spec_fraction"] is None  # the counters did not move
        eng.requests.clear()
        worker.handle(eng, {**point, "seed": 2}, job, loop, 1000, warmed)
        assert not [r for r in eng.requests if r[1] == worker.WARMUP_OUT_LEN], "no warm-up at a visited C"
        eng.requests.clear()
        worker.handle(eng, {**point, "C": 2, "n": 4}, job, loop, 1000, warmed)
        assert len([r for r in eng.requests if r[1] == worker.WARMUP_OUT_LEN]) == 2
    finally:
        loop.close()
    assert warmed == {2, 4}
