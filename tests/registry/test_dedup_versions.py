"""Versions that share their bytes (issue 39): a 3 % edit of a published warehouse uploads about 3 %.

200 photos, 320×320 u8: version 1 is published; then 1 % of the images are relabelled, 1 % replaced
and 1 % appended, the warehouse is rebuilt and published as version 2. Its TWH1 tar shards are
stored as chunks of whole sample images (docs/formats/registry.md, "Chunked shards"), so the
publish uploads the replaced and appended images, the heads and tails of the touched shards and
the small files, and the local store grows by as much. A control store, written with chunking off,
answers ``warp why`` and ``warp diff`` the same and its readers see the same arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.store import Store
from warpdata.sampledata.detection import edit, generate


def _files(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two warehouse versions (200 photos, then the 3 % edit) built with `warp etl`."""
    from support.warehouses import etl_version

    base = tmp_path_factory.mktemp("dedup")
    src = base / "coco"
    generate(src, count=200, seed=21, min_side=160, max_side=480, broken=False)

    def etl(name: str) -> str:
        return etl_version(src, base / name, size=320, shards="")

    v1 = etl("wh1")
    changed = edit(src, relabel=2, replace=2, append=2, seed=7)
    v2 = etl("wh2")
    return v1, v2, changed


def test_a_three_percent_edit_uploads_and_stores_under_three_percent(versions, tmp_path):
    v1, v2, _changed = versions
    store = Store(str(tmp_path / "store"))
    r1 = publish(PublishRequest("ws/wh", from_paths=[v1]), store=store)
    before = _files(tmp_path / "store")
    r2 = publish(PublishRequest("ws/wh", from_paths=[v2]), store=store)
    after = _files(tmp_path / "store")
    new = sum(n for p, n in after.items() if p not in before)
    m2 = store.get_manifest("ws/wh", r2.version_hash)
    version_bytes = m2.stats["total_bytes"]  # every byte a reader of version 2 gets
    assert version_bytes > 60_000_000 and r1.bytes_uploaded > 0.99 * version_bytes
    # the replaced and appended images are new; every other image is a chunk version 1 stored
    images = 4 * 320 * 320 * 3
    assert images <= r2.bytes_uploaded <= 0.025 * version_bytes, (r2.bytes_uploaded, version_bytes)
    assert sum(after.values()) - sum(before.values()) == new <= 0.03 * sum(before.values())
    # warp ls --versions: version 2 holds alone what its publish uploaded, and shares the rest
    from warpdata.lineage.history import versions

    h1, h2 = versions(store, "ws/wh")
    assert (h1.version_hash, h2.version_hash) == (r1.version_hash, r2.version_hash)
    assert h2.own_bytes == r2.bytes_uploaded and h1.shared_bytes == h2.shared_bytes > 0.97 * version_bytes
    assert h1.own_bytes + h1.shared_bytes == r1.bytes_uploaded
    # the control: each changed TWH1 shard stored whole again (8 % here, every shard before the layout fix)
    control = Store(str(tmp_path / "control"))
    publish(PublishRequest("ws/wh", from_paths=[v1], chunk_target=0), store=control)
    c2 = publish(PublishRequest("ws/wh", from_paths=[v2], chunk_target=0), store=control)
    assert c2.bytes_uploaded > 3 * r2.bytes_uploaded


def test_a_chunked_version_reads_and_answers_as_its_control(cli, versions, tmp_path, monkeypatch):
    import warpdata.warehouse as wh

    v1, v2, changed = versions
    vs = {}
    for name, target in (("store", None), ("control", 0)):
        st = Store(str(tmp_path / name))
        kw = {} if target is None else {"chunk_target": target}
        vs[name] = [publish(PublishRequest("ws/wh", from_paths=[v], **kw), store=st).version_hash for v in (v1, v2)]
    m = Store(str(tmp_path / "store")).get_manifest("ws/wh", vs["store"][1])
    assert m.to_dict()["format_version"] == 5 and any(s.chunks for a in m.artifacts.values() for s in a.shards)

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    local = wh.open(v2)
    for name in ("store", "control"):
        with wh.open("ws/wh", store=str(tmp_path / name)) as w:
            assert len(w) == len(local) == 202 and w.keys() == local.keys()
            idx = np.arange(len(w))
            got, want = w.batch(idx), local.batch(idx)
            assert all(np.array_equal(got[k], want[k]) for k in want)
            assert len(w.verify()) == w.num_shards
        monkeypatch.setenv("WARP_STORE", str(tmp_path / name))
        r = cli("inspect", "ws/wh", "--verify")
        assert r.code == 0, r.err
    local.close()

    def answers(name: str) -> tuple[list, dict]:
        store = str(tmp_path / name)
        why = []
        for key in changed["relabelled"] + changed["replaced"] + changed["appended"]:
            d = cli("why", "ws/wh", key, "--store", store, "--json").json()
            why.append([d["key"], d["index"], d["source"]["sha256"], d["label"]["sha256"], d["row"]["values"],
                        d["location"]["file"], d["location"]["image_offset"]])
        a, b = vs[name]
        diff = cli("diff", "ws/wh", "--from", a, "--to", b, "--rows", "--json", "--store", store).json()
        return why, _without_hashes(diff, set(vs[name]))

    assert answers("store") == answers("control")
    # in the chunked store, why names the chunk holding the image: its bytes there are the image's
    key = changed["replaced"][0]
    loc = cli("why", "ws/wh", key, "--store", str(tmp_path / "store"), "--json").json()["location"]
    image = (Path(v2) / loc["file"]).read_bytes()[loc["image_offset"]:][:loc["image_bytes"]]
    assert Store(str(tmp_path / "store")).read_range(loc["chunk_sha256"], loc["chunk_offset"], len(image)) == image
    assert "chunk_sha256" not in cli("why", "ws/wh", key, "--store", str(tmp_path / "control"),
                                     "--json").json()["location"]


