"""The sweep's orchestration end to end on the CPU: engine processes started per arm (the
real bench worker, over a stand-in `sglang` package whose Engine serves requests after a
delay), every cell measured and appended, a rerun resuming, and the table and ratios written.
What the H200 measures is not checked here; that the sweep drives its engines is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spectool.harness.bench import engines, sweep

ENGINE = '''
import asyncio, gzip, json, os, sys, time


class Engine:
    """A continuous-batching engine in miniature: arrivals wait for a prefill step, then every
    running request gains its tokens per step (a speculative arm's whole chain: the bench
    sizes its loads for that). Its profiler works as SGLang's: started for N forward steps,
    it writes its trace at the first step past them, or when stopped. One of
    STUB_FAIL_AT_STEPS draft steps dies at start-up, as a CUDA graph capture that fails."""

    def __init__(self, **kw):
        if str(kw.get("speculative_num_steps")) == os.environ.get("STUB_FAIL_AT_STEPS"):
            print("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
            os._exit(1)
        with open(os.environ["STUB_ENGINE_ARGS"], "a") as f:
            f.write(json.dumps({**kw, "stub_tree": os.environ.get("STUB_TREE")}) + "\\n")
        self.spec, self.profiles = bool(kw.get("speculative_algorithm")), 0
        # A step takes 0.3 ms; a speculative one 0.8 ms for its chain of steps + 1 tokens.
        self.tokens_per_step = int(kw.get("speculative_num_steps") or 0) + 1 if self.spec else 1
        self.step_s = 0.0008 if self.spec else 0.0003
        self.waiting, self.running, self.task = [], [], None
        self.forward_ct, self.profiler = 0, None  # profiler: [output_dir, the step it ends at, first step]

    async def async_generate(self, input_ids, sampling_params, stream=False):
        loop = asyncio.get_running_loop()
        req = {"want": sampling_params["max_new_tokens"], "got": 0, "first": loop.create_future(),
               "done": loop.create_future()}
        self.waiting.append(req)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._serve())

        async def chunks():
            yield await req["first"]
            yield await req["done"]

        return chunks()

    async def _serve(self):
        while self.waiting or self.running:
            self.forward_ct += 1  # then the profiler's check, as SGLang's run_batch does
            if self.profiler and self.forward_ct >= self.profiler[1]:
                self._write_trace()
            if self.waiting:  # a prefill step: each new request gets its first token
                new, self.waiting = self.waiting, []
                await asyncio.sleep(0.002)
                for r in new:
                    r["got"] = 1
                    r["first"].set_result({"meta_info": {"completion_tokens": 1}})
                self.running += new
            else:
                await asyncio.sleep(self.step_s)
                for r in self.running:
                    r["got"] = min(r["want"], r["got"] + self.tokens_per_step)
            for r in [r for r in self.running if r["got"] >= r["want"]]:
                self.running.remove(r)
                r["done"].set_result({"meta_info": {"completion_tokens": r["want"]}, "output_ids": [1] * r["want"]})

    def generate(self, input_ids, sampling_params):
        return {"meta_info": {"completion_tokens": sampling_params["max_new_tokens"]}}

    def shutdown(self):
        pass

    @property
    def tokenizer_manager(self):
        return self

    async def start_profile(self, output_dir, num_steps, activities, with_stack, record_shapes):
        self.profiles += 1
        if self.spec and self.profiles == int(os.environ.get("STUB_SPEC_OOM_AT_PROFILE", 0)):
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB.", file=sys.stderr)
            os._exit(1)  # as the real engine's scheduler dies: no result, the process gone
        self.profiler = [output_dir, self.forward_ct + num_steps, self.forward_ct]

    async def stop_profile(self):
        if self.profiler is None:
            raise RuntimeError("Profiling is not in progress. Call /start_profile first.")
        self._write_trace()

    def _write_trace(self):
        """A trace as SGLang's profiler leaves it: the steps it ran, decode steps annotated on
        the GPU, one launch per kernel, the forward 5 ms and 3 kernels between two of them."""
        output_dir, _, first = self.profiler
        self.profiler = None
        ev, t = [], 0.0
        for step in range(self.forward_ct - first):
            ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": "step[DECODE bs=8]", "ts": t, "dur": 5000})
            for i, (name, at, dur) in enumerate([("gemm", 0, 4990), ("argmax", 5010, 30), ("copy", 5050, 2),
                                                 ("resolve", 5060, 2)]):
                corr = step * 10 + i
                ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t + at, "dur": dur, "args": {"correlation": corr}})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + at - 100, "dur": 5,
                           "tid": 1, "args": {"correlation": corr}})
            ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "ts": t, "id": step})
            t += 5100
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, f"{time.time()}-TP-0.trace.json.gz"), "wb") as f:  # SGLang's naming
            f.write(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
'''


REPO = Path(__file__).resolve().parents[1]
# A sweep small enough for the stand-in engines: 4-token prompts, 8-token outputs.
TINY = dict(threshold=4, prompt_len=4, out_len=8, transition=False, budget_s=120)


def _server_args() -> str:
    """A ServerArgs with exactly the fields the bench sets on its engines (every arm's, a
    threshold included): the real worker maps its arguments onto these as onto SGLang's."""
    from spectool.harness.bench.arms import arms, engine_kwargs

    fields = set()
    for arm in arms(threshold=4):
        fields |= set(engine_kwargs(arm, {"target": "t", "draft": "d"}, max_bs=8, max_total_tokens=1, port=1))
    return "import dataclasses\n\n\n@dataclasses.dataclass\nclass ServerArgs:\n" + "".join(
        f"    {name}: object = None\n" for name in sorted(fields)
    )


