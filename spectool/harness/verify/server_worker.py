"""One engine configuration served the way users serve SGLang, run in its own process
(``python -m``), for the configs marked ``served``.

It starts ``python -m sglang.launch_server`` with the configuration's settings as flags on
its command line (``--enable-metrics`` and ``--skip-tokenizer-init`` among them: the golden
models have no tokenizer), waits for ``/health``, and sends each workload's requests to the
native ``/generate`` API as token ids, one client thread per request, each at its delay.
SGLang 0.5.12's OpenAI ``/v1/completions`` accepts token-id prompts but builds its answer
from the decoded text, which a server without a tokenizer does not have; ``/generate``
answers with ``output_ids`` and ``meta_info`` as ``Engine.async_generate`` does. It writes
the out.json the Engine jobs write, and per workload the server log's spec-fallback switch
lines and SGLang's ``/metrics`` counters before and after. The server runs in a process
group of its own, stopped when this process ends or is told to stop.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from .engine_worker import engine_kwargs, record, request_args, settled_stats

HOST = "127.0.0.1"
SWITCH_LINE = re.compile(r"spec-fallback: decode batch of (\d+) requests, drafting (ON|OFF)")
SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# The counters of SGLang's /metrics the claims read: name, labels a sample must have, summed
# over the others (ranks, models). The decode ones are counted once per decode step whose
# result the scheduler processed: one pass, and the batch's requests plus accepted drafts.
COUNTERS = {
    "decode_passes": ("sglang:cuda_graph_passes_total", {"mode": ("decode_cuda_graph", "decode_none")}),
    "decode_tokens": ("sglang:realtime_tokens_total", {"mode": ("decode",)}),
    "requests": ("sglang:num_requests_total", {}),
    "generation_tokens": ("sglang:generation_tokens_total", {}),
}


def launch_kwargs(job: dict) -> dict:
    """The server's settings: the Engine jobs' (engine_kwargs) and what serving adds."""
    return {**engine_kwargs(job), "host": HOST, "enable_metrics": True}


def command_line(kwargs: dict) -> list[str]:
    """ServerArgs fields as launch_server flags: `--name-with-dashes VALUE`, a True switch as
    the bare flag, a False one left out. None is written `off`, as the fallback's flags
    spell it (no other setting here is None)."""
    argv = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, "off" if value is None else str(value)]
    return argv


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in LABEL.findall(m.group(2) or "")}
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def server_counters(text: str) -> dict[str, float]:
    """COUNTERS read from a /metrics text (0 for a counter SGLang has not created yet)."""
    samples = parse_metrics(text)
    return {
        key: sum(
            value
            for sample, labels, value in samples
            if sample == name and all(labels.get(k) in allowed for k, allowed in want.items())
        )
        for key, (name, want) in COUNTERS.items()
    }


def switch_lines(log: str) -> list[tuple[int, str]]:
    """The spec-fallback switch lines of a log: (batch size, "OFF" | "ON") in order."""
    return [(int(bs), state) for bs, state in SWITCH_LINE.findall(log)]


def _http(url: str, payload: dict | None = None, timeout: float = 600) -> bytes:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def _wait_ready(base: str, server: subprocess.Popen) -> None:
    """Until /health answers 200 (after SGLang's own warm-up request), or the server exits."""
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before /health answered")
        try:
            _http(base + "/health", timeout=30)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1.0)


def _run_clients(base: str, wl: dict, want_logprobs: bool) -> list[dict]:
    """The workload's requests, one client thread each, sent at their delays."""
    t0 = time.perf_counter()

    def one(i, req):
        time.sleep(max(0.0, req["delay"] - (time.perf_counter() - t0)))
        try:
            out = json.loads(_http(base + "/generate", request_args(req, want_logprobs)))
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"request {i}: /generate answered {exc.code}: {exc.read()[:500]!r}") from None
        return record(i, out, req, want_logprobs, t0)

    with ThreadPoolExecutor(max_workers=len(wl["requests"])) as pool:
        futures = [pool.submit(one, i, r) for i, r in enumerate(wl["requests"])]
        return [f.result() for f in futures]


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (SGLang's scheduler and detokenizer too), SIGKILL
    to whatever is left after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
            server.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _log_since(path: str | None, offset: int) -> str | None:
    if not path:
        return None
    with open(path, errors="replace") as f:
        f.seek(offset)
        return f.read()


def main(job_path: str, out_path: str) -> int:
    job = json.loads(open(job_path).read())
    stats_path, log_path = job.get("stats_path"), job.get("log_path")
    env = dict(os.environ)
    if stats_path and job.get("observe") != "log":
        env["SPECTOOL_FALLBACK_STATS"] = stats_path
    result = {"config": job["config"]["name"], "workloads": {}, "ok": False}
    t_start = time.perf_counter()
    from ..engine_compat import adapt, server_arg_fields

    argv = command_line(adapt(launch_kwargs(job), server_arg_fields()))
    print("server:", " ".join([sys.executable, "-m", "sglang.launch_server", *argv]), flush=True)
    # The server writes to this process's log (the runner's), where its switch lines are read.
    server = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *argv], env=env, start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the runner's stop: end the server too
    base = f"http://{HOST}:{job.get('port', 31000)}"
    try:
        _wait_ready(base, server)
        result["startup_s"] = round(time.perf_counter() - t_start, 1)
        want_lp = job["config"]["algorithm"] is None
        after = None
        for wl in job["workloads"]:
            before = after if after is not None else settled_stats(stats_path, job=job)
            metrics_before = server_counters(_http(base + "/metrics").decode())
            offset = os.path.getsize(log_path) if log_path else 0
            t0 = time.perf_counter()
            outs = _run_clients(base, wl, want_lp)
            seconds = round(time.perf_counter() - t0, 3)
            after = settled_stats(stats_path, job=job)
            log = _log_since(log_path, offset)
            result["workloads"][wl["name"]] = {
                "requests": outs,
                "seconds": seconds,
                "stats_before": before,
                "stats_after": after,
                "metrics_before": metrics_before,
                "metrics_after": server_counters(_http(base + "/metrics").decode()),
                "switches": None if log is None else switch_lines(log),
            }
        result["ok"] = True
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        result["total_s"] = round(time.perf_counter() - t_start, 1)
        with open(out_path, "w") as f:
            json.dump(result, f)
        _stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
