"""Conformance suite for the dataset registry's store backends (warp/registry/store.py): one
base class holds the tests, one subclass per backend supplies a ``store`` fixture (zarr-python's
``StoreTests`` pattern). A backend is done when its subclass passes.

The store's keys are content hashes and dataset ids, so its "create-only put" answers a second
put of a key with ``False`` (the documented contract: the key names its content, the work is
done) rather than raising; what the suite checks is that the first bytes are never replaced and
that exactly one of N racing writers is told it wrote.

A subclass supplies:

* ``store``: a fixture returning a fresh, empty :class:`~warpdata.registry.store.Store` whose
  root is the only thing inside a fresh folder (bucket, memory folder): the hostile-key test
  checks that nothing appears beside it;
* ``large_size`` and :meth:`StoreConformance.put_large`: how a large blob goes up (the S3 subclass
  uses the registry's multipart upload).
"""

from __future__ import annotations

import hashlib
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from warpdata.core.errors import (
    BlobNotFoundError,
    DatasetNotFoundError,
    ExitCode,
    InvalidDatasetIdError,
    InvalidHashError,
    WarpError,
)
from warpdata.registry.manifest import Manifest, ShardRef, Table, blob_key
from warpdata.registry.store import Store

RACERS = 8
HOSTILE_HASHES = [
    "../../../../etc/passwd", "/etc/passwd", "0" * 62 + "/.", "0" * 63 + "\0", "0" * 64 + "\n", "0" * 64 + "/../x",
    "A" * 64, "0" * 65, "", "0" * 63,
]
HOSTILE_IDS = [
    "../x", "ws/..", "ws/../../x", "/etc/passwd", "ws//x", "ws/a\0b", "ws/a\n", "ws/a/b", "WS/Upper", "ws\\a", "",
    "ws/" + "a" * 300,
]
HOSTILE_WORKSPACES = ["..", "../x", "/etc", "ws/a", "a\0", "a\n", "", "WS", "."]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(did: str, tag: bytes) -> Manifest:
    return Manifest(did, tables={"main": Table(shards=(ShardRef(sha(tag), len(tag), row_count=1),))})


def race(n: int, fn) -> list:
    """Run ``fn(i)`` for i in range(n) on n threads released together; their results in order."""
    barrier = threading.Barrier(n)

    def go(i: int):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(go, range(n)))


