"""PyTorch side of the feature cache: a Dataset and a gradient-accumulation loader.

Contract:

* :class:`FeatureCacheDataset` holds only a :class:`~.reader.ShardCache`
  handle (which pickles to its path and settings). Indexed by an int it
  returns one record; indexed by a sequence of ints it returns the whole
  batch as tensors, copied once from the mapped shards into the tensors'
  storage (shared memory inside a DataLoader worker, so the batch crosses to
  the main process without another copy); faster than per-item
  ``__getitem__`` + default collate (docs/design.md §4).
* :class:`BigBatchLoader` is a ``DataLoader`` over that dataset whose
  sampler is :class:`warpdata.partition.sampler.ShardAwareSampler` with
  ``batch_size = micro_batch_size × accumulation_steps``: every step fetches
  one "big batch" and yields it as a :class:`Step` with its micro-batches
  (tensor views, no copies). The sampler hands each DataLoader worker its own
  contiguous run of shards and interleaves batches in the order DataLoader
  assigns them to workers, so each worker's LRU only ever holds the shards it
  is reading. Partitioning follows the one vocabulary of every warp loader
  (``rank``, ``world_size``, ``drop_last``, ``pad``, ``seed``;
  docs/partitioning.md). ``drop_last=True`` is this loader's default, unlike
  the library's: one optimizer step is one *full* big batch and every rank
  takes the same number of steps (DDP never waits on a rank that ran out),
  without repeating a sample; the epoch's last samples that do not fill a
  round of full big batches on every rank are left out. ``drop_last=False``
  reads every sample exactly once (ranks may differ by one step), and with
  ``pad=True`` repeats samples so every rank has the same number of steps.
  ``set_epoch`` reshuffles; ``state_dict``/``load_state_dict`` resume
  mid-epoch from the last step the training loop actually consumed, also at
  another world size from the list of every rank's state.
* A cache built from ``[[directory]]`` tables weights its records by their
  directory's ``num_repeats`` (docs/features-config.md): the sampler yields
  each record that many times per epoch, from the one stored copy, and
  ``len(loader)`` counts those weighted samples (``repeat=False``: once each).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from warpdata.features.reader import ShardCache, caption_text
from warpdata.partition.digest import content_of_manifest
from warpdata.partition.sampler import BatchIndices, ShardAwareSampler
from warpdata.partition.world import UNSET, renamed

_TORCH_DTYPES = {"uint8": torch.uint8, "int8": torch.int8, "uint16": torch.uint16, "int16": torch.int16,
                 "uint32": torch.uint32, "int32": torch.int32, "uint64": torch.uint64, "int64": torch.int64,
                 "float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "bool": torch.bool}


def in_worker() -> bool:
    return torch.utils.data.get_worker_info() is not None


def decode_caption(caption: np.ndarray | torch.Tensor, length: int | torch.Tensor) -> str:
    """The stored caption text of one record."""
    arr = caption.numpy() if isinstance(caption, torch.Tensor) else caption
    return caption_text(arr, int(length))


class FeatureCacheDataset(Dataset):
    """Map-style dataset over a feature cache; ``ds[[i, j, ...]]`` is a batched read."""

    def __init__(self, cache: ShardCache | str | os.PathLike, *, fields: Sequence[str] | None = None,
                 max_resident: int = 2, verify: str = "fast") -> None:
        self.cache = cache if isinstance(cache, ShardCache) else ShardCache(cache, max_resident=max_resident,
                                                                            verify=verify)
        self.fields = list(fields) if fields else self.cache.field_names()
        unknown = set(self.fields) - set(self.cache.field_names())
        if unknown:
            raise KeyError(f"fields {sorted(unknown)} are not in the cache (it has {self.cache.field_names()})")

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return {k: torch.from_numpy(v) for k, v in self.cache.get(int(index), self.fields).items()}
        index = list(index)
        spec = {f.name: f for f in self.cache.fields}
        tensors = {}
        for name in self.fields:
            f = spec[name]
            t = torch.empty((len(index), *f.shape), dtype=_TORCH_DTYPES[np.dtype(f.dtype).name])
            if in_worker():
                # fill shared memory directly: DataLoader would otherwise copy the batch into it
                t.share_memory_()
            tensors[name] = t
        self.cache.get_batch(index, out={k: v.numpy() for k, v in tensors.items()})
        return tensors


class _BatchIndexSampler(BatchIndices, Sampler):
    """Yields the shard-aware sampler's big batches as index lists (one dataset call per batch)."""


@dataclass
class Step:
    """One optimizer step's data: the big batch and its micro-batch views."""

    epoch: int
    index: int  # step number within the epoch
    batch: dict[str, torch.Tensor]
    micro_batches: list[dict[str, torch.Tensor]]

    def __len__(self) -> int:
        return len(next(iter(self.batch.values()))) if self.batch else 0


