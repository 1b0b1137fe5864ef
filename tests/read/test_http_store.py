"""HTTP(S) read-only stores: a store folder written by `warp publish` and served by a static web
host (a threaded server with Range support on 127.0.0.1, tests/support/httpserve.py) reads through
the same API and commands as a local or S3 store; writes and listing fail with typed errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from support.datasets import make_rows, write_media
from support.httpserve import StaticServer


@pytest.fixture
def published(cli, tmp_path, monkeypatch):
    """ws/demo published by `warp publish` into a local store folder: 2 Parquet files, a media artifact."""
    write_media(tmp_path / "media", 6)
    files = []
    for k, part in enumerate([make_rows(300, 0, image_every=6), make_rows(200, 300, image_every=6)]):
        p = tmp_path / f"part-{k}.parquet"
        pq.write_table(part, p, row_group_size=100)
        files.append(str(p))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "store"
    r = cli("publish", "ws/demo", "--table", f"main={tmp_path}/part-*.parquet", "--artifact",
            f"media={tmp_path / 'media'}", "--bind", "main.image=media:image", "--store", str(folder))
    assert r.code == 0, r.err
    return {"folder": folder, "version": r.out.strip(), "media": tmp_path / "media", "tmp": tmp_path}


@pytest.fixture
def host(published, monkeypatch):
    with StaticServer(published["folder"]) as srv:
        monkeypatch.setenv("WARP_STORE", srv.url + "/")
        yield srv


def test_reads_tables_refs_and_filters_over_http(published, host):
    ds = warpdata.dataset("ws/demo", mode="remote")
    assert ds.version == published["version"]
    t = ds.table("main")
    assert t.num_rows == 500 and t.schema().names[:3] == ["id", "x", "label"]
    ids = [i for b in t.batches(128, columns=["id"]) for i in b.column(0).to_pylist()]
    assert ids == list(range(500))
    assert t.filter("id BETWEEN 250 AND 260").select(["id"]).to_arrow().column("id").to_pylist() == list(range(250, 261))
    d = next(iter(t.batch_dicts(8)))
    assert d["image"][3].read_bytes() == (published["media"] / "img" / "0003.png").read_bytes()
    assert d["image"][3].as_numpy().shape == (11, 10, 3)
    blob_gets = [r for r in host.log if r["method"] == "GET" and "/blobs/" in r["path"]]
    index = ds.manifest.artifacts["media"].index.hash  # the member index is read whole, once
    assert blob_gets and all(r["range"] for r in blob_gets if index not in r["path"])  # shards: by ranges
    assert sum(index in r["path"] for r in blob_gets) == 1
    assert not any(r["path"].rstrip("/").endswith(("/datasets", "/blobs")) for r in host.log)  # no listing
    st = ds.stats.to_dict()  # what warp counted is what the host served
    assert st["requests"] == host.requests and st["retries"] == 0 and st["bytes"] > 0


def test_cli_over_http(cli, published, host, tmp_path):
    r = cli("stream", "ws/demo", "--columns", "id,label", "--limit", "3", "--mode", "remote")
    assert r.code == 0, r.err
    assert [json.loads(x) for x in r.out.splitlines()] == [{"id": i, "label": f"label-{i % 7}"} for i in range(3)]
    r = cli("cat", "ws/demo", "--artifact", "media", "--ref", "img/0002.png", "--mode", "remote")
    assert r.code == 0, r.err
    r = cli("ls", "ws/demo", "--json")
    assert r.code == 0, r.err
    assert r.json()["datasets"][0]["version"] == published["version"]
    r = cli("warm", "ws/demo", "--json")
    assert r.code == 0, r.err
    assert r.json()["fetched"] == r.json()["blobs"] > 0
    host.reset()
    r = cli("stream", "ws/demo", "--columns", "id", "--mode", "local")  # offline from the warmed cache
    assert r.code == 0 and len(r.out.splitlines()) == 500 and host.requests == 0


def test_cat_bytes_are_exact(published, host):
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "warpdata", "cat", "ws/demo", "--artifact", "media", "--ref",
                        "img/0004.png", "--mode", "remote", "-v"], capture_output=True, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert p.stdout == (published["media"] / "img" / "0004.png").read_bytes()


def test_writes_to_an_http_store_fail_naming_the_url(cli, published, host, tmp_path):
    p = tmp_path / "new.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), p)
    r = cli("publish", "ws/other", "--table", f"main={p}")
    assert r.code == 78 and r.out == ""
    assert host.url in r.err and "read-only" in r.err and "hint:" in r.err
    r = cli("publish", "ws/other", "--table", f"main={p}", "--json")
    assert r.code == 78 and r.json()["error"] == "read-only-store"
    assert not [x for x in host.log if x["method"] != "GET" and x["method"] != "HEAD"]  # nothing was sent
    from warpdata.core.errors import ReadOnlyStoreError
    from warpdata.registry.store import Store

    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        Store(host.url).put_blob("0" * 64, b"", verify=False)
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        Store(host.url).delete_object("datasets/ws/demo/latest.json")


def test_listing_and_version_prefixes_need_names(cli, published, host):
    r = cli("ls")
    assert r.code == 2 and "cannot be listed" in r.err and "warp ls ws/name" in r.err
    r = cli("stream", "ws/demo", "--version", published["version"][:10], "--limit", "1")
    assert r.code == 2 and "cannot be listed" in r.err and "full 64-hex" in r.err
    r = cli("stream", "ws/demo", "--version", published["version"], "--columns", "id", "--limit", "1")
    assert r.code == 0 and r.out.strip() == '{"id":0}'
    r = cli("stream", "ws/nope", "--limit", "1")
    assert r.code == 66 and "not published in store" in r.err and host.url in r.err


@pytest.fixture
def http_server(published):
    """``python -m http.server`` (it ignores Range: 200 and the whole file) serving the store folder."""
    import socket
    import subprocess
    import sys
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                          str(published["folder"])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        p.kill()
        p.wait()


def test_python_http_server_serves_head_stream_cat_and_refs(cli, published, http_server, monkeypatch, tmp_path):
    """A host that ignores Range: the first ranged read that comes back whole switches it to whole-object
    reads, verified and kept in the blob cache; one note on stderr says so."""
    monkeypatch.setenv("WARP_STORE", http_server)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "fresh-cache"))
    r = cli("head", "ws/demo", "-n", "3", "--columns", "id,label", "--mode", "remote")
    assert r.code == 0, r.err
    assert "ignores HTTP Range" in r.err and r.err.count("ignores HTTP Range") == 1
    assert http_server.removeprefix("http://") in r.err
    r = cli("stream", "ws/demo", "--columns", "id,label", "--mode", "remote")
    assert r.code == 0, r.err
    assert [json.loads(x)["id"] for x in r.out.splitlines()] == list(range(500))
    r = cli("cat", "ws/demo", "--artifact", "media", "--ref", "img/0002.png", "--mode", "remote")
    assert r.code == 0, r.err
    ds = warpdata.dataset("ws/demo", mode="remote")
    d = next(iter(ds.table("main").batch_dicts(8)))
    assert d["image"][3].read_bytes() == (published["media"] / "img" / "0003.png").read_bytes()
    assert ds.remote.ignores_range
    shards = {s.hash for t in ds.manifest.tables.values() for s in t.shards}
    cached = {p.name for p in (tmp_path / "fresh-cache" / "blobs").glob("*/*")}
    assert shards <= cached  # each shard downloaded whole once, kept (verified) in the blob cache


def test_a_whole_answer_that_does_not_hash_is_refused(cli, published, monkeypatch, tmp_path):
    """Correctness never depends on the host honouring Range: a whole object is checked against its hash."""
    shard = next(iter(warpdata.dataset("ws/demo", store=str(published["folder"])).manifest.tables["main"].shards))

    def lie(method, path, rng):
        if method == "GET" and shard.hash in path:
            data = (published["folder"] / path.lstrip("/")).read_bytes()
            return 200, {}, bytes([data[0] ^ 1]) + data[1:]
        return None

    with StaticServer(published["folder"], ranges=False, lie=lie) as bad:
        monkeypatch.setenv("WARP_STORE", bad.url)
        monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "other-cache"))
        r = cli("stream", "ws/demo", "--columns", "id", "--mode", "remote")
        assert r.code == 65 and shard.hash in r.err and "hash" in r.err, r.err


def test_unreachable_http_store_is_typed(cli, published, monkeypatch):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("WARP_STORE", f"http://127.0.0.1:{port}/warp")
    r = cli("stream", "ws/demo", "--mode", "remote")
    assert r.code == 78 and f"127.0.0.1:{port}" in r.err and "refuses connections" in r.err


def test_throttling_host_is_retried_then_bounded(cli, published, monkeypatch):
    with StaticServer(published["folder"], fail_every=3) as flaky:
        monkeypatch.setenv("WARP_STORE", flaky.url)
        ds = warpdata.dataset("ws/demo", mode="remote")
        assert sum(b.num_rows for b in ds.table("main").batches(100)) == 500
        st = ds.stats.to_dict()
        assert flaky.faults > 0 and st["retries"] == flaky.faults == st["throttled"]
        assert st["requests"] == flaky.requests
    with StaticServer(published["folder"], fail_every=1) as down:
        monkeypatch.setenv("WARP_STORE", down.url)
        monkeypatch.setenv("WARP_RETRY_BUDGET", "1")
        r = cli("stream", "ws/demo", "--mode", "remote", "--json")
        assert r.code == 75, r.err
        assert down.url in r.err and "retry budget of 1s" in r.err and "WARP_RETRY_BUDGET" in r.err
        err = json.loads(r.out)
        assert err["error"] == "store-busy" and err["details"]["attempts"] == down.requests > 1


def test_format1_manifest_filters_over_http(tmp_path, monkeypatch):
    from support.datasets import publish

    publish(str(tmp_path / "old"), "ws/old", {"main": [make_rows(300), make_rows(200, 300)]}, tmp_path,
            row_group_size=100, stats=False)  # a format-1 manifest: no shard statistics
    with StaticServer(tmp_path / "old") as host:
        monkeypatch.setenv("WARP_STORE", host.url)
        t = warpdata.dataset("ws/old", mode="remote").table("main")
        got = t.filter("id BETWEEN 290 AND 310").select(["id"]).to_arrow().column("id").to_pylist()
        assert sorted(got) == list(range(290, 311))
        assert t.filter("id >= 0").count() == 500


def test_a_down_store_never_serves_another_stores_rows(cli, published, host, monkeypatch):
    """The pointer and manifest caches are keyed by store: after reading ws/demo from store A, a down
    store B with the same ws/name fails typed; store A itself, when down, falls back and says so."""
    r = cli("stream", "ws/demo", "--columns", "id", "--limit", "3")  # store A (the host), seen and cached
    assert r.code == 0 and len(r.out.splitlines()) == 3, r.err
    assert cli("warm", "ws/demo").code == 0
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("WARP_STORE", f"http://127.0.0.1:{port}/b")  # store B: down
    r = cli("stream", "ws/demo", "--columns", "id", "--limit", "3")
    assert r.code == 78 and r.out == "" and f"127.0.0.1:{port}" in r.err and "last known" not in r.err
    r = cli("stream", "ws/demo", "--columns", "id", "--limit", "3", "--mode", "local")
    assert r.code == 66 and r.out == "" and f"127.0.0.1:{port}/b" in r.err
    monkeypatch.setenv("WARP_STORE", f"{published['folder']}-moved")  # a local store B without it
    r = cli("stream", "ws/demo", "--columns", "id", "--limit", "3")
    assert r.code == 66 and r.out == ""
    a_url = host.url
    monkeypatch.setenv("WARP_STORE", a_url + "/")
    host.stop()  # store A, down: its own last known version, said so
    r = cli("stream", "ws/demo", "--columns", "id", "--limit", "3", "--mode", "auto")
    assert r.code == 0 and len(r.out.splitlines()) == 3, r.err
    assert "last known version" in r.err and "seen in this store" in r.err and a_url.split("//")[1] in r.err


def test_a_blob_larger_than_a_document_cap_reads_whole(tmp_path):
    """Documents (pointers, manifests) are capped at 32 MiB; a blob is read by its own size."""
    import hashlib

    from warpdata.registry.store import Store
    from warpdata.storage.policy import JSON_CAP

    data = bytes(range(256)) * ((JSON_CAP >> 8) + 4096)
    h = hashlib.sha256(data).hexdigest()
    p = tmp_path / "store" / "blobs" / "sha256" / h[:2] / h
    p.parent.mkdir(parents=True)
    p.write_bytes(data)
    with StaticServer(tmp_path / "store") as srv:
        assert Store(srv.url).get_blob(h) == data


def test_doctor_on_a_range_less_host_finishes_and_leaves_no_lock(published, http_server, tmp_path):
    """`warp doctor WS/NAME` on `python -m http.server` waited 600 s on its own blob-cache lock: the
    cache filling a blob asked the store for it by ranges, the host answered whole, and the whole
    answer went to the cache again, behind the lock its own fill held. It is one GET into the fill now.
    (A fresh process: which hosts ignore Range is remembered per process.)"""
    import os
    import subprocess
    import sys

    cache = tmp_path / "doctor-cache"
    env = {**os.environ, "WARP_STORE": http_server, "WARP_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-m", "warpdata", "doctor", "ws/demo"], env=env, capture_output=True,
                       text=True, timeout=300)  # a guard against the hang, not a measure of time
    assert p.returncode == 0, p.stderr
    assert "ignores HTTP Range" in p.stderr
    assert not list((cache / "locks").glob("*.lock"))
