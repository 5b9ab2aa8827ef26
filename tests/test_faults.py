"""Faults: a crash between file writes, a corrupted lockfile, modified files, symlinks out of
the tree, concurrent runs."""

from __future__ import annotations

import json
import os

import pytest

from spectool import api, transaction
from spectool.errors import SourceError

from .conftest import FIXTURES, make_tree

R1 = FIXTURES / "add_method" / "recipe"


def _two_file_tree(tmp_path, recipes):
    """Two files, two recipes: one transaction writes both."""
    import shutil

    rdir = tmp_path / "recipes"
    shutil.copytree(R1, rdir / "a")
    shutil.copytree(R1, rdir / "b")
    y = (rdir / "b" / "recipe.yaml").read_text().replace("fx-add-method", "fx-other").replace("srt.target", "srt.other")
    (rdir / "b" / "recipe.yaml").write_text(y)
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "tree", "0.5.12", {"sglang/srt/target.py": src, "sglang/srt/other.py": src})
    return tree, rdir, src


def test_read_only_tree_changes_nothing(tmp_path, monkeypatch):
    """A write that fails while staging (a read-only folder, a full disk) rolls back: exit 2,
    the tree untouched, no journal, no temp files, no .spectool."""
    tree, rdir, src = _two_file_tree(tmp_path, None)
    real = transaction._write_file

    def refuse(path, data, mode=None):
        if str(path).endswith("other.py" + transaction.TMP_SUFFIX):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, data, mode)

    monkeypatch.setattr(transaction, "_write_file", refuse)
    with pytest.raises(SourceError, match="Permission denied.*nothing was changed"):
        api.apply(tree, recipes_dir=rdir)
    monkeypatch.undo()
    assert all((tree / f"sglang/srt/{n}.py").read_bytes() == src for n in ("other", "target"))
    assert not (tree / "spectool.lock").exists() and not (tree / ".spectool").exists()
    assert not list(tree.rglob("*.spectool-tmp"))
    out = api.apply(tree, recipes_dir=rdir)
    assert out.ok and out.wrote


def test_unwritable_state_dir_is_exit_2(tmp_path):
    from click.testing import CliRunner

    from spectool.cli import main

    tree, rdir, src = _two_file_tree(tmp_path, None)
    (tree / ".spectool").write_text("not a folder")
    r = CliRunner().invoke(main, ["apply", "--sglang-dir", str(tree), "--recipes-dir", str(rdir)])
    assert r.exit_code == 2 and ".spectool is not a folder" in r.output and "Nothing was changed" in r.output
    assert "Traceback" not in r.output
    assert all((tree / f"sglang/srt/{n}.py").read_bytes() == src for n in ("other", "target"))


def _applied(tmp_path):
    tree, rdir, src = _two_file_tree(tmp_path, None)
    assert api.apply(tree, recipes_dir=rdir).ok
    return tree, rdir, src


def _pristine(tree, src) -> bool:
    return all((tree / f"sglang/srt/{n}.py").read_bytes() == src for n in ("other", "target"))


@pytest.mark.parametrize("bad", ["{not json", "[]", "null", '"x"', "{}", '{"schema": 1}', "\xff\xfe", ""])
def test_corrupted_lockfile(tmp_path, bad):
    """A lockfile that does not parse: status is not ok and names revert; apply and check
    refuse; revert restores from spectool's copy of the lockfile."""
    tree, rdir, src = _applied(tmp_path)
    (tree / "spectool.lock").write_bytes(bad.encode("latin-1"))
    st = api.status(tree)
    assert not st.ok and "spectool.lock is corrupt" in st.notes[0] and "spectool revert" in st.notes[0]
    for fn in (lambda: api.apply(tree, recipes_dir=rdir), lambda: api.check(tree, recipes_dir=rdir)):
        with pytest.raises(SourceError, match="spectool.lock is corrupt.*spectool revert"):
            fn()
    out = api.revert(tree)
    assert "copy of the lockfile" in " ".join(out.notes)
    assert _pristine(tree, src) and not (tree / "spectool.lock").exists() and not (tree / ".spectool").exists()


