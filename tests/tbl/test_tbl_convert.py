"""tar -> tbl: tar dialects, sample grouping, sidecars, skips, errors, CLI and inspect."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.errors import DataError, UsageError
from warpdata.formats import tbl
from warpdata.sampledata.photos import encode_jpeg, encode_png, synthetic_photo
from warpdata.sampledata.wds import generate, write_tar
from warpdata.tbl.converter import ConvertRequest, convert
from warpdata.tbl.tarstream import TarFormatError, iter_members, split_key


def _jpg(seed=0, w=32, h=24):
    return encode_jpeg(synthetic_photo(np.random.default_rng(seed), w, h))


def _tar(path, entries, fmt=tarfile.PAX_FORMAT):
    """entries: (name, bytes) regular files, or (name, ("type", TarInfo type)) for others."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            if isinstance(data, bytes):
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                ti.type = data = data[1]
                if data in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    ti.linkname = "x"
                tf.addfile(ti)
    return str(path)


@pytest.fixture(scope="module")
def wds_tar(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("wds") / "s.tar", count=24, seed=3)["path"]


# ----------------------------------------------------------------- tarstream --
@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_dialects_long_names(tmp_path, fmt):
    long_name = "d" * 90 + "/" + "n" * 60 + ".jpg"  # > 100 chars: prefix, GNU L or PAX path
    entries = [("short.jpg", b"abc"), (long_name, b"x" * 700)]
    if fmt != tarfile.USTAR_FORMAT:
        entries.append(("ünï/" + "z" * 120 + ".txt", b"t"))
    p = _tar(tmp_path / "t.tar", entries, fmt)
    with open(p, "rb") as f:
        got = [(m.name, m.data) for m in iter_members(f)]
    assert got == entries
    with open(p, "rb") as f:
        assert [m.size for m in iter_members(f, with_data=False)] == [len(d) for _n, d in entries]


def test_tar_damage_is_reported(tmp_path):
    p = _tar(tmp_path / "t.tar", [("a.jpg", b"x" * 2000), ("b.jpg", b"y" * 10)])
    raw = Path(p).read_bytes()
    with pytest.raises(TarFormatError, match="ends inside member"):
        list(iter_members(io.BytesIO(raw[:512 * 3])))
    bad = bytearray(raw)
    bad[512 * 5 + 10] ^= 0xFF  # inside the second header (after PAX-less header + 4 data blocks)
    with pytest.raises(TarFormatError, match="checksum"):
        list(iter_members(io.BytesIO(bytes(bad))))
    with pytest.raises(TarFormatError, match="not a tar archive"):
        list(iter_members(io.BytesIO(b"hello" * 200)))


def test_split_key_follows_webdataset():
    assert split_key("a/b/c.seg.png") == ("a/b/c", "seg.png")
    assert split_key("x.y/z.jpg") == ("x.y/z", "jpg")
    assert split_key("noext") is None and split_key("dir/.hidden") is None


# ----------------------------------------------------------------- converter --
def test_convert_keeps_every_member(tmp_path, wds_tar):
    out = tmp_path / "o.tbl"
    res = convert(ConvertRequest(wds_tar, str(out), workers=2, verify=True))
    assert (res.samples, res.sidecars, res.skipped, res.members) == (24, 72, 0, 96)
    assert res.verified is True and res.formats == {"jpeg": 24}
    with tarfile.open(wds_tar) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    r = tbl.TblReader(out)
    assert r.header.flags & tbl.F_WARP_METADATA
    for i in range(len(r)):
        meta = r.metadata(i)
        key = meta["key"]
        assert bytes(r[i]) == members[f"{key}.jpg"] and meta["name"] == f"{key}.jpg"
        assert {ext: v.encode() for ext, v in meta["sidecars"].items()} == \
            {e: members[f"{key}.{e}"] for e in ("cls", "json", "txt")}
        assert (r.info(i).width, r.info(i).height) == tuple(json.loads(meta["sidecars"]["json"])[k]
                                                            for k in ("width", "height"))
    assert len(r.key(1)) > 100 and r.key(2) == "unicode/échantillon-000002"
    assert r.index_of(r.key(1)) == 1


