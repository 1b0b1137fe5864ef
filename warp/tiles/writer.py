"""TileWriter: a row-major byte stream in, a Zarr v3 array (or pyramid) out.

The writer contract (docs/formats/zarr-tiles.md):

* ``write(buf) -> int`` consumes as much of ``buf`` as fits and returns the
  count; when both slab buffers are busy it returns **0 without blocking** —
  the caller retries later (``wait()`` blocks until there is room, for
  callers that prefer that). Errors raise; 0 never means an error.
* ``reserve()`` / ``commit(n)``: the zero-copy form — a writable window into
  the current slab (e.g. for ``readinto``), ``None`` when nothing is free.
* ``close()`` flushes the last slab, waits for every object, then writes
  ``zarr.json`` (and the group's, for pyramids) and ``manifest.json``, in
  that order: a reader never sees metadata for data that is not there.

Pipeline: two preallocated, pre-faulted slab buffers (a slab is one
tile-height of dimension 0, ``formats.tiling.SlabPlan``). The caller fills
one while a collector thread has the backend compress the other; frames are
assembled into shards (or unsharded chunk objects) as soon as a slab is done
— a slab completes a whole row of shards because the shard extent of
dimension 0 equals the tile's — and written by a small I/O pool, atomically
per object (one ``writev`` of the frames, no join); a backend that signals each
object's chunks (``on_group_ready``: the CPU backend compresses a slab shard
after shard) has each shard hashed and written while the rest of its slab
compresses. Frames may be views into the backend's reused output arenas: the slab's ticket is ``release``d once
its objects are written. Durable writes fsync each object once and each
directory once, just before ``zarr.json``. With ``levels > 1`` each finished slab is also downsampled
(``pyramid.py``) into the next level's writer, and the output is an
OME-Zarr-style multiscale group with levels ``0``, ``1``, ….
"""

from __future__ import annotations

import hashlib
import math
import os
import queue
import shutil
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from warpdata.core.atomic import CommitOnSuccess, dir_mode
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import ConfigError, DataError, InternalError
from warpdata.core.names import MANIFEST_NAME, ZARR_ARRAY
from warpdata.formats import crc as crc32c
from warpdata.formats import zarr_v3
from warpdata.formats.tiling import SlabPlan, TileGeometry
from warpdata.kernels import TileBackend, get_backend
from warpdata.storage import zarr_store
from warpdata.tiles import replace
from warpdata.tiles.canary import check_first_chunks
from warpdata.tiles.digests import crc32c_combine, level_digest, slab_digest
from warpdata.tiles.layout import auto_shards, check_shards, default_axes, layout_fields
from warpdata.tiles.pyramid import METHODS, Downsampler, downsampled_shape
from warpdata.tiles.result import WriteResult, check_manifest, pyramid_group, warm_manifest_check

__all__ = ["TileWriter", "WriteResult", "auto_shards", "crc32c_combine", "level_digest", "slab_digest"]

_STOP = object()
_WAKE = object()  # a ticket became ready (the collector re-checks)
_OBJECT = object()  # (_OBJECT, slab, object, ticket): one object's chunks are compressed (on_group_ready)


