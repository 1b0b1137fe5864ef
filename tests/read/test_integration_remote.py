"""Integration: train from a published artifact, against a real S3 protocol server (moto).

``warpdata.warehouse.open("ws/name")`` and ``ShardCache("ws/name")`` resolve
the published dataset, take the artifact's tar shards from the blob cache (or
fetch them into it whole, hash-checked, as ``warp warm`` does) and map each
member in place: the cache holds every byte once, a warmed dataset opens with
zero data GETs, and the members' own checksums are checked on first touch.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import warpdata
from PIL import Image
from support.warehouses import warehouse_config
from warpdata.core.errors import MissingInputError, UsageError
from warpdata.etl.quarantine import Thresholds
from warpdata.features.reader import ShardCache
from warpdata.features.writer import CacheSpec, build_cache
from warpdata.registry.store import Store
from warpdata.sampledata.detection import generate
from warpdata.storage.blobcache import BlobCache
from warpdata.warehouse.reader import Warehouse


@pytest.fixture
def published(cli, s3, tmp_path, monkeypatch):
    d = tmp_path / "coco"
    generate(d, count=10, seed=11, min_side=64, max_side=140)
    r = cli("etl", "--config", str(warehouse_config(d, tmp_path / "wh", 1)), "--json")
    assert r.code == 0, r.err
    wh_path = r.json()["path"]
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("publish", "vision/coco", "--from", wh_path, "--json")
    assert r.code == 0, r.err
    return wh_path, r.json()["version_hash"]


def assert_same(a: Warehouse, b: Warehouse) -> None:
    assert len(a) == len(b) and a.num_shards == b.num_shards
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.key == y.key and x.run_id == y.run_id and x.frame_id == y.frame_id
        for f in ("image", "boxes", "mask", "classes"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), (i, f)


def published_blobs(name: str) -> dict[str, int]:
    """hash -> bytes of every blob the published version holds (what 'warp warm' caches)."""
    m = warpdata.dataset(name).manifest
    out = {}
    for t in m.tables.values():
        out.update({s.hash: s.byte_size for s in t.shards})
    for a in m.artifacts.values():
        out.update({s.hash: s.byte_size for s in (*a.shards, *([a.index] if a.index else []))})
    return out


def blob_gets_by_key(s3) -> dict[str, int]:
    """object key -> bytes GET'd under warp/blobs/ (ranged reads summed)."""
    out: dict[str, int] = {}
    for r in s3.requests("GET", "warp/blobs/"):
        assert r["range"], r  # fsspec reads by range
        a, b = r["range"].split("=")[1].split("-")
        out[r["key"]] = out.get(r["key"], 0) + int(b) - int(a) + 1
    return out


def assert_one_copy(cache_dir: Path, name: str) -> None:
    """The cache holds exactly the published blobs: no member copies, no views."""
    cache = BlobCache(cache_dir)
    blobs = published_blobs(name)
    on_disk = {p.name: p.stat().st_size for p in (cache_dir / "blobs").glob("*/*")}
    assert set(on_disk) <= set(blobs) and all(on_disk[h] == blobs[h] for h in on_disk)
    assert cache.stats().bytes == sum(on_disk.values())
    assert not (cache_dir / "views").exists() and not (cache_dir / "members").exists()


def test_open_published_warehouse_from_s3(s3, published, tmp_path):
    wh_path, version = published
    local = Warehouse(wh_path)
    cache_dir = tmp_path / "cache"
    s3.reset_counts()
    remote = warpdata.warehouse.open("vision/coco")
    assert_same(remote, local)
    assert remote.verify() == [s["checksum_sha256"] for s in local.manifest["shards"]]
    # the needed tar shards came whole, each once (as 'warp warm' fetches them), nothing else was copied
    art = warpdata.dataset("vision/coco").manifest.artifacts[remote.published.artifact]
    sizes = {s.hash: s.byte_size for s in art.shards}
    got = blob_gets_by_key(s3)
    tar_gets = {k.rsplit("/", 1)[-1]: n for k, n in got.items() if k.rsplit("/", 1)[-1] in sizes}
    assert tar_gets == {h: sizes[h] for h in remote.published.blobs}
    assert remote.published.fetched_bytes == sum(tar_gets.values())
    assert_one_copy(cache_dir, "vision/coco")
    # each TWH1 shard is mapped in place, at its offset inside its cached tar shard
    for i, s in enumerate(local.manifest["shards"]):
        m = remote.shard(i)
        assert Path(m.path).parent.parent == (cache_dir / "blobs") and m.offset > 0
        assert m.length == s["size_bytes"] and str(remote.path) in m.name
        with open(m.path, "rb") as f:
            f.seek(m.offset)
            assert f.read(m.length) == (Path(wh_path) / s["relative_path"]).read_bytes(), i
    # the tar shards are pinned while the warehouse is open, released by close()
    cache = BlobCache(cache_dir)
    pinned = set(remote.published.blobs)
    assert pinned and pinned <= cache.pinned_hashes()
    remote.close()
    assert not pinned & cache.pinned_hashes()

    s3.reset_counts()
    again = warpdata.warehouse.open("vision/coco", version=version, store=s3.url("warp"))
    assert s3.count("GET", "warp/blobs/") == 0  # everything from the cache: zero data GETs
    assert again.published.fetched_bytes == 0 and again.path == remote.path
    assert_same(again, local)
    again.close()


