"""Presigned S3 GET URLs (AWS Signature Version 4, query-string authentication) without botocore.

Importing botocore and making a client costs a command ~0.5-1 s before its first S3 request; when the
credentials are plain environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional
``AWS_SESSION_TOKEN``) and no profile is named, the read path signs its GETs with :class:`SigV4Presigner`
instead (the standard library's ``hmac`` and ``hashlib``). Anything else (profiles, SSO, instance
metadata, anonymous reads, bucket names with dots over https) keeps botocore:
:meth:`SigV4Presigner.for_config` answers None. The algorithm is AWS's "Authenticating Requests: Using
Query Parameters (AWS Signature Version 4)"; the test compares its URLs with botocore's, signed at the
same second (tests/storage/test_s3sign.py).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from urllib.parse import quote, urlsplit

__all__ = ["SigV4Presigner"]


def _enc(s: str, safe: str = "-_.~") -> str:
    return quote(s, safe=safe)


class SigV4Presigner:
    """Signs ``GET bucket/key`` URLs for one endpoint, region and set of static credentials."""

    def __init__(self, endpoint: str | None, region: str, path_style: bool, access_key: str, secret_key: str,
                 token: str | None = None) -> None:
        self.region, self.path_style = region, path_style
        self.access_key, self.secret_key, self.token = access_key, secret_key, token
        # without an endpoint, the global host botocore also presigns with (bucket.s3.amazonaws.com)
        self.endpoint = (endpoint or "https://s3.amazonaws.com").rstrip("/")
        self._keys: dict[str, bytes] = {}  # date -> signing key

    @classmethod
    def for_config(cls, config) -> SigV4Presigner | None:
        """A presigner for ``config`` (a :class:`~warpdata.storage.locations.StorageConfig`) when its
        credentials are static environment variables; None where botocore must resolve them."""
        if config.anon or config.profile or (config.endpoint_url and not config.path_style):
            return None  # botocore's addressing for a custom endpoint without path-style is its own choice
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            return None
        return cls(config.endpoint_url, config.region, config.path_style, key, secret,
                   os.environ.get("AWS_SESSION_TOKEN") or None)

    def url_base(self, bucket: str) -> str | None:
        """``scheme://host[/bucket]`` of ``bucket``'s objects; None where a virtual host would not
        match a TLS certificate (a dotted bucket name over https)."""
        u = urlsplit(self.endpoint)
        if self.path_style:
            return f"{u.scheme}://{u.netloc}{u.path}/{bucket}"
        if "." in bucket and u.scheme == "https":
            return None
        return f"{u.scheme}://{bucket}.{u.netloc}{u.path}"

    def _signing_key(self, date: str) -> bytes:
        k = self._keys.get(date)
        if k is None:
            k = ("AWS4" + self.secret_key).encode()
            for part in (date, self.region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys = {date: k}
        return k

    def presign(self, bucket: str, key: str, expires: int, now: float | None = None) -> str | None:
        """A URL that GETs ``bucket/key`` for ``expires`` seconds from ``now`` (default: the clock)."""
        base = self.url_base(bucket)
        if base is None:
            return None
        t = time.gmtime(time.time() if now is None else now)
        amz_date, date = time.strftime("%Y%m%dT%H%M%SZ", t), time.strftime("%Y%m%d", t)
        u = urlsplit(base)
        path = _enc(f"{u.path}/{key}", safe="-_.~/")
        scope = f"{date}/{self.region}/s3/aws4_request"
        params = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{self.access_key}/{scope}",
                  "X-Amz-Date": amz_date, "X-Amz-Expires": str(int(expires)), "X-Amz-SignedHeaders": "host"}
        if self.token:
            params["X-Amz-Security-Token"] = self.token
        query = "&".join(f"{_enc(k)}={_enc(v)}" for k, v in sorted(params.items()))
        host = u.netloc
        if (u.scheme, u.port) in (("http", 80), ("https", 443)):
            host = u.hostname or host
        canonical = f"GET\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        sig = hmac.new(self._signing_key(date), to_sign.encode(), hashlib.sha256).hexdigest()
        return f"{u.scheme}://{u.netloc}{path}?{query}&X-Amz-Signature={sig}"
