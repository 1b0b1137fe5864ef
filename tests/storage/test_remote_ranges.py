"""The ranged reads under the remote stream: how :func:`plan_ranges` coalesces, and what one
read costs on S3 (moto on 127.0.0.1, every request counted by the server).

A plan fetches every needed byte once; every other byte it fetches lies in a merged gap of at
most ``hole`` bytes, the large gaps together within ``waste`` of the needed bytes; no GET is
longer than ``split``. On S3 a ranged read is one GET through a presigned URL: no HEAD first.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.core.errors import BlobNotFoundError, DataError
from warpdata.storage import ranges as ranges_module
from warpdata.storage.remote import Remote, plan_ranges
from warpdata.storage.s3reads import _PresignedRanges


def _union(ranges) -> list[tuple[int, int]]:
    """[start, end) runs of the bytes ``ranges`` ((offset, length) pairs) cover."""
    out: list[list[int]] = []
    for o, n in sorted((o, n) for o, n in ranges if n > 0):
        if out and o <= out[-1][1]:
            out[-1][1] = max(out[-1][1], o + n)
        else:
            out.append([o, o + n])
    return [(a, b) for a, b in out]


def _covered(runs, a: int, b: int) -> bool:
    return any(s <= a and b <= e for s, e in runs)


ranges_st = st.lists(st.tuples(st.integers(0, 5_000_000), st.integers(0, 400_000)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(ranges_st, st.integers(0, 2_000_000), st.integers(1, 3_000_000), st.floats(0, 0.5),
       st.integers(0, 20_000))
def test_plan_covers_exactly_the_needed_bytes(ranges, hole, split, waste, small):
    plan = plan_ranges(ranges, hole=hole, split=split, waste=waste, small=small)
    needed = _union(ranges)
    fetched = _union(plan)
    # sorted, disjoint, none empty, none over the split size
    assert all(0 < n <= split for _, n in plan)
    assert all(plan[i][0] + plan[i][1] <= plan[i + 1][0] for i in range(len(plan) - 1))
    # every needed byte is fetched
    assert all(_covered(fetched, a, b) for a, b in needed)
    # and every other byte fetched is a whole gap between needed runs, of at most `hole` bytes
    # (or `small`), the gaps over `small` within `waste` of the needed bytes
    gaps = [(needed[i][1], needed[i + 1][0]) for i in range(len(needed) - 1)]
    merged = [(a, b) for a, b in gaps if _covered(fetched, a, b)]
    assert all(not _covered(fetched, a, a + 1) for a, b in gaps if (a, b) not in merged)
    assert all(b - a <= max(hole, small) for a, b in merged)
    need = sum(b - a for a, b in needed)
    assert sum(b - a for a, b in merged if b - a > small) <= waste * need + 1e-6
    assert sum(n for _, n in plan) == need + sum(b - a for a, b in merged)
    assert fetched == _union([(a, b - a) for a, b in needed + merged])
    # the first and last bytes fetched are needed ones
    if plan:
        assert plan[0][0] == needed[0][0] and plan[-1][0] + plan[-1][1] == needed[-1][1]


def test_plan_merges_near_chunks_and_splits_long_runs():
    mb = 1 << 20
    # two column chunks 64 KiB apart in 4 MiB: one GET
    assert plan_ranges([(0, 2 * mb), (2 * mb + 65536, 2 * mb)]) == [(0, 4 * mb + 65536)]
    # a gap costing more than the waste budget stays a gap
    assert plan_ranges([(0, 100_000), (900_000, 100_000)]) == [(0, 100_000), (900_000, 100_000)]
    # a gap over the hole stays a gap, however large the reads
    assert len(plan_ranges([(0, 30 * mb), (32 * mb, 30 * mb)], split=64 * mb)) == 2
    # a 40 MiB run in near-equal pieces of at most 16 MiB
    pieces = plan_ranges([(10, 40 * mb)])
    assert len(pieces) == 3 and all(n <= 16 * mb for _, n in pieces)
    assert pieces[0][0] == 10 and sum(n for _, n in pieces) == 40 * mb
    assert plan_ranges([]) == [] and plan_ranges([(5, 0)]) == []


def test_a_read_across_split_pieces_is_served_from_memory(tmp_path, monkeypatch):
    """A column chunk longer than the split size is fetched in pieces; reading it whole must not
    send another request."""
    data = bytes(range(256)) * 4096  # 1 MiB
    (tmp_path / "obj").write_bytes(data)
    monkeypatch.setattr(ranges_module, "SPLIT_SIZE", 100_000)
    r = Remote(str(tmp_path))
    f = r.open("obj", len(data))
    with f.prefetched([(1000, 500_000)]):
        sent = r.stats.requests
        assert sent == 5  # 500,000 bytes in pieces of at most 100,000
        assert f.read_at(500_000, 1000) == data[1000:501_000]
        assert f.read_at(150_000, 90_000) == data[90_000:240_000]
        assert r.stats.requests == sent
    assert f.read_at(10, 1000) == data[1000:1010]  # released: a GET again
    assert r.stats.requests == sent + 1


@pytest.mark.s3
def test_s3_ranged_reads_are_one_get_each_without_head(s3):
    s3.client.put_object(Bucket=s3.bucket, Key="warp/blobs/obj", Body=bytes(range(256)) * 400)
    r = Remote(s3.url("warp"))
    s3.reset_counts()
    assert r.read_range("blobs/obj", 10, 20) == bytes(range(10, 30))
    assert r.read_range("blobs/obj", 0, 102_400) == bytes(range(256)) * 400
    reqs = s3.requests(key_prefix="warp/blobs/")
    assert [(q["method"], q["range"]) for q in reqs] == [("GET", "bytes=10-29"), ("GET", "bytes=0-102399")]
    assert all("X-Amz-Algorithm=AWS4-HMAC-SHA256" in q["query"] for q in reqs)  # SigV4: every region takes it
    assert r.stats.to_dict()["by_kind"] == {"GET": 2}


@pytest.mark.s3
def test_s3_small_objects_are_one_get_each(s3):
    """``latest`` and manifests: one presigned GET, no HEAD; a missing key is None, not an error."""
    s3.client.put_object(Bucket=s3.bucket, Key="warp/refs/ws/ds/latest.json", Body=b'{"v": 1}')
    r = Remote(s3.url("warp"))
    s3.reset_counts()
    assert r.get("refs/ws/ds/latest.json") == b'{"v": 1}'
    assert r.get("refs/ws/ds/missing.json") is None
    reqs = s3.requests(key_prefix="warp/refs/")
    assert [q["method"] for q in reqs] == ["GET", "GET"]
    assert all("X-Amz-Algorithm=AWS4-HMAC-SHA256" in q["query"] for q in reqs)
    assert r.stats.to_dict()["by_kind"] == {"GET": 2}


@pytest.mark.s3
def test_s3_presigned_reads_fail_typed(s3):
    s3.client.put_object(Bucket=s3.bucket, Key="warp/blobs/obj", Body=b"x" * 1000)
    r = Remote(s3.url("warp"))
    with pytest.raises(BlobNotFoundError) as e:
        r.read_range("blobs/missing", 0, 10)
    assert "blobs/missing" in e.value.message
    with pytest.raises(DataError) as e:  # the object is shorter than asked
        r.read_range("blobs/obj", 900, 200)
    assert "asked for 200 bytes at 900, got 100" in e.value.message
    with pytest.raises(DataError) as e:
        r.read_range("blobs/obj", 5000, 10)
    assert "past the object's end" in e.value.message


@pytest.mark.s3
def test_a_proxy_keeps_pyarrows_client(s3, monkeypatch):
    from warpdata.storage.locations import StorageConfig

    cfg = StorageConfig.from_env()
    assert _PresignedRanges.for_config(cfg) is not None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert _PresignedRanges.for_config(cfg) is None
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert _PresignedRanges.for_config(cfg) is not None


@pytest.mark.s3
def test_s3_connections_are_kept_alive_across_threads(s3, monkeypatch):
    """A stream's threads come and go; their reads reuse the idle connections of earlier ones
    (on real S3 each new connection is a TLS handshake). moto closes every connection, so the
    reads go through a keep-alive proxy in front of it (tests/support/httpserve.py)."""
    import threading

    from support.httpserve import FaultProxy

    s3.client.put_object(Bucket=s3.bucket, Key="warp/blobs/obj", Body=b"y" * 1000)
    with FaultProxy(s3.endpoint, fail_every=0) as proxy:
        for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
            monkeypatch.setenv(var, proxy.url)
        r = Remote(s3.url("warp"))
        pre = r.transport._presigned()
        got = []
        for _ in range(4):
            t = threading.Thread(target=lambda: got.append(r.read_range("blobs/obj", 0, 10)))
            t.start()
            t.join()
        assert got == [b"y" * 10] * 4 and proxy.requests == 4
        assert sum(len(v) for v in pre._idle.values()) == 1  # one connection served all four threads


@pytest.mark.s3
def test_a_fork_while_a_reader_is_locked_does_not_hang_the_child(s3):
    """A DataLoader worker forked while another thread held the presigned reader's lock: the child
    gets a fresh lock and no connections of the parent's, and reads."""
    import os
    import signal
    import time

    s3.client.put_object(Bucket=s3.bucket, Key="warp/blobs/obj", Body=b"0123456789" * 10)
    r = Remote(s3.url("warp"))
    assert r.read_range("blobs/obj", 0, 4) == b"0123"
    pre = r.transport._presigned()
    with pre._mu:  # held, as by another thread, at the moment of the fork
        pid = os.fork()
        if pid == 0:  # the child: read, then leave without running the parent's atexit hooks
            try:
                ok = r.read_range("blobs/obj", 10, 4) == b"0123"
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the reader's lock")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
