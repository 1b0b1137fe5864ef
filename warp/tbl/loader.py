"""Batches of decoded images from a .tbl file: shuffle, threads, ranks, filters.

Contract: :class:`TblLoader` yields :class:`Batch`\\ es of decoded RGB images
(numpy HWC uint8; one ``(B, H, W, 3)`` array when ``size`` is given, else a
list) together with the samples' indices (and keys/metadata on request).

* Order: file order, or a permutation seeded by ``(seed, epoch)``
  (:meth:`TblLoader.set_epoch`), identical on every rank.
* Distributed: ``rank``/``world_size`` (default from ``RANK``/``WORLD_SIZE``)
  split each epoch so that every selected sample is seen exactly once over
  all ranks and every rank gets the same number of batches (needed so DDP
  does not hang): :func:`plan_batches`. ``drop_last`` keeps only full
  batches instead (and then drops the remainder).
* ``filter``: a predicate on :class:`~warpdata.formats.tbl.SampleInfo`
  applied before sharding, from the index alone (no decode).
* Decoding runs in ``threads`` threads (simplejpeg and Pillow release the
  GIL), ``prefetch`` batches ahead. JPEGs are decoded with DCT-domain
  downscaling when the target is at least 2x smaller, so only the needed
  resolution is ever reconstructed (docs/design.md §3: decode is the bottleneck);
  a bilinear resize then gives the exact size.
* Memory: each batch's images live in one buffer. A buffer is handed out
  again only once nothing outside the loader references it (no image, view
  or tensor built on it is alive: the refcount check ``ndarray.resize``
  uses), so a training loop that drops each batch reuses a few warm buffers
  instead of faulting in fresh pages for every batch, and a caller who keeps
  batches keeps them intact. The loader holds at most ``prefetch + 3`` such
  buffers (about the batches in flight anyway) until it is dropped.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from warpdata.core.errors import DataError, UsageError
from warpdata.formats.tbl import FORMAT_CODES, SampleInfo, TblReader


@dataclass
class Batch:
    images: Any  # np.ndarray (B, H, W, 3) uint8 with ``size``, else list of HWC arrays
    indices: np.ndarray  # int64 sample indices in the file
    metadata: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.indices)


def dist_from_env(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size), defaulting to the RANK / WORLD_SIZE environment variables."""
    from warpdata.core import envvars
    def env_int(name: str, default: int) -> int:
        v = envvars.get(name)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise UsageError(f"{name}={v!r} is not an integer", hint=f"unset {name} or set it to a number") from None

    world = world_size if world_size is not None else env_int("WORLD_SIZE", 1)
    r = rank if rank is not None else env_int("RANK", 0)
    if world < 1 or not 0 <= r < world:
        raise UsageError(f"rank {r} is not in [0, world_size={world})",
                         hint="pass rank= and world_size= (or RANK/WORLD_SIZE) with 0 <= rank < world_size")
    return r, world


def plan_batches(n: int, batch_size: int, world_size: int, drop_last: bool = False) -> list[tuple[int, int]]:
    """(start, stop) slices of an epoch's order for all batches, rank r taking every world_size-th.

    Without ``drop_last`` the slices cover ``range(n)`` exactly once, the
    count is a multiple of ``world_size`` (equal per rank) and batches are
    full except in the last round, where sizes shrink so no rank is left
    with nothing. With ``drop_last`` only full batches, equal per rank.
    """
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, not {batch_size}")
    if drop_last:
        per_rank = n // (world_size * batch_size)
        return [(j * batch_size, (j + 1) * batch_size) for j in range(per_rank * world_size)]
    if n == 0:
        return []
    if n < world_size:
        raise UsageError(f"{n} samples cannot be split over {world_size} ranks with every rank getting one",
                         hint="use drop_last=True, fewer ranks, or more samples")
    rounds = math.ceil(n / (world_size * batch_size))
    nb = rounds * world_size
    if nb > n:  # tiny epochs: fewer, smaller batches so every batch has a sample
        rounds = n // world_size
        nb = rounds * world_size
    extra = n - nb  # samples beyond one per batch
    if batch_size == 1 and extra:
        raise UsageError(f"{n} samples do not split evenly over {world_size} ranks with batch_size=1",
                         hint="use drop_last=True or a batch_size above 1")
    sizes = []
    for _ in range(nb):
        take = min(batch_size - 1, extra)
        sizes.append(1 + take)
        extra -= take
    if extra:
        raise UsageError(f"cannot plan {n} samples in {nb} batches of {batch_size}")
    out, pos = [], 0
    for s in sizes:
        out.append((pos, pos + s))
        pos += s
    return out