def test_lockfile_path_traversal_is_refused(tmp_path):
    """A files entry '../../x' with a matching saved original must not make revert write
    outside the tree."""
    tree, rdir, src = _applied(tmp_path)
    victim = tmp_path / "victim.py"
    victim.write_bytes(b"keep me\n")
    lock = json.loads((tree / "spectool.lock").read_text())
    evil = "../../victim.py"
    lock["files"][evil] = {"before": transaction_sha(b"pwned\n"), "after": transaction_sha(b"keep me\n")}
    (tree / "spectool.lock").write_text(json.dumps(lock))
    orig = tree / ".spectool" / "orig" / "x"
    orig.mkdir(parents=True)
    (orig / "victim.py").write_bytes(b"pwned\n")
    st = api.status(tree)
    assert not st.ok and "not a path inside the sglang package" in st.notes[0]
    with pytest.raises(SourceError, match="spectool revert --force"):
        api.revert(tree)  # the copy no longer matches the saved originals either (one more)
    with pytest.raises(SourceError, match="not a saved original of a file of the sglang package"):
        api.revert(tree, force=True)
    assert victim.read_bytes() == b"keep me\n" and not (tree / "x").exists()
    (orig / "victim.py").unlink()
    api.revert(tree)
    assert victim.read_bytes() == b"keep me\n" and _pristine(tree, src)


def transaction_sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_emptied_lockfile_files_do_not_orphan_originals(tmp_path):
    tree, rdir, src = _applied(tmp_path)
    lock = json.loads((tree / "spectool.lock").read_text())
    lock["files"] = {}
    (tree / "spectool.lock").write_text(json.dumps(lock))
    st = api.status(tree)
    assert not st.ok and "does not list 2 file(s)" in st.notes[0]
    with pytest.raises(SourceError, match="cannot be trusted"):
        api.apply(tree, recipes_dir=rdir)
    api.revert(tree)
    assert _pristine(tree, src) and not (tree / ".spectool").exists()


def test_deleted_lockfile_reverts_from_the_copy_or_the_originals(tmp_path):
    tree, rdir, src = _applied(tmp_path)
    (tree / "spectool.lock").unlink()
    st = api.status(tree)
    assert not st.ok and "spectool.lock is missing" in st.notes[0]
    api.revert(tree)
    assert _pristine(tree, src)

    assert api.apply(tree, recipes_dir=rdir).ok
    (tree / "spectool.lock").unlink()
    (tree / ".spectool" / "lock.json").unlink()
    st = api.status(tree)
    assert not st.ok and "revert --force" in st.notes[0]
    with pytest.raises(SourceError, match="spectool revert --force"):
        api.revert(tree)
    out = api.revert(tree, force=True)
    assert "restored the saved originals" in " ".join(out.notes)
    assert _pristine(tree, src) and not (tree / ".spectool").exists()


def test_damaged_saved_original_is_never_written(tmp_path):
    tree, rdir, src = _applied(tmp_path)
    (tree / ".spectool/orig/sglang/srt/target.py").write_bytes(b"garbage\n")
    st = api.status(tree)
    assert not st.ok and "does not match its 'before' hash" in st.notes[0]
    with pytest.raises(SourceError, match="revert --force"):
        api.revert(tree)
    with pytest.raises(SourceError, match="damaged, and spectool will not write it"):
        api.revert(tree, force=True)
    assert (tree / "sglang/srt/target.py").read_bytes() != b"garbage\n"
    (tree / "sglang/srt/target.py").write_bytes(src)
    (tree / ".spectool/orig/sglang/srt/target.py").unlink()
    api.revert(tree, force=True)  # the restored file is pristine; the other one comes back
    assert _pristine(tree, src) and not (tree / ".spectool").exists()


