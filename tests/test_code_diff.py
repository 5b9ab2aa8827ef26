"""tools/code_diff.py: a device run verified one tree; later edits to docstrings and comments
keep its code, any other edit does not."""

import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def code_diff(load_tool):
    return load_tool("code_diff")


def _repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    (root / "recipes").mkdir(parents=True)
    (root / "recipes/worker.py").write_text('def f(x):\n    """Old words."""\n    return x + 1  # one\n')
    (root / "recipes/recipe.yaml").write_text("versions: '>=0.5.12'\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "verified"], check=True)
    return root


def test_docstrings_and_comments_keep_the_code(tmp_path, code_diff):
    root = _repo(tmp_path)
    (root / "recipes/worker.py").write_text(
        'def f(x):\n    """New words,\n    over two lines."""\n    return x + 1  # another comment\n')
    assert code_diff.code_differences("HEAD", ["recipes"], root) == []


def test_any_other_edit_is_a_difference(tmp_path, code_diff):
    root = _repo(tmp_path)
    (root / "recipes/worker.py").write_text('def f(x):\n    """Old words."""\n    return x + 2\n')
    assert code_diff.code_differences("HEAD", ["recipes"], root) == ["recipes/worker.py"]
    (root / "recipes/worker.py").write_text('def f(x):\n    """Old words."""\n    return x + 1  # one\n')
    (root / "recipes/recipe.yaml").write_text("versions: '>=0.5.13'\n")
    assert code_diff.code_differences("HEAD", ["recipes"], root) == ["recipes/recipe.yaml"]
    (root / "recipes/new.py").write_text("X = 1\n")
    subprocess.run(["git", "-C", str(root), "add", "recipes/new.py"], check=True)
    assert code_diff.code_differences("HEAD", ["recipes"], root) == ["recipes/new.py (new)", "recipes/recipe.yaml"]
