"""CPU tile backend: numpy gather into reused buffers + per-thread zstandard.

Each worker thread owns one tile-shaped buffer and one ``ZstdCompressor``
(compressors are not thread-safe). A task gathers a run of tiles from the
slab into that buffer (``gather_tile``: the per-tile form of the seed's
lift/transpose, padding edge tiles with the fill value) and compresses it
while it is still in cache. numpy copies and zstd both release the GIL, so
throughput scales with threads; zstd is ~88 % of the CPU time (DESIGN.md §5).
Slab buffers are pre-faulted once and recycled through a small process-wide
pool: first-touch page faults made fresh buffers 30× slower here.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import zstandard
from warpdata.formats.tiling import SlabPlan, gather_tile

from . import TileBackend

# Freed slab buffers, kept for the next writer in this process: a fresh
# buffer costs a page fault per 4 KiB on first touch (0.2-0.4 GB/s here).
_POOL_LOCK = threading.Lock()
_POOL: list[np.ndarray] = []
POOL_CAP_BYTES = 1 << 30


def take_buffer(nbytes: int) -> np.ndarray:
    """A pre-faulted flat uint8 buffer of ``nbytes`` (reused from the pool when possible)."""
    with _POOL_LOCK:
        for i, b in enumerate(_POOL):
            if b.nbytes == nbytes:
                return _POOL.pop(i)
    buf = np.empty(nbytes, dtype=np.uint8)
    buf[::4096] = 0  # fault every page in now, not on the hot path
    return buf


def give_buffer(buf: np.ndarray) -> None:
    """Return a buffer from :func:`take_buffer`; the oldest are dropped past the cap."""
    with _POOL_LOCK:
        _POOL.append(buf)
        while sum(b.nbytes for b in _POOL) > POOL_CAP_BYTES:
            _POOL.pop(0)


def default_threads() -> int:
    from warpdata import envvars

    env = envvars.get("WARP_WORKERS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class CpuBackend(TileBackend):
    name = "cpu"
    accepts_views = True

    def __init__(self, *, level: int = 1, threads: int | None = None) -> None:
        super().__init__(level=level, threads=threads or default_threads())
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._slabs: list[np.ndarray] = []
        self.plan: SlabPlan | None = None

    @classmethod
    def probe(cls) -> str | None:
        return None

    def prepare(self, plan: SlabPlan) -> None:
        self.plan = plan
        g = plan.geometry
        self._grid = plan.slab_counts
        self._tile = g.tile
        # enough tasks per slab that no thread idles at the slab's tail
        n = plan.tiles_per_slab
        per = max(1, -(-n // (self.threads * 4)))
        self._tasks = [(i, min(i + per, n)) for i in range(0, n, per)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="warp-tiles-cpu")

    def alloc_slab(self) -> np.ndarray:
        flat = take_buffer(self.plan.slab_nbytes)
        self._slabs.append(flat)
        return flat.view(self.plan.geometry.dtype).reshape(self.plan.slab_shape)

    def _worker_state(self) -> tuple[np.ndarray, zstandard.ZstdCompressor]:
        st = getattr(self._local, "state", None)
        if st is None or st[0].shape != self._tile or st[0].dtype != self.plan.geometry.dtype or st[2] != self.level:
            buf = np.empty(self._tile, dtype=self.plan.geometry.dtype)
            comp = zstandard.ZstdCompressor(level=self.level, write_checksum=False, write_content_size=True)
            st = (buf, comp, self.level)
            self._local.state = st
        return st[0], st[1]

    def _compress_range(self, src: np.ndarray, start: int, stop: int) -> list[bytes]:
        buf, comp = self._worker_state()
        fill = self.plan.fill
        out = []
        for t in range(start, stop):
            idx = np.unravel_index(t, self._grid)
            gather_tile(src, idx, self._tile, fill, buf)
            out.append(comp.compress(buf))
        return out

    def submit(self, slab: np.ndarray, rows: int) -> list[Future]:
        src = slab[:rows]
        return [self._pool.submit(self._compress_range, src, a, b) for a, b in self._tasks]

    def ready(self, ticket: list[Future]) -> bool:
        return all(f.done() for f in ticket)

    def collect(self, ticket: list[Future]) -> list[bytes]:
        frames: list[bytes] = []
        for f in ticket:
            frames.extend(f.result())
        return frames

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for flat in self._slabs:
            give_buffer(flat)
        self._slabs.clear()
