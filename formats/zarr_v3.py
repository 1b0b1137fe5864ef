"""Zarr v3 arrays as warp writes them: metadata, shards, chunk keys, a store.

The subset (docs/formats/zarr-tiles.md; DESIGN.md §5) that zarr-python 3.1
and tensorstore read back bit-exact:

* ``zarr.json``: ``zarr_format`` 3, ``node_type`` array, regular chunk grid,
  default key encoding with separator ``/``, ``fill_value``; codecs ``bytes``
  (little-endian) then ``zstd`` ``{level, checksum: false}``; or one
  ``sharding_indexed`` codec with those as inner codecs, index codecs
  ``bytes`` + ``crc32c`` and the index at the end;
* chunk/shard objects at ``c/i/j/k`` (slowest dimension first): one plain
  zstd frame per chunk holding the chunk's C-order bytes, edge chunks padded
  to the full chunk shape with the fill value (no transpose codec: the tiled
  bytes already are the ``bytes`` encoding);
* a shard is its inner chunks' frames back to back, then the index: one
  little-endian u64 pair ``(offset, nbytes)`` per inner chunk in C order over
  the shard's chunk grid (offsets from byte 0 of the shard; an absent chunk
  is ``(2^64−1, 2^64−1)``), then the CRC-32C of those index bytes (u32 LE);
* objects are written atomically (temporary name + rename locally, one PUT
  on object stores) and ``zarr.json`` last, so a reader never sees metadata
  pointing at missing chunks.

Multiscale pyramids are a group ``zarr.json`` whose ``attributes.ome`` holds
OME-Zarr 0.5 ``multiscales`` metadata, levels in sub-arrays ``0``, ``1``, …
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
from warpdata.errors import DataError, MissingInputError

from .tiling import SUPPORTED_DTYPES, normalize_dtype, tile_counts

ZARR_JSON = "zarr.json"
EMPTY = 2**64 - 1
INDEX_ENTRY = 16  # two u64 per inner chunk
CRC_SIZE = 4


# -- metadata ------------------------------------------------------------------

def fill_value_json(value: Any, dtype) -> int | float | str:
    """The JSON spelling of a fill value for ``dtype`` (NaN/±Infinity as strings)."""
    dt = normalize_dtype(dtype)
    if dt.kind == "f":
        v = float(value)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    iv = int(value)
    info = np.iinfo(dt)
    if iv != value or not info.min <= iv <= info.max:
        raise DataError(f"fill value {value!r} does not fit {dt.name}",
                        hint=f"use an integer in [{info.min}, {info.max}]")
    return iv


def fill_value_from_json(value: Any, dtype) -> Any:
    dt = normalize_dtype(dtype)
    if isinstance(value, str):
        return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[value]
    return dt.type(value)


def _bytes_codec() -> dict:
    return {"name": "bytes", "configuration": {"endian": "little"}}


def _zstd_codec(level: int) -> dict:
    return {"name": "zstd", "configuration": {"level": int(level), "checksum": False}}


def array_metadata(shape: Sequence[int], dtype, chunks: Sequence[int], *, shards: Sequence[int] | None = None,
                   fill_value: Any = 0, level: int = 1, dimension_names: Sequence[str] | None = None,
                   attributes: dict | None = None) -> dict:
    """The ``zarr.json`` document of an array (sharded when ``shards`` is given)."""
    dt = normalize_dtype(dtype)
    shape = [int(s) for s in shape]
    chunks = [int(c) for c in chunks]
    inner = [_bytes_codec(), _zstd_codec(level)]
    if shards is not None:
        shards = [int(s) for s in shards]
        for d, (s, c) in enumerate(zip(shards, chunks, strict=True)):
            if s % c:
                raise DataError(f"shard size {s} in dimension {d} is not a multiple of the chunk size {c}",
                                hint="make every shard size a multiple of the tile size")
        grid, codecs = shards, [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": chunks, "codecs": inner,
            "index_codecs": [_bytes_codec(), {"name": "crc32c"}], "index_location": "end"}}]
    else:
        grid, codecs = chunks, inner
    meta: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": dt.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill_value_json(fill_value, dt),
        "codecs": codecs,
        "attributes": attributes or {},
    }
    if dimension_names is not None:
        if len(dimension_names) != len(shape):
            raise DataError(f"{len(dimension_names)} dimension names for {len(shape)} dimensions",
                            hint="give one name per dimension")
        meta["dimension_names"] = list(dimension_names)
    return meta


def group_metadata(attributes: dict | None = None) -> dict:
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}


def encode_json(meta: dict) -> bytes:
    """Deterministic ``zarr.json`` bytes (sorted keys, 2-space indent, trailing newline)."""
    return (json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def ome_multiscales(levels: Sequence[tuple[str, Sequence[float]]], axes: Sequence[dict], *,
                    method: str, name: str = "") -> dict:
    """OME-Zarr 0.5 group attributes for a pyramid: ``levels`` = (path, scale) pairs."""
    return {"ome": {"version": "0.5", "multiscales": [{
        "name": name,
        "axes": list(axes),
        "datasets": [{"path": p, "coordinateTransformations": [{"type": "scale", "scale": [float(x) for x in s]}]}
                     for p, s in levels],
        "type": method,
        "metadata": {"method": f"warpdata.tiles.pyramid.{method}", "description": "2x downsampling per level"},
    }]}}


def chunk_key(index: Sequence[int]) -> str:
    """The default-encoding key of a chunk (or shard) grid index: ``c/i/j/k``."""
    return "c/" + "/".join(str(int(i)) for i in index) if len(index) else "c"


@dataclass(frozen=True)
class ArrayLayout:
    """What a reader needs from ``zarr.json``: shape, dtype, chunk/shard shapes, fill."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    fill_value: Any
    level: int

    @classmethod
    def from_metadata(cls, meta: dict, where: str = ZARR_JSON) -> ArrayLayout:
        try:
            if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
                raise KeyError("zarr_format/node_type")
            if meta["data_type"] not in SUPPORTED_DTYPES:
                raise KeyError(f"data_type {meta['data_type']!r}")
            dtype = normalize_dtype(meta["data_type"])
            grid = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
            enc = meta.get("chunk_key_encoding", {})
            if enc.get("name") != "default" or enc.get("configuration", {}).get("separator", "/") != "/":
                raise KeyError("chunk_key_encoding (only default with '/' is supported)")
            codecs = meta["codecs"]
            if codecs[0]["name"] == "sharding_indexed":
                cfg = codecs[0]["configuration"]
                chunks, shards, inner = tuple(cfg["chunk_shape"]), grid, cfg["codecs"]
                if cfg.get("index_location", "end") != "end":
                    raise KeyError("index_location (only 'end' is supported)")
            else:
                chunks, shards, inner = grid, None, codecs
            names = [c["name"] for c in inner]
            if names != ["bytes", "zstd"]:
                raise KeyError(f"codecs {names} (expected ['bytes', 'zstd'])")
            level = int(inner[1].get("configuration", {}).get("level", 0))
            return cls(tuple(meta["shape"]), dtype, chunks, shards,
                       fill_value_from_json(meta["fill_value"], dtype), level)
        except (KeyError, IndexError, TypeError) as e:
            raise DataError(f"{where}: not a Zarr v3 array in the layout warp reads ({e})",
                            hint="warp reads arrays written by warp etl / TileWriter; use zarr-python for others",
                            path=where) from None

    @property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunks) * self.dtype.itemsize

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Objects per dimension (shards when sharded, else chunks)."""
        return tile_counts(self.shape, self.shards or self.chunks)

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shards or self.chunks, self.chunks, strict=True))


# -- shards --------------------------------------------------------------------

def shard_index(sizes: Sequence[int | None]) -> tuple[np.ndarray, int]:
    """(index entries (n, 2) u64, total payload bytes) for chunk sizes in C order; None = absent."""
    entries = np.empty((len(sizes), 2), dtype="<u8")
    off = 0
    for i, n in enumerate(sizes):
        if n is None:
            entries[i] = EMPTY
        else:
            entries[i] = (off, n)
            off += n
    return entries, off


def encode_index(entries: np.ndarray) -> bytes:
    raw = np.ascontiguousarray(entries, dtype="<u8").tobytes()
    return raw + int(google_crc32c.value(raw)).to_bytes(4, "little")


def shard_parts(chunks: Sequence[bytes | memoryview | None]) -> list:
    """The buffers of one shard, in file order: chunk frames then the index."""
    entries, _ = shard_index([None if c is None else len(c) for c in chunks])
    parts = [c for c in chunks if c is not None]
    parts.append(encode_index(entries))
    return parts


def decode_index(blob: bytes | memoryview, n_chunks: int, where: str) -> np.ndarray:
    """Parse and CRC-check a shard's trailing index; returns (n, 2) u64 entries."""
    size = n_chunks * INDEX_ENTRY
    if len(blob) < size + CRC_SIZE:
        raise DataError(f"{where}: shard is {len(blob)} bytes, too short for an index of {n_chunks} chunks",
                        hint="the shard is truncated; rewrite the array", path=where)
    raw = bytes(blob[len(blob) - size - CRC_SIZE: len(blob) - CRC_SIZE])
    stored = int.from_bytes(bytes(blob[len(blob) - CRC_SIZE:]), "little")
    computed = int(google_crc32c.value(raw))
    if stored != computed:
        raise DataError(f"{where}: shard index CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})",
                        hint="the shard is corrupt; rewrite the array", path=where)
    entries = np.frombuffer(raw, dtype="<u8").reshape(n_chunks, 2)
    limit = len(blob) - size - CRC_SIZE
    for i, (off, n) in enumerate(entries.tolist()):
        if off == EMPTY and n == EMPTY:
            continue
        if off + n > limit:
            raise DataError(f"{where}: inner chunk {i} spans bytes {off}..{off + n} past the data ({limit} bytes)",
                            hint="the shard is corrupt; rewrite the array", path=where)
    return entries


