"""TBL v2 codec: golden files, malformed corpus, round-trips, reader API, imageinfo."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import DataError, ExitCode, MissingInputError
from warpdata.formats import tbl
from warpdata.formats.imageinfo import (
    ImageHeaderError,
    UnknownImageFormat,
    image_info,
    sniff_format,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "tbl"
MALFORMED = Path(__file__).parents[1] / "malformed" / "tbl"


def _golden_module():
    spec = importlib.util.spec_from_file_location("tbl_make_golden", GOLDEN / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ golden --
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED["files"]))
def test_golden_files_read_back_exact_samples(name):
    with tbl.TblReader(GOLDEN / name) as r:
        assert len(r) == len(EXPECTED["samples"])
        for i, s in enumerate(EXPECTED["samples"]):
            data = bytes(r[i])
            assert hashlib.sha256(data).hexdigest() == s["sha256"]
            assert r.metadata(i)["key"] == s["key"]
        assert r.verify_all() == []
    assert hashlib.sha256((GOLDEN / name).read_bytes()).hexdigest() == EXPECTED["files"][name]


@pytest.mark.parametrize("variant", ["plain_none", "plain_lz4", "warp_none", "warp_lz4", "warp_zstd"])
def test_writer_reproduces_golden_bytes(variant, tmp_path):
    mod = _golden_module()
    out = tmp_path / f"{variant}.tbl"
    mod.write_variant(out, mod.VARIANTS[variant])
    assert out.read_bytes() == (GOLDEN / f"{variant}.tbl").read_bytes()


def test_golden_sizes_and_flags():
    r = tbl.TblReader(GOLDEN / "warp_none.tbl")
    assert r.header.extensions == ["payload-crc32", "index-crc32", "warp-metadata", "metadata-crc32"]
    assert r.header.meta_blocks == 4 and r.header.meta_crc != 0
    assert r.info(0) == tbl.SampleInfo(0, r.info(0).offset, r.info(0).size, r.info(0).size, 9, 7, "png",
                                       "none", True, r.info(0).crc16)
    assert (r.info(1).width, r.info(1).height, r.info(1).format) == (640, 480, "jpeg")
    assert r.info(2).format == "unknown"
    z = tbl.TblReader(GOLDEN / "warp_zstd.tbl")
    assert "zstd" in z.header.extensions and z.info(2).compression == "zstd"
    plain = tbl.TblReader(GOLDEN / "plain_none.tbl")
    assert plain.header.extensions == [] and plain.header.flags == tbl.F_HAS_CHECKSUMS | tbl.F_HAS_METADATA


@pytest.mark.parametrize("variant", ["none", "lz4", "zstd"])
def test_legacy_files_without_metadata_crc_still_read(variant):
    """Files warp wrote before the metadata CRC extension: no flag bit 7, no table, same samples."""
    old = tbl.TblReader(GOLDEN / f"legacy_warp_{variant}.tbl")
    new = tbl.TblReader(GOLDEN / f"warp_{variant}.tbl")
    assert not old.header.flags & tbl.F_META_CRC32 and new.header.flags & tbl.F_META_CRC32
    assert old.header.meta_blocks == 0 and new.header.meta_blocks == len(new)
    # the only difference: the table of 4 CRCs after the section (and the header fields)
    assert new.file_size == old.file_size + 4 * len(new)
    for i in range(len(old)):
        assert bytes(old[i]) == bytes(new[i]) and old.metadata(i) == new.metadata(i)


def _meta_edit(tmp_path, name="x.tbl"):
    """warp_none.tbl with sample 2's key edited in place (valid JSON, a different key)."""
    b = bytearray((GOLDEN / "warp_none.tbl").read_bytes())
    moff = struct.unpack_from("<Q", b, 24)[0]
    at = b.index(b'"key":"b/0003"', moff)
    b[at + 11] ^= 0x01
    p = tmp_path / name
    p.write_bytes(b)
    return p