def test_warm_then_open_keeps_one_copy(cli, s3, published, tmp_path):
    wh_path, _ = published
    cache_dir = tmp_path / "cache"
    r = cli("warm", "vision/coco", "--json")
    assert r.code == 0, r.err
    blobs = published_blobs("vision/coco")
    warmed = BlobCache(cache_dir).stats().bytes
    assert warmed == sum(blobs.values())
    s3.reset_counts()
    with warpdata.warehouse.open("vision/coco") as wh:
        assert_same(wh, Warehouse(wh_path))
        wh.verify()
        assert wh.published.fetched_bytes == 0
    assert s3.count("GET", "warp/blobs/") == 0  # zero data GETs
    assert BlobCache(cache_dir).stats().bytes == warmed  # and zero extra bytes
    assert_one_copy(cache_dir, "vision/coco")
    # offline, from the warmed cache only
    with warpdata.warehouse.open("vision/coco", mode="local") as wh:
        assert len(wh) == 10 and wh[9].key == Warehouse(wh_path)[9].key


def test_a_corrupt_cached_member_is_fetched_again_on_first_touch(cli, s3, published, tmp_path):
    """docs/formats/registry.md ("Readers of published data"): a member failing its checksum in the
    cache is evicted and fetched again once; the read then succeeds with the published bytes."""
    assert cli("warm", "vision/coco").code == 0
    with warpdata.warehouse.open("vision/coco") as wh:
        m = wh.shard(1)
        where, off = m.path, m.offset + m.header.image_offset + 7
        want = wh[int(wh.offsets[1])].image.copy()
    os.chmod(where, 0o644)
    with open(where, "r+b") as f:  # flip one image byte of shard 1 inside the cached tar shard
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    s3.reset_counts()
    with warpdata.warehouse.open("vision/coco") as wh:  # the cached tar is trusted: members are checked
        assert wh[0].key  # shard 0 is intact
        assert (wh[int(wh.offsets[1])].image == want).all()  # the first sample of shard 1, fetched again
        # by the member check, or (small warehouse: shard 1 shares the manifest's tar shard, which is
        # always hashed) by the open itself
        assert s3.count("GET", "warp/blobs/") > 0


def test_torch_loader_over_a_published_warehouse(s3, published):
    from warpdata.warehouse.torch import make_loader

    wh_path, _ = published
    local = Warehouse(wh_path)
    loader = make_loader("vision/coco", batch_size=3, num_workers=2, shuffle=False)
    seen = {}
    for batch in loader:
        for j, i in enumerate(batch["index"].tolist()):
            seen[i] = batch["image"][j].numpy()
    assert sorted(seen) == list(range(len(local)))
    for i, img in seen.items():
        assert np.array_equal(img, local[i].image)
    # what a worker receives: the members' locations and the manifest, no maps and no pins
    wh = loader.dataset._opened
    wh[0]
    clone = pickle.loads(pickle.dumps(wh))
    assert wh._shards and clone._shards == {} and clone.published is None
    assert_same(clone, local)
    assert_one_copy(Path(os.environ["WARP_CACHE_DIR"]), "vision/coco")