@pytest.fixture
def stub_engines(tmp_path, monkeypatch):
    """A stand-in sglang on the engines' PYTHONPATH, and a GPU as far as the sweep asks."""
    stub = tmp_path / "stub"
    (stub / "sglang/srt").mkdir(parents=True)
    (stub / "sglang/__init__.py").write_text(ENGINE)
    (stub / "sglang/srt/__init__.py").write_text("")
    (stub / "sglang/srt/server_args.py").write_text(_server_args())
    args = tmp_path / "engine-args.jsonl"
    env = dict(PYTHONPATH=os.pathsep.join([str(stub), str(REPO)]), STUB_ENGINE_ARGS=str(args), PYTHONUNBUFFERED="1")
    # The environment as the sweep starts its engines (a test's own settings included).
    monkeypatch.setattr(engines, "environment", lambda sglang_dir, acc_len: ("0.5.12", {**os.environ, **env}))
    monkeypatch.setattr("spectool.harness.verify.runner.gpu_info", lambda command="verify": ("sm90", "stand-in GPU"))
    return args


def test_a_sweep_starts_its_engines_measures_every_cell_and_resumes(tmp_path, stub_engines):
    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1, 8), arm_names=["A0", "A1", "A2"], port_base=27000)
    sweep.run(out, reps=1, **kw)
    started = [json.loads(line) for line in stub_engines.read_text().splitlines()]
    assert len(started) == 3, "one engine per arm"
    assert {e["max_total_tokens"] for e in started} == {engines.kv_pool_tokens(8, 4, 8)}
    assert {e["cuda_graph_max_bs"] for e in started} == {8}, "shaped for the sweep's largest C"
    assert sorted(e.get("speculative_disable_batch_size_threshold", -1) for e in started) == [-1, -1, 4]
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted((c["arm"], c["C"]) for c in cells) == [(a, C) for a in ("A0", "A1", "A2") for C in (1, 8)]
    assert all(c["output_tok_s"] > 0 and c["rep"] == 0 for c in cells)
    results = json.loads((out / "bench-results.json").read_text())
    assert set(results["ratios"]["8"]) >= {"A2/E"} and (out / "bench-table.md").exists()

    sweep.run(out, reps=2, **kw)  # resumes: only the second repetition is measured
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted(c["rep"] for c in cells) == [0] * 6 + [1] * 6
    assert len(stub_engines.read_text().splitlines()) == 6, "the rerun started its engines once"

    # More repetitions of two arms at one C: the report still covers the whole folder.
    sweep.run(out, reps=3, **{**kw, "concurrencies": (1,), "arm_names": ["A1", "A2"]})
    results = json.loads((out / "bench-results.json").read_text())
    assert results["concurrencies"] == [1, 8] and set(results["ratios"]) == {"1", "8"}
    assert set(results["startup_s"]) == {"A0", "A1", "A2"}, "the engines of earlier runs keep their start-up"
    assert "| 8 |" in (out / "bench-table.md").read_text()


