"""TBL v2 streaming writer (docs/formats/tbl-v2.md): :class:`TblWriter` spools payloads, index
entries and metadata blocks beside the output and assembles the file on close; see
:mod:`warpdata.formats.tbl` for the contract.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from array import array
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.core.atomic import TMP_PREFIX, CommitOnSuccess, fsync_dir
from warpdata.core.directio import BLOCK, AlignedFile, aligned_empty, wants_direct
from warpdata.core.errors import DataError, UsageError
from warpdata.formats.imageinfo import image_info, sniff_format
from warpdata.formats.tbl_layout import (
    _BIG_ENDIAN,
    _U32,
    COMPRESSIONS,
    E_HAS_METADATA,
    E_LZ4,
    E_ZSTD,
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    F_COMPRESSED,
    F_HAS_CHECKSUMS,
    F_HAS_METADATA,
    F_INDEX_CRC32,
    F_META_CRC32,
    F_PAYLOAD_CRC32,
    F_WARP_METADATA,
    F_ZSTD,
    HEADER_SIZE,
    META_BLOCK,
    META_BLOCK_SIZE,
    META_JSON,
    TRAILER_SIZE,
    EncodedSample,
    Header,
    canonical_json,
    crc32,
    encode_sample,
)


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
