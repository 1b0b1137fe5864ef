"""`warp publish`: the transaction, idempotence, inputs, plans and errors (local store and moto S3)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.publishing.publish import DatasetBuilder, PublishRequest, parse_binding, publish
from warpdata.registry.store import Store
from warpdata.registry.tarpack import ArtifactIndex


def make_dataset(root, n_shards=3, n_files=30):
    """Parquet shards whose `image` column names files under `imgs/`."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "imgs" / "sub").mkdir(parents=True, exist_ok=True)
    names = [f"sub/{j}.jpg" if j % 2 else f"{j}.jpg" for j in range(n_files)]
    per = n_files // n_shards
    for i in range(n_shards):
        chunk = names[i * per:(i + 1) * per]
        pq.write_table(pa.table({"image": chunk, "label": list(range(len(chunk)))}), root / "data" / f"p{i}.parquet")
    for j, name in enumerate(names):
        (root / "imgs" / name).write_bytes(bytes([j % 256]) * (500 + j))
    return names


def publish_args(root, *extra):
    return ("publish", "ws/demo", "--table", f"main={root}/data/*.parquet", "--artifact", f"imgs={root}/imgs",
            "--bind", "main.image=imgs:image", "--shard-size", "8KB", *extra)


@pytest.mark.s3
def test_publish_idempotent(cli, s3, tmp_path, monkeypatch):
    """Seed §12: publishing the same version again is a no-op (real S3 protocol, counted requests)."""
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    make_dataset(tmp_path)
    r1 = cli(*publish_args(tmp_path), "--json")
    assert r1.code == 0, r1.err
    first = r1.json()
    assert first["blobs_uploaded"] == first["blobs_total"] > 4
    assert first["manifest_written"] and first["latest_moved"]
    assert s3.count("PUT", "warp/blobs/") == first["blobs_total"]

    s3.reset_counts()
    r2 = cli(*publish_args(tmp_path), "--json")
    assert r2.code == 0, r2.err
    second = r2.json()
    assert second["version_hash"] == first["version_hash"]
    assert second["blobs_uploaded"] == 0 and second["bytes_uploaded"] == 0
    assert second["already_published"] and not second["manifest_written"] and not second["latest_moved"]
    assert s3.count("PUT") == 0, s3.requests("PUT")  # not a byte written: no blob, no manifest, no pointer
    assert s3.count("GET", "warp/blobs/") == 0

    # and without the stat cache, everything is re-hashed, still nothing is uploaded
    s3.reset_counts()
    r3 = cli(*publish_args(tmp_path, "--rehash"), "--json")
    assert r3.json()["version_hash"] == first["version_hash"]
    assert s3.count("PUT") == 0

    store = Store(s3.url("warp"))
    m = store.resolve("ws/demo")
    assert m.version_hash == first["version_hash"]
    assert m.tables["main"].row_count == 30 and len(m.tables["main"].shards) == 3
    idx = ArtifactIndex.from_bytes(store.get_blob(m.artifacts["imgs"].index.hash))
    h, off, ln = idx.lookup("sub/7.jpg")
    assert store.read_range(h, off, ln) == bytes([7]) * 507
    # DuckDB reads the published Parquet straight from S3 through the same storage config
    from warpdata.core.sqlgate import connect

    con = connect(filesystem=store.config.s3fs())
    urls = [store.blob_url(s.hash) for s in m.tables["main"].shards]
    assert con.execute(f"select count(*), sum(label) from read_parquet({urls!r})").fetchone() == (30, 135)


