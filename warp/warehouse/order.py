"""The tensor warehouse's order hook (the ``order`` entry of its artifact kind,
:mod:`warpdata.artifacts.kinds`): what ``warp order`` and :func:`warpdata.read.order.epoch_order`
need to replay ``make_loader``'s epoch order (docs/partitioning.md), read from the manifest and
index only, never a sample."""

from __future__ import annotations

from warpdata.partition.digest import content_of_manifest
from warpdata.read.order import OrderMaker, sampler_order
from warpdata.warehouse.reader import Warehouse


def epoch_source(target: str, *, published: bool = False, version: str | None = None,
                 store: str | None = None) -> OrderMaker:
    """The epoch order of the warehouse at local path ``target`` (or published as ``ws/name``)."""
    if not published:
        wh = Warehouse(target, verify="off", allow_invalid=True)
        return sampler_order(wh.shard_sizes.tolist(), None, content_of_manifest(wh.manifest))
    wh = Warehouse.from_published(target, version=version, store=store, verify="off", allow_invalid=True)
    try:
        return sampler_order(wh.shard_sizes.tolist(), None, content_of_manifest(wh.manifest))
    finally:
        wh.close()
