"""Presigned S3 GET URLs (AWS Signature Version 4, query-string authentication) without botocore.

Importing botocore and making a client costs a command ~0.5-1 s before its first S3 request; when the
credentials are plain environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional
``AWS_SESSION_TOKEN``) and no profile is named, the read path signs its GETs with :class:`SigV4Presigner`
instead (the standard library's ``hmac`` and ``hashlib``). The algorithm is AWS's "Authenticating
Requests: Using Query Parameters (AWS Signature Version 4)"; the host and path are the ones botocore's
``generate_presigned_url("get_object")`` chooses for the same bucket, key, region, endpoint and
addressing (botocore 1.43's S3 endpoint rules and its presigning customisations, for the inputs below).

What it signs, byte for byte as botocore does:

- **No endpoint**: the region's partition (botocore's ``partitions.json``: ``amazonaws.com``,
  ``amazonaws.com.cn`` for ``cn-*``, ``us-gov-*`` on ``amazonaws.com``, the ISO and EU sovereign
  partitions). Path-style: ``s3.<region>.<suffix>/<bucket>`` (``s3.amazonaws.com`` for us-east-1).
  Automatic addressing: in the ``aws`` partition botocore presigns on the global endpoint,
  ``<bucket>.s3.amazonaws.com`` whatever the region (``s3.amazonaws.com/<bucket>`` for a name that is not
  a lowercase DNS label); elsewhere ``<bucket>.s3.<region>.<suffix>``; a name that is not a DNS label
  (dots, capitals, underscores) goes path-style. The credential scope names the configured region.
- **A custom endpoint with path-style addressing**: ``scheme://authority`` as written (capitals and
  port kept), the endpoint's path with dot segments and repeated slashes removed, then
  ``/<bucket>/<key>``. The signed ``host`` is the lowercase host name (IPv6 in brackets) with the port
  unless it is the scheme's default.

Everything else is left to botocore: :meth:`SigV4Presigner.for_config` answers None (profiles, SSO,
instance metadata, anonymous reads, pseudo-regions such as ``aws-global`` or ``fips-...``, regions of no
known partition without an endpoint, a custom endpoint without path-style, settings only botocore reads:
``AWS_USE_FIPS_ENDPOINT``, ``AWS_USE_DUALSTACK_ENDPOINT``, ``AWS_S3_US_EAST_1_REGIONAL_ENDPOINT``, endpoint
or S3 options in the AWS config file) and :meth:`SigV4Presigner.presign` answers None for a bucket name
botocore validates or signs another way (ARNs, S3 Express ``--x-s3``). An endpoint with ``user:pw@``
is refused (:class:`~warpdata.core.errors.ConfigError`, naming the setting): credentials do not belong
in a URL that is logged, and botocore would send them to the server.

tests/storage/test_s3sign_botocore.py compares its URLs with botocore's (a Hypothesis property over
partitions, endpoints, keys, tokens and signing times, botocore's clock frozen).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from urllib.parse import quote, urlsplit

from warpdata.core import envvars
from warpdata.core.errors import ConfigError

__all__ = ["SigV4Presigner", "check_endpoint"]

# botocore/data/partitions.json (and endpoints.json, whose patterns are the same): a region's partition
# is the first whose pattern it matches; its DNS suffix names the S3 hosts
_PARTITIONS: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (pid, re.compile(rx), suffix) for pid, rx, suffix in (
        ("aws", r"^(us|eu|ap|sa|ca|me|af|il|mx)\-\w+\-\d+$", "amazonaws.com"),
        ("aws-cn", r"^cn\-\w+\-\d+$", "amazonaws.com.cn"),
        ("aws-eusc", r"^eusc\-(de)\-\w+\-\d+$", "amazonaws.eu"),
        ("aws-iso", r"^us\-iso\-\w+\-\d+$", "c2s.ic.gov"),
        ("aws-iso-b", r"^us\-isob\-\w+\-\d+$", "sc2s.sgov.gov"),
        ("aws-iso-e", r"^eu\-isoe\-\w+\-\d+$", "cloud.adc-e.uk"),
        ("aws-iso-f", r"^us\-isof\-\w+\-\d+$", "csp.hci.ic.gov"),
        ("aws-us-gov", r"^us\-gov\-\w+\-\d+$", "amazonaws.com"),
    ))
_REGION = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")  # a plain region (or an S3-compatible server's own name)
_BUCKET = re.compile(r"[a-zA-Z0-9._-]{1,255}")  # botocore's VALID_BUCKET, less the ARNs
_HOST_LABEL = re.compile(r"(?!-)[a-zA-Z\d-]{1,63}(?<!-)")  # botocore's VALID_HOST_LABEL_RE
_DNS_LABEL = re.compile(r"[a-z\d]([a-z\d-]{1,61})[a-z\d]")  # a virtual-hostable bucket: lowercase, 3-63
_ENDPOINT_HOST = re.compile(r"((?!-)[a-z\d-]{1,63}(?<!-)\.)*((?!-)[a-z\d-]{1,63}(?<!-))")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# settings botocore reads that change its URLs; warp leaves the signing to it when one is set
_BOTOCORE_ONLY_ENV = ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT")
_BOTOCORE_ONLY_CONFIG = re.compile(r"^\s*(s3|services|endpoint_url|use_fips_endpoint|use_dualstack_endpoint"
                                   r"|s3_us_east_1_regional_endpoint)\s*=", re.MULTILINE)
_ENDPOINT_SETTINGS = ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # StorageConfig.from_env's order


def _enc(s: str, safe: str = "-_.~") -> str:
    return quote(s, safe=safe)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 with repeated slashes dropped, as botocore normalises an endpoint's path."""
    if not path:
        return "/"
    out: list[str] = []
    for seg in path.split("/"):
        if seg == "..":
            if out:
                out.pop()
        elif seg and seg != ".":
            out.append(seg)
    return ("/" if path[0] == "/" else "") + "/".join(out) + ("/" if path[-1] == "/" and out else "")


