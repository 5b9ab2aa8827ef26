"""``spectool verify``: build the golden models, run every engine configuration in its own
process (a few at a time on one GPU), compare each speculative scenario with its
no-speculation baseline and with the recorded golden file, and report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ...errors import BadInputError
from ...statuses import Status
from ..engine_compat import server_args_source
from . import compare, golden_moe, scenarios
from .golden_eagle3 import ensure_models
from .golden_model import ModelSpec
from .golden_moe import MoeSpec
from .stock import stock_copy

TIERS_FLAG = "speculative_num_steps_tiers"  # the ServerArgs field of the tiers' engines
TRAIN_MOE = "train-moe"  # the runner's job that trains the MoE golden models on the GPU


def gpu_info(command: str = "verify") -> tuple[str, str]:
    """('sm90', 'NVIDIA H200'), or raise a clear error without a GPU."""
    try:
        import torch
    except ImportError:
        raise BadInputError(f"spectool {command} needs torch with CUDA (pip install 'spectool[gpu]').") from None
    if not torch.cuda.is_available():
        raise BadInputError(
            f"spectool {command} needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)."
        )
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}", torch.cuda.get_device_name()


def _launch(job: dict, workdir: Path, env: dict) -> tuple[subprocess.Popen, Path, Path]:
    name = job["config"]["name"]
    job_path, out_path, log_path = workdir / f"{name}.job.json", workdir / f"{name}.out.json", workdir / f"{name}.log"
    module = job.get("module", "spectool.harness.verify.engine_worker")
    # A result or counter file left by an earlier run in the same folder must never be read
    # as this engine's (counters would go negative, a crash would look like a pass).
    out_path.unlink(missing_ok=True)
    if job.get("stats_path"):
        Path(job["stats_path"]).unlink(missing_ok=True)
    job_path.write_text(json.dumps(job))
    if job.get("python_path"):  # a stock engine imports the release as published first
        env = {**env, "PYTHONPATH": os.pathsep.join([job["python_path"], env.get("PYTHONPATH", "")])}
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", module, str(job_path), str(out_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    return proc, out_path, log_path


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def next_ready(pending: list[dict], results: dict) -> dict | None:
    """The first pending job whose prerequisite (`after`: a job's name) has finished, taken
    off the list; a job whose prerequisite failed is answered with that, never started."""
    for job in pending:
        after = job.get("after")
        if after and after not in results:
            continue
        pending.remove(job)
        if after and not results[after].get("ok"):
            results[job["config"]["name"]] = {"ok": False, "error": f"not started: {after} failed"}
            return next_ready(pending, results)
        return job
    return None


def run_engines(jobs: list[dict], workdir: Path, env: dict, parallel: int, timeout: float, progress=None) -> dict:
    """Run jobs, `parallel` at a time, each once its prerequisite is done; returns name ->
    result (or an error with the log tail)."""
    pending, running, results = list(jobs), {}, {}
    try:
        while pending or running:
            while len(running) < parallel and (job := next_ready(pending, results)) is not None:
                proc, out, log = _launch(job, workdir, env)
                running[job["config"]["name"]] = (proc, out, log, time.time())
            if pending and not running:  # every pending job waits on one that will never run
                for job in pending:
                    results[job["config"]["name"]] = {"ok": False, "error": f"not started: {job.get('after')} missing"}
                break
            time.sleep(1.0)
            for name, (proc, out, log, t0) in list(running.items()):
                rc = proc.poll()
                if rc is None and time.time() - t0 < timeout:
                    continue
                if rc is None:
                    _kill_group(proc)
                    results[name] = {"ok": False, "error": f"timed out after {timeout:.0f} s", "log_tail": _tail(log)}
                else:
                    _kill_group(proc)  # SGLang children left behind
                    try:
                        results[name] = json.loads(out.read_text())
                        if not results[name].get("ok"):
                            results[name]["log_tail"] = _tail(log)
                    except (OSError, ValueError):
                        results[name] = {
                            "ok": False,
                            "error": f"engine process exited with {rc}",
                            "log_tail": _tail(log),
                        }
                del running[name]
                if progress:
                    progress(name, results[name])
    finally:
        for proc, *_ in running.values():
            _kill_group(proc)
    return results


def verify(
    sglang_dir: str | None,
    out_dir: Path,
    *,
    golden_root: Path,
    record: bool = False,
    parallel: int = 4,
    timeout: float = 420,
    only: list[str] | None = None,
    tp_size: int = 1,
    model_cache: Path | None = None,
    port_base: int = 31000,
    recipes: dict | None = None,
    console=None,
) -> dict:
    """Run every engine configuration against the golden tokens. `recipes` (recipes_dir,
    select, options) names the recipes the tree must have applied (default: the shipped ones)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    known = [c.name for c in scenarios.configs()]
    unknown = sorted(set(only or ()) - set(known))
    if unknown:  # else a typo would run the baselines alone and pass
        raise BadInputError(
            f"spectool verify --only {','.join(only)}: no engine config named {', '.join(unknown)}; "
            f"the configs are {', '.join(known)} (the baselines they are compared with run too)."
        )
    try:
        spec = ModelSpec().for_tp(tp_size)
    except ValueError as exc:
        raise BadInputError(f"spectool verify --tp {tp_size}: {exc}; use --tp 1 or 2.") from None
    if record and spec != ModelSpec():
        raise BadInputError(
            f"spectool verify --record --tp {tp_size}: golden files are recorded with the TP=1 model "
            f"(TP={tp_size} needs a model of its own, whose tokens no golden file holds); record at --tp 1."
        )
    env = dict(os.environ)
    sg_version, upstream_switch = inspect_tree(sglang_dir, env, **(recipes or {}))  # bad input first, then the GPU
    arch, gpu_name = gpu_info()
    out_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    log_lines = []
    # The committed golden model (golden/models) is used when it matches the spec; otherwise
    # it is trained here (about a minute on a GPU) and cached in the output folder.
    moe_cache = model_cache or out_dir / "models"
    if model_cache is None:
        shipped = golden_root / "models"
        model_cache = (
            shipped if (shipped / f"golden-target-{spec.key()}" / "model.safetensors").exists() else out_dir / "models"
        )
    wls = scenarios.workloads(spec)
    cfgs = select_configs(only)
    models = ensure_models(model_cache, spec, log=log_lines.append)
    moe_job = None
    if any(c.model == "moe" for c in cfgs):
        models["moe"], moe_job = moe_models(golden_root / "models", moe_cache, MoeSpec().for_tp(tp_size))
    stock_root = stock_copy(sglang_dir, out_dir / "stock") if sglang_dir and any(c.stock for c in cfgs) else None
    jobs, cfgs, skipped = plan_jobs(
        cfgs,
        wls,
        models,
        out_dir,
        sg_version,
        upstream_switch,
        tp_size,
        port_base,
        tiers=has_tiers(sglang_dir),
        stock_root=stock_root,
    )
    if moe_job:  # trained next to the engines that need neither, started as early as they are
        jobs.insert(sum(c.attention != "triton" for c in cfgs), moe_job)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("engines", total=len(jobs))

        def tick(name, res):
            status = "ok" if res.get("ok") else "FAILED"
            bar.console.print(
                f"  engine {name}: {status} (startup {res.get('startup_s', '?')} s, total {res.get('total_s', '?')} s)"
            )
            bar.advance(task)

        results = run_engines(jobs, out_dir, env, parallel, timeout, tick)
    if moe_job and results.get(TRAIN_MOE, {}).get("ok"):
        models["moe"] = results[TRAIN_MOE]["models"]
        log_lines += results[TRAIN_MOE].get("log", [])
    report = evaluate(
        results,
        cfgs,
        wls,
        models,
        sg_version,
        arch,
        gpu_name,
        golden_root,
        record,
        skipped,
        recipe_counters=not upstream_switch,
        kept_kinds=kept_speculative(sglang_dir),
    )
    report["tp_size"] = tp_size
    report["counters_from"] = "engine log (upstream's batch-size switch)" if upstream_switch else "spectool stats file"
    report["wall_seconds"] = round(time.time() - t_all, 1)
    report["model_build_log"] = log_lines
    (out_dir / "verify-results.json").write_text(json.dumps(report, indent=2))
    return report


def select_configs(only: list[str] | None) -> list:
    """The engine configs to run: all, or those named and the baselines they are compared
    with (only those, so that a run of a few new engines stays short)."""
    every = scenarios.configs()
    if not only:
        return every
    named = [c for c in every if c.name in only]
    needed = {c.name for c in named}
    for c in named:
        needed |= {scenarios.baseline_for(c, every, w).name for w in c.workloads} if c.algorithm else set()
    needed |= {s.reference for s in scenarios.scenarios() if s.reference and s.config in needed}
    return [c for c in every if c.name in needed]


def moe_models(shipped: Path, cache: Path, spec: MoeSpec) -> tuple[dict, dict | None]:
    """The MoE golden models: the committed ones when they match the spec, else the ones in
    `cache`, with the job that trains them there on the GPU when they are missing (its
    engines wait for it; the dense engines need not)."""
    for folder in (shipped, cache):
        if golden_moe.trained(folder, spec):
            return golden_moe.ensure_models(folder, spec), None
    job = {
        "config": {"name": TRAIN_MOE},
        "module": "spectool.harness.verify.golden_moe",
        "cache": str(cache),
        "spec": asdict(spec),
    }
    return {**golden_moe.paths(cache, spec), "meta": {}}, job


def inspect_tree(sglang_dir: str | None, env: dict, *, recipes_dir=None, select=None, options=None) -> tuple[str, bool]:
    """(SGLang version, whether its batch-size switch is upstream's) of the tree under test,
    which must be fully patched by the recipes (default: every shipped one); puts it first on
    the engines' PYTHONPATH."""
    here = str(Path(__file__).resolve().parents[3])
    if not sglang_dir:
        import importlib.metadata

        env["PYTHONPATH"] = os.pathsep.join([here, env.get("PYTHONPATH", "")])
        return importlib.metadata.version("sglang"), False
    from ... import api
    from ...source import locate

    tree = locate(sglang_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(tree.root), here, env.get("PYTHONPATH", "")])
    chk = api.check(sglang_dir, recipes_dir=recipes_dir, select=select, options=options)
    if not all(r.status in (Status.ALREADY_APPLIED, Status.UPSTREAMED) for r in chk.plan.results):
        bad = ", ".join(f"{r.id}={r.status}" for r in chk.plan.results)
        raise BadInputError(
            f"the SGLang tree {sglang_dir} is not patched ({bad}); run 'spectool apply --sglang-dir {sglang_dir}' first."
        )
    # Where the fallback is upstream's, its counters come from the engine log instead.
    return str(tree.version), any(r.id == "spec-fallback" and r.status == Status.UPSTREAMED for r in chk.plan.results)


