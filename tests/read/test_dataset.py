"""The read API against a real S3 protocol server (moto on 127.0.0.1) with request counting."""

from __future__ import annotations

import socket
from collections import Counter

import pyarrow as pa
import pytest
import warpdata
from support.datasets import make_rows, publish, range_bytes, write_media
from warpdata.core.errors import MissingInputError, UsageError
from warpdata.storage.blobcache import BlobCache, CacheTooSmallError

pytestmark = pytest.mark.s3


@pytest.fixture
def published(s3, tmp_path, monkeypatch):
    """ws/demo on S3: 3 shards (1200+900+600 rows, row groups of 300) and a media artifact."""
    write_media(tmp_path / "media", 12)
    parts = [make_rows(1200, 0, image_every=12, payload=400), make_rows(900, 1200, image_every=12, payload=400),
             make_rows(600, 2100, image_every=12, payload=400)]
    m = publish(s3.url(), "ws/demo", {"main": parts}, tmp_path, row_group_size=300, media=tmp_path / "media")
    monkeypatch.setenv("WARP_STORE", s3.url())
    s3.reset_counts()
    return m


def blob_gets(s3):
    return [r for r in s3.requests("GET", "warp/blobs/")]


def shard_size(m, i=0):
    return m.tables["main"].shards[i].byte_size


def test_remote_schema_no_pull(s3, published):
    ds = warpdata.dataset("ws/demo", mode="remote")
    assert ds.version == published.version_hash
    s3.reset_counts()
    sch = ds.table("main").schema()
    assert sch.names == ["id", "x", "label", "payload", "image", "audio"]
    gets = blob_gets(s3)
    assert gets and all(r["range"] for r in gets)  # ranged reads only
    assert s3.count("HEAD") <= 1  # one shard opened: at most one HEAD, no listing
    assert s3.count("GET", "") == len(gets) or all(r["key"] for r in s3.requests())
    assert range_bytes(gets) < 0.5 * shard_size(published)  # the footer, not the data
    assert not (BlobCache().root / "blobs").exists()  # remote mode keeps nothing


def test_head_reads_only_needed_row_groups(s3, published):
    t = warpdata.dataset("ws/demo", mode="remote").table("main")
    s3.reset_counts()
    h = t.head(5)
    assert h.column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert range_bytes(blob_gets(s3)) < 0.6 * shard_size(published)


def test_remote_stream_all_rows_once_over_ranks(s3, published):
    t = warpdata.dataset("ws/demo", mode="remote").table("main")
    seen: Counter = Counter()
    counts = []
    for rank in range(3):
        stream = t.batches(256, columns=["id"], rank=rank, world_size=3)
        n = 0
        for b in stream:
            assert isinstance(b, pa.RecordBatch) and b.num_rows <= 256
            seen.update(b.column(0).to_pylist())
            n += 1
        counts.append(n)
    assert len(set(counts)) == 1
    assert sorted(seen) == list(range(2700)) and set(seen.values()) == {1}
    assert all(r["range"] for r in blob_gets(s3))  # streamed by ranges, never pulled


def test_filter_pushdown_fetches_little(s3, published):
    t = warpdata.dataset("ws/demo", mode="remote").table("main")
    s3.reset_counts()
    got = t.filter("id BETWEEN 100 AND 120").select(["id", "label"]).to_arrow()
    assert got.column("id").to_pylist() == list(range(100, 121))
    assert got.schema.names == ["id", "label"]
    total = sum(s.byte_size for s in published.tables["main"].shards)
    assert range_bytes(blob_gets(s3)) <= 0.35 * total
    with pytest.raises(UsageError, match="filter"):
        t.filter("no_such_column > 3").to_arrow()


