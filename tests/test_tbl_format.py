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
from warpdata.errors import DataError, ExitCode, MissingInputError
from warpdata.formats import tbl
from warpdata.formats.imageinfo import (
    ImageHeaderError,
    UnknownImageFormat,
    image_info,
    sniff_format,
)

GOLDEN = Path(__file__).parent / "golden" / "tbl"
MALFORMED = Path(__file__).parent / "malformed" / "tbl"


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
    assert r.header.extensions == ["payload-crc32", "index-crc32", "warp-metadata"]
    assert r.info(0) == tbl.SampleInfo(0, r.info(0).offset, r.info(0).size, r.info(0).size, 9, 7, "png",
                                       "none", True, r.info(0).crc16)
    assert (r.info(1).width, r.info(1).height, r.info(1).format) == (640, 480, "jpeg")
    assert r.info(2).format == "unknown"
    z = tbl.TblReader(GOLDEN / "warp_zstd.tbl")
    assert "zstd" in z.header.extensions and z.info(2).compression == "zstd"
    plain = tbl.TblReader(GOLDEN / "plain_none.tbl")
    assert plain.header.extensions == [] and plain.header.flags == tbl.F_HAS_CHECKSUMS | tbl.F_HAS_METADATA


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