def decode_chunk(frame: bytes | memoryview, layout: ArrayLayout, where: str) -> np.ndarray:
    """One zstd frame → the chunk array (shape ``layout.chunks``)."""
    import zstandard

    try:
        raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=layout.chunk_nbytes)
    except zstandard.ZstdError as e:
        raise DataError(f"{where}: not a valid zstd frame ({e})", hint="the chunk is corrupt; rewrite the array",
                        path=where) from None
    if len(raw) != layout.chunk_nbytes:
        raise DataError(f"{where}: chunk decodes to {len(raw)} bytes, expected {layout.chunk_nbytes}",
                        hint="the chunk is corrupt; rewrite the array", path=where)
    return np.frombuffer(raw, dtype=layout.dtype).reshape(layout.chunks)


# -- stores --------------------------------------------------------------------

class Store:
    """Key → bytes under a root URL, through warp's storage layer (warp/storage.py).

    ``put`` is atomic per object: locally a temporary sibling written with
    one ``writev`` (the parts of a shard go to the kernel without being
    joined), fsync'd unless ``fsync=False``, then renamed into place; on
    object stores one PUT. ``put(..., sync_dir=False)`` leaves the fsync of
    the object's directory to :meth:`sync_dirs` — the writer calls it once
    before committing ``zarr.json`` instead of once per chunk object.
    """

    def __init__(self, url: str | os.PathLike, *, fsync: bool = True, config=None) -> None:
        from warpdata.storage import filesystem, parse_location

        self.location = parse_location(url)
        self.url = self.location.url
        self.fsync = fsync
        self.local = self.location.protocol == "file"
        self._fs = None if self.local else filesystem(self.location, config)
        self._dirs: set[str] = set()  # directories known to exist (shared with sub-stores)
        self._unsynced: set[str] = set()  # directories with renames not yet fsync'd
        self._direct_ok: bool | None = None  # O_DIRECT for big objects (decided on the first one)

    def _path(self, key: str) -> str:
        return self.location.join(key).path if key else self.location.path

    def put(self, key: str, parts: bytes | memoryview | Sequence[bytes | memoryview], *, sync_dir: bool = True) -> int:
        if isinstance(parts, (bytes, bytearray, memoryview)):
            parts = [parts]
        path = self._path(key)
        if self.local:
            return self._put_local(path, parts, sync_dir)
        data = b"".join(parts)
        self._fs.pipe_file(path, data)
        return len(data)

    def _put_local(self, path: str, parts: Sequence, sync_dir: bool) -> int:
        import tempfile

        from warpdata.atomic import TMP_PREFIX, fsync_dir

        parent, name = os.path.split(path)
        if parent not in self._dirs:
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix="-" + name, dir=parent)
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
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if self.fsync:
            if sync_dir:
                fsync_dir(parent)
            else:
                self._unsynced.add(parent)
        return n

    def _direct(self, parent: str) -> bool:
        if self._direct_ok is None:
            from warpdata.directio import wants_direct

            self._direct_ok = wants_direct(parent)
        return self._direct_ok

    def sync_dirs(self) -> None:
        """fsync every directory that got an object through ``put(..., sync_dir=False)``."""
        from warpdata.atomic import fsync_dir

        while self._unsynced:
            fsync_dir(self._unsynced.pop())

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
        return s


