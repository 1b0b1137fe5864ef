"""TBL v2 memory-mapped reader (docs/formats/tbl-v2.md): :class:`TblReader` validates the header,
the index and every entry at open and serves zero-copy payloads; see :mod:`warpdata.formats.tbl`
for the contract.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import fastcrc
import numpy as np
from isal.isal_zlib import crc32 as _isal_crc32
from warpdata.core.errors import MissingInputError
from warpdata.formats import bounded
from warpdata.formats.tbl_layout import (
    CRC32_RESIDUE,
    E_HAS_METADATA,
    E_LZ4,
    E_ZSTD,
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    F_INDEX_CRC32,
    F_META_CRC32,
    F_PAYLOAD_CRC32,
    F_WARP_METADATA,
    FORMAT_CODES,
    FORMATS,
    HEADER_SIZE,
    LZ4_MAX_RATIO,
    META_BLOCK,
    META_BLOCK_SIZE,
    META_JSON,
    TRAILER_SIZE,
    ChecksumMismatch,
    CorruptIndex,
    CorruptMetadata,
    CorruptSample,
    DecompressionError,
    FrameSizeMismatch,
    SampleInfo,
    SampleNotFound,
    TblError,
    TruncatedFile,
    crc16,
    crc32,
    entry_codec,
    parse_header,
)

# ZSTD entries larger than this are decoded a piece at a time by verify_all (only their CRC-16 is
# needed), so `warp inspect --verify` stays bounded whatever the index says (docs/formats/tbl-v2.md)
VERIFY_WHOLE_BYTES = 64 << 20


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
        # bounded (formats/bounded.py): a frame declaring another size than the index's is refused
        # before anything is allocated (docs/formats/tbl-v2.md, "Limits and checks")
        codec = bounded.zstd if flags & E_ZSTD else bounded.lz4_block
        return codec(data, usize, where=f"{self.path}: sample {i} at offset {off}", source="the index says",
                     error=DecompressionError, size_error=FrameSizeMismatch, hint=TblError._HINT,
                     path=self.path, sample=i, offset=off)

    def _crc16_in_pieces(self, i: int, off: int, data, usize: int) -> int:
        """CRC-16 of a ZSTD entry's decoded bytes, decoded a piece at a time (``verify_all``): memory
        independent of the index's uncompressed size."""
        crc = None
        for piece in bounded.zstd_pieces(data, usize, where=f"{self.path}: sample {i} at offset {off}",
                                         source="the index says", error=DecompressionError,
                                         size_error=FrameSizeMismatch, hint=TblError._HINT, path=self.path,
                                         sample=i, offset=off):
            crc = crc16(piece) if crc is None else fastcrc.crc16.modbus(piece, initial=crc)
        return crc16(b"") if crc is None else crc

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
            try:
                if flags & E_ZSTD and usize > VERIFY_WHOLE_BYTES:
                    computed = self._crc16_in_pieces(i, off, data, usize)
                else:
                    if flags & (E_LZ4 | E_ZSTD):
                        data = self._decompress(i, off, data, usize, flags)
                    computed = crc16(data)
            except DecompressionError as e:
                problems.append(CorruptSample(i, off, "decompress", None, None, e.message))
                continue
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
