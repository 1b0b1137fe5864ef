"""tar -> tbl fast path: O_DIRECT payload writes, in-place reads into the staging buffer, deferred members.

Whatever path the bytes take (O_DIRECT staging, page cache, a count that
misses, payloads bigger than a staging buffer, chunk boundaries inside a
payload or a trailer), the output is the same file, byte for byte.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.directio import wants_direct
from warpdata.formats import tbl
from warpdata.sampledata.photos import encode_jpeg, synthetic_photo
from warpdata.tbl import converter as conv
from warpdata.tbl.converter import ConvertRequest, convert
from warpdata.tbl.tarstream import TarFormatError, iter_members, member_data, read_member_into

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux-only")


def _tar(path, entries):
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 0
            tf.addfile(ti, io.BytesIO(data))
    return str(path)


@pytest.fixture(scope="module")
def photo_tar(tmp_path_factory):
    """Photos of many sizes (2 KB .. 70 KB), one sidecar each, one big binary sidecar, one PNG-less sample."""
    rng = np.random.default_rng(5)
    entries = []
    for i in range(40):
        w, h = (int(x) for x in rng.integers(24, 260, size=2))
        entries.append((f"s{i:03d}.jpg", encode_jpeg(synthetic_photo(rng, w, h), 95)))
        entries.append((f"s{i:03d}.cls", str(i).encode()))
        if i == 7:  # a sidecar bigger than the deferral threshold, not UTF-8
            entries.append((f"s{i:03d}.bin", bytes(rng.integers(0, 256, 40_000, dtype=np.uint8))))
    entries.append(("zz.txt", b"no image here"))
    return _tar(tmp_path_factory.mktemp("direct") / "photos.tar", entries)


@pytest.fixture
def small_chunks(monkeypatch):
    """Staging buffers of 3 pages and a flush every 2 chunks: boundaries fall inside payloads and trailers."""
    monkeypatch.setattr(tbl._DirectPayloads, "CHUNK", 3 * 4096)
    monkeypatch.setattr(tbl._DirectPayloads, "SYNC_EVERY", 2 * 3 * 4096)
    monkeypatch.setattr(conv, "_DEFER_ABOVE", 1024)


def _convert(src, out, monkeypatch, direct: str, **kw):
    monkeypatch.setenv("WARP_DIRECT_IO", direct)
    convert(ConvertRequest(str(src), str(out), **kw))
    return hashlib.sha256(out.read_bytes()).hexdigest()


@pytest.mark.parametrize("workers", [1, 2])
def test_direct_output_identical_to_page_cache_output(photo_tar, tmp_path, monkeypatch, small_chunks, workers):
    if not wants_direct(tmp_path):
        pytest.skip("the test directory's filesystem takes no O_DIRECT")
    used = []
    real = tbl._DirectPayloads.slot

    def counting_slot(self, n):
        got = real(self, n)
        used.append(got is not None)
        return got

    monkeypatch.setattr(tbl._DirectPayloads, "slot", counting_slot)
    direct = _convert(photo_tar, tmp_path / "d.tbl", monkeypatch, "1", workers=workers)
    assert any(used) and not all(used)  # filled in place, and copied where a payload crossed a boundary
    buffered = _convert(photo_tar, tmp_path / "b.tbl", monkeypatch, "0", workers=workers)
    no_fsync = _convert(photo_tar, tmp_path / "n.tbl", monkeypatch, "1", workers=workers, fsync=False)
    assert direct == buffered == no_fsync
    with tbl.TblReader(tmp_path / "d.tbl", verify=True) as r:
        assert len(r) == 40 and not r.verify_all()
        assert r.metadata(7)["binary"]["bin"]  # the deferred big sidecar was read


def test_direct_writer_used_aligned_writes(tmp_path, monkeypatch):
    """The sink really writes with O_DIRECT, and a payload bigger than a staging buffer is split correctly."""
    if not wants_direct(tmp_path):
        pytest.skip("the test directory's filesystem takes no O_DIRECT")
    monkeypatch.setattr(tbl._DirectPayloads, "CHUNK", 2 * 4096)
    payloads = [os.urandom(n) for n in (5, 4096, 20_000, 1, 8192, 3 * 8192 + 7)]
    w = tbl.TblWriter(tmp_path / "a.tbl", compression="none", expected_samples=len(payloads))
    assert isinstance(w._pay, tbl._DirectPayloads)
    sink = w._pay
    for p in payloads:
        w.add(p, format="unknown", width=0, height=0, metadata={"n": len(p)})
    w.close()
    assert sink._file.direct_bytes > 0
    monkeypatch.setenv("WARP_DIRECT_IO", "0")
    with tbl.TblWriter(tmp_path / "b.tbl", compression="none", expected_samples=len(payloads)) as w2:
        assert not isinstance(w2._pay, tbl._DirectPayloads)
        for p in payloads:
            w2.add(p, format="unknown", width=0, height=0, metadata={"n": len(p)})
    assert (tmp_path / "a.tbl").read_bytes() == (tmp_path / "b.tbl").read_bytes()
    with tbl.TblReader(tmp_path / "a.tbl") as r:
        assert [bytes(r[i]) for i in range(len(r))] == payloads


def test_direct_count_mismatch_and_abort(tmp_path, monkeypatch):
    """A wrong sample-count hint moves the directly written payloads; an abort leaves no file."""
    monkeypatch.setenv("WARP_DIRECT_IO", "1")
    monkeypatch.setattr(tbl._DirectPayloads, "CHUNK", 4096)
    payloads = [os.urandom(3000 + 100 * i) for i in range(6)]
    with tbl.TblWriter(tmp_path / "m.tbl", compression="none", expected_samples=9) as w:
        for p in payloads:
            w.add(p, format="unknown", width=0, height=0)
    with tbl.TblReader(tmp_path / "m.tbl") as r:
        assert [bytes(r[i]) for i in range(len(r))] == payloads and not r.verify_all()
    with pytest.raises(RuntimeError), tbl.TblWriter(tmp_path / "x.tbl", expected_samples=6) as w:
        for p in payloads:
            w.add(p, format="unknown", width=0, height=0)
        raise RuntimeError("stop")
    assert sorted(os.listdir(tmp_path)) == ["m.tbl"]


def test_deferred_members_and_a_file_that_shrinks(tmp_path):
    big, small = os.urandom(50_000), b"tiny"
    path = _tar(tmp_path / "t.tar", [("a.jpg", big), ("a.txt", small), ("b.jpg", big[:20_001])])
    with open(path, "rb") as f:
        ms = list(iter_members(f, defer_above=4096))
        stream = io.BytesIO(Path(path).read_bytes())
        list(iter_members(stream))
        assert f.tell() == stream.tell() > 0  # left after the end block, as a stream read leaves it
        assert [m.deferred for m in ms] == [True, False, True]
        assert ms[1].data == small and member_data(ms[0]) == big
        buf = bytearray(20_001)
        read_member_into(ms[2], buf)
        assert bytes(buf) == big[:20_001]
        os.truncate(path, ms[2].file_offset + 100)  # another process cuts the file after the scan
        with pytest.raises(TarFormatError, match="shrank"):
            member_data(ms[2])
        with pytest.raises(TarFormatError, match="shrank"):
            read_member_into(ms[2], buf)
    # and a scan of the cut file says where it ends
    with open(path, "rb") as f, pytest.raises(TarFormatError, match="ends inside member 'b.jpg'"):
        list(iter_members(f, defer_above=4096))


def test_pipes_and_gzip_never_defer(tmp_path):
    import gzip

    path = _tar(tmp_path / "t.tar", [("a.jpg", os.urandom(30_000))])
    raw = Path(path).read_bytes()
    for stream in (io.BytesIO(raw), gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(raw)))):
        (m,) = iter_members(stream, defer_above=10)
        assert not m.deferred and len(m.data) == 30_000


def _full_count(path):
    from warpdata.tbl.tarstream import group_samples, open_input

    f, _size = open_input(path)
    try:
        return sum(conv.choose_payload(s) is not None
                   for s in group_samples(iter_members(f, with_data=False), lambda _n, _r: None))
    finally:
        f.close()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_planned_count_agrees_with_the_parser(tmp_path, fmt, monkeypatch):
    """A plain file is planned whole first: the writer learns the parser's sample count before any payload."""
    jpg = encode_jpeg(synthetic_photo(np.random.default_rng(1), 16, 16))
    deep = "d" * 90 + "/" + "e" * 60  # > 100 characters: a ustar prefix, a GNU long name or a PAX path
    entries = [("a.jpg", jpg), ("a.txt", b"x"), ("dir/", None), ("b.txt", b"no image"), ("noext", b"?"),
               ("c.PNG", jpg), ("c.json", b"{}"), (f"{deep}/k.jpg", jpg), ("a.jpg", jpg), ("z.webp", jpg)]
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name.rstrip("/"))
            ti.mtime = 0
            if data is None:
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    full = _full_count(path)
    assert full == 5  # a, c, k, a again (a new run of the key), z
    seen = []
    real_close = tbl.TblWriter.close

    def close(self, **kw):
        seen.append((self._expected, self.num_samples))
        return real_close(self, **kw)

    monkeypatch.setattr(tbl.TblWriter, "close", close)
    res = convert(ConvertRequest(str(path), str(tmp_path / "o.tbl"), workers=1, fsync=False))
    assert res.samples == full and seen == [(full, full)]  # payloads written in place, never moved
    raw = path.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[:700])  # a cut inside the first member: the parser's error, nothing written
    with pytest.raises(TarFormatError, match="ends inside"):
        convert(ConvertRequest(str(cut), str(tmp_path / "cut.tbl"), workers=1, fsync=False))
    assert not (tmp_path / "cut.tbl").exists()