def test_open_errors_name_what_is_wrong(s3, published, tmp_path):
    with pytest.raises(MissingInputError) as e:
        warpdata.warehouse.open("vision/nope")
    assert "not a local directory" in e.value.message and "vision/nope" in e.value.message
    with pytest.raises(UsageError, match="published datasets"):
        warpdata.warehouse.open(published[0], version="abc")
    with pytest.raises(UsageError, match="blob cache"):
        warpdata.warehouse.open("vision/coco", mode="remote")
    # a dataset without a tensor warehouse
    (tmp_path / "t.tbl").write_bytes(b"TBL\x02" + os.urandom(100))
    from warpdata.publishing.publish import DatasetBuilder

    DatasetBuilder("ws/other", store=s3.url("warp")).add_from(tmp_path / "t.tbl").publish()
    with pytest.raises(MissingInputError, match="no tensor-warehouse artifact"):
        warpdata.warehouse.open("ws/other")


@pytest.fixture
def published_captions(cli, s3, tmp_path, monkeypatch):
    src = tmp_path / "src" / "g0"
    src.mkdir(parents=True)
    for i in range(6):
        Image.new("RGB", (40 + 4 * i, 30 + 2 * i), (30 * i, 90, 40)).save(src / f"s{i}.png")
        (src / f"s{i}.txt").write_text(f"caption {i}\n")
    build_cache(CacheSpec(source=str(tmp_path / "src"), output=str(tmp_path / "fc"), size=(32, 32),
                          thresholds=Thresholds(), shard_size=4), workers=1)
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("publish", "text/caps", "--from", str(tmp_path / "fc"), "--json")
    assert r.code == 0, r.err
    return ShardCache(tmp_path / "fc")


def assert_same_records(a: ShardCache, b: ShardCache) -> None:
    assert len(a) == len(b) == 6
    for i in range(6):
        x, y = a.get(i), b.get(i)
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_shard_cache_from_a_published_feature_cache(s3, published_captions, tmp_path):
    local = published_captions
    s3.reset_counts()
    remote = warpdata.ShardCache("text/caps", verify="full")
    assert s3.count("GET", "warp/blobs/") > 0 and remote.published.fetched_bytes > 0
    assert_same_records(remote, local)
    assert remote.verify_all() == []
    assert_one_copy(tmp_path / "cache", "text/caps")
    # a pickled handle (a DataLoader worker's copy) maps the same cached bytes, with no pins of its own
    clone = pickle.loads(pickle.dumps(remote))
    assert clone.published is None and clone.resident() == []
    assert_same_records(clone, local)
    clone.close()
    remote.close()
    s3.reset_counts()
    again = warpdata.ShardCache("text/caps")
    assert s3.count("GET", "warp/blobs/") == 0
    assert np.array_equal(again.get(5)["pixels"], local.get(5)["pixels"])
    assert Store(s3.url("warp")).resolve("text/caps").metadata["default_table"] == "records"
    again.close()


def test_warm_then_shard_cache_keeps_one_copy_and_checks_members(cli, s3, published_captions, tmp_path):

    cache_dir = tmp_path / "cache"
    assert cli("warm", "text/caps").code == 0
    warmed = BlobCache(cache_dir).stats().bytes
    assert warmed == sum(published_blobs("text/caps").values())
    s3.reset_counts()
    with warpdata.ShardCache("text/caps", verify="full") as sc:
        assert_same_records(sc, published_captions)
        file, offset, length = sc._where(sc.shards[1]["path"])
    assert s3.count("GET", "warp/blobs/") == 0 and BlobCache(cache_dir).stats().bytes == warmed
    assert_one_copy(cache_dir, "text/caps")
    os.chmod(file, 0o644)
    with open(file, "r+b") as f:  # flip the last record byte of shard 1 inside the cached tar shard
        f.seek(offset + length - 32 - 4 * 2 - 1)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    s3.reset_counts()
    with warpdata.ShardCache("text/caps", verify="full") as sc:
        assert sc.get(0)  # shard 0 is intact
        assert_same_records(sc, published_captions)  # shard 1 failed its SHA-256: fetched again once
        assert s3.count("GET", "warp/blobs/") > 0  # at the open (the manifest's tar shard) or on first touch
    # the same damage under verify="fast": the record CRC catches it, and the shard is fetched again
    with open(file, "r+b") as f:
        f.seek(offset + length - 32 - 4 * 2 - 1)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    s3.reset_counts()
    with warpdata.ShardCache("text/caps", verify="fast") as sc:
        assert_same_records(sc, published_captions)
        assert s3.count("GET", "warp/blobs/") > 0