def kept_speculative(sglang_dir: str | None) -> frozenset[str]:
    """The request kinds (scenarios.REQUEST_KINDS) whose batches the tree's fallback keeps on
    the speculative path, read from its eligibility rule as patched
    (EAGLEWorkerV2._spec_fallback_eligible): the batch attributes the rule tests. Empty
    where every batch may fall back, or where the tree has no such rule (upstream's switch)."""
    import ast

    from ..engine_compat import server_args_path

    path = server_args_path(sglang_dir).parent / "speculative" / "eagle_worker_v2.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return frozenset()
    rule = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_spec_fallback_eligible"),
        None,
    )
    if rule is None:
        return frozenset()
    names = {n.attr for n in ast.walk(rule) if isinstance(n, ast.Attribute)}
    tested = {
        "grammar": "has_grammar",
        "logprob": "return_logprob",
        "hidden_states": "_spec_fallback_returns_hidden_states",
    }
    return frozenset(kind for kind, attr in tested.items() if attr in names)


def has_tiers(sglang_dir: str | None) -> bool:
    """Whether the tree's ServerArgs (as patched) has --speculative-num-steps-tiers."""
    return TIERS_FLAG in server_args_source(sglang_dir)


def _cannot_run(c, sg_version: str, upstream_switch: bool, tiers: bool, stock_root: Path | None) -> str | None:
    """Why engine config `c` cannot run on this tree (None: it can)."""
    if c.stock and stock_root is None:
        return "a stock engine needs --sglang-dir, a tree spectool patched (its originals are the stock files)"
    if c.tiers and (upstream_switch or not tiers):
        return f"SGLang {sg_version} has no --speculative-num-steps-tiers (the recipes add it to 0.5.12-0.5.18)"
    if upstream_switch and c.algorithm not in (None, "EAGLE", "EAGLE3"):
        # Upstream's tiers (0.5.19+) cover EAGLE/EAGLE3 only; the threshold recipe refuses the
        # flag for other algorithms at start-up, so those scenarios do not apply there.
        return (
            f"upstream's batch-size switch supports EAGLE/EAGLE3 only; the flag is refused for "
            f"{c.algorithm} on SGLang {sg_version}"
        )
    return None


