"""The registry store over fsspec's ``memory://`` against the store conformance suite
(tests/conformance/stores.py)."""

from __future__ import annotations

import uuid

import pytest
from conformance.stores import StoreConformance
from warpdata.registry.store import Store


class TestMemoryStoreConformance(StoreConformance):
    @pytest.fixture
    def store(self):
        return Store(f"memory://warp-conformance-{uuid.uuid4().hex}/store")
