"""One SGLang engine configuration, run in its own process (``python -m``).

SGLang spawns scheduler processes and holds the GPU, so each configuration gets a fresh
process; the runner reads the JSON this writes. Input and output are JSON files.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from ..engine_compat import rendezvous_port


def settled_stats(path: str | None, since: float | None = None, job: dict | None = None, timeout: float = 60.0) -> dict:
    """The fallback counters once every step before `since` (a time.time(), by default now)
    is in them. The recipe writes its stats file at start-up and then every half second,
    with the time of the write (`written_at`): two writes after `since` with the same
    counters mean the engine has finished the steps of the requests that returned before it
    (overlap scheduling counts a step's acceptance just after its tokens), so the counters
    are exact for a workload. No file: the engine keeps no counters (no flag, or a release
    whose switch is upstream's). Counters rebuilt from the log are read after a short wait
    for the log."""
    if job and job.get("observe") == "log":
        time.sleep(0.2)
        return read_stats(path, job)
    if not path or not os.path.exists(path):
        return {}
    since = time.time() if since is None else since
    deadline, seen = time.time() + timeout, None
    while time.time() < deadline:
        stats = read_stats(path)
        written = stats.pop("written_at", 0)
        if written >= since:
            if seen is not None and seen[0] != written and seen[1] == stats:
                return stats
            if seen is None or seen[0] != written:
                seen = (written, stats)
        time.sleep(0.05)
    raise TimeoutError(f"the fallback's stats file {path} was not rewritten for {timeout:.0f} s (is the engine alive?)")


def read_stats(path: str | None, job: dict | None = None) -> dict:
    """The fallback counters now: the recipe's stats file, or (where the switch is upstream's)
    the same counters rebuilt from this engine's log."""
    if job and job.get("observe") == "log":
        from .upstream_log import stats_from_log

        try:
            with open(job["log_path"], errors="replace") as f:
                return stats_from_log(f.read(), job.get("initial_steps", 3), job["config"].get("threshold"))
        except OSError:
            return {}
    if not path:
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def engine_kwargs(job: dict) -> dict:
    cfg = job["config"]
    kw = dict(
        model_path=job["target"],
        skip_tokenizer_init=True,
        attention_backend=cfg.get("attention", "triton"),
        sampling_backend="pytorch",
        grammar_backend="none",
        cuda_graph_max_bs=32,
        disable_piecewise_cuda_graph=True,
        # Several engines share the GPU: a high static fraction passes SGLang's free-memory
        # check, and max_total_tokens keeps each KV pool small.
        mem_fraction_static=job.get("mem_fraction", 0.85),
        max_total_tokens=job.get("max_total_tokens", 32768),
        max_running_requests=64,
        # With tensor parallelism every rank must take the same fallback branch; a rank that
        # did not would hang the engine or change its tokens, which the golden check shows.
        tp_size=job.get("tp_size", 1),
        random_seed=0,
        port=job.get("port", 31000),
        nccl_port=rendezvous_port(job.get("port", 31000)),
        log_level="info",
    )
    if not cfg["cuda_graph"]:
        kw["disable_cuda_graph"] = True
    if cfg.get("hidden_states"):
        kw["enable_return_hidden_states"] = True
    if cfg["chunked_prefill"]:
        kw["chunked_prefill_size"] = cfg["chunked_prefill"]
    algo = cfg["algorithm"]
    if algo:
        kw.update(
            speculative_algorithm=algo,
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
        )
        if algo == "EAGLE3":
            kw.update(speculative_draft_model_path=job["eagle3_draft"])  # the trained head
        else:
            kw.update(speculative_draft_model_path=job["target"])
        if cfg["threshold"] is not None:
            kw["speculative_disable_batch_size_threshold"] = cfg["threshold"]
            kw["speculative_disable_batch_size_hysteresis"] = cfg["hysteresis"]
            kw.update(cfg["fallback_args"])
        if cfg.get("tiers"):
            kw.update(
                speculative_num_steps_tiers=list(cfg["tiers"]),
                speculative_num_steps_tier_boundaries=list(cfg["tier_boundaries"]),
            )
    if job.get("observe") == "log" and algo:
        kw["decode_log_interval"] = 1  # one log line per decode step: the counters' source
    kw.update(job.get("engine_overrides", {}))
    return kw


def decode_rows(hidden_states: list | None) -> list[list[float]]:
    """The decode steps' rows of a request's returned hidden states: SGLang returns the
    prompt's rows as one list of rows (when its prefill captured them), then one row per
    decode step."""
    return [row for row in hidden_states or [] if row and not isinstance(row[0], list)]


def record(i: int, out: dict, req: dict, want_logprobs: bool, t0: float) -> dict:
    """What the runner compares of one request's output: tokens and speculative counts, and
    the logprobs and hidden states it returned (the baseline always returns logprobs, for the
    top-2 margins and for the requests of other engines that ask for them)."""
    meta = out.get("meta_info", {})
    rec = {
        "index": i,
        "output_ids": list(out.get("output_ids", [])),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "spec_accept_length": meta.get("spec_accept_length"),
        "completion_tokens": meta.get("completion_tokens"),
        "finished_at": time.perf_counter() - t0,
    }
    if want_logprobs or req.get("return_logprob"):
        rec["asked_logprobs"] = bool(req.get("return_logprob"))
        rec["token_logprobs"] = [e[0] for e in meta.get("output_token_logprobs") or []]
        top = [
            sorted((p[0] for p in pos if p and p[0] is not None), reverse=True)
            for pos in meta.get("output_top_logprobs") or []
        ]
        rec["top_logprobs"] = [vals[:2] for vals in top]
        rec["top2_margins"] = [vals[0] - vals[1] if len(vals) >= 2 else None for vals in top]
    if req.get("return_hidden_states"):
        rec["asked_hidden_states"] = True
        rec["hidden_states"] = decode_rows(meta.get("hidden_states"))
    return rec


def request_args(req: dict, want_logprobs: bool) -> dict:
    """One workload request as SGLang's GenerateReqInput fields: the arguments of
    Engine.async_generate and the JSON body of the server's /generate alike (greedy, its
    length fixed by ignoring EOS)."""
    args = {
        "input_ids": req["prompt"],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": req["max_new_tokens"], "ignore_eos": True},
    }
    if want_logprobs or req.get("return_logprob"):
        args.update(return_logprob=True, top_logprobs_num=2)
    if req.get("return_hidden_states"):
        args["return_hidden_states"] = True
    return args


class Joins:
    """When each request of a workload starts: at its delay, or with `after` (request,
    tokens) once that request has produced that many tokens. The requests others wait on
    are streamed (`streamed`), and their progress is reported as it comes."""

    def __init__(self, requests: list[dict]):
        self.requests = requests
        self.produced = {j: 0 for j in {r["after"][0] for r in requests if r.get("after")}}
        self.changed = asyncio.Condition()

    def streamed(self, i: int) -> bool:
        return i in self.produced

    async def start(self, i: int) -> None:
        req = self.requests[i]
        if req.get("after"):
            j, tokens = req["after"]
            async with self.changed:
                await self.changed.wait_for(lambda: self.produced[j] >= tokens)
        elif req["delay"]:
            await asyncio.sleep(req["delay"])

    async def progress(self, i: int, tokens: float) -> None:
        async with self.changed:
            self.produced[i] = tokens
            self.changed.notify_all()

    async def finished(self, i: int) -> None:
        """A request waiting for more tokens than this one made starts now."""
        await self.progress(i, float("inf"))


async def _run_workload(engine, wl: dict, want_logprobs: bool) -> list[dict]:
    """The workload's requests at once, each started as Joins says; a streamed request's last
    chunk is its whole output, as a request that is not streamed returns it."""
    t0 = time.perf_counter()
    joins = Joins(wl["requests"])

    async def one(i, req):
        await joins.start(i)
        args = request_args(req, want_logprobs)
        if not joins.streamed(i):
            return record(i, await engine.async_generate(**args), req, want_logprobs, t0)
        out = None
        async for out in await engine.async_generate(**args, stream=True):
            await joins.progress(i, len(out["output_ids"]))
        await joins.finished(i)
        return record(i, out, req, want_logprobs, t0)

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(wl["requests"]))))


