"""The registry store over a local folder against the store conformance suite (tests/conformance/stores.py)."""

from __future__ import annotations

import pytest
from conformance.stores import StoreConformance
from warpdata.registry.store import Store


class TestLocalStoreConformance(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path):
        return Store(tmp_path / "container" / "store")
