"""Pieces of shards read by pages, kept in the blob cache so the next epoch reads them from disk.

Spec: ``docs/partitioning.md`` ("The cache carries epochs"). A reader of part of a row group
fetches a column's dictionary page, the pages holding its rows and the chunk's offset index
(:meth:`warpdata.read.batches._ShardFiles.read_rows`). Each such run of pages is kept as a blob
of the content-addressed cache (its SHA-256 is its name, so the cache's cap, LRU eviction, pins
and verification apply to it as to any blob), and a small index file names it:

    <cache>/pieces/<shard hex>/<row group>/<leaf>/<first page>-<end page>   (page runs)
    <cache>/pieces/<shard hex>/<row group>/<leaf>/dict                    (the dictionary page)
    <cache>/pieces/<shard hex>/<row group>/<leaf>/oi                      (the offset index)
    <cache>/pieces/<shard hex>/footer                                     (the footer)

each holding the SHA-256 of the piece's bytes. A later read of pages ``[k, m)`` of that
column chunk takes what runs on disk cover and fetches only the pages they miss, so ranks and
DataLoader workers sharing one cache directory on a machine fetch a page once, and an epoch
that reads the rows an earlier one read fetches nothing. A piece whose blob was evicted, or
whose bytes fail their hash, is simply missing. Index files are written atomically; two
readers racing for one piece both fetch it and write the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from warpdata.core.atomic import atomic_write_bytes
from warpdata.core.errors import WarpError
from warpdata.storage.blobcache import BlobCache, normalize_hash

__all__ = ["PieceCache"]


class PieceCache:
    """Runs of pages of one shard's column chunks in a :class:`BlobCache`."""

    def __init__(self, cache: BlobCache, shard_hash: str) -> None:
        self.cache = cache
        self.root = Path(cache.root) / "pieces" / normalize_hash(shard_hash)

    def _dir(self, group: int | None, leaf: int | None) -> Path:
        """The folder of a column chunk's pieces; the shard's own (its footer) for None."""
        return self.root if group is None else self.root / str(int(group)) / str(int(leaf or 0))

    def _get(self, index: Path) -> bytes | None:
        try:
            h = index.read_text().strip()
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
            return None
        except OSError:
            return None
        if len(h) != 64:
            return None
        return self.cache.read_bytes(h)  # verified against its name; None once evicted

    def _put(self, index: Path, data: bytes) -> None:
        h = hashlib.sha256(data).hexdigest()
        try:
            self.cache.put_bytes(h, data)
            index.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(index, h.encode())
        except (OSError, WarpError):  # a full disk or cache, a lock: the reader has its bytes already
            with contextlib.suppress(OSError):
                index.unlink()

    def named(self, group: int | None, leaf: int | None, name: str) -> bytes | None:
        """The piece ``name`` (``dict`` or ``oi``) of a column chunk, or the shard's ``footer``
        (``group`` None), or None."""
        return self._get(self._dir(group, leaf) / name)

    def keep_named(self, group: int | None, leaf: int | None, name: str, data: bytes) -> None:
        self._put(self._dir(group, leaf) / name, data)

    def lookup(self, group: int, leaf: int, offsets: Sequence[int], ends: Sequence[int], k: int,
               m: int) -> tuple[dict[int, bytes], list[tuple[int, int]]]:
        """Pages ``[k, m)`` of a column chunk (page ``i`` spans ``offsets[i] .. ends[i]`` of the
        shard): ``({page: bytes}`` of those on disk, ``[(a, b)]`` runs of pages missing)."""
        d = self._dir(group, leaf)
        have: dict[int, bytes] = {}
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(d):
                a, sep, b = name.partition("-")
                if not sep or not (a.isdigit() and b.isdigit()):
                    continue
                a_, b_ = int(a), int(b)
                if b_ > len(offsets) or a_ >= b_ or b_ <= k or a_ >= m \
                        or all(p in have for p in range(max(a_, k), min(b_, m))):
                    continue
                data = self._get(d / name)
                if data is None or len(data) != ends[b_ - 1] - offsets[a_]:
                    continue
                base = offsets[a_]
                for p in range(max(a_, k), min(b_, m)):
                    have[p] = data[offsets[p] - base:ends[p] - base]
        missing: list[tuple[int, int]] = []
        for p in range(k, m):
            if p in have:
                continue
            if missing and missing[-1][1] == p:
                missing[-1] = (missing[-1][0], p + 1)
            else:
                missing.append((p, p + 1))
        return have, missing

    def keep_pages(self, group: int, leaf: int, offsets: Sequence[int], ends: Sequence[int], run: tuple[int, int],
                   data: bytes, have: dict[int, bytes]) -> None:
        """Keep the fetched bytes of pages ``run`` and add them to ``have``."""
        a, b = run
        self._put(self._dir(group, leaf) / f"{a}-{b}", data)
        base = offsets[a]
        for p in range(a, b):
            have[p] = data[offsets[p] - base:ends[p] - base]
