"""The one request policy of every remote read: deadlines, body caps, what is retried, and counting.

Every request warp sends itself to a store (HTTP(S) stores, S3 reads through presigned URLs;
docs/formats/registry.md, "Request policy") follows these rules:

* **A deadline per attempt** covering connect, headers and body: ``WARP_REQUEST_DEADLINE``
  seconds (default 30) plus one second per MiB expected. ``http.client``'s timeout applies to
  each socket operation, so a host sending one byte per second would never trip it: the body is
  read in chunks (:func:`read_body`), the socket's timeout is cut to what is left before each
  one, and an attempt past its deadline ends with :class:`DeadlineExceeded` (retried, like a
  read timeout).
* **A body cap**: the expected size where it is known (a range's length, a blob's size from the
  manifest), :data:`JSON_CAP` for a JSON document (``latest.json``, a manifest) and
  :data:`ERROR_CAP` for an error answer. A body that announces or sends more ends the attempt
  with :class:`BodyTooLarge` (never retried): an endless chunked body costs at most the cap.
* **Retries only for transient failures**: 408, 429 and 503 (throttling), 500/502/504,
  resets, timeouts and deadlines, within ``WARP_RETRY_BUDGET`` seconds (:func:`retry_budget`);
  a refused connection is tried twice. Permanent failures end at once: TLS and certificate
  errors (:func:`is_tls_error`), a host name that does not resolve, any other 4xx, a redirect
  from https to http (:class:`InsecureRedirect`).
* **Counting in one place**: :class:`RequestStats` (requests by kind, bytes, retries,
  throttled answers, seconds backing off) is what ``-v`` and ``--json`` report.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import ConfigError

DEFAULT_RETRY_BUDGET = 60.0  # seconds (WARP_RETRY_BUDGET)
DEFAULT_DEADLINE = 30.0  # seconds (WARP_REQUEST_DEADLINE): one attempt's base deadline
SECONDS_PER_MIB = 1.0  # added to the deadline per MiB expected: a 1 MiB/s floor on throughput
JSON_CAP = 32 << 20  # bytes: the most a JSON document (pointer, manifest) may be
ERROR_CAP = 64 << 10  # bytes: the most of an error answer's body that is read
CHUNK = 1 << 20  # bytes read per socket read while the deadline is checked
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
THROTTLE_STATUS = frozenset({429, 503})


def _seconds(name: str, default: float, example: str) -> float:
    """Seconds from numeric variable ``name`` (bounded in warp/core/envvars.py; a bad value is a
    ConfigError naming it, with its range), else ``default``."""
    v = envvars.number(name)
    return default if v is None else float(v)


def retry_budget() -> float:
    """``WARP_RETRY_BUDGET`` in seconds (a ConfigError names a bad value)."""
    return _seconds("WARP_RETRY_BUDGET", DEFAULT_RETRY_BUDGET, "WARP_RETRY_BUDGET=60 (0 retries nothing)")


def request_deadline() -> float:
    """``WARP_REQUEST_DEADLINE`` in seconds: one attempt's base deadline (a ConfigError names a bad value)."""
    v = _seconds("WARP_REQUEST_DEADLINE", DEFAULT_DEADLINE, "WARP_REQUEST_DEADLINE=30")
    if v == 0:
        raise ConfigError("WARP_REQUEST_DEADLINE=0 leaves no time for a request",
                          hint="e.g. WARP_REQUEST_DEADLINE=30 (seconds per attempt)")
    return v


def allowed_seconds(base: float, nbytes: int) -> float:
    """Seconds one attempt may take to bring ``nbytes``: ``base`` plus one per MiB."""
    return base + nbytes / (1 << 20) * SECONDS_PER_MIB


class DeadlineExceeded(TimeoutError):
    """One attempt passed its deadline (a host that trickles its answer); retried like a timeout."""

    def __init__(self, url: str, seconds: float, got: int) -> None:
        super().__init__(f"{url} did not finish answering within its deadline of {seconds:.1f}s "
                         f"({got} bytes of body received)")
        self.url, self.seconds, self.got = url, seconds, got


class BodyTooLarge(OSError):
    """An answer's body announced or sent more than the cap: never retried."""

    def __init__(self, url: str, cap: int, got: int | None, announced: bool) -> None:
        what = f"announced {got} bytes" if announced else f"sent more than {cap} bytes"
        super().__init__(f"{url} {what}; at most {cap} were expected")
        self.url, self.cap, self.got, self.announced = url, cap, got, announced


class InsecureRedirect(OSError):
    """An https URL redirected to plain http: refused, never followed."""

    def __init__(self, url: str, target: str) -> None:
        super().__init__(f"{url} redirects to {target}, which is plain http")
        self.url, self.target = url, target