def test_a_waves_start_up_is_estimated_from_what_the_folder_recorded(tmp_path):
    """The wave's own arms' slowest recorded start-up, else the slowest of any arm (a first
    engine starts as slowly as the others did); a start-up recorded as nothing is no record."""
    from spectool.harness.bench.results import earlier_startup

    assert sweep.startup_estimate(["A1"], {}) is None
    report = tmp_path / "bench-results.json"
    report.write_text(json.dumps({"startup_s": {"A0": 74.2, "A1": 49.4, "S2": None}}))
    startup = earlier_startup(report)
    assert startup == {"A0": 74.2, "A1": 49.4}
    assert sweep.startup_estimate(["A1"], startup) == 49.4
    assert sweep.startup_estimate(["A1", "A0"], startup) == 74.2
    assert sweep.startup_estimate(["S2"], startup) == 74.2


def test_a_wave_starts_only_if_its_engines_would_be_ready_within_the_budget():
    assert sweep.ready_in_time(30, 540, None)  # nothing recorded: the first wave of a folder starts
    assert sweep.ready_in_time(300, 540, 74.2)
    assert not sweep.ready_in_time(60, 540, 74.2)
    assert not sweep.ready_in_time(74.2, 540, 74.2)  # ready only as the budget ends: nothing to measure
    # A budget shorter than the start-up itself: no call could do better, so the wave starts
    # rather than stop every call of the sweep at the same place.
    assert sweep.ready_in_time(60, 100, 150)


class _ClockAfterStart:
    """The sweep's clock, `ahead` seconds past its start from its second reading on: a run that
    has spent that much of its budget, whatever the machine's speed."""

    def __init__(self, ahead: float):
        import time

        self.real, self.ahead, self.readings = time.time, ahead, 0

    def time(self) -> float:
        self.readings += 1
        return self.real() + (self.ahead if self.readings > 1 else 0)


def test_engines_that_would_not_be_ready_within_the_budget_do_not_start(tmp_path, stub_engines, capsys, monkeypatch):
    """A resumed run with less of its budget left than the start-up the folder recorded for
    the next engines stops before starting them (its status: the budget reached, as a cut-off
    run's), and the folder keeps its cells; with time for them, the same command measures the
    rest."""
    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1, 8), arm_names=["A0", "A1"], port_base=27300)
    sweep.run(out, reps=1, **kw)
    report = json.loads((out / "bench-results.json").read_text())
    report["startup_s"] = {"A0": 100.0, "A1": 100.0}  # as slow engines record it
    (out / "bench-results.json").write_text(json.dumps(report))
    capsys.readouterr()

    monkeypatch.setattr(sweep, "time", _ClockAfterStart(150))  # 100 s of the 250 left, at most
    sweep.run(out, reps=2, **{**kw, "budget_s": 250})
    printed = " ".join(capsys.readouterr().out.split())  # as the console wrapped it
    assert (
        "time budget reached: 100 s left, less than these engines' start-up as this folder recorded it (100 s)"
        in printed
    )
    assert len(stub_engines.read_text().splitlines()) == 2, "no engine started"
    assert len((out / "cells.jsonl").read_text().splitlines()) == 4

    monkeypatch.setattr(sweep, "time", _ClockAfterStart(0))
    sweep.run(out, reps=2, **{**kw, "budget_s": 250})
    assert len((out / "cells.jsonl").read_text().splitlines()) == 8


def test_the_transition_resumes_the_rounds_it_lacks(tmp_path, stub_engines):
    """A folder holding one round of a transition, rerun with --transition-rounds 2, runs one
    more round on the engine and keeps the first; with its rounds all there, it starts no
    engine for them."""
    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1,), arm_names=["A2"], port_base=27500, transition=True)
    sweep.run(out, reps=0, **kw)
    first = json.loads((out / "transition.json").read_text())["A2"]
    assert "phases" in first, "one round: the record as it always was"
    sweep.run(out, reps=0, transition_rounds=2, **kw)
    rounds = json.loads((out / "transition.json").read_text())["A2"]["rounds"]
    assert len(rounds) == 2 and rounds[0] == first
    assert len(stub_engines.read_text().splitlines()) == 2
    sweep.run(out, reps=0, transition_rounds=2, **kw)
    assert len(stub_engines.read_text().splitlines()) == 2, "nothing left to measure: no engine"


