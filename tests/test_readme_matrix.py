"""The README's support table is the one spectool.matrix generates from recipes/matrix.yaml,
and the generator groups releases and names variants as documented."""

from __future__ import annotations

from pathlib import Path

from packaging.specifiers import SpecifierSet

from spectool import matrix
from spectool.recipe import Recipe, Variant

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block() -> str:
    text = README.read_text()
    start, end = "<!-- matrix:start -->\n", "<!-- matrix:end -->"
    assert start in text and end in text, "README.md has no <!-- matrix:start --> ... <!-- matrix:end --> block"
    return text.split(start, 1)[1].split(end, 1)[0]


def test_the_readme_table_is_the_generated_one():
    generated = matrix.markdown()
    assert readme_block() == generated, (
        "README.md's support table differs from recipes/matrix.yaml; replace the block with the "
        "output of `python -m spectool.matrix`:\n" + generated
    )


def test_equal_neighbours_share_a_row_and_applies_names_the_variant():
    rows = {
        "1.0": {"a": "applies", "b": "unsupported"},
        "1.0.post1": {"a": "applies", "b": "unsupported"},
        "1.1": {"a": "applies", "b": "upstreamed"},
        "1.2": {"a": "upstreamed", "b": "upstreamed"},
    }
    recipe = Recipe(
        "a",
        "",
        Path("a/recipe.yaml"),
        [Variant("old", SpecifierSet("<1.1"), []), Variant("new", SpecifierSet(">=1.1"), [])],
    )
    assert matrix.markdown(rows, [recipe]) == (
        "| SGLang | `a` | `b` |\n"
        "|---|---|---|\n"
        "| 1.0 – 1.0.post1 | applies (`old`) | unsupported |\n"
        "| 1.1 | applies (`new`) | upstreamed |\n"
        "| 1.2 | upstreamed | upstreamed |\n"
    )


def test_a_recipe_missing_from_a_release_shows_a_dash():
    rows = {"1.0": {"a": "applies"}, "1.1": {"a": "applies", "b": "applies"}}
    assert matrix.markdown(rows, []).splitlines()[2:] == ["| 1.0 | applies | - |", "| 1.1 | applies | applies |"]
