"""tools/device/stage.sh, the stage of a derived sweep: its budget within the call's time, its
status, and the log the results folder keeps. The bench is a stub that records its arguments;
the time left in the call is given (call_seconds_left, redefined), so no test waits or
depends on the machine's speed."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stage(tmp_path, *, left, budget, bench_prints="cells 4/4", env="", args=("--arms", "A0,A1")):
    """Run `stage bench-fixed.log BUDGET ARGS` with `left` seconds left in the call; return
    (status, stdout, the stub's argv or None, the folder's log or None)."""
    out, dest = tmp_path / "out", tmp_path / "out" / "sweep"
    dest.mkdir(parents=True, exist_ok=True)
    stub = tmp_path / "bench"
    stub.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\necho {shlex.quote(bench_prints)}\n')
    stub.chmod(0o755)
    script = (
        f"OUT={out} DEST={dest} BENCH=({stub}); {env}\n"
        "source tools/device/stage.sh\n"
        + f"call_seconds_left() {{ echo {left}; }}\n"
        + f"stage bench-fixed.log {budget} {shlex.join(args)}\n"
    )
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True)
    argv = tmp_path / "argv"
    log = dest / "bench-fixed.log"
    return (
        run.returncode,
        run.stdout,
        argv.read_text().split() if argv.exists() else None,
        log.read_text() if log.exists() else None,
    )


def test_a_stage_runs_with_its_own_budget_when_the_call_has_time(tmp_path):
    rc, _, argv, log = _stage(tmp_path, left=530, budget=300)
    assert rc == 0
    assert argv == ["--no-transition", "--budget", "300", "--arms", "A0,A1"]
    assert log.startswith("== ") and "--budget 300" in log and "cells 4/4" in log


def test_a_stage_gets_only_what_is_left_of_the_call(tmp_path):
    rc, _, argv, _ = _stage(tmp_path, left=340, budget=300)  # less the timeout's 60 s
    assert rc == 0
    assert argv[argv.index("--budget") + 1] == "280"


def test_a_stage_with_too_little_time_left_waits_for_the_next_call(tmp_path):
    rc, stdout, argv, log = _stage(tmp_path, left=220, budget=300)  # 160 s once the timeout's are kept
    assert rc == 75
    assert argv is None and log is None
    assert "call again" in stdout


def test_a_short_budget_asked_for_runs_as_asked(tmp_path):
    rc, _, argv, _ = _stage(tmp_path, left=540, budget=60)  # a resumed stage with little to do
    assert rc == 0
    assert argv[argv.index("--budget") + 1] == "60"


def test_the_call_budget_and_the_stage_minimum_are_settings(tmp_path):
    clock = "source tools/device/stage.sh; CALL_BUDGET=1000; SECONDS=100; call_seconds_left"
    left = int(subprocess.run(["bash", "-c", clock], cwd=ROOT, capture_output=True, text=True).stdout)
    assert 0 <= 900 - left < 100  # CALL_BUDGET less the elapsed seconds (and any bash took)
    rc, _, argv, _ = _stage(tmp_path, left=220, budget=300, env="MIN_STAGE_S=60")
    assert rc == 0
    assert argv[argv.index("--budget") + 1] == "160"


def test_a_stage_stopped_by_its_budget_returns_75_and_keeps_its_log(tmp_path):
    rc, stdout, _, log = _stage(tmp_path, left=540, budget=300, bench_prints="time budget reached: stopping")
    assert rc == 75
    assert "call again to resume them" in stdout
    assert "time budget reached" in log


def test_the_folders_log_keeps_every_calls_stage(tmp_path):
    _stage(tmp_path, left=540, budget=300, bench_prints="time budget reached: stopping")
    _, _, _, log = _stage(tmp_path, left=540, budget=300, bench_prints="cells 31/31")
    assert log.count("\n== ") + log.startswith("== ") == 2
    assert log.index("time budget reached") < log.index("cells 31/31")


def test_the_transition_runs_only_in_the_stage_that_asks_for_it(tmp_path):
    _, _, argv, _ = _stage(tmp_path, left=540, budget=200, env="STAGE_TRANSITION=1")
    assert "--no-transition" not in argv


def _checkout(tmp_path) -> Path:
    """A stand-in checkout: the device scripts, and one file in each folder whose hashes a
    call records."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "tools/device", root / "tools/device")
    for folder in ("recipes", "golden", "spectool"):
        (root / folder).mkdir()
        (root / folder / "f").write_text(folder)
    return root


