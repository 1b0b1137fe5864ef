"""What a remote stream fetches (moto on 127.0.0.1, every request counted by the server).

A shard the stream reads whole (every row group, every column) is one ranged GET of the whole
object, footer included, checked against its content hash and the manifest's footer length (and
put into the blob cache in auto mode, once); a projection fetches the
footer and then its column chunks, coalesced, within 5 % of the bytes it needs. No HEAD either
way: the manifest knows every size. Damaged store copies fail typed, naming the blob.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from support.datasets import make_rows, publish, range_bytes
from warpdata.core.errors import BlobCorruptedError, DataError, ManifestCorruptedError
from warpdata.read import batches as batches_module
from warpdata.read import dataset as dataset_module

pytestmark = pytest.mark.s3

SHARDS, ROWS, GROUP = 3, 3000, 1000


@pytest.fixture
def stream(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    parts = [make_rows(ROWS, k * ROWS) for k in range(SHARDS)]
    m = publish(s3.url("warp"), "ws/stream", {"main": parts}, tmp_path, row_group_size=GROUP)
    dataset_module._MANIFESTS.clear()
    shards = m.tables["main"].shards
    local = []
    for k in range(SHARDS):  # the same files, to count the bytes each read needs
        path = tmp_path / f"{k}.parquet"
        s3.client.download_file(s3.bucket, f"warp/{shards[k].uri}", str(path))
        local.append(path)
    s3.reset_counts()
    return {"manifest": m, "shards": shards, "files": local, "table": pa.concat_tables(parts)}


def _blob_requests(s3):
    return s3.requests(key_prefix="warp/blobs/")


def _needed(files, columns=None) -> int:
    """Bytes of the column chunks holding ``columns`` (None: all), and the footers."""
    from warpdata.registry.parquet_stats import footer_size_of

    total = 0
    for p in files:
        md = pq.read_metadata(p)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)
                         if columns is None or rg.column(c).path_in_schema in columns)
        total += footer_size_of(str(p))
    return total


def test_a_whole_shard_is_one_get_and_no_head(s3, stream):
    t = warpdata.dataset("ws/stream", mode="remote").table("main")
    got = list(t.batches(700))
    assert [b.num_rows for b in got] == [700] * (SHARDS * ROWS // 700) + [SHARDS * ROWS % 700]
    assert pa.Table.from_batches(got).equals(stream["table"])
    reqs = _blob_requests(s3)
    assert sorted((q["method"], q["key"], q["range"]) for q in reqs) == sorted(
        ("GET", f"warp/{s.uri}", f"bytes=0-{s.byte_size - 1}") for s in stream["shards"])
    assert range_bytes(reqs) <= 1.05 * _needed(stream["files"])


def test_a_projection_fetches_its_column_chunks_coalesced(s3, stream):
    t = warpdata.dataset("ws/stream", mode="remote").table("main")
    got = pa.Table.from_batches(list(t.batches(700, columns=["id", "x"])))
    assert got.equals(stream["table"].select(["id", "x"]))
    reqs = _blob_requests(s3)
    assert all(q["method"] == "GET" for q in reqs)
    need = _needed(stream["files"], {"id", "x"})
    assert need <= range_bytes(reqs) <= 1.05 * need
    # the footer, then one GET per row group (the gaps between them, the other columns, are
    # too large to fetch): not one per column chunk
    assert len(reqs) == SHARDS * (1 + ROWS // GROUP)
    whole = sum(s.byte_size for s in stream["shards"])
    assert range_bytes(reqs) < whole / 3  # the payload column is never fetched


def test_a_ranks_part_of_a_shard_reads_only_its_row_groups(s3, stream):
    """Rank 1 of 2 starts in the middle of shard 1: that shard is not read whole."""
    t = warpdata.dataset("ws/stream", mode="remote").table("main")
    got = pa.Table.from_batches(list(t.batches(500, rank=1, world_size=2)))
    half = SHARDS * ROWS // 2
    assert got.equals(stream["table"].slice(half))
    middle = stream["shards"][1]
    ranges = [q["range"] for q in _blob_requests(s3) if q["key"] == f"warp/{middle.uri}"]
    assert f"bytes=0-{middle.byte_size - 1}" not in ranges  # footer first, then its row groups
    assert not any(q["key"] == f"warp/{stream['shards'][0].uri}" for q in _blob_requests(s3))


def test_large_shards_stream_in_bounded_reads(s3, stream, monkeypatch):
    """Shards over the whole-shard size: footer, then reads of about CHUNK_BYTES, at most
    READAHEAD_BYTES ahead; the rows are the same."""
    size = stream["shards"][0].byte_size
    monkeypatch.setattr(batches_module, "WHOLE_SHARD_BYTES", size // 4)
    monkeypatch.setattr(batches_module, "CHUNK_BYTES", size // 3)
    monkeypatch.setattr(batches_module, "READAHEAD_BYTES", size // 2)
    t = warpdata.dataset("ws/stream", mode="remote").table("main")
    got = list(t.batches(900))
    assert pa.Table.from_batches(got).equals(stream["table"])
    reqs = _blob_requests(s3)
    assert all(q["method"] == "GET" for q in reqs)
    for s in stream["shards"]:
        mine = [q["range"] for q in reqs if q["key"] == f"warp/{s.uri}"]
        footer = s.stats["footer_size"]
        assert mine[0] == f"bytes={s.byte_size - footer}-{s.byte_size - 1}"
        assert len(mine) == 1 + ROWS // GROUP  # one read per row group: each is over CHUNK_BYTES / 2
    assert range_bytes(reqs) <= 1.05 * _needed(stream["files"])


def _damage(s3, shard, at: int, data: bytes) -> None:
    key = f"warp/{shard.uri}"
    body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[at:at + len(data)] = data
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))


def test_auto_mode_downloads_each_shard_once_into_the_cache(s3, stream):
    """The whole-shard GET also fills the blob cache (the prefetcher skips those shards), so the
    next epoch reads no blob at all."""
    t = warpdata.dataset("ws/stream", mode="auto").table("main")
    assert pa.Table.from_batches(list(t.batches(700))).equals(stream["table"])
    reqs = _blob_requests(s3)
    assert sorted(q["key"] for q in reqs) == sorted(f"warp/{s.uri}" for s in stream["shards"])
    assert range_bytes(reqs) == sum(s.byte_size for s in stream["shards"])
    s3.reset_counts()
    again = warpdata.dataset("ws/stream", mode="auto").table("main")
    assert pa.Table.from_batches(list(again.batches(700))).equals(stream["table"])
    assert _blob_requests(s3) == []


@pytest.mark.parametrize("mode", ["remote", "auto"])
def test_a_damaged_shard_is_fetched_twice_then_fails_typed(s3, stream, mode):
    """A whole-shard read is checked against the shard's content hash: same length, other bytes."""
    s = stream["shards"][1]
    _damage(s3, s, s.byte_size // 2, b"JUNK")  # inside a data page
    s3.reset_counts()
    t = warpdata.dataset("ws/stream", mode=mode).table("main")
    with pytest.raises(BlobCorruptedError) as e:
        list(t.batches(700))
    assert f"warp/{s.uri}" in e.value.message and "republish" in (e.value.hint or "")
    assert sum(q["key"] == f"warp/{s.uri}" for q in _blob_requests(s3)) == 2
    assert mode == "remote" or not dataset_module.dataset("ws/stream").cache.has(s.hash)


def test_a_footer_unlike_the_manifests_fails_typed(s3, stream):
    """A projection reads the footer by the manifest's length first: other bytes there fail typed."""
    s = stream["shards"][0]
    footer = s.stats["footer_size"]
    _damage(s3, s, s.byte_size - footer, b"\xff" * 16)  # the footer's first bytes
    t = warpdata.dataset("ws/stream", mode="remote").table("main")
    with pytest.raises(ManifestCorruptedError) as e:
        next(iter(t.batches(700, columns=["id"])))
    assert s.hash in e.value.message and "footer_size" in e.value.message


def test_a_shorter_store_copy_fails_typed(s3, stream):
    s = stream["shards"][2]
    key = f"warp/{s.uri}"
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body[:-100])
    t = warpdata.dataset("ws/stream", mode="remote").table("main")
    with pytest.raises(DataError) as e:
        list(t.batches(700))
    assert s.hash in e.value.message and "shorter" in (e.value.hint or "")