def test_convert_output_independent_of_workers_and_input_route(tmp_path, wds_tar):
    a, b, c = tmp_path / "a.tbl", tmp_path / "b.tbl", tmp_path / "c.tbl"
    convert(ConvertRequest(wds_tar, str(a), workers=1))
    convert(ConvertRequest(wds_tar, str(b), workers=2))
    gz = tmp_path / "s.tar.gz"
    gz.write_bytes(gzip.compress(Path(wds_tar).read_bytes(), mtime=0))
    res = convert(ConvertRequest(str(gz), str(c), workers=2))
    assert res.tar_bytes is None  # streamed: size unknown, spool path used
    assert a.read_bytes() == b.read_bytes() == c.read_bytes()


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd", "auto"])
def test_convert_compression_modes(tmp_path, compression):
    rng = np.random.default_rng(1)
    raw_bmp = io.BytesIO()
    from PIL import Image

    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(raw_bmp, format="BMP")
    p = _tar(tmp_path / "t.tar", [("a.jpg", _jpg()), ("b.bmp", raw_bmp.getvalue()),
                                  ("c.png", encode_png(synthetic_photo(rng, 10, 10)))])
    out = tmp_path / "o.tbl"
    res = convert(ConvertRequest(p, str(out), compression=compression, level=None))
    r = tbl.TblReader(out)
    codecs = [r.info(i).compression for i in range(3)]
    expect_bmp = {"none": "none", "lz4": "lz4", "zstd": "zstd", "auto": "lz4"}[compression]
    assert codecs[1] == expect_bmp
    if compression in ("none", "auto"):
        assert codecs[0] == codecs[2] == "none"
    assert res.compressed_samples == sum(c != "none" for c in codecs)
    assert bytes(r[1]) == raw_bmp.getvalue()


def test_convert_reports_every_skip(tmp_path):
    p = _tar(tmp_path / "t.tar", [
        ("dir", ("type", tarfile.DIRTYPE)),
        ("s1.jpg", _jpg(1)), ("s1.cls", b"3"), ("s1.npy", b"\x93NUMPY\xff\xfe"),
        ("s2.json", b"{}"),  # no image member
        ("README", b"no extension"),
        ("s3.jpg", _jpg(3)), ("s3.txt", b"a"), ("s3.txt", b"b"),  # duplicate extension
        ("link.jpg", ("type", tarfile.SYMTYPE)),
        ("s4.seg.png", encode_png(np.zeros((4, 6, 3), np.uint8))),  # compound extension
    ])
    out = tmp_path / "o.tbl"
    res = convert(ConvertRequest(p, str(out), workers=1))
    assert res.samples == 3 and res.members == 11
    assert res.skipped == 5
    reasons = {e["member"]: e["reason"] for e in res.skipped_examples}
    assert reasons["dir/"].startswith("not a regular file")
    assert "no image member" in reasons["s2.json"]
    assert "no extension" in reasons["README"]
    assert "second '.txt'" in reasons["s3.txt"]
    assert reasons["link.jpg"] == "not a regular file (symlink)"
    r = tbl.TblReader(out)
    assert r.metadata(0)["binary"] == {"npy": "k05VTVBZ//4="} and r.metadata(0)["sidecars"] == {"cls": "3"}
    assert r.metadata(1)["sidecars"] == {"txt": "a"}
    assert r.metadata(2)["name"] == "s4.seg.png" and (r.info(2).width, r.info(2).height) == (6, 4)
    assert res.samples + res.sidecars + res.skipped == res.members


@pytest.mark.parametrize("on_error", ["raise", "skip", "warn"])
def test_bad_image_header_policies(tmp_path, on_error):
    p = _tar(tmp_path / "t.tar", [("a.jpg", _jpg()), ("b.jpg", b"\xff\xd8\xff\xe0\x00"), ("b.cls", b"1"),
                                  ("c.png", b"not a png at all")])
    out = tmp_path / "o.tbl"
    warnings = []
    if on_error == "raise":
        with pytest.raises(DataError, match="b.jpg") as ei:
            convert(ConvertRequest(p, str(out), on_error=on_error))
        assert "--on-error" in ei.value.hint
        assert os.listdir(tmp_path) == ["t.tar"]  # nothing half-written
        return
    res = convert(ConvertRequest(p, str(out), on_error=on_error), warn=warnings.append)
    assert res.samples == 1 and res.skipped == 3
    assert len(warnings) == (2 if on_error == "warn" else 0)


def test_interrupted_conversion_leaves_no_output(tmp_path, wds_tar):
    out = tmp_path / "o.tbl"

    def progress(n, _pos):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(ConvertRequest(wds_tar, str(out), workers=2), progress=progress)
    assert os.listdir(tmp_path) == []


def test_bad_requests(tmp_path, wds_tar):
    with pytest.raises(UsageError):
        convert(ConvertRequest(wds_tar, str(tmp_path / "o.tbl"), compression="gzip"))
    with pytest.raises(UsageError):
        convert(ConvertRequest(wds_tar, str(tmp_path / "o.tbl"), on_error="ignore"))
    with pytest.raises(UsageError):
        convert(ConvertRequest(wds_tar, wds_tar))


