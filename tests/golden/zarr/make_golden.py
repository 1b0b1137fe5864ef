"""Regenerate the Zarr golden files and malformed corpus (run by hand, review the diff).

    .venv/bin/python tests/golden/zarr/make_golden.py

The tests never call this: a changed byte in warp's output must show up as a
failing test, not as a silently refreshed fixture.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def golden_input() -> np.ndarray:
    """A small ragged u16 array: 5x7x6, values that compress but are not trivial."""
    a = np.arange(5 * 7 * 6, dtype=np.uint32).reshape(5, 7, 6)
    return ((a * 2654435761) % 4093).astype(np.uint16)


def write(name: str, **kw) -> Path:
    from warpdata.tiles.writer import TileWriter

    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    a = golden_input()
    with TileWriter(out, a.shape, a.dtype, (2, 4, 4), backend="cpu", fsync=False, fill_value=0, **kw) as w:
        w.write_array(a)
    return out


def corrupt(src: Path, name: str, key: str, fn) -> None:
    dst = HERE / "malformed" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    p = dst / key
    if fn is None:
        p.unlink()
    else:
        p.write_bytes(fn(p.read_bytes()))


def main() -> None:
    sharded = write("sharded.zarr", shards=(2, 8, 8))
    write("unsharded.zarr", shards=None)
    write("pyramid.zarr", shards=(2, 8, 8), levels=2)
    flip = lambda b, i: b[:i] + bytes([b[i] ^ 0xFF]) + b[i + 1:]  # noqa: E731
    corrupt(sharded, "bad-index-crc", "c/1/0/0", lambda b: flip(b, len(b) - 1))
    corrupt(sharded, "truncated-shard", "c/1/0/0", lambda b: b[: len(b) // 2])
    corrupt(sharded, "bad-frame", "c/0/0/0", lambda b: flip(flip(b, 0), 1))
    corrupt(sharded, "bad-chunk-crc", "c/0/0/0", lambda b: flip(b, 20))  # inside the first chunk's frame
    pyramid = HERE / "pyramid.zarr"
    corrupt(pyramid, "bad-level1-chunk", "1/c/0/0/0", lambda b: flip(b, 12))
    corrupt(sharded, "missing-shard", "c/2/0/0", None)
    corrupt(sharded, "changed-data", "c/0/0/0", lambda b: b)  # rewritten below
    # a valid shard with different data: the structure checks pass, the input CRC does not
    import zstandard
    from warpdata.formats import zarr_v3

    changed = HERE / "malformed" / "changed-data" / "c/0/0/0"
    blob = changed.read_bytes()
    entries = zarr_v3.decode_index(blob, 4, "golden")
    off, n = (int(x) for x in entries[0])
    chunk = bytearray(zstandard.ZstdDecompressor().decompress(blob[off:off + n - 4]))  # the CRC-32C follows
    chunk[0] ^= 1
    frames = []
    for i, (o, m) in enumerate(entries.tolist()):
        if i == 0:
            frame = zstandard.ZstdCompressor(level=1).compress(bytes(chunk))
            frames.append(frame + zarr_v3.chunk_crc(frame))
        else:
            frames.append(blob[o:o + m])
    changed.write_bytes(b"".join(zarr_v3.shard_parts(frames)))
    bad = HERE / "malformed" / "bad-zarr-json"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(sharded, bad)
    (bad / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array", "shape": [5, 7, 6]}\n')


if __name__ == "__main__":
    main()
