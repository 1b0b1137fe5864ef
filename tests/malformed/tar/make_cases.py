"""Write the hostile / malformed tar inputs for ``warp tar-to-tbl`` (run by hand, never by tests).

    .venv/bin/python tests/malformed/tar/make_cases.py --write

``expected.json`` maps each file to the exit code and a message fragment
``tests/tbl/test_tbl_integrity.py`` expects. Headers are built byte by byte
here (fixed mtime, names and payloads), so the files never change between
Python versions.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
BLOCK = 512


def header(name: str, size: int | bytes, typ: bytes = b"0") -> bytes:
    """A ustar header; ``size`` as an int (octal, or GNU base-256 when too big) or a raw 12-byte field."""
    h = bytearray(BLOCK)
    h[0:len(name)] = name.encode()
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    if isinstance(size, bytes):
        h[124:136] = size
    elif size < 8 ** 11:
        h[124:136] = b"%011o\0" % size
    else:
        h[124:136] = b"\x80" + size.to_bytes(11, "big")
    h[136:148] = b"00000000000\0"
    h[156:157] = typ
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def member(name: str, data: bytes) -> bytes:
    pad = -len(data) % BLOCK
    return header(name, len(data)) + data + bytes(pad)


def pax(records: dict[str, str]) -> bytes:
    """A PAX extended header ('x') with ``records``; each record's length counts its own digits."""
    body = b""
    for k, v in records.items():
        rec = f" {k}={v}\n".encode()
        n = len(rec) + len(str(len(rec)))
        n = len(rec) + len(str(n))
        body += str(n).encode() + rec
    return header("PaxHeader/x", len(body), b"x") + body + bytes(-len(body) % BLOCK)


# a tiny PNG-like header is enough: imageinfo reads sizes from the header only
PNG = (b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + (4).to_bytes(4, "big") + (3).to_bytes(4, "big")
       + b"\x08\x02\0\0\0" + b"\0\0\0\0" + b"payload" * 20)
END = bytes(2 * BLOCK)


def sixteen() -> bytes:
    out = b""
    for i in range(16):
        out += member(f"s/{i:04d}.png", PNG) + member(f"s/{i:04d}.cls", str(i % 10).encode())
    return out + END


def cases() -> dict[str, tuple[bytes, int, str]]:
    full = sixteen()
    one = len(member("s/0000.png", PNG)) + len(member("s/0000.cls", b"0"))
    cls7 = 6 * one + len(member("s/0006.png", PNG))  # header of s/0006.cls
    out = {
        # cut inside the padding after s/0006.cls's one data byte: the old file path wrote 6 samples
        "truncated_in_padding.tar": (full[:cls7 + BLOCK + 100], 65, "ends inside the padding of member"),
        "truncated_in_data.tar": (full[:6 * one + BLOCK + 40], 65, "ends inside member"),
        "truncated_in_header.tar": (full[:6 * one + 200], 65, "ends inside a header"),
        "member_2pow40.tar": (header("big/0000.png", 1 << 40) + PNG + bytes(BLOCK) + END, 65,
                              "declares 1,099,511,627,776 bytes"),
        "size_not_octal.tar": (header("x/0000.png", b"0000000019 \0") + PNG + END, 65, "is not octal"),
        "size_plus_sign.tar": (header("x/0000.png", b"+0000000232\0") + PNG + END, 65, "is not octal"),
        "size_underscore.tar": (header("x/0000.png", b"00000_00232\0") + PNG + END, 65, "is not octal"),
        "size_base256_negative.tar": (header("x/0000.png", b"\xc0" + (5).to_bytes(11, "big")) + PNG + END, 65,
                                      "negative size"),
        "pax_negative_size.tar": (pax({"size": "-5"}) + header("x/0000.png", 232) + PNG + END, 65,
                                  "is not a whole number"),
        "pax_huge_size.tar": (pax({"size": str(1 << 70)}) + header("x/0000.png", 232) + PNG + END, 65,
                              "more than the limit"),
        "extended_header_2pow40.tar": (header("PaxHeader/x", 1 << 40, b"x") + bytes(BLOCK) + END, 65,
                                       "extended header"),
        "empty.tar": (b"", 65, "empty (0 bytes)"),
        "text_12_bytes.tar": (b"hello world\n", 65, "shorter than one 512-byte tar header"),
        "end_blocks_only.tar": (END, 65, "holds no members"),
        "no_samples.tar": (member("a/0000.txt", b"hi") + member("a/0001.cls", b"1") + END, 65,
                           "none of its 2 member(s) became a sample"),
    }
    # a member declaring 16 GiB of zeros: only its first MiB is stored here (a real bomb
    # is ~16 MB of gzip); the cap refuses it at the header, before decompressing anything
    bomb = header("bomb/0000.png", 16 << 30) + PNG + bytes((1 << 20) - len(PNG))
    out["gzip_bomb_16g.tar.gz"] = (gzip.compress(bomb, 9, mtime=0), 65, "declares 17,179,869,184 bytes")
    gz = gzip.compress(full, 6, mtime=0)
    out["gzip_truncated.tar.gz"] = (gz[:len(gz) // 2], 65, "gzip stream is damaged or cut short")
    bad = bytearray(gz)
    bad[-8] ^= 0x01  # the trailer's CRC-32: the tar inside is intact, so only that check can notice
    out["gzip_crc_mismatch.tar.gz"] = (bytes(bad), 65, "CRC check failed")
    return out


def main() -> int:
    if "--write" not in sys.argv:
        print(__doc__)
        return 2
    expected = {}
    for name, (data, code, needle) in cases().items():
        (HERE / name).write_bytes(data)
        expected[name] = {"exit": code, "message": needle}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(expected)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