class BufferPool:
    """Flat uint8 buffers reused once no array outside the pool refers to them.

    Fresh batch memory costs a page fault per 4 KiB on first touch (and
    glibc returns freed big blocks to the kernel): keeping the decoded images
    of a batch alive made a full-size loader ~30 % slower than a loop that drops
    each image at once (BENCHMARKS.md, TBL section).
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._bufs: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made so far (the rest of the takes were reuses)

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of ``nbytes`` that no live array shares memory with."""
        bufs = self._bufs
        with self._lock:
            for k in range(len(bufs)):
                buf = bufs[k]
                # references: the list, ``buf`` and getrefcount's argument; every
                # view (numpy, memoryview, torch.from_numpy) holds one more.
                # (No enumerate(): its reused result tuple would hold another.)
                if buf.nbytes >= nbytes and sys.getrefcount(buf) == 3:
                    del bufs[k]
                    bufs.append(buf)  # most recently used last
                    return buf[:nbytes]
            # headroom, so batches of varying total size soon fit an existing buffer
            buf = np.empty(max(nbytes + nbytes // 4, 1), np.uint8)
            bufs.append(buf)
            self.allocated += 1
            if len(bufs) > self.keep:
                for k in range(len(bufs)):
                    if sys.getrefcount(bufs[k]) == 2:  # the list and the argument: idle, drop it
                        del bufs[k]
                        break
                else:
                    del bufs[0]  # all busy: forget the oldest, its users keep it alive
            return buf[:nbytes]


def _as_size(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return int(h), int(w)


class ImageDecoder:
    """Decode one stored image to RGB HWC uint8, optionally to an exact (H, W)."""

    def __init__(self, size: int | tuple[int, int] | None = None, *, fast: bool = False) -> None:
        import simplejpeg

        self._sj = simplejpeg
        self.size = _as_size(size)
        self.fast = fast

    def __call__(self, data, fmt: int, width: int = 0, height: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        if fmt == FORMAT_CODES["jpeg"]:
            with contextlib.suppress(ValueError):  # CMYK and other rarities: Pillow handles them
                return self._jpeg(data, width, height, out)
        return self._pillow(data, out)

    def _jpeg(self, data, width: int, height: int, out: np.ndarray | None) -> np.ndarray:
        sj = self._sj
        if self.size is None:
            if out is not None:
                # ValueError: the index's size was not the decoder's: decode into new memory
                with contextlib.suppress(ValueError):
                    return sj.decode_jpeg(data, colorspace="RGB", fastdct=self.fast, fastupsample=self.fast,
                                          buffer=out)
            return sj.decode_jpeg(data, colorspace="RGB", fastdct=self.fast, fastupsample=self.fast)
        th, tw = self.size
        if out is not None and (width, height) == (tw, th):
            return sj.decode_jpeg(data, colorspace="RGB", fastdct=self.fast, fastupsample=self.fast, buffer=out)
        # DCT-domain scaling to the smallest n/8 size still >= the target
        img = sj.decode_jpeg(data, colorspace="RGB", fastdct=self.fast, fastupsample=self.fast,
                             min_height=th, min_width=tw)
        return self._resize(img, out)

    def _pillow(self, data, out: np.ndarray | None) -> np.ndarray:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            img = np.asarray(im.convert("RGB"))
        return img if self.size is None else self._resize(img, out)

    def _resize(self, img: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        th, tw = self.size  # type: ignore[misc]
        if img.shape[0] != th or img.shape[1] != tw:
            from PIL import Image

            img = np.asarray(Image.fromarray(img).resize((tw, th), Image.BILINEAR))
        if out is not None:
            out[...] = img
            return out
        return img


class TblLoader:
    """Iterate batches of decoded images from a .tbl file (see the module docstring)."""

    def __init__(self, source: str | os.PathLike | TblReader, batch_size: int = 32, *,
                 size: int | tuple[int, int] | None = None, shuffle: bool = False, seed: int = 0,
                 threads: int | None = None, rank: int | None = None, world_size: int | None = None,
                 filter: Callable[[SampleInfo], bool] | None = None, drop_last: bool = False,
                 verify: bool = True, prefetch: int = 2, with_metadata: bool = False,
                 fast_decode: bool = False) -> None:
        self.reader = source if isinstance(source, TblReader) else TblReader(source, verify=verify)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.size = _as_size(size)
        self.threads = threads or os.cpu_count() or 1
        self.rank, self.world_size = dist_from_env(rank, world_size)
        self.drop_last, self.prefetch, self.with_metadata = drop_last, max(1, prefetch), with_metadata
        self.decoder = ImageDecoder(self.size, fast=fast_decode)
        self.selection = self.reader.filter(predicate=filter) if filter else np.arange(len(self.reader))
        self.epoch = 0
        self._plan = plan_batches(len(self.selection), batch_size, self.world_size, drop_last)
        self._pool = BufferPool(self.prefetch + 3)

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the next iteration (same on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return len(self._plan) // self.world_size

    def order(self) -> np.ndarray:
        """This epoch's global order of sample indices (before splitting by rank)."""
        if not self.shuffle:
            return self.selection
        rng = np.random.default_rng([self.seed, self.epoch])
        return self.selection[rng.permutation(len(self.selection))]

    def batch_indices(self, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """The sample indices of each batch this rank (and data-loader worker) yields."""
        order = self.order()
        mine = self._plan[self.rank::self.world_size][worker::num_workers]
        return [order[a:b] for a, b in mine]

    def _outputs(self, idx: np.ndarray) -> tuple[np.ndarray | None, list[np.ndarray | None]]:
        """The batch array (with ``size``) and each image's output slot, carved from one pooled buffer.

        Full-size JPEGs whose index knows their size get a slot of exactly
        that shape; other images decode into memory of their own.
        """
        n = len(idx)
        if self.size:
            h, w = self.size
            out = self._pool.take(n * h * w * 3).reshape(n, h, w, 3)
            return out, list(out)
        ent = self.reader.index[idx]
        known = (ent["format"] == FORMAT_CODES["jpeg"]) & (ent["width"] > 0) & (ent["height"] > 0)
        sizes = np.where(known, ent["width"].astype(np.int64) * ent["height"] * 3, 0)
        buf = self._pool.take(int(sizes.sum()))
        ends = np.cumsum(sizes).tolist()
        slots: list[np.ndarray | None] = []
        for k, ok in enumerate(known.tolist()):
            if ok:
                a = ends[k] - int(sizes[k])
                slots.append(buf[a:ends[k]].reshape(int(ent["height"][k]), int(ent["width"][k]), 3))
            else:
                slots.append(None)
        return None, slots

    def _decode_into(self, i: int, out: np.ndarray | None) -> np.ndarray:
        r = self.reader
        off, _size, _usize, w, h, fmt, _flags, _c = r.index[i].tolist()
        try:
            return self.decoder(r.read(i), fmt, w, h, out)
        except DataError:
            raise
        except Exception as e:
            key = r.key(i) if r.header.flags & (1 << 6) else None
            name = f"sample {i}" + (f" ({key!r})" if key else "")
            raise DataError(f"{r.path}: {name} at offset {off} could not be decoded: {e}",
                            hint="run 'warp inspect --verify' on the file; filter the sample out or re-encode it",
                            path=r.path, sample=i) from None

    def iter_batches(self, worker: int = 0, num_workers: int = 1) -> Iterator[Batch]:
        plans = self.batch_indices(worker, num_workers)
        if self.threads <= 1:
            for idx in plans:
                yield self._batch_sync(idx)
            return
        with ThreadPoolExecutor(self.threads, thread_name_prefix="tbl-decode") as pool:
            pending: deque = deque()
            it = iter(plans)

            def submit() -> bool:
                idx = next(it, None)
                if idx is None:
                    return False
                out, slots = self._outputs(idx)
                futs = [pool.submit(self._decode_into, i, slot) for i, slot in zip(idx.tolist(), slots, strict=True)]
                del slots
                pending.append((idx, out, futs))
                return True

            for _ in range(self.prefetch):
                if not submit():
                    break
            try:
                while pending:
                    idx, out, futs = pending.popleft()
                    imgs = [f.result() for f in futs]
                    submit()
                    yield self._make(idx, out if out is not None else imgs)
            finally:
                for _idx, _out, futs in pending:
                    for f in futs:
                        f.cancel()

    def _batch_sync(self, idx: np.ndarray) -> Batch:
        out, slots = self._outputs(idx)
        imgs = [self._decode_into(i, slot) for i, slot in zip(idx.tolist(), slots, strict=True)]
        del slots
        return self._make(idx, out if out is not None else imgs)

    def _make(self, idx: np.ndarray, images: Any) -> Batch:
        meta = [self.reader.metadata(int(i)) for i in idx] if self.with_metadata else None
        return Batch(images, idx, meta)

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_batches()
