"""Layout defaults and descriptions of a tiled array: shard shapes, OME axes, and the fields that
name its layout in a manifest and in ``warp inspect`` alike (docs/formats/zarr-tiles.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from warpdata.core.errors import ConfigError
from warpdata.formats import zarr_v3
from warpdata.formats.tiling import TileGeometry

SHARD_CAP_BYTES = 64 << 20


def auto_shards(shape: Sequence[int], tile: Sequence[int], itemsize: int, cap: int = SHARD_CAP_BYTES) -> tuple[int, ...]:
    """Default shard shape: the tile's extent on the slowest kept dimension, as
    many tiles as fit under ``cap`` bytes on the others (halving the largest)."""
    geo = TileGeometry.create(shape, tile, np.uint8)
    first = geo.kept[0]
    factors = [1 if (d <= first or s <= 1) else c for d, (s, c) in enumerate(zip(geo.shape, geo.counts, strict=True))]
    while math.prod(factors) * geo.tile_elements * itemsize > cap and max(factors) > 1:
        i = max(range(len(factors)), key=lambda d: (factors[d], -d))
        factors[i] = -(-factors[i] // 2)
    return tuple(f * n for f, n in zip(factors, geo.tile, strict=True))


def check_shards(shape: Sequence[int], tile: Sequence[int], shards: Sequence[int]) -> tuple[int, ...]:
    geo = TileGeometry.create(shape, tile, np.uint8)
    if len(shards) != len(shape):
        raise ConfigError(f"shard shape {list(shards)} has {len(shards)} dimensions but the array has {len(shape)}",
                          hint="give one shard size per dimension")
    out = []
    for d, (s, n, sh) in enumerate(zip(geo.shape, geo.tile, shards, strict=True)):
        sh = 1 if s <= 1 else int(sh)
        if sh < 1 or sh % n:
            raise ConfigError(f"shard size {sh} in dimension {d} is not a positive multiple of the tile size {n}",
                              hint="make every shard size a multiple of the tile size")
        if d == geo.kept[0] and sh != n:
            raise ConfigError(f"shard size {sh} in dimension {d} (the slowest) must equal the tile size {n}",
                              hint="streamed writes complete one tile-height of shards at a time (docs/design.md §5)")
        out.append(sh)
    return tuple(out)


def default_axes(ndim: int, names: Sequence[str] | None = None) -> list[dict]:
    """OME-style axes: …, t, c, then up to three spatial axes z, y, x (last)."""
    if names is None:
        spatial = ["z", "y", "x"][-min(ndim, 3):]
        lead = ["t", "c"][-min(ndim - len(spatial), 2):] if ndim > len(spatial) else []
        extra = [f"dim_{i}" for i in range(ndim - len(spatial) - len(lead))]
        names = extra + lead + spatial
        # leading extra axes (>= 6-D) have no type: like t and c they are not downsampled
        kinds = {"t": "time", "c": "channel", **{n: None for n in extra}}
    else:
        kinds = {"t": "time", "c": "channel"}
    if len(names) != ndim:
        raise ConfigError(f"{len(names)} axis names for {ndim} dimensions", hint="give one name per dimension")
    out = []
    for n in names:
        t = kinds.get(n, "space")
        out.append({"name": n} if t is None else {"name": n, "type": t})
    return out


def layout_fields(shape: Sequence[int], dtype: np.dtype, chunks: Sequence[int], shards: Sequence[int] | None,
                  fill_value: Any, level: int, checksum: bool) -> dict[str, Any]:
    """Level 0's layout as the manifest records it and ``warp inspect`` reports it (the same keys,
    in the same order: the manifest's bytes depend on neither, canonical JSON sorts them)."""
    return {
        "format": "zarr-v3",
        "shape": list(shape),
        "dtype": dtype.name,
        "chunks": list(chunks),
        "shards": list(shards) if shards else None,
        "fill_value": zarr_v3.fill_value_json(fill_value, dtype),
        "codec": {"name": "zstd", "level": level, "checksum": "crc32c" if checksum else None},
    }