class TileWriter(CommitOnSuccess):
    """Stream a row-major array into a Zarr v3 array at ``url`` (see module docstring).

    ``shards``: ``"auto"`` (default), a shard shape, or ``None`` for one
    object per chunk. ``backend``: a name (``auto``/``cpu``/``gpu``, default
    ``WARP_BACKEND``) or a :class:`TileBackend` instance. ``levels`` > 1
    writes a multiscale pyramid downsampled with ``method``. ``checksum``
    (default on) ends every chunk with its CRC-32C, the Zarr ``crc32c``
    codec, which zarr-python and tensorstore verify on read.
    """

    def __init__(self, url, shape: Sequence[int], dtype, tile: Sequence[int], *,
                 shards: Sequence[int] | str | None = "auto", fill_value: Any = 0, level: int = 1,
                 backend: str | TileBackend | None = None, threads: int | None = None,
                 levels: int = 1, method: str = "median", axes: Sequence[str] | None = None,
                 attributes: dict | None = None, fsync: bool = True, storage_config=None, checksum: bool = True,
                 manifest_extra: dict | None = None, _store: zarr_store.Store | None = None,
                 _level_index: int = 0, rows: tuple[int, int] | None = None,
                 build_dir: str | None = None, on_committed=None) -> None:
        self.geometry = TileGeometry.create(shape, tile, dtype)
        if levels < 1:
            raise ConfigError(f"levels must be >= 1, got {levels}", hint="1 = full resolution only")
        if method not in METHODS:
            raise ConfigError(f"unknown downsampling method {method!r}", hint="use one of: " + ", ".join(METHODS))
        if not 1 <= int(level) <= 22:
            raise ConfigError(f"zstd level {level} is outside 1..22", hint="level 1 is the fast default")
        g = self.geometry
        zarr_v3.fill_value_json(fill_value, g.dtype)  # validates the fill value early
        self.fill_value = g.dtype.type(fill_value) if g.dtype.kind == "f" else int(fill_value)
        if isinstance(shards, str):
            if shards != "auto":
                raise ConfigError(f"shards must be 'auto', a shape or None, got {shards!r}")
            shards = auto_shards(g.shape, g.tile, g.dtype.itemsize)
        elif shards is not None:
            shards = check_shards(g.shape, g.tile, shards)
        self.shards = shards
        self.level = int(level)
        self.levels = int(levels)
        self.method = method
        self.axes = default_axes(g.ndim, axes) if (levels > 1 or axes is not None) else None
        self.attributes = attributes or {}
        self.manifest_extra = manifest_extra or {}
        self._level_index = _level_index
        # a range writer (a task of the ETL kit) takes rows [a, b) of dimension 0 of the elided array
        # only, into a store the driver commits (commit_parts): no metadata, nothing removed on failure
        # (rows[1] None: every row, for a level whose first dimension differs from the one above's)
        self.rows = None if rows is None else (int(rows[0]), None if rows[1] is None else int(rows[1]))
        if self.rows is not None and _store is None:
            raise InternalError("a range writer (rows=) writes into the store of the writer that commits it (_store=)")
        self._top = _store is None
        self._fsync = fsync
        self.checksum = bool(checksum)
        if isinstance(backend, TileBackend):
            self.backend = backend
        else:
            self.backend = get_backend(backend, level=self.level, threads=threads, checksum=self.checksum)
        self.backend.checksum = self.checksum  # chunks end with their CRC-32C (the crc32c codec)
        self._tmp: str | None = None  # local top-level output: built here, renamed to _final on success
        self._final: str | None = None
        # called once the manifest is written, before the output is put in place (the ETL drops its
        # receipts journal there: docs/formats/receipts.md, "Tiled arrays")
        self.on_committed = on_committed
        self._meta_sha: dict[str, str] = {}  # zarr.json objects written: key -> SHA-256
        if _store is None:
            final = zarr_store.Store(url, fsync=fsync, config=storage_config)
            self.url = final.url
            if final.local:
                # nothing half-written is ever visible under the final name (docs/formats/zarr-tiles.md,
                # "Writing and replacing"): build in a temporary sibling, rename on success
                replace.check_replaceable(final.location.path)
                replace.clean_leftovers(final.location.path, replace.run_started())
                self._final = final.location.path
                if build_dir is not None:  # the ETL's resumable build directory (kept across a killed run)
                    os.makedirs(build_dir, mode=dir_mode(), exist_ok=True)
                    self._tmp = str(build_dir)
                else:
                    self._tmp = str(replace.make_temp_dir(self._final))
                root = zarr_store.Store(self._tmp, fsync=fsync, config=storage_config)
            else:
                root = final
                root.track_writes()  # an object store has no rename: abort() deletes what was put
        else:
            root = _store
            self.url = str(url)
        self.root = root
        # a pyramid's levels live in sub-arrays "0", "1", …; a single level is the root itself
        self.store = root.sub(str(_level_index)) if levels > 1 else root
        self._empty = math.prod(g.shape) == 0
        self.plan = SlabPlan(g.elided(), self.fill_value)
        if self.rows is not None:
            if self.rows[1] is None:
                self.rows = (0, self.plan.geometry.shape[0] if not self._empty else 0)
            a, b = self.rows
            n0, total = self.plan.geometry.tile[0], self.plan.geometry.shape[0] if not self._empty else 0
            if not (0 <= a <= b <= total) or a % n0 or (b % n0 and b != total):
                raise InternalError(f"rows {self.rows} are not whole slabs of {total} rows of {n0}")
        try:
            self._start(threads, fsync, storage_config)
        except BaseException:
            self._discard()
            raise

    def _start(self, threads, fsync, storage_config) -> None:
        g = self.geometry
        root = self.root
        _level_index = self._level_index
        levels = self.levels
        self._expected = g.nbytes if self.rows is None else (self.rows[1] - self.rows[0]) * self.plan.row_nbytes
        self._received = 0
        self._crc = 0
        self._from_parts = False  # commit_parts(): the counts and hashes came from range writers
        # per slab: its CRC-32C, counts and the SHA-256 of each object (docs/formats/zarr-tiles.md, "Content hashes")
        self._slab_lock = threading.Lock()
        self._slab_crc: dict[int, int] = {}
        self._slab_counts: dict[int, tuple[int, int, int]] = {}  # stored bytes, objects, chunks
        self._slab_objs: dict[int, list[str | None]] = {}
        # objects handed to the I/O pool, per slab not yet finished (collector thread only):
        # [object numbers sent, their futures, stored bytes, chunks]
        self._slab_sent: dict[int, list] = {}
        self._slab_digest: dict[int, str] = {}  # set once every object of the slab is written
        self.stored_bytes = 0
        self.objects = 0
        self.chunks = 0
        self._closed = False
        self.result: WriteResult | None = None
        self._error: BaseException | None = None
        self._next: TileWriter | None = None
        self._down: Downsampler | None = None
        if self._empty:
            return
        self.backend.prepare(self.plan)
        # slab buffers are allocated on first use: write_array's zero-copy path never needs them
        self._bufs: list = [None, None]
        self._flat: list = [None, None]
        self._cond = threading.Condition()
        self._free: deque[int] = deque([0, 1])
        self._cur: int | None = None
        self._fill = 0
        self._slab_no = self._first_slab = 0 if self.rows is None else self.rows[0] // self.plan.geometry.tile[0]
        self._queue: queue.Queue = queue.Queue()
        self._io = ThreadPoolExecutor(2, thread_name_prefix="warp-tiles-io")
        self._io_pending: deque[tuple[list[Future], Any]] = deque()
        # close()'s schema check of the manifest first imports jsonschema (0.08-0.17 s here): done now,
        # beside the compression, it is off the write's serial tail (BENCHMARKS.md, "Tiles: where the
        # CPU writer's time goes")
        self._warm = self._io.submit(warm_manifest_check) if self._top and self.rows is None else None
        self._shard_setup()
        # the backend finishes a slab's shards one after another and signals each, so a shard's
        # SHA-256 and write overlap the rest of the slab's compression: only the last shard's are
        # left once the stream's last chunk is compressed (BENCHMARKS.md, "Tiles: where the CPU
        # writer's time goes")
        self._early = self.shards is not None and len(self._tiles_per_obj) > 1
        if self._early:
            self.backend.set_groups([[m for m in members if m is not None] for members in self._tiles_per_obj])
        if self.levels - _level_index > 1 and levels > 1:
            self._setup_next_level(root, threads, fsync, storage_config)
        self._collector = threading.Thread(target=self._collect_loop, name="warp-tiles-collect", daemon=True)
        self._collector.start()

    # -- geometry of objects ------------------------------------------------
    def _shard_setup(self) -> None:
        g, e = self.geometry, self.plan.geometry
        kept = g.kept
        if self.shards is None:
            self._factors = tuple(1 for _ in kept)
        else:
            self._factors = tuple(self.shards[d] // g.tile[d] for d in kept)
        self._inner = math.prod(self._factors)
        grid = e.counts[1:]
        fac = self._factors[1:]
        self._obj_grid = tuple(-(-c // f) for c, f in zip(grid, fac, strict=True))
        # for each object in a slab: its tile numbers within the slab (C order), None beyond the array
        tiles_per_obj: list[list[int | None]] = []
        for obj in np.ndindex(*self._obj_grid) if self._obj_grid else [()]:
            members: list[int | None] = []
            for inner in np.ndindex(*fac) if fac else [()]:
                idx = tuple(o * f + i for o, f, i in zip(obj, fac, inner, strict=True))
                if all(i < c for i, c in zip(idx, grid, strict=True)):
                    members.append(int(np.ravel_multi_index(idx, grid)) if grid else 0)
                else:
                    members.append(None)
            tiles_per_obj.append(members)
        self._tiles_per_obj = tiles_per_obj

    def _object_key(self, slab_no: int, obj_no: int) -> str:
        obj = np.unravel_index(obj_no, self._obj_grid) if self._obj_grid else ()
        elided = (slab_no, *(int(x) for x in obj))
        return zarr_v3.chunk_key(self.geometry.expand_index(elided))

    def _setup_next_level(self, root, threads, fsync, storage_config) -> None:
        g = self.geometry
        factors_full = [1 if a.get("type") != "space" else 2 for a in self.axes]
        next_shape = downsampled_shape(g.shape, factors_full)
        next_tile = [min(n, s) if s > 0 else n for n, s in zip(g.tile, next_shape, strict=True)]
        kept = g.kept
        self._down = Downsampler(self.plan.slab_shape[1:], g.dtype, [factors_full[d] if g.shape[d] > 1 else 1 for d in kept],
                                 self.method)
        self._next = TileWriter(self.url, next_shape, g.dtype, next_tile,
                                shards="auto" if self.shards is not None else None, fill_value=self.fill_value,
                                level=self.level, backend=self.backend.name, threads=threads, levels=self.levels,
                                method=self.method, axes=[a["name"] for a in self.axes], fsync=fsync,
                                storage_config=storage_config, checksum=self.checksum, _store=root,
                                _level_index=self._level_index + 1,
                                rows=None if self.rows is None else self._next_rows(self.rows))

    # -- intake (producer thread) -----------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            if isinstance(err, Exception):
                raise err
            raise InternalError(f"tile writer failed: {err!r}")

    def _slab_capacity(self) -> int:
        return self.plan.rows(self._slab_no) * self.plan.row_nbytes

    def _acquire(self) -> bool:
        if self._cur is not None:
            return True
        with self._cond:
            if not self._free:
                return False
            self._cur = self._free.popleft()
        if self._bufs[self._cur] is None:
            self._bufs[self._cur] = self.backend.alloc_slab()
            self._flat[self._cur] = self._bufs[self._cur].reshape(-1).view(np.uint8)
        self._fill = 0
        return True

    def _advance(self, n: int) -> None:
        self._fill += n
        self._received += n
        if self._fill == self._slab_capacity():
            rows = self.plan.rows(self._slab_no)
            self._queue.put((self._slab_no, self._cur, rows, self._bufs[self._cur]))
            self._cur = None
            self._slab_no += 1

    def _check_room(self, n: int) -> None:
        if self._closed:
            raise DataError(f"{self.url}: write after close", hint="open a new TileWriter")
        if self._received + n > self._expected:
            raise DataError(f"{self.url}: input has more than the {self._expected} bytes of shape "
                            f"{list(self.geometry.shape)} {self.geometry.dtype.name}",
                            hint="check the shape and dtype in the config", received=self._received + n)

    def write(self, buf) -> int:
        """Consume as much of ``buf`` as fits now; 0 when both slabs are busy (never blocks)."""
        self._raise_if_failed()
        mv = memoryview(buf).cast("B") if not isinstance(buf, np.ndarray) else memoryview(np.ascontiguousarray(buf)).cast("B")
        n = len(mv)
        if n == 0:
            return 0
        self._check_room(n)
        if self._empty:
            raise DataError(f"{self.url}: the array has no elements but data was written")
        done = 0
        src = np.frombuffer(mv, dtype=np.uint8)
        while done < n and self._acquire():
            k = min(self._slab_capacity() - self._fill, n - done)
            self._flat[self._cur][self._fill:self._fill + k] = src[done:done + k]
            done += k
            self._advance(k)
        return done

    def reserve(self) -> memoryview | None:
        """A writable window into the current slab, or None when both slabs are busy."""
        self._raise_if_failed()
        if self._closed:
            raise DataError(f"{self.url}: write after close", hint="open a new TileWriter")
        if self._empty or self._received >= self._expected or not self._acquire():
            return None
        return memoryview(self._flat[self._cur])[self._fill:self._slab_capacity()]

    def commit(self, n: int) -> None:
        """Mark ``n`` bytes of the last :meth:`reserve` window as written."""
        if n <= 0:
            return
        if self._cur is None or self._fill + n > self._slab_capacity():
            raise InternalError("commit() past the reserved window")
        self._advance(n)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`write` can accept bytes (or an error happened)."""
        if self._empty or self._cur is not None:
            return True
        with self._cond:
            ok = self._cond.wait_for(lambda: self._free or self._error is not None, timeout)
        self._raise_if_failed()
        return bool(ok)

    def write_all(self, buf) -> None:
        """Blocking convenience: write every byte of ``buf``."""
        mv = memoryview(np.ascontiguousarray(buf) if isinstance(buf, np.ndarray) else buf).cast("B")
        done = 0
        while done < len(mv):
            k = self.write(mv[done:])
            if k == 0:
                self.wait()
            done += k

    def write_array(self, a: np.ndarray) -> None:
        """Blocking: write a whole array, or the next block of rows of it."""
        g = self.geometry
        if a.dtype.newbyteorder("<") != g.dtype or a.shape[1:] != g.shape[1:] and a.shape != g.shape:
            raise DataError(f"array of shape {a.shape} {a.dtype} does not match the writer's rows of "
                            f"{list(g.shape)} {g.dtype.name}", hint="pass rows of the declared shape and dtype")
        a = np.ascontiguousarray(a, dtype=g.dtype)
        if (a.shape == g.shape and self._received == 0 and self._cur is None and not self._empty
                and self.backend.accepts_views):
            self._write_views(a)
        else:
            self.write_all(a)

    def _write_views(self, a: np.ndarray) -> None:
        """Zero-copy intake of a whole in-memory array: the backend compresses views of it.

        The slab buffers' slots still bound what is in flight (two slabs); the
        caller's array is not touched after this returns because close()
        waits for everything.
        """
        self._check_room(a.nbytes)
        rows_view = a.reshape(self.plan.geometry.shape)
        n0 = self.plan.geometry.tile[0]
        for slab_no in range(self.plan.n_slabs):
            with self._cond:
                self._cond.wait_for(lambda: self._free or self._error is not None)
                self._raise_if_failed()
                token = self._free.popleft()
            rows = self.plan.rows(slab_no)
            self._queue.put((slab_no, token, rows, rows_view[slab_no * n0: slab_no * n0 + rows]))
            self._received += rows * self.plan.row_nbytes
        self._slab_no = self.plan.n_slabs

    @property
    def bytes_received(self) -> int:
        return self._received

    @property
    def bytes_expected(self) -> int:
        return self._expected

    # -- collector thread ---------------------------------------------------------
    def _collect_loop(self) -> None:
        inflight: deque = deque()
        stop = False

        def submit(item) -> None:
            ticket = self.backend.submit(item[3], item[2])
            # the backend signals when the ticket is ready (the CPU backend does): then this
            # thread sleeps in queue.get() instead of polling ready() every 2 ms
            notified = self.backend.on_ready(ticket, lambda: self._queue.put(_WAKE))
            inflight.append((item, ticket, notified))
            slab_no = item[0]
            with self._slab_lock:
                self._slab_objs[slab_no] = [None] * len(self._tiles_per_obj)
            self._slab_sent[slab_no] = [set(), [], 0, 0]
            # the first slab's chunks are checked (canary.py) before any of its objects is written
            if self._early and slab_no != self._first_slab:
                self.backend.on_group_ready(ticket, lambda g, s=slab_no, t=ticket: self._queue.put((_OBJECT, s, g, t)))
            # slabs arrive in stream order: checksum the input while the backend compresses it,
            # so the last slab's CRC is not on the pipeline's serial tail
            # (without the GIL: the compression workers need it between their zstd calls)
            self._slab_crc[item[0]] = crc32c.extend(0, item[3][:item[2]].reshape(-1).view(np.uint8))

        try:
            while True:
                # collect the oldest slab once it is ready (after STOP: wait for it; a backend that
                # signals readiness wakes this thread, which meanwhile hands over finished objects),
                # but first hand every queued slab to the backend so no worker idles at a slab's tail
                if inflight and self._queue.empty() and (self.backend.ready(inflight[0][1])
                                                         or (stop and not inflight[0][2])):
                    (slab_no, buf_id, rows, view), ticket, _ = inflight.popleft()
                    frames = self.backend.collect(ticket)
                    self._finish_slab(slab_no, buf_id, rows, view, frames, ticket)
                    continue
                if stop and not inflight:
                    break
                timeout = None if not inflight or inflight[0][2] else 0.002
                try:
                    item = self._queue.get(timeout=timeout)
                except queue.Empty:
                    continue
                if item is _WAKE:
                    continue
                if item is _STOP:
                    stop = True
                    continue
                if item[0] is _OBJECT:
                    _, slab_no, obj_no, ticket = item
                    if slab_no in self._slab_sent and obj_no not in self._slab_sent[slab_no][0]:
                        members = self._tiles_per_obj[obj_no]
                        got = self.backend.group_frames(ticket, [m for m in members if m is not None])
                        it = iter(got)
                        self._send_object(slab_no, obj_no, [None if m is None else next(it) for m in members])
                    continue
                submit(item)
        except BaseException as e:
            self._error = e
            with self._cond:
                self._cond.notify_all()

    def _finish_slab(self, slab_no: int, buf_id: int, rows: int, view: np.ndarray, frames: list,
                     ticket: Any = None) -> None:
        data = view[:rows]
        if slab_no == self._first_slab and len(frames) == self.plan.tiles_per_slab:
            # before the slab buffer is handed back for reuse
            check_first_chunks(self.plan, data, frames, checksum=self.checksum, url=self.url,
                               backend=self.backend.name)
        if self._down is not None:
            down = self._down.push(data)
            if down is not None:
                self._next.write_all(down)
        with self._cond:
            self._free.append(buf_id)
            self._cond.notify_all()
        if len(frames) != self.plan.tiles_per_slab:
            raise InternalError(f"backend {self.backend.name} returned {len(frames)} frames for "
                                f"{self.plan.tiles_per_slab} tiles")
        sent = self._slab_sent[slab_no]
        for obj_no, members in enumerate(self._tiles_per_obj):
            if obj_no not in sent[0]:  # not handed over early (on_group_ready)
                self._send_object(slab_no, obj_no, [None if m is None else frames[m] for m in members])
        del self._slab_sent[slab_no]
        self._slab_counts[slab_no] = (sent[2], len(self._tiles_per_obj), sent[3])
        # frames may be views into the backend's output arenas: hand them back once written
        self._io_pending.append((sent[1], ticket))
        while len(self._io_pending) > 2:
            self._wait_io(*self._io_pending.popleft())

    def _send_object(self, slab_no: int, obj_no: int, frames: list) -> None:
        """Hand one object (its members' frames, None past the array) to the I/O pool (collector thread)."""
        key = self._object_key(slab_no, obj_no)
        parts = [frames[0]] if self.shards is None else zarr_v3.shard_parts(frames)
        n_chunks = sum(f is not None for f in frames)
        nbytes = sum(len(p) for p in parts)
        self.chunks += n_chunks
        self.objects += 1
        self.stored_bytes += nbytes
        sent = self._slab_sent[slab_no]
        sent[0].add(obj_no)
        sent[2] += nbytes
        sent[3] += n_chunks
        # each object's file is fsync'd before its rename; directories once, at commit
        sent[1].append(self._io.submit(self._put_object, slab_no, obj_no, key, parts))

    def _put_object(self, slab_no: int, obj_no: int, key: str, parts: list) -> None:
        """Put one object and note its SHA-256; the slab's digest once its last object is written."""
        h = hashlib.sha256()
        for part in parts:
            h.update(part)
        self.store.put(key, parts, sync_dir=False)
        with self._slab_lock:
            objs = self._slab_objs[slab_no]
            objs[obj_no] = h.hexdigest()
            if all(o is not None for o in objs):
                self._slab_digest[slab_no] = slab_digest(
                    (self._object_key(slab_no, i), d) for i, d in enumerate(objs))
                del self._slab_objs[slab_no]

    def _next_rows(self, rows: tuple[int, int]):
        """Rows of the next level made from ``rows`` of this one (``(0, None)``: all of them)."""
        a, b = rows
        if self._empty or (a == 0 and b == self.plan.geometry.shape[0]):
            return (0, None)
        f = self._down.factors[0]
        return (a // f, -(-b // f))

    def _own_rows(self) -> tuple[int, int]:
        return self.rows if self.rows is not None else (0, 0 if self._empty else self.plan.geometry.shape[0])

    def slab_range(self, rows: tuple[int, int]) -> range:
        """The slab numbers holding rows ``[a, b)`` of (the elided) dimension 0."""
        if self._empty:
            return range(0)
        n0 = self.plan.geometry.tile[0]
        return range(rows[0] // n0, -(-rows[1] // n0))

    def range_part(self, rows: tuple[int, int]) -> dict[str, Any] | None:
        """What this writer (and its lower levels) wrote for rows ``[a, b)`` of dimension 0 (whole slabs of
        every level): ``{"rows", "bytes", "crc32c", "levels": [{"stored_bytes", "objects", "chunks",
        "first_slab", "slabs"}, …]}``, the unit of a receipt and of :meth:`commit_parts`; None while
        an object of it is not written yet."""
        a, b = int(rows[0]), int(rows[1])
        out: dict[str, Any] = {"rows": [a, b], "bytes": (b - a) * self.plan.row_nbytes, "levels": []}
        w, lo, hi = self, a, b
        crc = 0
        while w is not None:
            slabs = w.slab_range((lo, hi))
            with w._slab_lock:
                # counts are set once the slab's last object is handed over, which can be after
                # the objects handed over early are all written
                if any(s not in w._slab_digest or s not in w._slab_counts for s in slabs):
                    return None
                digests = [w._slab_digest[s] for s in slabs]
            counts = [w._slab_counts[s] for s in slabs]
            if w is self:
                for s in slabs:
                    crc = crc32c_combine(crc, w._slab_crc[s], w.plan.rows(s) * w.plan.row_nbytes)
            out["levels"].append({"stored_bytes": sum(c[0] for c in counts), "objects": sum(c[1] for c in counts),
                                  "chunks": sum(c[2] for c in counts), "first_slab": slabs.start if slabs else 0,
                                  "slabs": digests})
            if w._next is not None:
                lo, hi = w._next_rows((lo, hi))
                if hi is None:
                    hi = w._next.plan.geometry.shape[0] if not w._next._empty else 0
            w = w._next
        out["crc32c"] = crc
        return out

    def _wait_io(self, futures: list[Future], ticket: Any) -> None:
        for f in futures:
            f.result()
        self.backend.release(ticket)

    # -- finishing ------------------------------------------------------------------------
    def _drain(self) -> None:
        self._queue.put(_STOP)
        self._collector.join()
        self._raise_if_failed()
        while self._io_pending:
            self._wait_io(*self._io_pending.popleft())

    def _array_metadata(self) -> dict:
        g = self.geometry
        names = [a["name"] for a in self.axes] if self.axes else None
        return zarr_v3.array_metadata(g.shape, g.dtype, g.tile, shards=self.shards, fill_value=self.fill_value,
                                      level=self.level, dimension_names=names, attributes=self.attributes
                                      if self._top and self.levels == 1 else {}, checksum=self.checksum)

    def _level_info(self) -> list[dict]:
        g = self.geometry
        slabs = self.slab_range(self._own_rows())
        missing = [s for s in slabs if s not in self._slab_digest]
        if missing:
            raise InternalError(f"{self.url}: level {self._level_index} has no content hash for slab {missing[0]}")
        info = [{"path": str(self._level_index) if (self.levels > 1) else "", "shape": list(g.shape),
                 "chunks": list(g.tile), "shards": list(self.shards) if self.shards else None,
                 "stored_bytes": self.stored_bytes, "objects": self.objects,
                 "sha256": level_digest(self._slab_digest[s] for s in slabs)}]
        if self._next is not None:
            info += self._next._level_info()
        return info

    def close(self) -> WriteResult:
        """Flush, wait for every object, then write zarr.json(s) and the manifest."""
        if self._closed:
            raise DataError(f"{self.url}: already closed")
        if self._error is not None:
            self.abort()
            self._raise_if_failed()
        if self._received != self._expected:
            self.abort()
            raise DataError(f"{self.url}: input ended after {self._received} of {self._expected} bytes "
                            f"(shape {list(self.geometry.shape)} {self.geometry.dtype.name})",
                            hint="check the shape and dtype in the config against the input size",
                            received=self._received, expected=self._expected)
        self._closed = True
        try:
            if not self._empty:
                self._drain()
                if self._down is not None:
                    last = self._down.finish()
                    if last is not None:
                        self._next.write_all(last)
            if self._next is not None:
                self._next.close()
            self.store.sync_dirs()  # every chunk object durable before the metadata points at it
            if self.rows is None:  # a range's metadata is the driver's (commit_parts)
                meta = zarr_v3.encode_json(self._array_metadata())
                self.store.put(zarr_v3.ZARR_JSON, meta)
                self._meta_sha[f"{self._level_index}/{zarr_v3.ZARR_JSON}" if self.levels > 1
                               else zarr_v3.ZARR_JSON] = hashlib.sha256(meta).hexdigest()
        except BaseException:
            self._shutdown()
            if self._next is not None:
                self._next.abort()
            self._discard()
            raise
        self._shutdown()
        if not self._empty and not self._from_parts:
            crc = 0  # the CRC-32C of this writer's rows, from its slabs', in order
            for s in self.slab_range(self._own_rows()):
                crc = crc32c_combine(crc, self._slab_crc[s], self.plan.rows(s) * self.plan.row_nbytes)
            self._crc = crc
        levels = self._level_info()
        result = WriteResult(self.url, self.geometry.shape, self.geometry.dtype.name, self._expected,
                             sum(lv["stored_bytes"] for lv in levels), sum(lv["objects"] for lv in levels),
                             self.chunks, levels, crc32c=self._crc)
        if self._top:
            try:
                if self.levels > 1:
                    meta, result.ome_zarr = pyramid_group(levels, self.axes, self.method, self.attributes)
                    self.root.put(zarr_v3.ZARR_JSON, meta)
                    self._meta_sha[zarr_v3.ZARR_JSON] = hashlib.sha256(meta).hexdigest()
                result.manifest = self._manifest(result)
                check_manifest(result.manifest, f"{self.url}/{MANIFEST_NAME}")
                self.root.put(MANIFEST_NAME, canonical_json(result.manifest) + b"\n")
                if self.on_committed is not None:
                    self.on_committed()
                if self._tmp is not None:
                    replace.publish_dir(self._tmp, self._final, fsync=self._fsync)
                    self._tmp = None
            except BaseException:
                self._discard()
                raise
        self.result = result
        return result

    def commit_parts(self, parts: Sequence[dict]) -> WriteResult:
        """Commit what range writers (``rows=``: the ETL kit's tasks, warp/tiles/etl.py) put into this
        writer's store, then write the metadata and manifest as :meth:`close` does.

        ``parts`` in row order, each ``{"bytes", "crc32c", "levels": [{"stored_bytes", "objects",
        "chunks"}, …]}`` (one entry per pyramid level). This writer must not have been given data.
        """
        if self._received or (not self._empty and self._cur is not None):
            raise InternalError("commit_parts() on a writer that was given data itself")
        total = sum(int(p["bytes"]) for p in parts)
        if total != self._expected:
            self.abort()
            raise InternalError(f"{self.url}: the parts hold {total} of the array's {self._expected} bytes")
        crc = 0
        for p in parts:
            crc = crc32c_combine(crc, int(p["crc32c"]), int(p["bytes"]))
        w, level = self, 0
        while w is not None:
            w.stored_bytes = sum(int(p["levels"][level]["stored_bytes"]) for p in parts)
            w.objects = sum(int(p["levels"][level]["objects"]) for p in parts)
            w.chunks = sum(int(p["levels"][level]["chunks"]) for p in parts)
            w._received = w._expected
            w._from_parts = True
            if not w._empty:
                for p in parts:
                    lv = p["levels"][level]
                    for i, d in enumerate(lv["slabs"]):
                        w._slab_digest[int(lv["first_slab"]) + i] = d
            w, level = w._next, level + 1
        self._crc = crc
        return self.close()

    def level_counts(self) -> list[dict[str, int]]:
        """Per level: the bytes stored, objects and chunks this writer (and its lower levels) wrote."""
        out, w = [], self
        while w is not None:
            out.append({"stored_bytes": w.stored_bytes, "objects": w.objects, "chunks": w.chunks})
            w = w._next
        return out

    def _discard(self) -> None:
        """Remove what a failed top-level write left: its temporary directory, or the objects it PUT."""
        if not self._top:
            return
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        elif getattr(self, "root", None) is not None and not self.root.local:
            self.root.remove_written()

    def _manifest(self, r: WriteResult) -> dict:
        g = self.geometry
        m = {
            "kind": ZARR_ARRAY,
            **layout_fields(g.shape, g.dtype, g.tile, self.shards, self.fill_value, self.level, self.checksum),
            "array": r.levels[0]["path"],
            "levels": r.levels,
            "downsample": self.method if self.levels > 1 else None,
            "ome_zarr": r.ome_zarr,
            "raw_bytes": r.raw_bytes,
            "stored_bytes": r.stored_bytes,
            "objects": r.objects,
            "input_crc32c": f"{self._crc:08x}",
            "backend": self.backend.name,
            # the hash chain (docs/formats/zarr-tiles.md, "Content hashes"): each level's "sha256" covers
            # its objects through per-slab digests; these cover the zarr.json objects
            "metadata_sha256": dict(sorted(self._collect_meta_sha().items())),
        }
        m.update(self.manifest_extra)
        return m

    def _collect_meta_sha(self) -> dict[str, str]:
        out, w = {}, self
        while w is not None:
            out.update(w._meta_sha)
            w = w._next
        return out

    def _shutdown(self) -> None:
        if not self._empty:
            self._io.shutdown(wait=True)
        self.backend.close()

    def abort(self, discard: bool = True) -> None:
        """Stop without writing metadata, and remove everything written so far (the temporary
        directory of a local output; the objects already PUT to an object store). With
        ``discard=False`` what was written stays for a rerun to resume from (the ETL's receipts
        name it; docs/formats/receipts.md, "Tiled arrays")."""
        if self._closed:
            return
        self._closed = True
        if not self._empty:
            self._queue.put(_STOP)
            self._collector.join(timeout=60)
            self._io.shutdown(wait=True, cancel_futures=True)
        if self._next is not None:
            self._next.abort(discard)
        self.backend.close()
        if discard:
            self._discard()

