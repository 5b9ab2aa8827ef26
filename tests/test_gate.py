"""The gate's reading of a pin (PEP 503 names, extras, markers, options, ranges, the old pin
from git and the lockfile), the upgrade report's labels, statuses that agree across rows, and
`apply` with no pin file. The same cases through pre-commit itself: tests/test_precommit.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from spectool import api, pin
from spectool.cli import main
from spectool.errors import BadInputError
from spectool.statuses import Status
from tests.conftest import make_tree
from tests.test_port import CODE, OLD, RECIPE


@pytest.mark.parametrize(
    "line, exact",
    [
        ("SGLang==0.5.13", "0.5.13"),
        ("sglang[all]==0.5.13", "0.5.13"),
        ("sglang[all] == 0.5.13 ; python_version >= '3.10'", "0.5.13"),
        ("SG-Lang===0.5.13", None),  # another project: PEP 503 keeps the dash
        ("sglang==0.5.13 --hash=sha256:" + "0" * 64, "0.5.13"),
        ("sglang>=0.5.12,<0.5.14", None),
    ],
)
def test_a_requirement_is_read_as_pep_508_says(tmp_path, line, exact):
    f = tmp_path / "requirements.txt"
    f.write_text(f"# pins\n-r base.txt\ntorch==2.11.0  # torch\n{line}\n")
    req = pin.requirement_in(f)
    if line.startswith("SG-Lang"):
        assert req is None
        return
    assert req.exact == exact and pin.pinned_version_in(f) == exact
    if exact is None:
        assert str(req.specifier) == "<0.5.14,>=0.5.12"


def test_a_continued_line_and_a_toml_pin(tmp_path):
    f = tmp_path / "requirements-gpu.txt"
    f.write_text("sglang==0.5.13 \\\n    --hash=sha256:" + "1" * 64 + "\n")
    assert pin.pinned_version_in(f) == "0.5.13"
    t = tmp_path / "spectool.toml"
    t.write_text('[sglang]\nversion = "0.5.12"\n')
    assert pin.requirement_in(t).exact == "0.5.12"
    t.write_text("[sglang\n")
    with pytest.raises(BadInputError, match="not valid TOML"):
        pin.requirement_in(t)


def test_a_requirement_without_a_lower_bound_is_refused(tmp_path):
    f = tmp_path / "requirements.txt"
    for line in ("sglang", "sglang<0.6"):
        f.write_text(line + "\n")
        with pytest.raises(BadInputError, match="does not pin SGLang to a release"):
            pin.lowest_allowed(pin.requirement_in(f), lambda: pytest.fail("the index was asked"))


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


def test_the_old_pin_comes_from_git_head_then_the_lockfile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _git(tmp_path, "init", "-q")
    f = Path("requirements.txt")
    f.write_text("sglang[all]==0.5.12\n")
    assert pin.previous_pin(f) is None  # no commit yet
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "pin")
    f.write_text("sglang==0.5.13\n")
    assert pin.previous_pin(f) == "0.5.12"
    assert pin.applied_version() is None
    lock = tmp_path / "build" / "sglang-0.5.11" / "spectool.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"sglang_version": "0.5.11"}))
    assert pin.applied_version() == "0.5.11"


def _fake_cache(tmp_path, monkeypatch) -> Path:
    """Release 1.1 of the demo tree, cached as `spectool fetch` leaves one, and the demo recipe."""
    cache = tmp_path / "cache"
    tree = make_tree(cache / "sglang-1.1", "1.1", {"sglang/srt/worker.py": OLD.encode()})
    (tree / ".spectool-fetched").write_text("{}")
    monkeypatch.setenv("SPECTOOL_CACHE", str(cache))
    recipes = tmp_path / "recipes"
    (recipes / "demo").mkdir(parents=True)
    (recipes / "demo" / "recipe.yaml").write_text(RECIPE)
    (recipes / "demo" / "code.py").write_text(CODE)
    return recipes


def test_upgrade_labels_the_table_of_the_variants_run_today(tmp_path, monkeypatch):
    recipes = _fake_cache(tmp_path, monkeypatch)
    r = CliRunner().invoke(main, ["upgrade", "--to", "1.1", "--from", "1.0", "--recipes-dir", str(recipes)])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    at = lines.index("The variants you run today (SGLang 1.0) planned on SGLang 1.1:")
    assert lines[at + 1] == f"SGLang 1.1 at {tmp_path / 'cache' / 'sglang-1.1'}, planned with the variants for 1.0"
    assert "SGLang 1.0 at" not in r.output


def test_gate_reads_the_old_pin_from_git_for_the_drift_report(tmp_path, monkeypatch):
    recipes = _fake_cache(tmp_path, monkeypatch)
    work = tmp_path / "user"
    work.mkdir()
    monkeypatch.chdir(work)
    _git(work, "init", "-q")
    (work / "requirements.txt").write_text("SGLang==1.0\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "pin")
    (work / "requirements.txt").write_text("SGLang==1.1\n")
    r = CliRunner().invoke(main, ["gate", "requirements.txt", "--recipes-dir", str(recipes), "--json"])
    assert r.exit_code == 1, r.output
    data = json.loads(r.output)
    assert data["checked"] == [
        {"file": "requirements.txt", "requirement": "SGLang==1.1", "version": "1.1", "from": "1.0"}
    ]
    current = data["upgrades"][0]["current_variants_on_new_release"][0]
    assert current["variant"] == "v-1.0" and current["status"] == "would-apply"


def test_apply_without_a_pin_names_the_option_it_has(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pin, "find_pin", lambda: None)
    r = CliRunner().invoke(main, ["apply"])
    assert r.exit_code == 2
    assert "pass --sglang-dir DIR" in r.output and "version is read from the tree" in r.output
    assert "give a version" not in r.output
    tree = make_tree(tmp_path / "t", "0.5.12", {})
    (tree / "sglang-0.5.12.dist-info").mkdir()
    (tree / "sglang-0.5.12.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.12\n")
    r = CliRunner().invoke(main, ["apply", "--sglang-dir", str(tree), "--dry-run", "--json"])
    assert json.loads(r.output)["sglang_version"] == "0.5.12"


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_an_upstreamed_row_names_the_actual_status_of_what_it_requires(sglang_release, version):
    plan = api.check(sglang_release(version)).plan
    by_id = {r.id: r for r in plan.results}
    for r in plan.results:
        if r.status != Status.UPSTREAMED:
            continue
        for req in next(x for x in plan.recipes if x.id == r.id).requires:
            assert f"{req}: {by_id[req].status}" in r.message, r.message
        assert "maps the flag onto it" not in r.message