@pytest.fixture
def format1(s3, tmp_path, monkeypatch):
    """7 shards of 100 rows in row groups of 25, published without shard statistics (format 1):
    every shard's row counts come from its footer, fetched by the reader."""
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    parts = [make_rows(100, k * 100) for k in range(7)]
    publish(s3.url("warp"), "ws/fmt1", {"main": parts}, tmp_path, row_group_size=25, stats=False)
    dataset_module._MANIFESTS.clear()
    return pa.concat_tables(parts)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_get_their_own_rows_while_footers_arrive_late(s3, format1, monkeypatch, world):
    """The planner's threads learn a shard's row groups while the reader is on it: a rank whose
    part starts mid-shard must still get exactly its rows (a half-built bound list once gave
    rank 1 of 2 rows 325-699 instead of 350-699), with footers slow as S3's."""
    import time

    slow = batches_module._ShardFiles.row_groups

    def row_groups(self, unit):
        time.sleep(0.05)
        return slow(self, unit)

    monkeypatch.setattr(batches_module._ShardFiles, "row_groups", row_groups)
    t = warpdata.dataset("ws/fmt1", mode="remote").table("main")
    got = []
    for r in range(world):
        ids = [i for b in t.batches(64, rank=r, world_size=world) for i in b.column("id").to_pylist()]
        got.append(ids)
    assert sorted(i for ids in got for i in ids) == format1.column("id").to_pylist()  # each row once
    for ids in got:
        assert ids == list(range(ids[0], ids[0] + len(ids)))  # each rank a contiguous run, in order


def _planned_whole(ds) -> list[bool]:
    """Which shards the stream's planner would read whole (so the prefetcher skips them)."""
    t = ds.table("main")
    files = batches_module._ShardFiles(ds, t.shards)
    bounds = {}

    def bounds_of(u):
        b = [0]
        for n in files.row_groups(u):
            b.append(b[-1] + n)
        return bounds.setdefault(u, b)

    keys = ((u, g, 0, bounds_of(u)[g + 1] - bounds_of(u)[g]) for u in range(len(t.shards))
            for g in range(len(bounds_of(u)) - 1))
    planner = batches_module._RowGroupBatcher(files, keys, None, bounds_of, all_columns=True)
    try:
        return [planner.reads_whole(u) for u in range(len(t.shards))]
    finally:
        planner.close()


@pytest.mark.parametrize("mode", ["auto", "hybrid"])
def test_only_shards_read_whole_are_left_to_the_whole_shard_get(s3, format1, stream, mode):
    """The prefetcher skips the shards the planner reads whole by one GET (that GET fills the
    cache). Shards without a recorded footer length (format 1) cannot be read so: they must be
    planned as ranged reads and left to the prefetcher, or no epoch would ever cache them."""
    assert _planned_whole(warpdata.dataset("ws/fmt1", mode=mode)) == [False] * 7
    assert _planned_whole(warpdata.dataset("ws/stream", mode=mode)) == [True] * SHARDS