def test_ref_open_remote_reads_exact_member(s3, published, tmp_path):
    ds = warpdata.dataset("ws/demo", mode="remote")
    d = next(iter(ds.table("main").batch_dicts(4)))
    d["image"][0].read_bytes()  # loads the member index (one small GET)
    s3.reset_counts()
    ref = d["image"][3]
    data = ref.open().read()
    assert data == (tmp_path / "media" / "img" / "0003.png").read_bytes()
    gets = blob_gets(s3)
    assert len(gets) == 1 and range_bytes(gets) == len(data)  # one ranged GET of exactly the member
    assert s3.count() <= 2  # plus at most the HEAD that opens the shard
    assert ref.as_numpy().shape == (11, 10, 3) and ref.as_pil().size == (10, 11)
    a = d["audio"][1]
    assert a.sample_rate == 9000 and a.as_array().shape == (400,)
    with pytest.raises(UsageError):
        ref.local_path()  # remote mode keeps nothing locally


def test_cache_no_redownload(s3, published):
    ds = warpdata.dataset("ws/demo")
    res = ds.warm()
    assert res.fetched == res.blobs and res.fetched_bytes > 0
    s3.reset_counts()
    ds2 = warpdata.dataset("ws/demo")
    assert s3.count("GET") == 1  # latest.json only: the manifest is cached by hash
    rows = sum(b.num_rows for b in ds2.table("main").batches(500))
    refs = next(iter(ds2.table("main").batch_dicts(12)))
    assert [r.read_bytes()[:4] for r in refs["image"]] == [b"\x89PNG"] * 12
    assert refs["image"][0].local_path().read_bytes()[:4] == b"\x89PNG"
    assert rows == 2700 and blob_gets(s3) == []  # second read: zero data GETs
    assert ds2.warm().fetched == 0


def test_auto_mode_prefetch_warms_cache(s3, published):
    t = warpdata.dataset("ws/demo").table("main")
    shards = published.tables["main"].shards
    s3.reset_counts()
    ids = [i for b in t.batches(100, columns=["id"], prefetch=2) for i in b.column(0).to_pylist()]
    assert ids == list(range(2700))
    cache = BlobCache()
    # one column of each shard was read by ranges: no shard is downloaded whole beside it
    # (bytes in proportion to the columns read, docs/partitioning.md)
    assert not any(cache.has(s.hash) for s in shards)
    assert sum(_range_bytes(r) for r in blob_gets(s3)) < sum(s.byte_size for s in shards) // 2
    # every column: each shard is downloaded once, whole, and kept
    s3.reset_counts()
    assert sum(b.num_rows for b in t.batches(100, prefetch=2)) == 2700
    assert all(cache.has(s.hash) for s in shards)
    assert sum(_range_bytes(r) for r in blob_gets(s3)) <= sum(s.byte_size for s in shards)


def _range_bytes(r: dict) -> int:
    a, b = r["range"].split("=")[1].split("-")
    return int(b) - int(a) + 1


def test_eviction_under_cap_and_too_small(s3, published, monkeypatch):
    shards = published.tables["main"].shards
    cap = shards[0].byte_size + shards[1].byte_size + 10
    cache = BlobCache(cap_bytes=cap)
    ds = warpdata.dataset("ws/demo", cache=cache)
    ds.warm(artifacts=False)
    assert cache.stats().bytes <= cap
    assert cache.has(shards[2].hash) and not cache.has(shards[0].hash)  # LRU went first
    tiny = BlobCache(cache.root.parent / "tiny", cap_bytes=100)
    with pytest.raises(CacheTooSmallError) as ei:
        warpdata.dataset("ws/demo", cache=tiny).warm(artifacts=False)
    assert "100 B" in str(ei.value) and "working set" in str(ei.value)


def test_corrupt_cached_blob_is_refetched(s3, published):
    ds = warpdata.dataset("ws/demo")
    ds.warm(artifacts=False)
    s0 = published.tables["main"].shards[0]
    p = BlobCache().path_for(s0.hash)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    s3.reset_counts()
    t = warpdata.dataset("ws/demo").table("main")
    ids = [i for b in t.batches(1000, columns=["id"], prefetch="off") for i in b.column(0).to_pylist()]
    assert ids == list(range(2700))
    assert any(s0.hash in r["key"] for r in blob_gets(s3))  # read again from the store
    assert t.ds.fetch_blob(s0) and BlobCache().get(s0.hash) is not None