def plan_jobs(
    cfgs,
    wls,
    models,
    out_dir: Path,
    sg_version: str,
    upstream_switch: bool,
    tp_size: int = 1,
    port_base: int = 31000,
    *,
    tiers: bool = True,
    stock_root: Path | None = None,
):
    """One job per engine configuration; (jobs, configs run, configs skipped with the reason).
    `tiers`: the tree's ServerArgs has --speculative-num-steps-tiers (else the engines of
    tier configs are skipped). `stock_root`: the release as published (stock.stock_copy),
    which the stock configs import first (without it they are skipped)."""
    skipped = {c.name: why for c in cfgs if (why := _cannot_run(c, sg_version, upstream_switch, tiers, stock_root))}
    cfgs = [c for c in cfgs if c.name not in skipped]
    # flashinfer compiles its kernels at first use (minutes): its engines start first.
    cfgs = sorted(cfgs, key=lambda c: c.attention == "triton")
    jobs = []
    for i, c in enumerate(cfgs):
        config = asdict(c)
        m = models if c.model == "dense" else models[c.model]
        if upstream_switch:  # upstream's switch has none of the recipe's draft-sync paths or flags
            config["fallback_args"] = {}
        jobs.append(
            {
                "config": config,
                "target": m["target"],
                "eagle3_draft": m["eagle3_draft"],
                "workloads": [{"name": w, "requests": [asdict(r) for r in wls[w].requests]} for w in c.workloads],
                "stats_path": str(out_dir / f"{c.name}.stats.json") if c.algorithm else None,
                "port": port_base + 50 * i,
                "tp_size": tp_size,
            }
        )
        if c.stock:  # the release as published: no recipe, so no counters file
            jobs[-1].update(python_path=str(stock_root), stats_path=None)
        if c.served:  # its server writes to the job's log, where its switch lines are read
            jobs[-1].update(module="spectool.harness.verify.server_worker", log_path=str(out_dir / f"{c.name}.log"))
        if upstream_switch and c.algorithm:
            jobs[-1].update(observe="log", log_path=str(out_dir / f"{c.name}.log"), initial_steps=3)
        if c.model != "dense" and not m.get("meta"):  # its models are trained by a job of the run
            jobs[-1]["after"] = TRAIN_MOE
    return jobs, cfgs, skipped


