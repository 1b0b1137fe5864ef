"""`warp why`: one sample traced to its source file, label file, verdicts, recipe and shard, from
manifests and side tables only (docs/lineage.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_warehouse_sample_is_traced_to_a_file_whose_sha256_matches(cli, coco_warehouse):
    from warpdata.warehouse import open as open_warehouse

    r = cli("why", coco_warehouse, "2", "--json")
    assert r.code == 0, r.err
    assert r.err == ""
    d = r.json()
    root = coco_warehouse.parent.parent / "coco"
    assert d["status"] == "kept" and d["index"] == 2
    assert d["source"]["path"] == d["key"]
    assert d["source"]["sha256"] == sha(root / d["source"]["path"])
    assert d["label"] == {"file": "annotations.json", "sha256": sha(root / "annotations.json")}
    manifest = json.loads((coco_warehouse / "manifest.json").read_text())
    assert d["transform"]["version_recipe_sha256"] == manifest["version"] \
        == hashlib.sha256(manifest["version_recipe"].encode()).hexdigest()
    loc = d["location"]
    assert loc["shard_sha256"] == d["receipt"]["sha256"]
    shard = coco_warehouse / loc["file"]
    assert hashlib.sha256(shard.read_bytes()[:-32]).hexdigest() == loc["shard_sha256"]
    raw = shard.read_bytes()[loc["image_offset"]:loc["image_offset"] + loc["image_bytes"]]
    wh = open_warehouse(coco_warehouse)
    assert np.array_equal(np.frombuffer(raw, np.uint8), np.asarray(wh[2].image).reshape(-1))
    assert wh[2].key == d["key"]
    assert d["validation"]["verdict"] == "passed" and d["validation"]["dataset_verdict"] == "warn"
    coco = json.loads((root / "annotations.json").read_text())
    image_id = next(im["id"] for im in coco["images"] if im["file_name"] == d["key"].removeprefix("images/"))
    want = [str(a["id"]) for a in coco["annotations"] if a["image_id"] == image_id][:8]  # max_boxes = 8
    assert d["annotation_ids"] == want and len(want) == d["validation"]["boxes"]
    assert not any("annotation ids" in m for m in d["missing"])


def test_a_key_gives_the_same_answer_and_the_human_form_names_the_hash(cli, coco_warehouse):
    by_index = cli("why", coco_warehouse, "2", "--json").json()
    r = cli("why", coco_warehouse, by_index["key"])
    assert r.code == 0, r.err
    assert f"sha256 {by_index['source']['sha256']}" in r.out
    assert "not recorded:" in r.out and r.err == ""


def test_a_quarantined_key_answers_with_its_reason(cli, coco_warehouse):
    r = cli("why", coco_warehouse, "images/img_00002.jpg", "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["status"] == "quarantined" and d["validation"]["verdict"] == "missing-file"
    assert d["location"] is None


def test_unknown_keys_and_indexes_out_of_range_are_typed_errors(cli, coco_warehouse):
    r = cli("why", coco_warehouse, "images/nope.jpg")
    assert r.code == 66 and "nope.jpg" in r.err and r.out == ""
    r = cli("why", coco_warehouse, "99")
    assert r.code == 2 and "out of range" in r.err
    r = cli("why", coco_warehouse.parent, "0")
    assert r.code == 2 and "name the version directory" in r.err


def test_a_feature_cache_record_gives_its_shard_offset_and_fingerprint(cli, feature_cache):
    from warpdata.formats.featshard import FeatureShardReader

    r = cli("why", feature_cache, "d1/group_000/00002.jpg", "--json")
    assert r.code == 0, r.err
    d = r.json()
    manifest = json.loads((feature_cache / "manifest.json").read_text())
    assert d["encoder"]["fingerprint"] == manifest["fingerprint"]
    assert d["source"]["directory"] == "d1" and d["source"]["caption"].startswith("photo: ")
    loc = d["location"]
    shard = feature_cache / loc["shard"]
    assert sha(shard) == loc["shard_sha256"]
    with FeatureShardReader(shard) as fr:
        rec = fr.record_bytes(loc["index_in_shard"])
    assert shard.read_bytes()[loc["offset"]:loc["offset"] + loc["record_bytes"]] == bytes(rec)


def test_a_tbl_sample_gives_its_offset_and_key(cli, tmp_path):
    from warpdata.formats.tbl import TblReader
    from warpdata.sampledata.wds import generate

    generate(tmp_path / "wds", count=6, seed=1)
    out = tmp_path / "s.tbl"
    assert cli("tar-to-tbl", tmp_path / "wds" / "shard-000000.tar", out).code == 0
    r = cli("why", out, "3", "--json")
    assert r.code == 0, r.err
    d = r.json()
    with TblReader(out) as t:
        info = t.info(3)
        assert (d["key"], d["location"]["offset"], d["location"]["stored_bytes"]) == (t.key(3), info.offset, info.size)
    assert cli("why", out, d["key"], "--json").json()["index"] == 3


def test_a_zarr_row_names_the_object_holding_it():
    from warpdata.lineage.why import WhyRequest, why

    root = Path(__file__).resolve().parents[1] / "golden" / "zarr" / "sharded.zarr"
    res = why(WhyRequest(str(root), "3"))
    assert res.location["object"] == "c/1/0/0" and (root / "c" / "1" / "0" / "0").is_file()
    assert res.location["level_sha256"] == json.loads((root / "manifest.json").read_text())["levels"][0]["sha256"]
    with pytest.raises(Exception, match="out of range"):
        why(WhyRequest(str(root), "5"))


@pytest.mark.s3
def test_a_published_row_on_s3_is_traced_through_the_warehouse_without_reading_images(cli, s3, coco_warehouse):
    url = s3.url("warp")
    assert cli("publish", "ws/wh", "--from", coco_warehouse, "--store", url).code == 0
    s3.reset_counts()
    r = cli("why", "ws/wh", "images/img_00003.jpg", "--store", url, "--json")
    assert r.code == 0, r.err
    d = r.json()
    root = coco_warehouse.parent.parent / "coco"
    assert d["source"]["sha256"] == sha(root / "images/img_00003.jpg")
    assert d["label"]["sha256"] == sha(root / "annotations.json")
    assert d["row"]["table"] == "samples" and d["row"]["values"]["key"] == "images/img_00003.jpg"
    loc = d["location"]
    # what why read: manifests, Parquet side tables, the member index and one ranged read of
    # manifest.json; never the image's bytes
    gets = [q for q in s3.requests("GET") if q["key"].startswith("warp/blobs/")]
    image = range(loc["blob_offset"], loc["blob_offset"] + loc["image_bytes"])
    for q in gets:
        if q["key"].endswith(loc["blob_sha256"]):  # the tar shard that also holds manifest.json
            assert q["range"], "the tar shard was read whole"
            a, b = (int(x) for x in q["range"].removeprefix("bytes=").split("-"))
            assert b < image.start or a >= image.stop, "the image bytes were read"
    shard = coco_warehouse / loc["file"]
    blob = s3.client.get_object(Bucket=s3.bucket, Key=f"warp/blobs/sha256/{loc['blob_sha256'][:2]}/{loc['blob_sha256']}")
    data = blob["Body"].read()
    start = loc["blob_offset"]
    assert data[start:start + loc["image_bytes"]] == shard.read_bytes()[loc["image_offset"]:][:loc["image_bytes"]]


def test_an_edited_manifest_is_refused(cli, coco_warehouse, tmp_path):
    import shutil

    copy = tmp_path / coco_warehouse.name
    shutil.copytree(coco_warehouse, copy)
    m = copy / "manifest.json"
    assert cli("why", copy, "0").code == 0  # checked once: its seal is stamped in the cache
    m.write_text(m.read_text().replace('"pad_value":114', '"pad_value":115'))  # same size, new ctime
    r = cli("why", copy, "0")
    assert r.code == 65 and "content_sha256" in r.err and r.out == ""


def test_a_published_feature_cache_record_is_traced_to_its_bytes_inside_a_tar_shard(cli, feature_cache, tmp_path):
    from warpdata.registry.store import Store

    store = tmp_path / "store"
    assert cli("publish", "ws/fc", "--from", feature_cache, "--store", store).code == 0
    r = cli("why", "ws/fc", "d1/group_000/00002.jpg", "--store", store, "--json")
    assert r.code == 0, r.err
    d = r.json()
    local = cli("why", feature_cache, "d1/group_000/00002.jpg", "--json").json()
    assert d["encoder"] == local["encoder"] and d["row"]["table"] == "records"
    loc = d["location"]
    assert {k: loc[k] for k in local["location"]} == local["location"]
    tar = Store(store).get_blob(loc["blob_sha256"])
    record = (feature_cache / loc["shard"]).read_bytes()[loc["offset"]:loc["offset"] + loc["record_bytes"]]
    assert tar[loc["blob_offset"]:loc["blob_offset"] + loc["record_bytes"]] == record


@pytest.mark.s3
def test_a_warehouse_built_on_s3_is_traced_there_without_reading_a_shard(cli, s3, coco_warehouse, tmp_path,
                                                                         monkeypatch):
    from support.warehouses import built_on_s3

    url = built_on_s3(cli, s3, coco_warehouse, tmp_path, monkeypatch)
    assert url.startswith("s3://")
    s3.reset_counts()
    d = cli("why", url, "images/img_00003.jpg", "--json")
    assert d.code == 0, d.err
    got = d.json()
    assert got["source"]["sha256"] == sha(coco_warehouse.parent.parent / "coco" / "images/img_00003.jpg")
    assert got["label"]["sha256"] == sha(coco_warehouse.parent.parent / "coco" / "annotations.json")
    assert got["location"] == cli("why", coco_warehouse, "images/img_00003.jpg", "--json").json()["location"]
    assert not [q for q in s3.requests("GET") if q["key"].endswith(".twh1")]  # no shard byte read
    r = cli("why", url.rsplit("/", 1)[0] + "/v20000101-000000000000", "0")
    assert r.code == 66 and "manifest.json" in r.err


def test_a_quarantined_key_of_a_published_warehouse_answers_with_its_reason(cli, coco_warehouse, tmp_path):
    # review finding: the published path looked only in the samples table and said "no row with
    # key" (exit 66), though the version carries the warehouse's quarantine table
    store = tmp_path / "store"
    assert cli("publish", "ws/wh", "--from", coco_warehouse, "--store", store, "-q").code == 0
    local = cli("why", coco_warehouse, "images/img_00002.jpg", "--json").json()
    r = cli("why", "ws/wh", "images/img_00002.jpg", "--store", store, "--json")
    assert r.code == 0, r.err
    got = r.json()
    assert got["status"] == "quarantined" and got["key"] == "images/img_00002.jpg"
    assert got["validation"] == local["validation"] and got["label"] == local["label"]
    assert cli("why", "ws/wh", "images/nope.jpg", "--store", store).code == 66


@pytest.mark.parametrize("side", ["samples", "sources", "quarantine"])
def test_a_damaged_side_table_is_a_data_error_in_why_and_diff(cli, coco_warehouse, tmp_path, side):
    # review finding: a truncated side table surfaced as ArrowInvalid, exit 70
    import shutil

    copy = tmp_path / coco_warehouse.name
    shutil.copytree(coco_warehouse, copy)
    path = copy / f"{side}.parquet"
    path.write_bytes(path.read_bytes()[:300])
    sample = "images/img_00002.jpg" if side == "quarantine" else "0"  # img_00002 is quarantined
    r = cli("why", copy, sample)
    # checked against the manifest's side_tables before it is parsed (docs/formats/twh1.md)
    assert r.code == 65 and f"{path}: side table {side}.parquet does not match" in r.err and "hint:" in r.err, r.err
    if side != "quarantine":  # diff reads the samples and sources tables
        r = cli("diff", coco_warehouse, copy)
        assert r.code == 65 and f"{path}: side table {side}.parquet does not match" in r.err, r.err


def test_a_negative_index_is_told_indexes_count_from_0(cli):
    # issue 40: `warp why DS -1` answered "No such option: -1" (Click reads -1 as an option)
    said = ("-1 is not an option: sample indexes count from 0 (the first sample is 0, the last of N is N-1), so "
            "none is negative; give an index from 0, or a key (one that starts with '-' goes after '--')")
    r = cli("why", "vision/coco", "-1")
    assert (r.code, r.out) == (2, "")
    assert r.err == f"Usage: warp why [OPTIONS] {{TARGET}} {{INDEX|KEY}}\nTry 'warp why -h' for help.\n\nError: {said}\n"
    r = cli("--json", "why", "vision/coco", "-1")
    assert r.code == 2 and r.json() == {"error": "usage", "exit_code": 2, "message": said}
    r = cli("why", "vision/coco", "3", "--bogus")  # other unknown options keep Click's answer
    assert r.code == 2 and r.out == "" and r.err.endswith("\nError: No such option: --bogus\n")
