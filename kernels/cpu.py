"""CPU tile backend: numpy gather into reused buffers + per-thread zstd into reused output.

Each worker thread owns one tile-shaped buffer and one zstd compression
context (contexts are not thread-safe). A task gathers a run of tiles from
the slab into that buffer (``gather_tile``: the per-tile form of the
lift/transpose, padding edge tiles with the fill value) and compresses it
while it is still in cache, at level ``level`` with no checksum and the
content size in the frame header — byte-for-byte the frame that
``zstandard.ZstdCompressor(level=…, write_checksum=False).compress`` gives
(tested), so zarr-python and tensorstore read it like their own.

Output goes straight into a reused per-slab **arena** (one compress-bound
slot per tile): libzstd is called through the cffi binding that ships inside
``zstandard`` (``zstandard._cffi``; cffi releases the GIL for the call), so no
Python bytes object is allocated per chunk. ``compress()`` allocating a fresh
~0.5 MiB result per chunk cost 13-15 % of the CPU here in page faults and
allocator churn (measured: 0.281 vs 0.324 GB per CPU-second, same frames).
``collect`` returns memoryviews into the arena; they stay valid until the
writer hands the ticket back with ``release``. Arenas are recycled and not
pre-faulted: only the pages the frames touch ever get faulted, once.

With ``checksum`` on (the default) each frame is followed in its slot by its
CRC-32C (the Zarr ``crc32c`` codec, docs/formats/zarr-tiles.md), computed by
the same worker right after compressing, while the frame is still in cache
(libcrc32c through ctypes, no GIL: ``warpdata.formats.crc``).

A slab's tasks run object by object when the writer names its objects'
tiles (``set_groups``): each object is signalled (``on_group_ready``) as soon
as its chunks are compressed, so its SHA-256 and write overlap the rest of the
slab's compression instead of trailing the last slab.

Without cffi the backend falls back to ``compress()`` (bytes per chunk).
numpy copies and zstd both release the GIL, so throughput scales with
threads; zstd is ~88 % of the CPU time (docs/design.md §5). Slab buffers are
pre-faulted once and recycled through a small process-wide pool.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import zstandard
from warpdata.core import envvars
from warpdata.core.errors import InternalError
from warpdata.formats import crc as crc32c
from warpdata.formats.tiling import SlabPlan, gather_tile
from warpdata.formats.zarr_v3 import CRC_SIZE, chunk_crc
from warpdata.kernels import TileBackend

try:  # the libzstd bundled in zstandard, through cffi (needs the ``cffi`` runtime)
    from zstandard import _cffi as _zc
except ImportError:  # pragma: no cover - wheels without the cffi module
    _zc = None

_pack_crc = struct.Struct("<I").pack_into  # a chunk's CRC-32C trailer (docs/formats/zarr-tiles.md)

# Freed slab buffers and arenas, kept for the next writer in this process: a
# fresh buffer costs a page fault per 4 KiB on first touch (0.2-0.4 GB/s here).
_POOL_LOCK = threading.Lock()
_POOL: list[np.ndarray] = []
POOL_CAP_BYTES = 1 << 30


def take_buffer(nbytes: int, *, prefault: bool = True, small_pages: bool = False) -> np.ndarray:
    """A flat uint8 buffer of ``nbytes`` (reused from the pool when possible).

    ``prefault`` touches every page now, not on the hot path. Arenas skip it
    and ask for ``small_pages``: only the 4 KiB pages the compressed frames
    reach get faulted, where transparent huge pages (numpy's default for big
    arrays) fault whole 2 MiB pages, and those faults cost up to ~1 ms each
    here when the kernel has to compact memory (measured: 1.3 s of system
    time in the first 0.5 GiB write).
    """
    with _POOL_LOCK:
        for i, b in enumerate(_POOL):
            if b.nbytes == nbytes:
                return _POOL.pop(i)
    if small_pages and hasattr(mmap, "MADV_NOHUGEPAGE"):
        m = mmap.mmap(-1, nbytes)
        m.madvise(mmap.MADV_NOHUGEPAGE)
        buf = np.frombuffer(m, dtype=np.uint8)
    else:
        buf = np.empty(nbytes, dtype=np.uint8)
    if prefault:
        buf[::4096] = 0
    return buf


def give_buffer(buf: np.ndarray) -> None:
    """Return a buffer from :func:`take_buffer`; the oldest are dropped past the cap."""
    with _POOL_LOCK:
        _POOL.append(buf)
        while sum(b.nbytes for b in _POOL) > POOL_CAP_BYTES:
            _POOL.pop(0)


def default_threads() -> int:
    env = envvars.number("WARP_WORKERS")  # a bad value is a ConfigError naming it, not ignored
    if env is not None:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def compress_bound(nbytes: int) -> int:
    """libzstd's ZSTD_compressBound: the largest frame ``nbytes`` of input can give."""
    if _zc is not None:
        return int(_zc.lib.ZSTD_compressBound(nbytes))
    # zstd.h ZSTD_COMPRESSBOUND
    return nbytes + (nbytes >> 8) + (((128 << 10) - nbytes) >> 11 if nbytes < (128 << 10) else 0)


