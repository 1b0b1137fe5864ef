"""WFS1 feature shards: fixed-size records of named fixed-shape fields.

The spec is ``docs/formats/feature-shard.md``; this module is its reference
codec. A shard is ``[header 64][field table F×96][meta JSON][pad to 64]
[records N×record_size][CRC-32C per record N×4][trailer 32]``, little-endian.

* Safe: nothing is unpickled or executed; every offset and size is checked
  against the file before it is used, and each broken invariant raises one
  :class:`FeatureShardError` (a :class:`~warpdata.core.errors.DataError`) naming the
  file, the byte offset and what to do.
* Append-only: :class:`FeatureShardWriter` never seeks back. The record count
  lives in the trailer, so a shard can be streamed (to a pipe or object store)
  and a writer killed mid-way leaves a file that readers reject as truncated.
  The writer writes a temporary sibling and renames it over the target on
  :meth:`~FeatureShardWriter.close`.
* Zero-copy: :class:`FeatureShardReader` memory-maps the file and exposes the
  records as one numpy structured array over the mapping; fields are strided
  views. CRC-32C (hardware, GIL released) is checked per record on request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anycrc
import numpy as np
from warpdata.core.atomic import CommitOnSuccess
from warpdata.core.errors import DataError, MissingInputError

MAGIC = b"WFS1"
TRAILER_MAGIC = b"WFSE"
VERSION = 1
HEADER_SIZE = 64
FIELD_ENTRY_SIZE = 96
TRAILER_SIZE = 32
MAX_NDIM = 6
MAX_FIELDS = 4096
MAX_NAME_BYTES = 64
MAX_RECORD_SIZE = 1 << 31
MAX_META_BYTES = 1 << 20
DATA_ALIGN = 64
FLAG_RECORD_CRC = 1
KNOWN_FLAGS = FLAG_RECORD_CRC

_HEADER = struct.Struct("<4sHHIIQII32x")  # magic version flags fields record_size data_offset header_crc meta_size
_FIELD = struct.Struct("<64sBBHI6I")  # name dtype ndim reserved offset shape[6]
_TRAILER = struct.Struct("<4sIQQII")  # magic reserved record_count footer_offset trailer_crc reserved

DTYPE_CODES: dict[int, str] = {
    1: "u1", 2: "i1", 3: "<u2", 4: "<i2", 5: "<u4", 6: "<i4", 7: "<u8", 8: "<i8",
    9: "<f2", 10: "<f4", 11: "<f8", 12: "?",
}
_CODE_OF: dict[str, int] = {np.dtype(v).str: k for k, v in DTYPE_CODES.items()}


class FeatureShardError(DataError):
    """A WFS1 file breaks an invariant of the spec."""

    code = "bad-feature-shard"


class FeatureShardChecksumError(FeatureShardError):
    code = "feature-shard-checksum"


_CRC32C = anycrc.Model("CRC32-ISCSI")


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli). anycrc takes any buffer without a copy (google-crc32c
    insists on read-only buffers, i.e. a copy of every writable record)."""
    return _CRC32C.calc(data)


@dataclass(frozen=True)
class FieldSpec:
    """One named field: every record holds exactly ``shape`` values of ``dtype``."""

    name: str
    dtype: str
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        dt = np.dtype(self.dtype)
        # stored little-endian whatever the caller's byte order
        object.__setattr__(self, "dtype", (dt.newbyteorder("<") if dt.itemsize > 1 else dt).str)
        raw = self.name.encode("utf-8")
        if not raw or len(raw) > MAX_NAME_BYTES or b"\0" in raw:
            raise ValueError(f"field name {self.name!r} must be 1-{MAX_NAME_BYTES} UTF-8 bytes without NUL")
        if self.dtype not in _CODE_OF:
            raise ValueError(f"field {self.name!r}: dtype {self.dtype} is not supported by WFS1 "
                             f"(use one of {', '.join(sorted(np.dtype(d).name for d in DTYPE_CODES.values()))})")
        if len(self.shape) > MAX_NDIM or any(s <= 0 for s in self.shape):
            raise ValueError(f"field {self.name!r}: shape {self.shape} must have <= {MAX_NDIM} positive dims")

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.itemsize * int(np.prod(self.shape, dtype=np.int64))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": np.dtype(self.dtype).name, "shape": list(self.shape)}