def _endpoint_setting(endpoint: str) -> str:
    """The environment variable that supplied ``endpoint`` (StorageConfig.from_env's order)."""
    for name in _ENDPOINT_SETTINGS:
        if envvars.get(name) == endpoint:
            return name
    return "WARP_S3_ENDPOINT"


def check_endpoint(endpoint: str | None, setting: str | None = None) -> None:
    """Refuse an S3 endpoint URL with userinfo (``user:pw@host``): a typed ConfigError naming the
    setting (``setting``, or the environment variable that holds it), the password not repeated."""
    if endpoint is None:
        return
    netloc = urlsplit(endpoint).netloc
    if "@" not in netloc:
        return
    setting = setting or _endpoint_setting(endpoint)
    shown = endpoint.replace(netloc, "***@" + netloc.rpartition("@")[2], 1)
    raise ConfigError(f"{setting}: the S3 endpoint URL {shown} has userinfo (user:password@); "
                      f"warp does not send credentials in an endpoint URL",
                      hint=f"set {setting} to scheme://host[:port][/path] and give the credentials as "
                           "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile (WARP_S3_PROFILE)",
                      key=setting)


def _partition(region: str) -> tuple[str, str] | None:
    for pid, rx, suffix in _PARTITIONS:
        if rx.match(region):
            return pid, suffix
    return None


def _botocore_only_settings() -> bool:
    """Whether a setting only botocore reads (FIPS, dual-stack, us-east-1 regional, endpoint or S3
    options of the AWS config file) may change the URL it would sign."""
    if any(os.environ.get(k) for k in _BOTOCORE_ONLY_ENV):
        return True
    path = os.environ.get("AWS_CONFIG_FILE") or os.path.join(os.path.expanduser("~"), ".aws", "config")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    return _BOTOCORE_ONLY_CONFIG.search(text) is not None