class _Arena:
    """One slab's compressed output: tile ``t``'s frame at ``[t * slot, t * slot + sizes[t])``."""

    __slots__ = ("addr", "buf", "ptr", "sizes", "slot")

    def __init__(self, buf: np.ndarray, slot: int, n_tiles: int) -> None:
        self.buf = buf
        self.slot = slot
        self.sizes = [0] * n_tiles
        self.ptr = _zc.ffi.from_buffer(buf) if _zc is not None else None
        self.addr = buf.ctypes.data  # the CRC-32C of each frame is taken in place, by address

    def frames(self) -> list[memoryview]:
        mv = memoryview(self.buf)
        s = self.slot
        return [mv[t * s: t * s + n] for t, n in enumerate(self.sizes)]


class _Ticket:
    __slots__ = ("arena", "futures", "layout")

    def __init__(self, futures: list[Future], arena: _Arena | None, layout: tuple) -> None:
        self.futures = futures
        self.arena = arena
        # (tiles of each future, group of each future, futures per group), as when it was submitted
        self.layout = layout


class CpuBackend(TileBackend):
    name = "cpu"
    accepts_views = True

    def __init__(self, *, level: int = 1, threads: int | None = None, direct: bool | None = None,
                 checksum: bool = True) -> None:
        super().__init__(level=level, threads=threads or default_threads(), checksum=checksum)
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._slabs: list[np.ndarray] = []
        self._arenas: list[_Arena] = []  # every arena this backend made (returned to the pool on close)
        self._free_arenas: list[_Arena] = []
        self._lock = threading.Lock()
        # direct: compress into arenas through cffi (the fast path); False forces compress() + bytes
        self.direct = (_zc is not None) if direct is None else (bool(direct) and _zc is not None)
        self.plan: SlabPlan | None = None

    @classmethod
    def probe(cls) -> str | None:
        return None

    def prepare(self, plan: SlabPlan) -> None:
        self.plan = plan
        g = plan.geometry
        self._grid = plan.slab_counts
        self._tile = g.tile
        self._tile_nbytes = g.tile_elements * g.dtype.itemsize
        self._bound = compress_bound(self._tile_nbytes)
        self._slot = self._bound + CRC_SIZE  # the frame, then room for its CRC-32C
        n = plan.tiles_per_slab
        self._index = [tuple(int(i) for i in np.unravel_index(t, self._grid)) for t in range(n)]
        self._slices = [tuple(slice(i * k, i * k + k) for i, k in zip(idx, g.tile, strict=True)) for idx in self._index]
        # full tiles (no padding) of a slab with all its rows; the last slab and edge tiles take gather_tile
        self._full = [all(i * k + k <= s for i, k, s in zip(idx[1:], g.tile[1:], g.shape[1:], strict=True))
                      for idx in self._index]
        row_bytes = g.tile[-1] * g.dtype.itemsize
        self._row_dtype = np.dtype((np.void, row_bytes)) if g.tile[-1] > 1 and row_bytes < 2048 else None
        # enough tasks per slab that no thread idles long at the stream's tail (a task of
        # 64^3 u16 tiles is ~13 ms of zstd here at 16 tasks per thread)
        self._per = max(1, -(-n // (self.threads * 16)))
        self._set_tasks([list(range(n))])
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="warp-tiles-cpu")

    def _set_tasks(self, groups: list[list[int]]) -> None:
        """Tasks of at most ``_per`` tiles, group after group (a task never spans two groups)."""
        per = self._per
        self._tasks = [g[i:i + per] for g in groups for i in range(0, len(g), per)]
        self._layout = (self._tasks, [gi for gi, g in enumerate(groups) for _ in range(0, len(g), per)],
                        [-(-len(g) // per) for g in groups])

    def set_groups(self, groups) -> None:
        """Order the tasks object by object (in file order), so each object's chunks are done, and
        can be written, while the rest of the slab is still compressing: only the last object's
        SHA-256 and write are left after the slab's last chunk (BENCHMARKS.md, "Tiles: where the
        CPU writer's time goes")."""
        groups = [[int(t) for t in g] for g in groups]
        if sorted(t for g in groups for t in g) != list(range(self.plan.tiles_per_slab)):
            raise InternalError(f"groups {groups} do not cover the slab's {self.plan.tiles_per_slab} tiles once each")
        self._set_tasks(groups)

    def alloc_slab(self) -> np.ndarray:
        flat = take_buffer(self.plan.slab_nbytes)
        self._slabs.append(flat)
        return flat.view(self.plan.geometry.dtype).reshape(self.plan.slab_shape)

    def _take_arena(self) -> _Arena:
        with self._lock:
            if self._free_arenas:
                return self._free_arenas.pop()
        n = self.plan.tiles_per_slab
        arena = _Arena(take_buffer(n * self._slot, prefault=False, small_pages=True), self._slot, n)
        with self._lock:
            self._arenas.append(arena)
        return arena

    # -- per-thread state ---------------------------------------------------------
    def _tile_buffer(self) -> np.ndarray:
        st = getattr(self._local, "buf", None)
        if st is None or st[0].shape != self._tile or st[0].dtype != self.plan.geometry.dtype:
            buf = np.empty(self._tile, dtype=self.plan.geometry.dtype)
            st = (buf, _zc.ffi.from_buffer(buf) if _zc is not None else None)
            self._local.buf = st
        return st

    def _cctx(self):
        st = getattr(self._local, "cctx", None)
        if st is None or st[1] != self.level:
            lib = _zc.lib
            cctx = _zc.ffi.gc(lib.ZSTD_createCCtx(), lib.ZSTD_freeCCtx)
            if cctx == _zc.ffi.NULL:
                raise MemoryError("ZSTD_createCCtx failed")
            # the same parameters as zstandard.ZstdCompressor(level=L, write_checksum=False):
            # level L, no checksum, content size written (libzstd's defaults for the rest)
            for param, value in ((lib.ZSTD_c_compressionLevel, self.level), (lib.ZSTD_c_checksumFlag, 0),
                                 (lib.ZSTD_c_contentSizeFlag, 1)):
                _check(lib.ZSTD_CCtx_setParameter(cctx, param, value))
            st = (cctx, self.level)
            self._local.cctx = st
        return st[0]

    def _compressor(self) -> zstandard.ZstdCompressor:
        st = getattr(self._local, "comp", None)
        if st is None or st[1] != self.level:
            st = (zstandard.ZstdCompressor(level=self.level, write_checksum=False, write_content_size=True), self.level)
            self._local.comp = st
        return st[0]

    # -- work ---------------------------------------------------------------------
    def _tile_source(self, src: np.ndarray, t: int, buf: np.ndarray, full_rows: bool):
        """The C-contiguous bytes of tile ``t``: a view of ``src`` when it already is one, else ``buf``."""
        if full_rows and self._full[t]:
            view = src[self._slices[t]]
            if view.flags.c_contiguous:
                return view  # e.g. tiles spanning whole rows: no gather at all
            if self._row_dtype is not None:
                # copy whole tile rows as single void elements: numpy moves each with one memcpy
                # instead of an element loop (measured 4.8 -> 8.4 GB/s for 64^3 u16 tiles)
                np.copyto(buf.view(self._row_dtype), view.view(self._row_dtype))
            else:
                np.copyto(buf, view)
            return buf
        return gather_tile(src, self._index[t], self._tile, self.plan.fill, buf)

    def _compress_direct(self, src: np.ndarray, arena: _Arena, tiles: list[int]) -> None:
        buf, bufptr = self._tile_buffer()
        cctx = self._cctx()
        ffi, lib = _zc.ffi, _zc.lib
        slot, bound, nbytes, sizes = self._slot, self._bound, self._tile_nbytes, arena.sizes
        full_rows = src.shape[0] == self._tile[0]
        out, addr = arena.buf, arena.addr
        # the frame's CRC-32C straight from the arena by address, written with one pack_into: a
        # numpy view, its ctypes pointer and a bytes round trip per chunk were ~5 % of the
        # writer's samples (BENCHMARKS.md, "Where the tile writer's time goes")
        crc_at = crc32c.native_extend() if self.checksum else None
        for t in tiles:
            tile = self._tile_source(src, t, buf, full_rows)
            ptr = bufptr if tile is buf else ffi.from_buffer(tile)
            n = lib.ZSTD_compress2(cctx, arena.ptr + t * slot, bound, ptr, nbytes)  # GIL released by cffi
            if lib.ZSTD_isError(n):
                raise InternalError(f"zstd compression failed: {ffi.string(lib.ZSTD_getErrorName(n)).decode()}")
            if self.checksum:
                pos = t * slot + n
                c = crc_at(0, addr + t * slot, n) if crc_at is not None else crc32c.extend(0, out[t * slot:pos])
                _pack_crc(out, pos, c)
                n += CRC_SIZE
            sizes[t] = n

    def _compress_bytes(self, src: np.ndarray, tiles: list[int]) -> list[bytes]:
        buf, _ = self._tile_buffer()
        comp = self._compressor()
        full_rows = src.shape[0] == self._tile[0]
        frames = [comp.compress(self._tile_source(src, t, buf, full_rows)) for t in tiles]
        return [f + chunk_crc(f) for f in frames] if self.checksum else frames

    def submit(self, slab: np.ndarray, rows: int) -> _Ticket:
        src = slab[:rows]
        if not self.direct:
            return _Ticket([self._pool.submit(self._compress_bytes, src, ts) for ts in self._tasks], None,
                           self._layout)
        arena = self._take_arena()
        return _Ticket([self._pool.submit(self._compress_direct, src, arena, ts) for ts in self._tasks], arena,
                       self._layout)

    def ready(self, ticket: _Ticket) -> bool:
        return all(f.done() for f in ticket.futures)

    def on_ready(self, ticket: _Ticket, callback) -> bool:
        lock = threading.Lock()
        left = [len(ticket.futures)]

        def one_done(_f) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                callback()

        if not ticket.futures:
            callback()
        for f in ticket.futures:
            f.add_done_callback(one_done)  # runs at once if f is already done
        return True

    def on_group_ready(self, ticket: _Ticket, callback) -> bool:
        if ticket.arena is None:
            return False  # the compress() fallback hands frames over per slab only
        lock = threading.Lock()
        _, groups, per_group = ticket.layout
        left = list(per_group)

        def make(gi: int):
            def one_done(f: Future) -> None:
                if f.cancelled() or f.exception() is not None:
                    return  # collect() raises it; the group is never signalled
                with lock:
                    left[gi] -= 1
                    last = left[gi] == 0
                if last:
                    callback(gi)
            return one_done

        for f, gi in zip(ticket.futures, groups, strict=True):
            f.add_done_callback(make(gi))  # runs at once if f is already done
        return True

    def group_frames(self, ticket: _Ticket, tiles) -> list:
        """Frames of ``tiles`` (memoryviews into the arena) once their group was signalled."""
        a = ticket.arena
        mv, s, sizes = memoryview(a.buf), a.slot, a.sizes
        return [mv[t * s: t * s + sizes[t]] for t in tiles]

    def collect(self, ticket: _Ticket) -> list:
        """The slab's frames in tile order: memoryviews valid until :meth:`release` (bytes without cffi)."""
        if ticket.arena is None:
            frames: list = [None] * self.plan.tiles_per_slab
            for f, tiles in zip(ticket.futures, ticket.layout[0], strict=True):
                for t, frame in zip(tiles, f.result(), strict=True):
                    frames[t] = frame
            return frames
        for f in ticket.futures:
            f.result()
        return ticket.arena.frames()

    def release(self, ticket: _Ticket) -> None:
        """The writer is done with the frames of ``ticket``: their arena may be reused."""
        if ticket.arena is not None:
            with self._lock:
                self._free_arenas.append(ticket.arena)
            ticket.arena = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for flat in self._slabs:
            give_buffer(flat)
        self._slabs.clear()
        with self._lock:
            # arenas still out (an aborted write) may be referenced by pending I/O: leave those to the GC
            free = {id(a) for a in self._free_arenas}
            for arena in self._arenas:
                if id(arena) in free:
                    give_buffer(arena.buf)
            self._arenas.clear()
            self._free_arenas.clear()


def _check(code: int) -> int:
    if _zc.lib.ZSTD_isError(code):
        raise InternalError(f"zstd parameter rejected: {_zc.ffi.string(_zc.lib.ZSTD_getErrorName(code)).decode()}")
    return code
