"""The content-addressed blob cache: keys, verification, locks, pins, eviction."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import (
    BlobCorruptedError,
    CacheTooSmallError,
    ConfigError,
    DataError,
    UsageError,
)
from warpdata.core.sizes import format_size, parse_size
from warpdata.storage.blobcache import GB, BlobCache, normalize_hash


def h(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def test_put_get_roundtrip_and_layout(tmp_path):
    c = BlobCache(tmp_path / "c", cap_bytes=10_000)
    data = b"hello blob"
    p = c.put_bytes(h(data), data)
    hx = hashlib.sha256(data).hexdigest()
    assert p == tmp_path / "c" / "blobs" / hx[:2] / hx
    assert c.read_bytes(hx) == data
    assert c.has(h(data))
    assert not list((tmp_path / "c").rglob(".warp-tmp-*"))


def test_fetch_downloads_once(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000)
    calls = []
    data = os.urandom(1000)

    def writer(f):
        calls.append(1)
        f.write(data[:400])
        f.write(data[400:])

    for _ in range(3):
        c.fetch(h(data), writer, size=len(data))
    assert len(calls) == 1
    # a fresh instance (new process) also finds it
    BlobCache(tmp_path, cap_bytes=10_000).fetch(h(data), writer)
    assert len(calls) == 1


def test_hash_mismatch_leaves_nothing(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000)
    want = h(b"right bytes")
    with pytest.raises(BlobCorruptedError) as ei:
        c.fetch(want, lambda f: f.write(b"wrong bytes"), source="s3://b/x")
    assert "s3://b/x" in str(ei.value) and isinstance(ei.value, DataError)
    assert not c.has(want)
    assert not list(tmp_path.rglob(".warp-tmp-*"))
    assert not list((tmp_path / "locks").glob("*.lock"))


def test_writer_crash_is_atomic(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000)

    def boom(f):
        f.write(b"partial")
        raise ConnectionError("network went away")

    with pytest.raises(ConnectionError):
        c.fetch(h(b"partial and more"), boom)
    assert not c.has(h(b"partial and more"))
    assert not list(tmp_path.rglob(".warp-tmp-*"))


def test_corrupt_blob_dropped_and_refetched(tmp_path):
    data = os.urandom(5000)
    c = BlobCache(tmp_path, cap_bytes=100_000)
    p = c.put_bytes(h(data), data)
    with open(p, "r+b") as f:  # bit rot in place
        f.seek(100)
        f.write(b"\x00\xff\x00")
    c2 = BlobCache(tmp_path, cap_bytes=100_000)
    assert c2.get(h(data)) is None
    assert not p.exists()
    calls = []
    c2.fetch(h(data), lambda f: (calls.append(1), f.write(data)))
    assert calls == [1] and c2.read_bytes(h(data)) == data


def test_lru_eviction_under_cap(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=3000)
    blobs = [bytes([i]) * 1000 for i in range(3)]
    for i, b in enumerate(blobs):
        c.put_bytes(h(b), b)
        os.utime(c.stamp_path(h(b)), (1000 + i, 1000 + i))  # the sidecar's mtime is the LRU use stamp
    c.get(h(blobs[0]))  # blob 0 is now the most recently used
    new = b"n" * 1000
    c.put_bytes(h(new), new)
    assert c.has(h(blobs[0])) and not c.has(h(blobs[1])) and c.has(h(blobs[2])) and c.has(h(new))
    assert c.stats().bytes <= 3000


def test_pinned_never_evicted_and_too_small_cap(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=2500)
    a, b = b"a" * 1000, b"b" * 1000
    c.put_bytes(h(a), a)
    c.put_bytes(h(b), b)
    with c.pinned([h(a), h(b)]):
        # another process sees our pins
        other = BlobCache(tmp_path, cap_bytes=2500)
        assert {normalize_hash(h(a)), normalize_hash(h(b))} <= other.pinned_hashes()
        with pytest.raises(CacheTooSmallError) as ei:
            other.put_bytes(h(b"c" * 1000), b"c" * 1000)
        msg = str(ei.value)
        assert format_size(2500) in msg and format_size(3000) in msg
        assert isinstance(ei.value, ConfigError)
        assert ei.value.details["working_set_bytes"] == 3000
    assert c.has(h(a)) and c.has(h(b))
    c.put_bytes(h(b"c" * 1000), b"c" * 1000)  # pins released: LRU evicts one
    assert c.stats().bytes <= 2500


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_lock_of_dead_process_is_broken(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000, lock_timeout=10)
    data = b"x" * 10
    hx = normalize_hash(h(data))
    c._ensure_dirs()
    import socket

    (tmp_path / "locks" / f"{hx}.lock").write_text(
        json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "since": time.time()}))
    c.put_bytes(h(data), data)
    assert c.has(h(data))
    assert not (tmp_path / "locks" / f"{hx}.lock").exists()


def test_foreign_host_lock_stale_after_timeout(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000, stale_after=5, lock_timeout=10)
    data = b"y" * 10
    hx = normalize_hash(h(data))
    c._ensure_dirs()
    lock = tmp_path / "locks" / f"{hx}.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": time.time() - 60}))
    c.put_bytes(h(data), data)
    assert c.has(h(data))
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": time.time()}))
    assert not c._break_if_stale(lock)  # fresh foreign lock is respected


def test_live_lock_waits_for_holder(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000)
    data = b"z" * 100
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(f):
        calls.append("slow")
        started.set()
        release.wait(5)
        f.write(data)

    t = threading.Thread(target=c.fetch, args=(h(data), slow))
    t.start()
    started.wait(5)
    result = {}
    t2 = threading.Thread(target=lambda: result.setdefault(
        "p", c.fetch(h(data), lambda f: (calls.append("second"), f.write(data)))))
    t2.start()
    time.sleep(0.2)
    assert "p" not in result  # still waiting on the holder
    release.set()
    t.join(5)
    t2.join(5)
    assert calls == ["slow"] and result["p"].read_bytes() == data


def _proc_fetch(root, data, counter):
    c = BlobCache(root, cap_bytes=10_000_000)

    def w(f):
        with open(counter, "a") as fh:
            fh.write("x")
        time.sleep(0.3)
        f.write(data)

    c.fetch(h(data), w)


def test_processes_fetch_once(tmp_path):
    data = os.urandom(100_000)
    counter = tmp_path / "count"
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_proc_fetch, args=(str(tmp_path / "c"), data, str(counter))) for _ in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert counter.read_text() == "x"


def test_dead_process_pins_are_void(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10_000)
    c.pins_dir.mkdir(parents=True)
    import socket

    f = c.pins_dir / "dead.json"
    f.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "blobs": ["ab" * 32]}))
    assert "ab" * 32 not in c.pinned_hashes()
    assert not f.exists()


def test_gc_verify_clear_stats(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10**6)
    items = [os.urandom(1000) for _ in range(5)]
    for i, b in enumerate(items):
        c.put_bytes(h(b), b)
        os.utime(c.stamp_path(h(b)), (100 + i, 100 + i))
    s = c.stats()
    assert (s.blobs, s.bytes) == (5, 5000)
    r = c.gc(2500)
    assert r.evicted == 3 and r.freed_bytes == 3000 and r.kept == 2
    assert not c.has(h(items[0])) and c.has(h(items[4]))
    p = c.path_for(h(items[4]))
    p.write_bytes(b"garbage")
    checked, bad = c.verify()
    assert checked == 2 and bad == [normalize_hash(h(items[4]))] and not p.exists()
    c.put_manifest("ws/name", "ab" * 32, b"{}")
    c.put_pointer("ws/name", "ab" * 32, '"etag"')
    assert c.stats().manifests == 1
    assert c.clear() == 1000
    assert c.stats().blobs == 0 and c.get_pointer("ws/name") is None


def test_manifest_and_pointer_cache(tmp_path):
    c = BlobCache(tmp_path, cap_bytes=10)
    v = "cd" * 32
    assert c.get_manifest("ws/a", v) is None
    c.put_manifest("ws/a", "sha256:" + v, b'{"x":1}')
    assert c.get_manifest("ws/a", v) == b'{"x":1}'
    c.put_pointer("ws/a", v, "e1")
    assert c.get_pointer("ws/a")["version"] == v and c.get_pointer("ws/a")["etag"] == "e1"
    assert c.cached_datasets() == ["ws/a"]
    with pytest.raises(UsageError):
        c.get_manifest("../etc", v)


def test_env_cap_and_bad_values(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_SIZE_GB", "0.5")
    assert BlobCache(tmp_path).cap_bytes == GB // 2
    monkeypatch.setenv("WARP_CACHE_SIZE_GB", "lots")
    with pytest.raises(ConfigError, match="WARP_CACHE_SIZE_GB"):
        BlobCache(tmp_path)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "envcache"))
    monkeypatch.delenv("WARP_CACHE_SIZE_GB")
    assert BlobCache().root == tmp_path / "envcache"


def test_bad_hash_rejected(tmp_path):
    with pytest.raises(DataError):
        BlobCache(tmp_path, cap_bytes=1).path_for("md5:abc")


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from(["", "B", "KB", "MB", "GB", "TB"]))
def test_parse_size_units(n, unit):
    factor = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}[unit]
    assert parse_size(f"{n}{unit}") == n * factor
    assert parse_size(f"{n} {unit.lower()}") == n * factor


def test_parse_size_rejects():
    for bad in ("", "GB", "12 parsecs", "-3GB"):
        with pytest.raises(UsageError):
            parse_size(bad)
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))


def _count_hashes(monkeypatch) -> list[str]:
    """Record each full hash of a blob file (the real function still runs)."""
    import warpdata.storage.blobcache as bc

    seen: list[str] = []
    real = bc._sha256_path

    def counting(p):
        seen.append(os.path.basename(p))
        return real(p)

    monkeypatch.setattr(bc, "_sha256_path", counting)
    return seen


def test_stamp_spares_a_new_instance_the_hash_of_an_unchanged_blob(tmp_path, monkeypatch):
    data = os.urandom(5000)
    BlobCache(tmp_path).put_bytes(h(data), data)
    hashed = _count_hashes(monkeypatch)
    assert BlobCache(tmp_path).read_bytes(h(data)) == data
    assert hashed == []  # hashed as it entered the cache; the file still matches that stamp
    assert BlobCache(tmp_path, verify="full").read_bytes(h(data)) == data
    assert hashed == [normalize_hash(h(data))]  # full: every new instance hashes it once


def test_stamp_change_rehashes_and_a_corrupt_blob_is_dropped_and_fetched_again(tmp_path, monkeypatch):
    data = os.urandom(5000)
    c = BlobCache(tmp_path)
    p = c.put_bytes(h(data), data)
    hashed = _count_hashes(monkeypatch)
    os.utime(p, (1, 1))  # a touch changes the stamp (ctime): hashed again, still good
    assert BlobCache(tmp_path).get(h(data)) == p and len(hashed) == 1
    assert BlobCache(tmp_path).get(h(data)) == p and len(hashed) == 1  # the new stamp was recorded
    with open(p, "r+b") as f:  # same size, same inode: only the bytes (and ctime) change
        f.seek(100)
        f.write(bytes([data[100] ^ 1]))
    c2 = BlobCache(tmp_path)
    assert c2.get(h(data)) is None and not p.exists() and not c2.stamp_path(h(data)).exists()
    calls = []
    c2.fetch(h(data), lambda f: (calls.append(1), f.write(data)))
    assert calls == [1] and BlobCache(tmp_path).read_bytes(h(data)) == data


def test_verify_mode_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_VERIFY", "sometimes")
    with pytest.raises(ConfigError):
        BlobCache(tmp_path)
    monkeypatch.setenv("WARP_CACHE_VERIFY", "full")
    assert BlobCache(tmp_path).verify_mode == "full"