def test_a_transition_cut_off_keeps_the_rounds_it_finished(tmp_path, stub_engines, monkeypatch):
    """A call stopped half-way through its rounds (the device's time limit ends the process)
    keeps every round it finished in transition.json, as it keeps its cells; the same command
    then measures only the rounds still lacking."""

    class CutOff(Exception):
        pass

    finish_rounds = sweep._transition

    def cut_after_one_round(*args, **kw):
        rounds = finish_rounds(*args, **kw)
        yield next(rounds)
        raise CutOff

    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1,), arm_names=["A2"], port_base=27600, transition=True)
    monkeypatch.setattr(sweep, "_transition", cut_after_one_round)
    with pytest.raises(CutOff):
        sweep.run(out, reps=0, transition_rounds=3, **kw)
    first = json.loads((out / "transition.json").read_text())["A2"]
    assert "phases" in first, "the finished round is on disk"

    monkeypatch.setattr(sweep, "_transition", finish_rounds)
    sweep.run(out, reps=0, transition_rounds=3, **kw)
    rounds = json.loads((out / "transition.json").read_text())["A2"]["rounds"]
    assert len(rounds) == 3 and rounds[0] == first


def test_a_transition_round_that_would_outlast_the_budget_does_not_start(tmp_path, stub_engines, capsys, monkeypatch):
    """A later round starts only if the budget left holds what the round before took: with
    rounds that take 200 s on the sweep's clock and a budget of 120 s, one round is measured
    and kept, and the run says why it stopped."""
    import time as real_time

    class RoundClock:
        readings = iter(range(0, 10**6, 200))
        time = staticmethod(real_time.time)
        monotonic = staticmethod(lambda: next(RoundClock.readings))

    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1,), arm_names=["A2"], port_base=27700, transition=True)
    monkeypatch.setattr(sweep, "time", RoundClock)
    sweep.run(out, reps=0, transition_rounds=3, **kw)
    assert "phases" in json.loads((out / "transition.json").read_text())["A2"], "one round"
    printed = " ".join(capsys.readouterr().out.split())
    assert "time budget reached for the transition: " in printed
    assert "less than a round took (200 s); the rounds left are skipped, rerun to run them" in printed


def test_cells_of_the_other_warm_up_take_no_new_cells_but_a_transition_may_join(tmp_path, stub_engines):
    """A folder whose cells ran the warm-up wave only at an engine's first visit of a C (no
    `warmup` field) takes no new cells: refused before any engine starts. A run that adds
    only transition rounds (--reps 0) may run over it."""
    from spectool.errors import BadInputError

    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1,), arm_names=["A2"], port_base=27900)
    sweep.run(out, reps=1, **kw)
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert {c["warmup"] for c in cells} == {"before every load"}
    (out / "cells.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in c.items() if k != "warmup"}) + "\n" for c in cells)
    )
    with pytest.raises(
        BadInputError, match="warm-up wave at an engine's first visit of a C, and this bench runs it before every load"
    ):
        sweep.run(out, reps=2, **kw)
    assert len(stub_engines.read_text().splitlines()) == 1, "no engine started"
    sweep.run(out, reps=0, **{**kw, "transition": True})
    assert "phases" in json.loads((out / "transition.json").read_text())["A2"]


def test_a_resumed_transition_refuses_rounds_of_another_schedule(tmp_path, stub_engines):
    """Rounds are read phase by phase beside the folder's: a rerun whose schedule differs (here
    a threshold of 200, whose high load is 256 at --max-batch 256) is refused before any engine
    starts, naming both schedules."""
    from spectool.errors import BadInputError

    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1,), arm_names=["A2"], port_base=27800, transition=True)
    sweep.run(out, reps=0, **kw)
    with pytest.raises(
        BadInputError, match=r"at C = 4, 192, 4, 192, 4, and this run's schedule is C = 4, 256, 4, 256, 4"
    ):
        sweep.run(out, reps=0, transition_rounds=2, **{**kw, "threshold": 200, "max_batch": 256})
    assert len(stub_engines.read_text().splitlines()) == 1, "no engine started"


