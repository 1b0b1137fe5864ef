"""`warp gc` in-process: exit codes, what goes to stdout and stderr (docs/formats/registry.md,
"Garbage collection"; the library is tested in tests/registry/test_gc.py)."""

from __future__ import annotations

import hashlib

import pytest
from support.datasets import make_rows, publish
from warpdata.registry.store import Store


@pytest.fixture
def store(tmp_path):
    """A local store: ws/t with two versions (v1 dropped-able, v2 latest) and one orphan blob."""
    url = str(tmp_path / "store")
    v1 = publish(url, "ws/t", {"main": [make_rows(20)]}, tmp_path / "a")
    v2 = publish(url, "ws/t", {"main": [make_rows(30)]}, tmp_path / "b")
    Store(url).put_blob(hashlib.sha256(b"orphan").hexdigest(), b"orphan")
    return url, v1, v2


def test_human_report_goes_to_stderr_and_dry_run_deletes_nothing(cli, store):
    url, v1, _v2 = store
    r = cli("gc", "--store", url, "--drop", f"ws/t@{v1.version_hash[:12]}", "--grace", "0", "--dry-run")
    assert r.code == 0 and r.out == ""
    assert f"would drop ws/t@{v1.version_hash[:12]}" in r.err
    assert "3 (" in r.err and "would delete 2 (" in r.err  # v1's shard and the orphan
    assert Store(url).has_manifest("ws/t", v1.version_hash)
    r = cli("gc", "--store", url, "--drop", f"ws/t@{v1.version_hash[:12]}", "--grace", "0")
    assert r.code == 0 and "deleted 2 (" in r.err and f"dropped ws/t@{v1.version_hash[:12]}" in r.err
    assert not Store(url).has_manifest("ws/t", v1.version_hash)


def test_json_is_the_whole_stdout(cli, store):
    url, _v1, _v2 = store
    r = cli("--json", "gc", "--store", url)
    assert r.code == 0 and r.err == ""
    doc = r.json()
    assert (doc["versions_kept"], doc["blobs_listed"], doc["blobs_referenced"]) == (2, 3, 2)
    assert (doc["blobs_deleted"], doc["blobs_kept_young"], doc["grace_seconds"]) == (0, 1, 86400)
    r = cli("--json", "gc", "--store", url, "--grace", "0")
    assert r.json()["blobs_deleted"] == 1 and r.json()["bytes_deleted"] == len(b"orphan")


@pytest.mark.parametrize("args, code, said", [
    (["--grace", "5"], 2, "not a duration with a unit"),
    (["--drop", "ws/t"], 2, "not WS/NAME@VERSION"),
    (["--drop", "ws/t@latest"], 2, "cannot be dropped"),
    (["--drop", "ws/t@ffffff"], 66, "no version starting with"),
])
def test_bad_options_change_nothing(cli, store, args, code, said):
    url, _v1, _v2 = store
    before = sorted(Store(url).list_objects(""))
    r = cli("gc", "--store", url, "--grace", "0", *args)
    assert r.code == code and said in r.err and r.out == ""
    assert sorted(Store(url).list_objects("")) == before


def test_dropping_latest_by_hash_is_refused(cli, store):
    url, _v1, v2 = store
    r = cli("gc", "--store", url, "--drop", f"ws/t@{v2.version_hash}")
    assert r.code == 2 and "latest.json points at" in r.err and "hint: publish a newer version" in r.err


def test_a_corrupt_manifest_is_exit_65_naming_its_key(cli, store):
    url, v1, _v2 = store
    st = Store(url)
    key = st.manifest_key("ws/t", v1.version_hash)
    path = st.url_of(key)
    with open(path, "r+b") as f:
        f.write(b"{{{{")
    r = cli("gc", "--store", url, "--grace", "0")
    assert r.code == 65 and key in r.err and "deleted nothing" in r.err
    assert st.has_blob(hashlib.sha256(b"orphan").hexdigest())


def test_an_http_store_is_read_only(cli):
    r = cli("gc", "--store", "https://example.invalid/warp")
    assert r.code == 78 and "cannot garbage-collect https://example.invalid/warp" in r.err and r.out == ""


def test_help_lists_gc_with_examples(cli):
    r = cli("gc", "--help")
    assert r.code == 0 and "warp gc --drop" in r.out and "--grace" in r.out
    r = cli("--help")
    assert r.code == 0 and " gc " in r.out