def test_metadata_edit_is_caught_on_read_and_by_verify_all(tmp_path):
    p = _meta_edit(tmp_path)
    with pytest.raises(tbl.ChecksumMismatch) as ei:
        tbl.TblReader(p).metadata(0)  # any metadata access checks the section first
    assert ei.value.details["check"] == "metadata-section-crc32" and ei.value.details["sample"] == 2
    assert "sample 2" in ei.value.message
    problems = tbl.TblReader(p, verify=False).verify_all()
    assert [(x.index, x.check) for x in problems] == [(-1, "metadata-section-crc32"), (2, "metadata-crc32")]
    # payloads are untouched and still read
    assert bytes(tbl.TblReader(p)[2]) == bytes(tbl.TblReader(GOLDEN / "warp_none.tbl")[2])


def test_block_crc_checked_per_read_after_the_scan(tmp_path):
    """A block that changes after the first scan (file rewritten under the map) fails its own CRC."""
    p = tmp_path / "x.tbl"
    p.write_bytes((GOLDEN / "warp_none.tbl").read_bytes())
    r = tbl.TblReader(p)
    assert r.key(3) == "b/0004"
    b = bytearray(p.read_bytes())
    moff = r.header.metadata_offset
    at = b.index(b'"key":"b/0003"', moff)
    with open(p, "r+b") as f:  # in place: the map sees it
        f.seek(at + 11)
        f.write(bytes([b[at + 11] ^ 1]))
    with pytest.raises(tbl.ChecksumMismatch) as ei:
        r.metadata(2)
    assert ei.value.details["check"] == "metadata-crc32" and ei.value.details["sample"] == 2
    assert r.metadata_raw(2, verify=False) is not None  # verify=False trusts the bytes


def test_legacy_file_verify_all_reports_unparseable_json():
    problems = tbl.TblReader(MALFORMED / "legacy_metadata_not_json.tbl", verify=False).verify_all()
    assert [(x.index, x.check) for x in problems] == [(0, "metadata-json")]


def test_plain_and_turboloader_files_have_no_metadata_crc():
    for name in ("plain_none.tbl", "turboloader_lz4.tbl"):
        h = tbl.TblReader(GOLDEN / name).header
        assert not h.flags & tbl.F_META_CRC32 and (h.meta_crc, h.meta_blocks) == (0, 0)


