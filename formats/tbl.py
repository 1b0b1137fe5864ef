"""TBL v2 container: layout, codecs, a streaming writer and an mmap reader.

The byte layout is specified in ``docs/formats/tbl-v2.md`` and is the one
``turboloader`` 2.39 writes and reads (docs/design.md §3)::

    [header 64 B][index N x 24 B][payloads (+ CRC-32 trailers)][metadata blocks]

Contract:

* :class:`TblWriter` streams: payloads, index entries and metadata blocks go
  to spool files beside the output as they arrive, so memory stays constant in
  the number of samples; :meth:`TblWriter.close` assembles the final file under
  a temporary name and renames it into place. With ``extensions=False`` the
  output is a plain TurboLoader file, byte-identical to ``TblWriterV2``'s for the
  same inputs; with ``extensions=True`` (default) it adds warp's extensions
  (CRC-32 payload trailers, index CRC-32, ZSTD entries, warp JSON metadata,
  metadata block and section CRC-32s), each announced by a header flag bit,
  which a TurboLoader reader either ignores or refuses (it never returns
  wrong bytes; see the spec). With all of them every byte a reader uses is
  under a CRC it checks.
* :class:`TblReader` memory-maps a file, validates header, index CRC and every
  index entry at open (offsets in range, no overlaps, plausible sizes), and
  returns zero-copy ``memoryview`` payloads in O(1); with ``verify=True`` each
  read checks the payload's CRC. Metadata is checked against the section CRC
  before its first parse, and each block against its own CRC when read. Broken invariants raise one typed error each
  (:class:`BadMagic`, :class:`UnsupportedVersion`, :class:`TruncatedFile`,
  :class:`CorruptIndex`, :class:`ChecksumMismatch`, :class:`CorruptMetadata`,
  :class:`DecompressionError`), all :class:`~warpdata.core.errors.DataError`\\ s
  naming the file, the sample and the offset.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import sys
import tempfile
import threading
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastcrc
import numpy as np
from isal.isal_zlib import crc32 as _isal_crc32
from warpdata.core.atomic import TMP_PREFIX, CommitOnSuccess, fsync_dir
from warpdata.core.errors import DataError, MissingInputError, UsageError, WarpError

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
# LZ4 expands at most 255x; anything claiming more is corrupt, not data
LZ4_MAX_RATIO = 255


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
    import zstandard

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
        import zstandard

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
        import lz4.block

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


# ---------------------------------------------------------------- writer ----
def _copy_range(src_fd: int, dst_fd: int, count: int, src_off: int = 0) -> None:
    """Copy ``count`` bytes of ``src_fd`` from ``src_off`` to the current end of ``dst_fd``."""
    dst_off = os.lseek(dst_fd, 0, os.SEEK_END)
    done = 0
    try:
        while done < count:
            n = os.copy_file_range(src_fd, dst_fd, count - done, src_off + done, dst_off + done)
            if n == 0:
                break
            done += n
    except (OSError, AttributeError):
        pass
    chunk = 8 << 20
    while done < count:
        buf = os.pread(src_fd, min(chunk, count - done), src_off + done)
        if not buf:
            raise OSError(f"short read while copying spool data ({done} of {count} bytes)")
        os.pwrite(dst_fd, buf, dst_off + done)
        done += len(buf)
    os.lseek(dst_fd, dst_off + count, os.SEEK_SET)


_HUGE_PAGE = 2 << 20


def _staging_buffer(nbytes: int) -> Any:
    """A zeroed, page-aligned uint8 array for :class:`_DirectPayloads`, on transparent huge pages if offered.

    An anonymous mapping advised ``MADV_HUGEPAGE`` over its 2 MiB-aligned
    part (THP is commonly in ``madvise`` mode). Measured here, 5 x 4 MiB
    buffers, 160 MB written with ``O_DIRECT``: first touch 2.5-7 ms of CPU
    instead of 10-16 ms (one fault per 2 MiB, not per 4 KiB), the writes'
    kernel time (pinning the pages) 5-6 ms instead of 8-10 ms, and the
    writes themselves ~50 ms instead of 80-100 ms. Where the advice is not
    available or refused, the pages are ordinary ones: the bytes are the same.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < _HUGE_PAGE:
        from warpdata.core.directio import aligned_empty

        return aligned_empty(nbytes)
    m = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, np.uint8)  # keeps the mapping alive as long as the array (its base)
    skip = (-a.ctypes.data) % _HUGE_PAGE
    with contextlib.suppress(OSError):
        m.madvise(advice, skip, nbytes)
    return a[skip:skip + nbytes]


