"""PyTorch adaptors for .tbl files (needs ``torch``; ``pip install 'warp-toolchain[torch]'``).

Contract:

* :class:`TblDataset` is a map-style ``Dataset``: ``ds[i]`` is
  ``(image, index)`` with ``image`` a HWC uint8 tensor (resized to ``size``
  when given, so the default collate can stack it), for use with any sampler
  (``DistributedSampler`` included).
* :class:`TblIterableDataset` yields whole batches from
  :class:`~warpdata.tbl.loader.TblLoader` (use ``DataLoader(ds,
  batch_size=None, num_workers=K)``): the rank's batches are split over the
  K workers round-robin, so the DataLoader yields them in the rank's order and
  every sample is still seen exactly once per epoch over all ranks and
  workers (the library default; ``pad=True`` or ``drop_last=True`` give every
  rank the same number of batches, as DDP needs). ``rank`` / ``world_size``
  are resolved once, in the main process. ``state_dict(batches_consumed)`` /
  ``load_state_dict`` resume mid-epoch (the list of every rank's states: at
  another world size).

Both reopen the file by path in each worker process (an mmap is never
pickled: docs/design.md §4).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

try:
    import torch
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - exercised only without torch
    from warpdata.core.errors import missing_dependency

    raise missing_dependency("the PyTorch adaptor for .tbl files", "torch", "torch") from e

from warpdata.core.verify import verify_level
from warpdata.formats.tbl import FORMAT_CODES, SampleInfo, TblReader
from warpdata.tbl.loader import OLD_VERIFY, ImageDecoder, TblLoader, _verify_all


class TblDataset(Dataset):
    """Map-style dataset of decoded images: ``ds[i] -> (HWC uint8 tensor, sample index)``.

    ``verify``: ``"fast"`` (each payload's CRC-32 as it is read), ``"full"``
    (also every checksum of the file once, here) or ``"off"``. Partitioning
    belongs to the sampler you pair it with.
    """

    def __init__(self, path: str | os.PathLike, *, size: int | tuple[int, int] | None = None,
                 verify: str | bool = "fast", filter: Callable[[SampleInfo], bool] | None = None,
                 transform: Callable[[Any], Any] | None = None) -> None:
        level = verify_level(verify, "TblDataset", OLD_VERIFY)
        self.path, self.size, self.transform = str(path), size, transform
        self.verify = level != "off"
        r = TblReader(self.path, verify=self.verify)
        if level == "full":
            _verify_all(r)
        self.selection = r.filter(predicate=filter) if filter else None
        self._n = len(self.selection) if self.selection is not None else len(r)
        r.close()
        self._reader: TblReader | None = None
        self._decoder: ImageDecoder | None = None

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        if self._reader is None:
            self._reader = TblReader(self.path, verify=self.verify)
            self._decoder = ImageDecoder(self.size)
        if not 0 <= i < self._n:
            raise IndexError(f"{self.path}: index {i} out of range ({self._n} samples)")
        j = int(self.selection[i]) if self.selection is not None else i
        info = self._reader.info(j)
        img = self._decoder(self._reader.read(j), FORMAT_CODES.get(info.format, 0), info.width, info.height)
        t = torch.from_numpy(img if img.flags.writeable else img.copy())
        return (self.transform(t) if self.transform else t), j

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_reader"] = d["_decoder"] = None
        return d


class TblIterableDataset(IterableDataset):
    """Batches from :class:`TblLoader`, split over DataLoader workers (``batch_size=None``).

    ``loader_kwargs`` are :class:`TblLoader`'s (``rank``, ``world_size``,
    ``drop_last``, ``pad``, ``seed``, ``shuffle``, ``verify``, ``resume`` ...).
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = 32, **loader_kwargs: Any) -> None:
        self.path, self.batch_size = str(path), batch_size
        loader_kwargs.setdefault("threads", 1)  # parallelism comes from the worker processes
        probe = TblLoader(self.path, batch_size, **{**loader_kwargs, "prefetch": 1})
        # resolved here, once: a worker process has no process group of its own
        loader_kwargs.update(rank=probe.rank, world_size=probe.world_size)
        if probe.verify == "full":
            loader_kwargs["verify"] = "fast"  # the whole file was checked once, by the probe
        self.kwargs = loader_kwargs
        self.epoch = probe.epoch
        self._epoch_pinned = False  # set_epoch() was called: a resume state must be of this epoch
        self._len = len(probe)
        probe.reader.close()

    def _probe(self) -> TblLoader:
        probe = TblLoader(self.path, self.batch_size, **{**self.kwargs, "prefetch": 1})
        probe.set_epoch(self.epoch)
        return probe

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.kwargs.pop("resume", None)
        self.epoch = int(epoch)
        self._epoch_pinned = True
        probe = self._probe()
        self._len = len(probe)
        probe.reader.close()

    def __len__(self) -> int:
        return self._len

    def state_dict(self, batches_consumed: int) -> dict[str, Any]:
        """This rank's resume state once the loop used ``batches_consumed`` batches of this pass."""
        probe = self._probe()
        try:
            return probe.state_dict(batches_consumed)
        finally:
            probe.reader.close()

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from this rank's state, or from the list of every rank's states (any world size)."""
        probe = TblLoader(self.path, self.batch_size, **{**self.kwargs, "resume": None, "prefetch": 1})
        if self._epoch_pinned:
            probe.set_epoch(self.epoch)
        probe.load_state_dict(state)
        self.epoch = probe.epoch
        self.kwargs["resume"] = probe.state_dict(0)  # this rank's own state: workers need no merging
        self._len = len(probe)
        probe.reader.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        loader = TblLoader(self.path, self.batch_size, **self.kwargs)
        loader.set_epoch(self.epoch)
        try:
            for b in loader.iter_batches(worker, workers):
                images = torch.from_numpy(b.images) if not isinstance(b.images, list) else \
                    [torch.from_numpy(x if x.flags.writeable else x.copy()) for x in b.images]
                yield {"images": images, "indices": torch.from_numpy(b.indices.astype("int64"))}
        finally:
            loader.reader.close()
