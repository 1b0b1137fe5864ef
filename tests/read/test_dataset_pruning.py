"""Filters pruned by the manifest's shard statistics, counted on a real S3 protocol server (moto).

A shard whose statistics rule a filter out must cost zero requests (no HEAD,
no GET); an opened shard's footer must be one ranged GET of exactly the
recorded footer length; results must equal an unpruned scan (a format-1
manifest of the same data).
"""

from __future__ import annotations

import json

import pytest
import warpdata
from support.datasets import make_rows, publish, range_bytes
from warpdata.core.errors import MissingInputError, UsageError

pytestmark = pytest.mark.s3

ROWS = [(0, 400), (400, 400), (800, 400), (1200, 400)]  # (first id, rows) per shard, row groups of 100


@pytest.fixture
def stores(s3, tmp_path, monkeypatch):
    """The same 4 shards published twice: ws/stats (format 2) and ws/plain (format 1, no stats)."""
    parts = [make_rows(n, start, payload=200) for start, n in ROWS]
    with_stats = publish(s3.url(), "ws/stats", {"main": parts}, tmp_path / "a", row_group_size=100)
    plain = publish(s3.url(), "ws/plain", {"main": parts}, tmp_path / "b", row_group_size=100, stats=False)
    monkeypatch.setenv("WARP_STORE", s3.url())
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    return with_stats, plain


def _keys(m, positions):
    return {f"warp/{m.tables['main'].shards[i].uri}" for i in positions}


def _blob_requests(s3):
    return [r for r in s3.requests() if r["key"].startswith("warp/blobs/")]


def test_manifest_carries_stats(stores):
    m, plain = stores
    doc = json.loads(warpdata.dataset("ws/stats", mode="remote").manifest.to_bytes())
    assert doc["format_version"] == 2
    s0 = doc["tables"]["main"]["shards"][0]["stats"]
    assert s0["columns"]["id"] == {"min": 0, "max": 399, "null_count": 0}
    assert [rg["columns"]["id"]["min"] for rg in s0["row_groups"]] == [0, 100, 200, 300]
    assert "min" not in s0["columns"]["x"]  # floats: no min/max (NaN semantics)
    assert json.loads(warpdata.dataset("ws/plain", mode="remote").manifest.to_bytes())["format_version"] == 1


def test_pruned_shards_cost_zero_requests(s3, stores):
    m, _ = stores
    t = warpdata.dataset("ws/stats", mode="remote").table("main")
    s3.reset_counts()
    got = t.filter("id BETWEEN 450 AND 460").select(["id", "label"]).to_arrow()
    assert got.column("id").to_pylist() == list(range(450, 461))
    reqs = _blob_requests(s3)
    touched = {r["key"] for r in reqs}
    assert touched == _keys(m, [1])  # shards 0, 2, 3: not a single request
    assert not touched & _keys(m, [0, 2, 3])
    shard = m.tables["main"].shards[1]
    gets = [r for r in reqs if r["method"] == "GET"]
    footer = shard.stats["footer_size"]
    # the footer: one GET of exactly the recorded length at the end of the shard
    assert gets[0]["range"] == f"bytes={shard.byte_size - footer}-{shard.byte_size - 1}"
    # then only row group 0 of shard 1 (ids 400-499), only the id and label columns
    assert len(gets) == 2 and range_bytes(gets[1:]) < 0.1 * shard.byte_size
    assert sum(r["method"] == "HEAD" for r in reqs) <= 1


def test_fully_pruned_filter_sends_nothing(s3, stores):
    t = warpdata.dataset("ws/stats", mode="remote").table("main")
    s3.reset_counts()
    q = t.filter("id > 100000 OR label = 'nope'")
    assert q.count() == 0 and list(q.batches()) == []
    assert _blob_requests(s3) == []


@pytest.mark.parametrize("expr", [
    "id BETWEEN 123 AND 1333", "id % 97 = 3", "label = 'label-3' AND id >= 1100", "id IN (5, 777, 1599, 4000)",
    "NOT (id < 1550)", "x > 700.0", "id IS NULL", "label > 'label-5' OR id < 3", "1 = 1",
])
def test_pruned_results_equal_unpruned(s3, stores, expr):
    ds_stats = warpdata.dataset("ws/stats", mode="remote").table("main")
    ds_plain = warpdata.dataset("ws/plain", mode="remote").table("main")
    a = ds_stats.filter(expr).select(["id", "label"]).to_arrow()
    b = ds_plain.filter(expr).select(["id", "label"]).to_arrow()
    assert sorted(a.column("id").to_pylist()) == sorted(b.column("id").to_pylist())
    assert a.schema.names == b.schema.names == ["id", "label"]
    assert ds_stats.filter(expr).count() == ds_plain.filter(expr).count() == b.num_rows
    full = ds_stats.filter(expr).to_arrow()
    assert full.schema.names == ["id", "x", "label", "payload"] and full.num_rows == b.num_rows


def test_filter_errors_and_sharding(s3, stores):
    t = warpdata.dataset("ws/stats", mode="remote").table("main")
    with pytest.raises(UsageError, match="filter"):
        t.filter("no_such_column > 3").to_arrow()
    with pytest.raises(UsageError, match="filter"):
        t.filter("id >").to_arrow()
    # ranks still split whole shards round-robin, pruning inside each rank's part
    per_rank = [list(t.filter("id >= 300").batches(rank=r, world_size=2)) for r in range(2)]
    ids = sorted(i for batches in per_rank for b in batches for i in b.column("id").to_pylist())
    assert ids == list(range(300, 1600))
    assert all(per_rank)  # both ranks got rows
    with pytest.warns(DeprecationWarning, match="rank= and world_size="):  # the old name, for one release
        old = list(t.filter("id >= 300").batches(shard=(1, 2)))
    assert [b.column("id").to_pylist() for b in old] == [b.column("id").to_pylist() for b in per_rank[1]]
    with pytest.raises(UsageError, match="together"):
        list(t.filter("id >= 300").batches(rank=1))
    # the old shard="auto" still means this process's rank and world (RANK / WORLD_SIZE here)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RANK", "1")
        mp.setenv("WORLD_SIZE", "2")
        with pytest.warns(DeprecationWarning):
            auto = list(t.filter("id >= 300").batches(shard="auto"))
    assert [b.column("id").to_pylist() for b in auto] == [b.column("id").to_pylist() for b in per_rank[1]]


def test_local_mode_needs_only_the_shards_that_may_match(s3, stores, tmp_path):
    m, _ = stores
    ds = warpdata.dataset("ws/stats")
    ds.warm(shards=slice(2, 3), artifacts=False)  # only shard 2 (ids 800-1199) in the cache
    local = warpdata.dataset("ws/stats", mode="local").table("main")
    assert local.filter("id BETWEEN 900 AND 905").count() == 6  # shards 0, 1, 3 pruned: not needed
    with pytest.raises(MissingInputError, match="not in the cache"):
        local.filter("id BETWEEN 100 AND 105").count()


def test_streaming_reads_footer_exactly(s3, stores):
    m, _ = stores
    t = warpdata.dataset("ws/stats", mode="remote").table("main")
    s3.reset_counts()
    assert t.schema().names == ["id", "x", "label", "payload"]
    gets = [r for r in _blob_requests(s3) if r["method"] == "GET"]
    shard = m.tables["main"].shards[0]
    assert len(gets) == 1 and range_bytes(gets) == shard.stats["footer_size"]
    rows = sum(b.num_rows for b in t.batches(256))
    assert rows == 1600
