"""The tiled array's hash chain and the CRC-32C arithmetic behind range-parallel writes.

Content hashes (docs/formats/zarr-tiles.md, "Content hashes"): each object is named in its slab's
digest by its SHA-256, each slab's digest in its level's. The writer computes them as objects are
written, ``warp inspect --verify`` and a resumed ETL (docs/formats/receipts.md, "Tiled arrays")
recompute them from the stored objects. Standard library only, so inspection does not load the
writer.
"""

from __future__ import annotations

import functools
import hashlib


def slab_digest(objects) -> str:
    """SHA-256 of a slab: one line ``<key> <object sha256>\\n`` per object, in the object grid's C order."""
    h = hashlib.sha256()
    for key, d in objects:
        h.update(f"{key} {d}\n".encode())
    return h.hexdigest()


def level_digest(slabs) -> str:
    """SHA-256 of a level: one line ``<slab digest>\\n`` per slab, in order."""
    h = hashlib.sha256()
    for d in slabs:
        h.update(f"{d}\n".encode())
    return h.hexdigest()


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, v) for v in mat]


@functools.lru_cache(maxsize=64)
def _zeros_operator(len2: int) -> tuple[int, ...]:
    """The GF(2) matrix that appends ``len2`` zero bytes to a CRC-32C register (zlib's method)."""
    op = [0x82F63B78] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        op = _gf2_square(op)  # one zero byte
    out = [1 << n for n in range(32)]  # identity
    while len2:
        if len2 & 1:
            out = [_gf2_times(op, v) for v in out]
        len2 >>= 1
        if len2:
            op = _gf2_square(op)
    return tuple(out)


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32C of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)`` (zlib's ``crc32_combine``
    with the Castagnoli polynomial): the tasks of a range-parallel write checksum their own rows,
    a writer its slabs. The operator for each length is cached (slabs mostly share one)."""
    if len2 <= 0:
        return crc1
    return _gf2_times(list(_zeros_operator(len2)), crc1) ^ crc2
