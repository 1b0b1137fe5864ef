"""formats/bounded.py: a frame is decoded to the size its container says, and never allocates past it.

The bombs are real zstd frames (tests/malformed/bombs/make_bombs.py builds them: RLE blocks of
zeros); memory is checked in a child process under an address-space cap, by its peak RSS.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import lz4.block
import pytest
import zstandard
from warpdata.core.errors import DataError
from warpdata.formats import bounded

HERE = Path(__file__).resolve().parent.parent


def _bombs():
    spec = importlib.util.spec_from_file_location("make_bombs_unit", HERE / "malformed" / "bombs" / "make_bombs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


zstd_zeros = _bombs().zstd_zeros


def test_the_bomb_frames_are_valid_zstd():
    for declare in (True, False):
        frame = zstd_zeros(3 << 17, declare=declare)
        assert zstandard.frame_content_size(frame) == ((3 << 17) if declare else -1)
        assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=3 << 17) == bytes(3 << 17)
    assert len(zstd_zeros(1 << 32)) == 131_086  # the "131 KB frame declaring 4 GiB"


@pytest.mark.parametrize("declare", [True, False])
def test_a_frame_of_the_expected_size_decodes(declare):
    data = bytes(range(256)) * 300
    c = zstandard.ZstdCompressor(level=3, write_content_size=declare)
    assert bounded.zstd(c.compress(data), len(data), where="x") == data
    assert bounded.zstd(zstd_zeros(1000, declare=declare), 1000, where="x") == bytes(1000)
    assert bounded.lz4_block(lz4.block.compress(data, store_size=False), len(data), where="x") == data


def test_empty_frame():
    assert bounded.zstd(zstandard.ZstdCompressor().compress(b""), 0, where="x") == b""


@pytest.mark.parametrize(("frame", "expected", "needle"), [
    (zstd_zeros(1 << 32), 64, "the zstd frame declares 4,294,967,296 decoded bytes, the container expects 64"),
    (zstd_zeros(100), 64, "declares 100 decoded bytes"),
    (zstd_zeros(1 << 32, declare=False), 1 << 20, "(no declared size) decodes to more bytes than the container "
                                                   "expects (1,048,576)"),
    (zstd_zeros(100, declare=False), 1000, "decodes to 100 bytes, the container expects 1,000"),
    # a lying container: no 150-byte frame holds 2 GiB, refused before the 2 GiB buffer
    (zstd_zeros(4 << 17, declare=False), 1 << 31, "more than a zstd frame that size can hold"),
], ids=["declares-4gib", "declares-less", "undeclared-more", "undeclared-less", "impossible-ratio"])
def test_size_lies_are_typed(frame, expected, needle):
    with pytest.raises(bounded.FrameSizeError) as ei:
        bounded.zstd(frame, expected, where="f.bin: chunk 7", path="f.bin")
    e = ei.value
    assert isinstance(e, DataError) and e.exit_code == 65 and e.hint
    assert e.message.startswith("f.bin: chunk 7: ") and needle in e.message, e.message
    assert e.details["path"] == "f.bin" and e.details["expected"] == expected


def test_undecodable_frames_are_the_callers_error():
    class Mine(DataError):
        pass

    with pytest.raises(Mine, match="zstd decompression failed"):
        bounded.zstd(b"not a zstd frame", 10, where="x", error=Mine)
    good = zstandard.ZstdCompressor(level=3).compress(bytes(range(200)) * 50)
    with pytest.raises(Mine, match="zstd decompression failed"):
        bounded.zstd(good[:-6], 10_000, where="x", error=Mine)  # truncated
    with pytest.raises(Mine, match="lz4 decompression failed"):
        bounded.lz4_block(b"\xff" * 40, 1000, where="x", error=Mine)


def test_lz4_past_its_expansion_limit_is_refused_unallocated():
    with pytest.raises(bounded.FrameSizeError, match="more than LZ4's 255x expansion allows"):
        bounded.lz4_block(b"\x00" * 16, 1 << 31, where="x")


_CAPPED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))
sys.path.insert(0, sys.argv[1])
from make_bombs import zstd_zeros
from warpdata.formats import bounded
for declare in (True, False):
    try:
        bounded.zstd(zstd_zeros(1 << 32, declare=declare), 1 << 20, where="bomb")
    except bounded.FrameSizeError as e:
        print(type(e).__name__, e.exit_code)
print([ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()[1])
"""


def test_a_4gib_bomb_stays_within_a_768mib_address_space():
    p = subprocess.run([sys.executable, "-c", _CAPPED, str(HERE / "malformed" / "bombs")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "MemoryError" not in p.stderr, p.stderr[-2000:]
    lines = p.stdout.split()
    assert lines[:4] == ["FrameSizeError", "65", "FrameSizeError", "65"], p.stdout
    assert int(lines[4]) < 200 << 10, f"peak RSS {int(lines[4]) >> 10} MiB"


def test_pieces_give_the_same_bytes_and_the_same_refusals():
    data = bytes(range(256)) * 40_000  # 10 MB
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    pieces = list(bounded.zstd_pieces(frame, len(data), where="x", piece=1 << 20))
    assert b"".join(pieces) == data and max(map(len, pieces)) <= 1 << 20
    with pytest.raises(bounded.FrameSizeError, match="declares 4,294,967,296 decoded bytes"):
        next(bounded.zstd_pieces(zstd_zeros(1 << 32), 1 << 20, where="x"))
    with pytest.raises(bounded.FrameSizeError, match=r"\(no declared size\) decodes to more bytes"):
        for _ in bounded.zstd_pieces(zstd_zeros(1 << 32, declare=False), 1 << 20, where="x", piece=1 << 16):
            pass
    with pytest.raises(bounded.FrameSizeError, match="decodes to 100 bytes"):
        list(bounded.zstd_pieces(zstd_zeros(100, declare=False), 1000, where="x"))