def test_the_transition_runs_its_rounds_on_the_engine_and_tables_them(tmp_path, stub_engines):
    """--transition-rounds 2 through the real worker: the schedule twice on the A2 engine, each
    round with the references that bracket it, and the table's round column and goal line. Each
    round records whether its engine could switch: A2's threshold (4) lies below its batch (8);
    on engines of one request it could not, and it reads as a control."""
    out = tmp_path / "bench"
    kw = dict(TINY, concurrencies=(1,), arm_names=["A2"], port_base=27400, transition=True, max_batch=8)
    sweep.run(out, reps=0, transition_rounds=2, **kw)
    trans = json.loads((out / "transition.json").read_text())
    assert [len(rnd["phases"]) for rnd in trans["A2"]["rounds"]] == [len(sweep.TRANSITION)] * 2
    assert all(len(rnd["reference_records"]["4"]) == 2 for rnd in trans["A2"]["rounds"])
    assert [rnd["control"] for rnd in trans["A2"]["rounds"]] == [False, False]
    table = (out / "bench-table.md").read_text()
    assert "| A2 | 2 | 5 | 4 |" in table and "each phase the median of its rounds" in table
    assert "Controls" not in table
    single = tmp_path / "single"
    sweep.run(single, reps=0, transition_rounds=1, **{**kw, "max_batch": None})
    assert json.loads((single / "transition.json").read_text())["A2"]["control"] is True


def test_an_arm_whose_engine_cannot_start_leaves_the_others_measured(tmp_path, stub_engines, monkeypatch):
    """An engine that dies at start-up (a comparison arm on another release, say) stops only
    its own arm: the others are measured and reported, the run ends with the reason in one
    paragraph, and the same command, once the arm can start, measures only its cells. With
    no engine able to start, the start stops as before."""
    monkeypatch.setenv("STUB_FAIL_AT_STEPS", "2")
    out = tmp_path / "bench"
    s2 = "S2=A1:speculative_num_steps=2;speculative_num_draft_tokens=3"
    tree = str(_site(tmp_path / "site-0.5.12", "0.5.12", _server_args()))
    kw = dict(TINY, concurrencies=(1, 8), arm_names=["A0", "A1"], variants=[s2], port_base=27600, sglang_dir=tree)
    with pytest.raises(sweep.BadInputError) as failed:
        sweep.run(out, reps=1, **kw)
    msg = str(failed.value)
    assert msg.startswith(
        "bench arm S2's engine exited with 1 during its start: torch.AcceleratorError: CUDA error: an "
        "illegal memory access was encountered. Its log:"
    )
    assert f"The other arms were measured: {out / 'bench-table.md'}." in msg and "\n" not in msg
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted((c["arm"], c["C"]) for c in cells) == [("A0", 1), ("A0", 8), ("A1", 1), ("A1", 8)]
    assert "| 8 |" in (out / "bench-table.md").read_text()

    monkeypatch.delenv("STUB_FAIL_AT_STEPS")
    sweep.run(out, reps=1, **kw)
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted((c["arm"], c["C"]) for c in cells[4:]) == [("S2", 1), ("S2", 8)]

    monkeypatch.setenv("STUB_FAIL_AT_STEPS", "3")  # A1's, alone in the run
    with pytest.raises(sweep.BadInputError, match="^bench arm A1's engine exited with 1 during its start"):
        sweep.run(tmp_path / "alone", reps=1, **{**kw, "arm_names": ["A1"], "variants": []})
    assert not (tmp_path / "alone" / "cells.jsonl").exists()


def _site(path: Path, version: str, server_args: str) -> Path:
    """An unpacked stand-in SGLang as the bench reads it and its engines run it: its version,
    its ServerArgs and the stand-in Engine."""
    (path / "sglang/srt").mkdir(parents=True)
    (path / "sglang/__init__.py").write_text(ENGINE)
    (path / "sglang/srt/__init__.py").write_text("")
    (path / "sglang/version.py").write_text(f'__version__ = "{version}"\n')
    (path / "sglang/srt/server_args.py").write_text(server_args)
    return path