def is_tls_error(e: BaseException) -> bool:
    """A TLS handshake or certificate failure (permanent: retrying only delays the error)."""
    import ssl

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ssl.SSLError | ssl.CertificateError) or type(e).__name__ == "SSLError":
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False


def read_body(r: Any, sock: Any, url: str, deadline: float, allowed: float, cap: int) -> bytes:
    """The body of response ``r`` (``http.client.HTTPResponse``), read in chunks of at most
    :data:`CHUNK` with the socket's timeout cut to what is left of ``deadline`` (an attempt of
    ``allowed`` seconds) before each one; :class:`DeadlineExceeded` past the deadline,
    :class:`BodyTooLarge` past ``cap`` bytes."""
    announced = r.getheader("Content-Length")
    if announced is not None and announced.strip().isdigit() and int(announced) > cap:
        raise BodyTooLarge(url, cap, int(announced), True)
    parts: list[bytes] = []
    got = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(url, allowed, got)
        if r.length == 0 and not r.chunked:
            r.read()  # the announced length is in: this frees the connection for its next request
            return b"".join(parts)
        if sock is not None:
            sock.settimeout(min(left, sock.gettimeout() or left))
        try:
            chunk = r.read1(min(CHUNK, cap - got + 1))
        except TimeoutError:
            raise DeadlineExceeded(url, allowed, got) from None
        if not chunk:
            return b"".join(parts)
        got += len(chunk)
        if got > cap:
            raise BodyTooLarge(url, cap, got, False)
        parts.append(chunk)


class Watchdog:
    """Shuts down the socket of an attempt still running at its deadline: the backstop for the parts
    of a request the chunked body read cannot check (``http.client`` reads the status line and the
    headers itself, one ``recv`` at a time, so a host trickling its headers would pass every per-
    operation timeout). One thread per process, started on first use (again after a fork)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._armed: dict[int, tuple[float, Any]] = {}
        self._fired: set[int] = set()
        self._seq = 0
        self._pid = 0

    def arm(self, deadline: float, sock: Any) -> int:
        with self._cv:
            if self._pid != os.getpid():  # a forked child has no thread: start one
                self._pid, self._armed, self._fired = os.getpid(), {}, set()
                threading.Thread(target=self._run, name="warp-deadline", daemon=True).start()
            self._seq += 1
            self._armed[self._seq] = (deadline, sock)
            self._cv.notify()
            return self._seq

    def disarm(self, token: int) -> bool:
        """Stop watching; True when the deadline had already fired (the socket was shut down)."""
        with self._cv:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        import socket

        with self._cv:
            while True:
                now = time.monotonic()
                for token, (deadline, sock) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        self._fired.add(token)
                        with contextlib.suppress(OSError):  # already closed: nothing to stop
                            sock.shutdown(socket.SHUT_RDWR)
                nxt = min((d for d, _ in self._armed.values()), default=None)
                self._cv.wait(None if nxt is None else max(0.0, nxt - now) + 0.01)


    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's thread may have held it at the fork) and no
        thread yet (:meth:`arm` starts one)."""
        self._cv = threading.Condition()
        self._armed, self._fired, self._pid = {}, set(), 0


WATCHDOG = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG._after_fork)


class RequestStats:
    """Requests a store client sent and bytes it received, with the retries among them.

    Thread-safe; :meth:`snapshot` / :meth:`since` measure one operation.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.retries = 0
        self.throttled = 0
        self.backoff_seconds = 0.0
        self.by_kind: dict[str, int] = {}

    def request(self, kind: str) -> None:
        with self._mu:
            self.requests += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def received(self, n: int) -> None:
        with self._mu:
            self.bytes += n

    def retried(self, throttled: bool, pause: float) -> None:
        with self._mu:
            self.retries += 1
            self.throttled += throttled
            self.backoff_seconds += pause

    def to_dict(self) -> dict[str, Any]:
        with self._mu:
            return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries,
                    "throttled": self.throttled, "backoff_seconds": round(self.backoff_seconds, 3),
                    "by_kind": dict(sorted(self.by_kind.items()))}

    snapshot = to_dict

    def since(self, before: dict[str, Any]) -> dict[str, Any]:
        """What happened after ``before`` (a :meth:`snapshot`)."""
        now = self.to_dict()
        kinds = {k: v - before["by_kind"].get(k, 0) for k, v in now["by_kind"].items()}
        return {"requests": now["requests"] - before["requests"], "bytes": now["bytes"] - before["bytes"],
                "retries": now["retries"] - before["retries"], "throttled": now["throttled"] - before["throttled"],
                "backoff_seconds": round(now["backoff_seconds"] - before["backoff_seconds"], 3),
                "by_kind": {k: v for k, v in kinds.items() if v}}
