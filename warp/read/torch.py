"""PyTorch over a table: :class:`TorchLoader` and the picklable IterableDataset behind it.

Numeric columns become tensors, other columns lists; each DataLoader worker reopens the
dataset by id (the recipe of the dataset's ``reopen()``, :class:`~warpdata.read.base.DatasetBase`),
so nothing heavy is pickled and this module imports no dataset module (they import it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warpdata.core.errors import missing_dependency
from warpdata.partition.plan import ResumeState

if TYPE_CHECKING:
    from warpdata.read.source import TableSource


class TorchLoader:
    """A DataLoader over a table with resume state; iterate it like any DataLoader.

    Numeric columns become tensors (zero-copy from Arrow where possible);
    other columns stay lists. ``len()`` is the number of batches this rank
    yields (equal on every rank with ``pad=True`` or ``drop_last=True``).
    ``world``: ``(rank, world_size)`` resolved in the main process, or
    ``(None, None)`` to take them from a resume state; the workers get them
    as they are (a worker has no process group of its own).
    """

    def __init__(self, table: TableSource, batch_size: int, columns: list[str] | None, num_workers: int,
                 world: tuple[int | None, int | None], kw: dict[str, Any]) -> None:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise missing_dependency("to_torch()", "torch", "torch") from None
        self.table, self.batch_size, self.columns = table, batch_size, columns
        self.num_workers, self.kw = num_workers, kw
        self.rank, self.world_size = world
        self.read_refs = False
        self.consumed = 0
        self._probe = table.batches(batch_size, columns, rank=self.rank, world_size=self.world_size,
                                    worker=(0, 1), **kw)
        self.rank, self.world_size = self._probe.plan.rank, self._probe.plan.world
        # No more DataLoader workers than this rank has batches: the plan refuses a worker with
        # no batch (docs/partitioning.md), and a small table with drop_last=True (the README's
        # 500 rows in batches of 256: one batch) would otherwise fail for a worker that had
        # nothing to do. Same batches, same order; the extra processes are just not started.
        left = len(self._probe.plan.remaining())
        if left:
            self.num_workers = min(num_workers, left)

    def __len__(self) -> int:
        return len(self._probe.plan.remaining())

    def state_dict(self) -> ResumeState:
        """This rank's resume state after the batches the loop consumed (gather every rank's for another world)."""
        return self._probe.plan.state_after(self.consumed, max(1, self.num_workers),
                                            manifest=self.table.ds.version, table=self.table.name)

    def __iter__(self):
        from torch.utils.data import DataLoader

        kw = self.kw
        if kw.get("resume") is not None:
            # the workers get this rank's state as planned here (a list of every rank's states merged once)
            kw = {**kw, "resume": self._probe.plan.state_after(0, manifest=self.table.ds.version,
                                                                table=self.table.name)}
        # a registered dataset is found again by name, a published one in its store (reopen())
        ds = _make_torch_iterable((self.table.ds.reopen(), self.table.name, self.batch_size, self.columns,
                                   (self.rank, self.world_size), kw, self.read_refs))
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
                (reopen, args), table, batch_size, columns, world, kw, read_refs = self.args
                ds = reopen(*args)
                t = ds.table(table)
                readers = {c: ds.artifact(b.artifact) for c, b in t.bindings.items()} if read_refs else {}
                for b in t.batches(batch_size, columns, rank=world[0], world_size=world[1], **kw):
                    d = _to_torch_batch(b)
                    for c, reader in readers.items():
                        if c in d:
                            vals = d[c]
                            got = iter(reader.read_many([v for v in vals if v is not None]))
                            d[c] = [None if v is None else next(got) for v in vals]
                    yield d

        _TORCH_ITERABLE = WarpTableIterable
    return _TORCH_ITERABLE(args)
