"""Tensor warehouse: validated, deterministically transformed TWH1 shards + manifest.

Build one with ``warp etl --config transform.toml`` (:mod:`.etl`); read one
with :func:`open` (:mod:`.reader`; a path, or a published dataset name) or, for PyTorch,
:class:`warpdata.warehouse.torch.WarehouseDataset` / ``make_loader``. The
shard format is :mod:`warpdata.formats.twh1` (docs/formats/twh1.md); the
manifest schema ships as ``manifest.schema.json``.
"""

from __future__ import annotations

from typing import Any


def open(path, *, allow_invalid: bool = False, verify: str = "fast", version: str | None = None,
         store: str | None = None, mode: str | None = None, artifact: str | None = None) -> Any:
    """Open a warehouse version directory, or a published dataset by name (``"vision/coco"``).

    See :func:`warpdata.warehouse.reader.open`; ``version=``/``store=``
    pick the published version and store (default: latest in WARP_STORE);
    ``verify``: ``"fast"`` (each shard's SHA-256 on first touch), ``"full"``
    (every shard's when opened) or ``"off"``.
    """
    from warpdata.warehouse.reader import open as _open

    return _open(path, allow_invalid=allow_invalid, verify=verify, version=version, store=store, mode=mode,
                 artifact=artifact)
