"""HTTP(S) stores against the request-policy conformance cases (tests/conformance/stores.py):
hostile hosts on 127.0.0.1 (tests/support/hostile.py) end every read typed, in bounded time and memory."""

from __future__ import annotations

import pytest
from conformance.stores import RequestPolicyConformance
from warpdata.storage.remote import Remote


class TestHttpRequestPolicy(RequestPolicyConformance):
    @pytest.fixture
    def remote_at(self):
        return lambda url: Remote(url + "/store")
