"""The feature cache's order hook (the ``order`` entry of its artifact kind,
:mod:`warpdata.artifacts.kinds`): what ``warp order`` and :func:`warpdata.read.order.epoch_order`
need to replay ``BigBatchLoader``'s epoch order (docs/partitioning.md), read from the manifest and
index only, never a record."""

from __future__ import annotations

from warpdata.features.reader import ShardCache
from warpdata.partition.digest import content_of_manifest
from warpdata.read.order import OrderMaker, sampler_order


def epoch_source(target: str, *, published: bool = False, version: str | None = None,
                 store: str | None = None) -> OrderMaker:
    """The epoch order of the feature cache at local path ``target`` (or published as ``ws/name``)."""
    cache = ShardCache(target, version=version, store=store, verify="off") if published else \
        ShardCache(target, verify="off")
    try:
        return sampler_order(cache.shard_sizes.tolist(), cache.record_repeats(), content_of_manifest(cache.manifest))
    finally:
        if published:
            cache.close()