def test_modified_file_is_refused_unless_force(tmp_path):
    tree = make_tree(
        tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()}
    )
    api.apply(tree, recipes_dir=R1)
    p = tree / "sglang/srt/target.py"
    p.write_text(p.read_text() + "\n# hand edit\n")
    with pytest.raises(SourceError, match="changed since spectool wrote them"):
        api.apply(tree, recipes_dir=R1)
    with pytest.raises(SourceError, match="changed since spectool wrote them"):
        api.revert(tree)
    assert not api.status(tree).ok
    assert api.apply(tree, recipes_dir=R1, force=True).ok
    api.revert(tree, force=True)
    assert p.read_bytes() == (FIXTURES / "add_method" / "before.py").read_bytes()


def test_other_sglang_under_lock_is_refused(tmp_path):
    tree = make_tree(
        tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()}
    )
    api.apply(tree, recipes_dir=R1)
    (tree / "sglang" / "version.py").write_text('__version__ = "0.5.13"\n')
    with pytest.raises(SourceError, match="written for 0.5.12"):
        api.apply(tree, recipes_dir=R1)


def test_symlink_out_of_tree_is_refused(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_bytes((FIXTURES / "add_method" / "before.py").read_bytes())
    tree = make_tree(tmp_path / "t", "0.5.12", {})
    os.symlink(outside, tree / "sglang/srt/target.py")
    with pytest.raises(SourceError, match="symlink that leads out"):
        api.apply(tree, recipes_dir=R1)
    assert outside.read_bytes() == (FIXTURES / "add_method" / "before.py").read_bytes()


def test_concurrent_apply_is_locked_out(tmp_path):
    """One lock per tree, whichever way its directory is spelled; taking it writes nothing."""
    tree = make_tree(
        tmp_path / "t", "0.5.12", {"sglang/srt/target.py": (FIXTURES / "add_method" / "before.py").read_bytes()}
    )
    with transaction.locked(tree):
        for spelling in (tree, tree / "sglang"):
            with pytest.raises(SourceError, match="another spectool run holds the lock"):
                api.apply(spelling, recipes_dir=R1)
            with pytest.raises(SourceError, match="another spectool run holds the lock"):
                api.status(spelling)
    assert not (tree / ".spectool").exists()


def test_changed_recipe_reapplies_from_originals(tmp_path):
    """Editing a recipe after applying it: apply updates the tree instead of colliding with
    the old output; revert still restores the pristine bytes."""
    import shutil

    rdir = tmp_path / "r"
    shutil.copytree(R1, rdir)
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": src})
    assert api.apply(tree, recipes_dir=rdir).ok
    code = rdir / "code.py"
    code.write_text(code.read_text().replace("math.ceil(2 * x)", "math.ceil(3 * x)"))
    chk = api.check(tree, recipes_dir=rdir)
    assert chk.ok and "changed since they were applied" in " ".join(chk.notes)
    out = api.apply(tree, recipes_dir=rdir)
    assert out.ok and out.wrote, [r.to_json() for r in out.plan.results]
    text = (tree / "sglang/srt/target.py").read_text()
    assert "3 * x" in text and "2 * x" not in text
    assert {r.status for r in api.apply(tree, recipes_dir=rdir).plan.results} == {"already-applied"}
    api.revert(tree)
    assert (tree / "sglang/srt/target.py").read_bytes() == src


def test_commands_that_write_nothing_leave_no_trace(tmp_path):
    """dry-run, a failed apply, check, status and revert of an untouched tree create no
    .spectool folder and no lockfile; revert removes both."""
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": src})
    api.apply(tree, recipes_dir=R1, dry_run=True)
    api.check(tree, recipes_dir=R1)
    api.status(tree)
    api.revert(tree)
    drifted_src = src.replace(b"class Worker", b"class Other2")
    drifted = make_tree(tmp_path / "d", "0.5.12", {"sglang/srt/target.py": drifted_src})
    assert not api.apply(drifted, recipes_dir=R1).ok
    for t in (tree, drifted):
        assert not (t / ".spectool").exists() and not (t / "spectool.lock").exists()
    assert api.apply(tree, recipes_dir=R1).ok
    api.revert(tree)
    assert not (tree / ".spectool").exists() and not (tree / "spectool.lock").exists()


def test_symlink_inside_the_tree_stays_a_symlink(tmp_path):
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/real_target.py": src})
    link = tree / "sglang/srt/target.py"
    os.symlink("real_target.py", link)
    assert api.apply(tree, recipes_dir=R1).ok
    assert link.is_symlink() and b"def twice" in (tree / "sglang/srt/real_target.py").read_bytes()
    assert api.status(tree).ok
    api.revert(tree)
    assert link.is_symlink() and os.readlink(link) == "real_target.py"
    assert (tree / "sglang/srt/real_target.py").read_bytes() == src


def test_force_over_a_hand_edit_records_it(tmp_path):
    """apply --force over a hand-edited file whose recipe is still in place adopts the
    file's bytes: status is intact again, and revert still restores the original."""
    src = (FIXTURES / "add_method" / "before.py").read_bytes()
    tree = make_tree(tmp_path / "t", "0.5.12", {"sglang/srt/target.py": src})
    assert api.apply(tree, recipes_dir=R1).ok
    p = tree / "sglang/srt/target.py"
    p.write_bytes(p.read_bytes() + b"\n# hand edit\n")
    assert not api.status(tree).ok
    out = api.apply(tree, recipes_dir=R1, force=True)
    assert out.ok and out.wrote and "recorded the current bytes" in " ".join(out.notes)
    assert api.status(tree).ok and b"# hand edit" in p.read_bytes()
    api.revert(tree)
    assert p.read_bytes() == src


def test_interrupt_names_status(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from spectool.cli import main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "apply", interrupted)
    r = CliRunner().invoke(main, ["apply", "--sglang-dir", str(tmp_path), "--recipes-dir", str(R1)])
    assert r.exit_code == 1 and f"spectool status --sglang-dir {tmp_path}" in r.output


def test_sigint_during_the_write_waits_for_it(tmp_path):
    """A Ctrl-C that arrives in the middle of the write is held until the write is over:
    the tree is completely patched and no journal is left."""
    import signal

    tree, rdir, src = _two_file_tree(tmp_path, None)
    pid = os.fork()
    if pid == 0:
        real = os.replace

        def replace(a, b):
            if str(b).endswith("target.py"):
                os.kill(os.getpid(), signal.SIGINT)
            return real(a, b)

        os.replace = replace
        try:
            api.apply(tree, recipes_dir=rdir)
        except KeyboardInterrupt:
            os._exit(42)
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 42, "interrupted after the write"
    assert not (tree / ".spectool" / "journal.json").exists() and not list(tree.rglob("*.spectool-tmp"))
    st = api.status(tree)
    assert st.ok and {f["state"] for f in st.files} == {"intact"}


@pytest.mark.parametrize("damage", ["status", "inputs", "results", "bytes"])
def test_damaged_readback_record_only_costs_a_plan(tmp_path, damage):
    """check's shortcut record in .spectool is a cache: damaged, it is ignored (planned instead)."""
    tree, rdir, src = _applied(tmp_path)
    record = tree / ".spectool" / "readback.json"
    data = json.loads(record.read_text())
    if damage == "status":
        data["results"][0]["status"] = "junk"
    elif damage == "inputs":
        data["inputs"]["../../etc/passwd"] = "0" * 64
    elif damage == "results":
        data["results"] = [{"id": 1}]
    record.write_bytes(b"\xff[" if damage == "bytes" else json.dumps(data).encode())
    assert api.check(tree, recipes_dir=rdir).ok
