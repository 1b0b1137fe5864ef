"""Integration: train from a published artifact, against a real S3 protocol server (moto).

``warpdata.warehouse.open("ws/name")`` and ``ShardCache("ws/name")`` resolve
the published dataset, materialise the artifact's shards into the blob cache
from byte ranges of its tar shards (hash-checked), and open the normal
readers; the second open issues no data GETs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import warpdata
from PIL import Image
from warpdata.blobcache import BlobCache
from warpdata.errors import MissingInputError, UsageError
from warpdata.features.reader import ShardCache
from warpdata.features.writer import CacheSpec, build_cache
from warpdata.quarantine import Thresholds
from warpdata.registry.store import Store
from warpdata.sampledata.detection import generate
from warpdata.warehouse.reader import Warehouse

CONFIG = """
[source]
format = "coco"
path = "."
labels = "annotations.json"

[transform]
target_size = 64
max_boxes = 8

[validation]
max_invalid_fraction = { warn = 0.0, fail = 0.5 }
max_missing_fraction = { warn = 0.0, fail = 0.5 }

[output]
root = "../wh"
shard_samples = 4
"""


@pytest.fixture
def published(cli, s3, tmp_path, monkeypatch):
    d = tmp_path / "coco"
    generate(d, count=10, seed=11, min_side=64, max_side=140)
    (d / "t.toml").write_text(CONFIG)
    r = cli("etl", "--config", str(d / "t.toml"), "--json")
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


def test_open_published_warehouse_from_s3(s3, published, tmp_path):
    wh_path, version = published
    local = Warehouse(wh_path)
    s3.reset_counts()
    remote = warpdata.warehouse.open("vision/coco")
    assert_same(remote, local)
    assert remote.verify() == [s["checksum_sha256"] for s in local.manifest["shards"]]
    # shard bytes came by ranged GETs of the tar shards, never a whole-object download
    blob_gets = s3.requests("GET", "warp/blobs/")
    shard_bytes = sum(s["size_bytes"] for s in local.manifest["shards"])
    manifest_bytes = (Path(wh_path) / "manifest.json").stat().st_size
    assert blob_gets and remote.published.fetched_bytes == shard_bytes + manifest_bytes
    ranged = sum(int(r["range"].split("-")[1]) - int(r["range"].split("=")[1].split("-")[0]) + 1
                 for r in blob_gets if r["range"])
    assert shard_bytes <= ranged < shard_bytes + manifest_bytes + 65536  # member ranges, not whole tar shards
    # the cached blobs (named by content hash) are pinned while the warehouse is open, released by close()
    cache = BlobCache(tmp_path / "cache")
    shard_hashes = set(remote.published.blobs)
    assert len(shard_hashes) == remote.num_shards + 1 and shard_hashes <= cache.pinned_hashes()
    for i, s in enumerate(local.manifest["shards"]):
        assert (remote.path / s["relative_path"]).resolve().parent.parent == (tmp_path / "cache" / "blobs").resolve()
        assert (remote.path / s["relative_path"]).read_bytes() == (Path(wh_path) / s["relative_path"]).read_bytes(), i
    remote.close()
    assert not shard_hashes & cache.pinned_hashes()

    s3.reset_counts()
    again = warpdata.warehouse.open("vision/coco", version=version, store=s3.url("warp"))
    assert s3.count("GET", "warp/blobs/") == 0  # everything from the cache: zero data GETs
    assert again.published.fetched_bytes == 0 and again.path == remote.path
    assert_same(again, local)
    again.close()


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
    from warpdata.registry.publish import DatasetBuilder

    DatasetBuilder("ws/other", store=s3.url("warp")).add_from(tmp_path / "t.tbl").publish()
    with pytest.raises(MissingInputError, match="no tensor-warehouse artifact"):
        warpdata.warehouse.open("ws/other")


def test_shard_cache_from_a_published_feature_cache(cli, s3, tmp_path, monkeypatch):
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
    local = ShardCache(tmp_path / "fc")
    s3.reset_counts()
    remote = warpdata.ShardCache("text/caps", verify="shard")
    assert s3.count("GET", "warp/blobs/") > 0
    assert len(remote) == len(local) == 6
    for i in range(6):
        a, b = remote.get(i), local.get(i)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    remote.close()
    s3.reset_counts()
    again = warpdata.ShardCache("text/caps")
    assert s3.count("GET", "warp/blobs/") == 0
    assert np.array_equal(again.get(5)["pixels"], local.get(5)["pixels"])
    assert Path(again.path).is_dir() and Store(s3.url("warp")).resolve("text/caps").metadata["default_table"] == "records"
    again.close()