@dataclass(frozen=True)
class Layout:
    """Field offsets inside a record and the record size (the writer's choice)."""

    fields: tuple[FieldSpec, ...]
    offsets: tuple[int, ...]
    record_size: int

    @classmethod
    def pack(cls, fields: Sequence[FieldSpec]) -> Layout:
        """Natural alignment per field, record size a multiple of 8 (so every
        record keeps 8-byte alignment after the 64-aligned data offset)."""
        if not fields:
            raise ValueError("a feature shard needs at least one field")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate field names in {names}")
        offsets, pos = [], 0
        for f in fields:
            pos = -(-pos // f.itemsize) * f.itemsize
            offsets.append(pos)
            pos += f.nbytes
        size = max(8, -(-pos // 8) * 8)
        if size > MAX_RECORD_SIZE:
            raise ValueError(f"record of {size} bytes exceeds the WFS1 limit of {MAX_RECORD_SIZE}")
        return cls(tuple(fields), tuple(offsets), size)

    def numpy_dtype(self) -> np.dtype:
        return np.dtype({"names": [f.name for f in self.fields],
                         "formats": [(f.dtype, f.shape) if f.shape else f.dtype for f in self.fields],
                         "offsets": list(self.offsets), "itemsize": self.record_size})


def _align(n: int, a: int = DATA_ALIGN) -> int:
    return -(-n // a) * a


def encode_header(layout: Layout, meta: Mapping[str, Any] | None, flags: int) -> bytes:
    meta_bytes = json.dumps(dict(meta or {}), sort_keys=True, separators=(",", ":"),
                            ensure_ascii=False, allow_nan=False).encode("utf-8") if meta else b""
    if len(meta_bytes) > MAX_META_BYTES:
        raise ValueError(f"shard meta of {len(meta_bytes)} bytes exceeds {MAX_META_BYTES}")
    table = bytearray()
    for f, off in zip(layout.fields, layout.offsets, strict=True):
        shape = list(f.shape) + [0] * (MAX_NDIM - len(f.shape))
        table += _FIELD.pack(f.name.encode("utf-8"), _CODE_OF[f.dtype], len(f.shape), 0, off, *shape)
    data_offset = _align(HEADER_SIZE + len(table) + len(meta_bytes))
    head = bytearray(_HEADER.pack(MAGIC, VERSION, flags, len(layout.fields), layout.record_size,
                                  data_offset, 0, len(meta_bytes)))
    blob = head + table + meta_bytes
    blob += b"\0" * (data_offset - len(blob))
    struct.pack_into("<I", blob, 24, crc32c(blob))
    return bytes(blob)


@dataclass(frozen=True)
class ShardInfo:
    """What a finished shard is: the manifest entry the cache writer records."""

    path: str
    records: int
    bytes: int
    sha256: str


class FeatureShardWriter(CommitOnSuccess):
    """Append fixed-size records to a new WFS1 file; rename into place on close.

    ``append_batch`` takes a mapping of field name to an array whose leading
    dimension is the batch; values are cast with numpy's ``same_kind`` rule
    (float32 → float16 is allowed, float → int is not). The record buffer is
    preallocated and reused between batches.
    """

    def __init__(self, path: str | os.PathLike, fields: Sequence[FieldSpec], *,
                 meta: Mapping[str, Any] | None = None, record_crc: bool = True, fsync: bool = True) -> None:
        self.path = Path(path)
        self.layout = Layout.pack(list(fields))
        self._dtype = self.layout.numpy_dtype()
        self._flags = FLAG_RECORD_CRC if record_crc else 0
        self._fsync = fsync
        self._crcs: list[int] = []
        self._count = 0
        self._sha = hashlib.sha256()
        self._buf = np.zeros(0, self._dtype)
        self.info: ShardInfo | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(prefix=".warp-tmp-", suffix="-" + self.path.name, dir=self.path.parent)
        self._f = os.fdopen(fd, "wb")
        self._write(encode_header(self.layout, meta, self._flags))

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._sha.update(data)

    @property
    def count(self) -> int:
        return self._count

    def append(self, record: Mapping[str, Any]) -> None:
        self.append_batch({k: np.asarray(v)[None] for k, v in record.items()})

    def append_batch(self, batch: Mapping[str, Any]) -> None:
        names = set(self._dtype.names)
        missing, extra = names - set(batch), set(batch) - names
        if missing or extra:
            raise ValueError(f"{self.path}: batch fields differ from the shard's: missing {sorted(missing)}, "
                             f"unexpected {sorted(extra)}")
        n = None
        for f in self.layout.fields:
            a = np.asarray(batch[f.name])
            if a.shape[1:] != f.shape or (n is not None and a.shape[0] != n):
                raise ValueError(f"{self.path}: field {f.name!r} has shape {a.shape}, expected (B, *{f.shape})"
                                 + (f" with B={n}" if n is not None else ""))
            n = a.shape[0]
        if not n:
            return
        if self._buf.shape[0] < n:
            self._buf = np.zeros(n, self._dtype)
        buf = self._buf[:n]
        for f in self.layout.fields:
            a = np.asarray(batch[f.name])
            if not np.can_cast(a.dtype, f.dtype, casting="same_kind"):
                raise ValueError(f"{self.path}: field {f.name!r} has dtype {a.dtype}, cannot store as {np.dtype(f.dtype)}")
            np.copyto(buf[f.name], a, casting="same_kind")
        raw = memoryview(buf.view(np.uint8).reshape(-1))
        if self._flags & FLAG_RECORD_CRC:
            rs = self.layout.record_size
            self._crcs.extend(crc32c(raw[i * rs:(i + 1) * rs]) for i in range(n))
        self._write(raw)
        self._count += n

    def close(self) -> ShardInfo:
        """Write the CRC table and trailer, fsync, and rename over ``path``."""
        footer_offset = self._f.tell()
        tail = np.asarray(self._crcs, dtype="<u4").tobytes() if self._flags & FLAG_RECORD_CRC else b""
        trailer = bytearray(_TRAILER.pack(TRAILER_MAGIC, 0, self._count, footer_offset, 0, 0))
        struct.pack_into("<I", trailer, 24, crc32c(tail + bytes(trailer[:24])))
        self._write(tail + bytes(trailer))
        size = self._f.tell()
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())
        self._f.close()
        os.chmod(self._tmp, 0o644)
        os.replace(self._tmp, self.path)
        self.info = ShardInfo(str(self.path), self._count, size, self._sha.hexdigest())
        return self.info

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)



def _fail(path: str, offset: int, what: str, cls=FeatureShardError, **details: Any) -> FeatureShardError:
    return cls(f"{path}: {what} (at byte {offset})",
               hint="the shard is corrupt or not a WFS1 file; rebuild the cache (warp etl --clear)",
               path=path, offset=offset, **details)


@dataclass(frozen=True)
class ParsedHeader:
    layout: Layout
    flags: int
    data_offset: int
    meta: dict[str, Any]
    record_count: int
    footer_offset: int


def parse(buf: bytes | memoryview | mmap.mmap, path: str = "<buffer>") -> ParsedHeader:
    """Check every structural invariant of a whole WFS1 file held in ``buf``."""
    size = len(buf)
    if size < HEADER_SIZE + TRAILER_SIZE:
        raise _fail(path, 0, f"file of {size} bytes is shorter than a header plus trailer")
    magic, version, flags, nfields, record_size, data_offset, header_crc, meta_size = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise _fail(path, 0, f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise _fail(path, 4, f"unsupported WFS version {version} (this warp reads {VERSION})")
    if flags & ~KNOWN_FLAGS:
        raise _fail(path, 6, f"unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    if not 1 <= nfields <= MAX_FIELDS:
        raise _fail(path, 8, f"field count {nfields} outside 1..{MAX_FIELDS}")
    if not 8 <= record_size <= MAX_RECORD_SIZE or record_size % 8:
        raise _fail(path, 12, f"record size {record_size} is not a positive multiple of 8 <= {MAX_RECORD_SIZE}")
    if meta_size > MAX_META_BYTES:
        raise _fail(path, 28, f"meta size {meta_size} exceeds {MAX_META_BYTES}")
    table_end = HEADER_SIZE + nfields * FIELD_ENTRY_SIZE
    if data_offset != _align(table_end + meta_size) or data_offset > size - TRAILER_SIZE:
        raise _fail(path, 16, f"data offset {data_offset} does not follow the field table and meta "
                              f"(expected {_align(table_end + meta_size)}) or lies past the end")
    head = bytearray(buf[:data_offset])
    struct.pack_into("<I", head, 24, 0)
    if crc32c(head) != header_crc:
        raise _fail(path, 24, f"header CRC-32C mismatch: stored {header_crc:#010x}, computed {crc32c(head):#010x}",
                    FeatureShardChecksumError)
    fields, offsets, spans, names = [], [], [], set()
    for i in range(nfields):
        pos = HEADER_SIZE + i * FIELD_ENTRY_SIZE
        rawname, code, ndim, reserved, off, *shape = _FIELD.unpack_from(buf, pos)
        name_b = rawname.rstrip(b"\0")
        if not name_b or b"\0" in name_b:
            raise _fail(path, pos, f"field {i}: empty name or NUL inside the name")
        try:
            name = name_b.decode("utf-8")
        except UnicodeDecodeError:
            raise _fail(path, pos, f"field {i}: name is not UTF-8") from None
        if name in names:
            raise _fail(path, pos, f"field {i}: duplicate name {name!r}")
        if code not in DTYPE_CODES:
            raise _fail(path, pos + 64, f"field {name!r}: unknown dtype code {code}")
        if ndim > MAX_NDIM or reserved:
            raise _fail(path, pos + 65, f"field {name!r}: ndim {ndim} > {MAX_NDIM} or reserved bytes set")
        dims = tuple(shape[:ndim])
        if any(d == 0 for d in dims) or any(shape[ndim:]):
            raise _fail(path, pos + 72, f"field {name!r}: shape {tuple(shape)} has zero or stray dims for ndim {ndim}")
        spec = FieldSpec(name, DTYPE_CODES[code], dims)
        if off % spec.itemsize or off + spec.nbytes > record_size:
            raise _fail(path, pos + 68, f"field {name!r}: offset {off} (+{spec.nbytes} bytes) misaligned or "
                                        f"outside the {record_size}-byte record")
        names.add(name)
        fields.append(spec)
        offsets.append(off)
        spans.append((off, off + spec.nbytes, name))
    spans.sort()
    for (_a0, a1, an), (b0, _b1, bn) in zip(spans, spans[1:], strict=False):
        if b0 < a1:
            raise _fail(path, HEADER_SIZE, f"fields {an!r} and {bn!r} overlap inside the record")
    meta: dict[str, Any] = {}
    if meta_size:
        try:
            meta = json.loads(bytes(buf[table_end:table_end + meta_size]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _fail(path, table_end, f"meta is not UTF-8 JSON: {e}") from None
        if not isinstance(meta, dict):
            raise _fail(path, table_end, "meta is not a JSON object")
    tpos = size - TRAILER_SIZE
    tmagic, treserved, count, footer_offset, trailer_crc, treserved2 = _TRAILER.unpack_from(buf, tpos)
    if tmagic != TRAILER_MAGIC:
        raise _fail(path, tpos, "no trailer: the file is truncated or its writer did not finish")
    crc_bytes = 4 * count if flags & FLAG_RECORD_CRC else 0
    if (footer_offset != data_offset + count * record_size
            or footer_offset + crc_bytes + TRAILER_SIZE != size or treserved or treserved2):
        raise _fail(path, tpos, f"trailer says {count} records ending at {footer_offset}, which does not "
                                f"match the file size {size}")
    tail = bytes(buf[footer_offset:tpos + 24])
    if crc32c(tail) != trailer_crc:
        raise _fail(path, tpos + 24, f"trailer CRC-32C mismatch: stored {trailer_crc:#010x}, "
                                     f"computed {crc32c(tail):#010x}", FeatureShardChecksumError)
    return ParsedHeader(Layout(tuple(fields), tuple(offsets), record_size), flags, data_offset, meta,
                        count, footer_offset)


class FeatureShardReader:
    """Memory-mapped, zero-copy view of one WFS1 shard.

    ``records`` is a structured array over the mapping; ``field(name)`` and
    ``record(i)`` are views into it. Views keep the mapping alive: the file is
    unmapped when the reader and every view are gone, so dropping a reader
    never invalidates arrays a caller still holds.

    With ``offset`` and ``length`` the shard is that byte range of ``path``
    (a member of a cached tar shard, mapped in place from the page boundary
    below ``offset``; offsets in the shard stay relative to the member).
    ``name`` replaces the path in messages.
    """

    def __init__(self, path: str | os.PathLike, *, offset: int = 0, length: int | None = None,
                 name: str | None = None) -> None:
        self.path = name or str(path)
        try:
            with open(path, "rb") as f:
                file_size = os.fstat(f.fileno()).st_size
                size = file_size - offset if length is None else length
                if offset + size > file_size:
                    raise _fail(self.path, 0, f"{path} is {file_size} bytes, too short for {size} bytes at {offset}")
                if size == 0:
                    raise _fail(self.path, 0, "file is empty")
                start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets are page-aligned
                whole = offset == 0 and length is None
                self._map = mmap.mmap(f.fileno(), 0 if whole else offset - start + size,
                                      access=mmap.ACCESS_READ, offset=start)
        except FileNotFoundError:
            raise MissingInputError(f"{self.path}: feature shard does not exist",
                                    hint="check the cache path, or rebuild it with warp etl") from None
        self._mm = self._map if whole else memoryview(self._map)[offset - start:][:size]
        self.header = parse(self._mm, self.path)
        self.layout = self.header.layout
        self.meta = self.header.meta
        self.records = np.frombuffer(self._mm, dtype=self.layout.numpy_dtype(), count=self.header.record_count,
                                     offset=self.header.data_offset)
        self._crcs = (np.frombuffer(self._mm, dtype="<u4", count=self.header.record_count,
                                    offset=self.header.footer_offset)
                      if self.header.flags & FLAG_RECORD_CRC else None)

    def __len__(self) -> int:
        return self.header.record_count

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        return self.layout.fields

    @property
    def has_record_crc(self) -> bool:
        return self._crcs is not None

    def field(self, name: str) -> np.ndarray:
        return self.records[name]

    def record(self, i: int) -> dict[str, np.ndarray]:
        r = self.records[i]
        return {f.name: r[f.name] for f in self.layout.fields}

    def record_bytes(self, i: int) -> memoryview:
        rs, off = self.layout.record_size, self.header.data_offset
        return memoryview(self._mm)[off + i * rs: off + (i + 1) * rs]

    def verify_record(self, i: int) -> None:
        if self._crcs is None:
            return
        if not 0 <= i < len(self):
            raise IndexError(f"{self.path}: record {i} out of range 0..{len(self) - 1}")
        got, want = crc32c(self.record_bytes(i)), int(self._crcs[i])
        if got != want:
            off = self.header.data_offset + i * self.layout.record_size
            raise _fail(self.path, off, f"record {i}: CRC-32C mismatch, stored {want:#010x}, computed {got:#010x}",
                        FeatureShardChecksumError, record=i)

    def verify(self) -> None:
        for i in range(len(self)):
            self.verify_record(i)

    def iter_records(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(len(self)):
            yield self.record(i)

    def close(self) -> None:
        """Drop this reader's references; the mapping closes when no view remains."""
        self.records = None  # type: ignore[assignment]
        self._crcs = None
        buf, self._mm = self._mm, None
        if buf is not None:
            with contextlib.suppress(BufferError):
                if isinstance(buf, memoryview):
                    buf.release()  # the member's slice first, then the map under it
                self._map.close()

    def __enter__(self) -> FeatureShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_shard(path: str | os.PathLike, fields: Sequence[FieldSpec], batch: Mapping[str, Any], *,
                meta: Mapping[str, Any] | None = None, record_crc: bool = True, fsync: bool = False) -> ShardInfo:
    """Write one whole shard from a batch of arrays (convenience for tests and tools)."""
    with FeatureShardWriter(path, fields, meta=meta, record_crc=record_crc, fsync=fsync) as w:
        w.append_batch(batch)
    return w.info
