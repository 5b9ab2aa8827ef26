"""tools/device/keep.sh: a bench folder kept on the warm machine between calls, so that the
same command called again resumes where the call before stopped, though the tree it is sent
lacks that call's cells. Plain files in a temporary folder; no GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _folder(path: Path, cells: int, **extra: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cells.jsonl").write_text("".join(f'{{"cell": {i}}}\n' for i in range(cells)))
    for name, text in extra.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def _run(tmp_path: Path, call: str, env: str = "") -> subprocess.CompletedProcess:
    script = f"KEEP_ROOT={tmp_path / 'keep'} {env}; source tools/device/keep.sh; {call}"
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)


def _cells(path: Path) -> int:
    return len((path / "cells.jsonl").read_text().splitlines())


def test_a_first_call_seeds_from_the_folder_it_was_sent(tmp_path):
    results, dest = _folder(tmp_path / "tree/sweep", 3), tmp_path / "out/sweep"
    dest.mkdir(parents=True)
    _run(tmp_path, f"seed_dest {results} {dest}")
    assert _cells(dest) == 3


def test_the_next_call_resumes_from_the_machines_copy_when_it_holds_more_cells(tmp_path):
    results, dest = _folder(tmp_path / "tree/sweep", 3), tmp_path / "out/sweep"
    _folder(dest, 10, **{"bench-fixed.log": "call 1\n", "traces/t.json": "{}", "models/m": "w"})
    _run(tmp_path, f"keep_dest {dest}")
    kept = tmp_path / "keep/sweep"
    assert _cells(kept) == 10 and (kept / "bench-fixed.log").exists()
    assert not (kept / "traces").exists() and not (kept / "models").exists()  # left out, as packed
    fresh = tmp_path / "out2/sweep"
    fresh.mkdir(parents=True)
    run = _run(tmp_path, f"seed_dest {results} {fresh}")
    assert _cells(fresh) == 10 and "from this machine's copy (10 cells" in run.stdout
    # The folder it is sent wins once it holds as many cells (the archive unpacked into it).
    _folder(results, 10)
    (results / "goals.md").write_text("from the tree")
    again = tmp_path / "out3/sweep"
    again.mkdir(parents=True)
    _run(tmp_path, f"seed_dest {results} {again}")
    assert (again / "goals.md").read_text() == "from the tree"


def test_keeping_replaces_the_copy_and_can_be_turned_off(tmp_path):
    dest = _folder(tmp_path / "out/sweep", 4, stale="x")
    _run(tmp_path, f"keep_dest {dest}")
    (dest / "stale").unlink()
    _run(tmp_path, f"keep_dest {dest}")
    assert not (tmp_path / "keep/sweep/stale").exists()
    _folder(dest, 9)
    _run(tmp_path, f"keep_dest {dest}", env="BENCH_KEEP=0")
    assert _cells(tmp_path / "keep/sweep") == 4  # left as it was
    results, fresh = _folder(tmp_path / "tree/sweep", 1), tmp_path / "out2/sweep"
    fresh.mkdir(parents=True)
    _run(tmp_path, f"seed_dest {results} {fresh}", env="BENCH_KEEP=0")
    assert _cells(fresh) == 1
