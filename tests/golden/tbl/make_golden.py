"""Write the TBL v2 golden files and the malformed corpus (run by hand, never by tests).

    .venv/bin/python tests/golden/tbl/make_golden.py --write

Inputs are fixed byte strings built here (no image encoder whose output could
change between library versions). ``test_tbl_format.py`` checks that warp
still writes these exact bytes and reads them back; a format change must
regenerate them deliberately and say so in the commit.

``legacy_warp_*.tbl`` were written by warp before the metadata CRC extension
(header flag bit 7, docs/formats/tbl-v2.md): the current writer cannot make
them any more, so this script keeps them as they are (readers must still
open them).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).parent
MALFORMED = HERE.parent.parent / "malformed" / "tbl"


def _png(w: int, h: int, seed: int) -> bytes:
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    rows = b"".join(b"\0" + bytes((x * 7 + y * 13 + seed) & 0xFF for x in range(w * 3)) for y in range(h))
    # level 0 (stored) deflate is identical on every zlib version
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 0)) + chunk(b"IEND", b""))


def _jpeg_header_only(w: int, h: int) -> bytes:
    """SOI + APP0 + SOF0 + filler: enough for header parsing (not decodable)."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + app0 + sof + bytes(range(256)) * 4 + b"\xff\xd9"


SAMPLES = [
    ("a/0001", "png", _png(9, 7, 1)),
    ("a/0002", "jpg", _jpeg_header_only(640, 480)),
    ("b/0003", "bin", b"warp tbl golden text payload " * 20),
    ("b/0004", "png", _png(3, 5, 2)),
]
VARIANTS = {
    "plain_none": dict(compression="none", extensions=False),
    "plain_lz4": dict(compression="lz4", extensions=False),
    "warp_none": dict(compression="none", extensions=True),
    "warp_lz4": dict(compression="lz4", extensions=True),
    "warp_zstd": dict(compression="zstd", extensions=True, level=3),
}


def write_variant(path: Path, opts: dict) -> None:
    from warpdata.formats.tbl import TblWriter

    with TblWriter(path, fsync=False, **opts) as w:
        for key, ext, data in SAMPLES:
            w.add(data, metadata={"key": key, "name": f"{key}.{ext}"})
        if opts.get("extensions"):
            w.close(warp_metadata=True)


def write_turboloader(path: Path, compress: bool) -> None:
    import turboloader as t
    from warpdata.formats.imageinfo import image_info

    w = t.TblWriterV2(str(path), enable_compression=compress)
    for i, (key, ext, data) in enumerate(SAMPLES):
        try:
            info = image_info(data)
            fmt, wd, ht = getattr(t.SampleFormat, info.format.upper()), info.width, info.height
        except Exception:
            fmt, wd, ht = t.SampleFormat.UNKNOWN, 0, 0
        w.add_sample(data, fmt, width=wd, height=ht)
        w.add_metadata(i, json.dumps({"key": key, "name": f"{key}.{ext}"}, sort_keys=True, separators=(",", ":")),
                       t.MetadataType.JSON)
    w.finalize()


def _rehdr(b: bytearray) -> bytearray:
    b[44:48] = b"\0\0\0\0"
    b[44:48] = struct.pack("<I", zlib.crc32(bytes(b[:64])))
    return b


def _reindex(b: bytearray) -> bytearray:
    n = struct.unpack_from("<Q", b, 8)[0]
    b[48:52] = struct.pack("<I", zlib.crc32(bytes(b[64:64 + 24 * n])))
    return _rehdr(b)


def _remeta(b: bytearray) -> bytearray:
    """Recompute the metadata block CRC table and section CRC (flag bit 7) after an edit."""
    moff, msize = struct.unpack_from("<QQ", b, 24)
    blocks = struct.unpack_from("<I", b, 56)[0]
    pos, table = moff, moff + msize
    for k in range(blocks):
        if pos + 16 > table:  # an edit broke the walk: repair what still parses (tests/formats/test_fuzz_tbl.py)
            break
        size = struct.unpack_from("<I", b, pos + 8)[0]
        if pos + 16 + size > table or table + 4 * k + 4 > len(b):
            break
        struct.pack_into("<I", b, table + 4 * k, zlib.crc32(bytes(b[pos:pos + 16 + size])))
        pos += 16 + size
    struct.pack_into("<I", b, 52, zlib.crc32(bytes(b[moff:table + 4 * blocks])))
    return _rehdr(b)


