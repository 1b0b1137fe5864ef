"""TBL v2 layout (docs/formats/tbl-v2.md): header, index entry and metadata block structs, flag
bits, CRCs, the typed errors, and the per-sample codecs shared by the writer
(:mod:`warpdata.formats.tbl_writer`) and the reader (:mod:`warpdata.formats.tbl_reader`).
The module :mod:`warpdata.formats.tbl` is the public face of all three.
"""

from __future__ import annotations

import json
import struct
import sys
import threading
import zlib
from array import array
from dataclasses import dataclass
from typing import Any

import fastcrc
import numpy as np
from isal.isal_zlib import crc32 as _isal_crc32
from warpdata.core.errors import DataError, MissingInputError, UsageError, WarpError
from warpdata.formats import bounded
from warpdata.formats.bounded import FrameSizeError

__all__ = [
    "BadMagic",
    "COMPRESSIONS",
    "CRC32_RESIDUE",
    "ChecksumMismatch",
    "CorruptIndex",
    "CorruptMetadata",
    "CorruptSample",
    "DecompressionError",
    "ENTRY",
    "ENTRY_DTYPE",
    "ENTRY_SIZE",
    "EXTENSION_FLAGS",
    "E_HAS_METADATA",
    "E_LZ4",
    "E_ZSTD",
    "EncodedSample",
    "FORMATS",
    "FORMAT_CODES",
    "F_COMPRESSED",
    "F_HAS_CHECKSUMS",
    "F_HAS_METADATA",
    "F_INDEX_CRC32",
    "F_META_CRC32",
    "F_PAYLOAD_CRC32",
    "F_WARP_METADATA",
    "F_ZSTD",
    "FrameSizeMismatch",
    "HEADER",
    "HEADER_SIZE",
    "Header",
    "KNOWN_FLAGS",
    "LZ4_MAX_RATIO",
    "MAGIC",
    "MAX_DIM",
    "META_BLOCK",
    "META_BLOCK_SIZE",
    "META_CUSTOM",
    "META_JSON",
    "META_MSGPACK",
    "META_NONE",
    "META_PROTOBUF",
    "PRECOMPRESSED",
    "SampleInfo",
    "SampleNotFound",
    "TRAILER_SIZE",
    "TblError",
    "TruncatedFile",
    "UnsupportedVersion",
    "VERSION",
    "canonical_json",
    "crc16",
    "crc32",
    "encode_sample",
    "entry_codec",
    "parse_header",
    "resolve_compression",
]

# ---------------------------------------------------------------- layout ----
MAGIC = b"TBL\x02"
VERSION = 2
HEADER_SIZE = 64
ENTRY_SIZE = 24
META_BLOCK_SIZE = 16
TRAILER_SIZE = 4

# magic, version, num_samples, header_size, pad, metadata_offset, metadata_size,
# flags, header_crc32, reserved[16]
HEADER = struct.Struct("<4sIQIIQQII16s")
# offset, stored size, uncompressed size, width, height, format, flags, crc16
ENTRY = struct.Struct("<QIIHHBBH")
META_BLOCK = struct.Struct("<QIHH")
_U32 = struct.Struct("<I")
_BIG_ENDIAN = sys.byteorder == "big"
assert array("I").itemsize == 4  # the metadata block CRC table is spooled from an array("I")
ENTRY_DTYPE = np.dtype([("offset", "<u8"), ("size", "<u4"), ("usize", "<u4"), ("width", "<u2"),
                        ("height", "<u2"), ("format", "u1"), ("flags", "u1"), ("crc16", "<u2")])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE == ENTRY.size and HEADER.size == HEADER_SIZE

# header flags: bits 0-2 are TurboLoader's, bits 3-7 warp's extensions
F_COMPRESSED = 1 << 0
F_HAS_METADATA = 1 << 1
F_HAS_CHECKSUMS = 1 << 2
F_PAYLOAD_CRC32 = 1 << 3  # a CRC-32 of the stored bytes follows every payload
F_INDEX_CRC32 = 1 << 4  # reserved bytes 48..51 hold a CRC-32 of the index table
F_ZSTD = 1 << 5  # some entries are ZSTD frames
F_WARP_METADATA = 1 << 6  # every sample has one JSON block with "key" and "sidecars"
# a CRC-32 per metadata block in a table after the section, and one over section + table
# in header bytes 52..55 (block count in 56..59): docs/formats/tbl-v2.md, "Metadata CRCs"
F_META_CRC32 = 1 << 7
KNOWN_FLAGS = (1 << 8) - 1
EXTENSION_FLAGS = {"payload-crc32": F_PAYLOAD_CRC32, "index-crc32": F_INDEX_CRC32,
                   "zstd": F_ZSTD, "warp-metadata": F_WARP_METADATA, "metadata-crc32": F_META_CRC32}

