"""Zarr v3 arrays as warp writes them: metadata, shards, chunk keys, a store.

The subset (docs/formats/zarr-tiles.md; docs/design.md §5) that zarr-python 3.1
and tensorstore read back bit-exact:

* ``zarr.json``: ``zarr_format`` 3, ``node_type`` array, regular chunk grid,
  default key encoding with separator ``/``, ``fill_value``; codecs ``bytes``
  (little-endian), ``zstd`` ``{level, checksum: false}``, then ``crc32c``; or
  one ``sharding_indexed`` codec with those as inner codecs, index codecs
  ``bytes`` + ``crc32c`` and the index at the end;
* chunk/shard objects at ``c/i/j/k`` (slowest dimension first): per chunk
  one plain zstd frame holding the chunk's C-order bytes, edge chunks padded
  to the full chunk shape with the fill value (no transpose codec: the tiled
  bytes already are the ``bytes`` encoding), then the CRC-32C of the frame
  (u32 LE, the ``crc32c`` codec) — so zarr-python and tensorstore reject a
  damaged chunk too. Arrays written before the checksum (codecs ending in
  ``zstd``) are still read;
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

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import google_crc32c
import numpy as np
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.names import MANIFEST_NAME, ZARR_ARRAY
from warpdata.formats import bounded, crc
from warpdata.formats.tiling import SUPPORTED_DTYPES, normalize_dtype, tile_counts

# lazy third-party imports: zstandard is imported by formats/bounded.py when a chunk is decoded, so
# importing this module does not load it

ZARR_JSON = "zarr.json"
EMPTY = 2**64 - 1
INDEX_ENTRY = 16  # two u64 per inner chunk
CRC_SIZE = 4

# Limits on what a zarr.json may declare before warp reads it (docs/formats/zarr-tiles.md, "Limits"):
# a hostile or damaged file must not make a reader or `warp inspect --verify` allocate or loop
# without bound. Each is far above anything warp writes in practice.
MAX_DIMS = 64
MAX_ELEMENTS = 2**50  # elements in the whole array (product of the shape)
MAX_OBJECTS = 2**32  # stored objects (shards or chunks) the grid declares
MAX_CHUNK_BYTES = 2**31  # decoded bytes of one chunk (what decoding one allocates)
MAX_CHUNKS_PER_SHARD = 2**24  # inner chunks of one shard (its index is 16 bytes each)
MAX_JSON_BYTES = 1 << 20  # size of a zarr.json
MAX_ROW_BLOCK_BYTES = 2**30  # decoded bytes of one row of objects (what iter_row_blocks allocates at once)
MAX_ABSENT_OBJECTS = 1024  # absent objects a whole-array read or verify tolerates before refusing the grid
VERIFY_WHOLE_BYTES = 64 << 20  # chunks larger than this are verified a piece at a time (check_chunk)


class ZarrChecksumError(DataError):
    """Stored and computed CRC-32C differ (a shard index, a chunk, or the decoded array against
    the manifest's input checksum): the bytes are damaged (docs/formats/zarr-tiles.md)."""

    code = "zarr-checksum"


def chunk_crc(frame: Any) -> bytes:
    """The ``crc32c`` codec's suffix for ``frame``: its CRC-32C, u32 little-endian."""
    return crc.extend(0, frame).to_bytes(CRC_SIZE, "little")


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
    """The fill value of ``zarr.json``; ValueError/KeyError/TypeError when it does not fit ``dtype``."""
    dt = normalize_dtype(dtype)
    if isinstance(value, bool) or value is None:
        raise TypeError(f"fill value {value!r}")
    if dt.kind == "f":
        if isinstance(value, str):
            return dt.type({"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[value])
        if not isinstance(value, (int, float)):
            raise TypeError(f"fill value {value!r}")
        return dt.type(value)
    if not isinstance(value, int):  # integer dtypes: an integer in range
        raise TypeError(f"fill value {value!r}")
    info = np.iinfo(dt)
    if not info.min <= value <= info.max:
        raise ValueError(f"fill value {value} outside {dt.name}")
    return dt.type(value)


def _bytes_codec() -> dict:
    return {"name": "bytes", "configuration": {"endian": "little"}}


def _zstd_codec(level: int) -> dict:
    return {"name": "zstd", "configuration": {"level": int(level), "checksum": False}}


def array_metadata(shape: Sequence[int], dtype, chunks: Sequence[int], *, shards: Sequence[int] | None = None,
                   fill_value: Any = 0, level: int = 1, dimension_names: Sequence[str] | None = None,
                   attributes: dict | None = None, checksum: bool = True) -> dict:
    """The ``zarr.json`` document of an array (sharded when ``shards`` is given).

    ``checksum``: every chunk ends with its CRC-32C (the ``crc32c`` codec after ``zstd``).
    """
    dt = normalize_dtype(dtype)
    shape = [int(s) for s in shape]
    chunks = [int(c) for c in chunks]
    inner = [_bytes_codec(), _zstd_codec(level)] + ([{"name": "crc32c"}] if checksum else [])
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


class _Bad(Exception):
    """A reason ``zarr.json`` is not in the layout warp reads (becomes a DataError)."""


def _int_list(v: Any, what: str, *, minimum: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _Bad(f"{what} must be a list of integers, got {v!r:.80}")
    if len(v) > MAX_DIMS:
        raise _Bad(f"{what} has {len(v)} dimensions, over warp's limit MAX_DIMS = {MAX_DIMS}")
    if any(x < minimum for x in v):
        raise _Bad(f"{what} {v!r:.80} has a value below {minimum}")
    return tuple(v)


def _named(c: Any, what: str) -> tuple[str, dict]:
    if not isinstance(c, dict) or not isinstance(c.get("name"), str):
        raise _Bad(f"{what} must be an object with a name, got {c!r:.80}")
    cfg = c.get("configuration", {})
    if not isinstance(cfg, dict):
        raise _Bad(f"{what} {c['name']!r}: configuration must be an object")
    return c["name"], cfg


def _pow2(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n > 1 and n & (n - 1) == 0 else f"{n:,}"


@dataclass(frozen=True)
class ArrayLayout:
    """What a reader needs from ``zarr.json``: shape, dtype, chunk/shard shapes, fill, checksum."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    fill_value: Any
    level: int
    checksum: bool = False  # every chunk ends with the crc32c codec's CRC-32C

    @classmethod
    def from_metadata(cls, meta: Any, where: str = ZARR_JSON) -> ArrayLayout:
        """Parse and check ``zarr.json``: DataError naming the field (or the limit) when it is not
        an array in the layout warp writes, or declares sizes past warp's limits (MAX_*)."""
        try:
            return cls._parse(meta)
        except _Bad as e:
            raise DataError(f"{where}: not a Zarr v3 array in the layout warp reads ({e})",
                            hint="warp reads arrays written by warp etl / TileWriter; use zarr-python for others",
                            path=where) from None

    @classmethod
    def _parse(cls, meta: Any) -> ArrayLayout:
        if not isinstance(meta, dict):
            raise _Bad("the document is not a JSON object")
        if meta.get("zarr_format") != 3 or isinstance(meta.get("zarr_format"), bool) or meta.get("node_type") != "array":
            raise _Bad("zarr_format/node_type: expected 3 and 'array'")
        dt_name = meta.get("data_type")
        if not isinstance(dt_name, str) or dt_name not in SUPPORTED_DTYPES:
            raise _Bad(f"data_type {dt_name!r:.40}")
        dtype = normalize_dtype(dt_name)
        shape = _int_list(meta.get("shape"), "shape", minimum=0)
        grid_meta = meta.get("chunk_grid")
        name, cfg = _named(grid_meta, "chunk_grid")
        if name != "regular":
            raise _Bad(f"chunk_grid {name!r:.40} (only 'regular' is supported)")
        grid = _int_list(cfg.get("chunk_shape"), "chunk_grid chunk_shape", minimum=1)
        if len(grid) != len(shape):
            raise _Bad(f"chunk_shape has {len(grid)} dimensions, shape has {len(shape)}")
        name, enc = _named(meta.get("chunk_key_encoding", {"name": "default"}), "chunk_key_encoding")
        if name != "default" or enc.get("separator", "/") != "/":
            raise _Bad("chunk_key_encoding (only default with '/' is supported)")
        codecs = meta.get("codecs")
        if not isinstance(codecs, list) or not codecs:
            raise _Bad("codecs must be a non-empty list")
        first, cfg = _named(codecs[0], "codec")
        if first == "sharding_indexed":
            if len(codecs) != 1:
                raise _Bad("codecs after sharding_indexed are not supported")
            chunks = _int_list(cfg.get("chunk_shape"), "sharding chunk_shape", minimum=1)
            if len(chunks) != len(shape):
                raise _Bad(f"sharding chunk_shape has {len(chunks)} dimensions, shape has {len(shape)}")
            if any(g % c for g, c in zip(grid, chunks, strict=True)):
                raise _Bad(f"shard shape {list(grid)} is not a multiple of the chunk shape {list(chunks)}")
            if cfg.get("index_location", "end") != "end":
                raise _Bad("index_location (only 'end' is supported)")
            index = cfg.get("index_codecs")
            if not isinstance(index, list) or [_named(c, "index codec")[0] for c in index] != ["bytes", "crc32c"] \
                    or index[0].get("configuration", {}).get("endian", "little") != "little":
                raise _Bad("index_codecs (expected [bytes little-endian, crc32c])")
            shards, inner = grid, cfg.get("codecs")
            if not isinstance(inner, list):
                raise _Bad("sharding codecs must be a list")
        else:
            chunks, shards, inner = grid, None, codecs
        parsed = [_named(c, "codec") for c in inner]
        names = [n for n, _ in parsed]
        if names not in (["bytes", "zstd"], ["bytes", "zstd", "crc32c"]):
            raise _Bad(f"codecs {names!r:.80} (expected ['bytes', 'zstd', 'crc32c'])")
        if parsed[0][1].get("endian", "little") != "little":
            raise _Bad("bytes codec endian (only 'little' is supported)")
        zcfg = parsed[1][1]
        level = zcfg.get("level", 0)
        if not isinstance(level, int) or isinstance(level, bool) or not isinstance(zcfg.get("checksum", False), bool):
            raise _Bad(f"zstd configuration {zcfg!r:.80}")
        try:
            fill = fill_value_from_json(meta.get("fill_value"), dtype)
        except (KeyError, TypeError, ValueError, OverflowError):
            raise _Bad(f"fill_value {meta.get('fill_value')!r:.40} for {dtype.name}") from None
        layout = cls(shape, dtype, chunks, shards, fill, level, checksum=len(names) == 3)
        layout._check_limits()
        return layout

    def _check_limits(self) -> None:
        elements = math.prod(self.shape)
        if elements > MAX_ELEMENTS:
            raise _Bad(f"shape {list(self.shape)} declares {elements:,} elements, over warp's limit "
                       f"MAX_ELEMENTS = {_pow2(MAX_ELEMENTS)}")
        if self.chunk_nbytes > MAX_CHUNK_BYTES:
            raise _Bad(f"chunk shape {list(self.chunks)} declares {self.chunk_nbytes:,} bytes per chunk, over "
                       f"warp's limit MAX_CHUNK_BYTES = {_pow2(MAX_CHUNK_BYTES)}")
        if math.prod(self.chunks_per_shard) > MAX_CHUNKS_PER_SHARD:
            raise _Bad(f"shard shape {list(self.shards or ())} holds {math.prod(self.chunks_per_shard):,} chunks, "
                       f"over warp's limit MAX_CHUNKS_PER_SHARD = {_pow2(MAX_CHUNKS_PER_SHARD)}")
        objects = math.prod(self.grid_shape) if elements else 0
        if objects > MAX_OBJECTS:
            raise _Bad(f"the chunk grid of shape {list(self.shape)} has {objects:,} objects, over warp's limit "
                       f"MAX_OBJECTS = {_pow2(MAX_OBJECTS)}")

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
        raise ZarrChecksumError(f"{where}: shard index CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})",
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


def decode_chunk(payload: bytes | memoryview, layout: ArrayLayout, where: str) -> np.ndarray:
    """One chunk payload (zstd frame, then its CRC-32C when ``layout.checksum``) → the chunk array.

    Bounded (formats/bounded.py): a frame declaring, needing or yielding another size than the
    chunk shape × itemsize is a :class:`~warpdata.formats.bounded.FrameSizeError` raised before the
    output is allocated (docs/formats/zarr-tiles.md, "Limits").
    """
    frame = split_chunk(payload, layout, where)
    raw = bounded.zstd(frame, layout.chunk_nbytes, where=where, path=where,
                       source=f"chunk shape {list(layout.chunks)} of {layout.dtype.name} says",
                       hint="the chunk is corrupt; rewrite the array")
    return np.frombuffer(raw, dtype=layout.dtype).reshape(layout.chunks)


def split_chunk(payload: bytes | memoryview, layout: ArrayLayout, where: str) -> memoryview:
    """The zstd frame of a chunk payload, its CRC-32C checked first when the layout has one."""
    mv = memoryview(payload).cast("B")
    if not layout.checksum:
        return mv
    if len(mv) < CRC_SIZE:
        raise DataError(f"{where}: chunk is {len(mv)} bytes, too short for its CRC-32C",
                        hint="the chunk is truncated; rewrite the array", path=where)
    frame = mv[:len(mv) - CRC_SIZE]
    stored = bytes(mv[len(mv) - CRC_SIZE:])
    computed = chunk_crc(frame)
    if stored != computed:
        raise ZarrChecksumError(f"{where}: chunk CRC-32C mismatch (stored {int.from_bytes(stored, 'little'):#010x}, "
                        f"computed {int.from_bytes(computed, 'little'):#010x})",
                        hint="the chunk is corrupt; rewrite the array", path=where)
    return frame


class KeyReader(Protocol):
    """What the readers below need of a store: keyed bytes (``warpdata.storage.zarr_store.Store`` is one)."""

    url: str
    local: bool

    def get(self, key: str) -> bytes: ...
    def size(self, key: str) -> int | None: ...
    def exists(self, key: str) -> bool: ...


# -- reading (verification and small reads; zarr-python/tensorstore are the real readers)

def parse_json_document(data: bytes, where: str) -> Any:
    """A ``zarr.json`` document: DataError (never an untyped error) when it is too big, not UTF-8 or not JSON."""
    if len(data) > MAX_JSON_BYTES:
        raise DataError(f"{where}: {len(data):,} bytes, over warp's limit MAX_JSON_BYTES = {_pow2(MAX_JSON_BYTES)}",
                        hint="this is not metadata warp wrote; rewrite the array", path=where)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 text (byte {e.start}: {e.reason})",
                        hint="zarr.json must be UTF-8 JSON; the file is damaged, rewrite the array",
                        path=where) from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DataError(f"{where}: not valid JSON ({str(e)[:120]})", hint="the file is damaged; rewrite the array",
                        path=where) from None


def read_metadata(store: KeyReader, key: str = ZARR_JSON) -> Any:
    return parse_json_document(store.get(key), f"{store.url}/{key}")


def read_layout(store: KeyReader) -> ArrayLayout:
    return ArrayLayout.from_metadata(read_metadata(store), f"{store.url}/{ZARR_JSON}")


def grid_indices(shape: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every index of a grid of ``shape`` in C order, lazily (``np.ndindex`` turns each range into a
    tuple first: 2^29 objects along one dimension were a 4 GiB MemoryError before the first one)."""
    shape = tuple(int(n) for n in shape)
    if any(n <= 0 for n in shape):
        return
    idx = [0] * len(shape)
    while True:
        yield tuple(idx)
        d = len(shape) - 1
        while d >= 0:
            idx[d] += 1
            if idx[d] < shape[d]:
                break
            idx[d] = 0
            d -= 1
        if d < 0:
            return


class _Absent:
    """Counts the objects a whole-array pass finds absent and refuses the grid past MAX_ABSENT_OBJECTS:
    warp writes every object of an array, so a grid mostly absent is a damaged shape, not a sparse
    array (docs/formats/zarr-tiles.md, "Limits")."""

    def __init__(self, store: KeyReader, layout: ArrayLayout) -> None:
        self.store, self.layout, self.n, self.visited = store, layout, 0, 0

    def visit(self, present: bool) -> None:
        self.visited += 1
        if present:
            return
        self.n += 1
        if self.n > MAX_ABSENT_OBJECTS:
            lay = self.layout
            where = f"{self.store.url}/{ZARR_JSON}"
            total = math.prod(lay.grid_shape)
            raise DataError(f"{where}: shape {list(lay.shape)} with {'shards' if lay.shards else 'chunks'} "
                            f"{list(lay.shards or lay.chunks)} declares {total:,} objects, and {self.n:,} of the "
                            f"first {self.visited:,} are absent: over warp's limit MAX_ABSENT_OBJECTS = "
                            f"{MAX_ABSENT_OBJECTS:,}", hint="warp writes every object of an array: the shape in "
                            "zarr.json is damaged or the array is incomplete; rewrite it", path=where,
                            objects=total, absent=self.n, visited=self.visited)


def check_objects_present(store: KeyReader, layout: ArrayLayout, present: int) -> None:
    """Refuse a grid declaring more than MAX_ABSENT_OBJECTS objects beyond the ``present`` ones
    (a listing of the array's objects), before any of them is read."""
    total = math.prod(layout.grid_shape) if math.prod(layout.shape) else 0
    if total > present + MAX_ABSENT_OBJECTS:
        where = f"{store.url}/{ZARR_JSON}"
        raise DataError(f"{where}: shape {list(layout.shape)} with {'shards' if layout.shards else 'chunks'} "
                        f"{list(layout.shards or layout.chunks)} declares {total:,} objects, the array holds "
                        f"{present:,}: over warp's limit MAX_ABSENT_OBJECTS = {MAX_ABSENT_OBJECTS:,} absent",
                        hint="warp writes every object of an array: the shape in zarr.json is damaged or the "
                        "array is incomplete; rewrite it", path=where, objects=total, present=present)


def _object_blob(store: KeyReader, obj_index: Sequence[int]) -> bytes | None:
    try:
        return store.get(chunk_key(obj_index))
    except MissingInputError:
        return None


def _payloads_of(blob: bytes, store: KeyReader, layout: ArrayLayout,
                 obj_index: Sequence[int]) -> Iterator[tuple[tuple[int, ...], Any, str]]:
    """(chunk grid index, stored payload, where) of each chunk of one object, the shard index checked."""
    where = f"{store.url}/{chunk_key(obj_index)}"
    if layout.shards is None:
        yield tuple(obj_index), blob, where
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
        yield gidx, mv[off: off + nb], f"{where} (inner chunk {i})"


def _chunks_of(blob: bytes, store: KeyReader, layout: ArrayLayout,
               obj_index: Sequence[int]) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    for gidx, payload, where in _payloads_of(blob, store, layout, obj_index):
        yield gidx, decode_chunk(payload, layout, where)


def check_chunk(payload: bytes | memoryview, layout: ArrayLayout, where: str) -> None:
    """What :func:`decode_chunk` checks (CRC-32C, frame, decoded size) without keeping the chunk: chunks
    over VERIFY_WHOLE_BYTES are decoded a piece at a time, so verifying stays bounded whatever
    chunk shape ``zarr.json`` declares."""
    if layout.chunk_nbytes <= VERIFY_WHOLE_BYTES:
        decode_chunk(payload, layout, where)
        return
    frame = split_chunk(payload, layout, where)
    for _ in bounded.zstd_pieces(frame, layout.chunk_nbytes, where=where, path=where,
                                 source=f"chunk shape {list(layout.chunks)} of {layout.dtype.name} says",
                                 hint="the chunk is corrupt; rewrite the array"):
        pass


def iter_object_chunks(store: KeyReader, layout: ArrayLayout, obj_index: Sequence[int]) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """Decoded chunks of one stored object (a shard or a chunk): (chunk grid index, array); none when absent."""
    blob = _object_blob(store, obj_index)
    if blob is not None:
        yield from _chunks_of(blob, store, layout, obj_index)


def iter_row_blocks(store: KeyReader, layout: ArrayLayout,
                    max_bytes: int = MAX_ROW_BLOCK_BYTES) -> Iterator[np.ndarray]:
    """The array as consecutive row blocks along dimension 0 (one object row each).

    Memory stays at one row of objects; concatenating the blocks gives the
    whole array in C order (how ``verify`` recomputes the input checksum). A row
    of objects that decodes to more than ``max_bytes`` is a :class:`DataError`
    raised before anything is allocated (an absurd shape is not a MemoryError).
    """
    if math.prod(layout.shape) == 0:
        return
    grid = layout.grid_shape
    step = (layout.shards or layout.chunks)[0]
    row_bytes = min(step, layout.shape[0]) * math.prod(layout.shape[1:]) * layout.dtype.itemsize
    if row_bytes > max_bytes:
        where = f"{store.url}/{ZARR_JSON}"
        raise DataError(f"{where}: one row of objects of shape {list(layout.shape)} (chunks {list(layout.chunks)}) "
                        f"decodes to {row_bytes:,} bytes, over warp's limit MAX_ROW_BLOCK_BYTES = "
                        f"{_pow2(max_bytes)}", hint="read it by slices with zarr-python or tensorstore, or "
                        "rewrite it with smaller chunks along the first dimension", path=where)
    absent = _Absent(store, layout)
    for i0 in range(grid[0]):
        r0, r1 = i0 * step, min((i0 + 1) * step, layout.shape[0])
        block = np.full((r1 - r0, *layout.shape[1:]), layout.fill_value, dtype=layout.dtype)
        for rest in grid_indices(grid[1:]):
            blob = _object_blob(store, (i0, *rest))
            absent.visit(blob is not None)
            if blob is None:
                continue
            for gidx, chunk in _chunks_of(blob, store, layout, (i0, *rest)):
                start = [g * c for g, c in zip(gidx, layout.chunks, strict=True)]
                if any(st >= n for st, n in zip(start, layout.shape, strict=True)):
                    continue
                stop = [min(st + c, n) for st, c, n in zip(start, layout.chunks, layout.shape, strict=True)]
                dst = (slice(start[0] - r0, stop[0] - r0),) + tuple(
                    slice(a, b) for a, b in zip(start[1:], stop[1:], strict=True))
                block[dst] = chunk[tuple(slice(0, b - a) for a, b in zip(start, stop, strict=True))]
        yield block


def _manifest_record(store: KeyReader) -> tuple[dict, dict] | None:
    """(manifest, its level entry) describing the array at ``store``, if warp's manifest is found."""
    if not store.local:
        return None
    path = store.location.path.rstrip("/")
    for root, level in ((path, ""), (os.path.dirname(path), os.path.basename(path))):
        try:
            with open(os.path.join(root, MANIFEST_NAME), "rb") as f:
                m = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict) or m.get("kind") != ZARR_ARRAY or not isinstance(m.get("levels"), list):
            continue
        for lv in m["levels"]:
            if isinstance(lv, dict) and lv.get("path", "") == level:
                return m, lv
    return None


def _check_against_manifest(store: KeyReader, layout: ArrayLayout, data: np.ndarray) -> None:
    rec = _manifest_record(store)
    if rec is None:
        return
    m, lv = rec
    where = f"{store.url}/{ZARR_JSON}"
    want = {"shape": list(layout.shape), "chunks": list(layout.chunks),
            "shards": list(layout.shards) if layout.shards else None}
    for k, v in want.items():
        if k in lv and lv[k] != v:
            raise DataError(f"{where}: {k} {v} differs from the {lv[k]} recorded in manifest.json",
                            hint="the metadata is damaged; rewrite the array", path=where)
    if m.get("dtype") not in (None, layout.dtype.name):
        raise DataError(f"{where}: data_type {layout.dtype.name} differs from the {m.get('dtype')} in manifest.json",
                        hint="the metadata is damaged; rewrite the array", path=where)
    if lv.get("path", "") == m.get("array", "") and isinstance(m.get("input_crc32c"), str):
        got = f"{crc.extend(0, data):08x}"
        if got != m["input_crc32c"]:
            raise ZarrChecksumError(f"{store.url}: decodes to CRC-32C {got}, not the input's {m['input_crc32c']} recorded "
                            "in manifest.json", hint="the array or its metadata is damaged; rewrite it", path=where)


def verify_array(store: KeyReader) -> tuple[dict[str, int], list[str]]:
    """Check every object of an array: index CRCs, chunk CRCs, frame validity, decoded sizes.

    Returns (counts, problems); a missing object is a problem unless the
    array is empty there (warp writes every object of a completed array).
    """
    layout = read_layout(store)
    counts = {"objects": 0, "chunks": 0, "stored_bytes": 0, "chunk_crcs": 0, "index_crcs": 0}
    problems: list[str] = []
    if math.prod(layout.shape) == 0:
        return counts, problems
    absent = _Absent(store, layout)
    for obj in grid_indices(layout.grid_shape):
        key = chunk_key(obj)
        size = store.size(key)
        absent.visit(size is not None)
        if size is None:
            problems.append(f"{store.url}/{key}: missing")
            continue
        counts["objects"] += 1
        counts["stored_bytes"] += size
        try:
            blob = _object_blob(store, obj)
            if blob is None:
                raise MissingInputError(f"{store.url}/{key}: missing", hint="check the array path")
            for _gidx, payload, where in _payloads_of(blob, store, layout, obj):
                check_chunk(payload, layout, where)
                counts["chunks"] += 1
                counts["chunk_crcs"] += layout.checksum
            counts["index_crcs"] += layout.shards is not None
        except (DataError, MissingInputError) as e:
            problems.append(e.message)
    return counts, problems
