"""Requests a publish sends to S3 (moto on 127.0.0.1, counted by the server)."""

from __future__ import annotations

import pytest
from test_publish import make_dataset
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.store import Store

pytestmark = pytest.mark.s3


def _request(root, dataset="ws/req"):
    return PublishRequest(dataset, tables={"main": [f"{root}/data/*.parquet"]}, artifacts={"imgs": str(root / "imgs")},
                          shard_size=2 << 10)


def _listings(s3):
    return [r for r in s3.requests("GET") if r["key"] == "" and "list-type" in r["query"]]


def test_first_publish_sends_one_request_per_blob_plus_a_constant(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    make_dataset(tmp_path, n_shards=3, n_files=30)
    store = Store(s3.url("warp"))
    s3.reset_counts()
    r = publish(_request(tmp_path), store=store)
    assert r.blobs_uploaded == len(r.blobs) > 4
    assert s3.count("HEAD", "warp/blobs/") == 0  # no existence check per blob ...
    assert len(_listings(s3)) == 1  # ... one listing of the store's blobs instead
    assert s3.count() <= r.blobs_uploaded + 6  # blobs, manifest, latest, and a few reads
    for blob in store.resolve("ws/req").blobs():
        store.get_blob(blob.hash)  # every blob is there and hashes to its name


def test_a_second_dataset_uploads_only_the_blobs_the_store_lacks(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    make_dataset(tmp_path / "a", n_shards=3, n_files=30)
    store = Store(s3.url("warp"))
    first = publish(_request(tmp_path / "a", "ws/a"), store=store)
    s3.reset_counts()
    second = publish(_request(tmp_path / "a", "ws/b"), store=store)  # same bytes, other name
    assert second.blobs_uploaded == 0 and s3.count("PUT", "warp/blobs/") == 0
    assert s3.count("HEAD", "warp/blobs/") == 0 and len(_listings(s3)) == 1
    assert Store(s3.url("warp")).missing_blobs([b.hash for b in first.blobs] + ["ab" * 32]) == ["ab" * 32]