def main(job_path: str, out_path: str) -> int:
    job = json.loads(open(job_path).read())
    stats_path = job.get("stats_path")
    if stats_path and job.get("observe") != "log":
        os.environ["SPECTOOL_FALLBACK_STATS"] = stats_path  # before the engine spawns its processes
    result = {"config": job["config"]["name"], "workloads": {}, "ok": False}
    t_start = time.perf_counter()
    import sglang

    from ..engine_compat import adapt, server_arg_fields

    engine = sglang.Engine(**adapt(engine_kwargs(job), server_arg_fields()))
    result["startup_s"] = round(time.perf_counter() - t_start, 1)
    try:
        want_lp = job["config"]["algorithm"] is None
        loop = asyncio.get_event_loop()
        after = None
        for wl in job["workloads"]:
            before = after if after is not None else settled_stats(stats_path, job=job)
            t0 = time.perf_counter()
            outs = loop.run_until_complete(_run_workload(engine, wl, want_lp))
            after = settled_stats(stats_path, job=job)
            result["workloads"][wl["name"]] = {
                "requests": outs,
                "seconds": round(time.perf_counter() - t0, 3),
                "stats_before": before,
                "stats_after": after,
            }
        result["ok"] = True
    finally:
        result["total_s"] = round(time.perf_counter() - t_start, 1)
        with open(out_path, "w") as f:
            json.dump(result, f)
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