def _dead_endpoint() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_offline_fallback_and_local_mode(s3, published, monkeypatch, caplog):
    warpdata.dataset("ws/demo").warm()
    dead = _dead_endpoint()
    for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, dead)
    with caplog.at_level("WARNING", logger="warpdata"):
        ds = warpdata.dataset("ws/demo")  # store unreachable: last known latest, with a warning
    assert ds.offline_fallback and ds.version == published.version_hash
    assert "store unreachable" in caplog.text  # logged (the CLI renders it as 'warning: ...')
    assert sum(b.num_rows for b in ds.table("main").batches(1000)) == 2700
    local = warpdata.dataset("ws/demo", mode="local")
    d = next(iter(local.table("main").batch_dicts(2)))
    assert d["image"][1].read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(MissingInputError, match="never been read"):
        warpdata.dataset("ws/other", mode="local")


def test_local_mode_missing_blob_fails_fast(s3, published):
    warpdata.dataset("ws/demo").table("main").head(1)  # caches pointer + manifest only
    t = warpdata.dataset("ws/demo", mode="local").table("main")
    with pytest.raises(MissingInputError, match="not in the cache") as ei:
        list(t.batches(100))
    assert "warp warm ws/demo" in ei.value.hint


def test_latest_moves_and_pinned_version(s3, published, tmp_path):
    first = warpdata.dataset("ws/demo").version
    m2 = publish(s3.url(), "ws/demo", {"main": [make_rows(10)]}, tmp_path / "v2")
    assert warpdata.dataset("ws/demo").version == m2.version_hash  # pointer revalidated
    assert warpdata.dataset("ws/demo", version=first).table("main").num_rows == 2700
    assert warpdata.dataset("ws/demo", version=first[:10]).version == first


def test_resume_mid_epoch_with_other_worker_count(s3, published):
    t = warpdata.dataset("ws/demo").table("main")
    stream = t.batches(200, columns=["id"], rank=0, world_size=2, shuffle=True, seed=5)
    got = []
    for i, b in enumerate(stream):
        got += b.column(0).to_pylist()
        if i == 2:
            break
    state = stream.state_dict().to_json()
    for w in range(2):  # resume as two DataLoader workers
        got += [i for b in t.batches(columns=["id"], resume=state, worker=(w, 2)) for i in b.column(0).to_pylist()]
    full = [i for b in t.batches(200, columns=["id"], rank=0, world_size=2, shuffle=True, seed=5) for i in b.column(0).to_pylist()]
    assert sorted(got) == sorted(full) and len(got) == len(full)


def test_to_torch_with_workers(s3, published):
    pytest.importorskip("torch")
    t = warpdata.dataset("ws/demo").table("main")
    seen = []
    for rank in range(2):
        loader = t.to_torch(batch_size=128, columns=["id", "x", "label"], num_workers=2, rank=rank, world_size=2)
        n = 0
        for b in loader:
            seen += b["id"].tolist()
            assert b["x"].dtype.is_floating_point and isinstance(b["label"], list)
            n += 1
        assert n == len(loader)
    assert sorted(seen) == list(range(2700))
    # one batch on the rank and two workers asked for: one worker runs it (no worker is left idle,
    # none fails), as with the README's 500 rows in batches of 256 with drop_last=True
    loader = t.to_torch(batch_size=2000, num_workers=2, rank=0, world_size=2)
    assert len(loader) == 1 and loader.num_workers == 1
    assert [b["id"].tolist() for b in loader] == [list(range(1350))]
    dropped = t.to_torch(batch_size=1000, num_workers=2, rank=1, world_size=2, drop_last=True)
    assert len(dropped) == 1 and [len(b["id"]) for b in dropped] == [1000]


