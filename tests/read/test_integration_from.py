"""Integration: `warp etl` outputs published with `warp publish --from` become queryable tables.

A tensor warehouse writes samples.parquet (one row per written sample) and a
feature cache records.parquet; --from publishes every top-level Parquet file
as a table named after its stem, plus "files" bound to the artifact; the
per-sample table is the dataset's default table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.warehouses import warehouse_config
from warpdata.etl.quarantine import Thresholds
from warpdata.features.writer import CacheSpec, build_cache
from warpdata.read.dataset import dataset
from warpdata.registry.store import Store
from warpdata.sampledata.detection import generate
from warpdata.warehouse.reader import Warehouse

WH_TABLES = {"files", "samples", "sources", "summary", "reasons", "quarantine"}


def etl(cli, cfg) -> dict:
    r = cli("etl", "--config", str(cfg), "--json")
    assert r.code == 0, r.err
    return r.json()


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    d = tmp_path_factory.mktemp("det") / "coco"
    generate(d, count=14, seed=7, min_side=64, max_side=140)
    return d


def test_samples_parquet_matches_the_reader_and_is_deterministic(cli, coco, tmp_path):
    a = etl(cli, warehouse_config(coco, tmp_path / "a", 1))
    b = etl(cli, warehouse_config(coco, tmp_path / "b", 3))
    assert a["version"] == b["version"]
    pa_, pb = Path(a["path"]) / "samples.parquet", Path(b["path"]) / "samples.parquet"
    assert pa_.read_bytes() == pb.read_bytes()  # byte-identical across worker counts
    assert not list(Path(a["path"]).glob(".warp-tmp*"))
    rows = pq.read_table(pa_).to_pylist()
    wh = Warehouse(a["path"], allow_invalid=True)
    assert len(rows) == len(wh) == a["samples"]
    assert json.loads((Path(a["path"]) / "manifest.json").read_text())["files"]["samples"] == "samples.parquet"
    shard_ids = {s["id"]: i for i, s in enumerate(wh.manifest["shards"])}
    for i, r in enumerate(rows):
        s = wh[i]
        assert r["sample"] == i and r["key"] == s.key and r["run_id"] == s.run_id and r["frame_id"] == s.frame_id
        assert r["n_boxes"] == s.num_boxes and r["class_ids"] == [int(c) for c in s.classes[: s.num_boxes]]
        assert wh.offsets[shard_ids[r["shard_id"]]] + r["shard_index"] == i
        assert (coco / r["source_path"]).is_file() and not r["source_path"].startswith("/")
    # truncated JPEGs fail the full decode: they are quarantined, never listed
    quarantined = {q["sample_id"] for q in pq.read_table(Path(a["path"]) / "quarantine.parquet").to_pylist()}
    assert quarantined and not quarantined & {r["key"] for r in rows}


def test_publish_from_warehouse_gives_queryable_tables(cli, coco, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    res = etl(cli, warehouse_config(coco, tmp_path / "wh", 2))
    r = cli("publish", "vision/coco", "--from", res["path"], "--json")
    assert r.code == 0, r.err
    m = Store(tmp_path / "store").resolve("vision/coco")
    assert set(m.tables) == WH_TABLES and set(m.artifacts) == {"tensor-warehouse"}
    assert [(b.table, b.column, b.artifact) for b in m.bindings] == [("files", "path", "tensor-warehouse")]
    assert m.metadata["default_table"] == "samples"
    assert m.tables["samples"].row_count == res["samples"]

    local = pq.read_table(Path(res["path"]) / "samples.parquet").to_pylist()
    r = cli("stream", "vision/coco", "--table", "samples", "--filter", "n_boxes >= 2", "--columns", "key,n_boxes")
    assert r.code == 0, r.err
    got = [json.loads(x) for x in r.out.splitlines()]
    assert got == [{"key": x["key"], "n_boxes": x["n_boxes"]} for x in local if x["n_boxes"] >= 2] and got
    # no --table: the declared per-sample table
    r = cli("stream", "vision/coco", "--columns", "sample", "--limit", "3")
    assert r.code == 0, r.err
    assert [json.loads(x)["sample"] for x in r.out.splitlines()] == [0, 1, 2]
    # the files table lists members and opens them through its binding
    ds = dataset("vision/coco")
    files = next(ds.table("files").batch_dicts(100))
    refs = {ref.member: ref for ref in files["path"]}
    assert "samples.parquet" in refs and "manifest.json" in refs
    assert refs["manifest.json"].read_bytes() == (Path(res["path"]) / "manifest.json").read_bytes()


def test_publish_from_feature_cache_records_on_s3(cli, s3, tmp_path, monkeypatch):
    from PIL import Image

    src = tmp_path / "src" / "g0"
    src.mkdir(parents=True)
    for i in range(5):
        Image.new("RGB", (40 + 4 * i, 30 + 2 * i), (20 * i, 100, 50)).save(src / f"s{i}.png")
        (src / f"s{i}.txt").write_text(f"caption {i}\n")
    spec = dict(source=str(tmp_path / "src"), size=(32, 32), thresholds=Thresholds(), shard_size=2)
    a = build_cache(CacheSpec(output=str(tmp_path / "fc"), **spec), workers=1)
    b = build_cache(CacheSpec(output=str(tmp_path / "fc2"), **spec), workers=3)
    assert (tmp_path / "fc" / "records.parquet").read_bytes() == (tmp_path / "fc2" / "records.parquet").read_bytes()
    assert a.manifest == b.manifest
    rows = pq.read_table(tmp_path / "fc" / "records.parquet").to_pylist()
    assert [(r["record"], r["key"], r["caption"], r["shard"], r["shard_index"], r["height"], r["width"]) for r in rows] == \
        [(i, f"g0/s{i}.png", f"caption {i}", f"shard-{i // 2:05d}.wfs", i % 2, 30 + 2 * i, 40 + 4 * i) for i in range(5)]

    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("publish", "text/caps", "--from", str(tmp_path / "fc"), "--json")
    assert r.code == 0, r.err
    r = cli("stream", "text/caps", "--filter", "shard_index = 1", "--columns", "key,caption", "--mode", "remote")
    assert r.code == 0, r.err
    assert [json.loads(x) for x in r.out.splitlines()] == [{"key": f"g0/s{i}.png", "caption": f"caption {i}"}
                                                            for i in (1, 3)]
    # the feature cache's quarantine exports (docs/formats/feature-shard.md) are tables too, as a warehouse's
    assert sorted(dataset("text/caps", mode="remote").tables) == ["files", "quarantine", "reasons", "records",
                                                                  "summary"]
