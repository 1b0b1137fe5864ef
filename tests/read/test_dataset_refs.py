"""Ref reads against moto S3 (request counting): background shard fetch, no HEAD per read, coalescing."""

from __future__ import annotations

import pytest
import warpdata
from support.datasets import make_rows, publish, range_bytes, write_media
from warpdata.storage.blobcache import BlobCache

pytestmark = pytest.mark.s3


@pytest.fixture
def published(s3, tmp_path, monkeypatch):
    """ws/refs on S3: 40 images and 3 sounds packed in tar shards of ~4 KB."""
    write_media(tmp_path / "media", 40)
    m = publish(s3.url(), "ws/refs", {"main": [make_rows(80, 0, image_every=40)]}, tmp_path,
                media=tmp_path / "media", tar_target=4096)
    monkeypatch.setenv("WARP_STORE", s3.url())
    return m


def _members(n=40):
    return [f"img/{i:04d}.png" for i in range(n)]


def _shard_of(art, member):
    return art.locate(member)[0]


def test_auto_mode_fetches_a_touched_shard_in_the_background_then_reads_it_locally(s3, published, tmp_path):
    ds = warpdata.dataset("ws/refs")
    art = ds.artifact("media")
    art.index  # noqa: B018  (the member index: one small GET, cached)
    shards = {_shard_of(art, m) for m in _members()}
    assert len(shards) > 1
    first = _members()[0]
    s3.reset_counts()
    assert art.read(first) == (tmp_path / "media" / first).read_bytes()
    assert art.wait_fetches(30)
    touched = _shard_of(art, first)
    cache = BlobCache()
    assert cache.has(touched)  # the whole shard came in, hash-checked by the cache
    assert not any(cache.has(h) for h in shards - {touched})  # untouched shards are not fetched
    whole = [r for r in s3.requests("GET", "warp/blobs/") if touched in r["key"] and not r["range"]
             or r["range"] == f"bytes=0-{art._sizes[touched] - 1}"]
    assert whole, "the shard was not downloaded whole"
    s3.reset_counts()
    same = [m for m in _members() if _shard_of(art, m) == touched]
    for m in same:  # the rest of that shard: local preads, no request at all
        assert art.read(m) == (tmp_path / "media" / m).read_bytes()
    assert s3.count() == 0 and art.stats["local_reads"] >= len(same)
    # a new Dataset finds it in the cache: still no request for its members
    art2 = warpdata.dataset("ws/refs").artifact("media")
    s3.reset_counts()
    assert [art2.read(m) for m in same] == [(tmp_path / "media" / m).read_bytes() for m in same]
    assert s3.count("GET", "warp/blobs/") == 0 and s3.count("HEAD") == 0


def test_remote_mode_sends_no_head_per_read_and_keeps_nothing(s3, published, tmp_path):
    ds = warpdata.dataset("ws/refs", mode="remote")
    art = ds.artifact("media")
    art.index  # noqa: B018
    shards = {_shard_of(art, m) for m in _members()}
    s3.reset_counts()
    for m in _members():
        assert art.read(m) == (tmp_path / "media" / m).read_bytes()
    gets = s3.requests("GET", "warp/blobs/")
    assert len(gets) == 40 and all(r["range"] for r in gets)  # one ranged GET per ref, never the whole shard
    assert s3.count("HEAD") <= len(shards)  # at most one per shard (opening it), not one per read
    assert range_bytes(gets) == sum(art.locate(m)[2] for m in _members())
    assert not (BlobCache().root / "blobs").exists() or not any((BlobCache().root / "blobs").rglob("*"))


def test_remote_read_many_coalesces_adjacent_members(s3, published, tmp_path):
    art = warpdata.dataset("ws/refs", mode="remote").artifact("media")
    art.index  # noqa: B018
    ms = _members()
    shards = {_shard_of(art, m) for m in ms}
    s3.reset_counts()
    got = art.read_many(list(reversed(ms)))
    assert got == [(tmp_path / "media" / m).read_bytes() for m in reversed(ms)]
    gets = s3.requests("GET", "warp/blobs/")
    assert len(gets) == len(shards) < len(ms)  # adjacent members of a shard: one GET
    # the run spans only the members and the tar headers between them
    assert range_bytes(gets) < sum(art.locate(m)[2] for m in ms) + 1024 * len(ms)


def test_background_fetch_respects_the_cache_cap(s3, published, tmp_path):
    art0 = warpdata.dataset("ws/refs", mode="remote").artifact("media")
    smallest = min(s.byte_size for s in art0.meta.shards)
    cache = BlobCache(tmp_path / "small", cap_bytes=art0.meta.index.byte_size + smallest // 2)  # the index, no shard
    ds = warpdata.dataset("ws/refs", cache=cache)
    art = ds.artifact("media")
    assert art.read_many(_members()) == [(tmp_path / "media" / m).read_bytes() for m in _members()]
    art.wait_fetches(30)
    assert cache.stats().bytes <= cache.cap_bytes
    assert art.stats["shards_fetched"] == 0 and art.stats["remote_reads"] > 0


def test_batch_dicts_can_read_refs_in_parallel(s3, published, tmp_path):
    t = warpdata.dataset("ws/refs", mode="remote").table("main")
    s3.reset_counts()
    d = next(iter(t.batch_dicts(40, columns=["id", "image"], read_refs=True)))
    n = s3.count("GET", "warp/blobs/")
    assert [r.read_bytes() for r in d["image"]] == [(tmp_path / "media" / m).read_bytes() for m in _members()]
    assert s3.count("GET", "warp/blobs/") == n  # bytes were read with the batch: nothing more


def test_a_version_is_parsed_once_per_process_but_local_mode_still_needs_it_cached(s3, published, tmp_path,
                                                                                    monkeypatch):
    from warpdata.core.errors import MissingInputError
    from warpdata.registry.manifest import Manifest

    calls = []
    real = Manifest.from_bytes.__func__

    def counting(cls, *a, **kw):
        calls.append(1)
        return real(cls, *a, **kw)

    monkeypatch.setattr(Manifest, "from_bytes", classmethod(counting))
    v = warpdata.dataset("ws/refs").version
    n = len(calls)
    assert warpdata.dataset("ws/refs", version=v).version == v and len(calls) == n  # parsed and verified once
    other = BlobCache(tmp_path / "other")
    with pytest.raises(MissingInputError):  # the memo is no cache: local mode reads its own cache only
        warpdata.dataset("ws/refs", mode="local", version=v, cache=other)


def test_to_torch_can_read_bound_columns_as_bytes(s3, published, tmp_path):
    pytest.importorskip("torch")
    t = warpdata.dataset("ws/refs").table("main")
    got = []
    for b in t.to_torch(batch_size=16, columns=["id", "image"], rank=0, world_size=1, read_refs=True):
        got += list(zip(b["id"].tolist(), b["image"], strict=True))
    assert len(got) == 80
    assert all(data == (tmp_path / "media" / f"img/{i % 40:04d}.png").read_bytes() for i, data in got)