def evaluate(
    results,
    cfgs,
    wls,
    models,
    sg_version,
    arch,
    gpu_name,
    golden_root,
    record,
    skipped=None,
    recipe_counters: bool = True,
    kept_kinds: frozenset[str] = frozenset(),
) -> dict:
    """Scenario rows, golden checks and the verdict. `recipe_counters`: the fallback counters
    are spectool's stats file (False where the switch is upstream's and they are rebuilt
    from its log, which has no KV-only path to count). `kept_kinds`: the request kinds the
    release's fallback keeps speculating (kept_speculative); a scenario whose requests ask
    for one is checked as the release's rule serves it (scenarios.kept_speculative_claims)."""
    by_name = {c.name: c for c in cfgs}
    rows, engine_errors = [], {}
    for name, res in results.items():
        if not res.get("ok"):
            engine_errors[name] = {"error": res.get("error", "failed"), "log_tail": res.get("log_tail", "")}
    # Each baseline's tokens under its golden key (the workload, or model/backend/workload),
    # with the weights of a model that is keyed by them (the MoE target: trained on a GPU, it
    # differs from run to run unless committed).
    moe_sha = (models.get("moe") or {}).get("meta", {}).get("weights_sha")
    baselines = {}
    for c in cfgs:
        if c.algorithm is None and results.get(c.name, {}).get("ok"):
            for w in c.workloads:
                baselines.setdefault(
                    c.golden_key(w),
                    {
                        "prompts": [r.prompt for r in wls[w].requests],
                        "requests": results[c.name]["workloads"][w]["requests"],
                        **({"model_weights": moe_sha} if c.model == "moe" else {}),
                    },
                )
    gpath = compare.golden_path(golden_root, sg_version, arch)
    golden_problems, golden_skipped = [], []
    cross = {}

    def same_model(path: Path, data: dict) -> bool:
        """A golden file speaks only for the model it was recorded with (TP>1 trains its own)."""
        if data.get("model", {}).get("key") == models["meta"]["key"]:
            return True
        golden_skipped.append(
            f"{path}: recorded with model {data.get('model', {}).get('key')}, this run's is "
            f"{models['meta']['key']}; its engines are compared with their baselines only"
        )
        return False

    def checked(path: Path, data: dict, *, only_held: bool = False) -> list[str]:
        """The baselines against a golden file: those whose workload it holds for these
        weights (every one, unless `only_held`: one it lacks is a problem then)."""
        problems = []
        for key, b in baselines.items():
            held = data.get("workloads", {}).get(key)
            if held is None and only_held:
                continue
            if held is None and data.get("workloads"):  # a workload added after the recording
                golden_skipped.append(
                    f"{path} has no workload {key} (add it with --record); compared with its baseline only"
                )
                continue
            if held is not None and held.get("model_weights") != b.get("model_weights"):
                golden_skipped.append(
                    f"{path}: {key} was recorded with model weights {held.get('model_weights')}, this run's are "
                    f"{b.get('model_weights')}; compared with its baseline only"
                )
                continue
            problems += compare.compare_to_golden(data, key, b["prompts"], b["requests"])
        return problems

    for other in sorted(Path(golden_root).glob(f"*/{arch}/golden.json")):
        if other == gpath:
            continue
        # Same model, same prompts: plain decoding of another release must give the same tokens.
        odata = json.loads(other.read_text())
        if not same_model(other, odata):
            continue
        cross[odata.get("sglang_version", other.parent.parent.name)] = checked(other, odata, only_held=True)
    if record:
        # Recording adds workloads the file lacks and keeps those this run did not decode; the
        # ones it holds must still decode as recorded (plain decoding did not change), else
        # the run fails, naming them.
        kept = {}
        if gpath.exists():
            old = json.loads(gpath.read_text())
            if same_model(gpath, old):
                golden_problems += checked(gpath, old, only_held=True)
                kept = {k: v for k, v in old.get("workloads", {}).items() if k not in baselines}
        data = compare.make_golden(
            sg_version,
            arch,
            models["meta"],
            {"threshold": scenarios.THRESHOLD, "engine": "pytorch sampling, greedy; triton attention unless keyed"},
            baselines,
        )
        data["workloads"] = dict(sorted({**kept, **data["workloads"]}.items()))
        gpath.parent.mkdir(parents=True, exist_ok=True)
        gpath.write_text(json.dumps(data, indent=1))
    elif gpath.exists():
        golden = json.loads(gpath.read_text())
        if same_model(gpath, golden):
            golden_problems += checked(gpath, golden)
    elif models["meta"]["key"] != ModelSpec().key():
        golden_skipped.append(
            f"no golden file for model {models['meta']['key']}; its engines are compared with their baselines only"
        )
    else:
        golden_problems.append(f"no golden file at {gpath} (record one with --record)")
    skipped = skipped or {}
    for s in scenarios.scenarios():
        why = skipped.get(s.config) or (  # a reference skipped: a scenario of an engine that ran
            s.config in by_name and s.reference in skipped and f"its reference {s.reference}: {skipped[s.reference]}"
        )
        if why:
            rows.append(
                {
                    "scenario": s.name,
                    "config": s.config,
                    "workload": s.workload,
                    "what": s.what,
                    "ok": True,
                    "skipped": why,
                    "failures": [],
                }
            )
            continue
        c = by_name.get(s.config)
        if c is None:
            continue
        row = {"scenario": s.name, "config": s.config, "workload": s.workload, "what": s.what}
        base = scenarios.baseline_for(c, cfgs, s.workload)
        res, bres = results.get(c.name, {}), results.get(base.name, {})
        if not res.get("ok") or not bres.get("ok"):
            row.update(ok=False, failures=[f"engine {c.name if not res.get('ok') else base.name} failed"])
            rows.append(row)
            continue
        cand = res["workloads"][s.workload]
        basew = bres["workloads"][s.workload]
        prompts = [r.prompt for r in wls[s.workload].requests]
        cmp = compare.compare_tokens(basew["requests"], cand["requests"], prompts)
        window = compare.stats_window(cand["stats_before"], cand["stats_after"])
        fails = [] if cmp.ok else [f"{len(cmp.mismatches)} request(s) differ from the no-speculation baseline"]
        if s.reference:  # the release as published is the claim; plain decoding's difference is reported
            ref = results.get(s.reference, {})
            if not ref.get("ok"):
                row.update(ok=False, failures=[f"engine {s.reference} {'failed' if ref else 'did not run'}"])
                rows.append(row)
                continue
            row.update(reference=s.reference, baseline_mismatches=cmp.mismatches)
            cmp = compare.compare_tokens(ref["workloads"][s.workload]["requests"], cand["requests"], prompts)
            fails = [] if cmp.ok else [f"{len(cmp.mismatches)} request(s) differ from {s.reference}'s"]
        expect, rule = s.expect, sorted(scenarios.request_kinds(wls[s.workload]) & kept_kinds)
        if rule and c.threshold is not None:
            expect = scenarios.kept_speculative_claims(expect)
            row["what"] += f" (SGLang {sg_version} keeps {' and '.join(rule)} batches speculating: checked as such)"
        claims = scenarios.expectations(expect, recipe_counters=recipe_counters)
        fails += compare.check_expectations(claims, window)
        fails += compare.compare_outputs(basew["requests"], cand["requests"], claims)
        fails += compare.check_server(claims, window, cand, c.threshold, c.hysteresis)
        tr = compare.transitions(window["phases"])
        # No step counted (the patch without the flag): the counts are unknown, not zero.
        counted = compare.counted_steps(window) > 0
        row.update(
            ok=not fails,
            failures=fails,
            requests=cmp.requests,
            equal=cmp.equal,
            tokens=cmp.tokens,
            mismatches=cmp.mismatches,
            fallback_steps=window["fallback_steps"] if counted else None,
            spec_steps=window["spec_steps"] if counted else None,
            kv_only_steps=window["draft_kv_only_steps"],
            kv_only_graph_steps=window["draft_kv_only_graph_steps"],
            kv_only_prefills=window["draft_kv_only_prefills"],
            acceptance=compare.acceptance(window["phases"]),
            acceptance_before=tr["acceptance_before"],
            acceptance_after=tr["acceptance_after"],
            min_baseline_margin=compare.min_margin(basew["requests"]),
            seconds=cand["seconds"],
            fallback_memory_gib=cand["stats_after"].get("startup_memory_gib"),
        )
        rows.append(row)
    ok = all(r["ok"] for r in rows) and not engine_errors and not golden_problems
    return {
        "ok": ok,
        "sglang_version": sg_version,
        "gpu_arch": arch,
        "gpu": gpu_name,
        "golden_file": str(gpath),
        "recorded": record,
        "golden_problems": golden_problems,
        "golden_skipped": golden_skipped,
        "other_releases_golden": cross,
        "engine_errors": engine_errors,
        "scenarios": rows,
        "model": models["meta"],
        "moe_model": (models.get("moe") or {}).get("meta"),
        "engines": {
            k: {"startup_s": v.get("startup_s"), "total_s": v.get("total_s"), "ok": v.get("ok")}
            for k, v in results.items()
        },
    }


