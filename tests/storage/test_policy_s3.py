"""S3 reads (presigned GETs over ``http.client``) against the request-policy conformance cases
(tests/conformance/stores.py): the S3 endpoint is a hostile host on 127.0.0.1 (tests/support/hostile.py).
S3 clients follow no redirect at all: a redirect is a typed failure, never followed."""

from __future__ import annotations

import pytest
from conformance.stores import BUDGET, DEADLINE, SHARD, RequestPolicyConformance
from support.s3fixtures import s3_env
from warpdata.core.errors import ExitCode
from warpdata.storage.remote import Remote
from warpdata.storage.s3reads import _PresignedRanges

pytest.importorskip("boto3")


class TestS3RequestPolicy(RequestPolicyConformance):
    startup = 1.0  # on a loaded machine

    @pytest.fixture
    def remote_at(self, monkeypatch):
        def make(url: str) -> Remote:
            for k, v in s3_env(url).items():
                monkeypatch.setenv(k, v)
            remote = Remote("s3://bucket/store")
            _PresignedRanges.for_config(remote.config)  # the signing client is made before the clock starts
            return remote

        return make

    def test_redirect_is_not_followed_to_plain_http(self, remote_at, tmp_path, monkeypatch):
        from support.hostile import HostileHost, self_signed

        cert = self_signed(tmp_path)
        monkeypatch.setenv("AWS_CA_BUNDLE", cert[0])  # botocore's trust store: the endpoint is trusted
        with HostileHost("no-range", body=SHARD) as plain, \
                HostileHost("redirect", location=plain.url + "/elsewhere", tls=cert) as host:
            remote = remote_at(host.url)
            self.typed(lambda: remote.read_range(self.blob(), 0, 100, len(SHARD)), within=DEADLINE,
                       code=ExitCode.CONFIG)
            assert host.requests == 1 and plain.requests == 0

    def test_feature_cache_shard_from_a_trickling_host_ends_at_the_deadline(self, remote_at, tmp_path):
        """The feature cache's streamer reads a shard through the store's request policy (it sent one
        botocore GET, whose body read had no deadline: a host trickling the bytes held it for hours)."""
        from support.hostile import HostileHost
        from warpdata.features.remote import stream_object

        with HostileHost("trickle", body=SHARD) as host:
            remote = remote_at(host.url)
            with open(tmp_path / "shard", "wb") as dst:
                err = self.typed(lambda: stream_object(remote, "fc/v20260101-0123456789ab/shard-00000.wfs", dst,
                                                       len(SHARD)),
                                 within=DEADLINE + BUDGET + DEADLINE + 1, code=ExitCode.TEMPFAIL)
            assert "shard-00000.wfs" in str(err) and "WARP_RETRY_BUDGET" in err.hint
            assert 1 <= host.requests <= 3 and remote.stats.retries >= 1
