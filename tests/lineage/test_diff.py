"""`warp diff`: rows by key and members by content, reading only what changed (docs/lineage.md)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.store import Store


def write_shards(d: Path, n_shards: int, rows: int, edit=None) -> None:
    """``n_shards`` Parquet files of ``rows`` rows (key, value); ``edit(shard, rows)`` may change one."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for s in range(n_shards):
        recs = [{"key": f"k{s:05d}-{i:03d}", "value": s * rows + i, "tag": "a"} for i in range(rows)]
        if edit:
            recs = edit(s, recs)
        pq.write_table(pa.Table.from_pylist(recs), d / f"part-{s:05d}.parquet")


def edit_one_shard(s: int, recs: list[dict]) -> list[dict]:
    if s != 7:
        return recs
    recs = [dict(r) for r in recs]
    recs[0]["value"] = -1  # changed
    recs[1]["tag"] = "b"  # changed
    del recs[2]  # removed
    recs.append({"key": "k00007-new", "value": 0, "tag": "a"})  # added
    return recs


def publish_two(tmp_path: Path, store: Store, n_shards: int, rows: int, artifact: bool = False):
    def req(d):
        r = PublishRequest("ws/d", tables={"main": [str(d / "*.parquet")]})
        if artifact:
            r.artifacts = {"files": str(tmp_path / "art")}
        return r

    if artifact:
        (tmp_path / "art").mkdir()
        for i in range(6):
            (tmp_path / "art" / f"f{i}.bin").write_bytes(bytes([i]) * (300 << 10))  # each its own tar shard
    write_shards(tmp_path / "v1", n_shards, rows)
    v1 = publish(req(tmp_path / "v1"), store=store).version_hash
    write_shards(tmp_path / "v2", n_shards, rows, edit_one_shard)
    if artifact:
        (tmp_path / "art" / "f2.bin").write_bytes(b"\x09" * (300 << 10))
        (tmp_path / "art" / "f5.bin").unlink()
        (tmp_path / "art" / "g.bin").write_bytes(b"new")
    v2 = publish(req(tmp_path / "v2"), store=store).version_hash
    return v1, v2


def test_rows_added_removed_and_changed_by_key_on_a_local_store(cli, tmp_path):
    store = Store(tmp_path / "store")
    v1, v2 = publish_two(tmp_path, store, 12, 20, artifact=True)
    r = cli("diff", "ws/d", "--from", v1[:12], "--rows", "--store", tmp_path / "store")
    assert r.code == 1, r.err
    assert "rows +1 -1 ~2" in r.out and "members +1 -1 ~1" in r.out
    assert "+ main k00007-new" in r.out and "- main k00007-002" in r.out
    assert "~ main k00007-000" in r.out and "~ main k00007-001" in r.out
    assert "~ files f2.bin" in r.out and "- files f5.bin" in r.out and "+ files g.bin" in r.out
    assert "read " in r.err
    d = cli("diff", "ws/d", "--from", v1, "--to", v2, "--json", "--store", tmp_path / "store").json()
    main = d["tables"][0]
    assert (main["added"], main["removed"], main["changed"], main["key"]) == (1, 1, 2, "key")
    assert (main["shards_read"], main["shards_skipped"]) == (2, 22)
    assert d["same"] is False and main["added_keys"] is None  # lists only with --rows
    same = cli("diff", "ws/d", "--from", v2, "--store", tmp_path / "store", "--json")
    assert same.code == 0 and same.json()["same"] is True and same.json()["blobs_read"] == 0


def test_without_a_key_rows_are_compared_whole_and_a_key_must_be_unique(cli, tmp_path):
    store = Store(tmp_path / "store")
    for name, value in (("v1", 5), ("v2", 6)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"value": [1, 2, value], "tag": ["a", "a", "b"]}), tmp_path / name / "p.parquet")
    v1, v2 = (publish(PublishRequest("ws/nokey", tables={"main": [str(tmp_path / n / "p.parquet")]}),
                      store=store).version_hash for n in ("v1", "v2"))
    d = cli("diff", "ws/nokey", "--from", v1, "--json", "--store", tmp_path / "store")
    assert d.code == 1, d.err
    main = d.json()["tables"][0]
    assert (main["key"], main["added"], main["removed"], main["changed"]) == (None, 1, 1, 0)
    r = cli("diff", "ws/nokey", "--from", v1, "--key", "tag", "--store", tmp_path / "store")
    assert r.code == 2 and "does not identify rows" in r.err
    r = cli("diff", "ws/nokey", "--from", v1, "--key", "nope", "--store", tmp_path / "store")
    assert r.code == 2 and "nope" in r.err
    r = cli("diff", "ws/nokey", "--store", tmp_path / "store")
    assert r.code == 2 and "--from" in r.err


