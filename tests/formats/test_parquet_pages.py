"""formats/parquet_pages.py: rows of a row group decoded from its pages alone, and the Thrift codec
under it (docs/partitioning.md, "Reads aligned with storage")."""

from __future__ import annotations

import io
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.formats.parquet_pages import (
    ParquetPagesError,
    decode_struct,
    encode_struct,
    footer_of,
    offset_index,
    pages_for_rows,
    slice_file,
)


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": np.arange(n, dtype=np.int64),
        "label": pa.array([f"c{i % 5}" for i in range(n)]),  # dictionary-encoded
        "text": pa.array([None if i % 7 == 0 else rng.bytes(6).hex() for i in range(n)]),  # nulls, plain
        "score": rng.random(n),
        "tags": pa.array([[i] * (i % 4) for i in range(n)]),  # repeated: values != rows
        "pt": pa.array([{"a": i, "b": str(i)} for i in range(n)]),  # two leaves
    })


def _file(t: pa.Table, **kw) -> bytes:
    b = io.BytesIO()
    pq.write_table(t, b, write_page_index=True, **kw)
    return b.getvalue()


def _rows(data: bytes, g: int, lo: int, hi: int, columns: list[str] | None = None) -> pa.Table:
    """Rows [lo, hi) of row group g, from its offset index and pages only (as batches.read_rows does)."""
    n = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-n - 8:]
    fmd = footer_of(footer)
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    names = columns or md.schema.to_arrow_schema().names
    leaves = [j for j in range(md.num_columns) if md.schema.column(j).path.split(".")[0] in names]
    chunks, ranges = {}, {}
    for leaf in leaves:
        off, length = offset_index(fmd, g, leaf)
        cp = pages_for_rows(fmd, g, leaf, data[off:off + length])
        k, m, _, _ = cp.covering(lo, hi)
        chunks[leaf] = (cp, k, m)
        for r in ([cp.dict_range] if cp.dict_range else []) + [cp.byte_range(k, m)]:
            ranges[r] = data[r[0]:r[0] + r[1]]
    mini, first, end = slice_file(footer, g, chunks, ranges)
    got = pq.ParquetFile(pa.BufferReader(mini)).read(columns=names)
    assert got.num_rows == end - first and first <= lo and hi <= end
    return got.slice(lo - first, hi - lo)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), page_rows=st.sampled_from([7, 64, 512]), group=st.integers(100, 2000),
       data=st.data())
def test_any_rows_of_any_group_equal_the_full_read(n, page_rows, group, data):
    t = _table(n)
    raw = _file(t, max_rows_per_page=page_rows, row_group_size=group)
    full = pq.ParquetFile(pa.BufferReader(raw))
    g = data.draw(st.integers(0, full.num_row_groups - 1))
    rows = full.metadata.row_group(g).num_rows
    lo = data.draw(st.integers(0, rows - 1))
    hi = data.draw(st.integers(lo + 1, rows))
    cols = data.draw(st.sampled_from([None, ["score"], ["tags", "label"], ["pt"]]))
    want = full.read_row_group(g, columns=cols).slice(lo, hi - lo)
    assert _rows(raw, g, lo, hi, cols).equals(want)


def test_pages_fetched_are_few():
    """Rows 1000..1100 of a 20,000-row group: the pages holding them, not the column chunk."""
    t = _table(20000)
    raw = _file(t, max_rows_per_page=256, row_group_size=20000, dictionary_pagesize_limit=16 << 10)
    n = struct.unpack("<I", raw[-8:-4])[0]
    fmd = footer_of(raw[-n - 8:])
    md = pq.ParquetFile(pa.BufferReader(raw)).metadata
    for leaf in range(md.num_columns):
        off, length = offset_index(fmd, 0, leaf)
        cp = pages_for_rows(fmd, 0, leaf, raw[off:off + length])
        k, m, first, end = cp.covering(1000, 1100)
        assert (first, end) == (768, 1280) and m - k == 2
        assert cp.byte_range(k, m)[1] * 10 < md.row_group(0).column(leaf).total_compressed_size


def test_thrift_round_trip_keeps_unknown_fields():
    raw = _file(_table(100))
    n = struct.unpack("<I", raw[-8:-4])[0]
    meta = raw[-n - 8:-8]
    fields, end = decode_struct(meta)
    assert end == len(meta) and encode_struct(fields) == meta


@pytest.mark.parametrize("bad, what", [
    (b"\x1c" * 100_000, "deeper"),  # struct in struct in ...: bounded depth, never RecursionError
    (b"\x19\xfc\xff\xff\xff\x0f", "elements"),  # a list claiming 2^32 elements
    (b"\x18\xff\xff\xff\xff\x0f", "bytes"),  # a binary field claiming 4 GiB
    (b"\x15", "ends early"),
])
def test_hostile_thrift_is_a_typed_error(bad, what):
    with pytest.raises(ParquetPagesError, match=what):
        decode_struct(bad)


def test_a_footer_lying_about_its_length_is_refused():
    raw = _file(_table(10))
    n = struct.unpack("<I", raw[-8:-4])[0]
    footer = raw[-n - 8:]
    with pytest.raises(ParquetPagesError, match="claims"):
        footer_of(b"PAR1" + struct.pack("<I", 1 << 30) + b"PAR1")
    with pytest.raises(ParquetPagesError):
        footer_of(footer[:-8] + struct.pack("<I", n - 3) + b"PAR1")


def test_an_offset_index_out_of_order_is_refused():
    raw = _file(_table(3000), max_rows_per_page=100)
    n = struct.unpack("<I", raw[-8:-4])[0]
    fmd = footer_of(raw[-n - 8:])
    off, length = offset_index(fmd, 0, 0)
    index, _ = decode_struct(raw[off:off + length])
    et, locs = index[1][1]
    index[1] = (index[1][0], (et, list(reversed(locs))))
    with pytest.raises(ParquetPagesError, match="out of order|cover"):
        pages_for_rows(fmd, 0, 0, encode_struct(index))


def test_an_offset_index_claiming_more_pages_than_rows_is_refused_before_decoding_them():
    """A forged offset index of 3 MB of page locations for a 100-row group: refused at the list
    header (no Python object per claimed page)."""
    raw = _file(_table(100), max_rows_per_page=10)
    n = struct.unpack("<I", raw[-8:-4])[0]
    fmd = footer_of(raw[-n - 8:])
    loc = encode_struct({1: (6, 4), 2: (5, 10), 3: (6, 0)})
    forged = bytes([0x19, 0xFC]) + bytes([0x80, 0x89, 0x7A]) + loc * 200_000 + b"\x00"  # list of 2,000,000
    with pytest.raises(ParquetPagesError, match="elements"):
        pages_for_rows(fmd, 0, 0, forged)