def test_an_arm_runs_on_a_sglang_tree_of_its_own(tmp_path, stub_engines, monkeypatch):
    """--arm-sglang-dir: the variant UP starts on another release's tree (its environment), its
    fields are those of that tree's ServerArgs (one the tree under test lacks is accepted),
    and its cells and report name the release, in the same run as the other arms."""
    other = _site(tmp_path / "site-0.5.17", "0.5.17", _server_args() + "    speculative_adaptive: bool = False\n")
    under_test = _site(tmp_path / "site-0.5.12", "0.5.12", _server_args())
    up = "UP=A1:speculative_adaptive=true"
    with pytest.raises(sweep.BadInputError, match="'speculative_adaptive' is not a ServerArgs field"):
        sweep.select_arms(4, 8, ["A1"], [up], sglang_dir=str(under_test))
    arms = sweep.select_arms(4, 8, ["A1"], [up], sglang_dir=str(under_test), arm_trees={"UP": str(other)})
    assert [(a.name, a.extra.get("speculative_adaptive")) for a in arms] == [("A1", None), ("UP", True)]

    here = engines.environment  # the fixture's: the stand-in SGLang for the tree under test
    monkeypatch.setattr(
        engines,
        "environment",
        lambda d, acc: (
            ("0.5.17", {**here(d, acc)[1], "PYTHONPATH": os.pathsep.join([d, str(REPO)]), "STUB_TREE": "0.5.17"})
            if d == str(other)
            else here(d, acc)
        ),
    )
    out = tmp_path / "bench"
    first = dict(TINY, concurrencies=(1,), arm_names=["A1"], variants=[up], port_base=27400)
    sweep.run(out, **first, reps=1, sglang_dir=str(under_test), arm_trees={"UP": str(other)})
    started = {e.get("speculative_adaptive"): e for e in map(json.loads, stub_engines.read_text().splitlines())}
    assert started[True]["stub_tree"] == "0.5.17" and started[None]["stub_tree"] is None
    cells = {c["arm"]: c for c in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}
    assert (cells["UP"]["sglang"], cells["A1"]["sglang"]) == ("0.5.17", "0.5.12")
    # The variant's cells carry its label (a later run that does not define it still names
    # it); a standard arm's label is the bench's own.
    assert cells["UP"]["label"] == arms[1].label and "label" not in cells["A1"]
    report = json.loads((out / "bench-results.json").read_text())
    assert report["arm_sglang_versions"] == {"UP": "0.5.17"}, "only the arm on another release than the report's"
    # Resumed on another release than its cells', an arm would mix two under one name.
    with pytest.raises(sweep.BadInputError, match="holds cells of arm A1 measured on SGLang 0.5.12, and this run"):
        sweep.run(out, **first, reps=2, sglang_dir=str(other))
    # The same release resumes them, under --sglang-dir too, and a damaged report does not stop it.
    (out / "bench-results.json").write_text("{")
    sweep.run(out, **{**first, "arm_names": ["UP"]}, reps=2, sglang_dir=str(other))
    reps = [c["rep"] for c in map(json.loads, (out / "cells.jsonl").read_text().splitlines()) if c["arm"] == "UP"]
    assert sorted(reps) == [0, 1]
    # An arm that falls back at a threshold needs a tree with the recipes' flag.
    stock = _site(tmp_path / "stock-0.5.17", "0.5.17", "class ServerArgs:\n    speculative_algorithm: str = None\n")
    with pytest.raises(sweep.BadInputError, match="has no --speculative-disable-batch-size-threshold"):
        sweep.select_arms(4, 8, ["A2"], [], arm_trees={"A2": str(stock)})


def test_max_batch_sizes_the_engines_for_the_full_sweep_while_measuring_some_of_its_c(tmp_path, stub_engines):
    """--max-batch: a run of C=1 alone on engines shaped as a sweep up to 8 (graphs, running
    requests, KV pool), recorded in each cell; below the largest C it is refused before any
    engine starts. A profile sizes its engines the same way."""
    kw = dict(TINY, concurrencies=(1,), arm_names=["A0", "A2"], port_base=27200, reps=1)
    sweep.run(tmp_path / "sized", max_batch=8, **kw)
    started = [json.loads(line) for line in stub_engines.read_text().splitlines()]
    assert {e["cuda_graph_max_bs"] for e in started} == {8} and {e["max_running_requests"] for e in started} == {8}
    assert {e["max_total_tokens"] for e in started} == {engines.kv_pool_tokens(8, 4, 8)}
    cells = [json.loads(line) for line in (tmp_path / "sized" / "cells.jsonl").read_text().splitlines()]
    assert {c["max_batch"] for c in cells} == {8} and {c["C"] for c in cells} == {1}
    with pytest.raises(sweep.BadInputError, match=r"--max-batch 4 is below the largest --concurrency \(8\)"):
        sweep.run(tmp_path / "small", max_batch=4, **{**kw, "concurrencies": (1, 8)})
    assert len(stub_engines.read_text().splitlines()) == 2, "the refused run started no engine"
    assert not (tmp_path / "small").exists()
    sweep.profile(
        tmp_path / "profile",
        threshold=4,
        concurrencies=[4],
        arm_names=["A0"],
        steps=4,
        out_len=8,
        prompt_len=4,
        port_base=27300,
        max_batch=8,
    )
    profiled = json.loads(stub_engines.read_text().splitlines()[-1])
    # Its pool holds the profile's own load: a wave of 21 tokens (4 steps and 16 spare past the prefill).
    assert profiled["cuda_graph_max_bs"] == 8 and profiled["max_total_tokens"] == engines.kv_pool_tokens(8, 4, 21)