def _bench_tiers(tmp_path, upstream_has_adaptive_steps: bool):
    """Run bench-tiers.sh in a stand-in checkout whose carried runtime archive setup.sh unpacks
    into SITE, with UPSTREAM_SITE naming that tree; `python3` is a stub exiting 9, so a call
    that passes the check stops at its next step (applying the recipes)."""
    root = _checkout(tmp_path)
    tree = tmp_path / "runtime"
    (tree / "sglang/srt").mkdir(parents=True)
    (tree / ".spectool-wheels").touch()
    field = "speculative_adaptive_config: str = None" if upstream_has_adaptive_steps else "speculative_num_steps = 3"
    (tree / "sglang/srt/server_args.py").write_text(f"class ServerArgs:\n    {field}\n")
    (root / ".device-cache").mkdir()
    with tarfile.open(root / ".device-cache/sglang-0.5.17-site.tar.xz", "w:xz") as archive:
        archive.add(tree, arcname=".")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python3").write_text("#!/bin/sh\nexit 9\n")
    (stubs / "python3").chmod(0o755)
    site = tmp_path / "site-0.5.17"  # not there yet: setup.sh unpacks it
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "OUT": str(tmp_path / "out"),
        "SITE": str(site),
        "UPSTREAM_SITE": str(site),
    }
    return subprocess.run(
        ["bash", "tools/device/bench-tiers.sh", "0.5.17", str(tmp_path / "results")],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
    )


def test_upstream_site_may_name_the_tree_the_call_unpacks(tmp_path):
    run = _bench_tiers(tmp_path, upstream_has_adaptive_steps=True)
    assert "holds no SGLang with adaptive steps" not in run.stderr
    assert run.returncode == 9  # past the check, at `spectool apply`


def test_bench_tiers_refuses_an_upstream_tree_without_adaptive_steps(tmp_path):
    run = _bench_tiers(tmp_path, upstream_has_adaptive_steps=False)
    assert run.returncode == 2
    assert "holds no SGLang with adaptive steps (0.5.14 or later)" in run.stderr


def _unpack_from_parts(tmp_path, parts_carried: int):
    """Run unpack.sh in a stand-in checkout that holds the runtime archive only as the first
    `parts_carried` of its two parts (`split -b` pieces, as the calls before left them)."""
    root = _checkout(tmp_path)
    tree = tmp_path / "runtime"
    (tree / "sglang").mkdir(parents=True)
    (tree / "sglang/version.py").write_text("__version__ = '0.5.17'\n" + "#" * 4000)
    (tree / ".spectool-wheels").touch()
    whole = tmp_path / "whole.tar.xz"
    with tarfile.open(whole, "w:xz") as archive:
        archive.add(tree, arcname=".")
    data = whole.read_bytes()
    (root / ".device-cache").mkdir()
    for suffix, piece in list(zip("ab", (data[: len(data) // 2], data[len(data) // 2 :])))[:parts_carried]:
        (root / f".device-cache/sglang-0.5.17-site.tar.xz.part-a{suffix}").write_bytes(piece)
    site = tmp_path / "site-0.5.17"
    run = subprocess.run(
        ["bash", "tools/device/unpack.sh", "0.5.17"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "SITE": str(site)},
    )
    return run, site


def test_a_runtime_carried_in_parts_is_joined_and_unpacked(tmp_path):
    run, site = _unpack_from_parts(tmp_path, parts_carried=2)
    assert run.returncode == 0, run.stderr
    assert (site / "sglang/version.py").read_text().startswith("__version__ = '0.5.17'")


def test_a_runtime_missing_a_part_stops_before_anything_runs(tmp_path):
    run, site = _unpack_from_parts(tmp_path, parts_carried=1)
    assert run.returncode == 2
    assert "are not the whole archive: carry the missing ones" in run.stderr
    assert "sglang-0.5.17-site.tar.xz.part-aa)" in run.stderr
    assert not (site / "sglang").exists()
