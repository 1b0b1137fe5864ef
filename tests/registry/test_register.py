"""`warp register` / `unregister`: datasets of local files read in place, through the in-process CLI
and the library, with change detection."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from support.datasets import make_rows, publish, write_media


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    write_media(tmp_path / "media", 6)
    data = tmp_path / "data"
    data.mkdir()
    for k, part in enumerate([make_rows(300, 0, image_every=6), make_rows(200, 300, image_every=6)]):
        pq.write_table(part, data / f"part-{k}.parquet", row_group_size=100)
    time.sleep(0.15)  # older than the racy window: their stamps are trusted (see register.py)
    return tmp_path


def _register(cli, tmp, *extra):
    return cli("register", "ws/local", "--table", f"main={tmp}/data/part-0.parquet,{tmp}/data/part-1.parquet",
               "--artifact", f"media={tmp}/media", "--bind", "main.image=media:image", *extra)


def test_register_reads_in_place(cli, files):
    r = _register(cli, files, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["tables"] == {"main": {"files": 2, "rows": 500}} and doc["artifacts"]["media"]["members"] == 9
    assert doc["hashed_files"] == 11 and doc["path"].endswith("registered/ws/local.json")
    r = cli("stream", "ws/local", "--columns", "id,image", "--limit", "2")
    assert r.code == 0, r.err
    assert [json.loads(x) for x in r.out.splitlines()] == [{"id": 0, "image": "img/0000.png"},
                                                           {"id": 1, "image": "img/0001.png"}]
    ds = warpdata.dataset("ws/local")
    assert type(ds).__name__ == "RegisteredDataset" and ds.version == doc["version_hash"]
    t = ds.table("main")
    assert t.num_rows == 500
    assert t.filter("id >= 495").select(["id"]).to_arrow().column("id").to_pylist() == list(range(495, 500))
    d = next(iter(t.batch_dicts(8)))
    assert d["image"][5].read_bytes() == (files / "media" / "img" / "0005.png").read_bytes()
    assert d["image"][5].local_path() == files / "media" / "img" / "0005.png"  # the file itself
    assert ds.stats.to_dict()["requests"] == 0
    assert not (files / "store").exists()  # nothing copied into a store...
    assert not (files / "cache" / "blobs").exists()  # ...nor into the blob cache
    r = cli("cat", "ws/local", "--artifact", "media", "--ref", "snd/1.wav")
    assert r.code == 0
    r = cli("inspect", "ws/local", "--json")
    assert r.code == 0, r.err


def test_register_with_real_dataloader_workers(cli, files):
    assert _register(cli, files).code == 0
    t = warpdata.dataset("ws/local").table("main")
    got = []
    for b in t.to_torch(batch_size=64, columns=["id", "image"], num_workers=2, rank=0, world_size=1, read_refs=True):
        got += b["id"].tolist()
        assert all(x[:4] == b"\x89PNG" for x in b["image"])
    assert sorted(got) == list(range(500))


def test_registered_before_the_store_unless_store_is_named(cli, files, tmp_path):
    m = publish(str(tmp_path / "store"), "ws/local", {"main": [make_rows(7)]}, tmp_path / "pub")
    assert warpdata.dataset("ws/local").table("main").num_rows == 7
    r = _register(cli, files)  # the store publishes ws/local: shadowing it needs --shadow
    assert r.code == 2 and "ws/local is published in the store" in r.err and "--shadow" in r.err
    assert not (files / "cache" / "registered" / "ws" / "local.json").exists()
    assert warpdata.dataset("ws/local").table("main").num_rows == 7
    r = _register(cli, files, "--shadow")
    assert r.code == 0 and "--shadow: reads of ws/local now use these local files" in r.err
    assert warpdata.dataset("ws/local").table("main").num_rows == 500
    r = cli("ls", "--json")
    assert [(d["dataset"], d["version"], "registered" in d) for d in r.json()["datasets"]] == [
        ("ws/local", warpdata.dataset("ws/local").version, True), ("ws/local", m.version_hash, False)]
    r = cli("ls")
    assert r.code == 0 and "(registered)" in r.out and r.out.count("ws/local") == 2
    assert warpdata.dataset("ws/local", store=str(tmp_path / "store")).version == m.version_hash
    r = cli("unregister", "ws/local")
    assert r.code == 0 and "unregistered ws/local" in r.err
    assert warpdata.dataset("ws/local").version == m.version_hash
    r = cli("unregister", "ws/local", "--json")
    assert r.code == 66 and json.loads(r.out)["error"] == "missing-input"


def test_changed_files_are_detected(cli, files):
    assert _register(cli, files).code == 0
    part = files / "data" / "part-1.parquet"
    os.utime(part)  # touched, same bytes: re-hashed once, still readable
    assert sum(b.num_rows for b in warpdata.dataset("ws/local").table("main").batches(100)) == 500
    pq.write_table(make_rows(200, 9000, image_every=6), part, row_group_size=100)  # new content
    r = cli("stream", "ws/local", "--columns", "id")
    assert r.code == 65 and str(part) in r.err and "warp register ws/local" in r.err
    assert "changed since it was registered" in r.err
    img = files / "media" / "img" / "0002.png"
    img.write_bytes(img.read_bytes()[:-1] + b"\0")
    r = cli("cat", "ws/local", "--artifact", "media", "--ref", "img/0002.png")
    assert r.code == 65 and str(img) in r.err and r.out == ""
    (files / "media" / "img" / "0003.png").unlink()
    r = cli("cat", "ws/local", "--artifact", "media", "--ref", "img/0003.png")
    assert r.code == 66 and "is gone" in r.err


def test_reregister_hashes_only_what_changed(cli, files):
    first = _register(cli, files, "--json").json()
    again = _register(cli, files, "--json").json()
    assert again["version_hash"] == first["version_hash"] and again["hashed_files"] == 0
    assert again["replaced"] is None
    pq.write_table(make_rows(10, 5000, image_every=6), files / "data" / "part-1.parquet")
    time.sleep(0.15)
    third = _register(cli, files, "--json").json()
    assert third["hashed_files"] == 1 and third["replaced"] == first["version_hash"]
    assert warpdata.dataset("ws/local").table("main").num_rows == 310


def test_bad_registrations(cli, files):
    (files / "t.csv").write_text("id\n1\n")
    r = cli("register", "ws/bad", "--table", f"main={files}/t.csv")
    assert r.code == 65 and "not a Parquet file" in r.err and "warp publish" in r.err
    pq.write_table(pa.table({"image": ["img/0000.png", "img/nope.png"]}), files / "b.parquet")
    r = cli("register", "ws/bad", "--table", f"main={files}/b.parquet", "--artifact", f"media={files}/media",
            "--bind", "main.image=media:image")
    assert r.code == 65 and "img/nope.png" in r.err and "--allow-dangling" in r.err
    r = cli("register", "ws/bad", "--table", f"main={files}/missing-*.parquet")
    assert r.code == 66 and "no file matches" in r.err
    r = cli("register", "Bad/Name", "--table", f"main={files}/b.parquet")
    assert r.code == 2
    r = cli("register", "ws/bad")
    assert r.code == 2 and "nothing to register" in r.err
    os.symlink("/etc/hostname", files / "media" / "leak.txt")
    r = cli("register", "ws/bad", "--artifact", f"media={files}/media")
    assert r.code == 65 and "leak.txt" in r.err
    assert not (files / "cache" / "registered" / "ws" / "bad.json").exists()  # nothing half-written


def test_damaged_registration_is_named(cli, files):
    assert _register(cli, files).code == 0
    p = files / "cache" / "registered" / "ws" / "local.json"
    doc = json.loads(p.read_text())
    doc["tables"]["main"]["files"][0]["row_count"] = 1
    p.write_text(json.dumps(doc))
    r = cli("stream", "ws/local", "--limit", "1")
    assert r.code == 65 and str(p) in r.err and "warp unregister ws/local" in r.err


def _edit_in_place_keeping_mtime(path):
    """What `cp -p` / `rsync --inplace -t` leave: other bytes, same size, inode and mtime."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def test_an_edit_with_the_mtime_put_back_is_detected(cli, files):
    assert _register(cli, files).code == 0
    img = files / "media" / "img" / "0004.png"
    _edit_in_place_keeping_mtime(img)
    r = cli("cat", "ws/local", "--artifact", "media", "--ref", "img/0004.png")
    assert r.code == 65 and str(img) in r.err and "changed since it was registered" in r.err and r.out == ""
    part = files / "data" / "part-0.parquet"
    _edit_in_place_keeping_mtime(part)
    r = cli("stream", "ws/local", "--columns", "id")
    assert r.code == 65 and str(part) in r.err and r.out == ""


