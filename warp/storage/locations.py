"""Storage URLs over fsspec, with one S3 configuration for every client.

A location is a local path, ``file://`` URL, ``s3://bucket/prefix``,
``memory://name`` or ``http(s)://host/prefix`` (a store served read-only by any
static web host or CDN; read by :mod:`warpdata.storage.remote` with ranged GETs). :class:`StorageConfig` holds the S3 settings (endpoint,
region, profile, path-style addressing) read from ``WARP_S3_*`` / the usual
``AWS_*`` variables, and builds identically configured clients for s3fs,
pyarrow's native S3 filesystem and DuckDB, so the three never disagree about
where a bucket lives.

s3fs is set up for ranged reads (``default_cache_type="none"``: its default
50 MiB read-ahead fetched 127 % of a Parquet file for a one-column read) with
the listings cache left on.

Failing fast (docs/formats/registry.md, "Store errors"): a connection that is
refused or whose host does not resolve is tried twice, a connect that times
out (after ``connect_timeout``) once, instead of botocore's five attempts with
exponential back-off (15-20 s before the first error message); throttling and
server errors keep the full ``retries``. Readers over pyarrow are refused up
front when no credentials exist (pyarrow would silently go anonymous and
report a DNS or access error instead).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from warpdata.core import envvars
from warpdata.core.errors import (
    AuthenticationError,
    ConfigError,
    DependencyError,
    ReadOnlyStoreError,
    install_hint,
)

# lazy third-party imports: fsspec, s3fs, pyarrow.fs and botocore (heavy; s3fs and botocore the
# [s3] extra) are imported inside the functions that use them, so importing this module loads none
# of them: parsing a URL needs none


@dataclass(frozen=True)
class StorageConfig:
    endpoint_url: str | None = None
    region: str = "us-east-1"
    profile: str | None = None
    path_style: bool = False
    anon: bool = False
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    retries: int = 5
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def from_env(cls) -> StorageConfig:
        endpoint = envvars.get("WARP_S3_ENDPOINT") or envvars.get("AWS_ENDPOINT_URL_S3") or envvars.get("AWS_ENDPOINT_URL")
        region = envvars.get("WARP_S3_REGION") or envvars.get("AWS_REGION") or envvars.get("AWS_DEFAULT_REGION") or "us-east-1"
        profile = envvars.get("WARP_S3_PROFILE") or envvars.get("AWS_PROFILE")
        path_style = envvars.flag("WARP_S3_PATH_STYLE") or bool(endpoint and "amazonaws.com" not in endpoint)
        return cls(endpoint_url=endpoint, region=region, profile=profile, path_style=path_style,
                   anon=envvars.flag("WARP_S3_ANON"))

    # -- clients ---------------------------------------------------------
    def s3fs_kwargs(self) -> dict[str, Any]:
        client_kwargs: dict[str, Any] = {"region_name": self.region}
        if self.endpoint_url:
            client_kwargs["endpoint_url"] = self.endpoint_url
        config_kwargs: dict[str, Any] = {
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "retries": {"max_attempts": self.retries, "mode": "adaptive"},
        }
        if self.path_style:
            config_kwargs["s3"] = {"addressing_style": "path"}
        kw: dict[str, Any] = {
            "client_kwargs": client_kwargs,
            "config_kwargs": config_kwargs,
            "default_cache_type": "none",
            "default_block_size": 1 << 20,
            "use_listings_cache": True,
        }
        if self.profile:
            kw["profile"] = self.profile
        if self.anon:
            kw["anon"] = True
        return kw

    def s3fs(self):
        try:
            import s3fs
        except ImportError:
            raise DependencyError("S3 storage needs the 's3fs' package, which is not installed",
                                  hint=install_hint("s3")) from None
        return _s3fs_class(s3fs)(**self.s3fs_kwargs())

    def pyarrow_s3(self, retry_attempts: int | None = None):
        """pyarrow's native S3 filesystem; ``retry_attempts`` (attempts per request, 1: none) replaces
        the AWS SDK's own retry strategy, for callers that retry with their own budget."""
        from pyarrow import fs as pafs

        kw: dict[str, Any] = {"region": self.region, "connect_timeout": self.connect_timeout,
                              "request_timeout": self.read_timeout}
        if retry_attempts is not None:
            kw["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=retry_attempts)
        if self.endpoint_url:
            u = urlparse(self.endpoint_url)
            kw["endpoint_override"] = u.netloc or u.path
            kw["scheme"] = u.scheme or "https"
        if self.path_style:
            kw["force_virtual_addressing"] = False
        if self.anon:
            kw["anonymous"] = True
        else:
            creds = self._credentials()
            if creds is None:
                raise _no_credentials_error(self)
            kw.update(access_key=creds[0], secret_key=creds[1], session_token=creds[2])
        return pafs.S3FileSystem(**kw)

    def _credentials(self) -> tuple[str, str, str | None] | None:
        """Resolve credentials through botocore's usual chain (env, profile, IMDS)."""
        if self.anon:
            return None
        try:
            import botocore.session
        except ImportError:
            return None
        session = botocore.session.Session(profile=self.profile) if self.profile else botocore.session.Session()
        c = session.get_credentials()
        if c is None:
            return None
        f = c.get_frozen_credentials()
        return f.access_key, f.secret_key, f.token

    def credentials_source(self) -> str:
        try:
            import botocore.session
        except ImportError:
            return "unknown (botocore not installed)"
        session = botocore.session.Session(profile=self.profile) if self.profile else botocore.session.Session()
        c = session.get_credentials()
        return "none found" if c is None else str(getattr(c, "method", "unknown"))


CONNECT_ATTEMPTS = 2  # refused / unresolvable: one retry, then the error
CONNECT_TIMEOUT_ATTEMPTS = 1  # a connect that timed out already waited connect_timeout

_S3FS: dict[str, type] = {}


def _limit_connect_retries(caught_exception: BaseException | None = None, attempts: int = 0, **_: Any) -> None:
    """botocore ``needs-retry`` hook: stop retrying connection failures early.

    botocore's own retry handler keeps retrying them (5 attempts, exponential
    back-off); raising the caught exception here ends the request at once.
    Throttling, 5xx and read timeouts are left to botocore.
    """
    if caught_exception is None:
        return
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ConnectTimeoutError

    if not isinstance(caught_exception, BotoConnectionError):
        return
    limit = CONNECT_TIMEOUT_ATTEMPTS if isinstance(caught_exception, ConnectTimeoutError) else CONNECT_ATTEMPTS
    if attempts >= limit:
        raise caught_exception


def limit_connect_retries(client: Any) -> Any:
    """Install the connection-retry limit on a botocore/boto3 S3 client; returns it."""
    client.meta.events.register("needs-retry.s3", _limit_connect_retries, unique_id="warp-limit-connect-retries")
    return client


def _s3fs_class(s3fs: Any) -> type:
    """``s3fs.S3FileSystem`` whose client gets :func:`limit_connect_retries` when it is made."""
    cls = _S3FS.get("cls")
    if cls is None:
        class WarpS3FileSystem(s3fs.S3FileSystem):
            async def set_session(self, refresh: bool = False, kwargs: dict | None = None):
                client = await super().set_session(refresh, kwargs or {})
                return limit_connect_retries(client)

        cls = _S3FS["cls"] = WarpS3FileSystem
    return cls


def _no_credentials_error(cfg: StorageConfig) -> Exception:
    where = f"profile {cfg.profile!r}" if cfg.profile else \
        "the environment, ~/.aws/credentials, ~/.aws/config or instance metadata"
    return AuthenticationError(
        f"no S3 credentials found (looked in {where})",
        hint="set AWS_PROFILE (or WARP_S3_PROFILE), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
             "WARP_S3_ANON=1 reads a public bucket; 'warp doctor --only store' checks the setup")


@dataclass(frozen=True)
class Location:
    """A parsed storage URL: ``protocol`` is 'file', 's3', 'memory', 'http' or 'https'."""

    protocol: str
    path: str  # fsspec path: /abs/local, bucket/prefix, /memname, host[:port]/prefix

    @property
    def read_only(self) -> bool:
        """HTTP(S) stores are read-only: a static host takes no writes (docs/formats/registry.md)."""
        return self.protocol in HTTP_PROTOCOLS

    @property
    def url(self) -> str:
        if self.protocol == "file":
            return self.path
        return f"{self.protocol}://{self.path.lstrip('/')}"

    def join(self, *parts: str) -> Location:
        p = self.path.rstrip("/")
        for part in parts:
            p = f"{p}/{part.strip('/')}"
        return Location(self.protocol, p)


def parse_location(url: str | os.PathLike) -> Location:
    s = os.fspath(url)
    if "://" not in s:
        return Location("file", os.path.abspath(os.path.expanduser(s)))
    scheme, _, rest = s.partition("://")
    scheme = scheme.lower()
    if scheme == "file":
        if rest.startswith("localhost/"):  # file://localhost/abs is the same as file:///abs
            rest = rest[len("localhost"):]
        elif not rest.startswith("/"):
            raise ConfigError(f"file URL {s!r} names a host or a relative path",
                              hint="use file:///absolute/path or a plain path")
        return Location("file", os.path.abspath(rest))
    if scheme in ("s3", "s3a"):
        if not rest.strip("/"):
            raise ConfigError(f"storage URL {s!r} has no bucket", hint="use s3://BUCKET/PREFIX")
        return Location("s3", rest.strip("/"))
    if scheme == "memory":
        return Location("memory", "/" + rest.strip("/"))
    if scheme in HTTP_PROTOCOLS:
        host, _, prefix = rest.partition("/")
        if not host or "?" in rest or "#" in rest or "@" in host:
            raise ConfigError(f"store URL {s!r} needs a host and may not carry a query, fragment or credentials",
                              hint="use https://HOST/PREFIX (the folder that holds blobs/ and datasets/)")
        prefix = prefix.strip("/")
        return Location(scheme, f"{host.lower()}/{prefix}" if prefix else host.lower())
    raise ConfigError(f"unsupported storage URL scheme {scheme!r} in {s!r}",
                      hint="use a local path, file://, s3://, memory:// or https:// (read-only)")


HTTP_PROTOCOLS = ("http", "https")


def missing_store_folder(loc: Location) -> tuple[str, str] | None:
    """(cause, hint) when a local store's folder does not exist or is not a folder; else None.

    A store pointed at a folder that is not there is almost always a typo in
    WARP_STORE / --store; readers say so instead of "no datasets".
    """
    if loc.protocol != "file" or os.path.isdir(loc.path):
        return None
    hint = "check WARP_STORE or --store for a typo; 'warp publish' creates the store folder"
    if os.path.exists(loc.path):
        return f"store {loc.path} is not a folder", hint
    return f"store folder {loc.path} does not exist", hint


def filesystem(loc: Location, config: StorageConfig | None = None):
    """The fsspec filesystem for a location (S3 configured from ``config`` or env)."""
    if loc.protocol == "file":
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(auto_mkdir=True)
    if loc.protocol == "memory":
        from fsspec.implementations.memory import MemoryFileSystem

        return MemoryFileSystem()
    if loc.protocol == "s3":
        return (config or StorageConfig.from_env()).s3fs()
    if loc.protocol in HTTP_PROTOCOLS:
        raise ReadOnlyStoreError(f"store {loc.url} is served over HTTP: it has no filesystem to list or write",
                                 hint="HTTP(S) stores are read-only (warp stream/cat/warm/doctor); publish to "
                                      "the bucket or folder the host serves, then read it over HTTP")
    raise ConfigError(f"unsupported protocol {loc.protocol}")


def open_url(url: str, config: StorageConfig | None = None):
    """Return (fs, path) for a URL."""
    loc = parse_location(url)
    return filesystem(loc, config), loc.path