def test_errors_name_what_is_wrong(s3, published):
    ds = warpdata.dataset("ws/demo")
    with pytest.raises(MissingInputError, match="no table 'mian'") as ei:
        ds.table("mian")
    assert "main" in (ei.value.hint or "")
    with pytest.raises(UsageError, match="no column"):
        ds.table("main").select(["idd"])
    with pytest.raises(MissingInputError, match="no member"):
        ds.artifact("media").read("img/nope.png")
    with pytest.raises(FileNotFoundError):
        warpdata.dataset("ws/missing")
    with pytest.raises(UsageError):
        warpdata.dataset("ws/demo", mode="turbo")


def test_corrupt_cached_table_shard_is_fetched_again_once(s3, published):
    """Issue #4: a table read dropped a corrupt cached blob and read remotely from then on, never re-caching it."""
    ds = warpdata.dataset("ws/demo")
    ds.warm(artifacts=False)
    shard = published.tables["main"].shards[0]
    p = BlobCache().path_for(shard.hash)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.chmod(0o644)
    p.write_bytes(bytes(data))
    s3.reset_counts()
    ds2 = warpdata.dataset("ws/demo")
    rows = sum(b.num_rows for b in ds2.table("main").batches(500))
    assert rows == 2700
    assert p.is_file() and BlobCache().get(shard.hash) is not None  # cached again, verified
    whole = [r for r in blob_gets(s3) if not r["range"]]
    assert len(whole) <= 1 or len({r["key"] for r in whole}) == 1


def test_stream_reads_the_next_shard_ahead_while_the_current_batch_is_used(s3, published):
    import time

    t = warpdata.dataset("ws/demo", mode="remote").table("main")
    s1 = published.tables["main"].shards[1]
    footer = s1.stats["footer_size"]
    it = iter(t.batches(300))
    first = next(it)  # shard 0, row group 0: the consumer holds it and asks for nothing more
    assert first.num_rows == 300

    def shard1_data_gets():
        return [r for r in blob_gets(s3) if s1.hash in r["key"] and r["range"]
                and int(r["range"][6:].partition("-")[0]) < s1.byte_size - footer]

    deadline = time.monotonic() + 30
    while not shard1_data_gets() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert shard1_data_gets(), "shard 1's row groups were not read ahead"
    ids = first.column("id").to_pylist() + [i for b in it for i in b.column("id").to_pylist()]
    assert ids == list(range(2700))  # exact order and sizes kept


def test_a_batch_inside_one_row_group_is_a_zero_copy_slice(s3, published):
    t = warpdata.dataset("ws/demo", mode="remote").table("main")
    bs = list(t.batches(150, columns=["id", "x"]))
    assert [b.num_rows for b in bs] == [150] * 18
    # two batches of one row group share its buffers: no concatenate-and-copy
    a, b = bs[0].column("x"), bs[1].column("x")
    assert a.buffers()[1].address == b.buffers()[1].address and (a.offset, b.offset) == (0, 150)


def test_row_group_counts_in_the_manifest_that_lie_are_a_data_error(s3, published):
    """Hostile manifest: per-row-group row counts that sum right but do not match the shard."""
    import dataclasses

    from warpdata.core.errors import DataError
    from warpdata.registry.store import Store

    s0 = published.tables["main"].shards[0]
    rgs = [dict(r) for r in s0.stats["row_groups"]]
    rgs[0]["row_count"], rgs[1]["row_count"] = rgs[0]["row_count"] + 100, rgs[1]["row_count"] - 100
    bad = dataclasses.replace(s0, stats={**s0.stats, "row_groups": rgs})
    table = dataclasses.replace(published.tables["main"], shards=(bad, *published.tables["main"].shards[1:]))
    m = dataclasses.replace(published, tables={"main": table})
    store = Store(s3.url())
    store.put_manifest(m)
    store.set_latest("ws/demo", m.version_hash)
    t = warpdata.dataset("ws/demo", mode="remote").table("main")
    with pytest.raises(DataError, match="manifest says"):  # a limited read plans by row group
        list(t.batches(100, limit=1000))
    # a full stream reads the shard's row groups in one call: the rows come out exact regardless
    assert [i for b in t.batches(100) for i in b.column("id").to_pylist()] == list(range(2700))
