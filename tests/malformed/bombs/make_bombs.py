"""Decompression bombs and absurd shapes with every checksum right (issue 36, item 1).

Built by the tests at run time (each case is ~131 KB, made in milliseconds), or by hand to try
one with the CLI:

    .venv/bin/python tests/malformed/bombs/make_bombs.py OUTDIR

Each case is a valid container holding one valid zstd frame that declares (or decodes to) 4 GiB
of zeros — 32,768 RLE blocks of 128 KiB, 4 bytes each — where the container expects far less.
Every CRC the container has is recomputed (TBL: payload trailer, index CRC, header CRC, metadata
CRCs; Zarr: the chunk's CRC-32C and the shard index's CRC-32C), so the size is the only lie.
``expected.json`` says, per case, the error type, exit code and what the message must name.
``tests/malformed/test_bombs.py`` runs them under an address-space cap and checks peak RSS.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import fastcrc

HERE = Path(__file__).parent
GOLDEN_ZARR = HERE.parent.parent / "golden" / "zarr"
GIB4 = 1 << 32
TBL_USIZE = 1 << 20  # what the bomb's index entry says: a 1 MiB sample
BLOCK = 128 * 1024


def zstd_zeros(produce: int, *, declare: bool = True) -> bytes:
    """A valid zstd frame decoding to ``produce`` zero bytes: one RLE block per 128 KiB (RFC 8878
    §3.1.1.2), the content size in the header when ``declare`` (8 bytes, FCS flag 3), window 128 KiB."""
    fhd = 0xC0 if declare else 0x00  # FCS flag 3 (8 bytes) or none; not single-segment; no checksum
    head = b"\x28\xb5\x2f\xfd" + bytes([fhd, 0x38])  # window descriptor 0x38: 2^(10+7) = 128 KiB
    if declare:
        head += produce.to_bytes(8, "little")
    blocks = bytearray()
    left = produce
    while True:
        n = min(left, BLOCK)
        left -= n
        last = int(left == 0)
        blocks += (last | (1 << 1) | (n << 3)).to_bytes(3, "little") + b"\0"  # RLE block of byte 0
        if last:
            return head + bytes(blocks)


def tbl(dest: Path, *, declare: bool) -> Path:
    """A warp .tbl (all extensions) of three samples whose sample 1 is the bomb, its index saying 1 MiB."""
    from warpdata.formats import tbl as t

    bomb = zstd_zeros(GIB4, declare=declare)
    with t.TblWriter(dest, compression="zstd", level=3) as w:
        w.add(b"first sample " * 100, format="raw_u8")
        # the index's uncompressed size and CRC-16 say 1 MiB of zeros; the trailer CRC-32 is the frame's
        w.add_stored(bomb, TBL_USIZE, t.E_ZSTD | t.E_LZ4, t.crc16(bytes(TBL_USIZE)), None,
                     t.FORMAT_CODES["raw_u8"], 0, 0)
        w.add(b"last sample " * 100, format="raw_u8")
    return dest


def tbl_honest(dest: Path, usize: int = 768 << 20) -> Path:
    """A .tbl whose sample 1 honestly decodes to ``usize`` zero bytes from a 24 KB frame (index size,
    frame header and CRC-16 all agree): valid, and ``warp inspect --verify`` must check it in memory
    independent of ``usize`` (formats/tbl_reader.py, VERIFY_WHOLE_BYTES)."""
    from warpdata.formats import tbl as t

    piece, crc = bytes(4 << 20), None
    for _ in range(usize // len(piece)):
        crc = t.crc16(piece) if crc is None else fastcrc.crc16.modbus(piece, initial=crc)
    with t.TblWriter(dest, compression="zstd", level=3) as w:
        w.add(b"first sample " * 100, format="raw_u8")
        w.add_stored(zstd_zeros(usize), usize, t.E_ZSTD | t.E_LZ4, crc, None, t.FORMAT_CODES["raw_u8"], 0, 0)
        w.add(b"last sample " * 100, format="raw_u8")
    return dest


def _bare_array(src: str, dest: Path) -> Path:
    """A copy of a golden Zarr array without warp's manifest: zarr.json and the objects only."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(GOLDEN_ZARR / src, dest)
    (dest / "manifest.json").unlink()
    return dest


