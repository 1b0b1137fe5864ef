"""Sample-aligned chunks of tar shards holding one TWH1 or WFS1 file (docs/formats/registry.md, "Chunked shards").

A published tensor warehouse is one tar shard per TWH1 file (tarpack's ``alone_size``). Its bytes
are a small head (tar header and TWH1 header), the images of ``N`` samples, each exactly
``C·H·W·sizeof(dtype)`` bytes, back to back, and a small tail (boxes, mask, meta, checksum, tar
padding). When a new version relabels, replaces or appends a few samples, almost every image of
almost every shard is byte for byte the one before, wherever the shard begins. So a chunked shard
is stored as the concatenation of:

* the head ``[0, image region)``;
* runs of whole sample images: one image a chunk when an image is at least the 256 KiB target
  (320×320 and larger RGB u8); smaller images in runs of ``k = target // image bytes`` on
  average, a run ending after an image whose CRC-32 is ``k - 1`` modulo ``k`` (or at ``2k``);
* the tail ``[end of the images, end of the tar shard)``.

Each chunk is a content-addressed blob (``blobs/sha256/...``, SHA-256 of its bytes): a version
uploads only the chunks the store lacks. The shard keeps its SHA-256 as its identity; a reader
fetches the chunks, writes them in order into the blob cache under the shard's hash and checks
that hash as it lands (:meth:`warpdata.read.dataset.Dataset.fetch_blob`), so everything above the
blob cache (``materialize``, ``warm``, memory-mapped TWH1 members) sees the same file as before.

The items come from the TWH1 header (docs/formats/twh1.md); where a run ends is decided by each
image's own bytes, never by its position, so a sample removed from the middle of a shard (a label
deleted, an image now quarantined) changes the one run it sat in, and every later run keeps its
bytes and its chunk though it moved (fixed runs of ``k`` moved every later boundary: a 1-in-1,000
deletion re-uploaded 67 % of a 128 px warehouse). A feature cache's WFS1 shard
(docs/formats/feature-shard.md) is cut the same way at its fixed-size records. Any other member
is not chunked.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["CHUNK_TARGET", "chunk_ranges", "chunked_refs", "ends_run", "hash_chunks", "locate", "member_chunks",
           "member_items", "per_chunk", "read_range", "run_lengths", "twh1_items", "wfs1_items"]

# bytes of sample images per chunk, at most (one image when an image is larger): small enough that
# a chunk holds one 320×320 or 640×640 RGB image, so a replaced photo re-uploads itself only; large
# enough that small images do not make one object each (docs/formats/registry.md, "Chunked shards")
CHUNK_TARGET = 256 << 10
_READ = 8 << 20  # bytes of items :func:`member_chunks` reads at a time

_HEADER = struct.Struct("<4sIIIIIIIQQQQQQ")  # docs/formats/twh1.md: the 80-byte header
_DTYPE_BYTES = {0: 4, 1: 2, 2: 1}


def twh1_items(head: bytes, member_len: int) -> tuple[int, int, int] | None:
    """``(offset of the images inside the member, bytes of one image, images)`` of a member whose
    first bytes are ``head``; None when ``head`` is no TWH1 header this module understands, the
    member has no samples or is too short for them."""
    if len(head) < _HEADER.size:
        return None
    (magic, version, dtype, _endian, width, height, channels, _boxes, n, image_off,
     boxes_off, _mask_off, _meta_off, _sum_off) = _HEADER.unpack_from(head)
    if magic != b"TWH1" or version != 1 or dtype not in _DTYPE_BYTES or n == 0:
        return None
    one = width * height * channels * _DTYPE_BYTES[dtype]
    end = image_off + n * one
    if one <= 0 or image_off < _HEADER.size or end > boxes_off or end > member_len:
        return None
    return image_off, one, n


_WFS1 = struct.Struct("<4sHHIIQ")  # docs/formats/feature-shard.md: magic, version, flags, F, R, data_offset


def wfs1_items(head: bytes, member_len: int) -> tuple[int, int, int] | None:
    """As :func:`twh1_items`, for a WFS1 feature shard: ``(data_offset, R, records)``. The record
    count follows from the member's length (records, the optional CRC table, the 32-byte
    trailer); None when ``head`` is no WFS1 header or the length does not fit it."""
    if len(head) < _WFS1.size:
        return None
    magic, version, flags, _fields, r, data_off = _WFS1.unpack_from(head)
    if magic != b"WFS1" or version != 1 or r <= 0 or data_off < 64:
        return None
    per = r + (4 if flags & 1 else 0)
    body = member_len - 32 - data_off
    if body <= 0 or body % per:
        return None
    return data_off, r, body // per


def member_items(head: bytes, member_len: int) -> tuple[int, int, int] | None:
    """The fixed-size items (sample images, records) of a TWH1 or WFS1 member; None for others."""
    if head[:4] == b"TWH1":
        return twh1_items(head, member_len)
    if head[:4] == b"WFS1":
        return wfs1_items(head, member_len)
    return None


def per_chunk(item: int, target: int = CHUNK_TARGET) -> int:
    """``k``, the items a chunk holds on average: ``max(1, target // item)``."""
    return max(1, target // max(item, 1))


def ends_run(crc: int, run: int, k: int) -> bool:
    """Whether a run of ``run`` items ends after an item whose CRC-32 is ``crc``: at every item when
    ``k`` is 1; else where ``crc % k == k - 1`` (content-defined: the same items end runs wherever
    they sit, so a sample removed or inserted before them moves no later boundary), or at ``2k``
    items (a chunk is at most twice the target)."""
    return k == 1 or run >= 2 * k or crc % k == k - 1


def run_lengths(crcs: Sequence[int], k: int) -> list[int]:
    """The items of each chunk for items whose CRC-32s are ``crcs``, in order (:func:`ends_run`)."""
    out, run = [], 0
    for c in crcs:
        run += 1
        if ends_run(c, run, k):
            out.append(run)
            run = 0
    if run:
        out.append(run)
    return out


def member_chunks(path: str | os.PathLike, head: bytes, data_start: int, member_len: int, total: int,
                  target: int = CHUNK_TARGET) -> list[tuple[str, int]] | None:
    """``(sha256 hex, length)`` of each chunk of the tar shard at ``path`` (``total`` bytes) whose one
    member starts at ``data_start``, ``member_len`` bytes long, with first bytes ``head``: the head,
    runs of whole items (:func:`ends_run`), the tail. The file is read once, 8 MiB of whole items at a
    time into one buffer. None when the member is not a TWH1 or WFS1 file with items, or ``target`` < 1."""
    items = member_items(head, member_len)
    if items is None or target < 1:
        return None
    off, one, n = items
    k = per_chunk(one, target)
    first = data_start + off
    per_read = max(1, _READ // one)  # items a read brings in: small records are not one syscall each
    buf = bytearray(per_read * one)
    view = memoryview(buf)
    out = hash_chunks(path, [(0, first)])
    with open(path, "rb", buffering=0) as f:
        f.seek(first)
        h, run, done = hashlib.sha256(), 0, 0
        while done < n:
            m = min(per_read, n - done)
            got = 0
            while got < m * one:
                r = f.readinto(view[got:m * one])
                if not r:
                    raise OSError(f"{path}: ends inside item {done + got // one} (byte {first + done * one + got})")
                got += r
            seg = 0  # where the current run's bytes start in this read
            for t in range(m):
                o = t * one
                run += 1
                if done + t == n - 1 or ends_run(zlib.crc32(view[o:o + one]) if k > 1 else 0, run, k):
                    h.update(view[seg:o + one])
                    out.append((h.hexdigest(), run * one))
                    h, run, seg = hashlib.sha256(), 0, o + one
            if seg < m * one:
                h.update(view[seg:m * one])
            done += m
    end = first + n * one
    if total > end:
        out += hash_chunks(path, [(end, total - end)])
    return out


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
