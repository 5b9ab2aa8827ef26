"""The docs cite their evidence by path (result folders, recipes, tools, tests): every path
they quote must exist in the repo, so a moved or renamed result cannot leave a claim pointing
at nothing. Placeholders (`results/bench-X`, globs) are not paths."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tools/device/README.md",
        ROOT / "results/README.md"]
QUOTED = re.compile(r"`((?:results|golden|recipes|tools|tests|spectool)/[^`\s]*)`")


def quoted_paths(text: str):
    for m in QUOTED.finditer(text):
        path = m.group(1).rstrip(".,").split("::")[0]
        if re.search(r"[*{}<>]|\bX\b|-X\b|NAME|VERSION", path):
            continue
        yield path


def test_every_path_the_docs_quote_exists():
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOCS for path in quoted_paths(doc.read_text())
               if not (ROOT / path).exists()]
    assert not missing, "\n".join(missing)


def test_the_check_finds_a_missing_path():
    assert list(quoted_paths("see `results/0.5.99/h200/verify-golden/` and `results/bench-X-low`")) == [
        "results/0.5.99/h200/verify-golden/"]
