"""`warp doctor ws/name`: resolve, manifest, stream, refs and the slowest part, against moto S3
(request counts checked against the server's), an HTTP store, a throttling proxy and a registered
dataset; in-process CLI."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import warpdata
from support.datasets import make_rows, publish, write_media
from support.httpserve import FaultProxy, StaticServer


@pytest.fixture
def on_s3(s3, tmp_path, monkeypatch):
    write_media(tmp_path / "media", 8)
    parts = [make_rows(600, 0, image_every=8), make_rows(400, 600, image_every=8)]
    m = publish(s3.url(), "ws/demo", {"main": parts}, tmp_path, row_group_size=200, media=tmp_path / "media")
    monkeypatch.setenv("WARP_STORE", s3.url())
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    return m


@pytest.mark.s3
def test_doctor_dataset_on_s3(cli, s3, on_s3):
    s3.reset_counts()
    r = cli("doctor", "ws/demo", "--rows", "700", "--refs", "10", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] and doc["version"] == on_s3.version_hash and doc["table"] == "main"
    status = {c["name"]: c["status"] for c in doc["checks"]}
    assert status == {"resolve": "PASS", "manifest": "PASS", "stream": "PASS", "refs": "PASS", "slowest": "PASS"}
    m = doc["metrics"]
    assert m["rows"] == 700 and m["refs"] == 10 and m["rows_per_s"] > 0 and m["refs_per_s"] > 0
    assert m["requests"] == s3.count() and m["bytes_fetched"] > 0  # what warp counted is what moto served
    assert m["requests_per_1k_rows"] > 0 and m["retries"] == 0
    assert [p["name"] for p in doc["phases"]] == ["resolve", "manifest", "stream", "refs"]
    assert doc["slowest"].startswith("slowest: ") and doc["slowest"].split()[1].rstrip(",") in \
        ("resolve", "manifest", "stream", "refs")
    r = cli("doctor", "ws/demo", "--rows", "100")
    assert r.code == 0, r.err
    assert "dataset/stream" in r.out and "dataset/refs" in r.out and "PASS" in r.out
    assert "rows/s" in r.err and "requests per 1k rows" in r.err and "fetched" in r.err


@pytest.mark.s3
def test_doctor_names_throttling(cli, s3, on_s3, monkeypatch):
    with FaultProxy(s3.endpoint, fail_every=3) as proxy:
        for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
            monkeypatch.setenv(var, proxy.url)
        r = cli("doctor", "ws/demo", "--rows", "1000", "--refs", "8", "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert doc["metrics"]["retries"] == proxy.faults > 0 and 0 < doc["metrics"]["throttled"] <= proxy.faults
        slow = next(c for c in doc["checks"] if c["name"] == "slowest")
        assert slow["status"] == "WARN" and "throttled" in slow["remedy"]


def test_doctor_missing_dataset(cli, tmp_path, monkeypatch):
    publish(str(tmp_path / "store"), "ws/there", {"main": [make_rows(5)]}, tmp_path)
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    r = cli("doctor", "ws/thare", "--json")
    assert r.code == 1
    doc = r.json()
    assert [(c["name"], c["status"]) for c in doc["checks"]] == [
        ("resolve", "FAIL"), ("manifest", "SKIP"), ("stream", "SKIP"), ("refs", "SKIP")]
    assert "ws/there" in doc["checks"][0]["remedy"]  # did you mean
    r = cli("doctor", "ws/thare", "--only", "store")
    assert r.code == 2 and "--only" in r.err


def test_doctor_catches_a_bad_store_manifest(cli, tmp_path, monkeypatch):
    m = publish(str(tmp_path / "store"), "ws/bad", {"main": [make_rows(50)]}, tmp_path)
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    warpdata.dataset("ws/bad", mode="remote")  # parsed once in this process: resolving reuses it
    p = tmp_path / "store" / "datasets" / "ws" / "bad" / "versions" / f"{m.version_hash}.json"
    p.write_bytes(p.read_bytes().replace(b'"row_count":50', b'"row_count":51'))
    r = cli("doctor", "ws/bad", "--json")
    assert r.code == 1
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["resolve"]["status"] == "PASS" and checks["manifest"]["status"] == "FAIL"
    assert "hash mismatch" in checks["manifest"]["detail"] and checks["stream"]["status"] == "SKIP"


def test_doctor_over_http_and_registered(cli, tmp_path, monkeypatch):
    write_media(tmp_path / "media", 4)
    publish(str(tmp_path / "store"), "ws/web", {"main": [make_rows(300, 0, image_every=4)]}, tmp_path,
            row_group_size=100, media=tmp_path / "media")
    with StaticServer(tmp_path / "store") as host:
        monkeypatch.setenv("WARP_STORE", host.url)
        r = cli("doctor", "ws/web", "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert doc["store"] == host.url and doc["metrics"]["requests"] == host.requests
        assert {c["name"]: c["status"] for c in doc["checks"]}["refs"] == "PASS"
        r = cli("doctor", "--only", "store", "--json")
        assert r.code == 0, r.err
        st = {c["name"]: c["status"] for c in r.json()["checks"]}
        assert st == {"store-credentials": "SKIP", "store": "PASS", "duckdb-parquet": "SKIP",
                      "store-create-only": "SKIP", "store-cas": "SKIP"}
    pq.write_table(make_rows(120), tmp_path / "local.parquet")
    assert cli("register", "ws/mine", "--table", f"main={tmp_path}/local.parquet").code == 0
    r = cli("doctor", "ws/mine", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    checks = {c["name"]: c for c in doc["checks"]}
    assert "registered in place" in checks["resolve"]["detail"] and checks["refs"]["status"] == "SKIP"
    assert doc["metrics"]["requests"] == 0 and doc["metrics"]["rows"] == 120
    assert json.dumps(doc)  # one document
