"""Batches of decoded images from a .tbl file: shuffle, threads, ranks, filters.

Contract: :class:`TblLoader` yields :class:`Batch`\\ es of decoded RGB images
(numpy HWC uint8; one ``(B, H, W, 3)`` array when ``size`` is given, else a
list) together with the samples' indices (and keys/metadata on request).

* Order: file order, or a permutation seeded by ``(seed, epoch)``
  (:meth:`TblLoader.set_epoch`), identical on every rank.
* Distributed: the one partitioning and vocabulary of every warp loader
  (:mod:`warpdata.partition.split`, docs/partitioning.md). ``rank`` /
  ``world_size`` default to torch.distributed's, then ``RANK`` / ``WORLD_SIZE``,
  else 0 / 1; rank r reads one contiguous run of the epoch's order, cut into
  batches. By default (``drop_last=False, pad=False``) every selected sample is
  read exactly once over all ranks and ranks differ by at most one sample (so
  by at most one batch); under DDP use ``pad=True`` (repeat up to
  ``world_size - 1`` samples so every rank has as many batches) or
  ``drop_last=True`` (only full batches, the same number on every rank). A
  rank's batches are shared among data-loader workers round-robin (worker w
  takes batches w, w+K, ...), the order a DataLoader yields them in.
* Resume: :meth:`TblLoader.state_dict` after the batches consumed, and
  ``resume=`` / :meth:`TblLoader.load_state_dict` with this rank's state, or
  with the list of every rank's states at another world size (the rest of
  the epoch is split over the new ranks; each sample still once).
* ``verify``: ``"fast"`` (default; each payload's CRC-32 as it is read),
  ``"full"`` (also every checksum of the file once, when the loader is
  created) or ``"off"`` (:mod:`warpdata.core.verify`; ``True``/``False`` are
  the deprecated names of ``"fast"``/``"off"``).
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
import hashlib
import io
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
from warpdata.core.verify import verify_level
from warpdata.formats.tbl import FORMAT_CODES, SampleInfo, TblReader
from warpdata.partition.digest import EpochKeys, Tally
from warpdata.partition.split import (
    Remainder,
    check_all_ranks,
    check_drop_leaves_batches,
    merge_intervals,
    mode_of,
    rank_span,
)
from warpdata.partition.states import check_dict_state
from warpdata.partition.world import ResumeMismatchError, resolve_world

OLD_VERIFY = {True: "fast", False: "off"}


@dataclass
class Batch:
    images: Any  # np.ndarray (B, H, W, 3) uint8 with ``size``, else list of HWC arrays
    indices: np.ndarray  # int64 sample indices in the file
    metadata: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.indices)


def dist_from_env(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): explicit values, else torch.distributed, else RANK / WORLD_SIZE, else (0, 1)."""
    w = resolve_world(rank, world_size, worker=(0, 1))
    return w.rank, w.world_size


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
    """Iterate batches of decoded images from a .tbl file (see the module docstring).

    Partition keywords: ``rank``, ``world_size``, ``drop_last`` (default
    False), ``pad`` (default False), ``seed``; the library default reads every
    selected sample exactly once over all ranks.
    """

    def __init__(self, source: str | os.PathLike | TblReader, batch_size: int = 32, *,
                 size: int | tuple[int, int] | None = None, shuffle: bool = False, seed: int = 0,
                 threads: int | None = None, rank: int | None = None, world_size: int | None = None,
                 filter: Callable[[SampleInfo], bool] | None = None, drop_last: bool = False, pad: bool = False,
                 verify: str | bool = "fast", prefetch: int = 2, with_metadata: bool = False,
                 fast_decode: bool = False, resume: dict[str, Any] | list[dict[str, Any]] | None = None) -> None:
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, not {batch_size}")
        self.verify = verify_level(verify, "TblLoader", OLD_VERIFY)
        self.mode = mode_of(drop_last, pad, "TblLoader")
        self.reader = source if isinstance(source, TblReader) else TblReader(source, verify=self.verify != "off")
        if self.verify == "full":
            _verify_all(self.reader)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.size = _as_size(size)
        self.threads = threads or os.cpu_count() or 1
        self.rank, self.world_size = dist_from_env(rank, world_size)
        self.drop_last, self.pad = self.mode == "drop", self.mode == "pad"
        self.prefetch, self.with_metadata = max(1, prefetch), with_metadata
        self.decoder = ImageDecoder(self.size, fast=fast_decode)
        self.selection = self.reader.filter(predicate=filter) if filter else np.arange(len(self.reader))
        if self.drop_last:
            check_drop_leaves_batches(len(self.selection), self.world_size, batch_size)
        self.epoch = 0
        self._epoch_pinned = False  # set_epoch() was called: a resume state must be of this epoch
        self._skip = 0  # batches of this rank's epoch consumed before this pass (resume)
        self._yielded = 0
        self._complete = False  # a pass ended: the next one starts the epoch whole
        self._digests = EpochKeys(self.mode, self.seed)
        self._content: str | None = None
        self._orders: dict[int, np.ndarray] = {}
        self._split(())
        self._pool = BufferPool(self.prefetch + 3)
        if resume is not None:
            self.load_state_dict(resume)

    def _split(self, done) -> None:
        self._rem = Remainder(len(self.selection), done)
        self._start, self._count = rank_span(self._rem.size, self.rank, self.world_size, self.mode,
                                             self.batch_size)
        self._num_batches = -(-self._count // self.batch_size)
        self._digests.ledger = None
        self._items = None  # this rank's items in batch order, made for the first state

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the next iteration (same on every rank); a new epoch drops resume state."""
        if int(epoch) != self.epoch:
            self._skip = 0
            self._digests.carried = None
            self._complete = False
            self._split(())
        self.epoch = int(epoch)
        self._epoch_pinned = True

    def __len__(self) -> int:
        """Batches this rank yields in the next pass of this epoch."""
        return self._num_batches - self._skip

    def order(self, epoch: int | None = None) -> np.ndarray:
        """This epoch's global order of sample indices (before splitting by rank)."""
        e = self.epoch if epoch is None else int(epoch)
        if not self.shuffle:
            return self.selection
        got = self._orders.get(e)
        if got is None:
            rng = np.random.default_rng([self.seed, e])
            got = self._orders = {e: self.selection[rng.permutation(len(self.selection))]}
            got = got[e]
        return got

    # -- digests (docs/partitioning.md) -----------------------------------------
    @property
    def content(self) -> str:
        """The sample keys' content name: SHA-256 of the file's index (each payload's offset, size and CRC-32)."""
        if self._content is None:
            self._content = "tbl:" + hashlib.sha256(np.ascontiguousarray(self.reader.index).tobytes()).hexdigest()
        return self._content

    def order_digest(self, epoch: int | None = None) -> str:
        e = self.epoch if epoch is None else int(epoch)
        return self._digests.order_digest(self.content, e, self.order(e))

    def tally(self, batches_consumed: int) -> Tally:
        """The digests of this rank's first ``batches_consumed`` batches of the epoch (and what it carries)."""
        return Tally.of(self.digest_fields(batches_consumed))

    def digest_fields(self, batches_consumed: int) -> dict[str, Any]:
        """The digest fields of a state after this rank's first ``batches_consumed`` batches: a row of prefix
        sums over the epoch's keys (made a chunk at a time, :meth:`Ledger.prefix_lanes`)."""
        if self._items is None:
            self._items = np.arange(self._start, self._start + self._count, dtype=np.int64)
        dropped = self._count * self.world_size if self.mode == "drop" and self.rank == 0 else None
        return self._digests.fields(self.content, self.epoch, self.order(), self._rem, self._items,
                                    min(batches_consumed * self.batch_size, self._count), dropped)

    def _batch_positions(self, j: int) -> tuple[int, int]:
        """Items ``[lo, hi)`` of the remainder that batch ``j`` of this rank reads."""
        lo = self._start + j * self.batch_size
        return lo, self._start + min((j + 1) * self.batch_size, self._count)

    def batch_indices(self, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """The sample indices of each batch this rank (and data-loader worker) yields."""
        order = self.order()
        out = []
        for j in range(self._skip + worker, self._num_batches, max(1, num_workers)):
            out.append(order[self._rem.array(*self._batch_positions(j))])
        return out

    # -- resume -----------------------------------------------------------------
    def _fingerprint(self) -> str:
        # hashed once per selection and settings, not on every state_dict (a state saved every step)
        key = (id(self.selection), len(self.selection), len(self.reader), self.shuffle, self.seed)
        if getattr(self, "_fp_key", None) != key:
            h = hashlib.sha256(np.ascontiguousarray(self.selection, np.int64).tobytes())
            h.update(repr((len(self.reader), self.shuffle, self.seed)).encode())
            self._fp_key, self._fp = key, h.hexdigest()[:16]
        return self._fp

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """JSON-able resume state once the loop used ``batches_consumed`` batches of this pass
        (default: what this loader yielded in-process); batches skipped on resume count too."""
        k = self._yielded if batches_consumed is None else self._skip + int(batches_consumed)
        if not 0 <= k <= self._num_batches:
            raise UsageError(f"TblLoader: {k} batches consumed is not in 0..{self._num_batches} (this rank's batches)",
                             hint="pass the number of batches the training loop used in this pass")
        return {"kind": "tbl", "epoch": self.epoch, "fingerprint": self._fingerprint(), "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "mode": self.mode,
                "done": [list(x) for x in self._rem.done], "consumed": int(k), "seed": self.seed,
                "shuffle": bool(self.shuffle), **self.digest_fields(int(k))}

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from this rank's state, or from the list of every rank's states (any world size)."""
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        states = [check_dict_state("TblLoader resume", st) for st in states]  # fields and bounds first
        for st in states:
            if st.get("kind") != "tbl" or st.get("fingerprint") != self._fingerprint():
                raise ResumeMismatchError("TblLoader resume state comes from another file, filter, seed or shuffle",
                                 hint="resume with the same .tbl file, filter, seed and shuffle")
        epochs = {int(st["epoch"]) for st in states}
        if len(epochs) != 1:
            raise ResumeMismatchError(f"TblLoader resume states come from different epochs {sorted(epochs)}",
                                      hint="pass the states every rank saved at one step")
        epoch = epochs.pop()
        if self._epoch_pinned and epoch != self.epoch:
            raise ResumeMismatchError(f"TblLoader: the resume state is for epoch {epoch}, this loader was set to "
                                      f"epoch {self.epoch}",
                                      hint="call set_epoch() with the state's epoch, or load the state first")
        modes = sorted({str(st["mode"]) for st in states} | {self.mode})
        if len(modes) > 1:
            raise ResumeMismatchError(f"TblLoader: the resume states' split mode and this loader's differ {modes}",
                                      hint="resume with the drop_last / pad of the run that saved the states")
        self._digests.check("TblLoader resume", states, self.content, epoch, self.order(epoch))
        if epoch != self.epoch:
            self._orders = {}
        self.epoch = epoch
        self._complete = False
        one = states[0]
        if len(states) == 1 and (one["rank"], one["world_size"], one["batch_size"], one["mode"]) == \
                (self.rank, self.world_size, self.batch_size, self.mode):
            self._split(tuple(map(tuple, one["done"])))
            k = int(one["consumed"])
            if not 0 <= k <= self._num_batches:
                raise UsageError(f"TblLoader resume state consumed={k} is not in 0..{self._num_batches}")
            self._skip = self._yielded = k
            self._digests.resumed(states, own=True, rank=self.rank)
            return
        check_all_ranks("TblLoader resume", [(int(st["rank"]), int(st["world_size"])) for st in states])
        done: list[tuple[int, int]] = []
        n = len(self.selection)
        for st in states:
            rem = Remainder(n, tuple(map(tuple, st["done"])))
            bs = int(st["batch_size"])
            start, count = rank_span(rem.size, int(st["rank"]), int(st["world_size"]), st["mode"], bs)
            done.extend(rem.done)
            # a pad repeat (an item past the order's end) does not consume the sample it repeats
            done.extend(rem.ranges(start, min(start + min(int(st["consumed"]) * bs, count), rem.size)))
        self._split(merge_intervals(done))
        self._skip = self._yielded = 0
        # rank 0 carries what the old run consumed, so the final states sum to the epoch's digest
        self._digests.resumed(states, own=False, rank=self.rank)

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
        if self._complete:  # the last pass ended: this one reads the whole epoch again
            self._complete = False
            self._skip = 0
            self._digests.carried = None
            if self._rem.done:
                self._split(())
        plans = self.batch_indices(worker, num_workers)
        self._yielded = self._skip
        for b in self._iter_plans(plans):
            self._yielded += 1
            yield b
        # a whole pass done: the next pass of this epoch is complete again (reset when it starts,
        # so state_dict() after this pass still describes it)
        self._complete = True

    def _iter_plans(self, plans: list[np.ndarray]) -> Iterator[Batch]:
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


def _verify_all(reader: TblReader) -> None:
    """verify="full": every checksum of the file once, before the first batch."""
    problems = reader.verify_all()
    if problems:
        raise DataError(f"{reader.path}: {len(problems)} corrupt sample(s); first: {problems[0].message}",
                        hint="run 'warp inspect --verify' on the file to list them; re-create the file or "
                             "filter the samples out", path=str(reader.path), sample=problems[0].index)