def _without_hashes(d, versions: set[str]):
    if isinstance(d, dict):
        # what the diff cost (chunked shards name a changed member without reading it) is no answer
        return {k: _without_hashes(v, versions) for k, v in d.items()
                if k not in ("store", "members_read", "blobs_read", "bytes_read")}
    if isinstance(d, list):
        return [_without_hashes(v, versions) for v in d]
    if isinstance(d, str) and (d in versions or any(d.startswith(v[:12]) for v in versions)):
        return "<version>"
    return d



@pytest.mark.s3
def test_on_s3_the_edit_puts_only_new_chunks_and_reads_back_by_ranged_gets(versions, s3, tmp_path, monkeypatch):
    import warpdata.warehouse as wh

    v1, v2, _changed = versions
    url = s3.url("warp")

    def objects() -> dict[str, int]:
        out, token = {}, None
        while True:
            kw = {"ContinuationToken": token} if token else {}
            page = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="warp/", **kw)
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    publish(PublishRequest("ws/wh", from_paths=[v1], link_cache=False), store=Store(url))
    before = objects()
    s3.reset_counts()
    r2 = publish(PublishRequest("ws/wh", from_paths=[v2], link_cache=False), store=Store(url))
    after = objects()
    new = {k: n for k, n in after.items() if k not in before}
    puts = [q for q in s3.requests("PUT") if q["key"].startswith("warp/blobs/")]
    # one create-only PUT per new blob, and only those: the bytes PUT are the new objects' bytes
    assert sorted(q["key"] for q in puts) == sorted(k for k in new if k.startswith("warp/blobs/"))
    version_bytes = Store(url).get_manifest("ws/wh", r2.version_hash).stats["total_bytes"]
    assert sum(new.values()) <= 0.025 * version_bytes and r2.bytes_uploaded == sum(
        n for k, n in new.items() if k.startswith("warp/blobs/"))

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    s3.reset_counts()
    with wh.open("ws/wh", store=url) as w, wh.open(v2) as local:
        idx = np.arange(len(local))
        got, want = w.batch(idx), local.batch(idx)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    chunks = {c for a in Store(url).get_manifest("ws/wh", r2.version_hash).artifacts.values()
              for s in a.shards for c, _n in (s.chunks or ())}
    got_keys = {q["key"].rsplit("/", 1)[-1] for q in s3.requests("GET") if q["key"].startswith("warp/blobs/")}
    assert chunks <= got_keys  # every chunk fetched, and the chunked shards themselves never asked for
    assert not {s.hash for a in Store(url).get_manifest("ws/wh", r2.version_hash).artifacts.values()
                for s in a.shards if s.chunks} & got_keys


