"""Publishing rebuilt artifacts (issue #11) and reading published ones whose cached copy is bad (issue #4).

* the same ETL inputs built in two folders publish as one version with zero uploads;
* one changed source image re-uploads about one TWH1 shard, not the whole warehouse;
* a tampered or damaged cached tar shard is evicted and fetched again once; a store copy that is
  itself bad is a typed error naming the store object.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.store import Store
from warpdata.sampledata.detection import generate


def _config(src: Path, out: Path) -> Path:
    p = src / f"t-{out.name}.toml"
    p.write_text(f'[source]\nformat = "coco"\n[transform]\ntarget_size = 256\nmax_boxes = 8\n'
                 f'[validation]\nmax_invalid_fraction = {{ fail = 0.5 }}\nmax_missing_fraction = {{ fail = 0.5 }}\n'
                 f'[output]\nroot = "{out}"\nshard_samples = 6\n')
    return p


def _etl(cli, cfg: Path) -> dict:
    r = cli("-q", "etl", "--config", str(cfg), "--json")
    assert r.code == 0, r.err
    return r.json()


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    d = tmp_path_factory.mktemp("rebuild") / "coco"
    generate(d, count=26, seed=11, min_side=64, max_side=140, broken=False)
    return d


def test_identical_rebuilds_publish_as_one_version_and_a_changed_image_uploads_one_shard(cli, coco, tmp_path):
    store = Store(str(tmp_path / "store"))
    a = _etl(cli, _config(coco, tmp_path / "a"))
    b = _etl(cli, _config(coco, tmp_path / "b"))
    assert a["version"] == b["version"] and a["path"] != b["path"]
    assert (Path(a["path"]) / "manifest.json").read_bytes() == (Path(b["path"]) / "manifest.json").read_bytes()
    r1 = publish(PublishRequest("ws/wh", from_paths=[a["path"]]), store=store)
    r2 = publish(PublishRequest("ws/wh", from_paths=[b["path"]]), store=store)
    total = r1.bytes_total
    assert r1.bytes_uploaded == total > 5_000_000
    assert r2.version_hash == r1.version_hash and r2.bytes_uploaded == 0 and r2.blobs_uploaded == 0

    # one source image changes: its shard, the small members and the tables are new, the rest is not
    images = json.loads((coco / "annotations.json").read_text())["images"]
    first = next(coco.rglob(Path(images[0]["file_name"]).name))
    from PIL import Image

    with Image.open(first) as im:
        im.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(first, quality=90)
    c = _etl(cli, _config(coco, tmp_path / "c"))
    assert c["version"] != a["version"]
    r3 = publish(PublishRequest("ws/wh", from_paths=[c["path"]]), store=store)
    shard_bytes = max(s["size_bytes"] for s in json.loads((Path(c["path"]) / "manifest.json").read_text())["shards"])
    assert r3.version_hash != r1.version_hash
    # the shard is stored as chunks of whole sample images (docs/formats/registry.md, "Chunked shards"):
    # 256x256 RGB u8 images, one to a chunk (256 KiB target); the flipped image re-uploads its chunk, the shard's head
    # and tail (and the small members and tables), not the whole shard
    chunk = 256 * 256 * 3
    assert chunk <= r3.bytes_uploaded < min(shard_bytes, chunk + 100_000), (r3.bytes_uploaded, shard_bytes, total)


def _corrupt_cached_member(cache_root: Path, member_bytes: bytes, old: bytes, new: bytes) -> Path:
    for p in (cache_root / "blobs").rglob("*"):
        if p.is_file() and not p.name.startswith(".") and member_bytes in p.read_bytes():
            data = p.read_bytes()
            assert old in data
            p.chmod(0o644)
            p.write_bytes(data.replace(old, new, 1))
            return p
    raise AssertionError("member not found in the cache")


def test_published_warehouse_with_a_tampered_cache_is_fetched_again(cli, coco, tmp_path, monkeypatch):
    """Issue #4: a same-length class-name edit in the cached tar gave wrong names on every open."""
    import warpdata.warehouse as wh
    from warpdata.storage.blobcache import BlobCache

    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    a = _etl(cli, _config(coco, tmp_path / "a"))
    publish(PublishRequest("ws/wh", from_paths=[a["path"]]), store=Store(str(tmp_path / "store")))
    with wh.open("ws/wh") as w:
        names = [c["name"] for c in w.classes]
        first_key = w[0].key
    cache_root = BlobCache().root
    name = names[0].encode()
    _corrupt_cached_member(cache_root, b'"tensor-warehouse"', b'"name":"' + name, b'"name":"' + name[::-1])
    with wh.open("ws/wh") as w:  # the manifest's tar shard is always hashed: the bad copy is replaced
        assert [c["name"] for c in w.classes] == names

    # a damaged TWH1 member: detected on first touch, its tar shard evicted and fetched again
    shard = (Path(a["path"]) / "shard-00001.twh1").read_bytes()
    victim = _corrupt_cached_member(cache_root, shard[4096:4096 + 64], shard[8192:8192 + 16], b"\xff" * 16)
    with wh.open("ws/wh") as w:
        assert w.keys()[0] == first_key and len(w.verify()) == w.num_shards
        assert victim.is_file() and shard[8192:8192 + 16] in victim.read_bytes()


