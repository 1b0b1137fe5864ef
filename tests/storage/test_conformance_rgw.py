"""The registry store over a real S3 server: Ceph's RADOS Gateway (one-node cluster on 127.0.0.1,
tests/support/ceph.py), against the store conformance suite and the request-policy cases
(tests/conformance/stores.py). Run with ``make s3-conformance``; skipped elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance.stores import RequestPolicyConformance, StoreConformance
from support.ceph import rgw_env
from warpdata.publishing.multipart import PART_SIZE, _put_multipart
from warpdata.registry.store import Store
from warpdata.storage.remote import Remote
from warpdata.storage.s3reads import _PresignedRanges

pytestmark = pytest.mark.rgw


class TestRgwStoreConformance(StoreConformance):
    large_size = 2 * PART_SIZE + 12345  # three parts, the last one short

    @pytest.fixture
    def store(self, rgw):
        return Store(rgw.url("store"))

    def put_large(self, store: Store, hash_hex: str, path: Path) -> bool:
        return _put_multipart(store, hash_hex, str(path), self.large_size, concurrency=3)


class TestRgwRequestPolicy(RequestPolicyConformance):
    """The hostile hosts stand where the gateway would, signed for with the gateway user's keys."""

    startup = 1.0  # on a loaded machine

    @pytest.fixture
    def remote_at(self, rgw_server, monkeypatch):
        def make(url: str) -> Remote:
            for k, v in rgw_env(rgw_server).items():
                monkeypatch.setenv(k, v)
            monkeypatch.setenv("AWS_ENDPOINT_URL", url)
            monkeypatch.setenv("WARP_S3_ENDPOINT", url)
            remote = Remote("s3://bucket/store")
            _PresignedRanges.for_config(remote.config)  # the signing client is made before the clock starts
            return remote

        return make

    def test_redirect_is_not_followed_to_plain_http(self, remote_at, tmp_path, monkeypatch):
        from conformance.stores import DEADLINE, SHARD
        from support.hostile import HostileHost, self_signed
        from warpdata.core.errors import ExitCode

        cert = self_signed(tmp_path)
        monkeypatch.setenv("AWS_CA_BUNDLE", cert[0])  # botocore's trust store (S3 reads do not use SSL_CERT_FILE)
        with HostileHost("no-range", body=SHARD) as plain, \
                HostileHost("redirect", location=plain.url + "/elsewhere", tls=cert) as host:
            remote = remote_at(host.url)
            self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                       code=ExitCode.CONFIG)
            assert host.requests == 1 and plain.requests == 0