def test_a_profile_reduces_each_trace_and_keeps_an_excerpt(tmp_path, stub_engines):
    """--profile: each arm's trace reduced (per-step time, the decode-step anatomy), a
    two-step excerpt kept beside profile.md without flow arrows, and every arm diffed
    against A0."""
    out = tmp_path / "profile"
    rows = sweep.profile(
        out,
        threshold=4,
        concurrencies=[8, 8],
        arm_names=["A0", "A2"],
        steps=10,
        out_len=8,
        prompt_len=4,
        port_base=27500,
    )
    assert set(rows) == {"A0@8", "A2@8", "A0@8#2", "A2@8#2"}
    anatomy = rows["A2@8#2"]["anatomy"]
    assert anatomy["steps"] == 9 and anatomy["between_kernels"] == 3 and abs(anatomy["forward_ms"] - 5.0) < 1e-9
    excerpts = sorted(p.name for p in (out / "excerpts").iterdir())
    assert excerpts == ["A0-C8-2.trace.json.gz", "A0-C8.trace.json.gz", "A2-C8-2.trace.json.gz", "A2-C8.trace.json.gz"]
    from spectool.harness.bench import profile as prof

    cut = prof.load_events(out / "excerpts" / "A2-C8.trace.json.gz")
    assert cut and not [e for e in cut if e.get("ph") == "s"]
    md = (out / "profile.md").read_text()
    assert "A2 against A0 at C=8 (wave 2)" in md and "Decode steps taken apart on the GPU" in md


def test_a_profile_outlasts_its_steps_on_a_fast_engine_and_a_short_load_says_why(tmp_path, stub_engines, monkeypatch):
    """--profile-load lockstep on engines that finish an 8-token wave in three forward steps:
    the profile starts once the first wave is prefilled and its load holds the 40 steps, so
    every arm has its trace (a fixed two-second wait would start it after the load, and SGLang
    would write none). A load cut short (here one wave) leaves no trace: the profiler is
    stopped and the row says why, in profile.json and profile.md, also where the folder
    holds an earlier run's traces."""
    kw = dict(threshold=4, concurrencies=[8], arm_names=["A0", "A1"], steps=40, out_len=8, prompt_len=4)
    out = tmp_path / "profile"
    rows = sweep.profile(out, load="lockstep", port_base=28100, **kw)
    assert {name: r.get("error") for name, r in rows.items()} == {"A0@8": None, "A1@8": None}
    assert rows["A1@8"]["anatomy"]["steps"] == 39, "40 annotated steps: 39 intervals"
    monkeypatch.setattr(sweep, "profile_requests", lambda C, *args: C)
    rows = sweep.profile(out, load="lockstep", port_base=28300, **kw)
    why = rows["A1@8"]["error"]
    assert why.startswith("no trace of 40 steps: the load (8 requests of 8 tokens at C=8) ended before SGLang's")
    assert f"what the stopped profiler wrote is in {out / 'traces' / 'A1-C8'}" in why
    assert why in (out / "profile.md").read_text() and json.loads((out / "profile.json").read_text())["rows"]


def test_a_profile_of_more_arms_than_fit_the_gpu_runs_them_in_waves(tmp_path, stub_engines):
    """Two arms and one engine at a time (as two MoE-shaped engines on one H200): one engine
    after the other, each profiled at every C, each diffed against A0 as side by side."""
    out = tmp_path / "profile"
    rows = sweep.profile(
        out,
        threshold=4,
        concurrencies=[8],
        arm_names=["A0", "A2"],
        steps=10,
        out_len=8,
        prompt_len=4,
        port_base=27700,
        max_engines=1,
    )
    assert set(rows) == {"A0@8", "A2@8"}
    started = [json.loads(ln) for ln in stub_engines.read_text().splitlines()]
    # Two engines, each the first of its wave: the same ports, so never on the GPU together.
    assert len(started) == 2 and started[0]["port"] == started[1]["port"]
    assert [bool(kw.get("speculative_algorithm")) for kw in started] == [False, True]
    assert "A2 against A0 at C=8" in (out / "profile.md").read_text()


