"""The registry store over S3 (moto on 127.0.0.1, tests/support/s3fixtures.py) against the store
conformance suite (tests/conformance/stores.py). Large blobs go up the way ``warp publish``
sends them: the registry's create-only multipart upload (warp/publishing/publish.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance.stores import StoreConformance
from warpdata.publishing.publish import PART_SIZE, _put_multipart
from warpdata.registry.store import Store

pytestmark = pytest.mark.s3


class TestS3StoreConformance(StoreConformance):
    large_size = 2 * PART_SIZE + 12345  # three parts, the last one short

    @pytest.fixture
    def store(self, s3):
        self.s3 = s3
        return Store(s3.url("store"))

    def put_large(self, store: Store, hash_hex: str, path: Path) -> bool:
        self.s3.reset_counts()
        wrote = _put_multipart(store, hash_hex, str(path), self.large_size, concurrency=3)
        puts = self.s3.requests("PUT")
        assert len(puts) == 3 and all("partNumber=" in r["query"] for r in puts)  # parts, never one whole PUT
        return wrote
