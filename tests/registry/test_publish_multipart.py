"""`warp publish` of large blobs: parallel S3 multipart uploads, resumed after a kill (moto, counted requests)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.publishing.publish import MULTIPART_MIN, PART_SIZE
from warpdata.registry.manifest import blob_key
from warpdata.registry.store import Store

BIG = MULTIPART_MIN + 3 * PART_SIZE // 2  # 64 MB and more: 6 parts of 16 MB (the last one half)
NPARTS = -(-BIG // PART_SIZE)


@pytest.fixture(scope="module")
def big_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    (root / "data").mkdir()
    (root / "imgs").mkdir()
    pq.write_table(pa.table({"image": ["big.bin", "small.bin"]}), root / "data" / "p0.parquet")
    (root / "imgs" / "big.bin").write_bytes(np.random.default_rng(7).bytes(BIG))
    (root / "imgs" / "small.bin").write_bytes(b"x" * 100)
    return root


def args(root, store):
    return ("publish", "ws/big", "--store", store, "--table", f"main={root}/data/*.parquet",
            "--artifact", f"imgs={root}/imgs", "--bind", "main.image=imgs:image", "--shard-size", "512MB",
            "--json")


def parts(s3, prefix):
    return [r for r in s3.requests("PUT", prefix) if "partNumber=" in r["query"]]


def big_blob(store: Store, m) -> str:
    idx = m.artifacts["imgs"]
    return max(idx.shards, key=lambda s: s.byte_size).hash


@pytest.mark.s3
def test_large_blob_goes_up_in_parallel_parts(cli, s3, big_dataset, monkeypatch):
    monkeypatch.setenv("WARP_UPLOAD_CONCURRENCY", "3")
    s3.reset_counts()
    r = cli(*args(big_dataset, s3.url("a")))
    assert r.code == 0, r.err
    store = Store(s3.url("a"))
    m = store.resolve("ws/big")
    h = big_blob(store, m)
    key = f"a/{blob_key(h)}"
    assert [q["key"] for q in s3.requests("POST", key) if q["query"] == "uploads"] == [key]  # one create
    assert len(parts(s3, key)) == NPARTS
    assert len([q for q in s3.requests("POST", key) if "uploadId=" in q["query"]]) == 1  # one complete
    assert s3.count("PUT", key) == NPARTS  # never a whole-object PUT
    # read back with the fixture's own client: what is checked here is the upload, and a 100 MB read through
    # s3fs's concurrent ranges has met connect timeouts on a loaded 2-core machine
    assert hashlib.sha256(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()).hexdigest() == h
    # small blobs still go up in one PUT each
    assert not [q for q in s3.requests("PUT", "a/blobs/") if q["key"] != key and "partNumber=" in q["query"]]


@pytest.mark.s3
@pytest.mark.slow
def test_killed_multipart_upload_resumes_without_resending_finished_parts(cli, s3, big_dataset):
    r = cli(*args(big_dataset, s3.url("a")))
    assert r.code == 0, r.err
    a = Store(s3.url("a"))
    h = big_blob(a, a.resolve("ws/big"))
    data = a.get_blob(h)
    # what a publish killed after its first two parts leaves in store "b": an unfinished upload
    key = f"b/{blob_key(h)}"
    up = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    for i in (1, 2):
        s3.client.upload_part(Bucket=s3.bucket, Key=key, UploadId=up, PartNumber=i,
                              Body=data[(i - 1) * PART_SIZE:i * PART_SIZE])
    s3.reset_counts()
    r = cli(*args(big_dataset, s3.url("b")))
    assert r.code == 0, r.err
    assert sorted(int(q["query"].split("partNumber=")[1].split("&")[0]) for q in parts(s3, key)) == \
        list(range(3, NPARTS + 1))
    assert not [q for q in s3.requests("POST", key) if q["query"] == "uploads"]  # no new upload started
    assert Store(s3.url("b")).get_blob(h) == data
    # and a rerun sends nothing at all
    s3.reset_counts()
    assert cli(*args(big_dataset, s3.url("b"))).code == 0
    assert s3.count("PUT") == 0 and s3.count("POST") == 0


@pytest.mark.parametrize("bad", ["0", "x", "-2"])
def test_bad_upload_concurrency_is_a_config_error(cli, s3, big_dataset, monkeypatch, bad):
    monkeypatch.setenv("WARP_UPLOAD_CONCURRENCY", bad)
    r = cli(*args(big_dataset, s3.url("c")))
    assert r.code == 78, r.err
    assert "WARP_UPLOAD_CONCURRENCY" in r.err and "Traceback" not in r.err
