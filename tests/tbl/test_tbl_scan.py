"""tar -> tbl fast scan: scan_members agrees with the full parser, member for member and error for error.

scan_members parses plain ustar/GNU headers from pread windows and hands
over to iter_members' parser at the first header it does not take; these
tests pin that the two give the same members (names, sizes, kinds, bytes)
and the same typed errors with the same messages, on the tar dialects, on
the hostile corpus (tests/malformed/tar) and on random damage; and that the
converter's hand-written metadata JSON is canonical_json's bytes.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.formats.tbl import canonical_json
from warpdata.tbl import tarstream
from warpdata.tbl.converter import ConvertRequest, convert, meta_json
from warpdata.tbl.tarstream import TarFormatError, iter_members, scan_members

HERE = Path(__file__).parents[1]
CASES = HERE / "malformed" / "tar"


def _cases_module():
    spec = importlib.util.spec_from_file_location("tar_cases_scan", CASES / "make_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference(raw: bytes):
    """What the full parser says about ``raw``: [(name, size, kind, bytes)] or (error type, message)."""
    try:
        return [(m.name, m.size, m.type, m.data) for m in iter_members(io.BytesIO(raw))]
    except TarFormatError as e:
        return type(e), e.message


def _scanned(path: Path, **kw):
    """scan_members over the file, deferred members read as the converter reads them."""
    try:
        with open(path, "rb") as f:
            out = []
            for name, size, kind, off, data in scan_members(f, **kw):
                if kind == "file" and len(data) < size:
                    data = data + tarstream.read_at(f.fileno(), off + len(data), size - len(data), name)
                out.append((name, size, kind, data))
            return out
    except TarFormatError as e:
        return type(e), e.message


def _tar(entries, fmt) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            if isinstance(data, bytes):
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                ti.type = data
                if data in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    ti.linkname = "target"
                tf.addfile(ti)
    return buf.getvalue()


def _jpg(seed: int, pad: int = 0) -> bytes:
    import numpy as np
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

    return encode_jpeg(synthetic_photo(np.random.default_rng(seed), 24 + seed, 16)) + bytes(pad)


ENTRIES = [("a.jpg", _jpg(1, 3000)), ("a.cls", b"1"), ("dir", tarfile.DIRTYPE),
           ("a.big", os.urandom(70_000)), ("ln.jpg", tarfile.SYMTYPE), ("hard.txt", tarfile.LNKTYPE),
           ("p/q.r/k.txt", b""), ("d" * 90 + "/" + "n" * 60 + ".jpg", _jpg(2, 700)), ("p/q.r/k.jpg", _jpg(3)),
           ("z" * 96 + ".png", _jpg(4, 5000)), ("fifo", tarfile.FIFOTYPE), ("e.jpg", b"e" * 512),
           ("big.jpg", _jpg(5, 90_000)), ("big.bin", os.urandom(20_000)), ("big.txt", b"caption")]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("defer", [0, 16 << 10])
def test_scan_equals_parser_on_dialects(tmp_path, fmt, defer):
    entries = list(ENTRIES)
    if fmt != tarfile.USTAR_FORMAT:  # names ustar cannot hold: GNU long names, PAX paths, non-ASCII
        entries += [("ünï/" + "z" * 120 + ".txt", b"t"), ("x" * 150 + ".jpg", _jpg(6, 2000)), ("after.cls", b"2"),
                    ("ünï/" + "z" * 120 + ".jpg", _jpg(7))]
    raw = _tar(entries, fmt)
    p = tmp_path / "t.tar"
    p.write_bytes(raw)
    ref = _reference(raw)
    assert isinstance(ref, list) and len(ref) == len(entries)
    assert _scanned(p, defer_above=defer) == ref
    # and the converter's input route does not matter: a file (fast scan) and gzip (the parser) agree
    a, b = tmp_path / "a.tbl", tmp_path / "b.tbl"
    gz = tmp_path / "t.tar.gz"
    gz.write_bytes(gzip.compress(raw, mtime=0))
    ra = convert(ConvertRequest(str(p), str(a), workers=1, fsync=False, on_error="skip"))
    rb = convert(ConvertRequest(str(gz), str(b), workers=1, fsync=False, on_error="skip"))
    assert a.read_bytes() == b.read_bytes()
    assert (ra.members, ra.samples, ra.skipped_examples) == (rb.members, rb.samples, rb.skipped_examples)


def test_scan_reads_few_windows(tmp_path, monkeypatch):
    """A header, the small members after it and the next header come in one pread: ~1 syscall a sample."""
    entries = []
    for i in range(200):
        entries += [(f"s{i:04d}.cls", b"7"), (f"s{i:04d}.jpg", os.urandom(20_000)), (f"s{i:04d}.json", b"{}")]
    p = tmp_path / "t.tar"
    p.write_bytes(_tar(entries, tarfile.PAX_FORMAT))
    calls = []
    real = os.pread
    monkeypatch.setattr(tarstream.os, "pread", lambda fd, n, off: calls.append(n) or real(fd, n, off))
    with open(p, "rb") as f:
        got = list(scan_members(f))
    assert len(got) == 600 and all(len(d) < s for _n, s, _k, _o, d in got if s == 20_000)
    assert len(calls) <= 210, len(calls)


@pytest.mark.parametrize("name", sorted(x.name for x in CASES.glob("*.tar")))
def test_scan_equals_parser_on_hostile_corpus(tmp_path, name):
    raw = (CASES / name).read_bytes()
    p = tmp_path / name
    p.write_bytes(raw)
    ref = _reference(raw)
    assert _scanned(p) == ref


def test_scan_equals_parser_on_random_damage(tmp_path):
    mod = _cases_module()
    src = b"".join(mod.member(f"s/{i:04d}.png", mod.PNG + bytes([i]) * (i * 300))
                   + mod.member(f"s/{i:04d}.cls", str(i).encode()) for i in range(8)) + mod.END
    headers = [i for i in range(0, len(src), 512) if src[i + 257:i + 262] == b"ustar"]
    rng = random.Random(18)
    p = tmp_path / "in.tar"
    kinds = {"ok": 0, "error": 0}
    for case in range(400):
        x = bytearray(src)
        hdr = rng.choice(headers)
        what = rng.choice(["size", "chk", "byte", "truncate", "typ", "zero"])
        if what == "size":
            x[hdr + 124:hdr + 136] = rng.choice([b"%011o\0" % rng.randrange(4000), b"%011o " % 5, b" %010o\0" % 7,
                                                 b"%012o" % 9, b"00000000009\0", b"+0000000001\0", b"0000_000001\0",
                                                 b"\x80" + bytes(10) + b"\x07", bytes(rng.randrange(256) for _ in range(12))])
        elif what == "chk":
            x[hdr + 148:hdr + 156] = rng.choice([b"%06o \0", b"%07o\0", b" %06o\0", b"%06o  "]) % 0
        elif what == "byte":
            x[hdr + rng.randrange(512)] = rng.randrange(256)
        elif what == "truncate":
            del x[rng.randrange(len(x)):]
        elif what == "typ":
            x[hdr + 156] = rng.choice(b"0123456LKxgZ\0")
        else:
            x[hdr:hdr + 512] = bytes(512)
        if what != "truncate" and rng.random() < 0.85:  # most damage keeps a valid checksum
            h = x[hdr:hdr + 512]
            h[148:156] = b" " * 8
            x[hdr + 148:hdr + 156] = b"%06o\0 " % sum(h)
        p.write_bytes(x)
        ref = _reference(bytes(x))
        assert _scanned(p, max_member=1 << 20) == _scanned_reference(bytes(x)), f"case {case} ({what})"
        assert _scanned(p) == ref, f"case {case} ({what})"
        kinds["ok" if isinstance(ref, list) else "error"] += 1
    assert kinds["ok"] > 50 and kinds["error"] > 50, kinds


def _scanned_reference(raw: bytes):
    try:
        return [(m.name, m.size, m.type, m.data) for m in iter_members(io.BytesIO(raw), max_member=1 << 20)]
    except TarFormatError as e:
        return type(e), e.message


def test_scan_stops_at_a_file_that_shrank(tmp_path):
    raw = _tar([("a.jpg", os.urandom(50_000)), ("a.txt", b"t")], tarfile.USTAR_FORMAT)
    p = tmp_path / "t.tar"
    p.write_bytes(raw)
    with open(p, "rb") as f:
        (name, size, _k, off, data), _second = list(scan_members(f))
        assert len(data) < size
        os.truncate(p, off + 100)
        with pytest.raises(TarFormatError, match="shrank"):
            tarstream.read_at(f.fileno(), off, size, name)
        with pytest.raises(TarFormatError, match="shrank"):
            tarstream.read_at_into(f.fileno(), bytearray(size), off, size, name)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(key=TEXT, name=TEXT, text=st.dictionaries(TEXT, TEXT, max_size=4),
       binary=st.dictionaries(TEXT, st.text("ABCD+/=", max_size=8), max_size=3))
def test_meta_json_is_canonical_json(key, name, text, binary):
    meta: dict = {"key": key, "name": name}
    if text:
        meta["sidecars"] = text
    if binary:
        meta["binary"] = binary
    got = meta_json(key, name, text, binary)
    assert got == canonical_json(meta)
    assert json.loads(got) == meta


# ------------------------------------------------------------ two passes --
def _jpeg_with_app_segment(seed: int, app_bytes: int) -> bytes:
    """A JPEG whose frame header comes after ``app_bytes`` of APP1 segments (a large EXIF block)."""
    jpg = _jpg(seed)
    segs = b""
    while app_bytes > 0:
        n = min(app_bytes, 65533)
        segs += b"\xff\xe1" + (n + 2).to_bytes(2, "big") + bytes(n)
        app_bytes -= n
    return jpg[:2] + segs + jpg[2:]


def test_payload_headers_past_the_scan_window_are_read_on(tmp_path):
    """Sizes come from the head the scan brought when it holds the frame header, else from more bytes."""
    from warpdata.formats import tbl
    from warpdata.formats.imageinfo import image_info

    imgs = [_jpeg_with_app_segment(i, n) for i, n in enumerate((0, 3000, 30_000, 70_000, 140_000))]
    entries = [(f"s{i}.{ext}", data) for i, img in enumerate(imgs) for ext, data in (("cls", b"1"), ("jpg", img))]
    raw = _tar(entries, tarfile.USTAR_FORMAT)
    p, gz = tmp_path / "t.tar", tmp_path / "t.tar.gz"
    p.write_bytes(raw)
    gz.write_bytes(gzip.compress(raw, mtime=0))
    a, b = tmp_path / "a.tbl", tmp_path / "b.tbl"
    convert(ConvertRequest(str(p), str(a), workers=1, fsync=False))
    convert(ConvertRequest(str(gz), str(b), workers=1, fsync=False))
    assert a.read_bytes() == b.read_bytes()
    with tbl.TblReader(a) as r:
        for i, img in enumerate(imgs):
            info = image_info(img)
            assert (r.info(i).width, r.info(i).height) == (info.width, info.height) != (0, 0)
            assert bytes(r[i]) == img


def test_plans_past_the_memory_cap_spill_to_an_anonymous_file(tmp_path, monkeypatch):
    from warpdata.tbl import converter

    entries = [(f"s{i:04d}.{ext}", data) for i in range(300)
               for ext, data in (("jpg", _jpg(i % 7, i * 11)), ("txt", f"caption {i}".encode()))]
    p = tmp_path / "in" / "t.tar"
    p.parent.mkdir()
    p.write_bytes(_tar(entries, tarfile.PAX_FORMAT))
    a, b = tmp_path / "a" / "o.tbl", tmp_path / "b" / "o.tbl"
    convert(ConvertRequest(str(p), str(a), workers=2, fsync=False))
    spilled = []
    real = converter._PlanSpool.add

    def add(self, *plan):
        real(self, *plan)
        spilled.append(self._file is not None)
        if self._file is not None:  # anonymous: no name in the directory, even while it is in use
            assert os.listdir(b.parent) == []

    monkeypatch.setattr(converter._PlanSpool, "CAP", 1000)
    monkeypatch.setattr(converter._PlanSpool, "READ", 777)  # records straddle the pieces read back
    monkeypatch.setattr(converter._PlanSpool, "add", add)
    res = convert(ConvertRequest(str(p), str(b), workers=2, fsync=False))
    assert res.samples == 300 and sum(spilled) > 250
    assert a.read_bytes() == b.read_bytes()
    assert os.listdir(b.parent) == ["o.tbl"]
