"""Reads aligned with storage (docs/partitioning.md): a published table read by many ranks costs
about the bytes of the columns read, once, however small each rank's share of a row group.

Tables are written as users write them (pyarrow's defaults: one row group per file) and published
by warp's publisher, which gives them a page index; every request is counted by the S3 server.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from support.datasets import range_bytes
from warpdata.publishing.publish import PAGE_ROWS, PublishRequest
from warpdata.publishing.publish import publish as warp_publish
from warpdata.read import dataset as dataset_module

pytestmark = pytest.mark.s3

FILES, FILE_ROWS = 2, 60_000


def _rows(n: int, start: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "label": pa.array([f"c{i % 9}" for i in ids]),
                     "score": rng.random(n), "blob": pa.array([rng.bytes(40) for _ in range(n)], pa.binary())})


@pytest.fixture
def paged(s3, tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(FILES):
        pq.write_table(_rows(FILE_ROWS, k * FILE_ROWS), data / f"part-{k}.parquet")  # pyarrow's defaults
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = warp_publish(PublishRequest("ws/paged", tables={"main": [str(data / "*.parquet")]}))
    dataset_module._MANIFESTS.clear()
    s3.reset_counts()
    return r


def _column_bytes(ds, columns=None) -> int:
    """Bytes of the column chunks of ``columns`` (None: all) in the published shards."""
    total = 0
    for s in ds.table("main").shards:
        md = pq.read_metadata(pa.BufferReader(ds.remote.read_range(ds.blob_key(s), 0, s.byte_size)))
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)
                         if columns is None or rg.column(c).path_in_schema.split(".")[0] in columns)
    return total


def test_publish_gives_pyarrow_default_files_a_page_index(s3, paged):
    ds = warpdata.dataset("ws/paged", mode="remote")
    for s in ds.table("main").shards:
        md = pq.read_metadata(pa.BufferReader(ds.remote.read_range(ds.blob_key(s), 0, s.byte_size)))
        rg = md.row_group(0)
        assert all(rg.column(c).has_offset_index for c in range(rg.num_columns))
    assert ds.table("main").to_arrow().column("id").to_pylist() == list(range(FILES * FILE_ROWS))


@pytest.mark.parametrize("world, bound", [(1, 1.05), (4, 1.05), (8, 1.05), (16, 1.15)])
@pytest.mark.parametrize("columns", [None, ["id", "score"]])
def test_every_rank_together_downloads_the_columns_once(s3, paged, world, bound, columns):
    if columns and world == 8:  # 16 bytes a row: a rank's 15,000 rows are ~180 KB, its fixed cost ~10 KB
        bound = 1.08
    """Each rank's share (down to 1/8 of a row group) is fetched by its pages: all ranks together
    move at most 5 % more than the column chunks they read, footers and page indexes included,
    while a rank reads ≥ 15,000 rows. A rank's fixed cost is its footer, offset indexes and the
    page it shares with each neighbour (≤ PAGE_ROWS rows a column): 7,500 rows a rank pay ~10 %."""
    want = _column_bytes(warpdata.dataset("ws/paged", mode="remote"), columns)
    s3.reset_counts()
    seen = []
    for rank in range(world):
        t = warpdata.dataset("ws/paged", mode="remote").table("main")
        for b in t.batches(4096, columns=columns, rank=rank, world_size=world):
            seen.extend(b.column("id").to_pylist())
    assert sorted(seen) == list(range(FILES * FILE_ROWS))  # exact-once
    got = range_bytes(s3.requests("GET", "warp/blobs/"))
    assert got <= bound * want, (got, want, got / want)
    if world >= 4:  # before: every rank downloaded each whole row group it touched
        assert got < 0.6 * want * world / FILES


def test_head_fetches_pages_not_the_row_group(s3, paged):
    ds = warpdata.dataset("ws/paged", mode="remote")
    s3.reset_counts()
    assert ds.table("main").head(5).column("id").to_pylist() == list(range(5))
    got = range_bytes(s3.requests("GET", "warp/blobs/"))
    # footer, offset indexes, then one page of each column (and the dictionary's page)
    assert got < _column_bytes(ds) / FILES / 20
    assert PAGE_ROWS * 100 < FILE_ROWS * 10


def test_keep_layout_publishes_byte_for_byte(s3, tmp_path, monkeypatch):
    import hashlib

    f = tmp_path / "t.parquet"
    pq.write_table(_rows(1000, 0), f)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = warp_publish(PublishRequest("ws/asis", tables={"main": [str(f)]}, layout="as-is",
                                    store_url=s3.url("warp")))
    assert r.blobs[0].hash.removeprefix("sha256:") == hashlib.sha256(f.read_bytes()).hexdigest()
    again = warp_publish(PublishRequest("ws/paged2", tables={"main": [str(f)]}, store_url=s3.url("warp")))
    twice = warp_publish(PublishRequest("ws/paged2", tables={"main": [str(f)]}, store_url=s3.url("warp"),
                                        rehash=True))
    assert again.version_hash == twice.version_hash  # the rewrite is deterministic
    assert again.blobs[0].hash != r.blobs[0].hash


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_cache_carries_epochs(s3, paged, shuffle):
    """Ranks sharing a cache directory (one machine, auto mode): epoch 1 fetches each page once,
    epoch 2 fetches at most 5 % of the columns again, whatever rows each rank reads then."""
    world = 4
    want = _column_bytes(warpdata.dataset("ws/paged", mode="remote"))
    s3.reset_counts()
    moved = []
    for epoch in range(2):
        seen = []
        for rank in range(world):
            t = warpdata.dataset("ws/paged").table("main")
            for b in t.batches(4096, rank=rank, world_size=world, shuffle=shuffle, seed=3, epoch=epoch):
                seen.extend(b.column("id").to_pylist())
        assert sorted(seen) == list(range(FILES * FILE_ROWS))
        moved.append(range_bytes(s3.requests("GET", "warp/blobs/")))
        s3.reset_counts()
    assert moved[0] <= 1.05 * want, (moved, want)
    assert moved[1] <= 0.05 * want, (moved, want)


def test_a_second_reader_of_the_same_rows_fetches_nothing(s3, paged):
    """Two DataLoader-like readers of the same rank on one machine: the second finds every page."""
    t = warpdata.dataset("ws/paged").table("main")
    first = [b.column("id").to_pylist() for b in t.batches(4096, columns=["id"], rank=1, world_size=8)]
    s3.reset_counts()
    again = [b.column("id").to_pylist() for b in t.batches(4096, columns=["id"], rank=1, world_size=8)]
    assert again == first
    assert range_bytes(s3.requests("GET", "warp/blobs/")) == 0


def test_a_pinned_version_opens_with_one_request(s3, paged, monkeypatch, cli):
    """WARP_PIN (set once by a launcher): no rank reads `latest`; opening is the manifest alone."""
    monkeypatch.setenv("WARP_PIN", f"ws/other@{'0' * 64}, ws/paged@{paged.version_hash}")  # a prefix costs a listing
    s3.reset_counts()
    ds = warpdata.dataset("ws/paged", mode="remote")
    assert ds.version == paged.version_hash
    assert [(r["method"], r["key"].rsplit("/", 1)[-1]) for r in s3.requests()] == [
        ("GET", f"{paged.version_hash}.json")]
    monkeypatch.setenv("WARP_PIN", "ws/paged")
    r = cli("info", "ws/paged")
    assert r.code == 78 and "WARP_PIN" in r.err and "WS/NAME@VERSION" in r.err, r.err


@pytest.mark.parametrize("world, workers", [(4, 0), (8, 2)])
def test_the_plan_prices_what_the_ranks_then_fetch(s3, paged, cli, world, workers):
    """`warp inspect WS/NAME --plan --world N --workers K`: the bytes it prints are those the ranks
    then download (the same split, the same reads), counted by the server."""
    r = cli("inspect", "ws/paged", "--plan", "--world", str(world), "--workers", str(workers),
            "--batch-size", "2048", "--json")
    assert r.code == 0, r.err
    plan = r.json()
    assert len(plan["readers"]) == world * max(1, workers)
    assert sum(x["rows"] for x in plan["readers"]) == FILES * FILE_ROWS
    s3.reset_counts()
    for rank in range(world):
        t = warpdata.dataset("ws/paged", mode="remote").table("main")
        for w in range(max(1, workers)):
            for _ in t.batches(2048, rank=rank, world_size=world, worker=(w, max(1, workers))):
                pass
    got = range_bytes(s3.requests("GET", "warp/blobs/"))
    assert got == plan["bytes"], (got, plan["bytes"])
    text = cli("inspect", "ws/paged", "--plan", "--world", str(world))
    assert text.code == 0 and "per rank" in text.out and "total:" in text.out


def test_a_stream_of_whole_and_partial_row_groups_has_one_schema(s3, tmp_path, monkeypatch):
    """A file that has a page index is published as it is; a rank whose run covers whole row groups
    and parts of others gets batches with one schema (metadata included) and every row once."""
    f = tmp_path / "paged.parquet"
    t = _rows(10_000, 0).replace_schema_metadata({"origin": "test"})
    pq.write_table(t, f, row_group_size=1000, write_page_index=True, max_rows_per_page=100)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = warp_publish(PublishRequest("ws/mixed", tables={"main": [str(f)]}, store_url=s3.url("warp")))
    assert r.blobs[0].hash.removeprefix("sha256:") == __import__("hashlib").sha256(f.read_bytes()).hexdigest()
    seen = []
    for rank in range(3):
        tab = warpdata.dataset("ws/mixed", store=s3.url("warp"), mode="remote").table("main")
        batches = list(tab.batches(700, rank=rank, world_size=3))
        assert {b.schema.metadata.get(b"origin") for b in batches} == {b"test"}
        assert pa.Table.from_batches(batches).schema.equals(t.schema, check_metadata=False)
        seen += [i for b in batches for i in b.column("id").to_pylist()]
    assert sorted(seen) == list(range(10_000))


def test_a_damaged_parquet_input_is_a_data_error_naming_it(cli, tmp_path, monkeypatch):
    """The page rewrite reads every row group: a file whose column chunk does not decode is refused
    (exit 65, naming it), nothing published."""
    f = tmp_path / "bad.parquet"
    pq.write_table(_rows(2000, 0), f)
    data = bytearray(f.read_bytes())
    data[4:40] = b"\xff" * 36  # the first page's header
    f.write_bytes(bytes(data))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("publish", "ws/bad", "--table", f"main={f}", "--store", str(tmp_path / "store"))
    assert r.code == 65, r.err
    assert f"{f}: not a readable Parquet file" in r.err and "--keep-layout" in r.err
    assert not (tmp_path / "store" / "datasets").exists()


@pytest.mark.parametrize("pinned", [True, False])
def test_the_first_batch_needs_the_manifest_and_then_only_pages(s3, paged, pinned):
    """≤ 2 requests before a rank's first data request (the pointer, then the manifest, which
    carries each shard's footer and page locations: docs/formats/registry.md, "Page index in the
    manifest"), 1 when the version is pinned; no footer or offset index is read from a shard."""
    from warpdata.formats import parquet_index
    from warpdata.formats.parquet_pages import footer_of, offset_index

    version = paged.version_hash if pinned else None
    t = warpdata.dataset("ws/paged", version=version, mode="remote").table("main")
    next(iter(t.batches(2048, rank=3, world_size=8)))
    log = [r for r in s3.requests() if r["method"] in ("GET", "HEAD")]
    first_blob = next(k for k, r in enumerate(log) if r["key"].startswith("warp/blobs/"))
    assert len(log[:first_blob]) == (1 if pinned else 2), [r["key"] for r in log[:first_blob]]
    assert all(r["method"] == "GET" for r in log[:first_blob])
    metadata = set()  # footer and offset-index byte ranges of every shard
    for s in t.shards:
        fmd = footer_of(parquet_index.decode(s.stats["page_index"]).footer)
        metadata.add((s.hash.removeprefix("sha256:"), s.byte_size - s.stats["footer_size"], s.byte_size))
        for g in range(len(s.stats["row_groups"])):
            for leaf in range(4):
                off, n = offset_index(fmd, g, leaf)
                metadata.add((s.hash.removeprefix("sha256:"), off, off + n))
    blob_gets = [r for r in log[first_blob:] if r["key"].startswith("warp/blobs/")]
    assert blob_gets and all(r["range"] for r in blob_gets)
    for r in blob_gets:
        a, _, b = r["range"][6:].partition("-")
        for h, lo, hi in metadata:
            assert not (r["key"].endswith(h) and int(a) < hi and int(b) + 1 > lo), (r, lo, hi)