def test_an_engine_that_dies_mid_profile_is_named_with_its_error_and_the_traces_before_are_kept(
    tmp_path, stub_engines, monkeypatch
):
    """A profile on the H200 once ran a third arm's engine out of GPU memory at its last
    C (three engines with KV pools for 256 requests of 1152 tokens on one GPU), after seven
    minutes: it said only "bench engine exited with -9 during profile", and profile.md was
    never written. Now the error names the arm, the C, the log's error and what to change,
    and profile.json / profile.md hold every trace reduced before it."""
    from spectool.errors import BadInputError

    monkeypatch.setenv("STUB_SPEC_OOM_AT_PROFILE", "2")
    out = tmp_path / "profile"
    with pytest.raises(BadInputError) as err:
        sweep.profile(
            out,
            threshold=4,
            concurrencies=[8, 8],
            arm_names=["A0", "A2"],
            steps=10,
            out_len=8,
            prompt_len=4,
            port_base=27700,
        )
    msg = str(err.value)
    assert "bench arm A2's engine exited with 1 during profile at C=8" in msg
    assert "torch.OutOfMemoryError: CUDA out of memory" in msg and "fewer arms at once" in msg
    assert str(out / "A2.log") in msg
    kept = json.loads((out / "profile.json").read_text())["rows"]
    assert set(kept) == {"A0@8", "A2@8", "A0@8#2"}
    assert "A2 against A0 at C=8" in (out / "profile.md").read_text()


# An engine's log as SGLang 0.5.12 leaves it when the scheduler dies of CUDA out-of-memory:
# import warnings, a traceback whose frames name no error, the error, the shutdown.
OOM_LOG = """\
/tmp/site/torchao/quantization/quant_api.py:1731: SyntaxWarning: invalid escape sequence '\\.'
flashinfer.comm is not available, falling back to standard implementation
[2026-11-30 02:59:44] Ignore import error when loading sglang.srt.models.mimo_v2: Can not import FA3 in sgl_kernel.
[2026-11-30 03:05:21] Scheduler hit an exception: Traceback (most recent call last):
  File "/tmp/site/sglang/srt/managers/scheduler.py", line 3039, in run_batch
    batch_result = self.model_worker.forward_batch_generation(
  File "/tmp/site/sglang/srt/layers/activation.py", line 93, in forward_cuda
    out = torch.empty(output_shape, dtype=x.dtype, device=x.device)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total capacity of 139.80 GiB.

[2026-11-30 03:05:21] SIGQUIT received. signum=None, frame=None. It usually means one child failed.
"""


def test_an_engine_death_is_read_from_its_log(tmp_path):
    """The reason is the log's last error line, among SGLang's import warnings and the
    traceback, in one paragraph with what to change for an out-of-memory."""
    log = tmp_path / "A4G.log"
    log.write_text(OOM_LOG)
    msg = engines.engine_failure("A4G", -9, "profile at C=256", log)
    assert msg.startswith(
        "bench arm A4G's engine exited with -9 during profile at C=256: torch.OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 224.00 MiB."
    )
    assert "fewer arms at once" in msg and "\n" not in msg and f"Its log: {log}." in msg
    log.write_text("[x] loading weights\n[x] ready\n")
    quiet = engines.engine_failure("A0", 1, "its start", log)
    assert quiet.startswith("bench arm A0's engine exited with 1 during its start. Its log:")
    assert quiet.endswith("Its last lines:\n[x] loading weights\n[x] ready") and "GPU" not in quiet


def test_waves_set_how_many_requests_every_cell_measures(tmp_path, stub_engines):
    """--waves makes a cell `waves` times C requests (at least 16); without it the default
    rule holds: two waves up to C=64, 1.5 above, three per client when staggered."""
    assert [sweep._requests_for(C) for C in (1, 64, 128)] == [16, 128, 192]
    assert sweep._requests_for(8, "staggered") == 24
    assert [sweep._requests_for(C, "lockstep", 4) for C in (1, 64, 128)] == [16, 256, 512]
    assert sweep._requests_for(12, "staggered", 2.5) == 30
    out = tmp_path / "long-cells"
    sweep.run(
        out,
        **TINY,
        concurrencies=(8,),
        reps=1,
        arm_names=["A0"],
        port_base=27300,
        waves=3,
    )
    (cell,) = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert cell["n"] == 24
