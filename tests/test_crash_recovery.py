"""Kill apply and revert at every write step, then check what the tree and each command say.

A forked child runs the command with os.replace, os.fsync or os.unlink wrapped so that the
K-th call SIGKILLs the child (before the call; for replace and unlink also just after it),
for K = 1, 2, ... until the command completes unharmed. After each kill: status must not call a half-written tree fine,
check must refuse it, and the next command (recover, apply or revert, in turn) must leave a
consistent tree (pristine and unlocked, or completely patched and intact) with no temp files;
a final revert must give back the pristine bytes. A second test does the same through the
real CLI under strace, injecting SIGKILL at each rename(2).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spectool import api
from spectool.errors import SourceError

from .conftest import FIXTURES, REPO, make_tree

R1 = FIXTURES / "add_method" / "recipe"
FILES = ("sglang/srt/target.py", "sglang/srt/other.py")
CALLS = ("replace", "fsync", "unlink")
SRC = (FIXTURES / "add_method" / "before.py").read_bytes()


def _recipes(root: Path, *, variant: str = "2 * x") -> Path:
    """Two recipes on two files: one transaction writes both."""
    rdir = root / "recipes"
    for name, mod in (("a", "target"), ("b", "other")):
        shutil.copytree(R1, rdir / name, dirs_exist_ok=True)
        y = (R1 / "recipe.yaml").read_text().replace("fx-add-method", f"fx-{name}").replace("srt.target", f"srt.{mod}")
        (rdir / name / "recipe.yaml").write_text(y)
        code = (R1 / "code.py").read_text().replace("2 * x", variant)
        (rdir / name / "code.py").write_text(code)
    return rdir


def _tree(root: Path) -> Path:
    return make_tree(root / "tree", "0.5.12", {f: SRC for f in FILES})


def _killed(fn, call: str, k: int, after: bool) -> bool:
    """Run fn in a forked child that SIGKILLs itself at the k-th os.<call> (before or after it
    runs). True when the child was killed, False when fn finished first."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            real, count = getattr(os, call), [0]

            def hook(*args, **kwargs):
                count[0] += 1
                if count[0] == k and not after:
                    os.kill(os.getpid(), signal.SIGKILL)
                result = real(*args, **kwargs)
                if count[0] == k and after:
                    os.kill(os.getpid(), signal.SIGKILL)
                return result

            setattr(os, call, hook)
            fn()
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the command failed in the child ({call} #{k})"
    return False


def _snapshot(tree: Path) -> dict:
    return {f: (tree / f).read_bytes() for f in FILES}


def _temps(tree: Path) -> list[Path]:
    return [p for p in tree.rglob("*.spectool-tmp")]


def _consistent(tree: Path, patched: dict, before: dict | None = None) -> str:
    """'pristine', 'before' (as it was before the command) or 'patched': the only states a
    tree may be in once recovered."""
    files = _snapshot(tree)
    assert not _temps(tree), _temps(tree)
    if all(files[f] == SRC for f in FILES):
        assert not (tree / "spectool.lock").exists()
        return "pristine"
    state = "patched" if files == patched else "before" if files == before else None
    assert state, "half-patched tree"
    st = api.status(tree)
    assert st.ok and {f["state"] for f in st.files} == {"intact"}, st.to_json()
    return state


def _status_after_kill(tree: Path, rdir: Path, patched: dict, before: dict, stats: dict) -> None:
    """status: never fine on a half-written tree; when it says anything is unfinished, it
    names the one command that finishes it, and check refuses the tree too."""
    st = api.status(tree)
    notes = " ".join(st.notes)
    if st.ok:
        _consistent(tree, patched, before)  # fine only when the tree really is
        stats["status ok (consistent)"] += 1
    else:
        assert f"spectool recover --sglang-dir {tree}" in notes, notes
        stats["status names recover"] += 1
        with pytest.raises(SourceError, match="spectool recover"):
            api.check(tree, recipes_dir=rdir)


def _exercise(tmp_path, name: str, prepare, command, stats: dict) -> None:
    """Kill `command` at every step of every call kind; recover with each next command in turn."""
    steps = 0
    for call in CALLS:
        for after in (False, True) if call != "fsync" else (False,):  # after fsync #k = before the next step
            k = 1
            while True:
                root = tmp_path / f"{name}-{call}-{int(after)}-{k}"
                tree, rdir, patched = prepare(root)
                before = _snapshot(tree)
                if not _killed(functools.partial(command, tree, rdir), call, k, after):
                    assert _consistent(tree, patched)
                    break
                steps += 1
                _status_after_kill(tree, rdir, patched, before, stats)
                follow = ("recover", "apply", "revert")[steps % 3]
                if follow == "recover":
                    out = api.recover(tree)
                    assert out.ok, out.notes
                    stats[f"recover -> {_consistent(tree, patched, before)}"] += 1
                elif follow == "apply":
                    out = api.apply(tree, recipes_dir=rdir)
                    assert out.ok and _consistent(tree, patched) == "patched"
                    stats["apply again -> patched"] += 1
                else:
                    api.revert(tree)
                    assert _consistent(tree, patched) == "pristine"
                    stats["revert -> pristine"] += 1
                api.revert(tree)
                assert _snapshot(tree) == {f: SRC for f in FILES} and not (tree / ".spectool").exists()
                assert not (tree / "spectool.lock").exists()
                k += 1
    stats[f"{name}: steps killed"] = steps


def _prepared(template: Path, applied: bool, update: bool = False):
    """A factory of fresh copies of one prepared tree (and its recipes), with the bytes the
    command under test should leave when it completes."""
    tree, rdir = _tree(template), _recipes(template)
    patched_rdir = _recipes(template / "v2", variant="3 * x") if update else rdir
    if applied:
        assert api.apply(tree, recipes_dir=rdir).ok
    ref = _tree(template / "ref")
    assert api.apply(ref, recipes_dir=patched_rdir).ok
    patched = _snapshot(ref)

    def prepare(root: Path):
        shutil.copytree(tree, root / "tree", symlinks=True)
        shutil.copytree(patched_rdir, root / "recipes")
        return root / "tree", root / "recipes", patched

    return prepare


@pytest.fixture
def no_fsync(monkeypatch):
    """These tests kill processes, they do not cut power: skip the disk flushes (os.fsync
    is still called, and counted, at every step)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def test_kill_at_every_write_step(tmp_path, no_fsync):
    from collections import Counter

    stats: Counter = Counter()
    apply = lambda t, r: api.apply(t, recipes_dir=r)  # noqa: E731
    _exercise(tmp_path, "apply", _prepared(tmp_path / "t-apply", False), apply, stats)
    _exercise(tmp_path, "update", _prepared(tmp_path / "t-update", True, update=True), apply, stats)
    _exercise(tmp_path, "revert", _prepared(tmp_path / "t-revert", True), lambda t, r: api.revert(t), stats)
    print("\nkill at every write step:", dict(sorted(stats.items())))
    # every kind of write step was reached in every command
    assert (
        stats["apply: steps killed"] >= 20
        and stats["revert: steps killed"] >= 10
        and stats["update: steps killed"] >= 10
    )
    assert stats["status names recover"] > 0 and stats["recover -> pristine"] > 0 and stats["recover -> patched"] > 0


def _strace_ok() -> bool:
    if not shutil.which("strace"):
        return False
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=none", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _strace_ok(), reason="strace is not installed or ptrace is not permitted here")
def test_kill_at_every_rename_under_strace(tmp_path, no_fsync):
    """The real CLI in a subprocess, SIGKILLed by strace at the K-th rename(2) of apply and of
    revert; then the CLI's status, recover and revert on the tree."""
    from click.testing import CliRunner

    from spectool.cli import main

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}

    def cli(*args):
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    killed = 0
    for command in ("apply", "revert"):
        prepare = _prepared(tmp_path / f"t-{command}", command == "revert")
        k = 1
        while True:
            root = tmp_path / f"{command}-{k}"
            tree, rdir, patched = prepare(root)
            args = (
                ["apply", "--sglang-dir", tree, "--recipes-dir", rdir]
                if command == "apply"
                else ["revert", "--sglang-dir", tree]
            )
            # fsync(2) is skipped (retval=0): a killed process, not a power cut, is under test
            r = subprocess.run(
                [
                    "strace",
                    "-f",
                    "-qq",
                    "-o",
                    os.devnull,
                    "-e",
                    "trace=rename,fsync",
                    "-e",
                    f"inject=rename:signal=SIGKILL:when={k}",
                    "-e",
                    "inject=fsync:retval=0",
                    sys.executable,
                    "-m",
                    "spectool.cli",
                    *map(str, args),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            if r.returncode == 0:
                break
            assert r.returncode in (-9, 137), r.stderr
            killed += 1
            st = cli("status", "--sglang-dir", tree)
            if st.exit_code == 0:
                _consistent(tree, patched)
            else:
                assert "spectool recover" in st.output and "Traceback" not in st.output
            r = cli("recover", "--sglang-dir", tree)
            assert r.exit_code == 0 and "Traceback" not in r.output
            _consistent(tree, patched)
            assert cli("revert", "--sglang-dir", tree).exit_code == 0
            assert _snapshot(tree) == {f: SRC for f in FILES} and not (tree / ".spectool").exists()
            k += 1
    print(f"\nstrace: killed {killed} runs at a rename")
    assert killed >= 8


def test_crashed_tree_moved_or_copied_recovers_in_place(tmp_path, no_fsync):
    """The journal names paths relative to the tree: a crashed tree copied elsewhere (cp -a)
    is finished in the copy, and the original tree is not written through it."""
    prepare = _prepared(tmp_path / "t", False)
    tree, rdir, patched = prepare(tmp_path / "a")
    assert _killed(lambda: api.apply(tree, recipes_dir=rdir), "replace", 4, False)  # past the commit point
    journal = (tree / ".spectool" / "journal.json").read_text()
    assert str(tree) not in journal
    copy = tmp_path / "b" / "tree"
    shutil.copytree(tree, copy, symlinks=True)
    frozen = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    out = api.apply(copy, recipes_dir=rdir)
    assert out.ok and "finished an interrupted apply" in " ".join(out.notes)
    assert _consistent(copy, patched) == "patched"
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == frozen, "the original tree was written"


@pytest.mark.parametrize("path", ["../../x.py", "/etc/passwd", "a/../../x", "", None])
def test_journal_paths_must_stay_inside(tmp_path, path):
    import json

    tree = _tree(tmp_path)
    (tree / ".spectool").mkdir()
    entry = {"path": path, "tmp": f"{path}.spectool-tmp"}
    (tree / ".spectool" / "journal.json").write_text(
        json.dumps({"format": 2, "command": "apply", "state": "commit", "entries": [entry]})
    )
    (tmp_path / "x.py.spectool-tmp").write_text("outside")
    for fn in (api.recover, api.status):
        with pytest.raises(SourceError, match="outside the tree"):
            fn(tree)
    assert (tmp_path / "x.py.spectool-tmp").exists() and not (tmp_path / "x.py").exists()
