"""Keys → bytes under a root URL for Zarr arrays: the object store TileWriter writes through.

Moved out of ``formats/`` so the format module holds only codecs and layout
(docs/formats/zarr-tiles.md). Locally each object is written atomically (a
temporary sibling, one ``writev`` or an O_DIRECT bounce buffer for big objects,
fsync, rename); on object stores one PUT per object.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from warpdata.core import atomic
from warpdata.core.directio import (
    BLOCK,
    AlignedFile,
    give_aligned,
    pack_into,
    take_aligned,
    wants_direct,
)
from warpdata.core.errors import MissingInputError
from warpdata.formats.zarr_v3 import _check_against_manifest, iter_row_blocks, read_layout
from warpdata.storage.locations import filesystem, parse_location

if TYPE_CHECKING:
    import numpy as np

# lazy third-party imports: numpy is imported by read_array alone (warp/storage keeps heavy
# packages out of its import blocks: ruff's banned-module-level-imports in pyproject.toml)


class Store:
    """Key → bytes under a root URL, through warp's storage layer (warp/storage/locations.py).

    ``put`` is atomic per object: locally a temporary sibling written with
    one ``writev`` (the parts of a shard go to the kernel without being
    joined), fsync'd unless ``fsync=False``, then renamed into place; on
    object stores one PUT. ``put(..., sync_dir=False)`` leaves the fsync of
    the object's directory to :meth:`sync_dirs` — the writer calls it once
    before committing ``zarr.json`` instead of once per chunk object.
    """

    def __init__(self, url: str | os.PathLike, *, fsync: bool = True, config=None) -> None:
        self.location = parse_location(url)
        self.url = self.location.url
        self.fsync = fsync
        self.local = self.location.protocol == "file"
        self._fs = None if self.local else filesystem(self.location, config)
        self._dirs: set[str] = set()  # directories known to exist (shared with sub-stores)
        self._unsynced: set[str] = set()  # directories with renames not yet fsync'd
        self._direct_ok: bool | None = None  # O_DIRECT for big objects (decided on the first one)
        self._written: list[str] | None = None  # object-store paths put, when tracked (shared with sub-stores)
        self._mode: int | None = None  # permissions of local objects: 0o666 less the umask

    def track_writes(self) -> None:
        """Remember every object put (object stores), so :meth:`remove_written` can undo a failed write."""
        if self._written is None:
            self._written = []

    def remove_written(self) -> None:
        """Delete every object put since :meth:`track_writes` (best effort: errors are ignored)."""
        if not self._written:
            return
        paths, self._written[:] = list(self._written), []
        with contextlib.suppress(Exception):
            self._fs.rm(paths)

    def _path(self, key: str) -> str:
        return self.location.join(key).path if key else self.location.path

    def put(self, key: str, parts: bytes | memoryview | Sequence[bytes | memoryview], *, sync_dir: bool = True) -> int:
        if isinstance(parts, (bytes, bytearray, memoryview)):
            parts = [parts]
        path = self._path(key)
        if self.local:
            return self._put_local(path, parts, sync_dir)
        data = b"".join(parts)
        if self._written is not None:
            self._written.append(path)  # before the PUT: a failed PUT may still have left the object
        self._fs.pipe_file(path, data)
        return len(data)

    def _put_local(self, path: str, parts: Sequence, sync_dir: bool) -> int:
        import tempfile

        parent, name = os.path.split(path)
        if parent not in self._dirs:
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)
        fd, tmp = tempfile.mkstemp(prefix=atomic.TMP_PREFIX, suffix="-" + name, dir=parent)
        try:
            try:
                total = sum(len(memoryview(p).cast("B")) for p in parts)
                if total >= DIRECT_MIN_BYTES and self._direct(parent):
                    n = _write_direct(tmp, parts, total)
                else:
                    n = writev_all(fd, parts)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if self._mode is None:
                self._mode = _file_mode()
            os.chmod(tmp, self._mode)  # mkstemp makes 0600 files: give them the umask's permissions
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if self.fsync:
            if sync_dir:
                atomic.fsync_dir(parent)
            else:
                self._unsynced.add(parent)
        return n

    def _direct(self, parent: str) -> bool:
        if self._direct_ok is None:
            self._direct_ok = wants_direct(parent)
        return self._direct_ok

    def sync_dirs(self) -> None:
        """fsync every directory that got an object through ``put(..., sync_dir=False)``."""
        while self._unsynced:
            atomic.fsync_dir(self._unsynced.pop())

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            if self.local:
                with open(path, "rb") as f:
                    return f.read()
            return self._fs.cat_file(path)
        except FileNotFoundError:
            raise MissingInputError(f"{self.location.join(key).url}: missing", hint="check the array path",
                                    path=path) from None

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return os.path.exists(path) if self.local else self._fs.exists(path)

    def size(self, key: str) -> int | None:
        path = self._path(key)
        try:
            return os.path.getsize(path) if self.local else int(self._fs.size(path))
        except FileNotFoundError:
            return None

    def sub(self, prefix: str) -> Store:
        s = Store.__new__(Store)
        s.location = self.location.join(prefix) if prefix else self.location
        s.url, s.fsync, s.local, s._fs = s.location.url, self.fsync, self.local, self._fs
        s._dirs, s._unsynced, s._direct_ok = self._dirs, self._unsynced, self._direct_ok
        s._written, s._mode = self._written, self._mode
        return s


def _file_mode() -> int:
    return atomic.file_mode()


IOV_BATCH = 1024  # Linux's IOV_MAX


# objects at least this big are written with O_DIRECT where the filesystem suits it (warp/core/directio.py):
# copying a shard's frames into one reused, page-aligned buffer costs ~0.1 s of CPU per GB, the page
# cache's allocation + copy + writeback 0.4-2.7 s per GB here
DIRECT_MIN_BYTES = 256 << 10


def _write_direct(path: str, parts: Sequence, total: int) -> int:
    """Write ``parts`` to the empty file at ``path`` via one page-aligned bounce buffer."""
    padded = -(-total // BLOCK) * BLOCK
    buf = take_aligned(padded)
    try:
        pos = pack_into(buf, parts)
        buf[pos:padded] = 0
        with AlignedFile(path, direct=True) as f:
            f.write(0, buf[:padded])
            if padded != total:
                f.truncate(total)
    finally:
        give_aligned(buf)
    return total


def writev_all(fd: int, parts: Sequence) -> int:
    """Write every byte of ``parts`` to ``fd`` with ``os.writev`` (partial writes resumed)."""
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if len(v)]
    total = sum(len(v) for v in views)
    i = 0
    while i < len(views):
        batch = views[i:i + IOV_BATCH]
        n = os.writev(fd, batch)
        if n <= 0:
            raise OSError(f"writev wrote {n} bytes")
        # skip the buffers written whole, keep the rest of a partly written one
        for v in batch:
            if n >= len(v):
                n -= len(v)
                i += 1
            else:
                views[i] = v[n:]
                break
    return total


def read_array(url: str | os.PathLike) -> np.ndarray:
    """Decode a whole array written in warp's layout (for verification and tests).

    Every chunk's CRC-32C is checked (when the array has them); when warp's
    ``manifest.json`` describes the array (beside it, or one level up for a
    pyramid level) its recorded shape, chunks and shards must match
    ``zarr.json`` and level 0 must decode to the recorded input CRC-32C —
    so damaged metadata is a DataError, not an array of the wrong shape.
    """
    import numpy as np

    store = Store(url)
    layout = read_layout(store)
    if math.prod(layout.shape) == 0:
        out = np.full(layout.shape, layout.fill_value, dtype=layout.dtype)
    else:
        out = np.concatenate(list(iter_row_blocks(store, layout)), axis=0)
    _check_against_manifest(store, layout, out)
    return out
