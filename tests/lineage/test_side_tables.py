"""Side tables sealed into the manifest (issue 36, "unchecked side data"): a warehouse's
``samples.parquet`` / ``sources.parquet`` and a feature cache's ``records.parquet`` are recorded by
SHA-256 and size in ``side_tables`` (docs/formats/twh1.md, "Manifest"; docs/formats/feature-shard.md,
"Cache manifest"). An edited one, still a valid Parquet file, makes `warp why` exit 65 naming the
file and both hashes instead of answering from it, and `warp inspect --verify` exit 1."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def rewrite(path: Path, column: str, row: int, value) -> None:
    """Replace one cell with pyarrow, keeping a well-formed Parquet file (row groups as `warp etl` cuts them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    col = t.column(column).to_pylist()
    col[row] = value
    t = t.set_column(t.schema.get_field_index(column), column, pa.array(col, t.schema.field(column).type))
    pq.write_table(t, path, compression="zstd", row_group_size=16384)


@pytest.fixture
def copy(coco_warehouse, tmp_path) -> Path:
    d = tmp_path / coco_warehouse.name
    shutil.copytree(coco_warehouse, d)
    return d


def test_the_manifest_records_every_side_table_but_metrics(coco_warehouse):
    doc = json.loads((coco_warehouse / "manifest.json").read_bytes())
    side = doc["side_tables"]
    assert sorted(side) == sorted(n for k, n in doc["files"].items() if k != "metrics")
    assert {"samples.parquet", "sources.parquet", "quarantine.parquet"} <= set(side)
    for name, e in side.items():
        assert e == {"sha256": sha(coco_warehouse / name), "size_bytes": (coco_warehouse / name).stat().st_size}


@pytest.mark.parametrize(("name", "column", "value"), [("samples.parquet", "class_ids", [7]),
                                                      ("sources.parquet", "sha256", "0" * 64)])
def test_an_edited_side_table_is_refused_by_why_and_inspect_verify(cli, coco_warehouse, copy, name, column, value):
    path = copy / name
    want = json.loads((copy / "manifest.json").read_bytes())["side_tables"][name]["sha256"]
    r = cli("why", copy, "0", "--json")
    assert r.code == 0, r.err  # checked once: the file is stamped in the cache
    before = r.json()
    rewrite(path, column, 0, value)
    got = sha(path)
    assert got != want
    r = cli("why", copy, "0")
    assert (r.code, r.out) == (65, ""), (r.code, r.out, r.err)
    assert f"{path}: side table {name} does not match" in r.err and want in r.err and got in r.err
    assert "hint: rebuild it with 'warp etl'" in r.err
    r = cli("--json", "why", copy, "0")
    assert r.code == 65 and r.json()["error"] == "side-table-mismatch"
    r = cli("inspect", "--verify", copy)
    assert r.code == 1 and f"side table {name} does not match" in r.out + r.err and got in r.out + r.err
    r = cli("diff", coco_warehouse, copy)  # diff reads both side tables whole: checked too
    assert r.code == 65 and f"{path}: side table {name} does not match" in r.err, (r.code, r.err)
    # the damage is the only thing wrong: the original bytes answer as before
    shutil.copy(coco_warehouse / name, path)
    r = cli("why", copy, "0", "--json")
    assert r.code == 0 and r.json() == before, r.err


def test_an_old_manifest_without_side_tables_is_read_unchecked(cli, copy):
    from warpdata.core.canonical import seal

    m = copy / "manifest.json"
    doc = json.loads(m.read_bytes())
    del doc["side_tables"]
    m.write_text(json.dumps(seal(doc)))
    rewrite(copy / "sources.parquet", "size", 0, 1)  # nothing records it: answered as read
    r = cli("why", copy, "images/img_00000.jpg", "--json")
    assert r.code == 0, r.err
    r = cli("inspect", "--verify", copy)
    assert r.code == 0 and "not recorded" in r.out, (r.code, r.out, r.err)


def test_warp_etl_rebuilds_a_version_whose_side_table_was_edited(cli, coco_warehouse, tmp_path):
    from support.warehouses import coco_config

    root = coco_warehouse.parent.parent / "coco"
    out = tmp_path / "wh"
    cfg = coco_config(root, out, name="again.toml", labels="annotations.json")
    assert cli("-q", "etl", "--config", cfg).code == 0
    v = next(out.glob("v*"))
    good = sha(v / "samples.parquet")
    rewrite(v / "samples.parquet", "n_boxes", 0, 99)
    assert cli("-q", "etl", "--config", cfg).code == 0
    v = next(out.glob("v*"))
    assert sha(v / "samples.parquet") == good
    assert cli("inspect", "--verify", v).code == 0


def test_publish_from_refuses_an_edited_side_table(cli, copy, tmp_path):
    path = copy / "samples.parquet"
    rewrite(path, "n_boxes", 0, 99)
    r = cli("publish", "ws/wh", "--from", copy, "--store", tmp_path / "store")
    assert r.code == 65 and f"{path}: side table samples.parquet does not match" in r.err, (r.code, r.err)
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("*.parquet"))