def malformed(src: bytes) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, expected error class) derived from warp_none.tbl."""
    b = bytearray(src)
    n = struct.unpack_from("<Q", b, 8)[0]
    out: dict[str, tuple[bytes, str]] = {}

    def put(name, data, err):
        out[name] = (bytes(data), err)

    put("empty", b"", "BadMagic")
    put("truncated_header", b[:40], "TruncatedFile")
    put("truncated_index", b[:64 + 24 * n - 10], "TruncatedFile")
    x = bytearray(b)
    moff = struct.unpack_from("<Q", x, 24)[0]
    put("truncated_payload", x[:moff - 50], "TruncatedFile")
    x = bytearray(b)
    x[0:4] = b"TBX\x02"
    put("wrong_magic", x, "BadMagic")
    x = bytearray(b)
    x[3] = 3
    put("wrong_magic_version_byte", x, "UnsupportedVersion")
    x = bytearray(b)
    x[4:8] = struct.pack("<I", 3)
    put("wrong_version", _rehdr(x), "UnsupportedVersion")
    x = bytearray(b)
    x[9] ^= 0x01
    put("flipped_header_bit", x, "ChecksumMismatch")
    x = bytearray(b)
    x[64 + 24 + 16] ^= 0x01  # width of entry 1
    put("flipped_index_bit", x, "ChecksumMismatch")
    x = bytearray(b)
    off0 = struct.unpack_from("<Q", x, 64)[0]
    x[off0 + 40] ^= 0x10
    put("flipped_payload_bit", x, "ChecksumMismatch")
    x = bytearray(b)
    struct.pack_into("<Q", x, 64 + 24 * 2, len(x) + 1000)
    put("offset_past_end", _reindex(x), "TruncatedFile")
    x = bytearray(b)
    struct.pack_into("<Q", x, 64 + 24 * 1, off0 + 10)
    put("overlapping_entries", _reindex(x), "CorruptIndex")
    x = bytearray(b)
    struct.pack_into("<I", x, 64 + 24 * 3 + 8, 0xFFFFFFF0)
    put("absurd_size", _reindex(x), "TruncatedFile")
    x = bytearray(b)
    struct.pack_into("<I", x, 64 + 24 * 3 + 12, 0xFFFFFFF0)
    put("absurd_uncompressed_size", _reindex(x), "CorruptIndex")
    x = bytearray(b)
    struct.pack_into("<I", x, 16, 64 + 24 * (n + 1))
    put("header_size_mismatch", _rehdr(x), "CorruptIndex")
    x = bytearray(b)
    struct.pack_into("<Q", x, 8, 10 ** 12)
    put("absurd_sample_count", _rehdr(x), "CorruptIndex")
    x = bytearray(b)
    moff, msize = struct.unpack_from("<QQ", x, 24)
    struct.pack_into("<Q", x, moff, 99)  # metadata block names sample 99 (CRCs made to match)
    put("metadata_bad_sample", _remeta(x), "CorruptMetadata")
    x = bytearray(b)
    struct.pack_into("<Q", x, moff, 99)  # the same edit, CRCs left alone: caught as damage first
    put("metadata_bad_sample_crc", x, "ChecksumMismatch")
    x = bytearray(b)
    at = x.index(b'"key":"b/0003"', moff)
    x[at + 11] ^= 0x01  # b/0003 -> b/0103: still valid JSON, a different key
    put("metadata_key_bit", x, "ChecksumMismatch")
    x = bytearray(b)
    x[moff + 17] ^= 0x20  # first JSON block no longer parses
    put("metadata_json_bit", x, "ChecksumMismatch")
    x = bytearray(b)
    x[moff + msize + 5] ^= 0x01  # a byte of the block CRC table
    put("metadata_crc_table_bit", x, "ChecksumMismatch")
    x = bytearray(b)
    struct.pack_into("<I", x, 56, 10 ** 6)  # more blocks than the section can hold
    put("metadata_block_count", _rehdr(x), "CorruptIndex")
    x = bytearray(b)
    put("metadata_table_truncated", x[:moff + msize + 6], "TruncatedFile")
    x = bytearray(b)
    struct.pack_into("<I", x, 56, 1)  # one block announced, its CRC the file's last bytes: every other
    x = _remeta(x[:moff + msize + 4])  # block's CRC offset points past the end (sealed consistently)
    put("metadata_crc_offset_past_end", x, "CorruptMetadata")
    x = bytearray(b)
    struct.pack_into("<Q", x, 64 + 24 * 2, 2 ** 63 - 1)  # u64 offset near the int64 limit
    put("index_offset_int64_max", _reindex(x), "TruncatedFile")  # past the end, as offset_past_end
    x = bytearray(b)
    struct.pack_into("<Q", x, 64 + 24 * 2, 2 ** 64 - 1)
    put("index_offset_u64_max", _reindex(x), "TruncatedFile")
    return out


def malformed_legacy(src: bytes) -> dict[str, tuple[bytes, str]]:
    """Cases for files without the metadata CRC flag (legacy_warp_none.tbl)."""
    b = bytearray(src)
    moff = struct.unpack_from("<Q", b, 24)[0]
    b[moff + 17] ^= 0x20  # no CRC to catch it: the JSON parse does
    return {"legacy_metadata_not_json": (bytes(b), "CorruptMetadata")}


def main() -> int:
    if "--write" not in sys.argv:
        print(__doc__)
        return 2
    sys.path.insert(0, str(HERE.parents[2]))
    expected = {"samples": [{"key": k, "ext": e, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                            for k, e, d in SAMPLES], "files": {}}
    for name, opts in VARIANTS.items():
        write_variant(HERE / f"{name}.tbl", opts)
    write_turboloader(HERE / "turboloader_none.tbl", False)
    write_turboloader(HERE / "turboloader_lz4.tbl", True)
    for p in sorted(HERE.glob("*.tbl")):
        expected["files"][p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    (HERE / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    MALFORMED.mkdir(parents=True, exist_ok=True)
    index = {}
    cases = {**malformed((HERE / "warp_none.tbl").read_bytes()),
             **malformed_legacy((HERE / "legacy_warp_none.tbl").read_bytes())}
    for name, (data, err) in cases.items():
        (MALFORMED / f"{name}.tbl").write_bytes(data)
        index[f"{name}.tbl"] = err
    (MALFORMED / "expected.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(expected['files'])} golden files and {len(index)} malformed files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
