"""Rows of a Parquet row group read by pages: the page index, and a small file of just those pages.

Spec: ``docs/partitioning.md`` ("Reads aligned with storage"). A Parquet column chunk is a run
of pages; a file written with a page index (``write_page_index=True``) records, per column
chunk, an *offset index*: each data page's file offset, byte length and first row. A reader
that needs rows ``[lo, hi)`` of a row group then needs, per column, only the pages that hold
them (and the chunk's dictionary page), not the whole chunk.

pyarrow decodes whole row groups only, so the pages are handed to it as a file of their own
(:func:`slice_file`): ``PAR1``, then per column its dictionary page and the selected data
pages back to back, then a footer that is the original footer with one row group whose
column chunks point at those bytes (offsets, sizes and value counts rewritten; statistics,
page indexes and bloom filters left out, since they describe the whole chunk). Every byte of
a page is the original's, so what pyarrow decodes is what the full row group holds at those
rows.

The footer is Thrift's compact protocol; :func:`decode_struct` / :func:`encode_struct` read
and write any struct generically (field id → (type, value)), so fields this module does not
know survive a round trip.

Limits: every length, count and nesting depth read from the input is bounded
(:data:`MAX_DEPTH`, :data:`MAX_ITEMS`); a violation is :class:`ParquetPagesError`
(a ``DataError``, exit 65) naming what was wrong.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Any

from warpdata.core.errors import DataError

__all__ = ["ChunkPages", "ParquetPagesError", "Page", "chunk_pages", "decode_struct", "encode_struct",
           "footer_of", "leaf_count", "offset_index", "pages_for_rows", "row_group_count", "slice_file"]

MAX_DEPTH = 64  # Thrift struct/list nesting; Parquet's footer nests about 8 deep
MAX_ITEMS = 1 << 24  # elements of one list, bytes of one binary field

# compact-protocol type codes
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class ParquetPagesError(DataError):
    """A Parquet footer, offset index or page header that cannot be what it claims."""


# -- Thrift compact protocol ------------------------------------------------------------------
class _Reader:
    __slots__ = ("buf", "items", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, items: int = MAX_ITEMS) -> None:
        self.buf, self.pos, self.items = memoryview(buf), pos, items

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise ParquetPagesError("thrift data ends early")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ParquetPagesError("thrift varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or n > MAX_ITEMS or self.pos + n > len(self.buf):
            raise ParquetPagesError(f"thrift field of {n} bytes runs past its data")
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out


def _value(r: _Reader, t: int, depth: int) -> Any:
    if t in (_TRUE, _FALSE):  # a bool inside a container: one byte
        return r.byte() == _TRUE
    if t == _BYTE:
        return r.byte()
    if t in (_I16, _I32, _I64):
        return r.zigzag()
    if t == _DOUBLE:
        return struct.unpack("<d", r.take(8))[0]
    if t == _BINARY:
        return r.take(r.varint())
    if t in (_LIST, _SET):
        return _list(r, depth + 1)
    if t == _MAP:
        n = r.varint()
        if n > MAX_ITEMS:
            raise ParquetPagesError(f"thrift map of {n} entries")
        kv = r.byte() if n else 0
        return ("map", kv, [(_value(r, kv >> 4, depth + 1), _value(r, kv & 15, depth + 1)) for _ in range(n)])
    if t == _STRUCT:
        return _struct(r, depth + 1)
    raise ParquetPagesError(f"unknown thrift type {t}")


def _list(r: _Reader, depth: int) -> tuple[int, list]:
    if depth > MAX_DEPTH:
        raise ParquetPagesError(f"thrift data nests deeper than {MAX_DEPTH}")
    h = r.byte()
    n, t = h >> 4, h & 15
    if n == 15:
        n = r.varint()
    if n > r.items or n > len(r.buf) - r.pos:  # every element takes at least a byte
        raise ParquetPagesError(f"thrift list of {n} elements (at most {min(r.items, len(r.buf) - r.pos)} here)")
    return t, [_value(r, t, depth) for _ in range(n)]


def _struct(r: _Reader, depth: int) -> dict[int, tuple[int, Any]]:
    if depth > MAX_DEPTH:
        raise ParquetPagesError(f"thrift data nests deeper than {MAX_DEPTH}")
    out: dict[int, tuple[int, Any]] = {}
    fid = 0
    while True:
        h = r.byte()
        if h == 0:
            return out
        t, delta = h & 15, h >> 4
        fid = fid + delta if delta else r.zigzag()
        if t in (_TRUE, _FALSE):  # a bool field: the value is the type
            out[fid] = (_TRUE, t == _TRUE)
        else:
            out[fid] = (t, _value(r, t, depth))


def decode_struct(buf: bytes | memoryview, pos: int = 0,
                  items: int = MAX_ITEMS) -> tuple[dict[int, tuple[int, Any]], int]:
    """A compact-protocol struct at ``pos``: ``({field id: (type, value)}, end position)``; no
    list may hold more than ``items`` elements (nor more than the bytes left)."""
    r = _Reader(buf, pos, items)
    return _struct(r, 0), r.pos


def _w_varint(out: bytearray, n: int) -> None:
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _w_zigzag(out: bytearray, n: int) -> None:
    _w_varint(out, (n << 1) ^ (n >> 63))


def _w_value(out: bytearray, t: int, v: Any) -> None:
    if t in (_TRUE, _FALSE):
        out.append(_TRUE if v else _FALSE)
    elif t == _BYTE:
        out.append(v & 0xFF)
    elif t in (_I16, _I32, _I64):
        _w_zigzag(out, v)
    elif t == _DOUBLE:
        out += struct.pack("<d", v)
    elif t == _BINARY:
        _w_varint(out, len(v))
        out += v
    elif t in (_LIST, _SET):
        et, items = v
        if len(items) < 15:
            out.append(len(items) << 4 | et)
        else:
            out.append(0xF0 | et)
            _w_varint(out, len(items))
        for x in items:
            _w_value(out, et, x)
    elif t == _MAP:
        _, kv, items = v
        _w_varint(out, len(items))
        if items:
            out.append(kv)
        for k, x in items:
            _w_value(out, kv >> 4, k)
            _w_value(out, kv & 15, x)
    elif t == _STRUCT:
        _w_struct(out, v)
    else:
        raise ValueError(f"unknown thrift type {t}")


def _w_struct(out: bytearray, fields: dict[int, tuple[int, Any]]) -> None:
    last = 0
    for fid in sorted(fields):
        t, v = fields[fid]
        ht = (_TRUE if v else _FALSE) if t in (_TRUE, _FALSE) else t
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | ht)
        else:
            out.append(ht)
            _w_zigzag(out, fid)
        if t not in (_TRUE, _FALSE):
            _w_value(out, t, v)
        last = fid
    out.append(0)


def encode_struct(fields: dict[int, tuple[int, Any]]) -> bytes:
    """The compact-protocol bytes of a struct as :func:`decode_struct` returns it."""
    out = bytearray()
    _w_struct(out, fields)
    return bytes(out)


# -- Parquet structures --------------------------------------------------------------------------
# field ids from parquet.thrift (FileMetaData, RowGroup, ColumnChunk, ColumnMetaData, OffsetIndex,
# PageLocation, PageHeader)
FMD_ROW_GROUPS, FMD_NUM_ROWS = 4, 3
RG_COLUMNS, RG_TOTAL_BYTES, RG_NUM_ROWS, RG_FILE_OFFSET, RG_TOTAL_COMPRESSED, RG_ORDINAL = 1, 2, 3, 5, 6, 7
CC_FILE_OFFSET, CC_META, CC_OI_OFFSET, CC_OI_LENGTH, CC_CI_OFFSET, CC_CI_LENGTH = 2, 3, 4, 5, 6, 7
CM_PATH, CM_NUM_VALUES, CM_UNCOMPRESSED, CM_COMPRESSED = 3, 5, 6, 7
CM_DATA_PAGE_OFFSET, CM_INDEX_PAGE_OFFSET, CM_DICT_PAGE_OFFSET = 9, 10, 11
CM_KEEP = (1, 2, 3, 4, 5, 6, 7, 8, 9, 11)  # type, encodings, path, codec, counts, kv, offsets


def footer_of(footer: bytes) -> dict[int, tuple[int, Any]]:
    """The decoded FileMetaData of a footer (the file's last bytes: thrift, u32 length, ``PAR1``)."""
    if len(footer) < 12 or footer[-4:] != b"PAR1":
        raise ParquetPagesError("not a Parquet footer (no trailing PAR1)")
    n = struct.unpack("<I", footer[-8:-4])[0]
    if n + 8 > len(footer):
        raise ParquetPagesError(f"Parquet footer claims {n} bytes, {len(footer) - 8} are there")
    fmd, end = decode_struct(footer, len(footer) - 8 - n)
    if end != len(footer) - 8:
        raise ParquetPagesError("Parquet footer's length does not match its thrift data")
    return fmd


def _get(fields: dict, fid: int, default: Any = None) -> Any:
    got = fields.get(fid)
    return default if got is None else got[1]


@dataclass(frozen=True)
class Page:
    """A data page of a column chunk: file offset, bytes (header included), first row in the row group."""

    offset: int
    size: int
    first_row: int


@dataclass(frozen=True)
class ChunkPages:
    """What a reader needs to take pages out of one column chunk."""

    leaf: int  # the leaf column's index in the row group
    dict_range: tuple[int, int] | None  # (offset, length) of the dictionary page(s) before the first data page
    pages: tuple[Page, ...]
    rows: int  # rows of the row group

    def covering(self, lo: int, hi: int) -> tuple[int, int, int, int]:
        """``(first page, end page, first row, end row)``: the pages holding rows ``[lo, hi)``."""
        firsts = [p.first_row for p in self.pages]
        k = max(0, bisect.bisect_right(firsts, lo) - 1)
        m = max(k + 1, bisect.bisect_left(firsts, hi))
        end_row = self.pages[m].first_row if m < len(self.pages) else self.rows
        return k, m, self.pages[k].first_row, end_row

    def byte_range(self, k: int, m: int) -> tuple[int, int]:
        return self.pages[k].offset, self.pages[m - 1].offset + self.pages[m - 1].size - self.pages[k].offset


def offset_index(fmd: dict, group: int, leaf: int) -> tuple[int, int] | None:
    """(offset, length) of the offset index of column ``leaf`` of row group ``group``, or None."""
    rgs = _get(fmd, FMD_ROW_GROUPS, (0, []))[1]
    if not 0 <= group < len(rgs):
        raise ParquetPagesError(f"row group {group} is not in the footer ({len(rgs)} row groups)")
    cols = _get(rgs[group], RG_COLUMNS, (0, []))[1]
    if not 0 <= leaf < len(cols):
        raise ParquetPagesError(f"column {leaf} is not in row group {group}")
    off, n = _get(cols[leaf], CC_OI_OFFSET), _get(cols[leaf], CC_OI_LENGTH)
    return (off, n) if off is not None and n else None


def row_group_count(fmd: dict) -> int:
    """Row groups of a decoded footer."""
    return len(_get(fmd, FMD_ROW_GROUPS, (0, []))[1])


def leaf_count(fmd: dict, group: int) -> int:
    """Leaf column chunks of row group ``group`` of a decoded footer."""
    return len(_get(_get(fmd, FMD_ROW_GROUPS, (0, []))[1][group], RG_COLUMNS, (0, []))[1])


def pages_for_rows(fmd: dict, group: int, leaf: int, oi: bytes) -> ChunkPages:
    """The :class:`ChunkPages` of a column chunk from its offset index bytes ``oi``."""
    rows = _get(_get(fmd, FMD_ROW_GROUPS)[1][group], RG_NUM_ROWS, 0)
    index, end = decode_struct(oi, items=max(1, rows))  # a page holds at least one row
    if end != len(oi):
        raise ParquetPagesError(f"offset index of row group {group} column {leaf} has {len(oi) - end} extra bytes")
    locs = []
    for loc in _get(index, 1, (0, []))[1]:
        off, size, first = _get(loc, 1), _get(loc, 2), _get(loc, 3)
        if not (isinstance(off, int) and isinstance(size, int) and isinstance(first, int)):
            raise ParquetPagesError(f"offset index of row group {group} column {leaf} has a bad page location")
        locs.append(Page(off, size, first))
    return chunk_pages(fmd, group, leaf, locs)


def chunk_pages(fmd: dict, group: int, leaf: int, locs) -> ChunkPages:
    """The :class:`ChunkPages` of a column chunk from its page locations (an offset index's, or a
    manifest's page index: :mod:`warpdata.formats.parquet_index`), checked: in order, not
    overlapping, covering the row group's rows."""
    rgs = _get(fmd, FMD_ROW_GROUPS, (0, []))[1]
    if not 0 <= group < len(rgs):
        raise ParquetPagesError(f"row group {group} is not in the footer ({len(rgs)} row groups)")
    rg = rgs[group]
    rows = _get(rg, RG_NUM_ROWS, 0)
    cols = _get(rg, RG_COLUMNS, (0, []))[1]
    if not 0 <= leaf < len(cols):
        raise ParquetPagesError(f"column {leaf} is not in row group {group}")
    meta = _get(cols[leaf], CC_META) or {}
    pages: list[Page] = []
    for p in locs:
        if p.offset < 4 or p.size <= 0:
            raise ParquetPagesError(f"offset index of row group {group} column {leaf} has a bad page location")
        if pages and (p.first_row < pages[-1].first_row or p.offset < pages[-1].offset + pages[-1].size):
            raise ParquetPagesError(f"offset index of row group {group} column {leaf} is out of order")
        pages.append(p)
    if not pages or pages[0].first_row != 0 or pages[-1].first_row >= max(rows, 1):
        raise ParquetPagesError(f"offset index of row group {group} column {leaf} does not cover its {rows} rows")
    data_off = _get(meta, CM_DATA_PAGE_OFFSET)
    dict_off = _get(meta, CM_DICT_PAGE_OFFSET)
    dict_range = None
    if dict_off is not None and 4 <= dict_off < pages[0].offset:
        dict_range = (dict_off, pages[0].offset - dict_off)
    elif data_off is not None and 4 <= data_off < pages[0].offset:  # dictionary written as the first "data" page
        dict_range = (data_off, pages[0].offset - data_off)
    return ChunkPages(leaf, dict_range, tuple(pages), rows)


def _page_values(buf: bytes, start: int, end: int) -> tuple[int, int]:
    """(values, uncompressed bytes incl. headers) of the pages in ``buf[start:end]``."""
    values = unc = 0
    pos = start
    while pos < end:
        h, hend = decode_struct(buf, pos)
        comp = _get(h, 3)
        if not isinstance(comp, int) or comp < 0 or hend + comp > end:
            raise ParquetPagesError("a page header's size runs past its pages")
        unc += (hend - pos) + (_get(h, 2) or 0)
        dp = _get(h, 5) or _get(h, 8)
        if dp is not None:
            values += _get(dp, 1, 0)
        pos = hend + comp
    return values, unc


def slice_file(footer: bytes, group: int, chunks: dict[int, tuple[ChunkPages, int, int]],
               data: dict[tuple[int, int], bytes]) -> tuple[bytes, int, int]:
    """A Parquet file holding rows of row group ``group`` for the leaf columns in ``chunks``.

    ``chunks``: leaf index → (its :class:`ChunkPages`, first page, end page), every leaf
    covering the same rows; ``data``: the bytes of each ``(offset, length)`` range named by
    those (dictionary ranges and :meth:`ChunkPages.byte_range`). Returns ``(file bytes,
    first row, end row)`` of the row group the file holds. Leaves not in ``chunks`` keep their
    original metadata and must not be read from the result.
    """
    fmd = footer_of(footer)
    rgs = _get(fmd, FMD_ROW_GROUPS)[1]
    rg = dict(rgs[group])
    cols = list(_get(rg, RG_COLUMNS)[1])
    body = bytearray(b"PAR1")
    span = None
    total_unc = 0
    for leaf, (cp, k, m) in sorted(chunks.items()):
        first, end = cp.pages[k].first_row, (cp.pages[m].first_row if m < len(cp.pages) else cp.rows)
        if span is None:
            span = (first, end)
        elif span != (first, end):
            raise ParquetPagesError(f"column {leaf} pages cover rows {first}..{end}, not {span[0]}..{span[1]}")
        start = len(body)
        dict_values = dict_unc = 0
        if cp.dict_range is not None:
            d = data[cp.dict_range]
            body += d
            dict_values, dict_unc = _page_values(d, 0, len(d))  # a dictionary page has no data values
        page_start = len(body)
        pages = data[cp.byte_range(k, m)]
        body += pages
        values, unc = _page_values(pages, 0, len(pages))
        old = _get(cols[leaf], CC_META)
        meta = {f: old[f] for f in CM_KEEP if f in old}
        meta[CM_NUM_VALUES] = (_I64, values + dict_values)
        meta[CM_UNCOMPRESSED] = (_I64, unc + dict_unc)
        meta[CM_COMPRESSED] = (_I64, len(body) - start)
        meta[CM_DATA_PAGE_OFFSET] = (_I64, page_start)
        if cp.dict_range is not None and CM_DICT_PAGE_OFFSET in old:
            meta[CM_DICT_PAGE_OFFSET] = (_I64, start)
        elif cp.dict_range is not None:  # dictionary as the first "data" page
            meta[CM_DATA_PAGE_OFFSET] = (_I64, start)
        total_unc += unc + dict_unc
        cols[leaf] = {CC_FILE_OFFSET: (_I64, start), CC_META: (_STRUCT, meta)}
    if span is None:
        raise ParquetPagesError("no columns to take pages from")
    rg[RG_COLUMNS] = (_LIST, (_STRUCT, cols))
    rg[RG_NUM_ROWS] = (_I64, span[1] - span[0])
    rg[RG_TOTAL_BYTES] = (_I64, total_unc)
    rg[RG_FILE_OFFSET] = (_I64, 4)
    rg[RG_TOTAL_COMPRESSED] = (_I64, len(body) - 4)
    rg[RG_ORDINAL] = (_I16, 0)
    out = dict(fmd)
    out[FMD_ROW_GROUPS] = (_LIST, (_STRUCT, [rg]))
    out[FMD_NUM_ROWS] = (_I64, span[1] - span[0])
    meta_bytes = encode_struct(out)
    body += meta_bytes
    body += struct.pack("<I", len(meta_bytes)) + b"PAR1"
    return bytes(body), span[0], span[1]
