"""tar-to-tbl on hostile input (tests/malformed/tar), file vs pipe agreement, and inspect --verify's report."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warpdata.core.errors import DataError, ExitCode
from warpdata.formats import tbl
from warpdata.tbl.converter import ConvertRequest, convert
from warpdata.tbl.tarstream import MemberTooLarge, TarFormatError, iter_members

HERE = Path(__file__).parents[1]
CASES = HERE / "malformed" / "tar"
EXPECTED = json.loads((CASES / "expected.json").read_text())
GOLDEN = HERE / "golden" / "tbl"


def _cases_module():
    spec = importlib.util.spec_from_file_location("tar_cases", CASES / "make_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_corpus_files_are_what_the_script_writes():
    made = _cases_module().cases()
    assert sorted(made) == sorted(EXPECTED)
    for name, (data, code, needle) in made.items():
        stored = (CASES / name).read_bytes()
        if name.endswith(".gz"):  # deflate output may differ between zlib builds: compare what matters
            assert stored[-8:-4] == data[-8:-4] or name == "gzip_truncated.tar.gz", name
        else:
            assert stored == data, name
        assert EXPECTED[name] == {"exit": code, "message": needle}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_tar_exits_65_with_its_reason_and_writes_nothing(cli, tmp_path, name):
    out = tmp_path / "out" / "o.tbl"
    out.parent.mkdir()
    r = cli("tar-to-tbl", CASES / name, out)
    assert r.code == EXPECTED[name]["exit"] == ExitCode.DATA, r.err
    assert EXPECTED[name]["message"] in r.err and "hint:" in r.err
    assert str(CASES / name) in r.err
    assert os.listdir(out.parent) == []  # no OUT, no temporary files


@pytest.mark.parametrize("name", ["truncated_in_padding.tar", "truncated_in_data.tar", "member_2pow40.tar",
                                  "empty.tar", "no_samples.tar", "gzip_bomb_16g.tar.gz", "gzip_truncated.tar.gz",
                                  "gzip_crc_mismatch.tar.gz"])
def test_stdin_and_file_agree(tmp_path, name):
    """The same bytes through a pipe (not seekable) give the same exit code and message as the file."""
    out = tmp_path / "o.tbl"
    code = "import sys; from warpdata.cli.app import tar_to_tbl_main; sys.exit(tar_to_tbl_main())"
    p = subprocess.run([sys.executable, "-c", code, "-", str(out)], input=(CASES / name).read_bytes(),
                       capture_output=True, timeout=120)
    assert p.returncode == ExitCode.DATA, p.stderr
    assert EXPECTED[name]["message"].encode() in p.stderr
    assert os.listdir(tmp_path) == []


def test_cut_in_padding_from_a_file_object_is_an_error_not_fewer_samples():
    """The issue's case: a seek past the end of a file used to succeed and end the archive early."""
    data = (CASES / "truncated_in_padding.tar").read_bytes()
    for f in (io.BytesIO(data), open(CASES / "truncated_in_padding.tar", "rb")):  # noqa: SIM115
        with f, pytest.raises(TarFormatError, match="ends inside the padding of member 's/0006.cls'"):
            list(iter_members(f))
        # with_data=False (a header-only pass) seeks over data and padding alike
    with open(CASES / "truncated_in_padding.tar", "rb") as f, pytest.raises(TarFormatError, match="padding"):
        list(iter_members(f, with_data=False))


def test_member_cap_is_checked_before_any_byte_is_decompressed(tmp_path):
    """A real gzip bomb in miniature: 64 MiB of zeros in ~64 KiB; the cap refuses it at its header."""
    mod = _cases_module()
    big = 64 << 20
    raw = mod.header("bomb/0000.png", big) + mod.PNG + bytes(big - len(mod.PNG)) + mod.END
    p = tmp_path / "bomb.tar.gz"
    p.write_bytes(gzip.compress(raw, 1))
    assert p.stat().st_size < 1 << 20
    with gzip.open(p, "rb") as f:
        it = iter_members(f, max_member=16 << 20)
        with pytest.raises(MemberTooLarge) as ei:
            next(it)
        assert f.tell() <= 64 << 10  # only the header block (plus gzip's read-ahead) was decompressed
    e = ei.value
    assert isinstance(e, DataError) and e.details["limit"] == 16 << 20 and e.details["size"] == big
    assert "--max-member-mb" in e.hint
    with pytest.raises(MemberTooLarge, match="67,108,864 bytes"):
        convert(ConvertRequest(str(p), str(tmp_path / "o.tbl"), workers=1, fsync=False,
                               max_member_bytes=16 << 20))
    assert not (tmp_path / "o.tbl").exists()


