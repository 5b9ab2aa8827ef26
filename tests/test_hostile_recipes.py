"""Hostile and broken recipes: every one an exit-2 paragraph that names the file, never a
traceback or an internal error, the tree untouched, each case well under 5 s.

Named cases cover each rule; a generated corpus (hypothesis, derandomized so every run
tries the same cases) mutates a valid recipe three ways: values of the wrong type at
every key, inputs broken by construction (alias bombs, deep nesting, bad code references,
non-UTF-8 bytes, ...), and random edits of the YAML text.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectool.cli import main

from .conftest import FIXTURES, make_tree

FIXTURE = FIXTURES / "insert_statements"
TARGET = "sglang/srt/target.py"
BEFORE = (FIXTURE / "before.py").read_bytes()
BASE = yaml.safe_load((FIXTURE / "recipe" / "recipe.yaml").read_text())
CODE = (FIXTURE / "recipe" / "code.py").read_bytes()
LIMIT_S = 5.0


def _attempt(root: Path, recipe: bytes | dict, code: bytes = CODE, extra: dict | None = None):
    """apply a recipe folder (recipe.yaml + code.py + extra files) to a fresh tree; the CLI
    result, the tree, the recipe file and the seconds it took."""
    rdir = root / "recipes" / "r"
    rdir.mkdir(parents=True)
    text = recipe if isinstance(recipe, bytes) else yaml.safe_dump(recipe, sort_keys=False).encode()
    (rdir / "recipe.yaml").write_bytes(text)
    (rdir / "code.py").write_bytes(code)
    for name, data in (extra or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    tree = make_tree(root / "tree", "0.5.12", {TARGET: BEFORE})
    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["apply", "--sglang-dir", str(tree), "--recipes-dir", str(rdir.parent)])
    return r, tree, rdir, time.monotonic() - t0


def _untouched(tree: Path) -> bool:
    return (
        (tree / TARGET).read_bytes() == BEFORE
        and not (tree / "spectool.lock").exists()
        and not (tree / ".spectool").exists()
    )


def _assert_refused(r, tree: Path, rdir: Path, seconds: float, needle: str | None = None) -> None:
    out = r.output
    assert r.exit_code == 2, (r.exit_code, out)
    assert "Traceback" not in out and "internal error" not in out
    assert str(rdir) in out, f"the message does not name the recipe's folder or file: {out}"
    assert out.count("\n") <= 2, "one paragraph"
    if needle:
        assert needle in out, out
    assert _untouched(tree)
    assert seconds < LIMIT_S


def _assert_no_crash(r, tree: Path, rdir: Path, seconds: float) -> None:
    """A mutation may leave a valid recipe (exit 0 or a drift, exit 1); anything else is an
    exit-2 message naming the recipe, and a failed run leaves the tree untouched."""
    out = r.output
    assert r.exit_code in (0, 1, 2), (r.exit_code, out)
    assert "Traceback" not in out and "internal error" not in out, out
    if r.exit_code == 2:
        assert str(rdir) in out, out
    if r.exit_code != 0:
        assert _untouched(tree)
    assert seconds < LIMIT_S


def _op(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data["variants"][0]["operations"][0].update(changes)
    return data


def _variant(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data["variants"][0].update(changes)
    return data


def _bomb(width: int, depth: int) -> bytes:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, depth + 1):
        lines.append(f"a{i}: &a{i} [{', '.join(f'*a{i - 1}' for _ in range(width))}]")
    return ("\n".join(lines) + f"\nid: x\nsummary: y\nvariants: *a{depth}\n").encode()


def _yaml(data: dict) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


NAMED = {
    "alias bomb": (_bomb(9, 9), CODE, "YAML nodes once its aliases are resolved"),
    "recursive alias": (b"id: x\nsummary: y\nvariants: &v [*v]\n", CODE, "refers to itself"),
    "deep nesting": (b"id: x\nsummary: y\nvariants: " + b"[" * 5000 + b"]" * 5000 + b"\n", CODE, "nested deeper"),
    "huge file": (b"id: x\nsummary: y\n# " + b"x" * (1 << 20) + b"\n", CODE, "larger than"),
    "non-UTF-8 recipe": (_yaml(BASE).replace(b"summary: ", b"summary: caf\xe9 "), CODE, "not UTF-8"),
    "non-UTF-8 code file": (_yaml(BASE), b"def early_exit(self, batch):\n    x = 'caf\xe9'\n", "cannot be decoded"),
    "code syntax error": (_yaml(BASE), b"def early_exit(self, batch:\n", "syntax error"),
    "unhashable key": (b"id: x\nsummary: y\n? [a, b]\n: 1\nvariants: []\n", CODE, "keys must be plain words"),
    "duplicate key": (b"id: x\nid: y\nsummary: y\nvariants: []\n", CODE, "duplicate key"),
    "empty file": (b"", CODE, "expected a mapping"),
    "a list": (b"[1, 2]\n", CODE, "expected a mapping"),
    "python tag": (
        b"id: !!python/object/apply:os.system [echo hi]\nsummary: y\nvariants: []\n",
        CODE,
        "not valid YAML",
    ),
    "imports: [123]": (_yaml(_op(imports=[123])), CODE, "must be a list of str"),
    "code: 'code.py:'": (_yaml(_op(code="code.py:")), CODE, "must be 'FILE.py:QUALNAME'"),
    "code: ':'": (_yaml(_op(code=":")), CODE, "must be 'FILE.py:QUALNAME'"),
    "code outside the folder": (_yaml(_op(code="../../outside.py:early_exit")), CODE, "outside the recipe's folder"),
    "code at an absolute path": (_yaml(_op(code="/etc/passwd.py:x")), CODE, "outside the recipe's folder"),
    "count: 0": (_yaml(_op(count=0)), CODE, "at least 1"),
    "count: -3": (_yaml(_op(count=-3)), CODE, "at least 1"),
    "count: true": (_yaml(_op(count=True)), CODE, "must be int"),
    "count: '2'": (_yaml(_op(count="2")), CODE, "must be int"),
    "versions: ''": (_yaml(_variant(versions="")), CODE, "'versions' is empty"),
    "versions: '  '": (_yaml(_variant(versions="  ")), CODE, "'versions' is empty"),
    "versions: 0.5": (_yaml(_variant(versions=0.5)), CODE, "quote version strings"),
    "versions: junk": (_yaml(_variant(versions="latest")), CODE, "not a PEP 440 specifier"),
    "overlapping variants": (
        _yaml(
            {**BASE, "variants": [BASE["variants"][0], {**BASE["variants"][0], "name": "two", "versions": ">=0.5.12"}]}
        ),
        CODE,
        "both cover SGLang",
    ),
    "touching ranges overlap": (
        _yaml(
            {
                **BASE,
                "variants": [
                    {**BASE["variants"][0], "versions": "<=0.5.12"},
                    {**BASE["variants"][0], "name": "two", "versions": ">=0.5.12"},
                ],
            }
        ),
        CODE,
        "both cover SGLang 0.5.12",
    ),
    "open ranges overlap": (
        _yaml(
            {
                **BASE,
                "variants": [
                    {**BASE["variants"][0], "versions": "<0.5.13"},
                    {**BASE["variants"][0], "name": "two", "versions": ">0.5.12"},
                ],
            }
        ),
        CODE,
        "both cover SGLang",
    ),
    "duplicate variant names": (
        _yaml(
            {
                **BASE,
                "variants": [{**BASE["variants"][0], "versions": "<0.5"}, {**BASE["variants"][0], "versions": ">=0.5"}],
            }
        ),
        CODE,
        "used twice",
    ),
    "yield inserted": (
        _yaml(BASE),
        CODE.replace(b"self.count += 1", b"yield self.count"),
        "turn that function into a generator",
    ),
    "yield from inserted": (_yaml(BASE), CODE.replace(b"self.count += 1", b"yield from range(3)"), "generator"),
    "requires: [1]": (_yaml({**BASE, "requires": [1]}), CODE, "must be a list of str"),
    "options: a list": (_yaml({**BASE, "options": [1]}), CODE, "must be dict"),
    "option name not a word": (_yaml({**BASE, "options": {1: {"default": 1}}}), CODE, "must be an identifier"),
    "variants: []": (_yaml({**BASE, "variants": []}), CODE, "at least one variant"),
    "id with a slash": (_yaml({**BASE, "id": "../x"}), CODE, "'id'"),
    "target with empty parts": (_yaml(_op(target="sglang..srt.target:forward")), CODE, "'target' must look like"),
    "target outside sglang": (_yaml(_op(target="sglangx.srt:forward")), CODE, "inside the sglang package"),
    "null byte in anchor": (_yaml(_op(anchor="if x:\0\n    ...")), CODE, "anchor"),
    "op: a list": (_yaml(_op(op=[1])), CODE, "unknown op"),
    "bad import": (_yaml(_op(imports=["import os; import sys"])), CODE, "is not an import statement"),
    "qualname missing": (_yaml(_op(code="code.py:nothing_here")), CODE, "no definition named"),
}


@pytest.mark.parametrize("case", sorted(NAMED))
def test_named_bad_recipe(case, tmp_path):
    recipe, code, needle = NAMED[case]
    extra = {"outside.py": CODE} if "outside" in case else None
    r, tree, rdir, seconds = _attempt(tmp_path, recipe, code, extra)
    _assert_refused(r, tree, rdir, seconds, needle)


def test_non_latin1_code_into_latin1_file(tmp_path):
    """Code a latin-1 file's encoding cannot hold: exit 2 naming the file and the recipe."""
    d = FIXTURES / "latin1"
    rdir = tmp_path / "r" / "x"
    shutil.copytree(d / "recipe", rdir)
    code = (rdir / "code.py").read_text()
    (rdir / "code.py").write_text(code.replace("return 42", "return '\u20ac'"), encoding="utf-8")
    tree = make_tree(tmp_path / "tree", "0.5.12", {TARGET: (d / "before.py").read_bytes()})
    r = CliRunner().invoke(main, ["apply", "--sglang-dir", str(tree), "--recipes-dir", str(rdir.parent)])
    assert r.exit_code == 2 and "fx-latin1" in r.output and TARGET in r.output and "cannot hold it" in r.output
    assert (tree / TARGET).read_bytes() == (d / "before.py").read_bytes()


