"""Every SGLang release from 0.5.6.post2 on: reality must match recipes/matrix.yaml.

Each release is fetched from the package index (cached), every recipe is planned against it,
and the status must be the matrix's (applies / upstreamed / unsupported). 'applies' includes
compiling every patched file and the undefined-name check. A release on the index that the
matrix does not list fails the suite by name.
"""

from __future__ import annotations

import pytest

from spectool import api, matrix
from spectool.fetch import releases

pytestmark = pytest.mark.network

MATRIX = matrix.load()


@pytest.mark.parametrize("version", list(MATRIX))
def test_release_matches_matrix(version, cached_release):
    got = matrix.actual(cached_release(version))
    want = MATRIX[version]
    assert set(got) == set(want), f"{version}: recipes {sorted(got)} vs matrix {sorted(want)}"
    diffs = {rid: (want[rid], got[rid]) for rid in want if got[rid][0] != want[rid]}
    assert not diffs, f"{version}: expected vs actual: {diffs}"


def test_every_release_on_the_index_is_in_the_matrix():
    missing = matrix.missing_releases(MATRIX, releases())
    assert not missing, f"releases with no expected status in recipes/matrix.yaml: {missing}"


def test_applying_on_a_supported_release_really_applies(sglang_release):
    """One seed-era and one current release end to end: apply, no-op, revert."""
    for version in ("0.5.8", "0.5.17"):
        tree = sglang_release(version)
        out = api.apply(tree)
        assert out.ok, (version, [r.to_json() for r in out.plan.results])
        assert not api.apply(tree).wrote
        api.revert(tree)


def test_drift_report_on_moved_anchors(cached_release):
    """The 0.5.12 variants forced onto 0.5.17 (anchors moved): drift, with where to look."""
    out = api.check(cached_release("0.5.17"), version="0.5.12", select=["spec-disable-threshold"])
    r = out.plan.results[0]
    assert r.status == "drift" and r.error is not None
    assert "add_argument" in r.error.message and "--speculative-adaptive-config" in r.error.message