def test_wds_generator_is_deterministic(tmp_path):
    a = generate(tmp_path / "a.tar", count=5, seed=9)
    b = generate(tmp_path / "b", count=5, seed=9)
    assert Path(a["path"]).read_bytes() == Path(b["path"]).read_bytes()
    assert b["path"].endswith("shard-000000.tar") and a["members"] == 20


# ----------------------------------------------------------------------- CLI --
def test_cli_tar_to_tbl_json_and_inspect(cli, tmp_path, wds_tar):
    out = tmp_path / "o.tbl"
    r = cli("tar-to-tbl", wds_tar, out, "--json", "--verify")
    assert r.code == 0, r.err
    d = r.json()
    assert d["samples"] == 24 and d["verified"] is True and d["skipped"] == 0
    assert d["ratio"] < 1 and d["output_bytes"] == out.stat().st_size
    r = cli("tar-to-tbl", wds_tar, out)
    assert r.code == 2 and "--force" in r.err
    r = cli("tar-to-tbl", wds_tar, out, "--force", "--compression", "zstd")
    assert r.code == 0 and "samples" in r.out
    r = cli("inspect", out, "--json", "--head", "2")
    assert r.code == 0
    d = r.json()
    assert d["kind"] == "tbl" and d["samples"] == 24 and sum(d["compression"].values()) == 24
    assert d["extensions"][:2] == ["payload-crc32", "index-crc32"] and d["formats"] == {"jpeg": 24}
    assert len(d["tables"]["samples"]) == 2 and d["tables"]["samples"][0]["key"]
    r = cli("inspect", "--verify", out)
    assert r.code == 0 and "tbl:" in r.out


def test_cli_inspect_verify_exits_1_on_corruption(cli, tmp_path, wds_tar):
    out = tmp_path / "o.tbl"
    convert(ConvertRequest(wds_tar, str(out)))
    b = bytearray(out.read_bytes())
    r0 = tbl.TblReader(out)
    b[r0.info(5).offset + 100] ^= 0x40
    r0.close()
    out.write_bytes(b)
    r = cli("inspect", "--verify", "--json", out)
    assert r.code == 1
    d = json.loads(r.out.split("\n}\n")[0] + "\n}")
    assert d["ok"] is False and d["corrupt_samples"][0]["index"] == 5
    r = cli("inspect", out)
    assert r.code == 0  # without --verify only the index is checked


def test_cli_errors(cli, tmp_path):
    r = cli("tar-to-tbl", tmp_path / "missing.tar", tmp_path / "o.tbl")
    assert r.code == 66 and "hint:" in r.err
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 1024)
    r = cli("tar-to-tbl", bad, tmp_path / "o.tbl")
    assert r.code == 65 and "not a tar archive" in r.err
    assert not (tmp_path / "o.tbl").exists()
    r = cli("inspect", Path(__file__).parents[1] / "malformed" / "tbl" / "wrong_version.tbl")
    assert r.code == 65 and "version 3" in r.err


def test_stdin_pipeline_and_console_script(tmp_path, wds_tar):
    out = tmp_path / "o.tbl"
    code = "import sys; from warpdata.cli.app import tar_to_tbl_main; sys.exit(tar_to_tbl_main())"
    with open(wds_tar, "rb") as f:
        p = subprocess.run([sys.executable, "-c", code, "-", str(out), "--json"], stdin=f,
                           capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["samples"] == 24 and p.stderr == b""
    assert tbl.TblReader(out).verify_all() == []


def test_write_tar_helper_roundtrip(tmp_path):
    info = write_tar(tmp_path / "x.tar", [("k1", {"jpg": _jpg(), "cls": b"1"})])
    assert info["samples"] == 1 and info["members"] == 2


def test_cli_quiet_prints_only_the_output_path(cli, tmp_path, wds_tar):
    out_path = tmp_path / "q.tbl"
    r = cli("tar-to-tbl", "-q", wds_tar, out_path)
    assert r.code == 0, r.err
    assert r.out.strip() == str(out_path)
    assert tbl.TblReader(out_path).num_samples > 0


def test_cli_not_a_tar_names_the_input(cli, tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello, not a tar\n" * 64)
    r = cli("tar-to-tbl", bogus, tmp_path / "out.tbl")
    assert r.code == 65
    assert f"{bogus}: not a tar archive" in r.err
    assert not (tmp_path / "out.tbl").exists()