IOV_BATCH = 1024  # Linux's IOV_MAX


# objects at least this big are written with O_DIRECT where the filesystem suits it (warp/directio.py):
# copying a shard's frames into one reused, page-aligned buffer costs ~0.1 s of CPU per GB, the page
# cache's allocation + copy + writeback 0.4-2.7 s per GB here
DIRECT_MIN_BYTES = 256 << 10


def _write_direct(path: str, parts: Sequence, total: int) -> int:
    """Write ``parts`` to the empty file at ``path`` via one page-aligned bounce buffer."""
    from warpdata.directio import BLOCK, AlignedFile, give_aligned, pack_into, take_aligned

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


# -- reading (verification and small reads; zarr-python/tensorstore are the real readers)

def read_layout(store: Store) -> ArrayLayout:
    try:
        meta = json.loads(store.get(ZARR_JSON))
    except json.JSONDecodeError as e:
        raise DataError(f"{store.url}/{ZARR_JSON}: not valid JSON ({e})", hint="rewrite the array") from None
    return ArrayLayout.from_metadata(meta, f"{store.url}/{ZARR_JSON}")


def iter_object_chunks(store: Store, layout: ArrayLayout, obj_index: Sequence[int]) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """Decoded chunks of one stored object (a shard or a chunk): (chunk grid index, array)."""
    key = chunk_key(obj_index)
    where = f"{store.url}/{key}"
    try:
        blob = store.get(key)
    except MissingInputError:
        return
    if layout.shards is None:
        yield tuple(obj_index), decode_chunk(blob, layout, where)
        return
    per = layout.chunks_per_shard
    n = math.prod(per)
    entries = decode_index(blob, n, where)
    mv = memoryview(blob)
    for i, (off, nb) in enumerate(entries.tolist()):
        if off == EMPTY:
            continue
        local = np.unravel_index(i, per)
        gidx = tuple(int(o) * p + int(li) for o, p, li in zip(obj_index, per, local, strict=True))
        yield gidx, decode_chunk(mv[off: off + nb], layout, f"{where} (inner chunk {i})")