def split_batch(batch: dict[str, torch.Tensor], micro_batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Split a batch along dim 0 into views of ``micro_batch_size`` (last may be shorter)."""
    if not batch:
        return []
    parts = {k: torch.split(v, micro_batch_size) for k, v in batch.items()}
    n = len(next(iter(parts.values())))
    return [{k: parts[k][i] for k in batch} for i in range(n)]


class BigBatchLoader:
    """Steps of ``micro_batch_size × accumulation_steps`` samples from a feature cache.

    ``rank`` / ``world_size`` (default: torch.distributed, then RANK /
    WORLD_SIZE, else 0 / 1), ``drop_last`` (default True here, unless
    ``pad=True``: full big batches, equal steps on every rank, no repeats; see
    the module docstring), ``pad`` (repeat samples so every rank has as many
    steps), ``seed``. ``verify``: ``"fast"`` (each record's CRC-32C),
    ``"full"`` (each shard's SHA-256 as it is mapped) or ``"off"``.
    ``num_replicas=`` is the deprecated name of ``world_size=``.
    """

    def __init__(self, cache: ShardCache | str | os.PathLike, *, micro_batch_size: int,
                 accumulation_steps: int = 1, num_workers: int = 2, rank: int | None = None,
                 world_size: int | None = None, seed: int = 0, shuffle: bool = True, window: int | None = None,
                 drop_last: bool | None = None, pad: bool = False, fields: Sequence[str] | None = None,
                 max_resident: int = 2, verify: str = "fast", prefetch_factor: int = 2,
                 persistent_workers: bool = True, pin_memory: bool = False,
                 multiprocessing_context: str | None = None, repeat: bool = True,
                 num_replicas: Any = UNSET) -> None:
        world_size = renamed("BigBatchLoader", "num_replicas", num_replicas, "world_size", world_size, None)
        if micro_batch_size < 1 or accumulation_steps < 1:
            raise ValueError("micro_batch_size and accumulation_steps must be >= 1")
        if drop_last is None:
            drop_last = not pad  # this loader's default, unless pad=True asks for the padded split
        self.dataset = FeatureCacheDataset(cache, fields=fields, max_resident=max_resident, verify=verify)
        self.micro_batch_size = micro_batch_size
        self.accumulation_steps = accumulation_steps
        self.big_batch_size = micro_batch_size * accumulation_steps
        shard_size = int(self.dataset.cache.shard_sizes.max()) if self.dataset.cache.num_shards else 1
        self.sampler = ShardAwareSampler(
            self.dataset.cache.shard_sizes, rank=rank, world_size=world_size,
            num_workers=max(1, num_workers), batch_size=self.big_batch_size, shuffle=shuffle, seed=seed,
            # default window: one shard, so a worker's reads stay inside <= 2 resident shards
            window=window or shard_size, drop_last=drop_last, pad=pad,
            repeats=self.dataset.cache.record_repeats() if repeat else None,
            content=content_of_manifest(self.dataset.cache.manifest))
        self.drop_last, self.pad = self.sampler.drop_last, self.sampler.pad
        self.rank, self.world_size = self.sampler.rank, self.sampler.world_size
        self._batches = _BatchIndexSampler(self.sampler)
        kw: dict[str, Any] = {}
        if num_workers > 0:
            kw.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=multiprocessing_context)
        self.loader = DataLoader(self.dataset, batch_size=None, sampler=self._batches, num_workers=num_workers,
                                 pin_memory=pin_memory, **kw)
        self._step = 0  # steps handed to the training loop this epoch
        self._resume_step = 0

    def __len__(self) -> int:
        """Steps per epoch (equal on every rank with ``drop_last`` or ``pad``)."""
        return len(self._batches)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.sampler.epoch:
            self._step = self._resume_step = 0
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Step]:
        self._step = self._resume_step
        self._resume_step = 0
        for batch in self.loader:
            step = Step(self.sampler.epoch, self._step, batch, split_batch(batch, self.micro_batch_size))
            self._step += 1
            yield step

    def state_dict(self) -> dict[str, Any]:
        """Resume state after the steps yielded so far (prefetched batches are not counted)."""
        return {"epoch": self.sampler.epoch, "step": self._step,
                "sampler": self.sampler.state_dict(consumed=min(self._step * self.big_batch_size,
                                                                len(self.sampler)))}

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Resume from this rank's state, or from the list of every rank's states (any world size).

        After a resume at another world size the steps of this run are numbered
        from 0 and cover what the old run's ranks had not consumed.
        """
        many = isinstance(state, (list, tuple))
        self.sampler.load_state_dict([s["sampler"] for s in state] if many else state["sampler"])
        self._resume_step = 0 if self.sampler.resumed_elsewhere else int((state[0] if many else state)["step"])
        self._step = self._resume_step
