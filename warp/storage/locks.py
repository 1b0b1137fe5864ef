"""Lock files with stale-holder detection, for local stores' compare-and-swap (on-disk format:
``{"pid", "host", "time", "id"}``, unchanged)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid

from warpdata.core.errors import LockTimeoutError

__all__ = ["FileLock"]


class FileLock:
    """An exclusive lock file holding ``{"pid", "host", "time", "id"}``.

    Acquired with ``O_CREAT | O_EXCL``. A lock is *stale* when its holder is
    a dead process on this host, or when it is older than ``stale_after``
    seconds (a holder on another host, or a reused pid); a stale lock is
    moved aside with an atomic rename (so two breakers cannot both win) and
    removed. Waiting longer than ``timeout`` raises LockTimeoutError naming
    the holder.
    """

    def __init__(self, path: str | os.PathLike, *, stale_after: float = 30.0, timeout: float = 60.0) -> None:
        self.path = os.fspath(path)
        self.stale_after = stale_after
        self.timeout = timeout
        self.id = uuid.uuid4().hex

    def _record(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                           "id": self.id}).encode()

    @staticmethod
    def holder_is_stale(raw: bytes, stale_after: float) -> bool:
        try:
            info = json.loads(raw)
            pid, host, t = int(info["pid"]), str(info["host"]), float(info["time"])
        except (ValueError, KeyError, TypeError):
            return True  # a half-written or garbage lock file: its writer died mid-write
        if time.time() - t > stale_after:
            return True
        if host == socket.gethostname():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._maybe_break()
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(self._record())
                return
            if time.monotonic() > deadline:
                raise LockTimeoutError(
                    f"lock {self.path} is held by a live process: {self._holder_text()}",
                    hint=f"wait for it to finish; if that process is gone, delete {self.path}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _holder_text(self) -> str:
        try:
            with open(self.path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return "(released)"

    def _maybe_break(self) -> None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        if not raw:
            # the holder may be between open() and write(): judge emptiness by age only
            try:
                if time.time() - os.stat(self.path).st_mtime < min(self.stale_after, 5.0):
                    return
            except FileNotFoundError:
                return
        elif not self.holder_is_stale(raw, self.stale_after):
            return
        aside = f"{self.path}.stale-{self.id}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != raw:
            # between our read and rename a new holder took the lock: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        os.unlink(aside)

    def release(self) -> None:
        try:
            with open(self.path, "rb") as f:
                info = json.loads(f.read() or b"{}")
        except (FileNotFoundError, ValueError):
            return
        if info.get("id") == self.id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