def _difference(m: dict) -> str:
    return (
        f"request {m.get('request')}: first difference at token {m.get('first_diff')} "
        f"(baseline {m.get('baseline_token')} vs {m.get('candidate_token')}, "
        f"baseline top-2 gap {m.get('baseline_top2_margin')})"
    )


def print_report(report: dict, console) -> None:
    from rich.table import Table

    tp = f", TP={report['tp_size']}" if report.get("tp_size", 1) > 1 else ""
    t = Table(title=f"spectool verify: SGLang {report['sglang_version']} on {report['gpu']} ({report['gpu_arch']}){tp}")
    for col in (
        "scenario",
        "result",
        "equal/req",
        "tokens",
        "fallback",
        "spec",
        "accept",
        "acc before/after",
        "min margin",
    ):
        t.add_column(col)

    def f(x, d=2):
        return "-" if x is None else f"{x:.{d}f}"

    for r in report["scenarios"]:
        if r.get("skipped"):
            t.add_row(r["scenario"], "[yellow]skip[/]", *["-"] * 7)
            continue
        t.add_row(
            r["scenario"],
            "[green]pass[/]" if r["ok"] else "[red]FAIL[/]",
            f"{r.get('equal', '-')}/{r.get('requests', '-')}",
            str(r.get("tokens", "-")),
            f(r.get("fallback_steps"), 0),
            f(r.get("spec_steps"), 0),
            f(r.get("acceptance")),
            f"{f(r.get('acceptance_before'))}/{f(r.get('acceptance_after'))}",
            f(r.get("min_baseline_margin")),
        )
    console.print(t)
    for r in report["scenarios"]:
        for fl in r.get("failures", []):
            console.print(f"[red]{r['scenario']}[/]: {fl}")
        for m in r.get("mismatches", [])[:3]:
            console.print(f"    {_difference(m)}")
        if r.get("baseline_mismatches"):
            console.print(
                f"{r['scenario']}: as on {r['reference']}, plain decoding differs: "
                + "; ".join(_difference(m) for m in r["baseline_mismatches"][:3])
            )
    for r in report["scenarios"]:
        if r.get("skipped"):
            console.print(f"[yellow]{r['scenario']}[/]: skipped: {r['skipped']}")
    memory = {
        r["config"]: r["fallback_memory_gib"] for r in report["scenarios"] if r.get("fallback_memory_gib") is not None
    }
    if memory:
        console.print(
            "GPU memory the fallback took at start-up: "
            + ", ".join(f"{name} {gib:.2f} GiB" for name, gib in sorted(memory.items()))
            + (
                " (free GPU memory before and after, as SGLang reads its own graphs': engines that start "
                "together on one GPU read each other's allocations, so only a lone engine's reading is its own)"
                if len(report.get("engines", {})) > 1
                else ""
            )
        )
    for name, e in report["engine_errors"].items():
        console.print(f"[red]engine {name} failed[/]: {e['error']}\n{e['log_tail']}", markup=False)
    for p in report["golden_problems"]:
        console.print(f"golden: {p}")
    for p in report.get("golden_skipped") or []:
        console.print(f"[yellow]golden file not used[/]: {p}")
    for version, problems in (report.get("other_releases_golden") or {}).items():
        console.print(
            f"plain decoding vs SGLang {version}'s golden file: "
            + ("identical tokens" if not problems else f"{len(problems)} difference(s): {problems[:3]}")
        )
    console.print(f"overall: {'PASS' if report['ok'] else 'FAIL'} in {report.get('wall_seconds')} s")