# entry flags
E_LZ4 = 1 << 0
E_HAS_METADATA = 1 << 1
E_ZSTD = 1 << 2  # written as E_ZSTD | E_LZ4: a TurboLoader reader then fails in LZ4

# sample formats (TurboLoader's SampleFormat enum)
FORMATS = {0: "unknown", 1: "jpeg", 2: "png", 3: "webp", 4: "bmp", 5: "tiff", 6: "mp4", 7: "avi",
           8: "raw_u8"}
FORMAT_CODES = {v: k for k, v in FORMATS.items()}
# formats whose bytes are already entropy-coded: compression saves ~0 % (docs/design.md §3)
PRECOMPRESSED = frozenset({"jpeg", "png", "webp", "gif", "mp4", "avi"})

# metadata block types (TurboLoader's MetadataType enum)
META_NONE, META_JSON, META_PROTOBUF, META_MSGPACK, META_CUSTOM = 0, 1, 2, 3, 255
COMPRESSIONS = ("auto", "none", "lz4", "zstd")
MAX_DIM = 0xFFFF  # sizes above this are stored as 0 (unknown)
# LZ4 expands at most 255x; anything claiming more is corrupt, not data (formats/bounded.py)
LZ4_MAX_RATIO = bounded.LZ4_MAX_RATIO


# CRC-32 of (message + its own CRC-32, little-endian) is this constant for any
# message: checking it is exactly "stored trailer == computed CRC" in one pass
CRC32_RESIDUE = 0x2144DF1C


def crc16(data) -> int:
    """CRC-16/MODBUS (TurboLoader's per-sample checksum), GIL released."""
    return fastcrc.crc16.modbus(data)


def crc32(data, initial: int = 0) -> int:
    """CRC-32 (ISO-HDLC, zlib's; ``initial`` continues a running CRC).

    ISA-L's folding CRC (GIL released above 5 KiB): it streams payloads from
    the page cache as fast as a memcpy does, which fastcrc (~10 % slower on cold
    data here) and zlib (6 GB/s) do not (BENCHMARKS.md, TBL section).
    """
    return _isal_crc32(data, initial)


# ---------------------------------------------------------------- errors ----
class TblError(DataError):
    """Base of every malformed-.tbl error; carries ``path`` and facts in ``details``."""

    code = "bad-tbl"
    _HINT = "the file is damaged: re-create it with 'warp tar-to-tbl' or re-download it"

    def __init__(self, message: str, *, hint: str | None = None, **details: object) -> None:
        super().__init__(message, hint=hint or self._HINT, **details)


class BadMagic(TblError):
    code = "tbl-bad-magic"
    _HINT = "this is not a TBL v2 file; convert a tar with 'warp tar-to-tbl IN OUT'"


class UnsupportedVersion(TblError):
    code = "tbl-unsupported-version"
    _HINT = "warp reads TBL version 2 only; re-create the file with 'warp tar-to-tbl'"


class TruncatedFile(TblError):
    code = "tbl-truncated"
    _HINT = "the file is shorter than its header says (an interrupted copy?): copy or convert it again"


class CorruptIndex(TblError):
    code = "tbl-corrupt-index"


class ChecksumMismatch(TblError):
    code = "tbl-checksum-mismatch"


class CorruptMetadata(TblError):
    code = "tbl-corrupt-metadata"


class DecompressionError(TblError):
    code = "tbl-decompression"


class FrameSizeMismatch(DecompressionError, FrameSizeError):
    """A compressed entry whose frame declares, needs or yields another size than the index's
    uncompressed size (formats/bounded.py): refused before the output is allocated."""

    code = "tbl-frame-size"


