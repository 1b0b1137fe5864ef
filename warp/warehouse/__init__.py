"""Tensor warehouse: validated, deterministically transformed TWH1 shards + manifest.

Build one with ``warp etl --config transform.toml`` (:mod:`.etl`); read one
with :func:`open` (:mod:`.reader`) or, for PyTorch,
:class:`warpdata.warehouse.torch.WarehouseDataset` / ``make_loader``. The
shard format is :mod:`warpdata.formats.twh1` (docs/formats/twh1.md); the
manifest schema ships as ``manifest.schema.json``.
"""

from __future__ import annotations

from typing import Any


def open(path, *, allow_invalid: bool = False, verify: str = "lazy") -> Any:
    """Open a warehouse version directory; see :func:`warpdata.warehouse.reader.open`."""
    from .reader import Warehouse

    return Warehouse(path, allow_invalid=allow_invalid, verify=verify)
