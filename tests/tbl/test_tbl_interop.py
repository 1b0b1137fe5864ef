"""TBL v2 interop with the real `turboloader` 2.39 package, both directions.

Skipped only when turboloader cannot be imported (the `test` extra installs it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from warpdata.formats import tbl
from warpdata.formats.imageinfo import image_info

t = pytest.importorskip("turboloader")


def _samples():
    from warpdata.sampledata.photos import encode_jpeg, encode_png, synthetic_photo

    rng = np.random.default_rng(7)
    out = [encode_jpeg(synthetic_photo(rng, 40 + 9 * i, 30 + 5 * i)) for i in range(5)]
    out.append(encode_png(synthetic_photo(rng, 17, 23)))
    out.append(b"compressible text payload " * 40)
    out.append(b"")
    return out


def _tl_write(path, samples, compress, meta):
    w = t.TblWriterV2(str(path), enable_compression=compress)
    for i, s in enumerate(samples):
        try:
            info = image_info(s)
            fmt, wd, ht = getattr(t.SampleFormat, info.format.upper()), info.width, info.height
        except tbl.DataError:
            fmt, wd, ht = t.SampleFormat.UNKNOWN, 0, 0
        w.add_sample(s, fmt, width=wd, height=ht)
        if meta:
            w.add_metadata(i, json.dumps({"i": i}), t.MetadataType.JSON)
    w.finalize()


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("meta", [False, True])
def test_turboloader_files_open_in_warp(tmp_path, compress, meta):
    samples = _samples()
    p = tmp_path / "tl.tbl"
    _tl_write(p, samples, compress, meta)
    tr = t.TblReaderV2(str(p), verify_checksums=True)
    with tbl.TblReader(p, verify=True) as r:
        assert len(r) == len(samples) == tr.num_samples()
        for i, s in enumerate(samples):
            assert bytes(r[i]) == s
            info, tinfo = r.info(i), tr.get_sample_info(i)
            assert (info.width, info.height, info.size, info.uncompressed_size) == \
                (tinfo["width"], tinfo["height"], tinfo["size"], tinfo["uncompressed_size"])
            assert (info.compression == "lz4") == tinfo["is_compressed"]
            assert r.metadata(i) == ({"i": i} if meta else None)
        assert r.verify_all() == []
        if compress:
            assert any(r.info(i).compression == "lz4" for i in range(len(r)))


@pytest.mark.parametrize("compression", ["none", "lz4", "auto"])
@pytest.mark.parametrize("extensions", [False, True])
def test_warp_files_open_in_turboloader(tmp_path, compression, extensions):
    samples = _samples()
    p = tmp_path / "w.tbl"
    with tbl.TblWriter(p, compression=compression, extensions=extensions, fsync=False) as w:
        for i, s in enumerate(samples):
            w.add(s, metadata={"key": f"k{i}"})
        w.close(warp_metadata=extensions)
    tr = t.TblReaderV2(str(p), verify_checksums=True)
    assert tr.num_samples() == len(samples)
    assert tr.has_metadata()
    r = tbl.TblReader(p)
    # the metadata CRC extension (flag bit 7, table after the section) is invisible to TurboLoader
    assert bool(r.header.flags & tbl.F_META_CRC32) == extensions
    for i, s in enumerate(samples):
        assert tr.read_sample(i) == s
        info = tr.get_sample_info(i)
        assert (info["width"], info["height"]) == (r.info(i).width, r.info(i).height)
        assert json.loads(tr.read_metadata(i)[0]) == {"key": f"k{i}"}
    assert tr.filter_by_format(t.SampleFormat.PNG) == r.filter(formats=["png"]).tolist()


def test_uncompressed_files_byte_identical(tmp_path):
    samples = _samples()
    a, b = tmp_path / "tl.tbl", tmp_path / "w.tbl"
    _tl_write(a, samples, compress=False, meta=True)
    with tbl.TblWriter(b, compression="none", extensions=False, fsync=False) as w:
        for i, s in enumerate(samples):
            w.add(s, metadata=json.dumps({"i": i}))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("verify", [True, False])
def test_turboloader_refuses_zstd_entries_never_returns_wrong_bytes(tmp_path, verify):
    p = tmp_path / "z.tbl"
    with tbl.TblWriter(p, compression="zstd", fsync=False) as w:
        w.add(b"zstd payload " * 100)
        w.add(b"\x00\x01")  # incompressible: stored as is, readable everywhere
    assert tbl.TblReader(p).info(0).compression == "zstd"
    tr = t.TblReaderV2(str(p), verify_checksums=verify)
    with pytest.raises(RuntimeError, match="LZ4 decompression failed"):
        tr.read_sample(0)
    assert tr.read_sample(1) == b"\x00\x01"


def test_converter_output_opens_in_turboloader(tmp_path):
    from warpdata.sampledata.wds import generate
    from warpdata.tbl.converter import ConvertRequest, convert

    tar = generate(tmp_path / "s.tar", count=12)["path"]
    out = tmp_path / "s.tbl"
    convert(ConvertRequest(tar, str(out), workers=2))
    tr = t.TblReaderV2(str(out), verify_checksums=True)
    r = tbl.TblReader(out)
    assert tr.num_samples() == len(r) == 12
    for i in range(12):
        assert tr.read_sample(i) == bytes(r[i])
        assert json.loads(tr.read_metadata(i)[0])["key"] == r.key(i)


@pytest.mark.parametrize("name", ["warp_none.tbl", "warp_lz4.tbl", "legacy_warp_none.tbl"])
def test_golden_files_with_and_without_metadata_crc_open_in_turboloader(name):
    from pathlib import Path

    p = Path(__file__).parents[1] / "golden" / "tbl" / name
    tr = t.TblReaderV2(str(p), verify_checksums=True)
    r = tbl.TblReader(p)
    assert tr.num_samples() == len(r)
    for i in range(len(r)):
        assert tr.read_sample(i) == bytes(r[i])
        assert json.loads(tr.read_metadata(i)[0]) == r.metadata(i)