class StoreConformance:
    """Base of the store suites; see the module docstring for what a subclass supplies."""

    large_size: ClassVar[int] = 24 << 20

    def put_large(self, store: Store, hash_hex: str, path: Path) -> bool:
        """Create-only upload of a large local file (the backend's multipart path, if it has one)."""
        return store.put_blob_file(hash_hex, path)

    @staticmethod
    def objects(store: Store, *, beside: bool = False) -> list[str]:
        """Every object under the store's root, or (``beside``) under the folder that holds it."""
        root = store.location.path.rstrip("/")
        if beside:
            root = root.rsplit("/", 1)[0] or "/"
        store.fs.invalidate_cache()
        return sorted(store.fs.find(root))

    # -- put/get -------------------------------------------------------------------------------
    @pytest.mark.parametrize("size", [0, 1, 4095, 1 << 20])
    def test_put_get_round_trip(self, store, size):
        data = np.random.default_rng(size).bytes(size)
        h = sha(data)
        assert store.put_blob(h, data) is True
        assert store.get_blob(h) == data
        assert store.blob_size(h) == size and store.has_blob(h)
        with store.open_blob(h) as f:
            assert f.read() == data

    def test_manifest_bytes_round_trip(self, store):
        m = manifest("ws/rt", b"rt")
        assert store.put_manifest(m) is True
        assert store.get_manifest_bytes("ws/rt", m.version_hash) == m.to_bytes()
        assert store.get_manifest("ws/rt", m.version_hash) == m

    # -- objects by key (the interface under the dataset contract) -------------------------------
    def test_objects_by_key(self, store):
        assert store.put_object("probe/a", b"first") is True
        assert store.put_object("probe/a", b"second") is False  # create-only: the first bytes stay
        assert store.get_object("probe/a") == b"first"
        t1 = store.swap_object("probe/latest.json", b"1", None)
        assert t1 is not None and store.swap_object("probe/latest.json", b"x", None) is None  # exists already
        t2 = store.swap_object("probe/latest.json", b"2", t1)
        assert t2 is not None and store.swap_object("probe/latest.json", b"3", t1) is None  # a stale token
        assert store.get_object("probe/latest.json") == b"2"
        store.delete_object("probe/latest.json")
        store.delete_object("probe/latest.json")  # deleting what is gone is no error
        with pytest.raises(FileNotFoundError):
            store.get_object("probe/latest.json")
        store.remove_prefix("probe")
        with pytest.raises(FileNotFoundError):
            store.get_object("probe/a")

    # -- create-only -----------------------------------------------------------------------------
    def test_second_put_never_replaces_the_first(self, store, tmp_path):
        first, other = b"first bytes", b"other bytes"
        h = sha(first)
        assert store.put_blob(h, first) is True
        assert store.put_blob(h, other, verify=False) is False
        p = tmp_path / "other.bin"
        p.write_bytes(other)
        assert store.put_blob_file(h, p) is False
        assert store.get_blob(h) == first
        m = manifest("ws/once", b"once")
        assert store.put_manifest(m) is True
        assert store.put_manifest(m) is False

    @pytest.mark.parametrize("trial", range(3))
    def test_racing_puts_have_exactly_one_winner(self, store, trial):
        """N threads put different bytes under one key at once: one is told it wrote, and its bytes stay."""
        h = sha(f"race {trial}".encode())
        bodies = [f"writer {i} of trial {trial}".encode() * (i + 1) for i in range(RACERS)]
        wrote = race(RACERS, lambda i: store.put_blob(h, bodies[i], verify=False))
        winners = [i for i, w in enumerate(wrote) if w is True]
        assert len(winners) == 1, wrote
        assert all(w is False for i, w in enumerate(wrote) if i not in winners)
        assert store.get_blob(h, verify=False) == bodies[winners[0]]

    def test_racing_manifest_puts_have_exactly_one_winner(self, store):
        m = manifest("ws/racem", b"racem")
        wrote = race(RACERS, lambda i: store.put_manifest(m))
        assert sorted(wrote) == [False] * (RACERS - 1) + [True]
        assert store.list_versions("ws/racem") == [m.version_hash]

    # -- compare-and-swap of latest --------------------------------------------------------------
    def test_latest_compare_and_swap_has_exactly_one_winner(self, store):
        did = "ws/cas"
        ms = [manifest(did, f"cas {i}".encode()) for i in range(RACERS)]
        for m in ms:
            store.put_manifest(m)
        expected = None
        for _round in range(2):  # creating the pointer, then moving it
            got = race(RACERS, lambda i, exp=expected: store.cas_latest(did, ms[i].version_hash, exp))
            winners = [p for p in got if p is not None]
            assert len(winners) == 1, got
            now = store.read_latest(did)
            assert now.version_hash == winners[0].version_hash and now.token == winners[0].token
            if expected is not None:
                assert store.cas_latest(did, ms[0].version_hash, expected) is None  # a stale token loses
            expected = now
        assert store.read_latest(did) == expected

    # -- ranged reads ----------------------------------------------------------------------------
    def test_ranged_reads_are_exact(self, store):
        data = np.random.default_rng(7).bytes(10_007)
        h = sha(data)
        store.put_blob(h, data)
        n = len(data)
        ranges = [(0, 1), (0, n), (1, 100), (4096, 4096), (n - 1, 1), (n - 5, 5),  # the final byte(s)
                  (n - 3, 10), (n, 1), (n + 100, 5),  # past the end: what is there, as data[a:a + k] gives
                  (0, 0), (n // 2, 0), (n, 0), (n + 1, 0)]  # empty ranges: nothing, wherever they start
        for start, length in ranges:
            assert store.read_range(h, start, length) == data[start:start + length], (start, length)
        with store.open_blob(h) as f:
            f.seek(n - 1)
            assert f.read(1) == data[-1:] and f.read(1) == b""
        for start, length in [(-1, 1), (0, -1)]:
            with pytest.raises(WarpError):
                store.read_range(h, start, length)

    # -- missing keys ------------------------------------------------------------------------------
    def test_missing_keys_are_typed_not_found_errors_naming_the_key(self, store):
        h = sha(b"never stored")
        calls = {"get_blob": lambda: store.get_blob(h), "blob_size": lambda: store.blob_size(h),
                 "read_range": lambda: store.read_range(h, 0, 4), "read_range(0 bytes)": lambda: store.read_range(h, 0, 0),
                 "open_blob": lambda: store.open_blob(h)}
        for what, call in calls.items():
            with pytest.raises(BlobNotFoundError) as ei:
                call()
            assert h in ei.value.message and ei.value.exit_code == ExitCode.NO_INPUT, what
            assert isinstance(ei.value, FileNotFoundError), what
        assert not store.has_blob(h)
        v = sha(b"no such version")
        for call in (lambda: store.get_manifest_bytes("ws/none", v), lambda: store.get_manifest("ws/none", v)):
            with pytest.raises(DatasetNotFoundError) as ei:
                call()
            assert v in ei.value.message and "ws/none" in ei.value.message
        assert store.read_latest("ws/none") is None
        with pytest.raises(DatasetNotFoundError, match="ws/none"):
            store.resolve("ws/none")

    # -- listing -----------------------------------------------------------------------------------
    def test_listing(self, store):
        assert store.list_datasets() == [] and store.list_versions("ws/a") == []
        versions = sorted(manifest("ws/a", f"a{i}".encode()).version_hash for i in range(3))
        for i in range(3):
            store.put_manifest(manifest("ws/a", f"a{i}".encode()))
        store.put_manifest(manifest("ws/b", b"b"))  # a version, no latest pointer
        c = manifest("zz/c", b"c")
        store.put_manifest(c)
        store.set_latest("zz/c", c.version_hash)
        store.put_blob(sha(b"blob"), b"blob")  # blobs are not datasets
        assert store.list_versions("ws/a") == versions
        assert store.list_versions("ws/b") == [manifest("ws/b", b"b").version_hash]
        assert store.list_datasets() == ["ws/a", "ws/b", "zz/c"]
        assert store.list_datasets("ws") == ["ws/a", "ws/b"]
        assert [(d, p.version_hash if p else None) for d, p in store.iter_latest()] == [
            ("ws/a", None), ("ws/b", None), ("zz/c", c.version_hash)]

    def test_listing_objects_with_sizes_and_times(self, store):
        """What ``warp gc`` lists (warp/registry/gc.py): every key under a prefix at any depth, its
        size and last-modified time, sorted; nothing for a prefix with no objects."""
        import time

        assert store.list_objects("blobs/") == []
        t0 = time.time()
        for data in (b"one", b"second"):
            store.put_blob(sha(data), data)
        m = manifest("ws/a", b"a")
        store.put_manifest(m)
        got = store.list_objects("blobs/")
        assert [(k, n) for k, n, _t in got] == sorted((blob_key(sha(d)), len(d)) for d in (b"one", b"second"))
        assert all(t0 - 5 <= t <= time.time() + 5 for _k, _n, t in got)  # S3 LastModified: whole seconds
        assert [k for k, _n, _t in store.list_objects("datasets/")] == [store.manifest_key("ws/a", m.version_hash)]

    # -- large objects -----------------------------------------------------------------------------
    def test_large_object(self, store, tmp_path):
        data = np.random.default_rng(11).bytes(self.large_size)
        p = tmp_path / "large.bin"
        p.write_bytes(data)
        h = sha(data)
        del data
        assert self.put_large(store, h, p) is True
        assert self.put_large(store, h, p) is False
        assert store.blob_size(h) == self.large_size
        assert sha(store.get_blob(h)) == h
        raw = p.read_bytes()
        for start, length in [(0, 16), ((16 << 20) - 3, 6), (self.large_size - 1, 1), (self.large_size - 7, 100)]:
            assert store.read_range(h, start, length) == raw[start:start + length], (start, length)

    # -- hostile keys --------------------------------------------------------------------------------
    def test_hostile_keys_are_rejected_with_typed_errors(self, store, tmp_path):
        ok_did, ok_hash = "ws/ok", sha(b"ok")
        local = tmp_path / "x.bin"
        local.write_bytes(b"x")
        before = self.objects(store, beside=True)

        def check(exc: type[WarpError], key: str, what: str, call: Any) -> None:
            with pytest.raises(exc) as ei:
                call()
            assert repr(key) in ei.value.message, (what, ei.value.message)
            assert ei.value.exit_code == ExitCode.USAGE, what

        for h in HOSTILE_HASHES:
            for what, call in {
                "has_blob": lambda h=h: store.has_blob(h), "get_blob": lambda h=h: store.get_blob(h),
                "put_blob": lambda h=h: store.put_blob(h, b"x", verify=False),
                "put_blob_file": lambda h=h: store.put_blob_file(h, local),
                "read_range": lambda h=h: store.read_range(h, 0, 1), "blob_size": lambda h=h: store.blob_size(h),
                "open_blob": lambda h=h: store.open_blob(h), "missing_blobs": lambda h=h: store.missing_blobs([h]),
                "has_manifest": lambda h=h: store.has_manifest(ok_did, h),
                "get_manifest": lambda h=h: store.get_manifest(ok_did, h),
                "cas_latest": lambda h=h: store.cas_latest(ok_did, h, None),
                "set_latest": lambda h=h: store.set_latest(ok_did, h, check_manifest=False),
            }.items():
                check(InvalidHashError, h, f"{what}({h!r})", call)
        for did in HOSTILE_IDS:
            for what, call in {
                "list_versions": lambda d=did: store.list_versions(d), "read_latest": lambda d=did: store.read_latest(d),
                "has_manifest": lambda d=did: store.has_manifest(d, ok_hash),
                "get_manifest_bytes": lambda d=did: store.get_manifest_bytes(d, ok_hash),
                "cas_latest": lambda d=did: store.cas_latest(d, ok_hash, None),
                "set_latest": lambda d=did: store.set_latest(d, ok_hash, check_manifest=False),
                "resolve": lambda d=did: store.resolve(d),
            }.items():
                check(InvalidDatasetIdError, did, f"{what}({did!r})", call)
        for ws in HOSTILE_WORKSPACES:
            check(InvalidDatasetIdError, ws, f"list_datasets({ws!r})", lambda ws=ws: store.list_datasets(ws))
        assert self.objects(store, beside=True) == before, "a refused key still wrote something"


# -- the request policy (warp/storage/policy.py) ----------------------------------------------------

DEADLINE = 1.5  # seconds: WARP_REQUEST_DEADLINE in these tests
BUDGET = 2.0  # seconds: WARP_RETRY_BUDGET in these tests
MEMORY_CEILING = 96 << 20  # bytes of Python allocations one hostile read may peak at (JSON_CAP is 32 MiB)
SHARD = bytes(range(256)) * 64  # a 16 KiB object, stored as a blob (its key names its hash)


def bounded(fn) -> tuple[BaseException | None, Any, float, int]:
    """(error, result, seconds, peak bytes allocated) of ``fn()``."""
    import time
    import tracemalloc

    tracemalloc.start()
    t0 = time.monotonic()
    err, out = None, None
    try:
        out = fn()
    except BaseException as e:  # what it raised is the result
        err = e
    seconds = time.monotonic() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, out, seconds, peak


class RequestPolicyConformance:
    """The request-policy cases every protocol that sends requests passes (HTTP(S) stores; S3 through
    presigned reads): a hostile or broken host ends each read with a typed error, within the attempt
    deadline plus the retry budget, under a memory ceiling. Local and memory stores send no request.

    A subclass supplies ``remote_at(url)``: a fixture returning a function that makes a
    :class:`~warpdata.storage.remote.Remote` whose requests go to the host at ``url``
    (``http://`` or ``https://127.0.0.1:PORT``).
    """

    startup: ClassVar[float] = 0.0  # seconds a first request may spend making its client (S3: boto3)

    @pytest.fixture(autouse=True)
    def _policy_env(self, monkeypatch, tmp_path):
        monkeypatch.setenv("WARP_REQUEST_DEADLINE", str(DEADLINE))
        monkeypatch.setenv("WARP_RETRY_BUDGET", str(BUDGET))
        monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))

    @staticmethod
    def blob(data: bytes = SHARD) -> str:
        return f"blobs/sha256/{sha(data)[:2]}/{sha(data)}"

    def typed(self, fn, *, within: float, code: ExitCode, cause: str | None = None) -> WarpError:
        # on a thread the test outlives: a read that never ends fails the test instead of hanging it
        got: list = []
        t = threading.Thread(target=lambda: got.append(bounded(fn)), daemon=True)
        t.start()
        t.join(within + self.startup + 10)
        assert got, f"still reading after {within + self.startup + 10:.0f}s (limit {within + self.startup}s)"
        err, _, seconds, peak = got[0]
        assert isinstance(err, WarpError), f"untyped: {err!r}"
        assert err.exit_code == code, f"{err!r} exits {err.exit_code}, not {code}"
        if cause is not None:
            assert err.details.get("cause") == cause, (err, err.details)
        assert err.hint, err
        assert seconds <= within + self.startup, f"{err!r} took {seconds:.1f}s (limit {within + self.startup}s)"
        assert peak <= MEMORY_CEILING, f"peak {peak >> 20} MiB"
        return err

    def test_endless_body_is_cut_at_the_cap(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("endless") as host:
            remote = remote_at(host.url)
            err = self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE + 1,
                             code=ExitCode.CONFIG, cause="oversize")
            assert host.url.split("//")[1] in str(err)
            self.typed(lambda: remote.get("datasets/ws/name/latest.json"), within=DEADLINE + 10,
                       code=ExitCode.CONFIG, cause="oversize")
            assert host.requests == 2  # permanent: never retried

    def test_trickling_body_ends_at_the_deadline(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("trickle") as host:
            remote = remote_at(host.url)
            err = self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)),
                             within=DEADLINE + BUDGET + DEADLINE + 1, code=ExitCode.TEMPFAIL)
            assert "deadline" in str(err) and "WARP_RETRY_BUDGET" in err.hint
            assert 1 <= host.requests <= 3  # retried as a timeout, within the budget

    def test_streamed_object_from_a_trickling_host_ends_at_the_deadline(self, remote_at):
        """A whole object streamed to a file (the feature cache's shards) is read under the same
        deadline, by ranged GETs, however long the object."""
        from support.hostile import HostileHost

        with HostileHost("trickle", body=SHARD) as host:
            remote = remote_at(host.url)
            sink = io.BytesIO()
            err = self.typed(lambda: remote.stream_to("v20260101-0123456789ab/shard-00000.wfs", sink, len(SHARD)),
                             within=DEADLINE + BUDGET + DEADLINE + 1, code=ExitCode.TEMPFAIL)
            assert "deadline" in str(err) and 1 <= host.requests <= 3

    def test_trickling_headers_end_at_the_deadline(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("slow-headers") as host:
            remote = remote_at(host.url)
            err = self.typed(lambda: remote.get("datasets/ws/name/latest.json"),
                             within=DEADLINE + BUDGET + DEADLINE + 1, code=ExitCode.TEMPFAIL)
            assert "deadline" in str(err) and 1 <= host.requests <= 3

    def test_oversize_body_is_refused_before_it_is_read(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("oversize") as host:
            remote = remote_at(host.url)
            self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                       code=ExitCode.CONFIG, cause="oversize")
            assert host.requests == 1

    def test_wrong_content_range_is_refused(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("bad-range", body=SHARD) as host:
            remote = remote_at(host.url)
            self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                       code=ExitCode.CONFIG, cause="content-range")
            assert host.requests == 1

    def test_tls_to_a_plain_host_fails_at_once(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("no-range", body=SHARD) as host:
            remote = remote_at(host.url.replace("http://", "https://"))
            err = self.typed(lambda: remote.get("datasets/ws/name/latest.json"), within=DEADLINE,
                             code=ExitCode.CONFIG, cause="tls")
            assert "TLS" in str(err) and "http://" in err.hint
            assert host.requests == 0  # the handshake failed: no request was read, none retried

    def test_untrusted_certificate_fails_at_once(self, remote_at, tmp_path):
        from support.hostile import HostileHost, self_signed

        with HostileHost("no-range", body=SHARD, tls=self_signed(tmp_path)) as host:
            remote = remote_at(host.url)
            self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                       code=ExitCode.CONFIG, cause="tls")
            assert host.requests == 0

    def test_redirect_is_not_followed_to_plain_http(self, remote_at, tmp_path, monkeypatch):
        from support.hostile import HostileHost, self_signed

        cert = self_signed(tmp_path)
        monkeypatch.setenv("SSL_CERT_FILE", cert[0])  # the host's certificate is trusted
        with HostileHost("no-range", body=SHARD) as plain, \
                HostileHost("redirect", location=plain.url + "/elsewhere", tls=cert) as host:
            remote = remote_at(host.url)
            self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                       code=ExitCode.CONFIG, cause="redirect-downgrade")
            assert host.requests == 1 and plain.requests == 0

    def test_host_without_range_is_read_whole_and_verified(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("no-range", body=SHARD) as host:
            remote = remote_at(host.url)
            err, got, seconds, peak = bounded(lambda: [remote.read_range(self.blob(), o, 100, len(SHARD))
                                                       for o in (0, 1000, 5000)])
            assert err is None, err
            assert got == [SHARD[o:o + 100] for o in (0, 1000, 5000)]
            assert remote.ignores_range and peak <= MEMORY_CEILING
            assert host.requests == 2  # the ranged read answered whole, then one whole GET; then the cache

    def test_host_without_range_must_send_the_hashed_bytes(self, remote_at):
        from support.hostile import HostileHost

        with HostileHost("no-range", body=SHARD[:-1] + b"!") as liar:  # a whole answer is checked
            remote = remote_at(liar.url)
            err = self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                             code=ExitCode.DATA)
            assert sha(SHARD) in str(err)