def test_bad_store_copy_is_a_typed_error_naming_the_store_object(cli, coco, tmp_path, monkeypatch):
    import warpdata.warehouse as wh
    from warpdata.core.errors import BlobCorruptedError

    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    a = _etl(cli, _config(coco, tmp_path / "a"))
    publish(PublishRequest("ws/wh", from_paths=[a["path"]]), store=Store(str(tmp_path / "store")))
    shard = (Path(a["path"]) / "shard-00002.twh1").read_bytes()
    store_blob = _corrupt_cached_member(tmp_path / "store", shard[4096:4096 + 64], shard[8192:8192 + 16],
                                        b"\xff" * 16)
    # raised on the download (or on first touch of a cached copy)
    with pytest.raises((BlobCorruptedError, BlobCorruptedError)) as ei, wh.open("ws/wh") as w:
        w.verify()
    assert ei.value.exit_code == 65 and store_blob.name in ei.value.message


def test_published_feature_cache_member_failing_its_sha256_is_fetched_again(tmp_path, monkeypatch):
    """Shards of >= 256 KiB lie in tar shards of their own: the member check (not the manifest's tar
    hash) finds the damage, evicts that tar shard and fetches it again once."""
    from warpdata.features.reader import ShardCache
    from warpdata.features.writer import CacheSpec, build_cache
    from warpdata.sampledata.captions import generate as captions
    from warpdata.storage.blobcache import BlobCache

    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    captions(tmp_path / "src", count=24, seed=4)
    build_cache(CacheSpec(source=str(tmp_path / "src"), output=str(tmp_path / "fc"), size=(128, 128),
                          shard_size=8), allow_invalid=True)
    publish(PublishRequest("ws/fc", from_paths=[str(tmp_path / "fc")]), store=Store(str(tmp_path / "store")))
    with ShardCache(tmp_path / "fc") as local:
        want = [local.get(i)["pixels"] for i in range(len(local))]
    with ShardCache("ws/fc", verify="full") as sc:
        file, offset, length = sc._where(sc.shards[1]["path"])
        assert sc._where(sc.shards[0]["path"])[0] != file  # a tar shard of its own
    os.chmod(file, 0o644)
    with open(file, "r+b") as f:
        f.seek(offset + length // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    with ShardCache("ws/fc", verify="full") as sc:
        assert all((sc.get(i)["pixels"] == w).all() for i, w in enumerate(want))
        assert sc.published.refetched
    assert BlobCache().get(Path(file).name) is not None
