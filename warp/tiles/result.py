"""What a :class:`~warpdata.tiles.writer.TileWriter` returns and the documents it ends with: the
pyramid group's ``zarr.json`` and the manifest's schema check (docs/formats/zarr-tiles.md)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from warpdata.artifacts.kinds import validate
from warpdata.core.errors import DataError, InternalError
from warpdata.core.names import ZARR_ARRAY
from warpdata.formats import zarr_v3
from warpdata.tiles.ome import group_attributes


@dataclass
class WriteResult:
    url: str
    shape: tuple[int, ...]
    dtype: str
    raw_bytes: int
    stored_bytes: int
    objects: int
    chunks: int
    levels: list[dict] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    #: pyramids: whether the group is valid OME-Zarr 0.5 ({"valid", "version", "reason", "text"}); None for one level
    ome_zarr: dict[str, Any] | None = None
    #: CRC-32C of the bytes this writer took (a range writer: its rows only)
    crc32c: int = 0

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 0.0


def pyramid_group(levels: list[dict], axes: list[dict], method: str, attributes: dict) -> tuple[bytes, dict]:
    """A pyramid's group ``zarr.json`` (its bytes) and whether it is valid OME-Zarr 0.5 (ome.py)."""
    fac = [2.0 if a.get("type") == "space" else 1.0 for a in axes]
    scales = [(lv["path"], [f ** i for f in fac]) for i, lv in enumerate(levels)]
    multiscale = zarr_v3.ome_multiscales(scales, axes, method=method)["ome"]["multiscales"][0]
    # valid OME-Zarr 0.5 where the axes qualify, else under "warp" with the reason (ome.py)
    attrs, ome_zarr = group_attributes(multiscale, axes)
    attrs.update(attributes)
    return zarr_v3.encode_json(zarr_v3.group_metadata(attrs)), ome_zarr


def check_manifest(doc: dict, where: str) -> None:
    """The manifest against its schema before it is written: a failure is a bug in warp, not bad input."""
    try:
        validate(doc, where)
    except DataError as e:
        raise InternalError(f"TileWriter built an invalid manifest: {e.message}",
                            hint="report this with the array's shape, dtype and options") from None


def warm_manifest_check() -> None:
    """Load what :func:`check_manifest` needs (jsonschema, the zarr-array schema and its validator)
    ahead of the first check: the check of an empty document, whose rejection is expected."""
    with contextlib.suppress(DataError):
        validate({"kind": ZARR_ARRAY}, "(warm-up of the manifest check)")
