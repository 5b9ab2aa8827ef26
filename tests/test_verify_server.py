"""The served golden engine without a GPU: its launch_server command line against the patched
release's flags, the /generate request and answer, /metrics parsing, the switch lines of
the recipe's log, and the claims checked on them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from spectool.harness.verify import compare, runner, scenarios, server_worker
from spectool.harness.verify.engine_worker import record, request_args

REPO = Path(__file__).resolve().parent.parent

MODELS = {"target": "/m/target", "eagle3_draft": "/m/head", "moe": {"target": "mt", "eagle3_draft": "md", "meta": {}}}


def _served_job(tmp_path):
    jobs, _, _ = runner.plan_jobs(
        runner.select_configs(["eagle3-t4-http"]), scenarios.workloads(), MODELS, tmp_path, "0.5.12", False
    )
    return next(j for j in jobs if j["config"]["name"] == "eagle3-t4-http")


def _cli_flags(server_args_py) -> dict[str, str | None]:
    """Every flag an add_argument call of the file defines -> its action (None: takes a value)."""
    flags = {}
    for node in ast.walk(ast.parse(server_args_py.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            action = next((k.value for k in node.keywords if k.arg == "action"), None)
            if action is not None:
                action = action.value if isinstance(action, ast.Constant) else ast.unparse(action)
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    flags[arg.value] = action
    return flags


def test_only_selects_the_served_engine_and_its_baseline(tmp_path):
    assert {c.name for c in runner.select_configs(["eagle3-t4-http"])} == {"base-graph", "eagle3-t4-http"}
    job = _served_job(tmp_path)
    assert job["module"] == "spectool.harness.verify.server_worker"
    assert job["log_path"] == str(tmp_path / "eagle3-t4-http.log") and job["stats_path"]
    assert [w["name"] for w in job["workloads"]] == ["arrive"]
    s = next(s for s in scenarios.scenarios() if s.config == "eagle3-t4-http")
    assert s.expect.switches_logged and s.expect.metrics_agree and s.expect.fallback_after_spec
    assert (
        scenarios.expectations(s.expect, recipe_counters=False).keys().isdisjoint({"switches_logged", "metrics_agree"})
    ), "upstream's switch writes neither the recipe's lines nor its counters"


def test_the_command_line_is_the_patched_releases_flags(tmp_path, patched_release):
    """The server's flags, as a user writes them: each defined by the patched 0.5.12 ServerArgs,
    switches bare and only where the flag is a store_true, the threshold among them."""
    flags = _cli_flags(patched_release("0.5.12") / "sglang/srt/server_args.py")
    job = _served_job(tmp_path)
    argv = server_worker.command_line(server_worker.launch_kwargs(job))
    text = " ".join(argv)
    for want in (
        "--speculative-algorithm EAGLE3",
        "--speculative-draft-model-path /m/head",
        "--speculative-disable-batch-size-threshold 4",
        "--speculative-disable-batch-size-hysteresis 0",
        "--skip-tokenizer-init --",
        "--enable-metrics",
        "--host 127.0.0.1",
        f"--port {job['port']}",
    ):
        assert want in text or text.endswith(want), want
    assert "--speculative-disable-kv-only-margin" not in text, "the fallback's defaults, as users run it"
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        assert arg in flags, f"{arg} is no flag of the patched release"
        bare = i + 1 == len(argv) or argv[i + 1].startswith("--")
        assert bare == (flags[arg] == "store_true"), arg
    assert server_worker.command_line({"speculative_disable_kv_only_margin": None, "disable_cuda_graph": False}) == [
        "--speculative-disable-kv-only-margin",
        "off",
    ]


def test_the_generate_request_and_answer(cached_release):
    """A workload request as /generate's JSON body (fields of the release's GenerateReqInput and
    SamplingParams), and its answer, as the server serialises it (tuples become lists), read
    as the Engine's."""
    root = cached_release("0.5.12") / "sglang/srt"
    io = ast.parse((root / "managers/io_struct.py").read_text())
    cls = next(n for n in io.body if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    sp = ast.parse((root / "sampling/sampling_params.py").read_text())
    init = next(n for n in ast.walk(sp) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = {a.arg for a in init.args.args}

    req = {"prompt": [3, 4, 5], "max_new_tokens": 6, "delay": 0.1, "return_logprob": True}
    body = json.loads(json.dumps(request_args(req, False)))
    assert body == {
        "input_ids": [3, 4, 5],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    assert set(body) <= fields and set(body["sampling_params"]) <= params
    assert set(request_args({**req, "return_logprob": False}, False)) == {"input_ids", "sampling_params"}

    answer = json.loads(
        json.dumps(
            {
                "output_ids": [7, 8],
                "meta_info": {
                    "completion_tokens": 2,
                    "spec_verify_ct": 1,
                    "output_token_logprobs": [(-0.01, 7, None), (-0.5, 8, None)],
                    "output_top_logprobs": [[(-0.01, 7, None), (-6.0, 1, None)], [(-0.5, 8, None), (-2.5, 2, None)]],
                },
            }
        )
    )
    rec = record(3, answer, req, False, 0.0)
    assert rec["output_ids"] == [7, 8] and rec["completion_tokens"] == 2 and rec["index"] == 3
    assert rec["token_logprobs"] == [-0.01, -0.5] and rec["top2_margins"] == [5.99, 2.0]


# /metrics of an SGLang 0.5.12 server, abridged: the families the claims read (and neighbours
# with other labels or names that must not be counted), as prometheus_client writes them in
# multiprocess mode.
METRICS = """\
# HELP sglang:cuda_graph_passes_total Total number of forward passes categorized by CUDA graph.
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{engine_type="unified",mode="decode_cuda_graph",model_name="/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 95.0
sglang:cuda_graph_passes_total{engine_type="unified",mode="decode_none",model_name="/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
sglang:cuda_graph_passes_total{engine_type="unified",mode="prefill_none",model_name="/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 12.0
# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="unified",mode="decode",model_name="/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 731.0
sglang:realtime_tokens_total{engine_type="unified",mode="prefill_compute",model_name="/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 420.0
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.75
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="/m/target"} 11.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="/m/target"} 664.0
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="/m/target"} 1.0
sglang:e2e_request_latency_seconds_count{model_name="/m/target"} 11.0
"""


def test_metrics_are_read_from_sglangs_text_format():
    samples = server_worker.parse_metrics(METRICS)
    assert len(samples) == 10 and samples[-2][1] == {"le": "0.1", "model_name": "/m/target"}
    assert server_worker.server_counters(METRICS) == {
        "decode_passes": 97.0,
        "decode_tokens": 731.0,
        "requests": 11.0,
        "generation_tokens": 664.0,
    }
    assert server_worker.parse_metrics('x{a="q\\"uote",b="c"} 1e3\n') == [("x", {"a": 'q"uote', "b": "c"}, 1000.0)]
    assert set(server_worker.server_counters("").values()) == {0}, "no decode yet: the counters do not exist"


def test_switch_lines_are_read_as_the_recipe_logs_them():
    """The recipe's own switch message (its format string in common.py), formatted as its
    logger does, among other lines of a server log."""
    tree = ast.parse((REPO / "recipes/spec-fallback/common.py").read_text())
    (fmt,) = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and str(n.value).startswith("spec-fallback: decode")
    }
    log = "\n".join(
        [
            "[2026-12-01 10:00:00] Decode batch, #running-req: 2, #token: 180, token usage: 0.01, cuda graph: True",
            "[2026-12-01 10:00:01] " + fmt % (10, "OFF", 0, 31),
            "[2026-12-01 10:00:02] " + fmt % (2, "ON", 32, 31),
            "[2026-12-01 10:00:03] Prefill batch, #new-seq: 1, #new-token: 3",
        ]
    )
    assert server_worker.switch_lines(log) == [(10, "OFF"), (2, "ON")]
    assert server_worker.switch_lines("") == []


def _window(switches_down=1, switches_up=1):
    phases = [
        {"id": 1, "mode": "spec", "steps": 10, "reqs": 20, "correct_drafts": 60},
        {"id": 2, "mode": "fallback", "steps": 31, "reqs": 310, "correct_drafts": 0},
        {"id": 3, "mode": "spec", "steps": 40, "reqs": 80, "correct_drafts": 230},
    ]
    return {
        "fallback_steps": 31,
        "spec_steps": 50,
        "switches_to_fallback": switches_down,
        "switches_to_spec": switches_up,
        "phases": phases,
    }


def _run(**change):
    requests = [{"index": i, "completion_tokens": n} for i, n in enumerate([200, 200] + [32] * 8)]
    run = {
        "requests": requests,
        "switches": [(10, "OFF"), (2, "ON")],
        "metrics_before": {"decode_passes": 3.0, "decode_tokens": 7.0, "requests": 1.0, "generation_tokens": 8.0},
        # 81 steps; 410 requests' steps plus 290 accepted drafts; 10 requests of 656 tokens.
        "metrics_after": {"decode_passes": 84.0, "decode_tokens": 707.0, "requests": 11.0, "generation_tokens": 664.0},
    }
    run.update(change)
    return run


CLAIMS = {"switches_logged": True, "metrics_agree": True}


def test_a_served_run_that_logs_and_counts_its_switches_passes():
    assert compare.check_server(CLAIMS, _window(), _run(), 4, 0) == []
    assert compare.check_server({}, _window(), {}, 4, 0) == [], "an engine not served claims neither"


def test_each_served_claim_fails_by_name():
    def fails(window=None, **change):
        return compare.check_server(CLAIMS, window or _window(), _run(**change), 4, 0)

    assert fails(switches=[(10, "OFF")]) == ["the server log shows 0 'drafting ON' line(s), the counters 1 switch(es)"]
    assert fails(switches=[(4, "OFF"), (2, "ON")]) == [
        "the server log switches at batch sizes the rule forbids (OFF at [4], ON at []; T=4, H=0)"
    ]
    assert compare.check_server(CLAIMS, _window(), _run(switches=[(10, "OFF"), (4, "ON")]), 4, 1) == [
        "the server log switches at batch sizes the rule forbids (OFF at [], ON at [4]; T=4, H=1)"
    ]
    assert fails(_window(switches_down=0, switches_up=0), switches=[]) == [
        "the server log shows 0 'drafting OFF' line(s), the counters 0 switch(es)",
        "the server log shows 0 'drafting ON' line(s), the counters 0 switch(es)",
    ], "a workload that never switched proves nothing"
    assert fails(switches=None) == ["the server log was not read, so its switch lines cannot be checked"]

    def metrics(**after):
        return fails(metrics_after={**_run()["metrics_after"], **after})

    # A fallback step counted with drafts (or not at all) shows in the decode tokens.
    assert metrics(decode_tokens=707.0 + 31 * 3) == [
        "/metrics counted 793 decode tokens (the steps' requests plus accepted drafts), expected 700"
    ]
    assert metrics(decode_passes=84.0 - 31) == ["/metrics counted 50 decode passes (the counted steps), expected 81"]
    assert metrics(requests=12.0, generation_tokens=600.0) == [
        "/metrics counted 11 finished requests, expected 10",
        "/metrics counted 592 generated tokens, expected 656",
    ]
    without = _run()
    del without["metrics_after"]
    assert compare.check_server({"metrics_agree": True}, _window(), without, 4, 0) == [
        "no /metrics were read, so SGLang's counts cannot be checked"
    ]


def test_clients_send_each_request_at_its_delay_and_keep_its_place():
    """_run_clients against a local HTTP endpoint that answers /generate as the server does:
    every request sent once with its body, the delayed ones no earlier than their delay, the
    answers recorded in the workload's order whatever order they came back in; an error
    answer names the request."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen, t0 = [], time.perf_counter()

    class Generate(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((time.perf_counter() - t0, body))
            if body["input_ids"] == [0]:
                self.send_error(400, "bad request")
                return
            n = body["sampling_params"]["max_new_tokens"]
            answer = json.dumps({"output_ids": body["input_ids"][::-1][:n], "meta_info": {"completion_tokens": n}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(answer.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Generate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        wl = {
            "requests": [
                {"prompt": [1, 2, 3], "max_new_tokens": 2, "delay": 0.0},
                {"prompt": [4, 5, 6], "max_new_tokens": 3, "delay": 0.3},
                {"prompt": [7, 8, 9], "max_new_tokens": 1, "delay": 0.0},
            ]
        }
        t0 = time.perf_counter()
        recs = server_worker._run_clients(base, wl, False)
        assert [r["output_ids"] for r in recs] == [[3, 2], [6, 5, 4], [9]] and [r["index"] for r in recs] == [0, 1, 2]
        assert sorted(b["input_ids"] for _, b in seen) == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
        assert next(t for t, b in seen if b["input_ids"] == [4, 5, 6]) >= 0.3
        with pytest.raises(RuntimeError, match="^request 0: /generate answered 400"):
            server_worker._run_clients(base, {"requests": [{"prompt": [0], "max_new_tokens": 1, "delay": 0.0}]}, False)
    finally:
        server.shutdown()