def test_publish_local_cli_roundtrip(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    make_dataset(tmp_path)
    r = cli(*publish_args(tmp_path))
    assert r.code == 0, r.err
    version = r.out.strip()
    assert len(version) == 64 and "published ws/demo@" in r.err
    m = Store(tmp_path / "store").resolve("ws/demo")
    assert m.version_hash == version
    assert m.bindings_for("main")["image"].ref_type == "image"
    assert m.artifacts["imgs"].member_count == 30
    assert m.metadata["warp_version"] and "created_at" in m.metadata
    text = (tmp_path / "store" / "datasets" / "ws" / "demo" / "versions" / f"{version}.json").read_text()
    assert str(tmp_path) not in text  # invariant I1: no local path reaches the manifest


def test_changed_content_new_version(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    make_dataset(tmp_path)
    v1 = cli(*publish_args(tmp_path), "--json").json()
    img = tmp_path / "imgs" / "4.jpg"
    img.write_bytes(b"\xff" * img.stat().st_size)  # same size, new bytes: the stat cache must notice
    v2 = cli(*publish_args(tmp_path), "--json").json()
    assert v2["version_hash"] != v1["version_hash"]
    assert 0 < v2["blobs_uploaded"] < v2["blobs_total"]  # only the changed shard + index
    store = Store(tmp_path / "store")
    assert set(store.list_versions("ws/demo")) == {v1["version_hash"], v2["version_hash"]}
    assert store.read_latest("ws/demo").version_hash == v2["version_hash"]


def test_no_set_latest_and_dry_run(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    make_dataset(tmp_path)
    plan = cli(*publish_args(tmp_path, "--dry-run"), "--json")
    assert plan.code == 0, plan.err
    doc = plan.json()
    assert doc["dry_run"] and doc["blobs_to_upload"] == doc["blobs_total"]
    assert sum(b["byte_size"] for b in doc["plan"] if b["upload"]) == doc["bytes_to_upload"] > 0
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.json"))
    human = cli(*publish_args(tmp_path, "--dry-run"))
    assert human.code == 0 and human.out.strip().splitlines()[-1] == doc["version_hash"] and "blobs to upload" in human.err
    r = cli(*publish_args(tmp_path, "--no-set-latest"), "--json")
    assert r.json()["version_hash"] == doc["version_hash"] and r.json()["latest"] is None
    store = Store(tmp_path / "store")
    assert store.read_latest("ws/demo") is None
    assert store.has_manifest("ws/demo", doc["version_hash"])


def test_csv_and_jsonl_converted(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    (tmp_path / "a.csv").write_text("x,y\n1,a\n2,b\n")
    (tmp_path / "b.jsonl").write_text('{"x": 3, "y": "c"}\n{"x": 4, "y": "d"}\n')
    r = cli("publish", "ws/mixed", "--table", f"c={tmp_path}/a.csv", "--table", f"j={tmp_path}/b.jsonl", "--json")
    assert r.code == 0, r.err
    store = Store(tmp_path / "store")
    m = store.resolve("ws/mixed")
    assert m.tables["c"].row_count == 2 and m.tables["j"].row_count == 2
    assert [f["name"] for f in m.tables["j"].schema["fields"]] == ["x", "y"]
    t = pq.read_table(store.blob_url(m.tables["c"].shards[0].hash))
    assert t.column("x").to_pylist() == [1, 2]
    again = cli("publish", "ws/mixed", "--table", f"c={tmp_path}/a.csv", "--table", f"j={tmp_path}/b.jsonl", "--json")
    assert again.json()["version_hash"] == m.version_hash and again.json()["blobs_uploaded"] == 0


def test_from_warp_artifacts(cli, tmp_path, monkeypatch):
    """--from reads any warp manifest generically: a directory with manifest.json, and a .tbl file."""
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    wh = tmp_path / "warehouse" / "v1"
    (wh / "shards").mkdir(parents=True)
    (wh / "manifest.json").write_text(json.dumps({"kind": "tensor-warehouse", "version_key": "abc123",
                                                  "shards": [{"path": "shards/000.twh"}]}))
    (wh / "shards" / "000.twh").write_bytes(b"TWH1" + os.urandom(5000))
    tbl = tmp_path / "train.tbl"
    tbl.write_bytes(b"TBL\x02" + os.urandom(3000))
    r = cli("publish", "ws/from", "--from", str(wh), "--from", str(tbl), "--json")
    assert r.code == 0, r.err
    store = Store(tmp_path / "store")
    m = store.resolve("ws/from")
    assert set(m.artifacts) == {"tensor-warehouse", "tbl"}
    assert set(m.tables) == {"files", "tbl_files"}  # the second --from's "files" gets its artifact as prefix
    files = pq.read_table(store.blob_url(m.tables["files"].shards[0].hash)).to_pylist()
    assert files == [{"path": "manifest.json", "byte_size": (wh / "manifest.json").stat().st_size},
                     {"path": "shards/000.twh", "byte_size": 5004}]
    idx = ArtifactIndex.from_bytes(store.get_blob(m.artifacts["tbl"].index.hash))
    h, off, ln = idx.lookup("train.tbl")
    assert store.read_range(h, off, ln) == tbl.read_bytes()
    assert m.metadata["sources"][0] == {"artifact": "tensor-warehouse", "kind": "tensor-warehouse", "version_key": "abc123",
                                        "tables": ["files"]}
    assert str(tmp_path) not in json.dumps(m.to_dict())


@pytest.mark.parametrize("args, code, msg", [
    (("--table", "main"), 2, "NAME=VALUE"),
    (("--bind", "main.image"), 2, "TABLE.COLUMN=ARTIFACT:TYPE"),
    (("--bind", "main.image=imgs:pdf"), 2, "ref type 'pdf'"),
    (("--table", "main={root}/nothing/*.parquet"), 66, "no file matches"),
    (("--artifact", "imgs={root}/missing"), 66, "not a directory"),
    (("--from", "{root}/missing"), 66, "does not exist"),
    (("--table", "main={root}/data/*.parquet", "--bind", "main.nope=imgs:image", "--artifact", "imgs={root}/imgs"),
     2, "no column 'nope'"),
    (("--table", "main={root}/data/*.parquet", "--bind", "main.image=other:image"), 2, "artifact 'other'"),
    ((), 2, "nothing to publish"),
])
def test_usage_errors(cli, tmp_path, monkeypatch, args, code, msg):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    make_dataset(tmp_path)
    r = cli("publish", "ws/demo", *[a.format(root=tmp_path) for a in args])
    assert r.code == code, r.err
    assert msg in r.err and "hint:" in r.err and r.out == ""


def test_bad_dataset_id_and_bad_data(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    make_dataset(tmp_path)
    r = cli("publish", "Not/Valid", "--table", f"main={tmp_path}/data/*.parquet")
    assert r.code == 2 and "workspace/name" in r.err
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    r = cli("publish", "ws/x", "--table", f"main={tmp_path}/bad.parquet", "--json")
    assert r.code == 65 and r.json()["error"] == "bad-data"
    pq.write_table(pa.table({"other": [1]}), tmp_path / "data" / "zz.parquet")
    r = cli("publish", "ws/x", "--table", f"main={tmp_path}/data/*.parquet")
    assert r.code == 65 and "share one schema" in r.err


def test_builder_memory_store(tmp_path):
    make_dataset(tmp_path)
    store = Store("memory://publish-builder")
    res = (DatasetBuilder("ws/built", store=store)
           .add_table("main", sorted(str(p) for p in (tmp_path / "data").glob("*.parquet")))
           .add_artifact("imgs", tmp_path / "imgs")
           .bind("main", "image", "imgs", "image")
           .publish())
    assert res.blobs_uploaded == len(res.blobs)
    assert store.resolve("ws/built").version_hash == res.version_hash
    assert parse_binding("t.c=a").ref_type == "file"


def test_missing_blob_is_reuploaded(tmp_path):
    """If a blob vanished from the store, a new version that names it uploads it again."""
    make_dataset(tmp_path)
    store = Store(tmp_path / "store")
    req = PublishRequest("ws/heal", tables={"main": [f"{tmp_path}/data/*.parquet"]})
    res = publish(req, store=store)
    victim = store.resolve("ws/heal").tables["main"].shards[1].hash
    os.unlink(store.blob_path(victim))
    res2 = publish(PublishRequest("ws/heal2", tables={"main": [f"{tmp_path}/data/*.parquet"]}), store=store)
    assert res2.blobs_uploaded == 1 and res.version_hash != res2.version_hash
    assert store.has_blob(victim)


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_doctor_store_checks(cli, tmp_path, monkeypatch, request, where):
    if where == "s3":
        monkeypatch.setenv("WARP_STORE", request.getfixturevalue("s3").url("warp"))
    else:
        monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    r = cli("doctor", "--only", "store", "--json")
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["store-create-only"]["status"] == "PASS", checks["store-create-only"]
    assert checks["store-cas"]["status"] == "PASS", checks["store-cas"]
    assert checks["store-credentials"]["status"] == ("PASS" if where == "s3" else "SKIP")
    if where == "s3":
        assert "env" in checks["store-credentials"]["detail"]


@pytest.mark.s3
def test_doctor_missing_bucket_fails(cli, s3, monkeypatch):
    monkeypatch.setenv("WARP_STORE", "s3://no-such-bucket-here/warp")
    r = cli("doctor", "--only", "store", "--json")
    assert r.code == 1
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["store"]["status"] == "FAIL" and "bucket" in checks["store"]["detail"]
    # the checks after it do not fail again on the same cause: they say what to fix first
    assert checks["store-create-only"]["status"] == "SKIP"
    assert checks["store-create-only"]["remedy"] == "fix the 'store' check first"


@pytest.mark.s3
def test_the_publisher_reads_its_originals_instead_of_downloading(cli, s3, tmp_path, monkeypatch):
    """After a publish to a remote store, the published files sit in the blob cache as hard links:
    reading the dataset back sends no GET for a blob. An original edited afterwards is caught by
    the cache's stamp and the published bytes are downloaded instead."""
    import warpdata

    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))  # same filesystem as the originals
    make_dataset(tmp_path)
    r = cli(*publish_args(tmp_path), "--link-cache", "--keep-layout", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["cache_linked"] == doc["blobs_total"], doc  # Parquet originals and the packed shards
    original = tmp_path / "data" / "p0.parquet"
    assert original.stat().st_nlink == 2  # one inode: nothing was copied

    s3.reset_counts()
    ds = warpdata.dataset("ws/demo")
    rows = ds.table("main").to_arrow()
    assert sorted(rows.column("label").to_pylist()) == sorted([i for i in range(10)] * 3)
    assert next(iter(ds.table("main").batch_dicts(4)))["image"][1].read_bytes() == bytes([1]) * 501
    assert s3.count("GET", "warp/blobs/") == 0, s3.requests("GET")

    # the user rewrites an original in place: the cached link no longer matches its stamp, is hashed
    # again, dropped, and the published bytes come from the store
    with open(original, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"edited")
    s3.reset_counts()
    again = warpdata.dataset("ws/demo").table("main").to_arrow()
    assert again.num_rows == 30 and sorted(again.column("label").to_pylist()) == sorted(rows.column("label").to_pylist())
    assert s3.count("GET", "warp/blobs/") >= 1