def test_inspect_verify_hashes_every_file_whatever_the_stamps(cli, files):
    from warpdata.registry import register as reg

    assert _register(cli, files).code == 0
    r = cli("inspect", "ws/local", "--verify")
    assert r.code == 0, r.err
    img = files / "media" / "img" / "0001.png"
    img.write_bytes(img.read_bytes()[:-1] + b"\0")
    p = reg.registry_path("ws/local")
    doc = json.loads(p.read_text())  # stamps are not content: a registration that trusts the new one
    doc["artifacts"]["media"]["members"]["img/0001.png"][2] = reg.stamp_now(os.stat(img))
    p.write_text(json.dumps(doc))
    assert cli("cat", "ws/local", "--artifact", "media", "--ref", "img/0001.png").code == 0  # reads trust stamps
    r = cli("inspect", "ws/local", "--verify")
    assert r.code == 1, (r.code, r.err)
    assert str(img) in r.out + r.err and "changed since it was registered" in r.out + r.err


def test_publishing_over_a_registered_name_says_which_one_reads_serve(cli, files):
    """A publish moves the store's `latest`, but reads by name on this machine find the registration
    first: the publish says so (exit 0), naming the registration's version and what to do."""
    r = _register(cli, files)
    assert r.code == 0, r.err
    reg = warpdata.dataset("ws/local").version
    r = cli("publish", "ws/local", "--table", f"main={files}/data/part-0.parquet")
    assert r.code == 0, r.err
    assert f"ws/local is also registered in place on this machine (version {reg[:12]})" in r.err
    assert "'warp unregister ws/local'" in r.err
    assert warpdata.dataset("ws/local").version == reg  # as the warning says
