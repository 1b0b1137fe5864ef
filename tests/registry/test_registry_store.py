"""Store conformance: every backend (local dir, memory://, S3 via moto) passes the same suite."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from warpdata.core.errors import (
    BlobCorruptedError,
    BlobNotFoundError,
    DatasetNotFoundError,
    LockTimeoutError,
    ManifestCorruptedError,
)
from warpdata.registry.manifest import Manifest, ShardRef, Table, blob_key
from warpdata.registry.store import FileLock, Store


def _blob(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(did: str, data: bytes, rows: int = 1) -> Manifest:
    return Manifest(did, tables={"main": Table(shards=(ShardRef(_blob(data), len(data), row_count=rows),))})


class StoreTests:
    """Subclass and provide a ``store`` fixture; a new backend is done when this passes."""

    def test_blob_create_only(self, store):
        data = b"hello blob"
        h = _blob(data)
        assert not store.has_blob(h)
        assert store.put_blob(h, data) is True
        assert store.put_blob(h, data) is False
        assert store.has_blob(h)
        assert store.get_blob(h) == data
        assert store.blob_size(h) == len(data)
        assert store.read_range(h, 6, 4) == b"blob"
        with store.open_blob(h) as f:
            f.seek(6)
            assert f.read(2) == b"bl"

    def test_blob_file_upload(self, store, tmp_path):
        p = tmp_path / "x.bin"
        p.write_bytes(os.urandom(100_000))
        h = _blob(p.read_bytes())
        assert store.put_blob_file(h, p) is True
        assert store.put_blob_file(h, p) is False
        assert store.get_blob(h) == p.read_bytes()

    def test_wrong_bytes_for_hash_refused(self, store):
        with pytest.raises(BlobCorruptedError):
            store.put_blob(_blob(b"a"), b"b")

    def test_missing_blob(self, store):
        h = _blob(b"never stored")
        with pytest.raises(BlobNotFoundError, match=h):
            store.get_blob(h)
        assert isinstance(BlobNotFoundError("x"), FileNotFoundError)
        assert store.missing_blobs([h, _blob(b"also")]) == [h, _blob(b"also")]

    def test_missing_blobs_subset(self, store):
        hs = []
        for i in range(5):
            d = f"blob {i}".encode()
            hs.append(_blob(d))
            if i % 2 == 0:
                store.put_blob(hs[-1], d)
        assert store.missing_blobs(hs + hs[:1]) == [hs[1], hs[3]]

    def test_manifest_create_only_and_verified(self, store):
        m = _manifest("ws/alpha", b"x")
        assert store.put_manifest(m) is True
        assert store.put_manifest(m) is False
        assert store.has_manifest("ws/alpha", m.version_hash)
        assert store.get_manifest("ws/alpha", m.version_hash) == m
        assert store.list_versions("ws/alpha") == [m.version_hash]
        with pytest.raises(DatasetNotFoundError):
            store.get_manifest("ws/alpha", "0" * 64)

    def test_latest_cas(self, store):
        did = "ws/beta"
        m1, m2 = _manifest(did, b"1"), _manifest(did, b"2")
        store.put_manifest(m1)
        store.put_manifest(m2)
        assert store.read_latest(did) is None
        p1 = store.cas_latest(did, m1.version_hash, None)
        assert p1 is not None and p1.version_hash == m1.version_hash
        assert store.cas_latest(did, m2.version_hash, None) is None  # someone already created it
        p2 = store.cas_latest(did, m2.version_hash, p1)
        assert p2 is not None
        assert store.cas_latest(did, m1.version_hash, p1) is None  # stale token loses
        assert store.read_latest(did).version_hash == m2.version_hash
        assert store.resolve(did) == m2
        assert store.resolve(did, m1.version_hash[:8]) == m1

    def test_set_latest_requires_manifest(self, store):
        with pytest.raises(DatasetNotFoundError):
            store.set_latest("ws/gamma", "a" * 64)
        m = _manifest("ws/gamma", b"g")
        store.put_manifest(m)
        assert store.set_latest("ws/gamma", m.version_hash).version_hash == m.version_hash
        assert store.set_latest("ws/gamma", m.version_hash).version_hash == m.version_hash

    def test_concurrent_set_latest_threads(self, store):
        did = "ws/race"
        ms = [_manifest(did, f"m{i}".encode()) for i in range(8)]
        for m in ms:
            store.put_manifest(m)
        errors: list[BaseException] = []

        def go(m):
            try:
                store.set_latest(did, m.version_hash)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=go, args=(m,)) for m in ms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert store.read_latest(did).version_hash in {m.version_hash for m in ms}

    def test_list_datasets(self, store):
        for did in ("ws/a", "ws/b", "other/c"):
            m = _manifest(did, did.encode())
            store.put_manifest(m)
            store.set_latest(did, m.version_hash)
        assert store.list_datasets() == ["other/c", "ws/a", "ws/b"]
        assert store.list_datasets("ws") == ["ws/a", "ws/b"]
        assert [d for d, p in store.iter_latest("other") if p] == ["other/c"]

    def test_not_found_suggests(self, store):
        m = _manifest("vision/coco", b"c")
        store.put_manifest(m)
        store.set_latest("vision/coco", m.version_hash)
        with pytest.raises(DatasetNotFoundError) as e:
            store.resolve("vision/cocoo")
        assert "vision/coco" in (e.value.hint or "")

    def test_corrupted_latest(self, store):
        store.objects.put_if_absent(Store.latest_key("ws/bad"), b"not json")
        with pytest.raises(ManifestCorruptedError):
            store.read_latest("ws/bad")


class TestLocalStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        return Store(tmp_path / "store")

    def test_default_store_from_env(self, tmp_path, monkeypatch):
        monkeypatch.setenv("WARP_STORE", str(tmp_path / "envstore"))
        assert Store().url == str(tmp_path / "envstore")

    def test_corrupted_blob_on_disk(self, store):
        data = b"precious"
        h = _blob(data)
        store.put_blob(h, data)
        path = os.path.join(store.location.path, blob_key(h))
        os.chmod(path, 0o644)
        with open(path, "wb") as f:
            f.write(b"tampered")
        with pytest.raises(BlobCorruptedError, match="hashes to"):
            store.get_blob(h)


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self):
        return Store(f"memory://warp-test-{uuid.uuid4().hex}")


@pytest.mark.s3
class TestS3Store(StoreTests):
    @pytest.fixture
    def store(self, s3):
        return Store(s3.url("warp"))

    def test_create_only_uses_conditional_put(self, store, s3):
        data = b"counted"
        h = _blob(data)
        s3.reset_counts()
        store.put_blob(h, data)
        store.put_blob(h, data)
        puts = s3.requests("PUT", "warp/blobs/")
        assert len(puts) == 2  # the second is refused with 412 by the server, nothing overwritten
        assert store.get_blob(h) == data

    def test_latest_uses_etag(self, store, s3):
        m = _manifest("ws/etag", b"e")
        store.put_manifest(m)
        p = store.cas_latest("ws/etag", m.version_hash, None)
        head = s3.client.head_object(Bucket=s3.bucket, Key="warp/" + Store.latest_key("ws/etag"))
        assert head["ETag"] == p.token


# -- the local lock -----------------------------------------------------------

def test_filelock_breaks_dead_holder(tmp_path):
    lock = tmp_path / "x.lock"
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    lock.write_text(json.dumps({"pid": dead_pid, "host": socket.gethostname(), "time": time.time(), "id": "old"}))
    with FileLock(lock, timeout=5):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_filelock_breaks_old_foreign_holder(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "time": time.time() - 3600, "id": "old"}))
    with FileLock(lock, stale_after=30, timeout=5):
        pass


def test_filelock_waits_for_live_holder(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "id": "live"}))
    with pytest.raises(LockTimeoutError, match="held by a live process"):
        FileLock(lock, timeout=0.2).acquire()
    assert json.loads(lock.read_text())["id"] == "live"


def test_filelock_mutual_exclusion(tmp_path):
    lock = tmp_path / "x.lock"
    inside = []
    overlap = []

    def work():
        for _ in range(20):
            with FileLock(lock, timeout=30):
                inside.append(1)
                if len(inside) > 1:
                    overlap.append(1)
                time.sleep(0.0005)
                inside.pop()

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not overlap
