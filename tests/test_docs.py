"""The docs' claims match the code: every path and link they quote exists, the README's command
table lists exactly the CLI's commands, arguments and options (the verify and bench options
through their docs pages), the operation reference lists exactly the operation kinds and their
keys, and no doc tells the project's development history (git keeps it)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from spectool.cli import main
from spectool.ops import OPERATIONS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "tools/device/README.md", ROOT / "results/README.md"]
QUOTED = re.compile(r"`((?:results|golden|recipes|tools|tests|spectool)/[^`\s]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
OPTION = re.compile(r"--[a-z][a-z0-9-]*")


# -- quoted paths and links ------------------------------------------------------------------


def quoted_paths(text: str):
    """Repository paths quoted in backticks; placeholders (`results/bench-X`, globs, <...>) skipped."""
    for m in QUOTED.finditer(text):
        path = m.group(1).rstrip(".,").split("::")[0]
        if re.search(r"[*{}<>]|\bX\b|-X\b|NAME|VERSION", path):
            continue
        yield path


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", doc.read_text(), re.M)}


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Relative Markdown links whose file (or heading anchor) does not exist."""
    out = []
    for m in LINK.finditer(doc.read_text()):
        target = m.group(1)
        if re.match(r"[a-z]+:", target) or target.startswith("<"):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            out.append(f"{doc.relative_to(root)}: {target}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{doc.relative_to(root)}: {target} (no such heading)")
    return out


def test_every_path_the_docs_quote_exists():
    missing = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in quoted_paths(doc.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, "\n".join(missing)


def test_the_check_finds_a_missing_path():
    assert list(quoted_paths("see `results/0.5.99/h200/verify-golden/` and `results/bench-X-low`")) == [
        "results/0.5.99/h200/verify-golden/"
    ]


def test_every_relative_link_resolves():
    broken = [b for doc in [*DOCS, ROOT / "CHANGELOG.md"] for b in broken_links(doc)]
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_missing_file_and_heading(tmp_path):
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Options and keys\n")
    doc.write_text("[x](b.md#options-and-keys) [y](b.md#nope) [z](c.md) [w](https://example.com/c.md)\n")
    assert broken_links(doc, tmp_path) == ["a.md: b.md#nope (no such heading)", "a.md: c.md"]


# -- the README's command table against click ------------------------------------------------


def table(text: str, name: str) -> list[list[str]]:
    """The body rows of the Markdown table between <!-- name:start --> and <!-- name:end -->."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    assert start in text and end in text, f"no {start} ... {end} block"
    block = text.split(start, 1)[1].split(end, 1)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]


def documented_commands(readme: str) -> dict[str, tuple[set[str], set[str]]]:
    """README command table: name -> (ARGUMENTS, --options). A row whose options cell links
    to docs/X.md#options takes the options from that page's options table."""
    out = {}
    for cells in table(readme, "commands"):
        words = cells[0].strip("`").split()
        assert words[0] == "spectool", cells[0]
        arguments = {w.strip("[].") for w in words[2:]}
        link = re.search(r"\((docs/[\w/.-]+\.md)#options\)", cells[1])
        if link:
            page = (ROOT / link.group(1)).read_text()
            options = {o for row in table(page, "options") for o in OPTION.findall(row[0])}
        else:
            options = set(OPTION.findall(cells[1]))
        out[words[1]] = (arguments, options)
    return out


def cli_commands() -> dict[str, tuple[set[str], set[str]]]:
    ctx = click.Context(main)
    out = {}
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        arguments = {p.name.upper() for p in cmd.params if isinstance(p, click.Argument)}
        options = {
            o
            for p in cmd.params
            if isinstance(p, click.Option)
            for o in [*p.opts, *p.secondary_opts]
            if o.startswith("--")
        }
        out[name] = (arguments, options)
    return out


def test_the_readme_lists_every_command_with_its_arguments_and_options():
    docs, cli = documented_commands(README.read_text()), cli_commands()
    assert sorted(docs) == sorted(cli), "README command table vs `spectool --help`"
    problems = []
    for name, (args, opts) in cli.items():
        dargs, dopts = docs[name]
        if dargs != args:
            problems.append(f"spectool {name}: arguments {sorted(dargs)} documented, {sorted(args)} in the CLI")
        if dopts - opts:
            problems.append(f"spectool {name}: documented options that do not exist: {sorted(dopts - opts)}")
        if opts - dopts:
            problems.append(f"spectool {name}: options missing from the docs: {sorted(opts - dopts)}")
    assert not problems, "\n".join(problems)


def test_the_command_check_sees_a_stale_option():
    readme = README.read_text().replace("`--dry-run`", "`--dry-run`, `--no-such-flag`", 1)
    assert "--no-such-flag" in documented_commands(readme)["apply"][1]


# -- the operation reference against spectool.ops -------------------------------------------


def test_the_operation_reference_lists_every_kind_with_its_keys():
    rows = table((ROOT / "docs/recipes.md").read_text(), "operations")
    documented = {}
    for cells in rows:
        kind = cells[0].strip("`")
        required = set(re.findall(r"\*\*`(\w+)`\*\*", cells[1]))
        documented[kind] = (required, set(re.findall(r"`(\w+)`", cells[1])) - required)
    actual = {kind: (set(cls.required), set(cls.optional)) for kind, cls in OPERATIONS.items()}
    assert documented == actual, "docs/recipes.md operations table (bold: required) vs spectool.ops"


# -- no development history ------------------------------------------------------------------

HISTORY = re.compile(
    r"\bsessions?[ -]?\d+"  # numbered work periods
    r"|\bnext(?=/)"  # branch names
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",  # commit hashes
    re.I,
)


def history_mentions(text: str) -> list[str]:
    return [m.group(0) for m in HISTORY.finditer(text)]


@pytest.mark.parametrize(
    "doc",
    [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_docs_tell_no_development_history(doc):
    assert not history_mentions(doc.read_text()), f"{doc.relative_to(ROOT)}: {history_mentions(doc.read_text())}"


def test_the_history_check_finds_sessions_hashes_and_branches():
    # Built from parts, so that a repository-wide search for history words stays clean.
    work_period, commit, branch = "sess" + "ion 7", "4f0" + "c2e9", "ne" + "xt/"
    text = f"in {work_period} ({commit}) on {branch}x; decade, 0.5.12"
    assert history_mentions(text) == [work_period, commit, "next"]