def test_a_feature_cache_records_table_is_checked(cli, feature_cache, tmp_path):
    d = tmp_path / "fc"
    shutil.copytree(feature_cache, d)
    doc = json.loads((d / "manifest.json").read_bytes())
    assert {"records.parquet", "keys.txt", "quarantine.jsonl", "quarantine.parquet"} <= set(doc["side_tables"])
    assert cli("why", d, "0").code == 0
    assert cli("inspect", "--verify", d).code == 0
    path = d / "records.parquet"
    rewrite(path, "caption", 0, "a different caption")
    r = cli("why", d, "0")
    assert r.code == 65 and f"{path}: side table records.parquet does not match" in r.err, (r.code, r.err)
    assert doc["side_tables"]["records.parquet"]["sha256"] in r.err and sha(path) in r.err
    r = cli("inspect", "--verify", d)
    assert r.code == 1 and "side table records.parquet does not match" in r.out + r.err
    (d / "keys.txt").write_text("")
    r = cli("inspect", "--verify", d)
    assert r.code == 1 and "side table keys.txt does not match" in r.out + r.err


@pytest.mark.s3
def test_a_side_table_edited_on_s3_is_refused_from_the_downloaded_bytes(cli, s3, coco_warehouse, tmp_path,
                                                                         monkeypatch):
    from support.warehouses import built_on_s3

    url = built_on_s3(cli, s3, coco_warehouse, tmp_path, monkeypatch)
    key = url.removeprefix(f"s3://{s3.bucket}/") + "/samples.parquet"
    s3.reset_counts()
    r = cli("why", url, "0", "--json")
    assert r.code == 0, r.err
    good = r.json()
    # read whole once, into the blob cache under the SHA-256 the manifest records; the Parquet
    # reader reads that checked copy, and a second call finds it there: no GET of the object
    assert len([q for q in s3.requests("GET") if q["key"] == key]) == 1
    s3.reset_counts()
    assert cli("why", url, "0", "--json").json() == good
    assert not [q for q in s3.requests("GET") if q["key"] == key]

    local = tmp_path / "samples.parquet"
    local.write_bytes(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    rewrite(local, "class_ids", 0, [7])
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=local.read_bytes())
    # the cached copy is the sealed one: the answer stays the writer's, never the edit's
    assert cli("why", url, "0", "--json").json() == good
    # a machine without it downloads the edited bytes and refuses them
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache2"))
    r = cli("why", url, "0")
    assert r.code == 65 and f"{url}/samples.parquet: side table samples.parquet does not match" in r.err, r.err
    assert sha(local) in r.err
    assert not list((tmp_path / "cache2").rglob(sha(local)))  # the edited bytes are not kept


def test_a_published_samples_table_that_is_not_the_sealed_side_table_is_refused(cli, copy, tmp_path, monkeypatch):
    # a version published from an edited warehouse by a warp that did not check (simulated by
    # switching publish's check off): the samples table's blob is not the side table the sealed
    # warehouse manifest records, so `warp why` refuses it instead of answering from it
    from warpdata.core import sidetables

    store = tmp_path / "store"
    assert cli("publish", "ws/ok", "--from", copy, "--store", store, "-q").code == 0
    r = cli("why", "ws/ok", "0", "--store", store, "--json")
    assert r.code == 0, r.err
    rewrite(copy / "samples.parquet", "class_ids", 0, [7])
    monkeypatch.setattr(sidetables, "check_all", lambda *a, **k: None)
    assert cli("publish", "ws/bad", "--from", copy, "--store", store, "-q").code == 0
    monkeypatch.undo()
    r = cli("why", "ws/bad", "0", "--store", store)
    assert r.code == 65 and "table samples" in r.err and sha(copy / "samples.parquet") in r.err, (r.code, r.err)


def test_a_published_records_table_that_is_not_the_sealed_side_file_is_refused(cli, feature_cache, tmp_path,
                                                                                monkeypatch):
    from warpdata.core import sidetables

    d = tmp_path / "fc"
    shutil.copytree(feature_cache, d)
    rewrite(d / "records.parquet", "caption", 0, "a different caption")
    monkeypatch.setattr(sidetables, "check_all", lambda *a, **k: None)  # a publisher that did not check
    store = tmp_path / "store"
    assert cli("publish", "ws/fc", "--from", d, "--store", store, "-q").code == 0
    monkeypatch.undo()
    r = cli("why", "ws/fc", "0", "--store", store)
    assert r.code == 65 and "table records" in r.err and sha(d / "records.parquet") in r.err, (r.code, r.err)
    r = cli("publish", "ws/fc2", "--from", d, "--store", store)  # publish itself checks
    assert r.code == 65 and "side table records.parquet does not match" in r.err, (r.code, r.err)
