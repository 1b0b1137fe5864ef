"""Real PyTorch DataLoader workers (forked and spawned) share a dataset's manifest and member
index through the blob cache: one GET of each per node, not one per worker, in every mode
(remote mode caches no data shard, but keeps this metadata). Counted by the moto server."""

from __future__ import annotations

import pytest
import warpdata
from support.datasets import make_rows, publish, write_media

pytestmark = pytest.mark.s3


@pytest.fixture
def published(s3, tmp_path, monkeypatch):
    write_media(tmp_path / "media", 8)
    parts = [make_rows(300, 0, image_every=8), make_rows(300, 300, image_every=8), make_rows(200, 600, image_every=8)]
    m = publish(s3.url(), "ws/workers", {"main": parts}, tmp_path, row_group_size=100, media=tmp_path / "media")
    monkeypatch.setenv("WARP_STORE", s3.url())
    return m


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("mode", ["remote", "auto"])
def test_workers_fetch_manifest_and_index_once_per_node(s3, published, monkeypatch, mode, context):
    from torch.utils import data

    real_init = data.DataLoader.__init__

    def init(self, *a, **kw):  # the loader warp builds, started the way this test asks
        real_init(self, *a, **{**kw, "multiprocessing_context": context})

    monkeypatch.setattr(data.DataLoader, "__init__", init)
    from warpdata.read import dataset as read_dataset
    from warpdata.read import refs

    # the same content publishes the same version: forget what earlier tests parsed in this process
    monkeypatch.setattr(read_dataset, "_MANIFESTS", {})
    monkeypatch.setattr(refs, "_INDEXES", {})
    s3.reset_counts()
    t = warpdata.dataset("ws/workers", mode=mode).table("main")
    loader = t.to_torch(batch_size=64, columns=["id", "image"], num_workers=2, rank=0, world_size=1, read_refs=True)
    got = [i for b in loader for i in b["id"].tolist()]
    assert sorted(got) == list(range(800))
    version = published.version_hash
    index = published.artifacts["media"].index.hash
    gets = s3.requests("GET")
    assert sum(r["key"].endswith(f"versions/{version}.json") for r in gets) == 1  # the main process's
    assert sum(r["key"].endswith(index) for r in gets) == 1  # one worker fetched it; the others read the cache
    if mode == "remote":
        from warpdata.storage.blobcache import BlobCache

        shards = [s.hash for s in published.tables["main"].shards] + [s.hash for s in published.artifacts["media"].shards]
        assert not any(BlobCache().has(h) for h in shards)  # no data shard was kept
