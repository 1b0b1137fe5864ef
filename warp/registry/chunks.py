"""Sample-aligned chunks of tar shards holding one TWH1 or WFS1 file (docs/formats/registry.md, "Chunked shards").

A published tensor warehouse is one tar shard per TWH1 file (tarpack's ``alone_size``). Its bytes
are a small head (tar header and TWH1 header), the images of ``N`` samples, each exactly
``C·H·W·sizeof(dtype)`` bytes, back to back, and a small tail (boxes, mask, meta, checksum, tar
padding). When a new version relabels, replaces or appends a few samples, almost every image of
almost every shard is byte for byte the one before, wherever the shard begins. So a chunked shard
is stored as the concatenation of:

* the head ``[0, image region)``;
* runs of ``k`` whole sample images, ``k = max(1, target // image bytes)`` (one image per chunk
  for 320×320 and larger RGB images at the default 256 KiB target);
* the tail ``[end of the images, end of the tar shard)``.

Each chunk is a content-addressed blob (``blobs/sha256/...``, SHA-256 of its bytes): a version
uploads only the chunks the store lacks. The shard keeps its SHA-256 as its identity; a reader
fetches the chunks, writes them in order into the blob cache under the shard's hash and checks
that hash as it lands (:meth:`warpdata.read.dataset.Dataset.fetch_blob`), so everything above the
blob cache (``materialize``, ``warm``, memory-mapped TWH1 members) sees the same file as before.

Cut points come from the TWH1 header alone (docs/formats/twh1.md): no content-defined chunking,
no rolling hash. A feature cache's WFS1 shard (docs/formats/feature-shard.md) is cut the same way
at its fixed-size records. Any other member is not chunked.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["CHUNK_TARGET", "chunk_ranges", "chunked_refs", "hash_chunks", "locate", "member_cuts", "read_range",
           "twh1_cuts", "wfs1_cuts"]

# bytes of sample images per chunk, at most (one image when an image is larger): small enough that
# a chunk holds one 320×320 or 640×640 RGB image, so a replaced photo re-uploads itself only; large
# enough that small images do not make one object each (docs/formats/registry.md, "Chunked shards")
CHUNK_TARGET = 256 << 10

_HEADER = struct.Struct("<4sIIIIIIIQQQQQQ")  # docs/formats/twh1.md: the 80-byte header
_DTYPE_BYTES = {0: 4, 1: 2, 2: 1}


def twh1_cuts(head: bytes, data_start: int, member_len: int, target: int = CHUNK_TARGET) -> list[int] | None:
    """Interior cut offsets (inside the tar shard) for a member whose first bytes are ``head``,
    starting at ``data_start`` of the shard, ``member_len`` bytes long; None when ``head`` is no
    TWH1 header this module understands or the member has no samples."""
    if len(head) < _HEADER.size or target < 1:
        return None
    (magic, version, dtype, _endian, width, height, channels, _boxes, n, image_off,
     boxes_off, _mask_off, _meta_off, _sum_off) = _HEADER.unpack_from(head)
    if magic != b"TWH1" or version != 1 or dtype not in _DTYPE_BYTES or n == 0:
        return None
    one = width * height * channels * _DTYPE_BYTES[dtype]
    end = image_off + n * one
    if one <= 0 or image_off < _HEADER.size or end > boxes_off or end > member_len:
        return None
    k = max(1, target // one)
    start = data_start + image_off
    return [start + j * k * one for j in range(-(-n // k))] + [data_start + end]


_WFS1 = struct.Struct("<4sHHIIQ")  # docs/formats/feature-shard.md: magic, version, flags, F, R, data_offset


def wfs1_cuts(head: bytes, data_start: int, member_len: int, target: int = CHUNK_TARGET) -> list[int] | None:
    """As :func:`twh1_cuts`, for a WFS1 feature shard: runs of whole records of ``R`` bytes. The
    record count follows from the member's length (records, the optional CRC table, the 32-byte
    trailer); None when ``head`` is no WFS1 header or the length does not fit it."""
    if len(head) < _WFS1.size or target < 1:
        return None
    magic, version, flags, _fields, r, data_off = _WFS1.unpack_from(head)
    if magic != b"WFS1" or version != 1 or r <= 0 or data_off < 64:
        return None
    per = r + (4 if flags & 1 else 0)
    body = member_len - 32 - data_off
    if body <= 0 or body % per:
        return None
    n = body // per
    k = max(1, target // r)
    start = data_start + data_off
    return [start + j * k * r for j in range(-(-n // k))] + [start + n * r]


def member_cuts(head: bytes, data_start: int, member_len: int, target: int = CHUNK_TARGET) -> list[int] | None:
    """Cut points for a TWH1 or WFS1 member (:func:`twh1_cuts`, :func:`wfs1_cuts`); None for others."""
    if head[:4] == b"TWH1":
        return twh1_cuts(head, data_start, member_len, target)
    if head[:4] == b"WFS1":
        return wfs1_cuts(head, data_start, member_len, target)
    return None


def chunk_ranges(cuts: Sequence[int], total: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each chunk of a ``total``-byte shard cut at ``cuts``."""
    edges = [0, *cuts, total]
    return [(a, b - a) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def hash_chunks(path: str | os.PathLike, ranges: Sequence[tuple[int, int]]) -> list[tuple[str, int]]:
    """``(sha256 hex, length)`` of each range of the file at ``path``, read once, in order."""
    out = []
    with open(path, "rb", buffering=0) as f:
        pos = 0
        for off, n in ranges:
            if off != pos:
                f.seek(off)
            h = hashlib.sha256()
            left = n
            while left:
                data = f.read(min(left, 8 << 20))
                if not data:
                    raise OSError(f"{path}: ends before byte {off + n}")
                h.update(data)
                left -= len(data)
            out.append((h.hexdigest(), n))
            pos = off + n
    return out


def chunked_refs(manifests: Iterable[Any]) -> dict[str, Any]:
    """Shard hash -> :class:`~warpdata.registry.manifest.ShardRef` of every chunked artifact shard
    of ``manifests``."""
    return {s.hash: s for m in manifests for a in m.artifacts.values() for s in a.shards if s.chunks}


def read_range(store: Any, ref: Any, start: int, length: int) -> bytes:
    """``length`` bytes at ``start`` of the chunked shard ``ref`` from ``store`` (a
    :class:`~warpdata.registry.store.Store`): one ranged read of each chunk the range touches."""
    parts, pos, end = [], 0, start + length
    for h, n in ref.chunks:
        lo, hi = max(start, pos), min(end, pos + n)
        if lo < hi:
            parts.append(store.read_range(h, lo - pos, hi - lo))
        pos += n
        if pos >= end:
            break
    return b"".join(parts)


def locate(ref: Any, offset: int) -> tuple[str, int]:
    """The chunk of the chunked shard ``ref`` holding byte ``offset``: (its hash, offset inside it)."""
    pos = 0
    for h, n in ref.chunks:
        if offset < pos + n:
            return h, offset - pos
        pos += n
    raise ValueError(f"offset {offset} is past the end of shard {ref.hash} ({pos} bytes)")
