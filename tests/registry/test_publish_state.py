"""The unchanged re-publish path: the stat cache, its change detection, and one S3 round trip.

An unchanged re-publish must neither re-hash nor re-pack (stat cache hits),
must cost exactly one small GET of ``latest`` when the store already points
at the version, and must still notice every real change: a same-size edit
with the mtime put back (ctime moves), a file written too recently to trust
its timestamps (racily clean), and a store that changed under it (latest
moved elsewhere, or an empty store).
"""

from __future__ import annotations

import os
import time

import pytest
from test_publish import make_dataset
from warpdata.publishing import publish as publish_mod
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.store import Store
from warpdata.registry.tarpack import scan_members


def _request(root, dataset="ws/state", layout="as-is"):
    """The inputs published byte for byte (``layout="as-is"``): these tests are about the stat cache
    and the files' own bytes; the paged rewrite has its own (tests/registry/test_publish_pages.py)."""
    return PublishRequest(dataset, tables={"main": [f"{root}/data/*.parquet"]}, artifacts={"imgs": str(root / "imgs")},
                          shard_size=8 << 10, layout=layout)


def _settle():
    """Wait until every input is older than the racy window, so the stat cache may keep it."""
    time.sleep(publish_mod.RACY_WINDOW_NS / 1e9 + 0.05)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_unchanged_republish_hits_stat_cache(tmp_path, cache_dir):
    make_dataset(tmp_path)
    _settle()
    store = Store(tmp_path / "store")
    r1 = publish(_request(tmp_path), store=store)
    assert r1.stat_cache_hits == 0 and r1.blobs_uploaded == len(r1.blobs)
    r2 = publish(_request(tmp_path), store=store)
    # 3 Parquet files + 1 artifact directory, all from the cache; nothing sent
    assert r2.stat_cache_hits == 4
    assert r2.version_hash == r1.version_hash and r2.already_published
    assert r2.blobs_uploaded == 0 and not r2.manifest_written and not r2.latest_moved
    assert publish(_request(tmp_path, "ws/state"), store=store).stat_cache_hits == 4


