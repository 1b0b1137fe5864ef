"""Hot paths: TblReader reads (one CRC over payload + trailer, zero-copy slices), tar header sums.

The fast path (warp files without compressed entries) checks the CRC-32
residue of payload + stored trailer instead of comparing the trailer with a
separately computed CRC; these tests pin that both say the same thing for
every single-bit flip and that indexing/closing behave like the general path.
"""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.formats import tbl


def _write(path, payloads, **kw):
    with tbl.TblWriter(path, fsync=False, compression="none", **kw) as w:
        for p in payloads:
            w.add(p, format="unknown", width=0, height=0)
    return path


def test_residue_constant_is_crc32_of_message_plus_its_crc():
    for m in (b"", b"a", b"123456789", os.urandom(70_000)):
        assert tbl.crc32(m + zlib.crc32(m).to_bytes(4, "little")) == tbl.CRC32_RESIDUE
        assert tbl.crc32(m) == zlib.crc32(m)


@settings(max_examples=30, deadline=None)
@given(data=st.binary(min_size=0, max_size=300), bit=st.integers(min_value=0))
def test_every_single_bit_flip_in_payload_or_trailer_is_caught(tmp_path_factory, data, bit):
    d = tmp_path_factory.mktemp("flip")
    p = _write(d / "x.tbl", [b"head", data, b"tail"])
    r0 = tbl.TblReader(p)
    assert r0._fast
    info = r0.info(1)
    r0.close()
    span = (info.size + tbl.TRAILER_SIZE) * 8  # payload and its trailer
    bit %= span
    raw = bytearray(p.read_bytes())
    raw[info.offset + bit // 8] ^= 1 << (bit % 8)
    q = d / "bad.tbl"
    q.write_bytes(raw)
    r = tbl.TblReader(q)
    with pytest.raises(tbl.ChecksumMismatch) as ei:
        r.read(1)
    e = ei.value
    assert e.details["sample"] == 1 and e.details["offset"] == info.offset
    assert e.details["check"] == "payload-crc32" and e.details["stored"] != e.details["computed"]
    assert bytes(r.read(0)) == b"head" and bytes(r.read(2)) == b"tail"
    assert bytes(r.read(1, verify=False)) == bytes(raw[info.offset:info.offset + info.size])
    assert [x.index for x in r.verify_all()] == [1]


def test_fast_path_indexing_matches_general_path(tmp_path):
    payloads = [os.urandom(n) for n in (0, 1, 5000, 70_000)]
    fast = tbl.TblReader(_write(tmp_path / "fast.tbl", payloads))
    plain = tbl.TblReader(_write(tmp_path / "plain.tbl", payloads, extensions=False))
    assert fast._fast and not plain._fast
    for i in range(-len(payloads), len(payloads)):
        a, b = fast.read(i), plain.read(i)
        assert isinstance(a, memoryview) and a.readonly
        assert bytes(a) == bytes(b) == payloads[i]
    import numpy as np

    assert bytes(fast[np.int64(2)]) == payloads[2]
    for bad in (4, -5, 10**12):
        with pytest.raises(IndexError, match="out of range"):
            fast.read(bad)
        with pytest.raises(IndexError, match="out of range"):
            plain.read(bad)
    fast.close()
    with pytest.raises(IndexError, match="closed"):
        fast.read(0)


def test_error_of_negative_index_names_the_real_sample(tmp_path):
    p = _write(tmp_path / "x.tbl", [b"a" * 100, b"b" * 100])
    r0 = tbl.TblReader(p)
    off = r0.info(1).offset
    r0.close()
    raw = bytearray(p.read_bytes())
    raw[off] ^= 0x80
    p.write_bytes(raw)
    with pytest.raises(tbl.ChecksumMismatch) as ei:
        tbl.TblReader(p).read(-1)
    assert ei.value.details["sample"] == 1


@given(st.binary(min_size=512, max_size=512))
def test_tar_header_checksum_equals_the_byte_sum(hdr):
    from warpdata.tbl.tarstream import header_checksum

    assert header_checksum(hdr) == sum(hdr[:148]) + 8 * 32 + sum(hdr[156:])
    worst = b"\xff" * 512  # the largest sums: Adler-32's modulus must not wrap
    assert header_checksum(worst) == 504 * 255 + 256
