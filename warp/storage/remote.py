"""Reads of a store's keys by range, without listing: what the read API fetches through.

:class:`Remote` wraps a store root (local path, ``s3://``, ``memory://``, ``http(s)://``) in a
*transport* that knows three requests: get a whole object, get a byte range of it, and ask
its size.

* Ranged reads of S3 objects are one GET each through a presigned URL on the standard library's
  ``http.client`` (:class:`_PresignedRanges`): pyarrow's S3 files send a HEAD for the size
  before their first read of an object, and the reader knows every size from the manifest.
  Where a proxy applies to the endpoint (or without boto3) they go through pyarrow as below.
* S3, local and memory stores go through pyarrow filesystems, built on first use: S3 through
  pyarrow's native client built from the one :class:`~warpdata.storage.locations.StorageConfig`,
  with the AWS SDK's own retries turned off (the loop below retries instead, so every attempt
  is counted and the total time is bounded), shared per configuration and process for a few
  minutes so credentials are resolved once. Whole small objects (``latest.json``, manifests,
  member indexes) are one GET through botocore on S3 (pyarrow sends a HEAD before every object
  it opens) and a plain ``open()`` on a local store, so ``warp info`` never imports pyarrow.
* ``http://`` and ``https://`` stores (any static web host or CDN serving a store folder) go
  through the standard library's ``http.client``: keep-alive connections per thread, one
  ranged ``GET`` per range (``Range: bytes=A-B``), up to 5 redirects (never https to http),
  no listing and no writes (docs/formats/registry.md, "HTTP stores"). A host that answers a
  range with the whole object (``python -m http.server``) is read whole from then on: each
  blob once, verified against its hash and kept in the blob cache (:meth:`Remote._whole`).

Every request warp sends itself follows the request policy of :mod:`warpdata.storage.policy`
(a deadline per attempt, a body cap, permanent failures typed at once).
Every request is counted in :attr:`Remote.stats` (:class:`RequestStats`: requests by kind,
bytes received, retries, throttled answers, seconds backing off); ``warp stream``, ``warm``,
``cat`` and ``doctor ws/name`` report them with ``-v`` and ``--json``.

Back-off (docs/formats/registry.md, "Retries"): a request answered 429 or 503 (S3's
``SlowDown``), a 408/500/502/504, a reset connection, a read timeout or a passed deadline is tried again after a
jittered exponential pause (uniform in ``[0, min(5 s, 0.1 s × 2^(n-1))]``, or the server's
``Retry-After`` when longer), for at most ``WARP_RETRY_BUDGET`` seconds (default 60) per
request; then :class:`~warpdata.core.errors.StoreBusyError` (exit 75) names the store,
the key, the attempts and the last answer. A refused connection is tried twice, a connect
timeout and an unresolvable host once, so a wrong endpoint still fails in seconds.

:class:`RangeFile` is one object opened for random access: thread-safe :meth:`RangeFile.read_at`
(member reads, footers) and the file protocol pyarrow's Parquet reader wraps, plus
:meth:`RangeFile.prefetch`, which fetches the column chunks a row-group read will need as a
few coalesced ranges in parallel (:func:`plan_ranges`), so the decoder then reads from memory.

Modules: this one holds :class:`Remote` (the retry loop, typed errors, whole-object reads from a
host that ignores Range); :mod:`warpdata.storage.wire` the requests sent over ``http.client`` and
the HTTP stores' transport; :mod:`warpdata.storage.s3reads` the S3, local and memory transport and
the presigned reads; :mod:`warpdata.storage.ranges` :class:`RangeFile` and :func:`plan_ranges`
(imported from here as before).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import (
    AuthenticationError,
    BlobNotFoundError,
    DataError,
    RangeNotSupportedError,
    StoreBusyError,
    StorePermissionError,
    StoreUnavailableError,
    WarpError,
)
from warpdata.storage.blobcache import BlobCache
from warpdata.storage.errors import translate_storage_error
from warpdata.storage.locations import HTTP_PROTOCOLS, Location, StorageConfig, parse_location
from warpdata.storage.policy import (
    BodyTooLarge,
    InsecureRedirect,
    RequestStats,
    is_tls_error,
    request_deadline,
    retry_budget,
)
from warpdata.storage.ranges import RangeFile, _handler_class, plan_ranges
from warpdata.storage.s3reads import _ArrowTransport
from warpdata.storage.wire import (
    HttpStatusError,
    RangeIgnored,
    S3ResponseError,
    _ConnectTimeout,
    _HttpTransport,
)

# lazy third-party imports: pyarrow (heavy) is imported by Remote.fs alone: key reads (`warp
# info`) do not load it

log = logging.getLogger(__name__)

__all__ = ["HttpStatusError", "RangeFile", "Remote", "RequestStats", "plan_ranges", "retry_budget"]

BACKOFF_BASE = 0.1  # seconds: the first pause is uniform in [0, 0.1 s]
BACKOFF_CAP = 5.0  # seconds: no single pause is longer (unless Retry-After asks for it)
CONNECT_ATTEMPTS = 2  # refused / unresolvable: one retry, then the error
CONNECT_TIMEOUT_ATTEMPTS = 1  # a connect that timed out already waited connect_timeout
STREAM_CHUNK = 8 << 20  # bytes per ranged GET of a streamed object (:meth:`Remote.stream_to`)
_WHOLE_HOSTS: set[str] = set()  # hosts seen to ignore Range in this process: their objects are read whole
_WHOLE_MU = threading.Lock()


#: store URL -> when (time.monotonic) it last answered a request of this process: the progress
#: that :meth:`Remote._call`'s retries are measured against
_ANSWERED: dict[str, float] = {}
PATIENCE = 10  # retry budgets one request may wait while the store answers other requests


class Remote:
    """Key reads against a store root: counted, retried within a budget, ranged, never listed."""

    def __init__(self, store_url: str | os.PathLike | Location | None = None, *, config: StorageConfig | None = None,
                 stats: RequestStats | None = None) -> None:
        """The reader of ``store_url`` (default ``WARP_STORE``); an :class:`~warpdata.storage.base.ObjectStore`
        makes its own (:attr:`~warpdata.storage.base.ObjectStore.remote`) with its configuration and counters."""
        url = store_url if store_url is not None else envvars.default_store()
        self.loc = url if isinstance(url, Location) else parse_location(url)
        self.config = config or StorageConfig.from_env()
        self.stats = stats if stats is not None else RequestStats()
        self.retry_budget = retry_budget()
        self.deadline = request_deadline()
        self.root = self.loc.path.rstrip("/")
        if self.loc.protocol in HTTP_PROTOCOLS:
            self.transport: Any = _HttpTransport(self.loc.url, self.config, self.stats, self.deadline)
        else:
            self.transport = _ArrowTransport(self.loc, self.config, self.stats, self.deadline)
        self._fs = None
        self._blob_cache = None

    @property
    def url(self) -> str:
        return self.loc.url

    @property
    def read_only(self) -> bool:
        return self.loc.read_only

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def url_of(self, key: str) -> str:
        return self.path(key) if self.loc.protocol == "file" else f"{self.loc.protocol}://{self.path(key).lstrip('/')}"

    @property
    def fs(self):
        """A pyarrow filesystem over this store, for ``pyarrow.dataset`` over shard paths (see
        :meth:`path`): the transport's native one for S3, local and memory stores (its reads are
        not counted), one over the counted, retried HTTP reads for an HTTP store."""
        if self._fs is None:
            if isinstance(self.transport, _ArrowTransport):
                self._fs = self.transport.fs
            else:
                from pyarrow import fs as pafs

                self._fs = pafs.PyFileSystem(_handler_class()(self))
        return self._fs

    # -- errors ----------------------------------------------------------------
    def _wrap(self, e: Exception, key: str, action: str = "read") -> Exception:
        if isinstance(e, WarpError):
            return e
        where = self.url_of(key)
        policy = _policy_error(e, where, action, self.url, self._host)
        if policy is not None:
            return policy
        if isinstance(e, HttpStatusError):
            if e.status == 401:
                return AuthenticationError(f"{where}: the web host asks for credentials (HTTP 401)",
                                           hint="HTTP stores are read without credentials: serve the store "
                                                "publicly, or use its s3:// URL with credentials")
            if e.status == 403:
                return StorePermissionError(f"the web host refused to {action} {where} (HTTP 403)",
                                       hint="check the host's access rules for the store folder")
            return StoreUnavailableError(f"cannot {action} {where}: {e}",
                                         hint=f"check that {self.url} serves the store folder "
                                              "(blobs/ and datasets/); 'warp doctor ws/name' tests a read")
        if isinstance(self.transport, _HttpTransport):
            import socket

            host = self.transport.netloc
            cause = ("refuses connections" if isinstance(e, ConnectionRefusedError) else
                     "does not resolve (DNS lookup failed: offline, or a wrong host name)"
                     if isinstance(e, socket.gaierror) else
                     f"did not answer within {self.config.connect_timeout:g}s" if isinstance(e, _ConnectTimeout)
                     else f"failed: {_reason(e)}")
            return StoreUnavailableError(f"cannot {action} {where}: the web host {host} {cause}",
                                         hint="check the store URL (WARP_STORE or --store) and the network",
                                         host=host)
        t = translate_storage_error(e, where, action)
        if t is e and not isinstance(e, FileNotFoundError):
            return StoreUnavailableError(f"cannot {action} {where}: {e}",
                                         hint="check the network and WARP_S3_ENDPOINT; 'warp doctor --only store'")
        return t

    def _busy(self, key: str, attempts: int, seconds: float, last: Exception):
        status = getattr(last, "status", None)
        return StoreBusyError(
            f"store {self.url} kept refusing reads of {key}: {attempts} attempt(s) over {seconds:.1f}s, "
            f"the last answered {_reason(last)}; gave up after the retry budget of {self.retry_budget:g}s",
            hint="the store is throttling or failing: rerun later (nothing was half-written), read with fewer "
                 "DataLoader workers or ranks, or raise WARP_RETRY_BUDGET (seconds)",
            store=self.url, key=key, attempts=attempts, seconds=round(seconds, 3),
            budget=self.retry_budget, **({"status": status} if status else {}))

    def _call(self, key: str, fn: Callable[[], Any]) -> Any:
        """Run one request with the retry policy (module docstring); the transport counts each
        request it sends (a HEAD that opens an S3 object, each redirect hop).

        Giving up is judged by progress, not per request: a transient failure is retried (backing
        off with full jitter) until the store has answered no request of this process for the retry
        budget, a throttling answer (503 SlowDown, 429) counting as an answer; one request gives up
        after :data:`PATIENCE` budgets whatever else is answered. A throttled store slows a job
        down; it does not fail it (docs/partitioning.md, "Throttling")."""
        t0 = time.monotonic()
        attempt = 0
        while True:
            try:
                got = fn()
                _ANSWERED[self.url] = time.monotonic()
                return got
            except (FileNotFoundError, RangeIgnored):
                _ANSWERED[self.url] = time.monotonic()  # an answer all the same
                raise
            except WarpError:
                raise
            except Exception as e:
                why = self.transport.classify(e)
                if why is None:
                    raise self._wrap(e, key) from e
                attempt += 1
                elapsed = time.monotonic() - t0
                if why == "throttle":  # "slow down" is the store answering: it is alive, only busy
                    _ANSWERED[self.url] = time.monotonic()
                if why in ("connect", "connect-timeout"):
                    limit = CONNECT_TIMEOUT_ATTEMPTS if why == "connect-timeout" else CONNECT_ATTEMPTS
                    if attempt >= limit:
                        raise self._wrap(e, key) from e
                    pause = random.uniform(0.05, 0.25)
                else:
                    pause = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1)))
                    after = getattr(e, "retry_after", None)
                    if after:
                        pause = max(pause, min(float(after), BACKOFF_CAP * 2))
                    quiet = time.monotonic() - max(t0, _ANSWERED.get(self.url, 0.0))  # since the store last answered
                    # ... and one key refused for ten budgets while others are served is given up too
                    if quiet + pause > self.retry_budget or elapsed + pause > PATIENCE * self.retry_budget:
                        raise self._busy(key, attempt, elapsed, e) from e
                self.stats.retried(why == "throttle", pause)
                log.debug(f"{self.url_of(key)}: {_reason(e)}; retry {attempt} in {pause:.2f}s")
                time.sleep(pause)

    # -- reads -------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        data = self._call(key, lambda: self.transport.get(key))
        if data is not None:
            self.stats.received(len(data))
        return data

    def size(self, key: str) -> int:
        """The object's size in bytes (one HEAD); BlobNotFoundError when it is missing."""
        n = self._call(key, lambda: self.transport.size(key))
        if n is None:
            raise self._missing(key)
        return int(n)

    def probe(self, key: str) -> int | None:
        """One HEAD of ``key``, not retried (a reachability check): its size, or None when the host
        answers that it has no such object. The host's other answers raise :class:`HttpStatusError`
        on HTTP stores; failures to reach it raise raw (:meth:`typed_error` types them)."""
        return self.transport.size(key)

    def typed_error(self, e: Exception, key: str = "", action: str = "read") -> Exception:
        """The typed warp error for a failure of a request for ``key`` (what the retry loop raises)."""
        return self._wrap(e, key, action)

    def missing_error(self, key: str):
        """The typed error of ``key`` missing from the store (BlobNotFoundError naming its URL)."""
        return self._missing(key)

    def _missing(self, key: str):
        return BlobNotFoundError(f"{self.url_of(key)} is missing from the store",
                                 hint="the version was published incompletely; republish it")

    def open(self, key: str, size: int | None = None) -> RangeFile:
        """Random access to the object by ranged reads (its size from the manifest: no request)."""
        return RangeFile(self, key, size)

    def read_range(self, key: str, start: int, length: int, size: int | None = None) -> bytes:
        """``length`` bytes from ``start``: one ranged GET (retried; counted). From a host seen to
        ignore Range, a slice of the whole object, fetched once into the blob cache (:meth:`_whole`)."""
        if length <= 0:
            return b""
        if self._host in _WHOLE_HOSTS:
            data = self._whole(key, start, length, size)
        else:
            try:
                data = self._call(key, lambda: self.transport.read_range(key, start, length, size))
            except FileNotFoundError:
                raise self._missing(key) from None
            except RangeIgnored as e:
                data = self._whole(key, start, length, size if size is not None else e.total, e)
            else:
                self.stats.received(len(data))
        if len(data) != length:
            raise DataError(f"{self.url_of(key)}: asked for {length} bytes at {start}, got {len(data)}",
                            hint="the stored object is shorter than the manifest says; republish the dataset")
        return data

    @property
    def _host(self) -> str:
        """The host whose answers decide how objects are read: an HTTP store's ``scheme://netloc``,
        an S3 store's endpoint."""
        t = self.transport
        if isinstance(t, _HttpTransport):
            return f"{t.scheme}://{t.netloc}"
        return self.config.endpoint_url or self.loc.protocol

    @property
    def ignores_range(self) -> bool:
        """Whether this store's host answered a ranged read with the whole object (this process)."""
        return self._host in _WHOLE_HOSTS

    def _whole(self, key: str, start: int, length: int, size: int | None, seen: RangeIgnored | None = None) -> bytes:
        """``length`` bytes at ``start`` of object ``key`` read whole: from a host that ignores Range
        the object is fetched by one GET, verified against the content hash its key names, kept in
        the blob cache and sliced from there (docs/formats/registry.md, "HTTP stores"). An object
        whose key names no hash cannot be verified: RangeNotSupportedError."""
        import re

        m = re.fullmatch(r"blobs/sha256/[0-9a-f]{2}/([0-9a-f]{64})", key)
        if m is None:
            raise RangeNotSupportedError(
                f"{self.url_of(key)}: the host answered a ranged read with the whole object, and this object "
                "has no content hash to verify a whole read against",
                hint="serve the store from a host that honours HTTP Range (S3, nginx, Apache, CDNs do)",
                url=self.url_of(key))
        if size is None:
            size = self.size(key)
        self._note_whole_host(key, size)
        cache = self.blob_cache
        h = m.group(1)

        def writer(f) -> None:
            f.write(self._get_whole(key, size))

        try:
            path = cache.fetch(h, writer, size=size, source=self.url_of(key))
        except FileNotFoundError:
            raise self._missing(key) from None
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    def _note_whole_host(self, key: str, size: int) -> None:
        with _WHOLE_MU:
            first = self._host not in _WHOLE_HOSTS
            _WHOLE_HOSTS.add(self._host)
        if first:
            log.warning(f"the host {self._host} ignores HTTP Range requests: each object is downloaded whole "
                        f"(the first, {key.rsplit('/', 1)[-1][:12]}, is {size} bytes), verified and kept in the "
                        "blob cache; a host that honours Range reads only the bytes needed")

    def _get_whole(self, key: str, size: int) -> bytes:
        """The whole object by one GET (retried; counted)."""
        try:
            data = self._call(key, lambda: self.transport.get_whole(key, size))
        except FileNotFoundError:
            raise self._missing(key) from None
        self.stats.received(len(data))
        return data

    @property
    def blob_cache(self):
        """The blob cache whole objects are kept in (:meth:`_whole`): the one a reader set, or the default."""
        if self._blob_cache is None:
            self._blob_cache = BlobCache()
        return self._blob_cache

    @blob_cache.setter
    def blob_cache(self, cache) -> None:
        self._blob_cache = cache

    def stream_to(self, key: str, dst, size: int, *, hint: str | None = None, chunk: int = STREAM_CHUNK) -> None:
        """Object ``key`` into ``dst`` (a writable file object), ``chunk`` bytes per ranged GET, each
        under the request policy (its attempt's deadline, a body capped at what it asked for, retries
        within the budget, counted in :attr:`stats`), so memory stays at one chunk and no read can
        hang or grow without bound.

        ``size`` (a manifest's byte count) is what the object must hold, never what sizes a buffer:
        the last read asks for one byte more, so an object that is longer, or shorter, is a
        :class:`~warpdata.core.errors.DataError` naming it (with ``hint``). A failed write to ``dst``
        (this machine's disk) is raised as it is, not retried and not named a store error.
        """
        def mismatch(got: str) -> DataError:
            return DataError(f"{self.url_of(key)}: expected {size} bytes, the store {got}",
                             hint=hint or "the object was replaced, or what names its size is wrong",
                             path=self.url_of(key))

        if size <= 0:
            if self.size(key):
                raise mismatch("holds more")
            return
        pos = 0
        while pos < size:
            n = min(chunk, size - pos)
            last = pos + n == size
            data = self._read_upto(key, pos, n + 1 if last else n)
            if len(data) > n:
                raise mismatch("holds more")
            if len(data) < n:
                raise mismatch(f"sent {pos + len(data)}")
            dst.write(data)
            pos += n

    def _read_upto(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``start`` (fewer where the object ends first): one ranged GET
        under the policy, or a slice of the whole object from a host that ignores Range."""
        if self._host in _WHOLE_HOSTS:
            return self._whole(key, start, length, None)
        try:
            data = self._call(key, lambda: self.transport.read_range(key, start, length, None))
        except FileNotFoundError:
            raise self._missing(key) from None
        except RangeIgnored as e:
            return self._whole(key, start, length, e.total, e)
        self.stats.received(len(data))
        return data

    def copy_to(self, key: str, dst, size: int | None = None, chunk: int = 8 << 20) -> None:
        """Stream the whole object into ``dst`` (a writable file object), ``chunk`` bytes per ranged GET.

        From a host that ignores Range, by one GET straight into ``dst``, never through
        :meth:`_whole`: the caller is often the blob cache filling this very blob, whose lock
        :meth:`_whole` would wait on forever."""
        total = size if size is not None else self.size(key)
        if self._host in _WHOLE_HOSTS:
            dst.write(self._get_whole(key, total))
            return
        pos = 0
        while pos < total:
            n = min(chunk, total - pos)
            try:
                data = self._call(key, lambda at=pos, n=n: self.transport.read_range(key, at, n, total))
            except FileNotFoundError:
                raise self._missing(key) from None
            except RangeIgnored:
                self._note_whole_host(key, total)
                dst.write(self._get_whole(key, total)[pos:])
                return
            self.stats.received(len(data))
            if len(data) != n:
                raise DataError(f"{self.url_of(key)}: asked for {n} bytes at {pos}, got {len(data)}",
                                hint="the stored object is shorter than the manifest says; republish the dataset")
            dst.write(data)
            pos += n


def _policy_error(e: BaseException, where: str, action: str, store: str, endpoint: str):
    """The typed error of a permanent failure the request policy names (TLS, an oversize body,
    a redirect to plain http, an answer for another range) from the host at ``endpoint``, or
    None for any other failure."""
    from urllib.parse import urlsplit

    host = urlsplit(endpoint).netloc or endpoint
    if is_tls_error(e):
        return StoreUnavailableError(
            f"cannot {action} {where}: the TLS handshake with {host} failed ({_reason(e)})",
            hint="check that the host serves https on that port (a plain-HTTP host needs an http:// URL) and "
                 "that its certificate is valid for the name and trusted (SSL_CERT_FILE names extra CAs)",
            cause="tls", host=host)
    if isinstance(e, BodyTooLarge):
        return StoreUnavailableError(
            f"cannot {action} {where}: the host {host} {'announced' if e.announced else 'sent'} more than the "
            f"{e.cap} bytes expected", hint=f"check that {store} serves the store folder unchanged (a proxy or "
                                              "host that rewrites answers cannot serve a store)",
            cause="oversize", host=host, cap=e.cap)
    if isinstance(e, InsecureRedirect):
        return StoreUnavailableError(
            f"cannot {action} {where}: the host {host} redirects to plain http ({e.target}); warp never downgrades "
            "https", hint="use the https URL the host serves without a downgrade, or fix the host's redirect",
            cause="redirect-downgrade", host=host)
    if isinstance(e, HttpStatusError | S3ResponseError) and getattr(e, "status", None) == 206:
        return StoreUnavailableError(
            f"cannot {action} {where}: the host {host} answered a ranged read with another range ({_reason(e)})",
            hint=f"check that {store} is served by a host (or CDN) that implements HTTP Range correctly",
            cause="content-range", host=host)
    return None


def _reason(e: BaseException) -> str:
    if isinstance(e, HttpStatusError):
        return f"HTTP {e.status}" + (f" {e.reason}" if e.reason else "")
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