def test_chunks_shared_by_two_shards_upload_once_and_republish_from_the_stat_cache(versions, tmp_path):
    """Two TWH1 files with the same samples: their image chunks and tail are one blob each; a second
    publish of the unchanged folder (stat-cache hit: the shards are packed again to upload) sends the
    right bytes for every chunk, each read from its own shard's staged file."""
    import shutil
    import time

    art = tmp_path / "art"
    art.mkdir()
    shard = Path(versions[0]) / "shard-00000.twh1"
    shutil.copy(shard, art / "a.twh1")
    shutil.copy(shard, art / "b.twh1")
    time.sleep(0.25)  # past the stat cache's racy window (a file changed within 100 ms is not cached)
    r1 = publish(PublishRequest("ws/two", artifacts={"raw": str(art)}), store=Store(str(tmp_path / "s1")))
    m = Store(str(tmp_path / "s1")).get_manifest("ws/two", r1.version_hash)
    a, b = m.artifacts["raw"].shards
    assert a.chunks and b.chunks and a.chunks[0] != b.chunks[0] and a.chunks[1:] == b.chunks[1:]
    assert r1.bytes_uploaded == sum(n for _h, n in a.chunks) + b.chunks[0][1] + m.artifacts["raw"].index.byte_size
    r2 = publish(PublishRequest("ws/two", artifacts={"raw": str(art)}), store=Store(str(tmp_path / "s2")))
    assert r2.stat_cache_hits and r2.version_hash == r1.version_hash and r2.bytes_uploaded == r1.bytes_uploaded
    from warpdata.read.dataset import Dataset

    ds = Dataset("ws/two", store=str(tmp_path / "s2"))
    reader = ds.artifact("raw")
    try:
        assert reader.read("b.twh1") == reader.read("a.twh1") == shard.read_bytes()
    finally:
        reader.close()


def test_a_feature_cache_is_stored_as_record_chunks_and_traced_and_read_through_them(cli, tmp_path, monkeypatch):
    """WFS1 shards are cut at their fixed-size records (docs/formats/registry.md, "Chunked shards"):
    `warp why` names the chunk holding a record, readers see the same records."""
    from warpdata.features.reader import ShardCache
    from warpdata.features.writer import CacheSpec, build_cache
    from warpdata.sampledata.captions import generate as captions

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    captions(tmp_path / "src", count=24, seed=4)
    build_cache(CacheSpec(source=str(tmp_path / "src"), output=str(tmp_path / "fc"), size=(128, 128),
                          shard_size=8), allow_invalid=True)
    store = Store(str(tmp_path / "store"))
    r = publish(PublishRequest("ws/fc", from_paths=[str(tmp_path / "fc")]), store=store)
    m = store.get_manifest("ws/fc", r.version_hash)
    chunked = [s for a in m.artifacts.values() for s in a.shards if s.chunks]
    assert len(chunked) == 3 and all(len(s.chunks) >= 4 for s in chunked)
    with ShardCache(tmp_path / "fc") as local, ShardCache("ws/fc", store=str(tmp_path / "store")) as sc:
        assert len(sc) == len(local) and all((sc.get(i)["pixels"] == local.get(i)["pixels"]).all()
                                             for i in range(len(local)))
    r = cli("why", "ws/fc", "13", "--store", str(tmp_path / "store"), "--json")
    assert r.code == 0, r.err
    loc = r.json()["location"]
    assert loc["shard"] == "shard-00001.wfs"
    record = (tmp_path / "fc" / loc["shard"]).read_bytes()[loc["offset"]:loc["offset"] + loc["record_bytes"]]
    assert store.read_range(loc["chunk_sha256"], loc["chunk_offset"], len(record)) == record


def test_a_feature_cache_with_one_image_replaced_uploads_about_one_record_chunk(tmp_path, monkeypatch):
    from PIL import Image
    from warpdata.features.writer import CacheSpec, build_cache
    from warpdata.sampledata.captions import generate as captions

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    captions(tmp_path / "src", count=24, seed=4)

    def build(out: str):
        build_cache(CacheSpec(source=str(tmp_path / "src"), output=str(tmp_path / out), size=(128, 128),
                              shard_size=8), allow_invalid=True)
        return json.loads((tmp_path / out / "manifest.json").read_text())

    a = build("fc1")
    store = Store(str(tmp_path / "store"))
    publish(PublishRequest("ws/fc", from_paths=[str(tmp_path / "fc1")]), store=store)
    first = sorted(p for p in (tmp_path / "src").rglob("*.jpg"))[len(list((tmp_path / "src").rglob("*.jpg"))) // 2]
    with Image.open(first) as im:
        im.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(first, quality=90)
    b = build("fc2")
    # a shard's meta holds its task's identity, not the cache's fingerprint: the one shard holding the
    # image changed, the others are the same bytes (docs/formats/feature-shard.md, "Reusing the shards")
    assert sum(x["sha256"] != y["sha256"] for x, y in zip(a["shards"], b["shards"], strict=True)) == 1
    r = publish(PublishRequest("ws/fc", from_paths=[str(tmp_path / "fc2")]), store=store)
    record = 128 * 128 * 3
    # the chunk of records holding the new pixels (5 records a 256 KiB chunk), the shards' heads and
    # tails, the tables: under one shard, where whole-shard storage sends all four again
    whole = sum(s["bytes"] for s in b["shards"])
    assert record <= r.bytes_uploaded < b["shards"][0]["bytes"] < whole, (r.bytes_uploaded, whole)
