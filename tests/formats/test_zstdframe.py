"""zstd frame headers: the content size is read and, where a compressor left it out, added."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.core.errors import DataError
from warpdata.formats import zstdframe


def _stream(c: zstandard.ZstdCompressor, data: bytes) -> bytes:
    o = c.compressobj()
    return o.compress(data) + o.flush()


SIZES = [0, 1, 255, 256, 257, 65535, 65791, 65792, 1 << 20]


@pytest.mark.parametrize("size", SIZES[1:])  # empty input: even the streaming API writes the size (0)
@pytest.mark.parametrize("checksum", [False, True])
def test_a_frame_without_content_size_gets_one_and_still_decodes(size, checksum):
    data = (np.arange(size, dtype=np.uint32) * 2654435761 % 251).astype(np.uint8).tobytes()
    frame = _stream(zstandard.ZstdCompressor(level=1, write_checksum=checksum), data)
    assert zstdframe.content_size(frame) is None
    assert zstandard.frame_content_size(frame) == -1
    fixed = zstdframe.with_content_size(frame, size)
    assert zstdframe.content_size(fixed) == size == zstandard.frame_content_size(fixed)
    # one-shot decompression needs the size in the header: it works now
    assert zstandard.ZstdDecompressor().decompress(fixed) == data


@pytest.mark.parametrize("size", SIZES)
def test_a_frame_with_content_size_is_returned_as_is(size):
    data = bytes(size)
    frame = zstandard.ZstdCompressor(level=1).compress(data)
    assert zstdframe.content_size(frame) == size
    assert zstdframe.with_content_size(frame, size) is frame
    with pytest.raises(DataError, match="declares"):
        zstdframe.with_content_size(frame, size + 1)


def test_dictionary_id_is_skipped_correctly():
    samples = [bytes([i % 7]) * 300 + bytes(range(i % 50)) for i in range(200)]
    d = zstandard.train_dictionary(1024, samples)
    data = samples[3] * 10
    frame = _stream(zstandard.ZstdCompressor(level=1, dict_data=d, write_dict_id=True), data)
    assert zstandard.get_frame_parameters(frame).dict_id == d.dict_id()
    fixed = zstdframe.with_content_size(frame, len(data))
    assert zstandard.get_frame_parameters(fixed).dict_id == d.dict_id()
    assert zstandard.ZstdDecompressor(dict_data=d).decompress(fixed) == data


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), checksum=st.booleans())
def test_round_trip_property(data, checksum):
    frame = _stream(zstandard.ZstdCompressor(level=1, write_checksum=checksum), data)
    fixed = zstdframe.with_content_size(memoryview(frame), len(data))
    assert zstandard.ZstdDecompressor().decompress(fixed) == data
    assert zstdframe.with_content_size(fixed, len(data)) is fixed


@pytest.mark.parametrize(("frame", "needle"), [
    (b"", "bad magic"), (b"\x00\x01\x02\x03\x04\x05", "bad magic"),
    (zstdframe.MAGIC + b"\x08\x00", "reserved bit"),
    (zstdframe.MAGIC + b"\xc0\x00\x00", "shorter than its header"),
])
def test_malformed_headers_are_data_errors(frame, needle):
    with pytest.raises(DataError, match=needle):
        zstdframe.content_size(frame)
