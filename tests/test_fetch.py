"""Fetching pinned releases: the pin's sha256 is enforced, also for an already-unpacked cache."""

from __future__ import annotations

import json

import pytest

from spectool import fetch as fetch_mod
from spectool.errors import FetchError
from spectool.pin import load_pin, pinned_version_in


def _pin(tmp_path, sha):
    p = tmp_path / "spectool.toml"
    p.write_text(f'[sglang]\nversion = "9.9.9"\nfile = "sglang-9.9.9.tar.gz"\nsha256 = "{sha}"\n')
    return p


def test_cached_tree_with_other_hash_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECTOOL_PIN", str(_pin(tmp_path, "a" * 64)))
    root = tmp_path / "cache" / "sglang-9.9.9"
    root.mkdir(parents=True)
    (root / ".spectool-fetched").write_text(json.dumps({"file": "sglang-9.9.9.tar.gz", "sha256": "b" * 64}))
    with pytest.raises(FetchError, match="pin file says"):
        fetch_mod.fetch(progress=False)
    (root / ".spectool-fetched").write_text(json.dumps({"file": "sglang-9.9.9.tar.gz", "sha256": "a" * 64}))
    assert fetch_mod.fetch(progress=False) == root


def test_shipped_pin_is_complete():
    pin = load_pin()
    assert pin.version == "0.5.12" and len(pin.sha256) == 64 and pin.file.endswith(".whl")
    assert set(pin.recipes) == {"spec-disable-threshold", "spec-fallback", "sm120"}


def test_pinned_version_in_changed_files(tmp_path):
    r = tmp_path / "requirements.txt"
    r.write_text("torch==2.11.0\nsglang[all] == 0.5.17 ; python_version >= '3.10'\n")
    assert pinned_version_in(r) == "0.5.17"
    t = tmp_path / "spectool.toml"
    t.write_text('[sglang]\nversion = "0.5.12"\n')
    assert pinned_version_in(t) == "0.5.12"
    r.write_text("numpy\n")
    assert pinned_version_in(r) is None


@pytest.mark.network
def test_fetch_checks_the_index_hash_and_unpacks(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "c"))
    root = fetch_mod.fetch("0.5.8", progress=False)
    assert (root / "sglang" / "srt" / "server_args.py").is_file()
    marker = json.loads((root / ".spectool-fetched").read_text())
    assert marker["file"] == "sglang-0.5.8.tar.gz" and len(marker["sha256"]) == 64  # the sdist is preferred
