"""Write-once files in page-aligned pieces, bypassing the page cache where the filesystem allows.

Measured on the development machine (ext4 on a virtio disk, 1 GiB in 8 MiB
writes + fsync): buffered writes cost 0.4-1.8 s of kernel CPU per GiB
(allocating and copying into the page cache, then writeback), ``O_DIRECT``
writes 0.1-0.2 s, at the same or higher disk throughput. For the tensor
warehouse, whose shards are ~1.2 MB of pixels per sample, that is 0.5-2 ms of
CPU per sample saved on a 2-core machine where the decoder is the ceiling.

:class:`AlignedFile` writes a piece with ``O_DIRECT`` when its file offset,
memory address and length are all multiples of :data:`BLOCK`; anything else,
or a filesystem that refuses ``O_DIRECT`` (tmpfs, some network filesystems,
non-Linux systems), goes through an ordinary descriptor with ``pwrite``. The
bytes on disk are the same either way. Pieces may be handed to a background
thread (:meth:`submit`) so the device works while the caller computes; the
caller must not modify a submitted buffer until :meth:`wait` returns.

Durability is the caller's business (fsync the file and its directory):
``O_DIRECT`` bypasses the cache, not the need to commit metadata.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import Executor, Future
from typing import Any

from warpdata.core import envvars

# lazy third-party imports: numpy is imported inside the functions that use it, so importing this
# module does not load it (core/ stays free of third-party imports)

BLOCK = 4096
# where O_DIRECT skips the page cache and behaves (tmpfs accepts it on new kernels but copies into
# memory anyway; network and FUSE filesystems vary; btrfs checksums direct writes in flight)
DIRECT_FILESYSTEMS = frozenset({"ext4", "ext3", "xfs", "f2fs"})


@functools.lru_cache(maxsize=1)
def _mounts() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """From /proc/self/mountinfo: ``major:minor`` → type, and (mount point, type) longest first."""
    by_dev: dict[str, str] = {}
    points: list[tuple[str, str]] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) > 4 and rest:
                by_dev.setdefault(fields[2], rest[0])
                # mount points escape blanks as octal (\040)
                point = fields[4].encode().decode("unicode_escape")
                points.append((point, rest[0]))
    points.reverse()  # among equal mount points the later mount is the visible one (sort is stable)
    points.sort(key=lambda p: len(p[0]), reverse=True)
    return by_dev, points


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The type of the filesystem holding ``path`` (its nearest existing ancestor), e.g. ``ext4``."""
    p = os.path.abspath(os.fspath(path))
    while True:
        try:
            dev = os.stat(p).st_dev
            break
        except OSError:
            parent = os.path.dirname(p)
            if parent == p:
                return None
            p = parent
    by_dev, points = _mounts()
    found = by_dev.get(f"{os.major(dev)}:{os.minor(dev)}")
    if found is None:  # btrfs subvolumes and some overlays report devices mountinfo does not list
        real = os.path.realpath(p)
        for point, fstype in points:  # the longest mount point containing the path (later mounts win)
            if real == point or real.startswith(point.rstrip("/") + "/"):
                return fstype
    return found


def wants_direct(path: str | os.PathLike) -> bool:
    """Whether large writes under ``path`` should use O_DIRECT (``WARP_DIRECT_IO``: auto, 1, 0)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    mode = (envvars.get("WARP_DIRECT_IO") or "auto").strip().lower()
    if mode in ("0", "no", "off", "false"):
        return False
    if mode in ("1", "yes", "on", "true"):
        return True
    return filesystem_type(path) in DIRECT_FILESYSTEMS


def aligned_empty(nbytes: int, align: int = BLOCK) -> Any:
    """A zeroed uint8 numpy array of ``nbytes`` whose data starts at a multiple of ``align``."""
    import numpy as np

    raw = np.zeros(nbytes + align, np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip:skip + nbytes]


# Aligned bounce buffers outlive the threads that use them (writers' I/O pools come and go): a fresh
# 16 MiB buffer costs a page fault and a zeroed page per 4 KiB on first touch (1.6 % of a 1 GiB
# Zarr write's CPU when every writer allocated its own)
_POOL: list = []
_POOL_LOCK = threading.Lock()
POOL_CAP_BYTES = 256 << 20
_GRAIN = 16 << 20


def take_aligned(nbytes: int) -> Any:
    """A page-aligned uint8 array of at least ``nbytes`` (reused when one is free); see :func:`give_aligned`."""
    with _POOL_LOCK:
        fits = [i for i, b in enumerate(_POOL) if b.nbytes >= nbytes]
        if fits:  # the smallest that fits (by position: numpy arrays do not compare as list items)
            return _POOL.pop(min(fits, key=lambda i: _POOL[i].nbytes))
    return aligned_empty(-(-max(nbytes, 1) // _GRAIN) * _GRAIN)


def give_aligned(buf: Any) -> None:
    """Hand a buffer from :func:`take_aligned` back; the oldest are dropped past the pool's cap."""
    with _POOL_LOCK:
        _POOL.append(buf)
        while sum(b.nbytes for b in _POOL) > POOL_CAP_BYTES:
            _POOL.pop(0)


