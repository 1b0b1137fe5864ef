"""PyTorch over a table: :class:`TorchLoader` and the picklable IterableDataset behind it.

Numeric columns become tensors, other columns lists; each DataLoader worker reopens the
dataset by id, so nothing heavy is pickled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warpdata.partition.plan import ResumeState

if TYPE_CHECKING:
    from warpdata.read.source import TableSource


class TorchLoader:
    """A DataLoader over a table with resume state; iterate it like any DataLoader.

    Numeric columns become tensors (zero-copy from Arrow where possible);
    other columns stay lists. ``len()`` is the number of batches this rank
    yields, equal on every rank.
    """

    def __init__(self, table: TableSource, batch_size: int, columns: list[str] | None, num_workers: int,
                 shard: Any, kw: dict[str, Any]) -> None:
        try:
            import torch  # noqa: F401
        except ImportError:
            from warpdata.core.errors import missing_dependency

            raise missing_dependency("to_torch()", "torch", "torch") from None
        self.table, self.batch_size, self.columns = table, batch_size, columns
        self.num_workers, self.shard, self.kw = num_workers, shard, kw
        self.read_refs = False
        self.consumed = 0
        self._probe = table.batches(batch_size, columns, shard=shard, worker=(0, 1), **kw)
        # fail now, in the main process, if some worker would get nothing
        if self._probe.plan.remaining():
            for w in range(max(1, num_workers)):
                self._probe.plan.worker_batches(w, max(1, num_workers))

    def __len__(self) -> int:
        return len(self._probe.plan.remaining())

    def state_dict(self) -> ResumeState:
        return self._probe.plan.state_after(self.consumed, max(1, self.num_workers),
                                            manifest=self.table.ds.version, table=self.table.name)

    def __iter__(self):
        from torch.utils.data import DataLoader

        ds = _make_torch_iterable((self.table.ds.id, self.table.ds.version, self.table.ds.mode,
                                   self.table.ds.remote.url, self.table.name, self.batch_size, self.columns,
                                   self.shard, self.kw, self.read_refs))
        self.consumed = 0
        for b in DataLoader(ds, batch_size=None, num_workers=self.num_workers,
                            persistent_workers=False):
            self.consumed += 1
            yield b


def _to_torch_batch(batch) -> dict[str, Any]:
    import pyarrow as pa
    import torch

    outd: dict[str, Any] = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and col.null_count == 0:
            arr = col.to_numpy(zero_copy_only=False)
            # a zero-copy view of Arrow's immutable buffer: a tensor over it could be written
            # in place (undefined behaviour), so it gets its own writable copy
            outd[name] = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        else:
            outd[name] = col.to_pylist()
    return outd


_TORCH_ITERABLE: Any = None

def _make_torch_iterable(args: tuple) -> Any:
    """The IterableDataset behind :class:`TorchLoader`; picklable, reopens the dataset per worker."""
    global _TORCH_ITERABLE
    if _TORCH_ITERABLE is None:
        from torch.utils.data import IterableDataset

        class WarpTableIterable(IterableDataset):
            def __init__(self, args: tuple) -> None:
                self.args = args

            def __reduce__(self):
                return (_make_torch_iterable, (self.args,))

            def __iter__(self):
                dataset_id, version, mode, store, table, batch_size, columns, shard, kw, read_refs = self.args
                from warpdata.read.dataset import Dataset

                ds = Dataset(dataset_id, mode=mode, version=version, store=store)
                t = ds.table(table)
                readers = {}
                if read_refs:
                    from warpdata.read.refs import ArtifactReader

                    readers = {c: ArtifactReader(ds, b.artifact) for c, b in t.bindings.items()}
                for b in t.batches(batch_size, columns, shard=shard, **kw):
                    d = _to_torch_batch(b)
                    for c, reader in readers.items():
                        if c in d:
                            vals = d[c]
                            got = iter(reader.read_many([v for v in vals if v is not None]))
                            d[c] = [None if v is None else next(got) for v in vals]
                    yield d

        _TORCH_ITERABLE = WarpTableIterable
    return _TORCH_ITERABLE(args)
