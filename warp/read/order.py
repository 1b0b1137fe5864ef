"""The epoch order of any artifact a warp loader reads: the ground truth of ``warp order``.

:func:`epoch_order` opens a target as the loader that reads it would
(docs/partitioning.md): a published table (``Table.batches`` / ``to_torch``), a
tensor warehouse (``make_loader``), a feature cache (``BigBatchLoader``) or a
``.tbl`` file (``TblLoader``), by ``ws/name`` or a local path, and returns its
:class:`~warpdata.partition.digest.EpochOrder`: the same sequence, content name
and digests the loader's resume states carry. Only manifests and indexes are
read, never a sample.

A table is ordered here (it is the read API's own loader). Every other loader's system registers an
order hook in the artifact-kind table (:mod:`warpdata.artifacts.kinds`: ``ArtifactKind.order`` for a
directory with a manifest, :data:`~warpdata.artifacts.kinds.FILE_KINDS` for a ``.tbl`` file), loaded
by name when used, so this module imports no system (CONTRIBUTING.md "Floors"). A hook is
:data:`OrderHook`; systems whose loader draws from
:class:`~warpdata.partition.sampler.ShardAwareSampler` build their maker with :func:`sampler_order`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warpdata.artifacts.kinds import FILE_KINDS, KINDS
from warpdata.artifacts.manifests import read_manifest
from warpdata.core.errors import MissingInputError, UsageError
from warpdata.core.names import FEATURE_CACHE, MANIFEST_NAME, TENSOR_WAREHOUSE
from warpdata.core.registry import load
from warpdata.partition.digest import EpochOrder, RunOrder
from warpdata.partition.plan import ShardPlan, content_of_table
from warpdata.partition.sampler import ShardAwareSampler
from warpdata.partition.split import mode_of
from warpdata.read.dataset import dataset

if TYPE_CHECKING:
    import numpy as np

#: ``make(seed, epoch, shuffle) -> (content name, the epoch's sequence of sample positions: an int64 array)``
OrderMaker = Callable[[int, int, bool], tuple[str, Any]]
#: an order hook: ``hook(target, published=False, version=None, store=None) -> OrderMaker``;
#: ``target`` is a local path, or with ``published=True`` a ``ws/name`` in ``store``
OrderHook = Callable[..., OrderMaker]

# EpochOrder.kind (what `warp order` prints) of each artifact kind with an order hook
KIND_NAMES = {TENSOR_WAREHOUSE: "warehouse", FEATURE_CACHE: "features", "tbl": "tbl"}
# each loader's own shuffle default
SHUFFLE = {"table": False, "warehouse": True, "features": True, "tbl": False}


def epoch_order(target: str | os.PathLike, *, seed: int = 0, epoch: int = 0, drop_last: bool = False,
                pad: bool = False, shuffle: bool | None = None, table: str | None = None,
                version: str | None = None, store: str | None = None) -> EpochOrder:
    """The epoch's order of ``target`` (a local artifact path or a published ``ws/name``)."""
    mode = mode_of(drop_last, pad, "warp order")
    p = Path(target)
    if p.exists():
        kind, make = _local(p)
    else:
        kind, make = _published(str(target), table, version, store)
    shuffle = SHUFFLE[kind] if shuffle is None else bool(shuffle)
    if shuffle and kind != "table" and int(seed) < 0:  # their loaders seed numpy, which takes no negative seed
        raise UsageError(f"--seed {seed}: a shuffled {kind} loader takes a seed >= 0",
                         hint="give the seed the loader was built with (0 or more)")
    content, sequence = make(seed, epoch, shuffle)
    return EpochOrder(kind, content, mode, int(seed), int(epoch), shuffle, sequence)


def sampler_order(shard_sizes: Sequence[int], repeats: np.ndarray | None, content: str) -> OrderMaker:
    """The maker of a loader that draws from :class:`~warpdata.partition.sampler.ShardAwareSampler`
    over shards of ``shard_sizes`` (``repeats``: each record's repeat count, or None)."""
    def make(seed: int, epoch: int, shuffle: bool) -> tuple[str, np.ndarray]:
        s = ShardAwareSampler(list(shard_sizes), rank=0, world_size=1, shuffle=shuffle, seed=seed,
                              repeats=repeats, content=content)
        runs = s.sequence_runs(epoch)  # O(shards), whatever sample count the shards claim
        return content, s.sequence(epoch) if runs is None else runs
    return make


def _hook(kind: str, target: str) -> OrderHook:
    entry = FILE_KINDS.get(kind) or KINDS.get(kind)
    if entry is None or not entry.order:
        raise MissingInputError(f"{target}: a {kind} has no loader to order",
                                hint="warp order takes a published table, a tensor warehouse, a feature cache "
                                     "or a .tbl file")
    return load(entry.order, f"order hook of {kind}")


def _local(p: Path) -> tuple[str, OrderMaker]:
    if p.is_file():
        kind = next((k.name for k in FILE_KINDS.values() if p.name.endswith(k.suffix)), next(iter(FILE_KINDS)))
        return KIND_NAMES[kind], _hook(kind, str(p))(p)
    man = p / MANIFEST_NAME
    if not man.is_file():
        raise MissingInputError(f"{p}: not a .tbl file, and no {MANIFEST_NAME} in it",
                                hint="pass a .tbl file, a warehouse or feature-cache version directory, "
                                     "or a published WS/NAME")
    kind = read_manifest(man)["kind"]  # a damaged manifest is a DataError naming it, not a crash
    return KIND_NAMES.get(kind, kind), _hook(kind, str(p))(p)


def _published(name: str, table: str | None, version: str | None, store: str | None) -> tuple[str, OrderMaker]:
    ds = dataset(name, version=version, store=store)
    # a warehouse or feature cache is published as the artifact named by its kind, and ordered as its
    # loader reads it (the first such kind in the table), unless --table asks for one of the tables
    if table is None:
        for kind, entry in KINDS.items():
            if entry.order and kind in ds.artifacts:
                return KIND_NAMES[kind], _hook(kind, name)(name, published=True, version=version, store=store)
    if ds.tables:
        t = ds.table(table)

        def make(seed: int, epoch: int, shuffle: bool) -> tuple[str, RunOrder]:
            runs = ShardPlan(t._row_counts(), seed=seed, epoch=epoch, shuffle=shuffle).runs()
            # the row groups' runs: O(row groups), whatever row count the manifest claims
            return content_of_table(ds.version, t.name), RunOrder([a for a, _ in runs], [n for _, n in runs])
        return "table", make
    raise MissingInputError(f"{name} has no table, tensor warehouse or feature cache to order",
                            hint=f"warp info {name}  (lists its tables and artifacts)")