def pack_into(dst: Any, parts: Any) -> int:
    """Copy the buffers ``parts`` back to back into the uint8 array ``dst``; returns the bytes copied."""
    import numpy as np

    pos = 0
    for p in parts:
        b = np.frombuffer(p, np.uint8)
        dst[pos:pos + len(b)] = b
        pos += len(b)
    return pos


def _address(buf: Any) -> int:
    import numpy as np

    return np.frombuffer(buf, np.uint8).ctypes.data if len(memoryview(buf)) else 0


class AlignedFile:
    """An open file written by offset; ``O_DIRECT`` for aligned pieces when possible."""

    def __init__(self, path: str | os.PathLike, *, io: Executor | None = None, direct: bool | None = None) -> None:
        """``direct``: True tries O_DIRECT, False never, None (default) asks :func:`wants_direct`."""
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        self.dfd: int | None = None
        if direct is None:
            direct = wants_direct(self.path)
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.dfd = os.open(self.path, os.O_WRONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
            except OSError:  # EINVAL on tmpfs and others: buffered writes only
                self.dfd = None
        self.io = io
        self._pending: list[Future] = []
        self.direct_bytes = 0
        self.buffered_bytes = 0
        self._count_lock = threading.Lock()  # writes run in the caller's thread and the I/O thread

    @property
    def direct(self) -> bool:
        return self.dfd is not None

    def write(self, offset: int, buf: Any) -> None:
        """Write all of ``buf`` at ``offset`` (blocking)."""
        try:
            self._write(offset, buf)
        except OSError as e:
            if e.filename is None:  # pwrite(2) names no file (ENOSPC, EFBIG): name the one being written
                e.filename = self.path
            raise

    def _write(self, offset: int, buf: Any) -> None:
        mv = memoryview(buf).cast("B")
        n = len(mv)
        if not n:
            return
        if self.dfd is not None and not (offset % BLOCK or n % BLOCK or _address(mv) % BLOCK):
            try:
                self._pwrite_all(self.dfd, mv, offset)
                with self._count_lock:
                    self.direct_bytes += n
                return
            except OSError as e:
                import errno

                if e.errno != errno.EINVAL:
                    raise
                # the filesystem accepted O_DIRECT at open but not for this write: stop using it
                os.close(self.dfd)
                self.dfd = None
        self._pwrite_all(self.fd, mv, offset)
        with self._count_lock:
            self.buffered_bytes += n

    @staticmethod
    def _pwrite_all(fd: int, mv: memoryview, offset: int) -> None:
        done = 0
        while done < len(mv):
            done += os.pwrite(fd, mv[done:], offset + done)

    def submit(self, offset: int, buf: Any) -> None:
        """Write in the background thread if one was given (else now); see :meth:`wait`."""
        if self.io is None:
            self.write(offset, buf)
        else:
            self._pending.append(self.io.submit(self.write, offset, buf))

    def wait(self) -> None:
        """Block until every submitted piece is written; re-raises the first error."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError as e:
            if e.filename is None:
                e.filename = self.path
            raise

    def close(self) -> None:
        try:
            self.wait()
        finally:
            for fd in (self.dfd, self.fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.dfd = None
            self.fd = -1

    def __enter__(self) -> AlignedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            # let in-flight writes finish before the caller unlinks the file; their errors are moot
            for f in self._pending:
                with contextlib.suppress(BaseException):
                    f.result()
            self._pending = []
        self.close()
