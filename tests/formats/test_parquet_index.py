"""formats/parquet_index.py: a shard's footer and page locations in the manifest
(docs/formats/registry.md, "Page index in the manifest"): exact round trips, a golden encoding,
and bounded, typed refusals of whatever else a manifest might hold there."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.formats import parquet_index as pi
from warpdata.formats.parquet_pages import (
    Page,
    ParquetPagesError,
    footer_of,
    offset_index,
    pages_for_rows,
)

GOLDEN = Path(__file__).parent.parent / "golden" / "parquet_index"


def _file(path: Path, n: int = 5000, **kw) -> Path:
    rng = np.random.default_rng(0)
    t = pa.table({"id": np.arange(n, dtype=np.int64), "label": pa.array([f"c{i % 5}" for i in range(n)]),
                  "text": pa.array([None if i % 7 == 0 else rng.bytes(6).hex() for i in range(n)]),
                  "tags": pa.array([[i] * (i % 4) for i in range(n)])})
    pq.write_table(t, path, write_page_index=True, **kw)
    return path


def test_the_index_holds_the_files_footer_and_every_offset_index(tmp_path):
    f = _file(tmp_path / "t.parquet", row_group_size=2000, max_rows_per_page=128)
    data = f.read_bytes()
    index = pi.decode(pi.of_file(str(f)))
    n = int.from_bytes(data[-8:-4], "little")
    assert index.footer == data[-8 - n:]
    fmd = footer_of(index.footer)
    chunks = 0
    for g in range(3):
        for leaf in range(4):
            off, length = offset_index(fmd, g, leaf)
            assert index.chunk(fmd, g, leaf) == pages_for_rows(fmd, g, leaf, data[off:off + length])
            chunks += 1
    assert chunks == 12


def test_a_file_without_offset_indexes_has_none(tmp_path):
    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), f)  # pyarrow's default: no page index
    assert pi.of_file(str(f)) is None


def test_it_costs_about_a_byte_a_page_of_a_column(tmp_path):
    """5,000 rows in pages of 16 rows: 313 pages in each of 4 columns, ~20 KB of Thrift offset indexes."""
    f = _file(tmp_path / "t.parquet", max_rows_per_page=16)
    md = pq.read_metadata(f)
    thrift = sum(md.row_group(0).column(c).offset_index_length for c in range(4)) \
        if hasattr(md.row_group(0).column(0), "offset_index_length") else 0
    text = pi.of_file(str(f))
    n = int.from_bytes(f.read_bytes()[-8:-4], "little")
    assert len(base64.b64decode(text)) < n + 4 * 313 * 1.5
    if thrift:
        assert len(text) < thrift / 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 1 << 20), st.integers(0, 1 << 20)),
                         min_size=1, max_size=40), min_size=1, max_size=6))
def test_page_locations_round_trip_exactly(chunks):
    """Any locations (gaps, shrinking pages, irregular rows) survive encode -> decode."""
    locs = []
    for chunk in chunks:
        off, first, out = 4, 0, []
        for gap, size, rows in chunk:
            out.append(Page(off + gap, size, first))
            off, first = off + gap + size, first + rows
        locs.append(out)
    footer = _footer_with(len(locs))
    raw = pi.encode(footer, [locs])
    r = pi._In(raw)
    r.pos = 4
    n = r.varint()
    assert raw[r.pos:r.pos + n] == footer
    # decode() checks counts against the footer (one row group of len(locs) columns), not coverage
    index = pi.decode(base64.b64encode(zstandard.ZstdCompressor().compress(raw)).decode())
    assert [list(c) for c in index.pages[0]] == locs


def _footer_with(leaves: int) -> bytes:
    b = io.BytesIO()
    pq.write_table(pa.table({f"c{i}": [1] for i in range(leaves)}), b)
    data = b.getvalue()
    n = int.from_bytes(data[-8:-4], "little")
    return data[-8 - n:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(1, 1 << 30), st.integers(0, 1 << 40)),
                min_size=1, max_size=60))
def test_the_number_codec_round_trips(triples):
    out = bytearray()
    for a, b, c in triples:
        pi._zigzag(out, a - b)
        pi._zigzag(out, -c)
        pi._varint(out, c)
    r = pi._In(bytes(out))
    assert [(r.zigzag(), r.zigzag(), r.varint()) for _ in triples] == [(a - b, -c, c) for a, b, c in triples]
    assert r.pos == len(out)


def test_golden_encoding():
    """The encoding of fixed locations and a fixed footer (the bytes are the format)."""
    footer = (GOLDEN / "footer.bin").read_bytes()
    locs = [[[Page(4, 100, 0), Page(104, 100, 128), Page(204, 90, 256)], None],
            [[Page(400, 50, 0)], [Page(450, 60, 0), Page(520, 61, 10)]]]
    raw = pi.encode(footer, locs)
    assert raw == (GOLDEN / "index.bin").read_bytes()


def _text(raw: bytes, **kw) -> str:
    return base64.b64encode(zstandard.ZstdCompressor(**kw).compress(raw)).decode()


@pytest.mark.parametrize("text, says", [
    ("not base64!", "not base64"),
    (base64.b64encode(b"plain bytes").decode(), "not a zstd frame"),
    (_text(b"ABCD" + bytes(8)), "no WPI1 header"),
    (_text(b"WPI1\xff\xff\xff\xff\x0f"), "runs past"),
    (_text(b"WPI1\x80"), "truncated"),
])
def test_what_is_not_a_page_index_is_refused(text, says):
    with pytest.raises(ParquetPagesError, match=says):
        pi.decode(text, "ws/x shard 0")


def test_a_bomb_is_refused_before_it_is_decoded():
    """A 2 GiB frame of zeros declared in 100 bytes: refused by its declared size, nothing allocated."""
    c = zstandard.ZstdCompressor(level=1)
    frame = c.compress(bytes(1 << 20))
    # a frame that declares 2 GiB: rewrite the content size by compressing a stream with that size
    big = zstandard.ZstdCompressor(level=1, write_content_size=True)
    cobj = big.compressobj(size=2 << 30)
    head = cobj.compress(bytes(1 << 16))
    text = base64.b64encode(head + cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)).decode()
    with pytest.raises(ParquetPagesError, match="declares 2147483648 bytes"):
        pi.decode(text)
    assert len(frame) < 1 << 20


def test_counts_must_match_the_footer(tmp_path):
    f = _file(tmp_path / "t.parquet", row_group_size=2500)
    index = pi.decode(pi.of_file(str(f)))
    one_group = [list(x) for x in index.pages[0]]
    with pytest.raises(ParquetPagesError, match="1 row groups, the footer has 2"):
        pi.decode(pi.to_text(pi.encode(index.footer, [one_group])))
    with pytest.raises(ParquetPagesError, match="has 3 columns, the footer 4"):
        pi.decode(pi.to_text(pi.encode(index.footer, [one_group[:3], one_group])))
    bad = [[Page(p.offset, p.size, p.first_row + 7) for p in one_group[0]]] + one_group[1:]
    index2 = pi.decode(pi.to_text(pi.encode(index.footer, [bad, one_group])))
    with pytest.raises(ParquetPagesError, match="does not cover"):
        index2.chunk(footer_of(index.footer), 0, 0)
