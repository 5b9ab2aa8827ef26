"""Whether the working tree's code equals a commit's, docstrings and comments aside.

A device run verifies one exact tree (its tree-sha256.txt). When only documentation changes
afterwards, this says so precisely: Python files are compared as ASTs with docstrings
removed, every other file byte for byte.

    python tools/code_diff.py 1f22c7e recipes golden spectool   # exit 0: same code
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _without_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True).stdout


def code_differences(rev: str, paths: list[str], root: Path = ROOT) -> list[str]:
    """Files whose code differs between `rev` and the working tree of the repository at
    `root` (added, removed or changed beyond docstrings and comments)."""
    then = set(_git(root, "ls-tree", "-r", "--name-only", rev, "--", *paths).decode().split())
    now = set(_git(root, "ls-files", "--", *paths).decode().split())
    differ = sorted(f"{p} (only at {rev})" for p in then - now) + sorted(f"{p} (new)" for p in now - then)
    for path in sorted(then & now):
        old, new = _git(root, "show", f"{rev}:{path}"), (root / path).read_bytes()
        if old == new:
            continue
        if path.endswith(".py"):
            try:
                if _without_docstrings(old.decode()) == _without_docstrings(new.decode()):
                    continue
            except SyntaxError:
                pass
        differ.append(path)
    return differ


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    rev, paths = argv[0], argv[1:] or ["."]
    differ = code_differences(rev, paths)
    for line in differ:
        print(line)
    if not differ:
        print(f"same code as {rev} in {', '.join(paths)} (docstrings and comments aside)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
