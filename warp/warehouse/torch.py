"""PyTorch integration: a map-style Dataset with batched fetches, and a loader factory.

:class:`WarehouseDataset` wraps a warehouse *path*: the :class:`Warehouse`
(and its memory maps) is opened lazily inside each process that uses it, so
DataLoader workers (fork or spawn) never pickle or copy shard data.
``dataset[i]`` returns one sample as a dict of tensors; ``dataset[[i, j,
...]]`` (and ``__getitems__``) returns a whole batch, copied with one
``np.copyto`` per sample into freshly allocated tensors (in a worker they are
allocated in shared memory, as ``default_collate`` does, so the hand-over to
the main process costs no extra copy).

:func:`make_loader` builds a DataLoader driven by the shard-aware sampler
(:mod:`warpdata.partition.sampler`): each worker reads its own shards and the
epoch is split over ranks by the one vocabulary of every warp loader
(``rank``, ``world_size``, ``drop_last``, ``pad``, ``seed``; docs/partitioning.md).
``set_epoch`` reshuffles (``loader.sampler.set_epoch``), and resume goes through
``loader.sampler.state_dict(consumed=)`` / ``load_state_dict`` (the list of every
rank's states resumes at another world size).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info
from warpdata.core.verify import verify_level
from warpdata.partition.digest import content_of_manifest
from warpdata.partition.sampler import BatchIndices, ShardAwareSampler
from warpdata.partition.world import UNSET, renamed, split_policy
from warpdata.read.materialize import looks_like_dataset
from warpdata.warehouse.reader import OLD_VERIFY, Warehouse

_TORCH_DTYPE = {np.dtype(np.uint8): torch.uint8, np.dtype(np.float16): torch.float16,
                np.dtype(np.float32): torch.float32, np.dtype(np.int32): torch.int32,
                np.dtype(np.int64): torch.int64}


class WarehouseDataset(Dataset):
    """``path``: a warehouse directory, an open :class:`Warehouse`, or a published dataset name.

    ``verify``: ``"fast"`` (each shard's SHA-256 on its first touch in each
    process), ``"full"`` (every shard's when opened) or ``"off"``.
    """

    def __init__(self, path: str | os.PathLike | Warehouse, *, allow_invalid: bool = False,
                 verify: str = "fast") -> None:
        verify = verify_level(verify, "WarehouseDataset", OLD_VERIFY)
        opened = path if isinstance(path, Warehouse) else None
        if opened is None and looks_like_dataset(path):
            opened = Warehouse.from_published(str(path), allow_invalid=allow_invalid, verify=verify)
        # holds a published warehouse's cached tar shards pinned while this object lives; it pickles
        # without maps or pins, and each worker maps the same cached files from its copy
        self._opened = opened
        self._published = opened is not None and opened.published is not None
        self.path = str(opened.path if opened is not None else path)
        self.allow_invalid = allow_invalid
        self.verify = verify
        probe = opened if self._published else Warehouse(self.path, allow_invalid=allow_invalid, verify="off")
        self._len = len(probe)
        self.shard_sizes = probe.shard_sizes.tolist()
        self.content = content_of_manifest(probe.manifest)  # the sample keys' content name
        self._wh: Warehouse | None = None
        self._pid = -1

    @property
    def warehouse(self) -> Warehouse:
        # opened per process: a fork inherits no maps, a spawn gets only the path
        if self._wh is None or self._pid != os.getpid():
            # a published warehouse has no directory to reopen: copy it (the copy has no maps, no pins)
            self._wh = (copy.copy(self._opened) if self._published else
                        Warehouse(self.path, allow_invalid=self.allow_invalid, verify=self.verify))
            self._pid = os.getpid()
        return self._wh

    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        st["_wh"] = None
        if not self._published:
            st["_opened"] = None
        return st

    def __len__(self) -> int:
        return self._len

    def _alloc(self, n: int) -> dict[str, torch.Tensor]:
        wh = self.warehouse
        s0 = wh.shard(0)
        c, h, w = s0.images.shape[1:]
        shapes = {"image": ((n, c, h, w), s0.images.dtype), "boxes": ((n, wh.max_boxes, 4), s0.boxes.dtype),
                  "mask": ((n, wh.max_boxes), s0.mask.dtype), "classes": ((n, wh.max_boxes), np.dtype(np.int32)),
                  "frame_id": ((n,), np.dtype(np.int64)), "index": ((n,), np.dtype(np.int64))}
        shared = get_worker_info() is not None
        out = {}
        for k, (shape, dt) in shapes.items():
            t = torch.empty(shape, dtype=_TORCH_DTYPE[np.dtype(dt).newbyteorder("=")])
            out[k] = t.share_memory_() if shared else t
        return out

    def __getitems__(self, indices) -> dict[str, torch.Tensor]:
        idx = np.asarray(indices, np.int64).reshape(-1)
        tensors = self._alloc(len(idx))
        self.warehouse.batch(idx, out={k: v.numpy() for k, v in tensors.items()})
        return tensors

    def __getitem__(self, index) -> dict[str, torch.Tensor]:
        if isinstance(index, (list, tuple, np.ndarray, torch.Tensor)):
            return self.__getitems__(np.asarray(index))
        b = self.__getitems__([int(index)])
        return {k: v[0] for k, v in b.items()}


class ShardBatchSampler(BatchIndices, Sampler[list[int]]):
    """Yields the shard-aware sampler's batches as index lists (DataLoader ``sampler=`` with batch_size=None)."""


def make_loader(path: str | os.PathLike | Warehouse, *, batch_size: int, num_workers: int = 0, shuffle: bool = True,
                seed: int = 0, window: int = 1024, rank: int | None = None, world_size: int | None = None,
                drop_last: bool = False, pad: bool = False, allow_invalid: bool = False, verify: str = "fast",
                **loader_kwargs: Any) -> DataLoader:
    """A DataLoader of batch dicts over a warehouse (path, open Warehouse or published name), per rank and worker.

    ``rank`` / ``world_size``: default from torch.distributed, then RANK /
    WORLD_SIZE, else 0 / 1. The library default (``drop_last=False,
    pad=False``) reads every sample exactly once per epoch; ranks may then
    differ by one batch, which under DDP needs ``pad=True`` (repeat up to
    ``world_size - 1`` samples so every rank has as many) or ``drop_last=True``
    (full batches only, the same number per rank). ``verify``: ``"fast"``,
    ``"full"`` or ``"off"`` (:class:`WarehouseDataset`). ``num_replicas=`` and
    ``uneven=`` are the deprecated names of ``world_size=`` and ``pad=`` /
    ``drop_last=``. The sampler (``loader.sampler``, a :class:`ShardBatchSampler`)
    holds ``set_epoch``, ``state_dict(consumed=samples)`` and ``load_state_dict``.
    """
    where = "make_loader"
    world_size = renamed(where, "num_replicas", loader_kwargs.pop("num_replicas", UNSET), "world_size",
                         world_size, None)
    uneven = loader_kwargs.pop("uneven", UNSET)
    if uneven is not UNSET:
        drop_last, pad = renamed(where, "uneven", uneven, "drop_last= / pad=", (drop_last, pad), (False, False),
                                 lambda v: split_policy(where, "uneven", v))
    ds = WarehouseDataset(path, allow_invalid=allow_invalid, verify=verify)
    inner = ShardAwareSampler(ds.shard_sizes, rank=rank, world_size=world_size,
                              num_workers=max(1, num_workers), batch_size=batch_size, shuffle=shuffle,
                              seed=seed, window=window, drop_last=drop_last, pad=pad, content=ds.content)
    if num_workers:
        loader_kwargs.setdefault("persistent_workers", True)
    return DataLoader(ds, batch_size=None, sampler=ShardBatchSampler(inner), num_workers=num_workers,
                      **loader_kwargs)