def test_same_size_edit_with_mtime_restored_is_seen(tmp_path, cache_dir):
    make_dataset(tmp_path)
    _settle()
    store = Store(tmp_path / "store")
    r1 = publish(_request(tmp_path), store=store)
    publish(_request(tmp_path), store=store)  # cache is warm
    img = tmp_path / "imgs" / "sub" / "7.jpg"
    st = img.stat()
    img.write_bytes(b"\xee" * st.st_size)
    os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as before: only ctime tells
    assert img.stat().st_mtime_ns == st.st_mtime_ns and img.stat().st_size == st.st_size
    _settle()  # so the miss below is the ctime's doing, and r2 may cache its result
    r2 = publish(_request(tmp_path), store=store)
    assert r2.version_hash != r1.version_hash
    assert r2.stat_cache_hits == 3  # the tables still hit; the artifact was re-packed
    assert 0 < r2.blobs_uploaded < len(r2.blobs)  # the changed tar shard and the index
    # and a Parquet file edited the same way
    pq_file = sorted((tmp_path / "data").glob("*.parquet"))[0]
    st = pq_file.stat()
    data = bytearray(pq_file.read_bytes())
    data[4] ^= 0xFF  # a byte inside the first column chunk: still the same size
    pq_file.write_bytes(bytes(data))
    os.utime(pq_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    _settle()
    r3 = publish(_request(tmp_path), store=store)
    assert r3.version_hash != r2.version_hash and r3.stat_cache_hits == 3  # 2 tables + artifact


def test_racily_clean_inputs_are_not_cached(tmp_path, cache_dir, monkeypatch):
    """An input changed within the racy window of its scan is hashed again next time."""
    make_dataset(tmp_path)
    store = Store(tmp_path / "store")
    # every input counts as just written, whatever the machine's speed
    monkeypatch.setattr(publish_mod, "RACY_WINDOW_NS", 3600 * 10**9)
    publish(_request(tmp_path), store=store)
    assert publish(_request(tmp_path), store=store).stat_cache_hits == 0
    monkeypatch.setattr(publish_mod, "RACY_WINDOW_NS", 0)
    publish(_request(tmp_path), store=store)
    assert publish(_request(tmp_path), store=store).stat_cache_hits == 4


def test_scan_fingerprint_tracks_every_change(tmp_path):
    make_dataset(tmp_path)
    root = tmp_path / "imgs"
    a = scan_members(root)
    assert scan_members(root).fingerprint == a.fingerprint
    assert a.newest_change_ns >= max(os.stat(p).st_ctime_ns for _, p, _ in a.members)
    assert [m[0] for m in a.members] == sorted(m[0] for m in a.members)
    (root / "0.jpg").rename(root / "0b.jpg")  # rename: same bytes, new name
    b = scan_members(root)
    assert b.fingerprint != a.fingerprint
    os.utime(root / "0b.jpg", ns=(0, 0))  # mtime only
    assert scan_members(root).fingerprint != b.fingerprint
    (root / "new.jpg").write_bytes(b"x")
    assert len(scan_members(root).members) == len(a.members) + 1
    (root / ".warp-tmp-partial").write_bytes(b"ignored")  # a killed writer's leftover is not content
    assert len(scan_members(root).members) == len(a.members) + 1


def test_non_ascii_member_order_is_bytewise(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    for name in ("z", "é", "a/b", "a.txt", "\U0001f600", "\uff21"):
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(name.encode())
    names = [m[0] for m in scan_members(root).members]
    assert names == sorted(names, key=lambda n: n.encode("utf-8"))


@pytest.mark.s3
def test_unchanged_republish_is_one_get(s3, tmp_path, cache_dir):
    make_dataset(tmp_path)
    _settle()
    store = Store(s3.url("warp"))
    r1 = publish(_request(tmp_path), store=store)
    s3.reset_counts()
    r2 = publish(_request(tmp_path), store=store)
    assert r2.version_hash == r1.version_hash and r2.blobs_uploaded == 0 and r2.stat_cache_hits == 4
    reqs = s3.requests()
    assert [(r["method"], r["key"]) for r in reqs] == [("GET", "warp/datasets/ws/state/latest.json")], reqs


@pytest.mark.s3
def test_remote_changed_under_the_cache(s3, tmp_path, cache_dir):
    """The stat cache is local: a store whose latest moved, or an empty store, is checked and filled."""
    make_dataset(tmp_path)
    other = tmp_path / "other"
    make_dataset(other, n_shards=1, n_files=4)
    _settle()
    store = Store(s3.url("warp"))
    r1 = publish(_request(tmp_path), store=store)
    r_other = publish(_request(other), store=store)  # another publisher moves latest
    assert store.read_latest("ws/state").version_hash == r_other.version_hash
    s3.reset_counts()
    r2 = publish(_request(tmp_path), store=store)
    assert r2.version_hash == r1.version_hash and r2.stat_cache_hits == 4
    assert r2.already_published and r2.blobs_uploaded == 0 and not r2.manifest_written
    assert r2.latest_moved and store.read_latest("ws/state").version_hash == r1.version_hash
    assert s3.count("HEAD", "warp/datasets/ws/state/versions/") + s3.count(
        "GET", "warp/datasets/ws/state/versions/") >= 1  # the manifest's existence was checked
    assert s3.count("PUT", "warp/blobs/") == 0 and s3.count("PUT", "warp/datasets/ws/state/latest.json") == 1

    # a fresh, empty store: the cache's hits are re-packed from the inputs and every blob is sent
    fresh = Store(s3.url("fresh"))
    r3 = publish(_request(tmp_path), store=fresh)
    assert r3.stat_cache_hits == 4 and r3.version_hash == r1.version_hash
    assert r3.blobs_uploaded == len(r3.blobs) and r3.manifest_written
    m = fresh.resolve("ws/state")
    for blob in m.blobs():
        fresh.get_blob(blob.hash)  # verifies the SHA-256 of every uploaded blob


def test_published_manifest_carries_shard_stats(tmp_path, cache_dir):
    """`warp publish` records each Parquet shard's footer length and column min/max (format 2), and
    the table's exact Arrow schema (format 4)."""
    import pyarrow.parquet as pq
    from warpdata.registry.parquet_stats import footer_size_of

    make_dataset(tmp_path)
    store = Store(tmp_path / "store")
    r = publish(_request(tmp_path), store=store)
    m = store.resolve("ws/state")
    files = sorted((tmp_path / "data").glob("*.parquet"))
    assert m.version_hash == r.version_hash
    for f, shard in zip(files, m.tables["main"].shards, strict=True):
        assert shard.stats["footer_size"] == footer_size_of(str(f))
        assert shard.stats["columns"]["label"] == {"min": 0, "max": 9, "null_count": 0}
        assert shard.stats["row_groups"][0]["row_count"] == shard.row_count == 10
    assert store.get_manifest_bytes("ws/state", r.version_hash).count(b'"format_version":4') == 1
    assert m.tables["main"].arrow_schema().equals(pq.ParquetFile(files[0]).schema_arrow, check_metadata=True)