@pytest.mark.s3
def test_a_0_1_percent_change_on_s3_reads_0_1_percent_of_the_bytes(s3, tmp_path, monkeypatch):
    from warpdata.lineage.diff import DiffRequest, diff

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    store = Store(s3.url("warp"))
    v1, v2 = publish_two(tmp_path, store, 1000, 10)  # 10,000 rows; 4 of them change, in one shard
    s3.reset_counts()
    res = diff(DiffRequest("ws/d", from_version=v1, to_version=v2, store_url=s3.url("warp")))
    main = res.tables[0]
    assert (main.added, main.removed, main.changed) == (1, 1, 2)
    blob_gets = s3.requests("GET", "warp/blobs/")
    gets, requests = s3.count("GET"), s3.count()
    assert len(blob_gets) == 2 == res.blobs_read  # the changed shard of each version, nothing else
    ta, tb = (store.get_manifest("ws/d", v).tables["main"] for v in (v1, v2))
    changed = {s.hash for s in ta.shards} ^ {s.hash for s in tb.shards}
    assert {q["key"].rsplit("/", 1)[-1] for q in blob_gets} == changed
    assert gets == 4  # those two blobs and the two manifests (the store sends a HEAD before each)
    assert requests <= 8
    manifests = sum(len(store.get_manifest_bytes("ws/d", v)) for v in (v1, v2))
    full = sum(s.byte_size for v in (v1, v2) for s in store.get_manifest("ws/d", v).tables["main"].shards)
    assert res.bytes_total == full  # a full read: every shard of both versions
    assert res.bytes_read <= 0.0025 * full  # 2 shards of 2,000: 0.1 %
    print(f"diff of a 0.1 % change: {len(blob_gets)} blob GETs, {res.bytes_read} B of {full} B "
          f"({100 * res.bytes_read / full:.3f} %), plus {manifests} B of manifests")


def test_two_local_warehouse_versions_compare_by_sample_key_and_shard_hash(cli, coco_warehouse, tmp_path):
    import numpy as np
    from support.warehouses import coco_config
    from warpdata.cli.app import main
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

    src = coco_warehouse.parent.parent / "coco"
    copy = tmp_path / "coco"
    shutil.copytree(src, copy)
    rng = np.random.default_rng(3)
    img = copy / "images" / "img_00003.jpg"
    from PIL import Image

    w, h = Image.open(img).size
    img.write_bytes(encode_jpeg(synthetic_photo(rng, w, h)))  # same size, same boxes, new pixels
    cfg = coco_config(copy, tmp_path / "warehouse", labels="annotations.json")
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    other = next((tmp_path / "warehouse").glob("v*"))
    r = cli("diff", coco_warehouse, other, "--rows", "--json")
    assert r.code == 1, r.err
    d = r.json()
    samples = d["tables"][0]
    assert samples["changed_keys"] == ["images/img_00003.jpg"] and samples["added"] == samples["removed"] == 0
    shards = d["artifacts"][0]
    assert shards["changed"] == 1 and shards["added"] == shards["removed"] == 0
    r = cli("diff", coco_warehouse, coco_warehouse)
    assert r.code == 0 and "rows +0 -0 ~0" in r.out


def test_two_feature_caches_compare_records_by_key(cli, feature_cache, tmp_path):
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("features_golden", root / "golden/features/make_golden.py")
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    golden.make_sources(tmp_path)
    (tmp_path / "a" / "media" / "group_000" / "00002.txt").write_text("a caption written again")
    other = Path(golden.build("pixels-multi", tmp_path, workers=1, executor="local"))
    r = cli("diff", feature_cache, other, "--rows", "--json")
    assert r.code == 1, r.err
    d = r.json()
    assert d["kind"] == "feature-cache" and d["tables"][0]["table"] == "records"
    assert d["tables"][0]["changed_keys"] == ["d0/group_000/00002.jpg"]
    assert d["tables"][0]["added"] == d["tables"][0]["removed"] == 0
    assert d["artifacts"][0]["changed"] >= 1


