"""A Parquet shard's footer and page locations, compact enough to travel in the manifest.

Spec: ``docs/formats/registry.md`` ("Page index in the manifest") and ``docs/partitioning.md``
("Requests before the first batch"). A reader that takes part of a row group by pages needs the
shard's footer and the offset index of each column it reads: two ranged GETs per shard before
the pages themselves. A published shard's ``stats.page_index`` carries both, so a node's first
data request follows the manifest directly.

Encoding (before zstd, then base64 in the JSON manifest)::

    b"WPI1"
    varint footer length, footer bytes     # the file's last bytes: Thrift FileMetaData, length, "PAR1"
    varint row groups
      per row group: varint leaf columns
        per leaf: varint pages (0: the chunk has no offset index)
          per page: zigzag(offset - (previous offset + previous size)),   # 0 for back-to-back pages
                    zigzag(size - previous size),
                    zigzag(first_row - previous first_row - previous step)

A page's first offset and row are stored against 0. Pages of a written file follow one another
and hold the same row count, so nearly every number is 0 and zstd leaves about one byte per page
of each column (4.5 KB for the offset indexes of a 1,000,000-row, 5-column table that takes
265 KB as Thrift).

Decoding is bounded: the decompressed size is checked against the frame before allocation
(:mod:`warpdata.formats.bounded`), every count against what the footer says, every page location
with the checks :func:`warpdata.formats.parquet_pages.pages_for_rows` applies to an offset
index read from the file; a violation is :class:`~warpdata.formats.parquet_pages.ParquetPagesError`.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from warpdata.formats import bounded
from warpdata.formats import parquet_pages as pp

MAGIC = b"WPI1"
#: decoded bytes a page index may take: 16 bytes a page of each column of ~1 M pages
MAX_DECODED = 64 << 20
#: the base64 text of one shard's page index in a manifest
MAX_TEXT = 24 << 20


@dataclass(frozen=True)
class PageIndex:
    """A shard's footer bytes and, per row group and leaf column, its pages (None: no offset index)."""

    footer: bytes
    pages: tuple[tuple[tuple[pp.Page, ...] | None, ...], ...]

    def chunk(self, fmd: dict, group: int, leaf: int) -> pp.ChunkPages | None:
        """The :class:`~warpdata.formats.parquet_pages.ChunkPages` of a column chunk, or None."""
        if not 0 <= group < len(self.pages) or not 0 <= leaf < len(self.pages[group]):
            raise pp.ParquetPagesError(f"row group {group} column {leaf} is not in the page index")
        locs = self.pages[group][leaf]
        return None if locs is None else pp.chunk_pages(fmd, group, leaf, locs)


def _varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) ^ (n >> 63) if -(1 << 63) <= n < (1 << 63) else 0)


def encode(footer: bytes, pages: list[list[list[pp.Page] | None]]) -> bytes:
    """The uncompressed page index of a shard (see the module's docstring)."""
    out = bytearray(MAGIC)
    _varint(out, len(footer))
    out += footer
    _varint(out, len(pages))
    for group in pages:
        _varint(out, len(group))
        for locs in group:
            if not locs:
                _varint(out, 0)
                continue
            _varint(out, len(locs))
            end = size = first = step = 0
            for p in locs:
                _zigzag(out, p.offset - end)
                _zigzag(out, p.size - size)
                _zigzag(out, p.first_row - first - step)
                step = p.first_row - first
                end, size, first = p.offset + p.size, p.size, p.first_row
    return bytes(out)


def to_text(raw: bytes) -> str:
    """``raw`` compressed (zstd, level 19: deterministic) and base64-encoded for the manifest."""
    import zstandard

    return base64.b64encode(zstandard.ZstdCompressor(level=19).compress(raw)).decode("ascii")


def of_file(path: str) -> str | None:
    """The page index text of a Parquet file, or None where a column chunk has no offset index."""
    import os
    import struct

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 12:
            return None
        f.seek(size - 8)
        n = struct.unpack("<I", f.read(4))[0]
        if n + 12 > size:
            return None
        f.seek(size - 8 - n)
        footer = f.read(n + 8)
        fmd = pp.footer_of(footer)
        groups = []
        for g in range(pp.row_group_count(fmd)):
            leaves = []
            for leaf in range(pp.leaf_count(fmd, g)):
                r = pp.offset_index(fmd, g, leaf)
                if r is None or r[0] + r[1] > size:
                    return None
                f.seek(r[0])
                leaves.append(list(pp.pages_for_rows(fmd, g, leaf, f.read(r[1])).pages))
            groups.append(leaves)
    return to_text(encode(footer, groups))


class _In:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def varint(self) -> int:
        n = shift = 0
        while True:
            if self.pos >= len(self.buf) or shift > 63:
                raise pp.ParquetPagesError("page index: truncated or overlong number")
            b = self.buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)


def decode(text: str, where: str = "page index") -> PageIndex:
    """The :class:`PageIndex` a manifest's ``stats.page_index`` holds; ParquetPagesError when it is
    not one (bounded in memory by :data:`MAX_DECODED`)."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise pp.ParquetPagesError(f"{where}: not a page index of at most {MAX_TEXT} characters")
    try:
        frame = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise pp.ParquetPagesError(f"{where}: not base64") from None
    import zstandard

    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise pp.ParquetPagesError(f"{where}: not a zstd frame ({e})") from None
    if not 0 < declared <= MAX_DECODED:
        raise pp.ParquetPagesError(f"{where}: declares {declared} bytes (at most {MAX_DECODED})")
    raw = bounded.zstd(frame, declared, where=where, error=pp.ParquetPagesError)
    if raw[:4] != MAGIC:
        raise pp.ParquetPagesError(f"{where}: no {MAGIC.decode()} header")
    r = _In(raw)
    r.pos = 4
    n = r.varint()
    if n > len(raw) - r.pos:
        raise pp.ParquetPagesError(f"{where}: footer length {n} runs past the index")
    footer = raw[r.pos:r.pos + n]
    r.pos += n
    fmd = pp.footer_of(footer)
    groups = r.varint()
    if groups != pp.row_group_count(fmd):
        raise pp.ParquetPagesError(f"{where}: {groups} row groups, the footer has {pp.row_group_count(fmd)}")
    out = []
    for g in range(groups):
        leaves = r.varint()
        if leaves != pp.leaf_count(fmd, g):
            raise pp.ParquetPagesError(f"{where}: row group {g} has {leaves} columns, the footer {pp.leaf_count(fmd, g)}")
        row = []
        for _ in range(leaves):
            count = r.varint()
            if count > len(raw) - r.pos:  # each page takes at least 3 bytes
                raise pp.ParquetPagesError(f"{where}: row group {g} claims {count} pages")
            if not count:
                row.append(None)
                continue
            locs = []
            end = size = first = step = 0
            for _ in range(count):
                off = end + r.zigzag()
                size = size + r.zigzag()
                nxt = first + step + r.zigzag()
                step, first = nxt - first, nxt
                locs.append(pp.Page(off, size, first))
                end = off + size
            row.append(tuple(locs))
        out.append(tuple(row))
    if r.pos != len(raw):
        raise pp.ParquetPagesError(f"{where}: {len(raw) - r.pos} bytes after the last page")
    return PageIndex(footer, tuple(out))