class SampleNotFound(WarpError, KeyError):
    """A sample key that the file does not hold."""

    exit_code = MissingInputError.exit_code
    code = "tbl-sample-not-found"


# ---------------------------------------------------------------- header ----
@dataclass(frozen=True)
class Header:
    num_samples: int
    header_size: int
    metadata_offset: int
    metadata_size: int
    flags: int
    header_crc: int
    index_crc: int
    meta_crc: int = 0  # F_META_CRC32: CRC-32 of the metadata section and its block CRC table
    meta_blocks: int = 0  # F_META_CRC32: number of metadata blocks (= table entries)

    def pack(self) -> bytes:
        """The 64 header bytes with ``header_crc`` computed over them."""
        reserved = struct.pack("<III4x", self.index_crc, self.meta_crc, self.meta_blocks)
        raw = bytearray(HEADER.pack(MAGIC, VERSION, self.num_samples, self.header_size, 0,
                                    self.metadata_offset, self.metadata_size, self.flags, 0, reserved))
        raw[44:48] = struct.pack("<I", zlib.crc32(raw))
        return bytes(raw)

    @property
    def extensions(self) -> list[str]:
        return [name for name, bit in EXTENSION_FLAGS.items() if self.flags & bit]


def parse_header(buf, path: str = "<bytes>", file_size: int | None = None) -> Header:
    """Decode and check the 64-byte header (magic, version, CRC, size fields)."""
    if len(buf) < 4 or bytes(buf[:4]) != MAGIC:
        if len(buf) >= 3 and bytes(buf[:3]) == b"TBL":
            raise UnsupportedVersion(f"{path}: TBL magic with version byte {buf[3]}; warp reads version 2",
                                     path=path, version=int(buf[3]))
        raise BadMagic(f"{path}: not a TBL v2 file (first bytes {bytes(buf[:4]).hex(' ') or 'none'})",
                       path=path)
    if len(buf) < HEADER_SIZE:
        raise TruncatedFile(f"{path}: {len(buf)} bytes, shorter than the 64-byte TBL header",
                            path=path, size=len(buf))
    magic, version, n, hsize, _pad, moff, msize, flags, hcrc, reserved = HEADER.unpack_from(buf, 0)
    if version != VERSION:
        raise UnsupportedVersion(f"{path}: TBL header says version {version}; warp reads version 2",
                                 path=path, version=version)
    raw = bytearray(buf[:HEADER_SIZE])
    raw[44:48] = b"\0\0\0\0"
    computed = zlib.crc32(raw)
    if computed != hcrc:
        raise ChecksumMismatch(f"{path}: header CRC-32 mismatch (stored {hcrc:08x}, computed {computed:08x})",
                               path=path, offset=0, check="header-crc32", stored=hcrc, computed=computed)
    if hsize != HEADER_SIZE + ENTRY_SIZE * n:
        raise CorruptIndex(f"{path}: header_size {hsize} does not match {n} samples "
                           f"(expected {HEADER_SIZE + ENTRY_SIZE * n})", path=path)
    (index_crc, meta_crc, meta_blocks) = struct.unpack_from("<III", reserved, 0)
    if not flags & F_META_CRC32:
        meta_crc = meta_blocks = 0
    elif meta_blocks * META_BLOCK_SIZE > msize:
        raise CorruptIndex(f"{path}: header announces {meta_blocks} metadata blocks, more than "
                           f"{msize} metadata bytes can hold", path=path, offset=56)
    table_end = moff + msize + TRAILER_SIZE * meta_blocks
    if file_size is not None:
        if hsize > file_size:
            raise TruncatedFile(f"{path}: index of {n} samples needs {hsize} bytes, the file has {file_size}",
                                path=path, size=file_size, needed=hsize)
        if moff and (moff < hsize or moff + msize > file_size):
            bad = TruncatedFile if moff + msize > file_size and moff >= hsize else CorruptIndex
            raise bad(f"{path}: metadata section [{moff}, {moff + msize}) is outside the file "
                      f"(payloads start at {hsize}, file has {file_size} bytes)", path=path)
        if meta_blocks and table_end > file_size:
            raise TruncatedFile(f"{path}: the metadata CRC table [{moff + msize}, {table_end}) is past the end "
                                f"of the file ({file_size} bytes)", path=path, size=file_size, needed=table_end)
    if msize and not moff:
        raise CorruptIndex(f"{path}: metadata_size {msize} with no metadata offset", path=path)
    return Header(n, hsize, moff, msize, flags, hcrc, index_crc, meta_crc, meta_blocks)


