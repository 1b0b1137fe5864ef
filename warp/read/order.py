"""The epoch order of any artifact a warp loader reads: the ground truth of ``warp order``.

:func:`epoch_order` opens a target as the loader that reads it would
(docs/partitioning.md): a published table (``Table.batches`` / ``to_torch``), a
tensor warehouse (``make_loader``), a feature cache (``BigBatchLoader``) or a
``.tbl`` file (``TblLoader``), by ``ws/name`` or a local path, and returns its
:class:`~warpdata.partition.digest.EpochOrder`: the same sequence, content name
and digests the loader's resume states carry. Only manifests and indexes are
read, never a sample.
"""

from __future__ import annotations

import os
from pathlib import Path

from warpdata.core.errors import MissingInputError, UsageError
from warpdata.partition.digest import EpochOrder, content_of_manifest
from warpdata.partition.split import mode_of

KINDS = ("table", "warehouse", "features", "tbl")
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


def _sampler_order(shard_sizes, repeats, content):
    def make(seed: int, epoch: int, shuffle: bool):
        from warpdata.partition.sampler import ShardAwareSampler

        s = ShardAwareSampler(list(shard_sizes), rank=0, world_size=1, shuffle=shuffle, seed=seed,
                              repeats=repeats, content=content)
        return content, s.sequence(epoch)
    return make


def _local(p: Path):
    if p.is_file():
        from warpdata.tbl.loader import TblLoader

        def make(seed: int, epoch: int, shuffle: bool):
            loader = TblLoader(p, 1, shuffle=shuffle, seed=seed, rank=0, world_size=1, verify="off")
            try:
                return loader.content, loader.order(epoch).copy()
            finally:
                loader.reader.close()
        return "tbl", make
    from warpdata.artifacts.manifests import read_manifest
    from warpdata.core.names import MANIFEST_NAME

    man = p / MANIFEST_NAME
    if not man.is_file():
        raise MissingInputError(f"{p}: not a .tbl file, and no {MANIFEST_NAME} in it",
                                hint="pass a .tbl file, a warehouse or feature-cache version directory, "
                                     "or a published WS/NAME")
    doc = read_manifest(man)  # a damaged manifest is a DataError naming it, not a crash
    from warpdata.features.manifest import KIND as FEATURES

    if doc.get("kind") == FEATURES:
        from warpdata.features.reader import ShardCache

        cache = ShardCache(p, verify="off")
        return "features", _sampler_order(cache.shard_sizes.tolist(), cache.record_repeats(),
                                          content_of_manifest(cache.manifest))
    from warpdata.warehouse.reader import Warehouse

    wh = Warehouse(p, verify="off", allow_invalid=True)
    return "warehouse", _sampler_order(wh.shard_sizes.tolist(), None, content_of_manifest(wh.manifest))


def _published(name: str, table: str | None, version: str | None, store: str | None):
    from warpdata.read.dataset import dataset

    ds = dataset(name, version=version, store=store)
    from warpdata.features.manifest import KIND as FEATURES
    from warpdata.warehouse.manifest import KIND as WAREHOUSE

    kinds = set(ds.artifacts)  # a warehouse or feature cache is published as the artifact named by its kind
    # a published warehouse or feature cache is ordered as its loader reads it, unless --table asks
    # for one of the dataset's tables (Table.batches)
    if table is None and WAREHOUSE in kinds:
        from warpdata.warehouse.reader import Warehouse

        wh = Warehouse.from_published(name, version=version, store=store, verify="off", allow_invalid=True)
        try:
            return "warehouse", _sampler_order(wh.shard_sizes.tolist(), None, content_of_manifest(wh.manifest))
        finally:
            wh.close()
    if table is None and FEATURES in kinds:
        from warpdata.features.reader import ShardCache

        cache = ShardCache(name, version=version, store=store, verify="off")
        try:
            return "features", _sampler_order(cache.shard_sizes.tolist(), cache.record_repeats(),
                                              content_of_manifest(cache.manifest))
        finally:
            cache.close()
    if ds.tables:
        t = ds.table(table)

        def make(seed: int, epoch: int, shuffle: bool):
            import numpy as np
            from warpdata.partition.plan import ShardPlan, content_of_table

            plan = ShardPlan(t._row_counts(), seed=seed, epoch=epoch, shuffle=shuffle)
            parts = [np.arange(a, a + n, dtype=np.int64) for a, n in plan.runs()]
            return content_of_table(ds.version, t.name), np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return "table", make
    raise MissingInputError(f"{name} has no table, tensor warehouse or feature cache to order",
                            hint=f"warp info {name}  (lists its tables and artifacts)")
