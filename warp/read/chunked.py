"""Reading a chunked tar shard (docs/formats/registry.md, "Chunked shards").

A chunked shard is stored as content-addressed chunks whose bytes, in order, are the shard's.
:func:`write_chunks` streams them into a file (the blob cache checks the whole shard's SHA-256 as
it lands, so every reader above the cache sees exactly the shard it saw before chunking);
:class:`ChunkedFile` serves ranged reads of the shard from the chunks, one ranged GET per chunk
touched, for readers that do not cache shards.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from warpdata.core.errors import BlobCorruptedError, DataError
from warpdata.registry.manifest import ShardRef, blob_key

__all__ = ["FETCH_THREADS", "ChunkedFile", "bad_chunk", "write_chunks"]

# chunks fetched at once while a shard is assembled (ranged GETs in flight, and chunks held in memory)
FETCH_THREADS = 8


def _read(remote: Any, h: str, n: int) -> bytes:
    key = blob_key(h)
    data = remote.read_range(key, 0, n, n)
    if len(data) != n:
        raise DataError(f"{remote.url_of(key)}: chunk is {len(data)} bytes, the manifest says {n}",
                        hint="the stored chunk is damaged or truncated; republish the dataset")
    return data


def write_chunks(remote: Any, s: ShardRef, f: BinaryIO) -> None:
    """Write shard ``s``'s bytes into ``f`` from its chunks, fetched ``FETCH_THREADS`` at a time."""
    chunks = list(s.chunks or ())
    with ThreadPoolExecutor(max_workers=max(1, min(FETCH_THREADS, len(chunks)))) as ex:
        ahead: deque = deque()
        for h, n in chunks:  # a sliding window: the next GET starts as soon as the oldest is written
            ahead.append(ex.submit(_read, remote, h, n))
            if len(ahead) >= FETCH_THREADS:
                f.write(ahead.popleft().result())
        while ahead:
            f.write(ahead.popleft().result())


def bad_chunk(remote: Any, s: ShardRef) -> BlobCorruptedError | None:
    """The typed error naming the first stored chunk of ``s`` whose bytes do not hash to its name
    (each chunk read again), or None when every chunk does."""
    for h, n in s.chunks or ():
        got = hashlib.sha256(_read(remote, h, n)).hexdigest()
        if got != h:
            return BlobCorruptedError(f"{remote.url_of(blob_key(h))}: does not hash to {h} (it hashes to {got}; "
                                      f"a chunk of shard {s.hash})",
                                      hint="the store copy is damaged; republish the dataset")
    return None


class ChunkedFile:
    """Random access to a chunked shard by ranged reads of its chunks (thread-safe ``read_at``)."""

    def __init__(self, remote: Any, s: ShardRef) -> None:
        self.remote = remote
        self.chunks = list(s.chunks or ())
        self.starts: list[int] = []
        pos = 0
        for _h, n in self.chunks:
            self.starts.append(pos)
            pos += n
        self._size = pos
        self.closed = False

    def size(self) -> int:
        return self._size

    def read_at(self, nbytes: int, offset: int) -> bytes:
        end = min(offset + max(0, nbytes), self._size)
        parts = []
        at = offset
        i = bisect.bisect_right(self.starts, at) - 1
        while at < end and i < len(self.chunks):
            h, n = self.chunks[i]
            lo = at - self.starts[i]
            take = min(n - lo, end - at)
            parts.append(self.remote.read_range(blob_key(h), lo, take, n))
            at += take
            i += 1
        return b"".join(parts)

    def close(self) -> None:
        self.closed = True
