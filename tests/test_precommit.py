"""The upgrade gate through pre-commit itself, as a user's configuration names it, on a
scratch repository: a pin bump that passes (0.5.12 -> 0.5.17: threshold applies, the rest is
upstream) and one that drifts (0.5.12 -> 0.5.13: the flag's anchors moved). Both share one
pre-commit home, so the hook's environment is built once."""

from __future__ import annotations

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
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory):
    """A committed copy of this repository (try-repo wants a git repo; CI's clone is one)."""
    dst = tmp_path_factory.mktemp("hookrepo") / "spectool"
    ignore = shutil.ignore_patterns(".venv", ".cache", "build", "results", ".git", "__pycache__", ".device-cache", ".whl")
    shutil.copytree(REPO, dst, ignore=ignore)
    _git(dst, "init", "-q")
    _git(dst, "add", "-A")
    _git(dst, "commit", "-qm", "snapshot")
    return dst


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory):
    return tmp_path_factory.mktemp("pre-commit-home")


def _run_gate(tmp_path, hook_repo, home, pre_commit, version):
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hook_repo, check=True, capture_output=True, text=True).stdout
    work = tmp_path / "user"
    work.mkdir()
    _git(work, "init", "-q")
    (work / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hook_repo}\n    rev: {rev.strip()}\n    hooks:\n      - id: spectool-upgrade-gate\n")
    (work / "requirements.txt").write_text("sglang==0.5.12\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "pin 0.5.12")
    (work / "requirements.txt").write_text(f"sglang=={version}\n")
    _git(work, "add", "-A")
    env = {**os.environ, "PRE_COMMIT_HOME": str(home)}
    return subprocess.run([pre_commit, "run", "spectool-upgrade-gate", "--verbose", "--files", "requirements.txt"],
                          cwd=work, capture_output=True, text=True, env=env, timeout=1800)


def test_gate_passes_on_a_good_bump(tmp_path, hook_repo, pre_commit_home):
    r = _run_gate(tmp_path, hook_repo, pre_commit_home, _pre_commit(), "0.5.17")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "upgrade to SGLang 0.5.17: ready" in r.stdout


def test_gate_fails_on_a_drifting_bump(tmp_path, hook_repo, pre_commit_home):
    r = _run_gate(tmp_path, hook_repo, pre_commit_home, _pre_commit(), "0.5.13")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "need work" in r.stdout and "spec-disable-threshold" in r.stdout
    assert "handle_speculative_decoding" in r.stdout  # where the anchor went
