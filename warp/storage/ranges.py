"""Random access to one store object by ranged reads (:class:`RangeFile`), the plan of the ranged
GETs a read needs (:func:`plan_ranges`: nearby ranges coalesced, long runs split and fetched in
parallel), and a read-only ``pyarrow.fs`` handler over a :class:`~warpdata.storage.remote.Remote`
(:func:`_handler_class`) for ``pyarrow.dataset`` over an HTTP store."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from typing import Any

from warpdata.core.errors import ReadOnlyStoreError

# lazy third-party imports: pyarrow (heavy) is imported by the pyarrow file-system handler alone

__all__ = ["RangeFile", "plan_ranges"]

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

    def __init__(self, remote: Any, key: str, size: int | None = None) -> None:  # a Remote (not imported: it imports this)
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

    def prefetch(self, ranges: Sequence[tuple[int, int]], waste: float | None = None) -> list[int]:
        """Fetch ``(offset, length)`` ranges as :func:`plan_ranges` plans them (``waste``: its bytes
        beyond the needed ones), in parallel; tokens for :meth:`release`."""
        merged = plan_ranges(ranges, waste=waste)
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
    def prefetched(self, ranges: Sequence[tuple[int, int]], waste: float | None = None):
        tokens = self.prefetch(ranges, waste)
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

    def __init__(self, remote: Any) -> None:  # a Remote
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
        raise ReadOnlyStoreError(f"{self.remote.url}: the read path writes nothing")

    get_file_info_selector = create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only