class _DirectPayloads:
    """The payload region of a new .tbl file, written with ``O_DIRECT`` in the background.

    A file-like ``write``/``flush``/``close`` sink for :class:`TblWriter`: bytes
    are copied into page-aligned staging buffers of :data:`CHUNK` bytes that
    cover the file from ``start`` rounded down to a page; each full buffer goes
    to the disk from :data:`IO_THREADS` I/O threads while the caller fills the
    next (:class:`~warpdata.core.directio.AlignedFile`), and an ``fdatasync`` every
    :data:`SYNC_EVERY` bytes runs in a thread of its own. The bytes between the rounded-down
    start and ``start`` are written as zeros (the writer fills that part of the
    index at close). :meth:`flush` writes the last, partial buffer (its
    unaligned tail through the page cache) and waits for the disk.

    Why (BENCHMARKS.md, TBL section): through the page cache, every payload byte
    is copied into the cache and reaches the disk only at the final fsync, after
    all the CPU work, so conversion took the CPU time *plus* the disk time;
    here the disk works from the first chunk on, in parallel with parsing and
    checksumming, and no page-cache copy is made. Peak memory: :data:`BUFFERS`
    staging buffers, whatever the number of samples.
    """

    # measured here (160 and 390 MB tars, alternating runs, a loaded 2-core machine): 4 MiB pieces
    # with up to four in flight kept the disk busiest (copy / warp 0.66 against 0.54 with two in
    # flight: an I/O thread waiting for a CPU leaves the disk idle); 2 MiB or 8 MiB pieces were no
    # better. Peak RSS: +20 MB, flat in the number of samples
    CHUNK = 4 << 20
    BUFFERS = 5  # one filling, up to four at the disk
    IO_THREADS = 4
    # a direct write ends in the disk's volatile cache: the final fsync still waited ~0.35 s per
    # 380 MB here for the device to flush it. An fdatasync every SYNC_EVERY bytes, in a thread of
    # its own, flushes while the converter computes, and the final fsync finds little left
    SYNC_EVERY = 32 << 20

    def __init__(self, path: str, start: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from warpdata.core.directio import BLOCK, AlignedFile

        self._io = ThreadPoolExecutor(self.IO_THREADS, thread_name_prefix="tbl-direct")
        self._sync = ThreadPoolExecutor(1, thread_name_prefix="tbl-sync")
        self._syncing: Any = None  # the running fdatasync, if any
        self._unsynced = 0
        self._file = AlignedFile(path, direct=True)
        if not self._file.direct:  # the filesystem refused O_DIRECT after all
            self._io.shutdown()
            self._sync.shutdown()
            self._file.close()
            raise OSError("O_DIRECT refused")
        self._free = [_staging_buffer(self.CHUNK) for _ in range(self.BUFFERS)]
        self._busy: list[tuple[Any, Any]] = []  # (future, buffer), oldest first
        self._buf = self._free.pop()
        self._mv = memoryview(self._buf)
        self._fill = start % BLOCK
        self._mv[:self._fill] = bytes(self._fill)
        self._at = start - self._fill  # file offset of the staging buffer's first byte
        self._slot: memoryview | None = None
        self._closed = False

    def slot(self, n: int) -> memoryview | None:
        """The staging bytes where the next ``n`` payload bytes go, if they fit in the current buffer.

        The caller fills it and passes it to :meth:`write` (which then copies
        nothing), or drops it: the next write overwrites it.
        """
        if not 0 < n <= self.CHUNK - self._fill or self._closed:
            return None
        self._slot = self._mv[self._fill:self._fill + n]
        return self._slot

    def write(self, data) -> None:
        if data is self._slot and data is not None:  # filled in place (slot())
            self._slot = None
            self._fill += len(data)
            if self._fill == self.CHUNK:
                self._submit()
            return
        self._slot = None
        if isinstance(data, bytes) and len(data) <= self.CHUNK - self._fill:  # trailers, small payloads
            end = self._fill + len(data)
            self._mv[self._fill:end] = data
            self._fill = end
            if end == self.CHUNK:
                self._submit()
            return
        with memoryview(data) as src:
            src = src.cast("B") if src.format != "B" or src.ndim != 1 else src
            n, done = len(src), 0
            while done < n:
                k = min(n - done, self.CHUNK - self._fill)
                self._mv[self._fill:self._fill + k] = src[done:done + k]
                self._fill += k
                done += k
                if self._fill == self.CHUNK:
                    self._submit()

    def _submit(self) -> None:
        self._busy.append((self._io.submit(self._file.write, self._at, self._buf), self._buf))
        self._at += self.CHUNK
        self._unsynced += self.CHUNK
        if self._unsynced >= self.SYNC_EVERY and (self._syncing is None or self._syncing.done()):
            if self._syncing is not None:
                self._syncing.result()  # raises a failed flush now
            self._syncing = self._sync.submit(os.fdatasync, self._file.fd)
            self._unsynced = 0
        if not self._free:
            fut, buf = self._busy.pop(0)
            fut.result()
            self._free.append(buf)
        self._buf = self._free.pop()
        self._mv = memoryview(self._buf)
        self._fill = 0

    def flush(self) -> None:
        """Write what is staged (aligned part direct, the tail buffered) and wait for the disk."""
        from warpdata.core.directio import BLOCK

        if self._closed:
            return
        aligned = self._fill - self._fill % BLOCK
        if aligned:
            self._busy.append((self._io.submit(self._file.write, self._at, self._mv[:aligned]), self._buf))
        for fut, _buf in self._busy:
            fut.result()
        self._busy = []
        if self._syncing is not None:
            self._syncing.result()
            self._syncing = None
        if self._fill > aligned:
            self._file.write(self._at + aligned, self._mv[aligned:self._fill])
        # keep appending after what was flushed: restage the unaligned tail at its page
        tail = bytes(self._mv[aligned:self._fill])
        self._at += aligned
        self._mv[:len(tail)] = tail
        self._fill = len(tail)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for fut in [f for f, _b in self._busy] + [self._syncing]:
                if fut is not None:
                    with contextlib.suppress(BaseException):
                        fut.result()
        finally:
            self._busy, self._syncing = [], None
            self._io.shutdown(wait=True)
            self._sync.shutdown(wait=True)
            self._file.close()
            self._mv.release()
            self._free, self._buf = [], None


class TblWriter(CommitOnSuccess):
    """Stream samples into a new .tbl file at ``path`` (written atomically).

    ``compression``: ``auto`` | ``none`` | ``lz4`` | ``zstd`` (ZSTD needs
    ``extensions=True``). ``extensions=False`` writes exactly what TurboLoader
    writes. ``expected_samples`` (optional) lets payloads go straight into the
    output, skipping one copy at close, when the final count matches.
    Use as a context manager: an exception discards everything written.
    """

    _INDEX_FLUSH = 4096  # entries buffered before they go to the index spool
    _REBASE_CHUNK = 8192  # entries rebased per step at close (192 KiB)
    _SPOOL_BUFFER = 64 << 10  # index (written in 96 KiB blocks anyway) and metadata spools

    def __init__(self, path: str | os.PathLike, *, compression: str = "auto", level: int | None = None,
                 extensions: bool = True, expected_samples: int | None = None, fsync: bool = True) -> None:
        if compression not in COMPRESSIONS:
            raise UsageError(f"unknown compression {compression!r}",
                             hint=f"use one of {', '.join(COMPRESSIONS)}")
        if compression == "zstd" and not extensions:
            raise UsageError("ZSTD entries are a warp extension and need extensions=True",
                             hint="use lz4 or none for a plain TurboLoader file")
        self.path = Path(path)
        self.compression, self.level, self.extensions, self.fsync = compression, level, extensions, fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._expected = expected_samples
        self._tmp: list[str] = []
        self._closed = False
        self.num_samples = 0
        self.bytes_in = 0
        self.bytes_stored = 0
        self.compressed_samples = 0
        self._any_compressed = self._any_zstd = self._any_meta = False
        self._meta_size = 0
        self._meta_blocks = 0
        self._meta_crc = 0  # running CRC-32 of the metadata blocks (then of the CRC table)
        try:
            if expected_samples is not None:
                self._out_fd, self._out_path = self._mkstemp("out")
                self._base = HEADER_SIZE + ENTRY_SIZE * expected_samples
                os.ftruncate(self._out_fd, self._base)
                os.lseek(self._out_fd, self._base, os.SEEK_SET)
                self._pay = self._direct_payloads() or os.fdopen(os.dup(self._out_fd), "wb", buffering=1 << 20)
                self._pay_path = self._out_path
            else:
                self._out_fd, self._out_path = -1, ""
                self._base = 0
                fd, self._pay_path = self._mkstemp("payload")
                self._pay = os.fdopen(fd, "wb", buffering=1 << 20)
            # small spool buffers: a buffer's pages become resident only as it
            # first fills, and at ~60 B of metadata and 24 B of index per sample
            # 1 MiB buffers made peak RSS creep up until ~45,000 samples
            fd, self._idx_path = self._mkstemp("index")
            self._idx = os.fdopen(fd, "w+b", buffering=self._SPOOL_BUFFER)
            fd, self._meta_path = self._mkstemp("meta")
            self._meta = os.fdopen(fd, "w+b", buffering=self._SPOOL_BUFFER)
            # one u32 CRC-32 per metadata block (warp extension F_META_CRC32)
            fd, self._mcrc_path = self._mkstemp("metacrc")
            self._mcrc = os.fdopen(fd, "w+b", buffering=self._SPOOL_BUFFER)
        except BaseException:
            self.abort()
            raise
        self._pos = 0  # payload bytes written, relative to the payload region
        # entries are packed with struct into one reused buffer: per-sample numpy
        # field assignments left small objects alive now and then (tracemalloc:
        # ~200 more per 40,000 samples), pinning pymalloc pools; peak RSS was
        # ~1 MB higher at 50,000 samples than at 2,000 from that alone
        self._ebuf = bytearray(ENTRY_SIZE * self._INDEX_FLUSH)
        self._n_buf = 0
        # metadata blocks and their CRC-32s gather here and go to the spools ~64 KiB at a time: one
        # write and one running-CRC pass per batch instead of three calls per sample
        self._mbuf = bytearray()
        self._mcrcs = array("I")

    def _direct_payloads(self) -> _DirectPayloads | None:
        """An O_DIRECT payload sink when the output is fsync'd and its filesystem suits (warp/core/directio.py).

        Without fsync the page cache is the faster place to leave the bytes:
        the caller returns before the disk has them either way.
        """
        from warpdata.core.directio import wants_direct

        if not self.fsync or not wants_direct(self.path.parent):
            return None
        try:
            return _DirectPayloads(self._out_path, self._base)
        except OSError:
            return None

    def payload_slot(self, n: int) -> memoryview | None:
        """Where the next sample's ``n`` stored bytes will be written, to fill in place; or None.

        Only the O_DIRECT sink offers one (its staging buffer, when the bytes
        fit in it). Fill it and pass it as the stored bytes of the very next
        :meth:`add_encoded` (``encode_sample(slot, ...)`` with no compression):
        the bytes are then not copied again. An unused slot is simply dropped.
        """
        slot = getattr(self._pay, "slot", None)
        return slot(n) if slot is not None and not self._closed else None

    def _mkstemp(self, what: str) -> tuple[int, str]:
        fd, p = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=f"-{what}-{self.path.name}", dir=self.path.parent)
        self._tmp.append(p)
        return fd, p

    # -- adding samples --------------------------------------------------
    def add(self, data, *, format: str | int | None = None, width: int | None = None,
            height: int | None = None, metadata: Any = None, meta_type: int = META_JSON,
            compression: str | None = None) -> int:
        """Append one sample; returns its index.

        Format and size default to what the image header says (no decode).
        ``metadata`` may be ``bytes``/``str`` (stored as given) or any JSON
        value (stored as canonical JSON).
        """
        if format is None or width is None or height is None:
            from warpdata.formats.imageinfo import image_info, sniff_format

            sniffed = sniff_format(data)
            if sniffed is not None:
                try:
                    info = image_info(data, name=f"sample {self.num_samples}")
                    format = info.format if format is None else format
                    width = info.width if width is None else width
                    height = info.height if height is None else height
                except DataError:
                    format = sniffed if format is None else format
        meta = None
        if metadata is not None:
            meta = metadata if isinstance(metadata, bytes) else (
                metadata.encode("utf-8") if isinstance(metadata, str) else canonical_json(metadata))
        enc = encode_sample(data, format=format or "unknown", width=width or 0, height=height or 0,
                            compression=compression or self.compression, level=self.level,
                            trailer=self.extensions, metadata=meta, meta_type=meta_type)
        return self.add_encoded(enc)

    def add_encoded(self, s: EncodedSample) -> int:
        """Append a sample prepared by :func:`encode_sample` (possibly in another thread)."""
        if self._closed:
            raise UsageError(f"{self.path}: writer is closed")
        if s.flags & E_ZSTD and not self.extensions:
            raise UsageError("ZSTD entries need extensions=True")
        return self.add_stored(s.stored, s.usize, s.flags, s.crc16, s.crc32, s.format, s.width, s.height,
                               s.metadata, s.meta_type)

    def add_stored(self, stored, usize: int, flags: int, crc16: int, crc32_: int | None, format: int,
                   width: int, height: int, metadata: bytes | None = None, meta_type: int = META_JSON) -> int:
        """:meth:`add_encoded` without the :class:`EncodedSample`: the fields as :func:`encode_sample` sets them.

        ``stored`` and its CRCs as they will be written (``crc32_`` of
        ``stored``, None to compute it here; ``crc16`` of the uncompressed
        bytes), ``format`` a code of :data:`FORMATS`, sizes already 0 where
        above :data:`MAX_DIM`. The converter calls this once per sample.
        """
        if self._closed:
            raise UsageError(f"{self.path}: writer is closed")
        i = self.num_samples
        size = len(stored)
        if metadata is not None:
            flags |= E_HAS_METADATA
            bh = META_BLOCK.pack(i, len(metadata), meta_type, 0)
            mbuf = self._mbuf
            mbuf += bh
            mbuf += metadata
            self._meta_size += META_BLOCK_SIZE + len(metadata)
            self._any_meta = True
            if self.extensions:
                self._mcrcs.append(crc32(metadata, crc32(bh)))
                self._meta_blocks += 1
            if len(mbuf) >= self._SPOOL_BUFFER:
                self._flush_meta()
        ENTRY.pack_into(self._ebuf, ENTRY_SIZE * self._n_buf, self._pos, size, usize, width, height,
                        format, flags, crc16)
        self._n_buf += 1
        if self._n_buf == self._INDEX_FLUSH:
            self._flush_index()
        self._pay.write(stored)
        self._pos += size
        if self.extensions:
            self._pay.write(_U32.pack(crc32_ if crc32_ is not None else crc32(stored)))
            self._pos += TRAILER_SIZE
        if flags & (E_LZ4 | E_ZSTD):
            self.compressed_samples += bool(flags & E_LZ4)
            self._any_compressed |= bool(flags & E_LZ4)
            self._any_zstd |= bool(flags & E_ZSTD)
        self.bytes_in += usize
        self.bytes_stored += size
        self.num_samples = i + 1
        return i

    def _flush_meta(self) -> None:
        """Spool the metadata blocks and their CRCs gathered since the last flush (one write each)."""
        if self._mbuf:
            self._meta_crc = crc32(self._mbuf, self._meta_crc)
            self._meta.write(self._mbuf)
            self._mbuf.clear()
        if self._mcrcs:
            if _BIG_ENDIAN:
                self._mcrcs.byteswap()
            self._mcrc.write(self._mcrcs.tobytes())
            del self._mcrcs[:]

    def _flush_index(self) -> None:
        with memoryview(self._ebuf) as mv:
            self._idx.write(mv[: ENTRY_SIZE * self._n_buf])
        self._n_buf = 0

    # -- finishing -------------------------------------------------------
    def _flags(self) -> int:
        f = F_HAS_CHECKSUMS
        # TurboLoader sets COMPRESSED whenever LZ4 was asked for, even if no entry shrank
        if self._any_compressed or (not self.extensions and self.compression == "lz4"):
            f |= F_COMPRESSED
        if self._any_meta:
            f |= F_HAS_METADATA
        if self.extensions:
            f |= F_PAYLOAD_CRC32 | F_INDEX_CRC32
            if self._any_zstd:
                f |= F_ZSTD
            if self._any_meta:
                f |= F_META_CRC32
        return f

    def close(self, *, warp_metadata: bool = False) -> Path:
        """Assemble and rename the file into place; returns its path.

        ``warp_metadata=True`` sets the flag promising that every sample has
        one JSON block with ``key`` (the converter's output).
        """
        if self._closed:
            return self.path
        try:
            self._flush_index()
            self._flush_meta()
            self._pay.flush()
            self._idx.flush()
            self._meta.flush()
            self._mcrc.flush()
            n = self.num_samples
            base = HEADER_SIZE + ENTRY_SIZE * n
            in_place = self._expected is not None and self._expected == n
            if in_place:
                out_fd = self._out_fd
            else:
                if self._out_fd >= 0:  # count differs from the hint: payloads move
                    os.close(self._out_fd)
                out_fd, out_path = self._mkstemp("final")
                os.lseek(out_fd, 0, os.SEEK_SET)
                self._out_fd, self._out_path = out_fd, out_path
            # index: rebase offsets, CRC as we go, in constant-size chunks
            os.lseek(out_fd, HEADER_SIZE, os.SEEK_SET)
            idx_crc = 0
            self._idx.seek(0)
            # one fixed buffer, rebased in place: the same few allocations for any N
            chunk = bytearray(ENTRY_SIZE * self._REBASE_CHUNK)
            with memoryview(chunk) as mv:
                entries = np.frombuffer(chunk, ENTRY_DTYPE)
                while True:
                    got = self._idx.readinto(mv)
                    if not got:
                        break
                    if got % ENTRY_SIZE:
                        raise OSError(f"short read of the index spool ({got} bytes)")
                    entries[: got // ENTRY_SIZE]["offset"] += base
                    idx_crc = crc32(mv[:got], idx_crc)
                    os.write(out_fd, mv[:got])
            if not in_place:
                os.lseek(out_fd, base, os.SEEK_SET)
                src = os.open(self._pay_path, os.O_RDONLY)
                try:
                    _copy_range(src, out_fd, self._pos, self._base)
                finally:
                    os.close(src)
            os.lseek(out_fd, base + self._pos, os.SEEK_SET)
            meta_off = 0
            table = TRAILER_SIZE * self._meta_blocks
            meta_crc = self._meta_crc
            if self._meta_size:
                meta_off = base + self._pos
                _copy_range(self._meta.fileno(), out_fd, self._meta_size, 0)
                if table:  # the block CRC table follows the section; the section CRC covers it too
                    self._mcrc.seek(0)
                    done = 0
                    while done < table:  # in 1 MiB steps: constant memory for any N
                        crcs = self._mcrc.read(min(1 << 20, table - done))
                        if not crcs:
                            raise OSError(f"short read of the metadata CRC spool ({done} of {table} bytes)")
                        meta_crc = crc32(crcs, meta_crc)
                        done += len(crcs)
                    _copy_range(self._mcrc.fileno(), out_fd, table, 0)
            flags = self._flags()
            if warp_metadata and self.extensions:
                flags |= F_WARP_METADATA
            hdr = Header(n, base, meta_off, self._meta_size, flags, 0,
                         idx_crc if self.extensions else 0,
                         meta_crc if table else 0, self._meta_blocks if table else 0)
            os.pwrite(out_fd, hdr.pack(), 0)
            os.ftruncate(out_fd, base + self._pos + self._meta_size + table)
            if self.fsync:
                os.fsync(out_fd)
            os.fchmod(out_fd, 0o644)
            os.replace(self._out_path, self.path)
            self._tmp.remove(self._out_path)
            if self.fsync:
                fsync_dir(self.path.parent)
        except BaseException:
            self.abort()
            raise
        self._cleanup()
        return self.path

    def abort(self) -> None:
        """Discard everything: no output file, no temporary files."""
        self._cleanup()

    def _cleanup(self) -> None:
        self._closed = True
        for name in ("_pay", "_idx", "_meta", "_mcrc"):
            f = getattr(self, name, None)
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        if getattr(self, "_out_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._out_fd)
            self._out_fd = -1
        for p in self._tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        self._tmp = []



def write_tbl(path: str | os.PathLike, samples: Iterable[bytes], **kwargs: Any) -> Path:
    """Write ``samples`` (payload bytes) to ``path``; formats and sizes from headers."""
    with TblWriter(path, **kwargs) as w:
        for s in samples:
            w.add(s)
    return Path(path)


# ---------------------------------------------------------------- reader ----
class TblReader:
    """Random access to a .tbl file through mmap.

    ``reader[i]`` / :meth:`read` returns the sample's bytes: a zero-copy
    ``memoryview`` into the map for uncompressed entries, ``bytes`` for
    compressed ones. With ``verify=True`` every read checks the payload
    CRC-32 trailer when the file has them, else TurboLoader's CRC-16.
    Views stay valid while the reader is open.
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True) -> None:
        self.path = str(path)
        self.verify = verify
        if os.path.isdir(self.path):
            raise MissingInputError(f"{self.path} is a directory, not a .tbl file",
                                    hint="give the path of a .tbl file")
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise MissingInputError(f"{self.path}: no such file",
                                    hint="check the path; create one with 'warp tar-to-tbl IN OUT'") from None
        try:
            self.file_size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER_SIZE, 0)
            self.header = parse_header(head, self.path, self.file_size)
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.file_size else None
        finally:
            os.close(fd)
        h = self.header
        self.num_samples = h.num_samples
        self._trailer = TRAILER_SIZE if h.flags & F_PAYLOAD_CRC32 else 0
        self._view = memoryview(self._mm) if self._mm is not None else memoryview(b"")
        self.index = np.frombuffer(self._mm, ENTRY_DTYPE, count=h.num_samples, offset=HEADER_SIZE) \
            if h.num_samples else np.zeros(0, ENTRY_DTYPE)
        if h.flags & F_INDEX_CRC32:
            computed = crc32(self._view[HEADER_SIZE:h.header_size])
            if computed != h.index_crc:
                raise ChecksumMismatch(
                    f"{self.path}: index table CRC-32 mismatch (stored {h.index_crc:08x}, computed {computed:08x})",
                    path=self.path, offset=HEADER_SIZE, check="index-crc32", stored=h.index_crc, computed=computed)
        self._check_index()
        # payload [start, end) per sample as machine ints: indexing an array.array
        # gives a Python int in ~30 ns (a numpy scalar or a struct unpack costs
        # 3-5x that), and the per-read overhead is what remains once the CRC
        # streams at memory speed
        idx = self.index
        self._starts = array("q", idx["offset"].astype(np.int64).tobytes())
        self._ends = array("q", (idx["offset"].astype(np.int64) + idx["size"]).tobytes())
        # warp's own files: no compressed entry and a CRC-32 trailer on every
        # payload, so a verified read is one CRC over payload + trailer
        self._fast = bool(self._trailer) and not bool((idx["flags"] & (E_LZ4 | E_ZSTD)).any())
        self._closed = False
        self._meta_crc = bool(h.flags & F_META_CRC32)
        self._meta_loc: np.ndarray | None = None
        self._keys: dict[str, int] | None = None

    # -- validation ------------------------------------------------------
    def _check_index(self) -> None:
        idx, h = self.index, self.header
        if not len(idx):
            return
        end = h.metadata_offset or self.file_size
        # offsets are u64: ones >= 2^63 turn negative in int64 (caught by < header_size),
        # and comparing span with end - off never overflows (off + span could)
        off = idx["offset"].astype(np.int64, copy=False)
        span = idx["size"].astype(np.int64) + self._trailer
        bad = np.flatnonzero((off < h.header_size) | (off > end) | (span > end - off))
        if len(bad):
            i = int(bad[0])
            o, s = int(idx["offset"][i]), int(span[i])
            cls = TruncatedFile if o + s > self.file_size and o >= h.header_size else CorruptIndex
            raise cls(f"{self.path}: sample {i} at [{o}, {o + s}) lies outside the payload region "
                      f"[{h.header_size}, {end}) ({len(bad)} bad entries)",
                      path=self.path, sample=i, offset=o, bad_entries=len(bad))
        flags = idx["flags"]
        size, usize = idx["size"].astype(np.int64), idx["usize"].astype(np.int64)
        comp = (flags & (E_LZ4 | E_ZSTD)) != 0
        lz4_only = (flags & E_LZ4 != 0) & (flags & E_ZSTD == 0)
        bad = np.flatnonzero((~comp & (size != usize)) | (comp & (size >= usize) & (usize > 0))
                             | (lz4_only & (usize > size * LZ4_MAX_RATIO + 16)))
        if len(bad):
            i = int(bad[0])
            raise CorruptIndex(f"{self.path}: sample {i} has implausible sizes (stored {int(size[i])}, "
                               f"uncompressed {int(usize[i])}, flags {int(flags[i]):#x})",
                               path=self.path, sample=i, offset=HEADER_SIZE + ENTRY_SIZE * i)
        order = np.argsort(off, kind="stable")
        so = off[order]
        overlap = np.flatnonzero(so[:-1] + span[order][:-1] > so[1:])
        if len(overlap):
            a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
            raise CorruptIndex(f"{self.path}: samples {a} and {b} overlap at offset {int(off[b])}",
                               path=self.path, sample=b, offset=int(off[b]))

    # -- basic access ----------------------------------------------------
    def __len__(self) -> int:
        return self.num_samples

    def _entry(self, i: int) -> tuple[int, int, int, int, int]:
        n = self.num_samples
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self.path}: sample index {i} out of range (file has {n} samples)")
        off, size, usize, _w, _h, _fmt, flags, c16 = ENTRY.unpack_from(self._view, HEADER_SIZE + ENTRY_SIZE * i)
        return off, size, usize, flags, c16

    def raw(self, i: int) -> memoryview:
        """The stored bytes of sample ``i`` (compressed if it is), zero-copy, unchecked."""
        off, size, _u, _f, _c = self._entry(i)
        return self._view[off:off + size]

    def _range_error(self, i) -> IndexError:
        if self._closed:
            return IndexError(f"{self.path}: the reader is closed")
        return IndexError(f"{self.path}: sample index {i} out of range (file has {self.num_samples} samples)")

    def read(self, i: int, verify: bool | None = None):
        """The sample's uncompressed bytes (``memoryview`` when stored uncompressed).

        ``verify`` overrides the reader's setting for this call. The hot path
        (warp files without compressed entries) is one CRC-32 over the payload
        and its trailer, checked against the CRC residue, and a zero-copy slice.
        """
        try:
            a = self._starts[i]
            b = self._ends[i]
        except IndexError:
            raise self._range_error(i) from None
        if self._fast:
            view = self._view
            if (self.verify if verify is None else verify) and _isal_crc32(view[a:b + 4]) != CRC32_RESIDUE:
                if i < 0:
                    i += self.num_samples
                (stored,) = struct.unpack_from("<I", view, b)
                raise self._crc_error(i, a, "payload-crc32", stored, crc32(view[a:b]))
            return view[a:b]
        return self._read_entry(i + self.num_samples if i < 0 else i, verify)

    def _read_entry(self, i: int, verify: bool | None):
        off, size, usize, _w, _h, _fmt, flags, c16 = ENTRY.unpack_from(self._view, HEADER_SIZE + ENTRY_SIZE * i)
        data = self._view[off:off + size]
        check = self.verify if verify is None else verify
        if check and self._trailer:
            (stored,) = struct.unpack_from("<I", self._view, off + size)
            computed = crc32(data)
            if computed != stored:
                raise self._crc_error(i, off, "payload-crc32", stored, computed)
        if flags & (E_LZ4 | E_ZSTD):
            data = self._decompress(i, off, data, usize, flags)
            if check and not self._trailer:
                self._check16(i, off, data, c16)
        elif check and not self._trailer:
            self._check16(i, off, data, c16)
        return data

    __getitem__ = read

    def _check16(self, i: int, off: int, data, stored: int) -> None:
        computed = fastcrc.crc16.modbus(data)
        if computed != stored:
            raise self._crc_error(i, off, "crc16", stored, computed)

    def _crc_error(self, i: int, off: int, check: str, stored: int, computed: int) -> ChecksumMismatch:
        key = self._key_or_none(i)
        name = f"sample {i}" + (f" ({key!r})" if key else "")
        return ChecksumMismatch(
            f"{self.path}: {name} at offset {off}: {check} mismatch (stored {stored:#x}, computed {computed:#x})",
            hint="the file is damaged; run 'warp inspect --verify' to list every corrupt sample, then re-create it",
            path=self.path, sample=i, offset=off, check=check, stored=stored, computed=computed)

    def _decompress(self, i: int, off: int, data, usize: int, flags: int) -> bytes:
        try:
            if flags & E_ZSTD:
                out = _zstd_d().decompress(data, max_output_size=usize)
            else:
                import lz4.block

                out = lz4.block.decompress(data, uncompressed_size=usize)
        except Exception as e:
            raise DecompressionError(f"{self.path}: sample {i} at offset {off}: {entry_codec(flags)} "
                                     f"decompression failed ({e})", path=self.path, sample=i, offset=off) from None
        if len(out) != usize:
            raise DecompressionError(f"{self.path}: sample {i} at offset {off}: decompressed to {len(out)} "
                                     f"bytes, index says {usize}", path=self.path, sample=i, offset=off)
        return out

    def info(self, i: int) -> SampleInfo:
        n = self.num_samples
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"{self.path}: sample index {i} out of range (file has {n} samples)")
        off, size, usize, w, h, fmt, flags, c16 = ENTRY.unpack_from(self._view, HEADER_SIZE + ENTRY_SIZE * j)
        return SampleInfo(j, off, size, usize, w, h, FORMATS.get(fmt, f"format-{fmt}"), entry_codec(flags),
                          bool(flags & E_HAS_METADATA), c16)

    def __iter__(self) -> Iterator:
        for i in range(self.num_samples):
            yield self.read(i)

    # -- metadata --------------------------------------------------------
    def _walk_metadata(self) -> Iterator[tuple[int, int, int, int, int]]:
        """(block number, block offset, sample index, data size, type) of each metadata block, in order.

        Raises :class:`CorruptMetadata` where the blocks do not tile the section.
        """
        n = self.num_samples
        h = self.header
        pos, end = h.metadata_offset, h.metadata_offset + h.metadata_size
        view = self._view
        unpack = META_BLOCK.unpack_from
        k = 0
        while h.metadata_offset and pos < end:
            if pos + META_BLOCK_SIZE > end:
                raise CorruptMetadata(f"{self.path}: metadata block header at offset {pos} is cut short",
                                      path=self.path, offset=pos)
            si, size, typ, _r = unpack(view, pos)
            data_at = pos + META_BLOCK_SIZE
            if si >= n or data_at + size > end:
                raise CorruptMetadata(f"{self.path}: metadata block at offset {pos} names sample {si} "
                                      f"with {size} bytes (file has {n} samples, section ends at {end})",
                                      path=self.path, offset=pos, sample=int(si))
            yield k, pos, si, size, typ
            k += 1
            pos = data_at + size
        if self._meta_crc and k != h.meta_blocks:
            raise CorruptMetadata(f"{self.path}: the metadata section holds {k} blocks, the header "
                                  f"announces {h.meta_blocks}", path=self.path, offset=h.metadata_offset)

    def _block_crc(self, k: int, pos: int, size: int) -> tuple[int, int]:
        """(stored, computed) CRC-32 of metadata block ``k`` (16-byte header + data) at ``pos``."""
        h = self.header
        at = h.metadata_offset + h.metadata_size + TRAILER_SIZE * k
        if k >= h.meta_blocks or at + TRAILER_SIZE > len(self._view):  # the table holds meta_blocks entries
            raise CorruptMetadata(f"{self.path}: metadata block {k} at offset {pos} has no CRC in the block CRC "
                                  f"table (the header announces {h.meta_blocks} blocks; its CRC would be at "
                                  f"offset {at}, the file has {len(self._view)} bytes)",
                                  path=self.path, offset=pos)
        (stored,) = struct.unpack_from("<I", self._view, at)
        return stored, crc32(self._view[pos:pos + META_BLOCK_SIZE + size])

    def _section_crc(self) -> tuple[int, int]:
        """(stored, computed) CRC-32 of the metadata section and its block CRC table."""
        h = self.header
        end = h.metadata_offset + h.metadata_size + TRAILER_SIZE * h.meta_blocks
        return h.meta_crc, crc32(self._view[h.metadata_offset:end])

    def _metadata_problems(self) -> list[CorruptSample]:
        """Every failed metadata check (section CRC, block CRCs, structure), for :meth:`verify_all`."""
        h = self.header
        out: list[CorruptSample] = []
        if self._meta_crc:
            stored, computed = self._section_crc()
            if stored != computed:
                out.append(CorruptSample(-1, h.metadata_offset, "metadata-section-crc32", stored, computed,
                                         f"metadata section at offset {h.metadata_offset}: CRC-32 stored "
                                         f"{stored:08x}, computed {computed:08x}"))
        try:
            for k, pos, si, size, typ in self._walk_metadata():
                if self._meta_crc:
                    stored, computed = self._block_crc(k, pos, size)
                    if stored != computed:
                        out.append(CorruptSample(int(si), pos, "metadata-crc32", stored, computed,
                                                 f"sample {si}: metadata block {k} at offset {pos}: CRC-32 "
                                                 f"stored {stored:08x}, computed {computed:08x}"))
                        continue
                elif typ == META_JSON:  # no CRCs (older or TurboLoader files): at least it must parse
                    try:
                        json.loads(bytes(self._view[pos + META_BLOCK_SIZE:pos + META_BLOCK_SIZE + size]))
                    except ValueError as e:
                        out.append(CorruptSample(int(si), pos, "metadata-json", None, None,
                                                 f"sample {si}: metadata block {k} at offset {pos} is not "
                                                 f"valid JSON ({e})"))
        except CorruptMetadata as e:
            out.append(CorruptSample(-1, int(e.details.get("offset", h.metadata_offset)), "metadata", None, None,
                                     e.message))
        return out

    def _metadata_locations(self) -> np.ndarray:
        """(offset, size, type, block number) of each sample's first metadata block; offset -1 = none.

        With F_META_CRC32 the section CRC is checked first (one pass, C speed),
        so nothing is parsed from bytes that changed since they were written.
        """
        if self._meta_loc is not None:
            return self._meta_loc
        h = self.header
        if self._meta_crc:
            stored, computed = self._section_crc()
            if stored != computed:
                bad = next((p for p in self._metadata_problems() if p.check != "metadata-section-crc32"), None)
                where = f"; first bad block: {bad.message}" if bad else ""
                raise ChecksumMismatch(
                    f"{self.path}: metadata section CRC-32 mismatch (stored {stored:08x}, computed "
                    f"{computed:08x}){where}",
                    hint="the file's metadata (keys, sidecars) is damaged; re-create it with 'warp tar-to-tbl'",
                    path=self.path, offset=h.metadata_offset, check="metadata-section-crc32", stored=stored,
                    computed=computed, sample=bad.index if bad else -1)
        loc = np.full((self.num_samples, 4), -1, np.int64)
        for k, pos, si, size, typ in self._walk_metadata():
            if loc[si, 0] < 0:  # first block wins, as in TurboLoader's linear scan
                loc[si] = (pos + META_BLOCK_SIZE, size, typ, k)
        self._meta_loc = loc
        return loc

    def metadata_raw(self, i: int, verify: bool | None = None) -> tuple[memoryview, int] | None:
        """(bytes, type) of sample ``i``'s metadata block, or None; its block CRC checked if verifying."""
        j = self.info(i).index
        off, size, typ, k = self._metadata_locations()[j].tolist()
        if off < 0:
            return None
        if self._meta_crc and (self.verify if verify is None else verify):
            stored, computed = self._block_crc(k, off - META_BLOCK_SIZE, size)
            if stored != computed:
                raise ChecksumMismatch(
                    f"{self.path}: sample {j}: metadata block {k} at offset {off - META_BLOCK_SIZE}: CRC-32 "
                    f"mismatch (stored {stored:#x}, computed {computed:#x})",
                    hint="the file's metadata is damaged; run 'warp inspect --verify' to list every corrupt "
                         "block, then re-create it",
                    path=self.path, sample=j, offset=off - META_BLOCK_SIZE, check="metadata-crc32",
                    stored=stored, computed=computed)
        return self._view[off:off + size], int(typ)

    def metadata(self, i: int) -> Any:
        """Sample ``i``'s metadata: parsed JSON for JSON blocks, bytes otherwise, None if absent."""
        got = self.metadata_raw(i)
        if got is None:
            return None
        data, typ = got
        if typ != META_JSON:
            return bytes(data)
        try:
            return json.loads(bytes(data))
        except ValueError as e:
            raise CorruptMetadata(f"{self.path}: sample {i}: metadata is not valid JSON ({e})",
                                  path=self.path, sample=i) from None

    def _key_or_none(self, i: int) -> str | None:
        try:
            m = self.metadata(i) if self.header.flags & F_WARP_METADATA else None
        except (TblError, IndexError):
            return None
        return m.get("key") if isinstance(m, dict) else None

    def key(self, i: int) -> str | None:
        """The WebDataset key of sample ``i`` (from warp JSON metadata), or None."""
        m = self.metadata(i)
        return m.get("key") if isinstance(m, dict) and isinstance(m.get("key"), str) else None

    def index_of(self, key: str) -> int:
        """The index of the sample with WebDataset key ``key``; O(1) after the first call."""
        if self._keys is None:
            keys: dict[str, int] = {}
            for i in range(self.num_samples):
                k = self.key(i)
                if k is not None:
                    keys.setdefault(k, i)
            self._keys = keys
        try:
            return self._keys[key]
        except KeyError:
            raise SampleNotFound(f"{self.path}: no sample with key {key!r}",
                                 hint="list keys with 'warp inspect --head N FILE'", path=self.path,
                                 key=key) from None

    def get(self, key: str):
        """The bytes of the sample with key ``key``."""
        return self.read(self.index_of(key))

    # -- selection without decoding ---------------------------------------
    def filter(self, *, min_width: int = 0, min_height: int = 0, max_width: int | None = None,
               max_height: int | None = None, formats: Iterable[str] | None = None,
               predicate: Callable[[SampleInfo], bool] | None = None) -> np.ndarray:
        """Indices (int64 array) of samples whose cached size/format match."""
        idx = self.index
        keep = (idx["width"] >= min_width) & (idx["height"] >= min_height)
        if max_width is not None:
            keep &= idx["width"] <= max_width
        if max_height is not None:
            keep &= idx["height"] <= max_height
        if formats is not None:
            codes = [FORMAT_CODES[f] for f in formats if f in FORMAT_CODES]
            keep &= np.isin(idx["format"], codes)
        out = np.flatnonzero(keep).astype(np.int64)
        if predicate is not None:
            out = np.array([i for i in out.tolist() if predicate(self.info(i))], dtype=np.int64)
        return out

    # -- whole-file checks ------------------------------------------------
    def verify_all(self, progress: Callable[[int], None] | None = None) -> list[CorruptSample]:
        """Check every payload CRC-32 trailer and CRC-16 (after decompression) and the metadata CRCs; list all failures."""
        problems: list[CorruptSample] = []
        for i in range(self.num_samples):
            off, size, usize, flags, c16 = self._entry(i)
            data = self._view[off:off + size]
            if self._trailer:
                (stored,) = struct.unpack_from("<I", self._view, off + size)
                computed = crc32(data)
                if computed != stored:
                    problems.append(CorruptSample(i, off, "payload-crc32", stored, computed,
                                                  f"sample {i} at offset {off}: payload CRC-32 stored "
                                                  f"{stored:08x}, computed {computed:08x}"))
                    if progress:
                        progress(i + 1)
                    continue
            if flags & (E_LZ4 | E_ZSTD):
                try:
                    data = self._decompress(i, off, data, usize, flags)
                except DecompressionError as e:
                    problems.append(CorruptSample(i, off, "decompress", None, None, e.message))
                    continue
            computed = crc16(data)
            if computed != c16:
                problems.append(CorruptSample(i, off, "crc16", c16, computed,
                                              f"sample {i} at offset {off}: CRC-16 stored {c16:04x}, "
                                              f"computed {computed:04x}"))
            if progress and (i & 1023) == 1023:
                progress(i + 1)
        if self.header.metadata_size:
            problems.extend(self._metadata_problems())
        return problems

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Release the map. Views handed out keep it alive until they are dropped."""
        self.index = np.zeros(0, ENTRY_DTYPE)
        self._starts, self._ends, self._closed = array("q"), array("q"), True
        with contextlib.suppress(BufferError):
            self._view.release()
        if self._mm is not None:
            # with views still exported the map closes when they are collected
            with contextlib.suppress(BufferError):
                self._mm.close()

    def __enter__(self) -> TblReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # an mmap cannot be pickled (and copying it would copy the file):
        # workers reopen by path (docs/design.md §4)
        return {"path": self.path, "verify": self.verify}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], verify=state["verify"])

