"""Tensor warehouse: validated, deterministically transformed TWH1 shards + manifest.

Build one with ``warp etl --config transform.toml`` (:mod:`.etl`); read one
with :func:`open` (:mod:`.reader`; a path, or a published dataset name) or, for PyTorch,
:class:`warpdata.warehouse.torch.WarehouseDataset` / ``make_loader``. The
shard format is :mod:`warpdata.formats.twh1` (docs/formats/twh1.md); the
manifest schema ships as ``manifest.schema.json``.
"""

from __future__ import annotations

from warpdata.warehouse.reader import Warehouse, open

__all__ = ["Warehouse", "open"]