def test_max_member_mb_flag_raises_the_limit(cli, tmp_path):
    mod = _cases_module()
    payload = mod.PNG + bytes((2 << 20) - len(mod.PNG))
    p = tmp_path / "two_mib.tar"
    p.write_bytes(mod.member("k/0000.png", payload) + mod.END)
    r = cli("tar-to-tbl", p, tmp_path / "a.tbl", "--max-member-mb", "1")
    assert r.code == 65 and "--max-member-mb" in r.err and "2,097,152 bytes" in r.err
    r = cli("tar-to-tbl", p, tmp_path / "a.tbl", "--max-member-mb", "3")
    assert r.code == 0, r.err
    assert bytes(tbl.TblReader(tmp_path / "a.tbl")[0]) == payload


def test_cut_exactly_between_members_is_tolerated_like_tar(tmp_path):
    """No end-of-archive blocks after a complete member: tar(1) accepts it, so do we (file and pipe)."""
    mod = _cases_module()
    data = mod.sixteen()
    one = len(mod.member("s/0000.png", mod.PNG)) + len(mod.member("s/0000.cls", b"0"))
    p = tmp_path / "six.tar"
    p.write_bytes(data[:6 * one])
    res = convert(ConvertRequest(str(p), str(tmp_path / "o.tbl"), workers=1, fsync=False))
    assert res.samples == 6


# ------------------------------------------------------------ inspect --verify --
def test_inspect_verify_says_what_it_checked(cli):
    plain = cli("inspect", GOLDEN / "warp_lz4.tbl")
    assert plain.code == 0 and "verified" not in plain.out
    r = cli("inspect", "--verify", GOLDEN / "warp_lz4.tbl")
    assert r.code == 0
    assert r.out != plain.out
    for needle in ("CRC-32 of the 64 header bytes", "CRC-32 of 4 entries", "4 payload CRC-32 trailers",
                   "section CRC-32 and 4 block CRC-32s", "every check passed"):
        assert needle in r.out, needle
    d = cli("inspect", "--verify", "--json", GOLDEN / "warp_lz4.tbl").json()
    assert d["verified"] is True
    assert {k: v["ok"] for k, v in d["verification"].items()} == {
        "header": True, "index": True, "payloads": True, "metadata": True}


def test_inspect_verify_on_turboloader_file_names_the_missing_crcs(cli):
    r = cli("inspect", "--verify", GOLDEN / "turboloader_none.tbl")
    assert r.code == 0
    assert "no index CRC in this file" in r.out and "no metadata CRCs in this file" in r.out
    assert "4 payload CRC-16s" in r.out


def test_inspect_verify_fails_on_an_edited_label(cli, tmp_path):
    """The issue's case: one bit turns a .cls label 4 into 5; verify used to exit 0."""
    from warpdata.sampledata.wds import write_tar

    src = HERE / "golden" / "tbl" / "make_golden.py"
    spec = importlib.util.spec_from_file_location("g", src)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    write_tar(tmp_path / "x.tar", [(f"k{i}", {"png": g._png(4, 4, i), "cls": b"4"}) for i in range(3)])
    out = tmp_path / "x.tbl"
    convert(ConvertRequest(str(tmp_path / "x.tar"), str(out), workers=1, fsync=False))
    b = bytearray(out.read_bytes())
    at = b.index(b'"cls":"4"', tbl.TblReader(out).header.metadata_offset)
    b[at + 7] ^= 0x01  # "4" -> "5"
    out.write_bytes(b)
    r = cli("inspect", "--verify", out)
    assert r.code == 1
    assert "FAILED" in r.out
    assert "sample 0: metadata block 0" in r.err