def zarr_chunk(dest: Path) -> Path:
    """The unsharded golden array with chunk c/0/0/0 (expected 2x4x4 u16 = 64 bytes) a 4 GiB frame."""
    from warpdata.formats import zarr_v3

    _bare_array("unsharded.zarr", dest)
    frame = zstd_zeros(GIB4)
    (dest / "c" / "0" / "0" / "0").write_bytes(frame + zarr_v3.chunk_crc(frame))
    return dest


def zarr_shard(dest: Path) -> Path:
    """The sharded golden array with inner chunk 0 of shard c/0/0/0 a 4 GiB frame; index re-CRC'd."""
    from warpdata.formats import zarr_v3

    _bare_array("sharded.zarr", dest)
    p = dest / "c" / "0" / "0" / "0"
    blob = p.read_bytes()
    entries = zarr_v3.decode_index(blob, 4, str(p))
    frames = []
    for i, (off, n) in enumerate(entries.tolist()):
        if off == zarr_v3.EMPTY:
            frames.append(None)
        elif i == 0:
            frame = zstd_zeros(GIB4)
            frames.append(frame + zarr_v3.chunk_crc(frame))
        else:
            frames.append(blob[off:off + n])
    p.write_bytes(b"".join(zarr_v3.shard_parts(frames)))
    return dest


def zarr_chunk_honest(dest: Path) -> Path:
    """A valid 1x1x1 u32 array whose one chunk has shape 768x1024x256 (768 MiB decoded, within
    MAX_CHUNK_BYTES), stored as a 24 KB frame that decodes to exactly that: ``warp inspect --verify``
    must check it in memory independent of the chunk shape (formats/zarr_v3.py, check_chunk)."""
    from warpdata.formats import zarr_v3

    shutil.rmtree(dest, ignore_errors=True)
    chunks = [768, 1024, 256]
    (dest / "c" / "0" / "0").mkdir(parents=True)
    frame = zstd_zeros(768 * 1024 * 256 * 4)
    (dest / "c" / "0" / "0" / "0").write_bytes(frame + zarr_v3.chunk_crc(frame))
    (dest / "zarr.json").write_bytes(zarr_v3.encode_json(zarr_v3.array_metadata([1, 1, 1], "uint32", chunks)))
    return dest


def zarr_shape(dest: Path, shape: list[int]) -> Path:
    """The sharded golden array (5x7x6 u16, 3 shards) whose zarr.json says ``shape``: within every
    metadata limit (MAX_ELEMENTS, MAX_OBJECTS), but a grid of over a billion objects."""
    _bare_array("sharded.zarr", dest)
    meta = json.loads((dest / "zarr.json").read_text())
    meta["shape"] = shape
    (dest / "zarr.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return dest


CASES = {
    "tbl_zstd_declares_4gib.tbl": lambda d: tbl(d, declare=True),
    "tbl_zstd_undeclared_4gib.tbl": lambda d: tbl(d, declare=False),
    "tbl_zstd_honest_768mib.tbl": tbl_honest,
    "zarr_chunk_declares_4gib": zarr_chunk,
    "zarr_shard_declares_4gib": zarr_shard,
    "zarr_chunk_honest_768mib": zarr_chunk_honest,
    "zarr_shape_2pow32": lambda d: zarr_shape(d, [5, 2**32 - 1, 6]),  # the shape[1] = 2^32-1
    "zarr_shape0_2pow32": lambda d: zarr_shape(d, [2**32 - 1, 7, 6]),  # small rows: found absent, lazily
}


def build(name: str, outdir: Path) -> Path:
    return CASES[name](Path(outdir) / name)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        print(build(case, out))
