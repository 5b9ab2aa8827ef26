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


def test_concurrent_fetches_of_one_release_download_and_unpack_it_once(tmp_path, monkeypatch):
    """Two fetches of the same release at once (two spectool processes, two test workers)
    wait for each other on the release's lock: one downloads and unpacks, both get the tree."""
    import hashlib
    import threading
    import zipfile

    wheel = tmp_path / "index-files" / "sglang-9.9.8-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/__init__.py", "")
        z.writestr("sglang/srt/server_args.py", "class ServerArgs:\n    pass\n")
        z.writestr("sglang-9.9.8.dist-info/METADATA", "Name: sglang\nVersion: 9.9.8\n")
    entry = {"filename": wheel.name, "url": wheel.as_uri(), "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch_mod, "list_files", lambda project="sglang": [entry])  # a one-file index
    downloads, unpacks = [], []
    download, unpack = fetch_mod._download, fetch_mod._unpack
    monkeypatch.setattr(fetch_mod, "_download", lambda *a: (downloads.append(a), download(*a))[1])
    monkeypatch.setattr(fetch_mod, "_unpack", lambda *a: (unpacks.append(a), unpack(*a))[1])
    roots, errors = [], []

    def one():
        try:
            roots.append(fetch_mod.fetch("9.9.8", progress=False))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(roots) == 4 and len(set(roots)) == 1
    assert len(downloads) == 1 and len(unpacks) == 1
    assert (roots[0] / "sglang" / "srt" / "server_args.py").is_file()