class SigV4Presigner:
    """Signs ``GET bucket/key`` URLs for one endpoint, region and set of static credentials."""

    def __init__(self, endpoint: str | None, region: str, path_style: bool, access_key: str, secret_key: str,
                 token: str | None = None, *, setting: str | None = None) -> None:
        check_endpoint(endpoint, setting)
        self.region, self.path_style = region, path_style
        self.access_key, self.secret_key, self.token = access_key, secret_key, token
        self.custom = endpoint is not None
        self._supported = self.supports(endpoint, region, path_style)
        if endpoint is not None:
            self.endpoint = endpoint.rstrip("/")
        else:
            part = _partition(region)
            self.endpoint = ("https://s3.amazonaws.com" if part is None or part[0] == "aws"
                             else f"https://s3.{region}.{part[1]}")
        self._keys: dict[str, bytes] = {}  # date -> signing key

    @staticmethod
    def supports(endpoint: str | None, region: str, path_style: bool) -> bool:
        """Whether warp signs for this endpoint, region and addressing as botocore would (else botocore
        signs: FIPS and dual-stack pseudo-regions, regions of no partition (aws-global, ...) without an endpoint, a custom endpoint without
        path-style, an endpoint botocore would refuse)."""
        if len(region) > 63 or region.isdigit() or not _REGION.fullmatch(region) \
                or "fips" in region or "dualstack" in region:
            return False
        if endpoint is None:
            return _partition(region) is not None
        if not path_style or any(c in endpoint for c in "\t\r\n"):
            return False
        try:
            u = urlsplit(endpoint)
            u.port  # noqa: B018  a bad port raises here
        except ValueError:
            return False
        if u.scheme not in _DEFAULT_PORTS or u.query or u.fragment or not u.hostname:
            return False
        host = u.hostname
        if u.netloc.rpartition("@")[2].startswith("["):
            return "%" not in host  # an IPv6 literal (no zone ID)
        host = host[:-1] if host.endswith(".") else host
        return len(host) <= 255 and _ENDPOINT_HOST.fullmatch(host) is not None

    @classmethod
    def for_config(cls, config) -> SigV4Presigner | None:
        """A presigner for ``config`` (a :class:`~warpdata.storage.locations.StorageConfig`) when its
        credentials are static environment variables; None where botocore must resolve them or
        address the request itself. An endpoint with userinfo is a ConfigError."""
        setting = None
        if config.endpoint_url is not None:
            setting = _endpoint_setting(config.endpoint_url)
            check_endpoint(config.endpoint_url, setting)
        if config.anon or config.profile:
            return None
        if not cls.supports(config.endpoint_url, config.region, config.path_style):
            return None
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            return None
        if config.endpoint_url is None and (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")):
            return None  # botocore would send these requests to that endpoint
        if _botocore_only_settings():
            return None
        return cls(config.endpoint_url, config.region, config.path_style, key, secret,
                   os.environ.get("AWS_SESSION_TOKEN") or None, setting=setting)

    def url_base(self, bucket: str) -> str | None:
        """``scheme://host[/path]/bucket`` or ``https://bucket.host`` of ``bucket``'s objects, as
        botocore addresses them; None where botocore must (an unsupported configuration, a bucket
        name botocore validates or signs another way)."""
        if not self._supported or not _BUCKET.fullmatch(bucket) or bucket.endswith("--x-s3"):
            return None
        if self.custom:
            u = urlsplit(self.endpoint)
            path = _enc(_remove_dot_segments(u.path), safe="-_.~/")
            return f"{u.scheme}://{u.netloc}{path.rstrip('/')}/{bucket}"
        part = _partition(self.region)
        assert part is not None  # _supported
        pid, suffix = part
        hostable = _DNS_LABEL.fullmatch(bucket) is not None
        if pid == "aws" and not self.path_style and _HOST_LABEL.fullmatch(bucket):
            # botocore presigns on the global endpoint in the aws partition (signers.py,
            # _should_use_global_endpoint; handlers.py sets the region to aws-global)
            return f"https://{bucket}.s3.amazonaws.com" if hostable else f"https://s3.amazonaws.com/{bucket}"
        regional = "s3.amazonaws.com" if self.region == "us-east-1" else f"s3.{self.region}.{suffix}"
        if not self.path_style and hostable:
            return f"https://{bucket}.{regional}"
        return f"https://{regional}/{bucket}"

    def _signing_key(self, date: str) -> bytes:
        k = self._keys.get(date)
        if k is None:
            k = ("AWS4" + self.secret_key).encode()
            for part in (date, self.region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys = {date: k}
        return k

    def presign(self, bucket: str, key: str, expires: int, now: float | None = None) -> str | None:
        """A URL that GETs ``bucket/key`` for ``expires`` seconds from ``now`` (default: the clock);
        None where botocore must sign it (:meth:`url_base`)."""
        base = self.url_base(bucket)
        if base is None:
            return None
        t = time.gmtime(time.time() if now is None else now)
        amz_date, date = time.strftime("%Y%m%dT%H%M%SZ", t), time.strftime("%Y%m%d", t)
        u = urlsplit(base)
        path = u.path + "/" + _enc(key, safe="/~")
        scope = f"{date}/{self.region}/s3/aws4_request"
        # botocore's order in the URL; the canonical query sorts the encoded pairs
        params = [("X-Amz-Algorithm", "AWS4-HMAC-SHA256"), ("X-Amz-Credential", f"{self.access_key}/{scope}"),
                  ("X-Amz-Date", amz_date), ("X-Amz-Expires", str(int(expires))), ("X-Amz-SignedHeaders", "host")]
        if self.token is not None:
            params.append(("X-Amz-Security-Token", self.token))
        pairs = [(_enc(k), _enc(v)) for k, v in params]
        query = "&".join(f"{k}={v}" for k, v in pairs)
        canonical_query = "&".join(f"{k}={v}" for k, v in sorted(pairs))
        host = u.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if u.port is not None and u.port != _DEFAULT_PORTS.get(u.scheme):
            host = f"{host}:{u.port}"
        canonical = f"GET\n{path}\n{canonical_query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        sig = hmac.new(self._signing_key(date), to_sign.encode(), hashlib.sha256).hexdigest()
        return f"{u.scheme}://{u.netloc}{path}?{query}&X-Amz-Signature={sig}"