# -- the generated corpus ---------------------------------------------------------------

CORPUS = settings(
    max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

_junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, width=32)
    | st.text(max_size=12)
    | st.sampled_from(["", " ", "..", "../x.py:f", "code.py:", ":", "sglang", ">=0.5", "\0"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(data, prefix=()):
    """Every key path in a nested dict/list."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


PATHS = list(_paths(BASE))


@st.composite
def _structural(draw):
    """BASE with one value replaced by junk, one key deleted, or one unknown key added."""
    data = copy.deepcopy(BASE)
    path = draw(st.sampled_from(PATHS))
    parent = data
    for k in path[:-1]:
        parent = parent[k]
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(_junk)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(_junk)
    else:
        parent.append(draw(_junk))
    return data


@given(_structural())
@CORPUS
def test_corpus_wrong_values(data):
    with tempfile.TemporaryDirectory() as d:
        try:
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
        except yaml.YAMLError:
            return
        r, tree, rdir, seconds = _attempt(Path(d), text)
        _assert_no_crash(r, tree, rdir, seconds)


@st.composite
def _broken(draw):
    """Inputs that are broken by construction: (recipe bytes, code bytes, needle or None)."""
    kind = draw(
        st.sampled_from(["bomb", "nesting", "coderef", "count", "versions", "bytes", "code-bytes", "yield", "type"])
    )
    if kind == "bomb":
        width, depth = draw(st.integers(4, 12)), draw(st.integers(9, 14))
        return _bomb(width, depth), CODE, "YAML nodes"
    if kind == "nesting":
        n = draw(st.integers(40, 3000))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b"{a: ", b"}")]))
        return b"id: x\nsummary: y\nvariants: " + opener * n + b"1" + closer * n + b"\n", CODE, "nested deeper"
    if kind == "coderef":
        ref = draw(st.sampled_from(["../", "/", "", "code.py", "code.py:", "code.txt:f", "sub/../../"]))
        ref += draw(st.text(alphabet="abc./:_-", max_size=10))
        if ref.startswith("code.py:") and ref[8:].replace("_", "a").isidentifier():
            ref = "../" + ref
        return _yaml(_op(code=ref)), CODE, None
    if kind == "count":
        return _yaml(_op(count=draw(st.integers(-(10**6), 0)))), CODE, "at least 1"
    if kind == "versions":
        return _yaml(_variant(versions=draw(st.text(alphabet=" \t", max_size=4)))), CODE, "'versions' is empty"
    if kind == "bytes":
        bad = draw(st.binary(min_size=1, max_size=4).filter(lambda b: not _utf8(b)))
        return _yaml(BASE).replace(b"summary: ", b"summary: " + bad), CODE, "not UTF-8"
    if kind == "code-bytes":
        bad = draw(st.binary(min_size=1, max_size=4).filter(lambda b: not _utf8(b)))
        return _yaml(BASE), CODE.replace(b"self.count", b"self.count  # " + bad, 1), "cannot be decoded"
    if kind == "yield":
        stmt = draw(st.sampled_from([b"yield", b"yield 1", b"x = yield", b"yield from ()", b"if x:\n        yield"]))
        return _yaml(BASE), CODE.replace(b"self.count += 1", stmt), "generator"
    key = draw(st.sampled_from(["target", "anchor", "code", "count", "imports"]))
    value = draw(
        st.one_of(
            st.booleans(),
            st.floats(allow_nan=False),
            st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        )
    )
    if key == "count" and isinstance(value, bool) is False and isinstance(value, int):
        value = [value]
    if key == "imports" and isinstance(value, list):
        value = value + [1]
    return _yaml(_op(**{key: value})), CODE, "must be"


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@given(_broken())
@CORPUS
def test_corpus_broken_by_construction(case):
    recipe, code, needle = case
    with tempfile.TemporaryDirectory() as d:
        r, tree, rdir, seconds = _attempt(Path(d), recipe, code)
        _assert_refused(r, tree, rdir, seconds, needle)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 10_000), st.integers(0, 8), st.text(alphabet=":-[]{}&*!|>'\"#,?\n\t $%@`", max_size=6)
        ),
        min_size=1,
        max_size=4,
    )
)
@CORPUS
def test_corpus_text_edits(edits):
    """Random edits of the YAML text: delete a span and insert YAML punctuation."""
    text = (FIXTURE / "recipe" / "recipe.yaml").read_text()
    for pos, cut, ins in edits:
        pos %= len(text) + 1
        text = text[:pos] + ins + text[pos + cut :]
    with tempfile.TemporaryDirectory() as d:
        r, tree, rdir, seconds = _attempt(Path(d), text.encode())
        _assert_no_crash(r, tree, rdir, seconds)
