"""The upgrade gate through pre-commit itself (`pre-commit run`, the hook named in the user's
configuration) on a scratch repository, as a user runs it: a bump that passes (with the advice to retire what is upstream), one that
drifts (the drift report with the nearest candidates, the old pin read from git), the PEP 503
spellings of the pin, a range checked at its lowest release, and a requirement that names no
release refused. The tests share one pre-commit home, so the hook's environment is built once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.network
REPO = Path(__file__).resolve().parent.parent


def _pre_commit():
    exe = shutil.which("pre-commit") or str(Path(sys.executable).with_name("pre-commit"))
    if not Path(exe).exists():
        pytest.skip("pre-commit is not installed (pip install '.[test]')")
    return exe


def _git(cwd, *args):
    subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory):
    """A committed copy of this repository (pre-commit clones the hook's repository; CI's
    clone is one)."""
    dst = tmp_path_factory.mktemp("hookrepo") / "spectool"
    ignore = shutil.ignore_patterns(
        ".venv", ".cache", "build", "results", ".git", "__pycache__", ".device-cache", ".whl"
    )
    shutil.copytree(REPO, dst, ignore=ignore)
    _git(dst, "init", "-q")
    _git(dst, "add", "-A")
    _git(dst, "commit", "-qm", "snapshot")
    return dst


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory):
    return tmp_path_factory.mktemp("pre-commit-home")


def _run_gate(tmp_path, hook_repo, home, requirement, *, env=None, before="sglang==0.5.12", try_repo=False):
    """A user repository whose configuration names the gate and whose requirements.txt pinned
    `before` in HEAD and now says `requirement`; the hook run by `pre-commit run` as a user's
    commit would (no --verbose), or with `try_repo` by `pre-commit try-repo`, as a user tries a
    hook before adding it to the configuration."""
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hook_repo, check=True, capture_output=True, text=True)
    work = tmp_path / "user"
    work.mkdir()
    _git(work, "init", "-q")
    (work / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hook_repo}\n    rev: {rev.stdout.strip()}\n    hooks:\n      - id: spectool-upgrade-gate\n"
    )
    (work / "requirements.txt").write_text(f"torch==2.11.0\n{before}\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "pin")
    (work / "requirements.txt").write_text(f"torch==2.11.0\n{requirement}\n")
    _git(work, "add", "-A")
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), **(env or {})}
    command = ["try-repo", str(hook_repo)] if try_repo else ["run"]
    r = subprocess.run(
        [_pre_commit(), *command, "spectool-upgrade-gate", "--files", "requirements.txt"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    r.output = r.stdout + r.stderr
    return r


def _fake_release(sglang_release, cache: Path, version: str) -> None:
    """A cached release `version` (as `spectool fetch` leaves one): SGLang 0.5.12's sources with
    EAGLEWorkerV2.clear_cache_pool renamed, the anchor the fallback's methods follow."""
    tree = sglang_release("0.5.12")
    dest = cache / f"sglang-{version}"
    shutil.copytree(tree, dest)
    for meta in dest.glob("sglang-*.dist-info/METADATA"):
        meta.write_text(meta.read_text().replace("Version: 0.5.12\n", f"Version: {version}\n", 1))
    worker = dest / "sglang/srt/speculative/eagle_worker_v2.py"
    worker.write_text(worker.read_text().replace("def clear_cache_pool(", "def clear_cache_pools("))
    (dest / ".spectool-fetched").write_text(json.dumps({"file": "test", "sha256": "-"}))


def test_a_good_bump_passes_and_shows_what_to_retire(tmp_path, hook_repo, pre_commit_home):
    r = _run_gate(tmp_path, hook_repo, pre_commit_home, "sglang==0.5.17")
    assert r.returncode == 0, r.output[-3000:]
    assert "requirements.txt pins SGLang 0.5.17 (from 0.5.12)" in r.output
    assert "upgrade to SGLang 0.5.17: ready" in r.output
    assert "retire: sm120 is upstream in SGLang 0.5.17" in r.output  # shown without -v: the hook is verbose


@pytest.mark.parametrize("try_repo", [False, True], ids=["run", "try-repo"])
def test_a_drifting_bump_fails_with_the_drift_report(tmp_path, hook_repo, pre_commit_home, sglang_release, try_repo):
    cache = tmp_path / "cache"
    _fake_release(sglang_release, cache, "0.5.12.post99")
    r = _run_gate(
        tmp_path,
        hook_repo,
        pre_commit_home,
        "sglang==0.5.12.post99",
        env={"SPECTOOL_CACHE": str(cache)},
        try_repo=try_repo,
    )
    assert r.returncode == 1, r.output[-3000:]
    assert "need work" in r.output and "spec-fallback (drift)" in r.output
    assert "no member 'clear_cache_pool' to place the method after" in " ".join(r.output.split())
    assert "spec-fallback: nearest candidates in the new source:" in r.output
    assert "EAGLEWorkerV2.clear_cache_pools" in r.output


@pytest.mark.parametrize(
    "requirement",
    [
        "SGLang==0.5.12.post1",
        "sglang[all] == 0.5.12.post1 ; python_version >= '3.8'",
        "Sglang==0.5.12.post1 --hash=sha256:" + "0" * 64,
    ],
)
def test_every_spelling_of_the_pin_is_checked(tmp_path, hook_repo, pre_commit_home, requirement):
    r = _run_gate(tmp_path, hook_repo, pre_commit_home, requirement)
    assert r.returncode == 0, r.output[-3000:]
    assert "requirements.txt pins SGLang 0.5.12.post1 (from 0.5.12)" in r.output
    assert "upgrade to SGLang 0.5.12.post1: ready" in r.output


def test_a_range_is_checked_at_its_lowest_allowed_release(tmp_path, hook_repo, pre_commit_home):
    r = _run_gate(tmp_path, hook_repo, pre_commit_home, "sglang>=0.5.12.post1,<0.5.13")
    assert r.returncode == 0, r.output[-3000:]
    assert "'sglang>=0.5.12.post1,<0.5.13' is a range: checked at its lowest allowed release, 0.5.12.post1" in r.output
    assert "upgrade to SGLang 0.5.12.post1: ready" in r.output


def test_a_requirement_without_a_release_is_refused(tmp_path, hook_repo, pre_commit_home):
    r = _run_gate(tmp_path, hook_repo, pre_commit_home, "sglang<0.6")
    assert r.returncode == 1 and "- exit code: 2" in r.output, r.output[-3000:]  # pre-commit exits 1 on any failure
    assert "'sglang<0.6' does not pin SGLang to a release" in " ".join(r.output.split())
    assert "nothing to check" not in r.output