# ---------------------------------------------------------------- malformed --
MALFORMED_EXPECTED = json.loads((MALFORMED / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(MALFORMED_EXPECTED))
def test_malformed_corpus_raises_typed_errors(name):
    cls = getattr(tbl, MALFORMED_EXPECTED[name])
    path = MALFORMED / name
    with pytest.raises(cls) as ei:
        r = tbl.TblReader(path, verify=True)
        for i in range(len(r)):
            r.read(i)
            r.metadata(i)
    err = ei.value
    assert isinstance(err, DataError) and isinstance(err, ValueError)
    assert err.exit_code == ExitCode.DATA
    assert str(path) in err.message and err.hint


def test_flipped_payload_reported_by_verify_all_with_facts(tmp_path):
    src = (GOLDEN / "warp_none.tbl").read_bytes()
    r0 = tbl.TblReader(GOLDEN / "warp_none.tbl")
    b = bytearray(src)
    for i in (0, 3):
        b[r0.info(i).offset + 5] ^= 0xFF
    p = tmp_path / "two_bad.tbl"
    p.write_bytes(b)
    r = tbl.TblReader(p, verify=False)
    assert bytes(r[0]) != bytes(r0[0])  # verify=False really skips the check
    problems = r.verify_all()
    assert [(x.index, x.check) for x in problems] == [(0, "payload-crc32"), (3, "payload-crc32")]
    assert problems[0].offset == r0.info(0).offset and problems[0].stored != problems[0].computed
    with pytest.raises(tbl.ChecksumMismatch) as ei:
        tbl.TblReader(p).read(3)
    assert ei.value.details["sample"] == 3 and "b/0004" in ei.value.message


def test_crc16_checked_when_file_has_no_trailers(tmp_path):
    b = bytearray((GOLDEN / "plain_none.tbl").read_bytes())
    r0 = tbl.TblReader(GOLDEN / "plain_none.tbl")
    b[r0.info(1).offset + 30] ^= 1
    p = tmp_path / "x.tbl"
    p.write_bytes(b)
    with pytest.raises(tbl.ChecksumMismatch, match="crc16"):
        tbl.TblReader(p).read(1)
    assert [x.check for x in tbl.TblReader(p).verify_all()] == ["crc16"]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(MissingInputError):
        tbl.TblReader(tmp_path / "nope.tbl")
    with pytest.raises(MissingInputError):
        tbl.TblReader(tmp_path)


# --------------------------------------------------------------- round trip --
payloads = st.lists(st.one_of(st.binary(max_size=300), st.binary(max_size=40).map(lambda b: b * 30)),
                    max_size=12)


@given(payloads, st.sampled_from(["none", "lz4", "zstd", "auto"]), st.booleans(), st.booleans())
def test_roundtrip_any_payloads(tmp_path_factory, data, compression, with_meta, hint):
    if compression == "zstd":
        ext = True
    else:
        ext = bool(len(data) % 2)
    p = tmp_path_factory.mktemp("rt") / "x.tbl"
    with tbl.TblWriter(p, compression=compression, extensions=ext, fsync=False,
                       expected_samples=len(data) if hint else None) as w:
        for i, d in enumerate(data):
            w.add(d, metadata={"i": i, "s": "é"} if with_meta else None)
    with tbl.TblReader(p) as r:
        assert len(r) == len(data)
        assert [bytes(r[i]) for i in range(len(r))] == data
        if with_meta:
            assert [r.metadata(i) for i in range(len(r))] == [{"i": i, "s": "é"} for i in range(len(data))]
        else:
            assert all(r.metadata(i) is None for i in range(len(r)))
        assert r.verify_all() == []
        for i, d in enumerate(data):
            info = r.info(i)
            assert info.uncompressed_size == len(d)
            assert info.size <= len(d)
            assert info.crc16 == tbl.crc16(d)
    assert [x.name for x in p.parent.iterdir()] == ["x.tbl"]  # no spool files left


def test_expected_samples_mismatch_relocates_payloads(tmp_path):
    p = tmp_path / "x.tbl"
    with tbl.TblWriter(p, expected_samples=10, fsync=False) as w:
        for i in range(3):
            w.add(bytes([i]) * 100)
    assert [bytes(x) for x in tbl.TblReader(p)] == [bytes([i]) * 100 for i in range(3)]
    assert sorted(os.listdir(tmp_path)) == ["x.tbl"]


def test_writer_exception_leaves_nothing(tmp_path):
    p = tmp_path / "x.tbl"
    with pytest.raises(RuntimeError), tbl.TblWriter(p) as w:
        w.add(b"abc")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_zstd_requires_extensions(tmp_path):
    with pytest.raises(tbl.UsageError):
        tbl.TblWriter(tmp_path / "x.tbl", compression="zstd", extensions=False)
    with pytest.raises(tbl.UsageError):
        tbl.TblWriter(tmp_path / "x.tbl", compression="brotli")


def test_crc_models_match_turboloader_definitions():
    assert tbl.crc16(b"123456789") == 0x4B37  # CRC-16/MODBUS check value
    assert tbl.crc32(b"123456789") == zlib.crc32(b"123456789") == 0xCBF43926
    assert tbl.crc32(b"6789", tbl.crc32(b"12345")) == 0xCBF43926


# ------------------------------------------------------------------ reader --
def test_reader_zero_copy_info_filter_keys(tmp_path):
    from warpdata.sampledata.photos import encode_jpeg, encode_png

    rng = np.random.default_rng(0)
    p = tmp_path / "x.tbl"
    sizes = [(20, 10), (64, 48), (300, 200), (5, 5)]
    with tbl.TblWriter(p, fsync=False) as w:
        for i, (wd, ht) in enumerate(sizes):
            img = rng.integers(0, 255, (ht, wd, 3), dtype=np.uint8)
            w.add(encode_png(img) if i == 3 else encode_jpeg(img), metadata={"key": f"k{i}"})
        w.close(warp_metadata=True)
    r = tbl.TblReader(p)
    v = r[1]
    assert isinstance(v, memoryview) and v.readonly
    assert [(r.info(i).width, r.info(i).height) for i in range(4)] == sizes
    assert r.info(-1).format == "png" and r.info(-1).index == 3
    assert r.filter(min_width=50).tolist() == [1, 2]
    assert r.filter(max_height=10).tolist() == [0, 3]
    assert r.filter(formats=["png"]).tolist() == [3]
    assert r.filter(predicate=lambda s: s.width == s.height).tolist() == [3]
    assert r.index_of("k2") == 2 and r.key(0) == "k0"
    assert bytes(r.get("k3")) == bytes(r[3])
    with pytest.raises(tbl.SampleNotFound) as ei:
        r.index_of("nope")
    assert isinstance(ei.value, KeyError)
    with pytest.raises(IndexError):
        r.read(4)
    assert len(list(r)) == 4
    r.close()


def test_reader_pickles_by_path(tmp_path):
    import pickle

    p = tmp_path / "x.tbl"
    tbl.write_tbl(p, [b"one", b"two"], fsync=False)
    r2 = pickle.loads(pickle.dumps(tbl.TblReader(p, verify=False)))
    assert bytes(r2[1]) == b"two" and r2.verify is False


def test_empty_file_roundtrip(tmp_path):
    p = tmp_path / "e.tbl"
    tbl.write_tbl(p, [], fsync=False)
    r = tbl.TblReader(p)
    assert len(r) == 0 and r.verify_all() == [] and r.filter().tolist() == []


def test_lazy_toplevel_export():
    import warpdata

    assert warpdata.TblReader is tbl.TblReader


# --------------------------------------------------------------- imageinfo --
@pytest.mark.parametrize("fmt,kw", [("JPEG", {}), ("JPEG", {"progressive": True}), ("PNG", {}),
                                    ("WEBP", {}), ("WEBP", {"lossless": True}), ("BMP", {}),
                                    ("TIFF", {}), ("TIFF", {"big_tiff": True}), ("GIF", {})])
def test_imageinfo_matches_pillow(fmt, kw):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (53, 37), (1, 2, 3)).save(buf, format=fmt, **kw)
    info = image_info(buf.getvalue())
    assert (info.width, info.height) == (53, 37)
    assert info.format == {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "TIFF": "tiff",
                           "GIF": "gif"}[fmt]


def test_imageinfo_webp_extended_and_errors():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGBA", (70, 33), (1, 2, 3, 4)).save(buf, format="WEBP")
    info = image_info(buf.getvalue())
    assert (info.format, info.width, info.height) == ("webp", 70, 33)
    with pytest.raises(UnknownImageFormat):
        image_info(b"hello world")
    with pytest.raises(ImageHeaderError, match="x.jpg"):
        image_info(b"\xff\xd8\xff\xe0\x00", name="x.jpg")
    with pytest.raises(ImageHeaderError):
        image_info(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR")
    assert sniff_format(b"GIF89a....") == "gif" and sniff_format(b"") is None


@given(st.binary(max_size=64))
def test_imageinfo_never_crashes_on_garbage(data):
    for prefix in (b"", b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF\0\0\0\0WEBPVP8 ", b"BM", b"II*\x00",
                   b"MM\x00*", b"GIF89a"):
        try:
            info = image_info(prefix + data)
        except (UnknownImageFormat, ImageHeaderError):
            continue
        assert info.width >= 0 and info.height >= 0