# ------------------------------------------------------------ sample info ----
@dataclass(frozen=True)
class SampleInfo:
    index: int
    offset: int
    size: int  # stored bytes
    uncompressed_size: int
    width: int  # 0 = unknown
    height: int
    format: str
    compression: str  # none | lz4 | zstd
    has_metadata: bool
    crc16: int


@dataclass(frozen=True)
class CorruptSample:
    """One failed check found by :meth:`TblReader.verify_all`."""

    index: int
    offset: int
    check: str  # payload-crc32 | crc16 | decompress | metadata-crc32 | metadata-section-crc32 | metadata-json | metadata
    stored: int | None
    computed: int | None
    message: str


def entry_codec(flags: int) -> str:
    if flags & E_ZSTD:
        return "zstd"
    return "lz4" if flags & E_LZ4 else "none"


# ---------------------------------------------------------------- codecs ----
_tls = threading.local()


def _zstd_c(level: int):
    import zstandard  # lazy: a codec only some files use; readers of the others never load it

    cache = getattr(_tls, "zc", None)
    if cache is None:
        cache = _tls.zc = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return c


def _zstd_d():
    d = getattr(_tls, "zd", None)
    if d is None:
        import zstandard  # lazy, as in _zstd_c

        d = _tls.zd = zstandard.ZstdDecompressor()
    return d


@dataclass
class EncodedSample:
    """A sample ready to be appended: stored bytes plus everything in its index entry."""

    stored: Any  # bytes-like
    usize: int
    flags: int  # entry flags without E_HAS_METADATA
    crc16: int
    crc32: int | None  # of ``stored``; None when the writer has no trailers
    format: int
    width: int
    height: int
    metadata: bytes | None = None
    meta_type: int = META_JSON


def resolve_compression(compression: str, format: str | int) -> str:
    """What ``compression`` means for one payload of ``format``: ``auto`` is none for
    already-compressed formats (JPEG, PNG, ...), LZ4 otherwise."""
    if compression != "auto":
        return compression
    name = FORMATS.get(format, "unknown") if isinstance(format, int) else format
    return "none" if name in PRECOMPRESSED else "lz4"


def encode_sample(data, *, format: str | int = "unknown", width: int = 0, height: int = 0,
                  compression: str = "none", level: int | None = None, trailer: bool = True,
                  metadata: bytes | None = None, meta_type: int = META_JSON) -> EncodedSample:
    """Checksum and (optionally) compress one payload; thread-safe, GIL released in C.

    ``compression`` is ``none``, ``lz4``, ``zstd`` or ``auto`` (none for
    already-compressed formats, LZ4 otherwise). A compressed form is kept only
    when strictly smaller, as TurboLoader does.
    """
    fmt = format if isinstance(format, int) else FORMAT_CODES.get(format, 0)
    compression = resolve_compression(compression, fmt)
    usize = len(data)
    stored, flags = data, 0
    if compression == "lz4" and usize:
        import lz4.block  # lazy (a codec only some files use), as zstandard above

        if level is not None and level > 1:
            packed = lz4.block.compress(data, mode="high_compression", compression=min(level, 12),
                                        store_size=False)
        else:
            packed = lz4.block.compress(data, store_size=False)
        if len(packed) < usize:
            stored, flags = packed, E_LZ4
    elif compression == "zstd" and usize:
        packed = _zstd_c(3 if level is None else level).compress(data)
        if len(packed) < usize:
            stored, flags = packed, E_ZSTD | E_LZ4
    elif compression not in ("none", "lz4", "zstd"):
        raise UsageError(f"unknown compression {compression!r}", hint=f"use one of {', '.join(COMPRESSIONS)}")
    return EncodedSample(stored=stored, usize=usize, flags=flags, crc16=crc16(data),
                         crc32=crc32(stored) if trailer else None, format=fmt,
                         width=width if 0 < width <= MAX_DIM else 0,
                         height=height if 0 < height <= MAX_DIM else 0,
                         metadata=metadata, meta_type=meta_type)


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8: the same object gives the same bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