def test_a_zarr_array_compared_with_itself_is_the_same(cli):
    root = Path(__file__).resolve().parents[1] / "golden" / "zarr"
    r = cli("diff", root / "sharded.zarr", root / "sharded.zarr", "--json")
    assert r.code == 0 and r.json()["artifacts"][0]["artifact"] == "levels"
    r = cli("diff", root / "sharded.zarr", root / "pyramid.zarr", "--json")
    assert r.code == 1 and r.json()["artifacts"][0]["status"] == "changed"


def test_a_list_valued_key_column_is_compared_not_a_crash(cli, tmp_path):
    # review finding: a key column of list values (unhashable) exited 70 with TypeError
    store = tmp_path / "store"
    t = tmp_path / "t.parquet"
    versions = []
    for keys, vals in (([[1], [2], [3]], [1, 2, 3]), ([[1], [2, 0], [3]], [1, 2, 9])):
        pq.write_table(pa.table({"key": keys, "v": vals}), t)
        r = cli("publish", "ws/lk", "--table", f"main={t}", "--store", store, "-q")
        assert r.code == 0, r.err
        versions.append(r.out.strip())
    r = cli("diff", "ws/lk", "--from", versions[0], "--store", store, "--rows", "--json")
    assert r.code == 1, r.err
    [main] = r.json()["tables"]
    assert (main["added_keys"], main["removed_keys"], main["changed_keys"]) == (["[2, 0]"], ["[2]"], ["[3]"])


def test_a_default_key_that_repeats_gets_a_hint_that_can_be_followed(cli, tmp_path):
    # review finding: the hint said "or compare whole rows by naming none", but with no --key the
    # default column (here id) is picked again, so the advice led back to the same error
    store = tmp_path / "store"
    t = tmp_path / "t.parquet"
    versions = []
    for v in (1, 2):
        pq.write_table(pa.table({"id": [1, 1, 2], "v": [v, 0, 0]}), t)
        versions.append(cli("publish", "ws/dup", "--table", f"main={t}", "--store", store, "-q").out.strip())
    r = cli("diff", "ws/dup", "--from", versions[0], "--store", store)
    assert r.code == 2 and "column 'id' does not identify rows" in r.err
    assert "naming none" not in r.err and "give a unique column with --key" in r.err


def _two_versions(cli, tmp_path: Path, tables: dict[str, list[dict]], edit) -> tuple[Path, str]:
    """Publish ``tables`` as ws/two, then with ``edit(table, rows)`` applied; (store, first version)."""
    store = tmp_path / "store"
    first = None
    for step in (0, 1):
        args = []
        for name, rows in tables.items():
            f = tmp_path / f"{name}-{step}.parquet"
            pq.write_table(pa.Table.from_pylist(edit(name, rows) if step else rows), f)
            args += ["--table", f"{name}={f}"]
        r = cli("publish", "ws/two", *args, "--store", store, "-q")
        assert r.code == 0, r.err
        first = first or r.out.strip()
    return store, first


