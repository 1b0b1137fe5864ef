"""Threaded HTTP servers on 127.0.0.1 for the read path's tests.

``StaticServer(root, lie=None)``
    Serves a directory like a static web host or CDN (``lie`` forges answers for hostile-host
    tests): GET and HEAD, single-range
    ``Range: bytes=A-B`` / ``bytes=A-`` / ``bytes=-N`` answered with 206 and
    ``Content-Range`` (416 past the end), 404 for what is not there, keep-alive.
    Python's ``SimpleHTTPRequestHandler`` ignores ``Range`` (it answers 200 with the whole
    file); ``ranges=False`` reproduces that, to test that readers refuse such a host.

``FaultProxy(upstream)``
    Forwards every request to ``upstream`` (the moto S3 server) and answers ``503 SlowDown``
    (S3's throttling reply, with its XML body) to every ``fail_every``-th request instead;
    ``fail_every=1`` fails them all.

Both count what they served (``.requests``, ``.faults``, ``.log``) and take a ``fail_every``
(the static server answers 503 with ``Retry-After`` omitted). Use them as context managers.
"""

from __future__ import annotations

import http.client
import os
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")


class _Counting:
    """Request counting and every-Nth fault injection shared by both servers."""

    def __init__(self, fail_every: int = 0) -> None:
        self.fail_every = fail_every
        self.requests = 0
        self.faults = 0
        self.log: list[dict] = []
        self._mu = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def _count(self, method: str, path: str, rng: str | None) -> bool:
        """Record one request; True when it must be answered with a fault."""
        with self._mu:
            self.requests += 1
            fault = bool(self.fail_every) and self.requests % self.fail_every == 0
            self.faults += fault
            self.log.append({"method": method, "path": path, "range": rng, "fault": fault})
            return fault

    def reset(self) -> None:
        with self._mu:
            self.requests = self.faults = 0
            self.log.clear()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _start(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-http", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:
        pass

    def _reply(self, code: int, body: bytes = b"", headers: dict | None = None, send_body: bool = True,
               length: int | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)


class StaticServer(_Counting):
    """A static file host for ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, *, ranges: bool = True, fail_every: int = 0,
                 lie=None) -> None:
        super().__init__(fail_every)
        self.root = os.path.abspath(root)
        self.ranges = ranges
        # lie(method, path, range) -> None, or (status, headers, body) sent instead (hostile-host tests)
        self.lie = lie
        outer = self

        class Handler(_Quiet):
            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def do_PUT(self) -> None:  # a static host refuses writes
                self._reply(405, b"read-only")

            def _serve(self, head: bool) -> None:
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                rng = self.headers.get("Range")
                if outer._count(self.command, path, rng):
                    self._reply(503, b"busy", send_body=not head)
                    return
                forged = outer.lie(self.command, path, rng) if outer.lie else None
                if forged is not None:
                    status, headers, body = forged
                    self._reply(status, body, headers, send_body=not head)
                    return
                full = os.path.normpath(os.path.join(outer.root, path.lstrip("/")))
                if not full.startswith(outer.root + os.sep) or not os.path.isfile(full):
                    self._reply(404, b"not found", send_body=not head)
                    return
                size = os.path.getsize(full)
                m = _RANGE.match(rng or "") if outer.ranges else None
                if m is None or (m.group(1) == m.group(2) == ""):
                    with open(full, "rb") as f:
                        data = f.read() if not head else b""
                    self._reply(200, data, {"Accept-Ranges": "bytes" if outer.ranges else "none"}, not head,
                                length=size)
                    return
                a, b = m.group(1), m.group(2)
                if a == "":
                    start, end = max(0, size - int(b)), size - 1
                else:
                    start, end = int(a), min(int(b), size - 1) if b else size - 1
                if start >= size or start > end:
                    self._reply(416, b"", {"Content-Range": f"bytes */{size}"})
                    return
                with open(full, "rb") as f:
                    f.seek(start)
                    data = f.read(end - start + 1)
                self._reply(206, data, {"Content-Range": f"bytes {start}-{end}/{size}"}, not head,
                            length=end - start + 1)

        self._start(Handler)


class FaultProxy(_Counting):
    """Forwards to ``upstream`` (``http://127.0.0.1:PORT``), answering 503 SlowDown to every Nth request."""

    def __init__(self, upstream: str, fail_every: int = 0) -> None:
        super().__init__(fail_every)
        u = urllib.parse.urlsplit(upstream)
        self.host, self.port = u.hostname, u.port
        outer = self

        class Handler(_Quiet):
            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if outer._count(self.command, self.path, self.headers.get("Range")):
                    self._reply(503, SLOWDOWN, {"Content-Type": "application/xml"},
                                send_body=self.command != "HEAD")
                    return
                conn = http.client.HTTPConnection(outer.host, outer.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    self.send_response(r.status, r.reason)
                    for k, v in r.getheaders():
                        if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                            self.send_header(k, v)
                    # a HEAD keeps the object's length; a body is re-sent whole
                    length = r.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    if self.command != "HEAD" and data:
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._start(Handler)
