"""warp's own SigV4 presigner (warp/storage/s3sign.py) against botocore's: the same URL, signed at the
same second, for path-style endpoints, AWS's global host, session tokens and keys that need escaping;
and a read of an S3 dataset with static credentials that never imports botocore."""

from __future__ import annotations

import calendar
import os
import subprocess
import sys
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from warpdata.storage.locations import StorageConfig
from warpdata.storage.s3client import boto3_client
from warpdata.storage.s3sign import SigV4Presigner

pytest.importorskip("botocore")

KEYS = ["blobs/sha256/ab/" + "ab" * 32, "datasets/ws/n a+me/latest.json", "weird/é~*'()!.json"]


@pytest.fixture
def static_creds(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("endpoint,path_style,region", [
    ("http://127.0.0.1:9000", True, "us-east-1"), ("https://minio.example.com:9443", True, "eu-west-1"),
    (None, False, "us-east-1"), (None, False, "eu-west-1")])
@pytest.mark.parametrize("token", [None, "tok/en+="])
def test_presigned_urls_match_botocores(static_creds, monkeypatch, endpoint, path_style, region, token):
    if token:
        monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    cfg = StorageConfig(endpoint_url=endpoint, region=region, path_style=path_style)
    signer = SigV4Presigner.for_config(cfg)
    assert signer is not None
    client = boto3_client(cfg, attempts=1, signature="s3v4")
    for key in KEYS:
        theirs = client.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": key}, ExpiresIn=900)
        at = calendar.timegm(time.strptime(parse_qs(urlsplit(theirs).query)["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ"))
        ours = signer.presign("bench", key, 900, now=at)
        a, b = urlsplit(theirs), urlsplit(ours)
        assert (a.scheme, a.netloc, a.path) == (b.scheme, b.netloc, b.path)
        assert parse_qs(a.query) == parse_qs(b.query)  # the signature included


def test_botocore_keeps_what_it_alone_resolves(static_creds, monkeypatch):
    assert SigV4Presigner.for_config(StorageConfig(profile="dev")) is None
    assert SigV4Presigner.for_config(StorageConfig(anon=True)) is None
    assert SigV4Presigner.for_config(StorageConfig(endpoint_url="https://x.example.com")) is None  # not path-style
    signer = SigV4Presigner(None, "us-east-1", False, "a", "b")
    # a dotted name goes path-style, as botocore sends it (test_s3sign_botocore.py compares the URLs);
    # names botocore validates or signs another way stay botocore's
    assert signer.presign("dotted.bucket", "k", 60).startswith("https://s3.amazonaws.com/dotted.bucket/k?")
    assert signer.presign("arn:aws:s3:us-west-2:123456789012:accesspoint/ap", "k", 60) is None
    assert signer.presign("fast--usw2-az1--x-s3", "k", 60) is None
    assert SigV4Presigner.for_config(StorageConfig(region="aws-global")) is None  # a pseudo-region
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert SigV4Presigner.for_config(StorageConfig()) is None


@pytest.mark.s3
def test_an_s3_read_with_static_credentials_imports_no_botocore(s3, tmp_path):
    from support.datasets import make_rows, publish

    publish(s3.url(), "ws/demo", {"main": [make_rows(50)]}, tmp_path)
    code = ("import sys, warpdata; t = warpdata.dataset('ws/demo', mode='remote').table('main'); "
            "print(t.head(3).num_rows, 'botocore' in sys.modules, 'boto3' in sys.modules)")
    env = {**os.environ, "WARP_STORE": s3.url(), "WARP_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["3", "False", "False"]