def iter_row_blocks(store: Store, layout: ArrayLayout) -> Iterator[np.ndarray]:
    """The array as consecutive row blocks along dimension 0 (one object row each).

    Memory stays at one row of objects; concatenating the blocks gives the
    whole array in C order (how ``verify`` recomputes the input checksum).
    """
    if math.prod(layout.shape) == 0:
        return
    grid = layout.grid_shape
    step = (layout.shards or layout.chunks)[0]
    for i0 in range(grid[0]):
        r0, r1 = i0 * step, min((i0 + 1) * step, layout.shape[0])
        block = np.full((r1 - r0, *layout.shape[1:]), layout.fill_value, dtype=layout.dtype)
        for rest in np.ndindex(*grid[1:]):
            for gidx, chunk in iter_object_chunks(store, layout, (i0, *rest)):
                start = [g * c for g, c in zip(gidx, layout.chunks, strict=True)]
                if any(st >= n for st, n in zip(start, layout.shape, strict=True)):
                    continue
                stop = [min(st + c, n) for st, c, n in zip(start, layout.chunks, layout.shape, strict=True)]
                dst = (slice(start[0] - r0, stop[0] - r0),) + tuple(
                    slice(a, b) for a, b in zip(start[1:], stop[1:], strict=True))
                block[dst] = chunk[tuple(slice(0, b - a) for a, b in zip(start, stop, strict=True))]
        yield block


def read_array(url: str | os.PathLike) -> np.ndarray:
    """Decode a whole array written in warp's layout (for verification and tests)."""
    store = Store(url)
    layout = read_layout(store)
    if math.prod(layout.shape) == 0:
        return np.full(layout.shape, layout.fill_value, dtype=layout.dtype)
    return np.concatenate(list(iter_row_blocks(store, layout)), axis=0)


def verify_array(store: Store) -> tuple[dict[str, int], list[str]]:
    """Check every object of an array: index CRCs, frame validity, decoded sizes.

    Returns (counts, problems); a missing object is a problem unless the
    array is empty there (warp writes every object of a completed array).
    """
    layout = read_layout(store)
    counts = {"objects": 0, "chunks": 0, "stored_bytes": 0}
    problems: list[str] = []
    if math.prod(layout.shape) == 0:
        return counts, problems
    for obj in np.ndindex(*layout.grid_shape):
        key = chunk_key(obj)
        size = store.size(key)
        if size is None:
            problems.append(f"{store.url}/{key}: missing")
            continue
        counts["objects"] += 1
        counts["stored_bytes"] += size
        try:
            for _ in iter_object_chunks(store, layout, obj):
                counts["chunks"] += 1
        except DataError as e:
            problems.append(e.message)
    return counts, problems
