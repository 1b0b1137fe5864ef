"""Requests warp sends itself over ``http.client``, under the request policy of
:mod:`warpdata.storage.policy`: one exchange on a kept-alive connection (:func:`_exchange`: the
attempt's deadline, the body cap), the answers it can give (:class:`HttpStatusError`,
:class:`S3ResponseError`, :class:`RangeIgnored`, a wrong ``Content-Range``), and the transport of
``http(s)://`` stores (:class:`_HttpTransport`: keep-alive connections per thread, up to
:data:`MAX_REDIRECTS` redirects, never https to http). :class:`~warpdata.storage.remote.Remote`
retries and types what these raise (:func:`classify_http`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from warpdata import __version__
from warpdata.core.errors import DataError
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
)

__all__ = ["ConnectTimeoutError", "HttpStatusError", "RangeIgnored", "S3ResponseError", "classify_http"]

MAX_REDIRECTS = 5


class HttpStatusError(OSError):
    """An HTTP answer other than the one asked for (the transport's raw error, before typing)."""

    def __init__(self, status: int, url: str, reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} {reason} from {url}".replace("  ", " "))
        self.status, self.url, self.reason, self.retry_after = status, url, reason, retry_after


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
