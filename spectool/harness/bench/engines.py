"""The bench's engine processes: the environment each arm's engine runs in (its SGLang tree
first on PYTHONPATH, the simulated acceptance), starting them in parallel and waiting until
they serve, telling an engine that started degraded or died from a slow one, and the
commands the sweep sends them (bench/worker.py answers them)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BadInputError
from .arms import engine_kwargs
from .models import DEFAULT_TARGET, write_models

# Engine ports: PORT_BASE + 100*i. Two benches on one host (one per GPU) need their own base,
# below 32768, where Linux hands out ephemeral ports: the rendezvous ports are fixed.
PORT_BASE = 32000


def arm_port(port_base: int, i: int) -> int:
    """The port of the i-th engine of a bench (its rendezvous port inside that block)."""
    return port_base + 100 * i


@dataclass(frozen=True)
class Environments:
    """Where each arm's engine runs: the --sglang-dir tree (release `version`, environment
    `env`), or for the arms of --arm-sglang-dir a tree of their own."""

    version: str | None
    env: dict
    arm_versions: dict = field(default_factory=dict)
    arm_envs: dict = field(default_factory=dict)

    def release(self, arm: str) -> str | None:
        return self.arm_versions.get(arm, self.version)

    def of(self, arm: str) -> dict:
        return self.arm_envs.get(arm, self.env)


def environments(sglang_dir, arm_trees: dict | None, acc_len: float) -> Environments:
    """The engines' environments. An arm on a tree of its own leaves the --sglang-dir tree (the
    first entry of its PYTHONPATH, see environment) out of its path, so nothing of that release
    fills in for a module its own lacks."""
    version, env = environment(sglang_dir, acc_len)
    under_test = env["PYTHONPATH"].split(os.pathsep)[0] if sglang_dir else None
    versions, envs = {}, {}
    for name, tree in (arm_trees or {}).items():
        versions[name], arm_env = environment(tree, acc_len)
        kept = [p for p in arm_env.get("PYTHONPATH", "").split(os.pathsep) if p != under_test]
        envs[name] = {**arm_env, "PYTHONPATH": os.pathsep.join(kept)}
    return Environments(version, env, versions, envs)


def environment(sglang_dir, acc_len):
    """(SGLang version, environment) for the engine processes: the tree first on PYTHONPATH."""
    env = dict(os.environ, SGLANG_SIMULATE_ACC_LEN=str(acc_len), PYTHONUNBUFFERED="1")
    version = None
    if sglang_dir:
        from ...source import locate

        tree = locate(sglang_dir)
        version = str(tree.version)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree.root), str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH", "")]
        )
    return version, env


def kv_pool_tokens(max_bs: int, prompt_len: int, out_len: int) -> int:
    """The engines' KV pool (max_total_tokens), the same for every arm of a bench or profile:
    every request of the largest load at its full length, with a few slots each to spare (the
    speculative arms allocate ahead of their verified length), and a fixed margin."""
    return max_bs * (prompt_len + out_len + 16) + 4096


@contextlib.contextmanager
def start(
    arm_list,
    out: Path,
    envs: Environments,
    max_bs: int,
    max_total_tokens: int,
    log_level: str = "warning",
    port_base: int = PORT_BASE,
    tp: int = 1,
    target: str = DEFAULT_TARGET,
    failed: dict | None = None,
):
    """Start one engine process per arm (in parallel), each in its environment of `envs`,
    yield (procs, startup seconds), stop them. Engine i owns the ports from port_base + 100*i
    (its rendezvous port among them). An engine that dies or starts degraded stops the start
    with its reason, unless `failed` is given: then the reason goes there (arm -> one
    paragraph), that engine is stopped, and the others are yielded, so that one arm that
    cannot run does not cost the others' measurements; a start with none left still stops."""
    models = write_models(out / "models", target)
    procs = {}
    for i, arm in enumerate(arm_list):
        job = {
            "engine": engine_kwargs(
                arm,
                models,
                max_bs=max_bs,
                max_total_tokens=max_total_tokens,
                port=arm_port(port_base, i),
                log_level=log_level,
                tp=tp,
            ),
            "ready_path": str(out / f"{arm.name}.ready.json"),
            "stats_path": str(out / f"{arm.name}.stats.json") if arm.threshold is not None else None,
        }
        Path(job["ready_path"]).unlink(missing_ok=True)
        log = open(out / f"{arm.name}.log", "w")
        procs[arm.name] = subprocess.Popen(
            [sys.executable, "-m", "spectool.harness.bench.worker", json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=envs.of(arm.name),
            text=True,
            start_new_session=True,
        )
    try:
        reasons = wait_ready(procs, out, timeout=420, stop_at_first=failed is None)
        for name in procs:
            if name not in reasons:
                degraded = degraded_engine(name, (out / f"{name}.log").read_text(errors="replace"))
                if degraded:
                    reasons[name] = degraded
        if reasons and (failed is None or len(reasons) == len(procs)):
            raise BadInputError(" ".join(reasons.values()))
        if reasons:
            _stop({name: procs.pop(name) for name in reasons})
            failed.update(reasons)
        yield procs, {a: json.loads((out / f"{a}.ready.json").read_text())["startup_s"] for a in procs}
    finally:
        _stop(procs)


def _stop(procs: dict) -> None:
    """Ask each engine to quit, then kill the process group of any that has not within 20 s."""
    for p in procs.values():
        try:
            p.stdin.write(json.dumps({"quit": True}) + "\n")
            p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass
    for p in procs.values():
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass


# What to change when the engines do not fit the GPU together (each arm's engine holds a KV
# pool for every request of its batch capacity at full length: engine_batch): degraded_engine,
# engine_failure.
MEMORY_ADVICE = (
    "Free GPU memory: fewer arms at once (--arms, --max-engines), a smaller largest C or --max-batch, "
    "or shorter requests (--out-len), and run again."
)


def degraded_engine(arm: str, log: str) -> str | None:
    """An engine that started but not as the bench asked, so that its timings would not be
    comparable: the reason, or None. Both cases are SGLang or the fallback making do with
    too little GPU memory, quietly: the fallback serves eagerly when its CUDA graphs cannot
    be captured, and SGLang shrinks a KV pool that does not fit (on the H200, a third engine
    with a pool for 256 requests of 1152 tokens got 34 038 tokens and ran its waves at 30
    requests, retracting)."""
    for line in log.splitlines():
        if "spec-fallback: could not capture" in line:
            return (
                f"bench arm {arm} started without its fallback CUDA graphs, so its timings would not be "
                f"the fallback's: {line.split('spec-fallback: ', 1)[1][:300]} {MEMORY_ADVICE}"
            )
        if "speculative_adaptive disabled:" in line:
            return (
                f"bench arm {arm} asked for SGLang's adaptive steps, which its engine turned off: "
                f"{line.split('speculative_adaptive disabled:', 1)[1].strip()[:300]}"
            )
        shrunk = re.search(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)", line)
        if shrunk:
            return (
                f"bench arm {arm}'s engine got a KV pool of {int(shrunk[2]):,} tokens, not the {int(shrunk[1]):,} "
                "the bench sizes every arm's for (every request of the largest C at full length), so it would "
                f"run smaller batches than the other arms. {MEMORY_ADVICE}"
            )
    return None


def wait_ready(procs, out, timeout, stop_at_first: bool = False) -> dict:
    """Wait until every engine serves or has died (`stop_at_first`: until the first dies): arm
    -> why, for those that died or did not serve within `timeout` seconds (empty when all
    serve)."""
    t0, reasons = time.time(), {}
    while True:
        missing = [a for a in procs if a not in reasons and not (out / f"{a}.ready.json").exists()]
        for a in missing:
            if procs[a].poll() is not None:
                reasons[a] = engine_failure(a, procs[a].returncode, "its start", out / f"{a}.log")
        missing = [a for a in missing if a not in reasons]
        if not missing or (reasons and stop_at_first):
            return reasons
        if time.time() - t0 > timeout:
            return {**reasons, **{a: f"bench arm {a}'s engine did not start within {timeout} s." for a in missing}}
        time.sleep(0.1)  # a file's existence: cheap to ask often, and the first command waits on it


def engine_failure(arm: str, returncode: int, during: str, log: Path) -> str:
    """Why an arm's engine died, in one paragraph: the error its log ends with (the exit code
    alone, -9 or 1, says nothing), and for CUDA out-of-memory what to change: every arm's
    engine shares the GPU and holds a KV pool sized for its batch capacity's whole requests."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [ln.strip() for ln in lines if re.match(r"^\s*[\w.]*(Error|Exception)\b.*:", ln)]
    msg = f"bench arm {arm}'s engine exited with {returncode} during {during}"
    if errors:
        msg += f": {errors[-1][:400].rstrip('.')}"
    msg += f". Its log: {log}."
    if any("out of memory" in e.lower() for e in errors):
        msg += " The arms' engines share the GPU. " + MEMORY_ADVICE
    elif not errors:
        msg += " Its last lines:\n" + "\n".join(lines[-30:])
    return msg


def command(proc, arm: str, out, cmd):
    rp = out / f"result-{time.time_ns()}.json"
    cmd["result_path"] = str(rp)
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    while not rp.exists():
        if proc.poll() is not None:
            during = cmd["kind"] + (f" at C={cmd['C']}" if "C" in cmd else "")
            raise BadInputError(engine_failure(arm, proc.returncode, during, out / f"{arm}.log"))
        time.sleep(0.05)
    res = json.loads(rp.read_text())
    rp.unlink()
    return res
