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
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from warpdata.core import envvars
from warpdata.storage.locations import HTTP_PROTOCOLS, Location, StorageConfig, parse_location
from warpdata.storage.policy import (
    ERROR_CAP,
    JSON_CAP,
    THROTTLE_STATUS,
    TRANSIENT_STATUS,
    WATCHDOG,
    BodyTooLarge,
    DeadlineExceeded,
    InsecureRedirect,
    RequestStats,
    allowed_seconds,
    is_tls_error,
    read_body,
    request_deadline,
    retry_budget,
)
from warpdata.storage.s3client import CRED_ENV
from warpdata.storage.s3sign import SigV4Presigner

log = logging.getLogger(__name__)

__all__ = ["HttpStatusError", "RangeFile", "Remote", "RequestStats", "plan_ranges", "retry_budget"]

BACKOFF_BASE = 0.1  # seconds: the first pause is uniform in [0, 0.1 s]
BACKOFF_CAP = 5.0  # seconds: no single pause is longer (unless Retry-After asks for it)
CONNECT_ATTEMPTS = 2  # refused / unresolvable: one retry, then the error
CONNECT_TIMEOUT_ATTEMPTS = 1  # a connect that timed out already waited connect_timeout
# Planning the ranged GETs of a read (:func:`plan_ranges`; docs/design.md §9, "S3": nearby ranged
# GETs are coalesced). A request costs about what a few MB of transfer cost (on S3 its latency; on
# a local moto server its CPU), so needed ranges up to HOLE_SIZE apart are fetched by one GET, as
# long as the bytes fetched beyond the needed ones stay within MAX_WASTE of them; no GET is longer
# than SPLIT_SIZE, so a long run is fetched as several GETs in parallel. Gaps up to SMALL_HOLE
# (pyarrow's pre-buffering hole) are merged whatever they cost: a small read is one GET.
SMALL_HOLE = 8 << 10
HOLE_SIZE = 1 << 20
SPLIT_SIZE = 16 << 20
MAX_WASTE = 0.04
PREFETCH_THREADS = 8
MAX_REDIRECTS = 5
STREAM_CHUNK = 8 << 20  # bytes per ranged GET of a streamed object (:meth:`Remote.stream_to`)
_WHOLE_HOSTS: set[str] = set()  # hosts seen to ignore Range in this process: their objects are read whole
_WHOLE_MU = threading.Lock()


class HttpStatusError(OSError):
    """An HTTP answer other than the one asked for (the transport's raw error, before typing)."""

    def __init__(self, status: int, url: str, reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} {reason} from {url}".replace("  ", " "))
        self.status, self.url, self.reason, self.retry_after = status, url, reason, retry_after


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
        from warpdata.core.errors import (
            AuthenticationError,
            StorePermissionError,
            StoreUnavailableError,
            WarpError,
        )
        from warpdata.storage.errors import translate_storage_error

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
        from warpdata.core.errors import StoreBusyError

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
        request it sends (a HEAD that opens an S3 object, each redirect hop)."""
        from warpdata.core.errors import WarpError

        t0 = time.monotonic()
        attempt = 0
        while True:
            try:
                return fn()
            except (WarpError, FileNotFoundError, RangeIgnored):
                raise
            except Exception as e:
                why = self.transport.classify(e)
                if why is None:
                    raise self._wrap(e, key) from e
                attempt += 1
                elapsed = time.monotonic() - t0
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
                    if elapsed + pause > self.retry_budget:
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
        from warpdata.core.errors import BlobNotFoundError

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
            from warpdata.core.errors import DataError

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

        from warpdata.core.errors import RangeNotSupportedError

        m = re.fullmatch(r"blobs/sha256/[0-9a-f]{2}/([0-9a-f]{64})", key)
        if m is None:
            raise RangeNotSupportedError(
                f"{self.url_of(key)}: the host answered a ranged read with the whole object, and this object "
                "has no content hash to verify a whole read against",
                hint="serve the store from a host that honours HTTP Range (S3, nginx, Apache, CDNs do)",
                url=self.url_of(key))
        if size is None:
            size = self.size(key)
        with _WHOLE_MU:
            first = self._host not in _WHOLE_HOSTS
            _WHOLE_HOSTS.add(self._host)
        if first:
            log.warning(f"the host {self._host} ignores HTTP Range requests: each object is downloaded whole "
                        f"(the first, {key.rsplit('/', 1)[-1][:12]}, is {size} bytes), verified and kept in the "
                        "blob cache; a host that honours Range reads only the bytes needed")
        cache = self.blob_cache
        h = m.group(1)

        def writer(f) -> None:
            data = self._call(key, lambda: self.transport.get_whole(key, size))
            self.stats.received(len(data))
            f.write(data)

        try:
            path = cache.fetch(h, writer, size=size, source=self.url_of(key))
        except FileNotFoundError:
            raise self._missing(key) from None
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    @property
    def blob_cache(self):
        """The blob cache whole objects are kept in (:meth:`_whole`): the one a reader set, or the default."""
        if self._blob_cache is None:
            from warpdata.storage.blobcache import BlobCache

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
        from warpdata.core.errors import DataError

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
        """Stream the whole object into ``dst`` (a writable file object), ``chunk`` bytes per ranged GET."""
        total = size if size is not None else self.size(key)
        pos = 0
        while pos < total:
            n = min(chunk, total - pos)
            dst.write(self.read_range(key, pos, n, total))
            pos += n


def _policy_error(e: BaseException, where: str, action: str, store: str, endpoint: str):
    """The typed error of a permanent failure the request policy names (TLS, an oversize body,
    a redirect to plain http, an answer for another range) from the host at ``endpoint``, or
    None for any other failure."""
    from urllib.parse import urlsplit

    from warpdata.core.errors import StoreUnavailableError

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


# -- range files ------------------------------------------------------------------

_POOL: tuple[int, Any] | None = None
_POOL_MU = threading.Lock()


def _pool():
    """The process's prefetch threads (made again after a fork: a forked pool has no threads)."""
    global _POOL
    with _POOL_MU:
        if _POOL is None or _POOL[0] != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            _POOL = (os.getpid(), ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="warp-range"))
        return _POOL[1]