def test_the_text_output_ends_its_table_before_the_summary(cli, tmp_path):
    # issue 40: "changedread 2 blob(s)": the summary on stderr ran into the table's last line
    store, v1 = _two_versions(cli, tmp_path, {"main": [{"key": "a", "v": 1}, {"key": "b", "v": 2}]},
                              lambda _t, rows: [rows[0], {"key": "b", "v": 3}])
    r = cli("diff", "ws/two", "--from", v1[:12], "--store", store)
    assert r.code == 1
    lines = r.out.splitlines()
    assert lines[0].startswith("ws/two: " + v1[:12] + " -> ") and lines[0].endswith(": rows +0 -0 ~1")
    assert lines[1:] == ["table  key  added  removed  changed  status", "main   key  0      0        1        changed"]
    assert r.out.endswith("changed\n")
    assert r.err.startswith("read 2 blob(s), ") and r.err.endswith(" in both versions\n") and r.err.count("\n") == 1
    # one stream for both, as a terminal or `2>&1` sees them: stdout buffered (a pipe), flushed first
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.run(f"{shlex.quote(sys.executable)} -m warpdata diff ws/two --from {v1[:12]} "
                       f"--store {shlex.quote(str(store))} 2>&1", shell=True, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stdout
    merged = p.stdout.splitlines()
    assert merged[1:3] == lines[1:3] and merged[3].startswith("read 2 blob(s), ") and len(merged) == 4


def test_two_directories_are_the_versions_so_from_and_to_are_usage_errors(cli, tmp_path):
    # issue 40: `warp diff DIR DIR --to X` ignored --to silently
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    r = cli("diff", a, b, "--to", "81be07")
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [
        f"error: --to 81be07: versions are picked for a published dataset; {a} and {b} are themselves the "
        "two versions compared",
        f"hint: drop --to (warp diff {a} {b}), or compare a published dataset's versions: "
        "warp diff WS/NAME --from V1 --to V2"]
    r = cli("diff", a, b, "--from", "3f2a9c", "--to", "81be07")
    assert r.code == 2 and r.out == "" and r.err.startswith("error: --from 3f2a9c and --to 81be07: versions are")
    assert "hint: drop --from and --to (" in r.err


def test_a_published_dataset_given_as_a_directory_is_told_about_from(cli, tmp_path):
    # issue 40: `warp diff DIR WS/NAME` said "WS/NAME: no manifest.json" (exit 66)
    a = tmp_path / "a"
    a.mkdir()
    for args in ((a, "vision/coco"), ("vision/coco@3f2a9c", a)):
        r = cli("diff", *args)
        given = str(args[1] if args[0] == a else args[0])
        assert r.code == 2 and r.out == ""
        assert r.err.splitlines() == [
            f"error: {given} is not a local directory; a published dataset is compared with one of its own "
            "versions, given by --from (and --to), not with a directory",
            "hint: warp diff vision/coco --from V1 [--to V2] (list them with 'warp ls vision/coco --versions'); "
            "two local artifacts: warp diff DIR DIR2"]
    r = cli("diff", a, tmp_path / "missing")  # neither a directory nor a dataset id: what is missing
    assert r.code == 66 and r.out == "" and f"error: {a}: no manifest.json" in r.err


def test_key_without_table_compares_the_table_that_has_the_column(cli, tmp_path):
    # issue 40: `diff --key COL` without --table failed on the first table, which lacked COL
    tables = {"labels": [{"label_id": 1, "name": "cat", "value": 0}, {"label_id": 2, "name": "dog", "value": 0}],
              "main": [{"key": "a", "value": 1}, {"key": "b", "value": 2}]}

    def edit(table, rows):
        return [rows[0], {**rows[1], "name": "wolf"}] if table == "labels" else rows

    store, v1 = _two_versions(cli, tmp_path, tables, edit)
    r = cli("diff", "ws/two", "--from", v1, "--key", "label_id", "--rows", "--store", store)
    assert r.code == 1, r.err
    lines = r.out.splitlines()
    assert lines[0].endswith(": rows +0 -0 ~1")
    assert lines[1:] == ["table   key       added  removed  changed  status",
                         "labels  label_id  0      0        1        changed", "~ labels 2"]
    assert r.err.startswith("read 2 blob(s), ")
    r = cli("diff", "ws/two", "--from", v1, "--key", "value", "--store", store)  # in both tables
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == ["error: ws/two: --key 'value' is a column of 2 tables (labels, main): say which "
                                  "with --table", "hint: e.g. --table labels --key value"]
    r = cli("diff", "ws/two", "--from", v1, "--key", "nope", "--store", store)  # in none
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == ["error: ws/two: --key 'nope' is not a column of any table",
                                  "hint: tables and their columns: labels (label_id, name, value); main (key, value)"]
    r = cli("diff", "ws/two", "--from", v1, "--key", "value", "--table", "main", "--json", "--store", store)
    assert r.code == 0 and [t["table"] for t in r.json()["tables"]] == ["main"]
