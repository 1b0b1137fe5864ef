"""Parquet bytes handed to Arrow in Arrow's own memory (warp/core/arrowmem.py): a copy with no
Python object behind it, so an Arrow pool thread that frees it after a read never needs the
GIL (which aborted ``warp diff --rows`` at interpreter exit, exit 134)."""

from __future__ import annotations

import ctypes
import io

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.arrowmem import arrow_buffer, arrow_reader


def _address(b: bytes) -> int:
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0


@given(st.binary(max_size=4096))
def test_the_buffer_is_a_copy_in_arrow_memory(data):
    buf = arrow_buffer(data)
    assert buf.to_pybytes() == data and buf.size == len(data)
    if data:
        assert buf.address != _address(data)


def test_memoryviews_and_bytearrays_are_copied_too():
    raw = bytearray(b"abcdef")
    buf = arrow_buffer(memoryview(raw)[1:4])
    raw[1:4] = b"XYZ"  # the copy does not see later writes
    assert buf.to_pybytes() == b"bcd"


def test_a_parquet_table_reads_back_through_the_reader():
    t = pa.table({"key": [f"k{i}" for i in range(1000)], "v": list(range(1000))})
    sink = io.BytesIO()
    pq.write_table(t, sink, row_group_size=100)
    data = sink.getvalue()
    assert pq.read_table(arrow_reader(data)).equals(t)
    assert pq.ParquetFile(arrow_reader(data)).metadata.num_row_groups == 10