def plan_ranges(ranges: Sequence[tuple[int, int]], hole: int | None = None, split: int | None = None,
                waste: float | None = None, small: int | None = None) -> list[tuple[int, int]]:
    """The ranged GETs that fetch ``(offset, length)`` ranges: sorted, disjoint ``(offset, length)``.

    Overlapping and touching ranges are one run. The gaps between runs are then merged, smallest
    first, while the merged run stays at most ``split`` bytes and the gap is at most ``small``
    bytes, or at most ``hole`` bytes with all merged gaps together at most ``waste`` times the
    needed bytes. A run still longer than ``split`` is cut into near-equal pieces of at most
    ``split`` bytes. So every needed byte is fetched once, and every other byte fetched lies in
    a merged gap of at most ``hole`` bytes. Defaults: :data:`HOLE_SIZE`, :data:`SPLIT_SIZE`,
    :data:`MAX_WASTE`, :data:`SMALL_HOLE`.
    """
    hole = HOLE_SIZE if hole is None else hole
    split = SPLIT_SIZE if split is None else split
    waste = MAX_WASTE if waste is None else waste
    small = SMALL_HOLE if small is None else small
    runs: list[list[int]] = []
    for off, n in sorted((int(o), int(n)) for o, n in ranges if n > 0):
        if runs and off <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], off + n)
        else:
            runs.append([off, off + n])
    if not runs:
        return []
    budget = waste * sum(e - s for s, e in runs)
    # union-find over runs: a merged group keeps its [start, end) at its root
    parent = list(range(len(runs)))
    span = [list(r) for r in runs]

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for gap, i in sorted((runs[i + 1][0] - runs[i][1], i) for i in range(len(runs) - 1)):
        if gap > small and (gap > hole or gap > budget):
            continue
        a, b = root(i), root(i + 1)
        if span[b][1] - span[a][0] > split:
            continue
        parent[b] = a
        span[a][1] = span[b][1]
        budget -= gap
    out: list[tuple[int, int]] = []
    for i in range(len(runs)):
        if root(i) != i:
            continue
        s, e = span[i]
        pieces = -(-(e - s) // split)
        step = -(-(e - s) // pieces)
        for k in range(s, e, step):
            out.append((k, min(step, e - k)))
    return out


class RangeFile:
    """One store object opened for random access by ranged reads.

    :meth:`read_at` is thread-safe (no shared position). The file protocol (``seek``, ``tell``,
    ``read``) is what ``pyarrow.PythonFile`` wraps for the Parquet reader; reads inside ranges
    fetched by :meth:`prefetch` are served from memory, the rest by one ranged GET each.
    """

    def __init__(self, remote: Remote, key: str, size: int | None = None) -> None:
        self.remote, self.key = remote, key
        self._size = size
        self._pos = 0
        self.closed = False
        self._mu = threading.Lock()
        self._held: dict[int, tuple[int, bytes]] = {}  # token -> (offset, bytes)
        self._token = 0

    def __repr__(self) -> str:
        return f"RangeFile({self.remote.url_of(self.key)!r})"

    def size(self) -> int:
        if self._size is None:
            self._size = self.remote.size(self.key)
        return self._size

    def _from_held(self, off: int, n: int) -> bytes | None:
        """``n`` bytes at ``off`` from prefetched ranges (which may be consecutive pieces of one
        run, cut at the split size), or None when some of them were not prefetched."""
        with self._mu:
            held = self._held.values()
            for start, data in held:
                if start <= off and off + n <= start + len(data):
                    return data[off - start:off - start + n]
            parts, at, end = [], off, off + n
            while at < end:
                nxt = next(((s, d) for s, d in held if s <= at < s + len(d)), None)
                if nxt is None:
                    return None
                s, d = nxt
                parts.append(d[at - s:min(end, s + len(d)) - s])
                at = s + len(d)
        return b"".join(parts)

    def read_at(self, nbytes: int, offset: int) -> bytes:
        n = max(0, min(nbytes, self.size() - offset))
        if n == 0:
            return b""
        hit = self._from_held(offset, n)
        if hit is not None:
            return hit
        return self.remote.read_range(self.key, offset, n, self._size)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> list[int]:
        """Fetch ``(offset, length)`` ranges as :func:`plan_ranges` plans them, in parallel; tokens
        for :meth:`release`."""
        merged = plan_ranges(ranges)
        if not merged:
            return []
        if len(merged) == 1:
            got = [self.remote.read_range(self.key, merged[0][0], merged[0][1], self._size)]
        else:
            got = list(_pool().map(lambda r: self.remote.read_range(self.key, r[0], r[1], self._size), merged))
        tokens = []
        with self._mu:
            for (off, _n), data in zip(merged, got, strict=True):
                self._token += 1
                self._held[self._token] = (off, data)
                tokens.append(self._token)
        return tokens

    def release(self, tokens: Sequence[int]) -> None:
        with self._mu:
            for t in tokens:
                self._held.pop(t, None)

    @contextlib.contextmanager
    def prefetched(self, ranges: Sequence[tuple[int, int]]):
        tokens = self.prefetch(ranges)
        try:
            yield
        finally:
            self.release(tokens)

    # -- the file protocol (pyarrow.PythonFile) ------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: None}[whence]
        self._pos = (self.size() if base is None else base) + offset
        return self._pos

    def read(self, nbytes: int | None = None) -> bytes:
        n = self.size() - self._pos if nbytes is None or nbytes < 0 else nbytes
        data = self.read_at(n, self._pos)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self.closed = True
        with self._mu:
            self._held.clear()

    def __enter__(self) -> RangeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_HANDLER: list[type] = []


def _handler_class() -> type:
    """:class:`_RemoteHandler` as a ``pyarrow.fs.FileSystemHandler`` (made on first use: pyarrow loads lazily)."""
    if not _HANDLER:
        from pyarrow import fs as pafs

        _HANDLER.append(type("RemoteHandler", (_RemoteHandler, pafs.FileSystemHandler), {}))
    return _HANDLER[0]


class _RemoteHandler:
    """A read-only ``pyarrow.fs.FileSystemHandler`` over a :class:`Remote` (paths as :meth:`Remote.path`)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def _key(self, path: str) -> str:
        """The store key of a path made by :meth:`Remote.path` (a leading slash is optional)."""
        root = (self.remote.root + "/").lstrip("/")
        p = path.lstrip("/")
        return p[len(root):] if p.startswith(root) else p

    def get_type_name(self) -> str:
        return "warp-remote"

    def equals(self, other) -> bool:
        return isinstance(other, _RemoteHandler) and other.remote is self.remote

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths):
        from pyarrow import fs as pafs

        out = []
        for p in paths:
            try:
                out.append(pafs.FileInfo(p, pafs.FileType.File, size=self.remote.size(self._key(p))))
            except FileNotFoundError:
                out.append(pafs.FileInfo(p, pafs.FileType.NotFound))
        return out

    def open_input_file(self, path: str):
        import pyarrow as pa

        return pa.PythonFile(self.remote.open(self._key(path)), mode="r")

    def open_input_stream(self, path: str):
        return self.open_input_file(path)

    def _read_only(self, *args: Any, **kw: Any):
        from warpdata.core.errors import ReadOnlyStoreError

        raise ReadOnlyStoreError(f"{self.remote.url}: the read path writes nothing")

    get_file_info_selector = create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only


# -- transports ----------------------------------------------------------------------

_S3_FS: dict[tuple, tuple[float, Any]] = {}
_S3_FS_TTL = 300.0  # seconds a filesystem (and the credentials resolved into it) is reused

_CRED_ENV = CRED_ENV


def _pyarrow_s3(config):
    """One pyarrow S3 filesystem per configuration, credential environment and process, reused for
    a few minutes: building one resolves credentials through botocore (~50 ms), which every
    ``Dataset`` open would otherwise pay again. Its SDK retries are off (:meth:`Remote._call` retries)."""
    key = (config, tuple(os.environ.get(k) for k in _CRED_ENV), os.getpid())
    now = time.monotonic()
    hit = _S3_FS.get(key)
    if hit is not None and now - hit[0] < _S3_FS_TTL:
        return hit[1]
    fs = config.pyarrow_s3(retry_attempts=1)
    if len(_S3_FS) >= 16:
        _S3_FS.clear()
    _S3_FS[key] = (now, fs)
    return fs


_S3_CLIENTS: dict[tuple, tuple[float, Any]] = {}
_PRESIGNED: dict[tuple, tuple[float, Any]] = {}  # _PresignedRanges (or None) per configuration, like _S3_CLIENTS


def _live_readers():
    import weakref

    return weakref.WeakSet()


_LIVE_READERS = _live_readers()  # every _PresignedRanges, for the fork hook below


def _after_fork_in_child() -> None:
    """A child forked while another thread held a reader's lock would wait on it forever: give each
    reader a new lock and no connections (they belong to the parent)."""
    for r in list(_LIVE_READERS):
        r._mu = threading.Lock()
        r._idle = {}
        r._pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _s3_client(config):
    """One botocore S3 client per configuration, credential environment and process (a forked
    DataLoader worker must not share its parent's connection pool), reused like
    :func:`_pyarrow_s3`, with botocore's retries off (:meth:`Remote._call` retries); None
    without boto3 (whole-object reads then go through pyarrow: HEAD + GET)."""
    key = (config, tuple(os.environ.get(k) for k in _CRED_ENV), os.getpid())
    now = time.monotonic()
    hit = _S3_CLIENTS.get(key)
    if hit is not None and now - hit[0] < _S3_FS_TTL:
        return hit[1]
    import importlib.util

    if importlib.util.find_spec("boto3") is None:  # the [s3] extra
        return None
    from warpdata.storage.s3client import boto3_client

    # SigV4 (which every region accepts for query signing; botocore may pick SigV2): this one client
    # both sends whole-object GETs and signs the presigned URLs of ranged reads
    client = boto3_client(config, attempts=1, signature="s3v4")
    if len(_S3_CLIENTS) >= 16:
        _S3_CLIENTS.clear()
    _S3_CLIENTS[key] = (now, client)
    return client


_THROTTLE_TEXT = ("HTTP status 503", "HTTP status 429", "SLOW_DOWN", "SlowDown", "THROTTLING", "Throttl",
                  "REQUEST_LIMIT_EXCEEDED", "TooManyRequests", "ServiceUnavailable", "SERVICE_UNAVAILABLE")
_TRANSIENT_TEXT = ("HTTP status 500", "HTTP status 502", "HTTP status 504", "INTERNAL_FAILURE",
                   "Failed to flush response stream", "curlCode: 28", "curlCode: 52", "curlCode: 55",
                   "curlCode: 56", "NETWORK_CONNECTION", "Connection reset", "REQUEST_TIMEOUT", "RequestTimeout")


class _ArrowTransport:
    """Requests through a pyarrow filesystem (native S3, local, or fsspec's memory filesystem)."""

    def __init__(self, loc, config, stats: RequestStats, deadline: float) -> None:
        self.loc, self.config = loc, config
        self.deadline = deadline  # seconds: an attempt's base deadline (WARP_REQUEST_DEADLINE)
        self.protocol = loc.protocol
        self.stats = stats
        self._fs: Any = None
        self.root = loc.path.rstrip("/")
        self._files: dict[str, Any] = {}  # key -> open native file: S3 pays its HEAD once per key
        self._mu = threading.Lock()
        self._pre: Any = None  # S3 ranged reads by presigned URLs (None: not decided yet; False: not used)
        if loc.protocol == "s3":
            _before_s3_finalize(self)

    def close(self) -> None:
        with self._mu:
            self._files.clear()

    @property
    def fs(self):
        """The pyarrow filesystem, built on first use: a command that reads only small objects
        (``warp info``: the pointer and the manifest) never imports pyarrow."""
        if self._fs is None:
            from pyarrow import fs as pafs
            from warpdata.storage.locations import filesystem

            if self.protocol == "s3":
                self._fs = _pyarrow_s3(self.config)
            elif self.protocol == "file":
                self._fs = pafs.LocalFileSystem()
            else:
                self._fs = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem(self.loc, self.config)))
        return self._fs

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _count(self, kind: str) -> None:
        self.stats.request(kind if self.protocol == "s3" else "read")

    def _open(self, key: str):
        f = self._files.get(key)
        if f is None:
            if self.protocol == "s3":
                self.stats.request("HEAD")  # pyarrow's S3 open sends a HEAD for the size
            f = self.fs.open_input_file(self._path(key))
            with self._mu:
                if len(self._files) >= 256:
                    self._files.clear()
                f = self._files.setdefault(key, f)
        return f

    def get(self, key: str) -> bytes | None:
        """A whole small object: on S3 one GET (a presigned URL on a kept-alive connection, else
        botocore; pyarrow would HEAD first), a plain read from a local store, else through the
        pyarrow filesystem."""
        if self.protocol == "s3":
            pre = self._presigned()
            if pre is not None:
                return pre.get_object(self._path(key).lstrip("/"), self.stats, self.deadline)
            client = _s3_client(self.config)
            if client is not None:
                return self._s3_get(client, key)
        if self.protocol == "file":
            self._count("read")
            try:
                with open(self._path(key), "rb") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None
        sent = False
        try:
            if self.protocol == "s3":
                self.stats.request("HEAD")  # pyarrow opens a stream with a HEAD, then GETs
            with self.fs.open_input_stream(self._path(key)) as f:
                self._count("GET")
                sent = True
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            if self.protocol == "s3" and not sent and "GetObject" in str(e):
                self._count("GET")
            if _is_not_found(e):
                return None
            raise

    def _s3_get(self, client: Any, key: str) -> bytes | None:
        bucket, _, name = self._path(key).lstrip("/").partition("/")
        self.stats.request("GET")
        try:
            return client.get_object(Bucket=bucket, Key=name)["Body"].read()
        except Exception as e:
            err = getattr(e, "response", None) or {}
            code = str((err.get("Error") or {}).get("Code", ""))
            status = (err.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return None
            raise

    def read_range(self, key: str, start: int, length: int, size: int | None) -> bytes:
        if self.protocol == "s3":
            pre = self._presigned()
            if pre is not None:
                return pre.read_range(self._path(key).lstrip("/"), start, length, self.stats, self.deadline)
        try:
            f = self._open(key)
            self._count("GET")
            return f.read_at(length, start)
        except OSError as e:
            if _is_not_found(e):
                raise FileNotFoundError(key) from None
            raise

    def get_whole(self, key: str, size: int) -> bytes:
        """The whole object of ``size`` bytes (for an S3 endpoint that ignores Range)."""
        pre = self._presigned()
        if pre is None:  # pyarrow's reads honour Range on every S3 endpoint warp supports
            return self.read_range(key, 0, size, size)
        return pre.get_whole(self._path(key).lstrip("/"), size, self.stats, self.deadline)

    def _presigned(self) -> _PresignedRanges | None:
        """The presigned-URL reader of this S3 store, or None where it cannot stand in for
        pyarrow's (no boto3, or a proxy applies to the endpoint); decided once."""
        if self._pre is None:
            self._pre = _PresignedRanges.for_config(self.config) or False
        return self._pre or None

    def size(self, key: str) -> int | None:
        try:
            return self._open(key).size()
        except FileNotFoundError:
            return None
        except OSError as e:
            if _is_not_found(e):
                return None
            raise

    def classify(self, e: BaseException) -> str | None:
        from warpdata.storage.errors import connection_cause

        if self.protocol != "s3":
            return None
        if isinstance(e, BodyTooLarge | InsecureRedirect | RangeIgnored) or is_tls_error(e):
            return None  # permanent (warpdata.storage.policy)
        cause = connection_cause(e)
        if cause is not None:
            return {"timeout": "connect-timeout", "refused": "connect"}.get(cause[0])  # dns: permanent
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):  # botocore's ClientError (whole-object GETs)
            code = str((resp.get("Error") or {}).get("Code", ""))
            status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if status in THROTTLE_STATUS or code in ("SlowDown", "Throttling", "ThrottlingException",
                                                "RequestLimitExceeded", "TooManyRequests", "ServiceUnavailable"):
                return "throttle"
            if status in TRANSIENT_STATUS or code in ("InternalError", "RequestTimeout"):
                return "transient"
            return None
        if type(e).__name__ in ("ReadTimeoutError", "ConnectionClosedError", "ResponseStreamingError",
                                "IncompleteReadError"):
            return "transient"
        import http.client

        if isinstance(e, http.client.HTTPException | ConnectionError | TimeoutError):  # presigned reads
            return "transient"
        text = str(e)
        if any(t in text for t in _THROTTLE_TEXT):
            return "throttle"
        if any(t in text for t in _TRANSIENT_TEXT):
            return "transient"
        return None


PRESIGN_TTL = 300.0  # seconds a presigned URL is reused ...
PRESIGN_EXPIRES = 900  # ... of the seconds it is signed for (refreshed sooner after a 403)
MAX_IDLE_CONNECTIONS = 16  # kept-alive connections per host, shared by every thread


class S3ResponseError(OSError):
    """An S3 error answer to a presigned read, shaped like botocore's ClientError (``response``),
    so the retry policy (:meth:`_ArrowTransport.classify`) and the typed errors
    (:func:`~warpdata.storage.errors.translate_storage_error`) treat both alike."""

    def __init__(self, status: int, code: str, message: str, url: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP status {status} {code}: {message} ({url.split('?', 1)[0]})")
        self.status, self.retry_after = status, retry_after
        self.response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}


class ConnectTimeoutError(OSError):
    """Connecting to the S3 endpoint timed out (named as botocore's, which
    :func:`~warpdata.storage.errors.connection_cause` recognises)."""


class _S3ConnectError(OSError):
    """A connection to the S3 endpoint failed (the socket error is its cause); ``kwargs`` names
    the endpoint as botocore's EndpointConnectionError does."""

    def __init__(self, endpoint: str, e: BaseException) -> None:
        super().__init__(f"could not connect to {endpoint}: {e}")
        self.kwargs = {"endpoint_url": endpoint, "error": e}


def _exchange(take: Callable[[bool], Any], method: str, target: str, headers: dict[str, str], read_timeout: float,
              connect_error: Callable[[OSError], OSError], url: str, base: float,
              cap_of: Callable[[Any], int | None]):
    """(connection, response, body) of one request over ``http.client`` on a kept-alive connection
    from ``take(fresh)``, under the request policy (:mod:`warpdata.storage.policy`): the attempt
    ends within ``base`` seconds plus one per MiB of the length the answer announces, its body
    is at most ``cap_of(response)`` bytes, or not read at all when that is None (body None, the
    connection closed). A connection the server closed while it was idle is opened again once.
    ``connect_error`` names a failed connect (it may return the error itself). Body b"" for HEAD."""
    import http.client

    t0 = time.monotonic()
    for attempt in (0, 1):
        c = take(attempt == 1)
        reused = c.sock is not None
        try:
            if c.sock is None:
                try:
                    c.connect()
                except OSError as e:
                    err = connect_error(e)
                    if err is e:
                        raise
                    raise err from e
            left = t0 + base - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(url, base, 0)
            c.sock.settimeout(min(read_timeout, left))
            watch = WATCHDOG.arm(t0 + base, c.sock)  # the status line and headers: http.client reads them
            try:
                c.request(method, target, headers=headers)
                r = c.getresponse()
            except BaseException as e:
                if WATCHDOG.disarm(watch):
                    raise DeadlineExceeded(url, base, 0) from e
                raise
            if WATCHDOG.disarm(watch):
                raise DeadlineExceeded(url, base, 0)
            if method == "HEAD":
                return c, r, r.read()  # a HEAD answer has no body: this frees the connection
            cap = cap_of(r)
            if cap is None:
                c.close()
                return c, r, None
            announced = r.getheader("Content-Length") or ""
            n = min(int(announced), cap) if announced.strip().isdigit() else 0
            allowed = base + allowed_seconds(0, n)
            return c, r, read_body(r, c.sock, url, t0 + allowed, allowed, cap)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                http.client.CannotSendRequest, http.client.ResponseNotReady):
            c.close()
            if not reused or attempt == 1:
                raise
        except BaseException:
            c.close()
            raise
    raise AssertionError("unreachable")


class _PresignedRanges:
    """Ranged GETs of S3 objects through presigned URLs, sent with the standard library's
    ``http.client`` on keep-alive connections shared by the process's threads.

    pyarrow's S3 files send a HEAD for the size before their first read of each object; the
    reader knows every size from the manifest, so here each ranged read is one GET and nothing
    else (on a Python S3 server such as moto, every request also costs the server as much CPU
    as a few MB of transfer). A URL is signed by botocore (the same client, credentials and
    addressing as the store's other requests; no request to sign it) and reused for
    :data:`PRESIGN_TTL` seconds. Answers that are not the range asked for raise
    :class:`S3ResponseError` (its S3 error code from the body) for the retry policy. One reader
    serves every store of a configuration in a process (its signing client, URLs and
    connections), shared like :func:`_s3_client`; each read counts in its caller's stats.
    """

    def __init__(self, client: Any, endpoint: str, cafile: str | None, config) -> None:
        self.client, self.endpoint, self.cafile, self.config = client, endpoint, cafile, config
        self._urls: dict[str, tuple[float, str]] = {}
        self._idle: dict[tuple[str, str], list[Any]] = {}  # keep-alive connections not in use
        self._pid = os.getpid()
        self._mu = threading.Lock()
        self._ssl: Any = None
        _LIVE_READERS.add(self)

    @classmethod
    def for_config(cls, config) -> _PresignedRanges | None:
        """The reader for ``config``, or None without boto3 or where a proxy applies to the
        endpoint (pyarrow's client honours proxies; this one does not)."""
        import urllib.request
        from urllib.parse import urlsplit

        key = (config, tuple(os.environ.get(k) for k in _CRED_ENV), os.getpid())
        now = time.monotonic()
        hit = _PRESIGNED.get(key)
        if hit is not None and now - hit[0] < _S3_FS_TTL:
            reader = hit[1]
        else:
            reader = cls._make(config)
            if len(_PRESIGNED) >= 16:
                _PRESIGNED.clear()
            _PRESIGNED[key] = (now, reader)
        if reader is None:
            return None
        proxies = urllib.request.getproxies()
        if any(k in proxies for k in ("http", "https", "all")) \
                and not urllib.request.proxy_bypass(urlsplit(reader.endpoint).hostname or ""):
            return None
        return reader

    @classmethod
    def _make(cls, config) -> _PresignedRanges | None:
        import importlib.util

        if importlib.util.find_spec("boto3") is None:  # the [s3] extra
            return None
        signer = SigV4Presigner.for_config(config)  # static credentials: signed here, botocore never imported
        if signer is not None:
            cafile = os.environ.get("AWS_CA_BUNDLE") or None
            if cafile is None and signer.endpoint.startswith("https:") and importlib.util.find_spec("certifi"):
                import certifi  # botocore's default trust store

                cafile = certifi.where()
            return cls(signer, signer.endpoint, cafile, config)
        client = _s3_client(config)  # the process's one signing client of this configuration
        if client is None:
            return None
        endpoint = client.meta.endpoint_url
        cafile = None
        if endpoint.startswith("https:"):
            import botocore.httpsession
            import botocore.session

            session = botocore.session.Session(profile=config.profile) if config.profile else botocore.session.Session()
            cafile = session.get_config_variable("ca_bundle") or botocore.httpsession.get_cert_path(True)
        return cls(client, endpoint, cafile, config)

    def _url(self, path: str, fresh: bool = False) -> str:
        now = time.monotonic()
        hit = self._urls.get(path)
        if hit is not None and not fresh and now - hit[0] < PRESIGN_TTL:
            return hit[1]
        bucket, _, name = path.partition("/")
        url = None
        if isinstance(self.client, SigV4Presigner):
            url = self.client.presign(bucket, name, PRESIGN_EXPIRES)
        if url is None:  # botocore's client, or a bucket name only botocore addresses
            client = self.client if not isinstance(self.client, SigV4Presigner) else _s3_client(self.config)
            url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": name},
                                                ExpiresIn=PRESIGN_EXPIRES)
        if len(self._urls) >= 4096:
            self._urls.clear()
        self._urls[path] = (now, url)
        return url

    def _take(self, scheme: str, netloc: str, fresh: bool):
        """An idle keep-alive connection to ``netloc`` (any thread's: a stream's threads come and
        go, TLS handshakes are dear), or a new one; never one made before a fork."""
        import http.client

        with self._mu:
            if self._pid != os.getpid():
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get((scheme, netloc))
            if idle and not fresh:
                return idle.pop()
        if scheme == "https":
            if self._ssl is None:
                import ssl

                self._ssl = ssl.create_default_context(cafile=self.cafile)
            return http.client.HTTPSConnection(netloc, timeout=self.config.connect_timeout, context=self._ssl)
        return http.client.HTTPConnection(netloc, timeout=self.config.connect_timeout)

    def _give(self, scheme: str, netloc: str, c) -> None:
        with self._mu:
            idle = self._idle.setdefault((scheme, netloc), [])
            if self._pid == os.getpid() and len(idle) < MAX_IDLE_CONNECTIONS:
                idle.append(c)
                return
        c.close()

    def _send(self, url: str, headers: dict[str, str], stats: RequestStats, base: float,
              cap_of: Callable[[Any], int | None]):
        """(response, body) of one GET under the request policy (:func:`_exchange`); a keep-alive
        connection the server closed is opened again once."""
        from urllib.parse import urlsplit

        u = urlsplit(url)
        target = f"{u.path}?{u.query}" if u.query else u.path
        stats.request("GET")

        def connect_error(e: OSError) -> OSError:
            if isinstance(e, TimeoutError):
                return ConnectTimeoutError(f"connecting to {self.endpoint} timed out")
            return _S3ConnectError(self.endpoint, e)

        c, r, body = _exchange(lambda fresh: self._take(u.scheme, u.netloc, fresh), "GET", target, headers,
                               self.config.read_timeout, connect_error, url.split("?", 1)[0], base, cap_of)
        if r.will_close or body is None:
            c.close()
        else:
            self._give(u.scheme, u.netloc, c)
        return r, body

    def get_object(self, path: str, stats: RequestStats, base: float) -> bytes | None:
        """The whole (small) object ``bucket/key`` by one GET (at most :data:`JSON_CAP` bytes);
        None when there is no such key."""
        headers = {"Accept-Encoding": "identity"}

        def cap_of(r) -> int:
            return JSON_CAP if r.status == 200 else ERROR_CAP

        url = self._url(path)
        r, body = self._send(url, headers, stats, base, cap_of)
        if r.status == 403:  # credentials may have been rotated since the URL was signed: once more
            url = self._url(path, fresh=True)
            r, body = self._send(url, headers, stats, base, cap_of)
        if r.status == 200:
            return body
        code, message = _s3_error_of(body)
        if r.status == 404 and code in ("NoSuchKey", "", "NotFound"):
            return None
        raise S3ResponseError(r.status, code or str(r.status), message or (r.reason or ""), url, _retry_after(r))

    def read_range(self, path: str, start: int, length: int, stats: RequestStats, base: float) -> bytes:
        """``length`` bytes of ``bucket/key`` from ``start`` by one GET (FileNotFoundError: no such key;
        :class:`RangeIgnored` when the endpoint answers with the whole object)."""
        headers = {"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
        cap_of = _range_cap(start, length)
        url = self._url(path)
        r, body = self._send(url, headers, stats, base, cap_of)
        if r.status == 403:  # credentials may have been rotated since the URL was signed: once more
            url = self._url(path, fresh=True)
            r, body = self._send(url, headers, stats, base, cap_of)
        if r.status == 206:
            cr = r.getheader("Content-Range") or ""
            if not _content_range_ok(cr, start, length, body):
                raise S3ResponseError(206, "BadContentRange", f"answered Content-Range {cr!r} to a range at {start}",
                                      url)
            return body
        if r.status == 200:
            if body is not None:
                return body  # the whole object was asked for
            raise RangeIgnored(f"s3://{path}", start, length, _content_length(r))
        code, message = _s3_error_of(body)
        if r.status == 404 and code in ("NoSuchKey", "", "NotFound"):
            raise FileNotFoundError(path)
        if r.status == 416:
            from warpdata.core.errors import DataError

            raise DataError(f"s3://{path}: bytes {start}-{start + length - 1} lie past the object's end (HTTP 416)",
                            hint="the stored object is shorter than the manifest says; republish the dataset")
        raise S3ResponseError(r.status, code or str(r.status), message or (r.reason or ""), url, _retry_after(r))

    def get_whole(self, path: str, size: int, stats: RequestStats, base: float) -> bytes:
        """The whole object ``bucket/key`` of ``size`` bytes by one GET (for an endpoint that ignores Range)."""
        url = self._url(path)
        r, body = self._send(url, {"Accept-Encoding": "identity"}, stats, base,
                             lambda r: size if r.status == 200 else ERROR_CAP)
        if r.status == 200:
            return body
        code, message = _s3_error_of(body)
        if r.status == 404 and code in ("NoSuchKey", "", "NotFound"):
            raise FileNotFoundError(path)
        raise S3ResponseError(r.status, code or str(r.status), message or (r.reason or ""), url, _retry_after(r))


def _content_range_ok(cr: str, start: int, length: int, body: bytes) -> bool:
    """Whether ``Content-Range: cr`` answers a range of ``length`` bytes at ``start`` with ``body``:
    the same start, and the body is exactly the bytes it names (fewer where the object ends first)."""
    import re

    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", cr.strip())
    if m is None:
        return False
    a, b = int(m.group(1)), int(m.group(2))
    return a == start and a <= b <= start + length - 1 and b - a + 1 == len(body)


def _retry_after(r) -> float | None:
    after = r.getheader("Retry-After")
    try:
        return float(after) if after else None
    except ValueError:
        return None


def _content_length(r) -> int | None:
    n = (r.getheader("Content-Length") or "").strip()
    return int(n) if n.isdigit() else None


def _range_cap(start: int, length: int) -> Callable[[Any], int | None]:
    """The body cap of a ranged GET's answer: the range's length for 206, for 200 only when the
    whole object is the range asked for (else None: the host ignored Range, the body is not
    read), :data:`ERROR_CAP` for an error answer."""

    def cap_of(r) -> int | None:
        if r.status == 206:
            return length
        if r.status == 200:
            return length if start == 0 and _content_length(r) == length else None
        return ERROR_CAP

    return cap_of


class RangeIgnored(OSError):
    """A ranged GET was answered 200 with the whole object (its body left unread): the host
    ignores ``Range``. :class:`Remote` then reads that host's objects whole."""

    def __init__(self, url: str, start: int, length: int, total: int | None) -> None:
        super().__init__(f"{url}: a ranged read (bytes {start}-{start + length - 1}) was answered with the "
                         f"whole object ({total if total is not None else 'unknown'} bytes)")
        self.url, self.start, self.length, self.total = url, start, length, total


def _s3_error_of(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an S3 XML error body; empty strings when it has none."""
    import re

    text = (body or b"")[:4096].decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", text)
    msg = re.search(r"<Message>([^<]*)</Message>", text)
    return (code.group(1) if code else ""), (msg.group(1) if msg else "")


_OPEN_S3: Any = None  # the S3 transports alive (a WeakSet), closed before pyarrow finalizes S3


def _before_s3_finalize(transport: _ArrowTransport) -> None:
    """Drop open S3 files (and cached filesystems) at exit before pyarrow finalizes its S3 client.

    ``import pyarrow.fs`` registers ``ensure_s3_finalized`` with :mod:`atexit`; a native S3 object
    destroyed after it (an open file held by a cache here until the interpreter's last collection)
    aborts the process ("terminate called without an active exception"). This hook is registered
    after that import, and atexit runs hooks last-in first-out, so it runs first.
    """
    global _OPEN_S3
    if _OPEN_S3 is None:
        import atexit
        import weakref

        _OPEN_S3 = weakref.WeakSet()
        atexit.register(_close_s3)
    _OPEN_S3.add(transport)


def _close_s3() -> None:
    for t in list(_OPEN_S3 or ()):
        t.close()
    _S3_FS.clear()
    _S3_CLIENTS.clear()
    _PRESIGNED.clear()


def _is_not_found(e: Exception) -> bool:
    text = str(e)
    return "NoSuchKey" in text or "404" in text and "Not Found" in text or "Path does not exist" in text \
        or "HTTP status 404" in text


class _ConnectTimeout(OSError):
    """An HTTP store's host accepted no connection within ``connect_timeout``."""


class _HttpTransport:
    """GET / ranged GET / HEAD over ``http.client``, keep-alive connections per thread and process."""

    def __init__(self, base_url: str, config, stats: RequestStats, deadline: float) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(base_url)
        self.scheme, self.netloc, self.prefix = u.scheme, u.netloc, u.path.strip("/")
        self.config = config
        self.stats = stats
        self.deadline = deadline  # seconds: an attempt's base deadline (WARP_REQUEST_DEADLINE)
        self._local = threading.local()

    def url(self, key: str) -> str:
        from urllib.parse import quote

        path = f"{self.prefix}/{key}" if self.prefix else key
        return f"{self.scheme}://{self.netloc}/{quote(path)}"

    def _conn(self, scheme: str, netloc: str, fresh: bool = False):
        import http.client

        conns = getattr(self._local, "conns", None)
        if conns is None or self._local.pid != os.getpid():  # never a connection made before a fork
            conns = self._local.conns = {}
            self._local.pid = os.getpid()
        c = conns.get((scheme, netloc))
        if c is not None and fresh:
            c.close()
            c = None
        if c is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            c = conns[(scheme, netloc)] = cls(netloc, timeout=self.config.connect_timeout)
        return c

    def _request(self, method: str, key: str, headers: dict[str, str], cap_of: Callable[[Any], int | None]):
        """(status, response, body) after following redirects, under the request policy
        (:func:`_exchange`; ``cap_of`` gives the body cap of a 2xx answer, the body of any other
        is not read: None). A redirect from https to http is refused (:class:`InsecureRedirect`)."""
        from urllib.parse import urljoin, urlsplit

        from warpdata import __version__

        url = self.url(key)
        hdrs = {"User-Agent": f"warp/{__version__}", "Accept-Encoding": "identity", **headers}

        def cap(r) -> int | None:
            return cap_of(r) if 200 <= r.status < 300 else None

        for _ in range(MAX_REDIRECTS + 1):
            u = urlsplit(url)
            target = u.path + (f"?{u.query}" if u.query else "")
            self.stats.request(method)

            def connect_error(e: OSError, netloc: str = u.netloc) -> OSError:
                return _ConnectTimeout(f"connecting to {netloc} timed out") if isinstance(e, TimeoutError) else e

            c, r, body = _exchange(lambda fresh, u=u: self._conn(u.scheme, u.netloc, fresh), method, target, hdrs,
                                   self.config.read_timeout, connect_error, url, self.deadline, cap)
            if r.will_close:
                c.close()
            if r.status in (301, 302, 303, 307, 308) and r.getheader("Location"):
                nxt = urljoin(url, r.getheader("Location"))
                if urlsplit(nxt).scheme not in ("http", "https") or not urlsplit(nxt).netloc:
                    raise HttpStatusError(r.status, self.url(key), f"redirects to {nxt!r}, not an http(s) URL")
                if u.scheme == "https" and urlsplit(nxt).scheme == "http":
                    raise InsecureRedirect(url, nxt)
                url = nxt
                continue
            return r.status, r, body
        raise HttpStatusError(310, url, "too many redirects")

    def _error(self, status: int, r, key: str) -> HttpStatusError:
        return HttpStatusError(status, self.url(key), r.reason or "", _retry_after(r))

    def get(self, key: str, cap: int = JSON_CAP) -> bytes | None:
        status, r, body = self._request("GET", key, {}, lambda r: cap)
        if status == 200:
            return body
        if status in (404, 410):
            return None
        raise self._error(status, r, key)

    def read_range(self, key: str, start: int, length: int, size: int | None) -> bytes:
        status, r, body = self._request("GET", key, {"Range": f"bytes={start}-{start + length - 1}"},
                                        _range_cap(start, length))
        if status == 206:
            cr = r.getheader("Content-Range") or ""
            if not _content_range_ok(cr, start, length, body):
                raise HttpStatusError(206, self.url(key), f"answered Content-Range {cr!r} to a range at {start}")
            return body
        if status == 200:
            if body is not None:
                return body  # the whole object was asked for
            raise RangeIgnored(self.url(key), start, length, _content_length(r))
        if status in (404, 410):
            raise FileNotFoundError(self.url(key))
        if status == 416:
            from warpdata.core.errors import DataError

            raise DataError(f"{self.url(key)}: bytes {start}-{start + length - 1} lie past the object's end (HTTP 416)",
                            hint="the stored object is shorter than the manifest says; republish the dataset")
        raise self._error(status, r, key)

    def get_whole(self, key: str, size: int) -> bytes:
        """The whole object of ``size`` bytes by one GET (for a host that ignores Range)."""
        status, r, body = self._request("GET", key, {}, lambda r: size)
        if status == 200:
            return body
        if status in (404, 410):
            raise FileNotFoundError(self.url(key))
        raise self._error(status, r, key)

    def size(self, key: str) -> int | None:
        status, r, _ = self._request("HEAD", key, {}, lambda r: 0)
        if status == 200 and _content_length(r) is not None:
            return _content_length(r)
        if status in (404, 410):
            return None
        if status in (200, 405, 501):  # no HEAD (or no length): the total from a one-byte range
            status, r, _ = self._request("GET", key, {"Range": "bytes=0-0"}, _range_cap(0, 1))
            cr = r.getheader("Content-Range") or ""
            if status == 206 and "/" in cr and cr.rsplit("/", 1)[1].isdigit():
                return int(cr.rsplit("/", 1)[1])
            if status == 200 and _content_length(r) is not None:  # a host that ignores Range
                return _content_length(r)
            if status in (404, 410):
                return None
        raise self._error(status, r, key)

    def classify(self, e: BaseException) -> str | None:
        return classify_http(e)


def classify_http(e: BaseException) -> str | None:
    """The request policy's verdict on a failed request sent through ``http.client`` (an HTTP
    store's or a presigned S3 read): "throttle" or "transient" (retried within the budget),
    "connect" (a refused connection: tried twice), "connect-timeout" (once), None (permanent)."""
    import http.client
    import socket

    if isinstance(e, HttpStatusError):
        if e.status in THROTTLE_STATUS:
            return "throttle"
        return "transient" if e.status in TRANSIENT_STATUS else None
    if isinstance(e, BodyTooLarge | InsecureRedirect | RangeIgnored) or is_tls_error(e):
        return None
    if isinstance(e, _ConnectTimeout):
        return "connect-timeout"
    if isinstance(e, socket.gaierror):
        return None  # a host name that does not resolve stays unresolved for a retry
    if isinstance(e, ConnectionRefusedError):
        return "connect"
    if isinstance(e, TimeoutError | ConnectionError | http.client.HTTPException | OSError):
        return "transient"
    return None
