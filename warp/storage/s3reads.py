"""Reads of S3, local and memory stores (:class:`_ArrowTransport`): pyarrow filesystems built on first
use (S3's shared per configuration and process for a few minutes, its SDK retries off), whole small
objects by one GET, and S3 ranged reads by presigned URLs on kept-alive ``http.client`` connections
(:class:`_PresignedRanges`: no HEAD, the manifest gives every size). What the module docstring of
:mod:`warpdata.storage.remote` says of S3 reads is done here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from warpdata.core.errors import DataError
from warpdata.storage.errors import connection_cause
from warpdata.storage.locations import filesystem
from warpdata.storage.policy import (
    ERROR_CAP,
    JSON_CAP,
    THROTTLE_STATUS,
    TRANSIENT_STATUS,
    BodyTooLarge,
    InsecureRedirect,
    RequestStats,
    is_tls_error,
)
from warpdata.storage.s3client import CRED_ENV, boto3_client
from warpdata.storage.s3sign import SigV4Presigner
from warpdata.storage.wire import (
    ConnectTimeoutError,
    RangeIgnored,
    S3ResponseError,
    _content_length,
    _content_range_ok,
    _exchange,
    _range_cap,
    _retry_after,
    _s3_error_of,
    _S3ConnectError,
)

# lazy third-party imports: pyarrow and botocore (heavy) are imported inside the functions that
# use them, so importing this module loads none of them: an S3 read with static credentials signs
# its own URLs and never loads botocore

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

    def _send_signed(self, path: str, headers: dict[str, str], stats: RequestStats, base: float,
                     cap_of: Callable[[Any], int | None]) -> tuple[str, Any, bytes | None]:
        """(URL, response, body) of one GET of ``path`` by a presigned URL; on a 403 the URL is signed
        afresh and sent once more (credentials may have been rotated since the URL was signed)."""
        url = self._url(path)
        r, body = self._send(url, headers, stats, base, cap_of)
        if r.status == 403:
            url = self._url(path, fresh=True)
            r, body = self._send(url, headers, stats, base, cap_of)
        return url, r, body

    def get_object(self, path: str, stats: RequestStats, base: float) -> bytes | None:
        """The whole (small) object ``bucket/key`` by one GET (at most :data:`JSON_CAP` bytes);
        None when there is no such key."""
        headers = {"Accept-Encoding": "identity"}

        def cap_of(r) -> int:
            return JSON_CAP if r.status == 200 else ERROR_CAP

        url, r, body = self._send_signed(path, headers, stats, base, cap_of)
        if r.status == 200:
            return body
        if (err := _failure(r, body, url)) is None:
            return None
        raise err

    def read_range(self, path: str, start: int, length: int, stats: RequestStats, base: float) -> bytes:
        """``length`` bytes of ``bucket/key`` from ``start`` by one GET (FileNotFoundError: no such key;
        :class:`RangeIgnored` when the endpoint answers with the whole object)."""
        headers = {"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
        cap_of = _range_cap(start, length)
        url, r, body = self._send_signed(path, headers, stats, base, cap_of)
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
        if (err := _failure(r, body, url)) is None:
            raise FileNotFoundError(path)
        if r.status == 416:
            raise DataError(f"s3://{path}: bytes {start}-{start + length - 1} lie past the object's end (HTTP 416)",
                            hint="the stored object is shorter than the manifest says; republish the dataset")
        raise err

    def get_whole(self, path: str, size: int, stats: RequestStats, base: float) -> bytes:
        """The whole object ``bucket/key`` of ``size`` bytes by one GET (for an endpoint that ignores Range)."""
        url = self._url(path)
        r, body = self._send(url, {"Accept-Encoding": "identity"}, stats, base,
                             lambda r: size if r.status == 200 else ERROR_CAP)
        if r.status == 200:
            return body
        if (err := _failure(r, body, url)) is None:
            raise FileNotFoundError(path)
        raise err


def _failure(r: Any, body: bytes | None, url: str) -> S3ResponseError | None:
    """The error of an S3 answer that is not a success; None when it says there is no such key."""
    code, message = _s3_error_of(body)
    if r.status == 404 and code in ("NoSuchKey", "", "NotFound"):
        return None
    return S3ResponseError(r.status, code or str(r.status), message or (r.reason or ""), url, _retry_after(r))


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
