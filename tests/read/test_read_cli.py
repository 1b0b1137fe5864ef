"""warp warm / cache / stream / ls / cat / init / inspect ws/name, in-process against a local store."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from support.datasets import make_rows, publish, write_media


@pytest.fixture
def store(tmp_path, monkeypatch):
    write_media(tmp_path / "media", 6)
    url = str(tmp_path / "store")
    m = publish(url, "ws/demo", {"main": [make_rows(300, 0, image_every=6), make_rows(200, 300, image_every=6)]},
                tmp_path, row_group_size=100, media=tmp_path / "media")
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    return m


def test_ls(cli, store):
    r = cli("ls", "ws/", "--json")
    assert r.code == 0, r.err
    d = r.json()["datasets"]
    assert [x["dataset"] for x in d] == ["ws/demo"] and d[0]["rows"] == 500 and d[0]["tables"] == ["main"]
    r = cli("ls")
    assert r.code == 0 and "ws/demo" in r.out and store.version_hash[:12] in r.out


def test_stream_formats(cli, store):
    r = cli("stream", "ws/demo", "--columns", "id,label", "--limit", "3")
    assert r.code == 0, r.err
    rows = [json.loads(x) for x in r.out.splitlines()]
    assert rows == [{"id": i, "label": f"label-{i}"} for i in range(3)]
    r = cli("stream", "ws/demo", "--columns", "id", "--filter", "id >= 495", "--format", "csv")
    assert r.code == 0, r.err
    assert [int(x["id"]) for x in csv.DictReader(io.StringIO(r.out))] == list(range(495, 500))
    r = cli("stream", "ws/demo", "--columns", "id", "--shard", "1/2")
    assert r.code == 0 and len(r.out.splitlines()) == 250
    bad = cli("stream", "ws/demo", "--columns", "nope")
    assert bad.code == 2 and "no column" in bad.err and bad.out == ""


def test_stream_shard_is_exact_unless_pad(cli, store):
    """500 rows over 8 ranks: 500 rows in all, each once (it used to be 504, silently)."""
    ids = []
    for r in range(8):
        res = cli("stream", "ws/demo", "--columns", "id", "--shard", f"{r}/8")
        assert res.code == 0, res.err
        assert "repeat" not in res.err
        ids += [json.loads(x)["id"] for x in res.out.splitlines()]
    assert sorted(ids) == list(range(500))
    padded, notes = [], []
    for r in range(8):
        res = cli("stream", "ws/demo", "--columns", "id", "--shard", f"{r}/8", "--pad")
        assert res.code == 0, res.err
        rows = [json.loads(x)["id"] for x in res.out.splitlines()]
        assert len(rows) == 63
        padded += rows
        notes.append(res.err)
    assert len(padded) == 504 and set(padded) == set(range(500))
    assert "4 of them repeated" in notes[7] and "4 repeats over all ranks" in notes[7]
    assert "repeated" not in notes[0]
    r = cli("stream", "ws/demo", "--pad")
    assert r.code == 2 and "--pad only applies with --shard" in r.err


def test_stream_arrow_ipc_to_a_pipe(store, tmp_path):
    env = {**os.environ}
    p = subprocess.run([sys.executable, "-m", "warpdata", "stream", "ws/demo", "--format", "arrow",
                        "--columns", "id,x", "--batch-size", "64"], capture_output=True, env=env, check=True)
    t = pa.ipc.open_stream(p.stdout).read_all()
    assert t.num_rows == 500 and t.column("id").to_pylist() == list(range(500))


def test_cat_writes_exact_bytes(store, tmp_path):
    p = subprocess.run([sys.executable, "-m", "warpdata", "cat", "ws/demo", "--artifact", "media",
                        "--ref", "img/0002.png"], capture_output=True, check=True)
    assert p.stdout == (tmp_path / "media" / "img" / "0002.png").read_bytes()
    p = subprocess.run([sys.executable, "-m", "warpdata", "cat", "ws/demo", "--artifact", "media",
                        "--ref", "img/0002.pgn"], capture_output=True)
    assert p.returncode == 66 and b"no member" in p.stderr and p.stdout == b""


def test_warm_then_cache_commands(cli, store, tmp_path):
    r = cli("warm", "ws/demo", "--json")
    assert r.code == 0, r.err
    w = r.json()
    assert w["fetched"] == w["blobs"] == 2 + len(store.artifacts["media"].shards) + 1
    assert cli("warm", "ws/demo", "--json").json()["fetched"] == 0
    s = cli("cache", "stats", "--json").json()
    assert s["blobs"] == w["blobs"] and s["bytes"] == w["fetched_bytes"] and s["datasets"] == 1
    assert cli("cache", "verify").code == 0
    blob = next((tmp_path / "cache" / "blobs").rglob("*"), None)
    victim = next(p for p in (tmp_path / "cache" / "blobs").rglob("*") if p.is_file())
    assert blob is not None
    victim.write_bytes(b"corrupt")
    r = cli("cache", "verify", "--json")
    assert r.code == 1 and r.json()["corrupt"] == [victim.name]
    r = cli("cache", "gc", "--limit", "1KB", "--json")
    assert r.code == 0 and r.json()["evicted"] >= 1
    assert cli("cache", "stats", "--json").json()["bytes"] <= 1000
    assert cli("cache", "clear").code == 0
    assert cli("cache", "stats", "--json").json()["blobs"] == 0
    r = cli("warm", "ws/demo", "--tables", "main", "--shards", "0:1", "--no-artifacts", "--json")
    assert r.json()["fetched"] == 1
    assert cli("warm", "ws/demo", "--shards", "x").code == 2


def test_cache_gc_refuses_a_size_without_a_unit(cli, store, tmp_path):
    """`--limit 20` used to mean 20 bytes and evict the whole cache."""
    assert cli("warm", "ws/demo").code == 0
    before = cli("cache", "stats", "--json").json()
    assert before["blobs"] > 0
    for bare in ("20", "0.5", " 3 "):
        r = cli("cache", "gc", "--limit", bare)
        assert r.code == 2, r.err
        assert "has no unit" in r.err and f"say {bare.strip()}GB" in r.err
    assert cli("cache", "stats", "--json").json() == before  # nothing evicted
    r = cli("cache", "gc", "--limit", "20 parsecs")
    assert r.code == 2 and "is not a size" in r.err
    r = cli("cache", "gc", "--limit", "20GB", "--json")
    assert r.code == 0 and r.json()["evicted"] == 0 and r.json()["limit_bytes"] == 20 * 10**9
    assert "bare number is refused" in cli("cache", "--help").out


def test_publish_shard_size_needs_a_unit(cli, tmp_path):
    r = cli("publish", "ws/x", "--table", f"main={tmp_path}/none.parquet", "--shard-size", "4096")
    assert r.code == 2 and "--shard-size 4096 has no unit" in r.err


def test_init_generates_a_loader_whose_smoke_test_runs(cli, store, tmp_path):
    out = tmp_path / "loader.py"
    r = cli("init", "ws/demo", "--out", str(out))
    assert r.code == 0, r.err
    p = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Batch 2: 10 rows" in p.stdout and "Smoke test passed!" in p.stdout
    assert "image: ImageRef(" in p.stdout
    assert cli("init", "ws/demo", "--out", str(out)).code == 2  # no silent overwrite


def test_inspect_dataset(cli, store):
    r = cli("inspect", "ws/demo", "--json", "--head", "2")
    assert r.code == 0, r.err
    d = r.json()
    assert d["kind"] == "dataset" and d["version"] == store.version_hash
    assert [t["rows"] for t in d["tables"]["tables"]] == [500]
    assert {b["column"] for b in d["tables"]["bindings"]} == {"image", "audio"}
    assert [row["id"] for row in d["tables"]["head of main"]] == [0, 1]
    r = cli("inspect", "ws/nothere")
    assert r.code == 66 and "ws/nothere" in r.err


def test_local_mode_without_warm_fails_fast(cli, store):
    r = cli("stream", "ws/demo", "--mode", "local")
    assert r.code == 66 and "warp warm ws/demo" in r.err


def test_dataset_without_latest_is_named_as_such(cli, tmp_path, monkeypatch):
    """After publish --no-set-latest, `stream` said "did you mean vision/dry?" about vision/dry itself."""
    import pyarrow.parquet as pq

    url = str(tmp_path / "store2")
    monkeypatch.setenv("WARP_STORE", url)
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "d.parquet")
    r = cli("publish", "vision/dry", "--table", f"main={tmp_path / 'd.parquet'}", "--no-set-latest", "--json")
    assert r.code == 0, r.err
    vh = r.json()["version_hash"]
    r = cli("stream", "vision/dry")
    assert r.code == 66
    assert "did you mean" not in r.err
    assert "has 1 version(s)" in r.err and "no latest" in r.err and f"--version {vh[:12]}" in r.err
    r = cli("stream", "vision/dry", "--version", vh[:12])
    assert r.code == 0 and len(r.out.splitlines()) == 3
    r = cli("ls")
    assert r.code == 0 and "(no latest)" in r.out and vh[:12] in r.out
    assert f"--version {vh[:12]}" in r.err
    d = cli("ls", "--json").json()["datasets"]
    assert d[0]["version"] is None and d[0]["versions"] == [vh]
    r = cli("stream", "vision/dyr")  # a real typo still gets the suggestion
    assert r.code == 66 and "did you mean vision/dry?" in r.err


def test_store_folder_that_does_not_exist(cli, tmp_path, monkeypatch):
    """WARP_STORE pointing at a missing folder used to print "no datasets" (exit 0)."""
    missing = tmp_path / "stroe"
    monkeypatch.setenv("WARP_STORE", str(missing))
    r = cli("ls")
    assert r.code == 66 and f"store folder {missing} does not exist" in r.err and "WARP_STORE" in r.err
    r = cli("ls", "--store", str(tmp_path / "nope"), "--json")
    assert r.code == 66 and r.json()["error"] == "missing-input"
    r = cli("stream", "ws/demo")
    assert r.code == 66 and "does not exist" in r.err and "did you mean" not in r.err
    (tmp_path / "afile").write_text("x")
    r = cli("ls", "--store", str(tmp_path / "afile"))
    assert r.code == 66 and "is not a folder" in r.err
    assert not missing.exists()  # reading created nothing
    monkeypatch.delenv("WARP_STORE")  # the default store of a fresh install is just empty
    r = cli("ls")
    assert r.code == 0 and "nothing has been published" in r.err


def test_common_mistakes_get_a_cause_and_a_hint(cli, store):
    """`ls ws/name` listed nothing; `--columns ''` streamed everything; `--shard 0/0` spoke of 0..-1."""
    r = cli("ls", "ws/demo", "--json")
    assert r.code == 0 and [d["dataset"] for d in r.json()["datasets"]] == ["ws/demo"]
    r = cli("ls", "ws/dmeo")
    assert r.code == 66 and "dataset ws/dmeo is not in store" in r.err and "did you mean ws/demo?" in r.err
    r = cli("ls", "nows/")
    assert r.code == 66 and "workspace nows/ is not in store" in r.err and "did you mean ws?" in r.err
    r = cli("ls", "text/")
    assert r.code == 66 and "workspaces: ws" in r.err
    r = cli("stream", "ws/demo", "--columns", "")
    assert r.code == 2 and "names no column" in r.err and r.out == ""
    r = cli("stream", "ws/demo", "--shard", "0/0")
    assert r.code == 2 and "world size must be at least 1" in r.err


def test_info(cli, store):
    r = cli("info", "ws/demo")
    assert r.code == 0 and r.err == "", r.err
    lines = r.out.splitlines()
    assert lines[0] == "dataset:      ws/demo" and lines[1] == f"version:      {store.version_hash}"
    assert "rows:         500" in lines
    assert any(ln.split()[:3] == ["main", "500", "2"] for ln in lines)  # table, rows, shards
    assert any(ln.split()[:2] == ["media", "tar_shards"] for ln in lines)
    assert any(ln.split() == ["main", "image", "media", "image"] for ln in lines)
    d = cli("info", "ws/demo", "--json").json()
    assert d["dataset"] == "ws/demo" and d["version"] == store.version_hash and d["rows"] == 500
    assert d["format_version"] == 2  # published without Arrow schemas: info needs none
    assert d["tables"] == [{"name": "main", "rows": 500, "shards": 2, "bytes": store.tables["main"].byte_size,
                            "columns": 6, "default": True}]
    assert d["artifacts"][0]["name"] == "media" and d["artifacts"][0]["members"] == 9
    assert {(b["column"], b["ref_type"]) for b in d["bindings"]} == {("image", "image"), ("audio", "audio")}
    r = cli("info", "ws/nothere", "--json")
    assert r.code == 66 and r.json()["error"] == "dataset-not-found" and "ws/nothere" in r.err


def test_schema(cli, store):
    r = cli("schema", "ws/demo")
    assert r.code == 0 and r.err == "", r.err
    rows = [ln.split() for ln in r.out.splitlines()]
    assert rows[0] == ["column", "type", "nullable", "bound", "to"]
    assert rows[1] == ["id", "int64", "yes"] and rows[4] == ["payload", "binary", "yes"]
    assert rows[5] == ["image", "string", "yes", "media", "(image)"]
    d = cli("schema", "ws/demo", "--json").json()
    assert d["source"] == "footer" and d["rows"] == 500 and d["table"] == "main"
    assert [f["name"] for f in d["fields"]] == ["id", "x", "label", "payload", "image", "audio"]
    assert d["fields"][5] == {"name": "audio", "type": "string", "nullable": True, "artifact": "media",
                              "ref_type": "audio"}
    r = cli("schema", "ws/demo", "--table", "mian")
    assert r.code == 66 and "no table 'mian'" in r.err and "did you mean 'main'?" in r.err and r.out == ""


def test_head(cli, store):
    r = cli("head", "ws/demo", "-n", "3", "--columns", "id,label,payload")
    assert r.code == 0 and r.err == "", r.err
    assert [ln.split() for ln in r.out.splitlines()] == [
        ["id", "label", "payload"], ["0", "label-0", "<100", "bytes>"], ["1", "label-1", "<100", "bytes>"],
        ["2", "label-2", "<100", "bytes>"]]
    d = cli("head", "ws/demo", "--json").json()
    assert d["columns"] == ["id", "x", "label", "payload", "image", "audio"] and len(d["rows"]) == 5
    import base64

    from support.datasets import make_rows
    want = make_rows(5, image_every=6).to_pylist()
    assert [base64.b64decode(row["payload"]) for row in d["rows"]] == [w["payload"] for w in want]
    assert d["rows"][4]["image"] == "img/0004.png"
    assert cli("head", "ws/demo", "-n", "0", "--json").json()["rows"] == []
    r = cli("head", "ws/demo", "-n", "-1")
    assert r.code == 2 and r.out == "" and "-n" in r.err
    r = cli("head", "ws/demo", "--columns", "nope")
    assert r.code == 2 and "no column 'nope'" in r.err


def test_info_schema_head_of_a_published_format_4_version(cli, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store4"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache4"))
    t = pa.table({"id": pa.array(range(1000), pa.int32()), "label": [f"l{i % 3}" for i in range(1000)],
                  "vec": pa.array([[float(i)] * 3 for i in range(1000)], pa.list_(pa.float32(), 3))})
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=250)
    assert cli("publish", "ws/four", "--table", f"main={tmp_path / 't.parquet'}", "-q").code == 0
    d = cli("info", "ws/four", "--json").json()
    assert d["format_version"] == 4 and d["tables"][0]["rows"] == 1000 and d["tables"][0]["columns"] == 3
    s = cli("schema", "ws/four", "--json").json()
    assert s["source"] == "manifest"
    assert [f["type"] for f in s["fields"]] == [str(x) for x in pq.ParquetFile(tmp_path / "t.parquet").schema_arrow.types]
    assert s["fields"][2]["type"].startswith("fixed_size_list<")
    h = cli("head", "ws/four", "-n", "2", "--json").json()
    assert h["rows"] == [{"id": 0, "label": "l0", "vec": [0.0, 0.0, 0.0]}, {"id": 1, "label": "l1", "vec": [1.0, 1.0, 1.0]}]
