"""Tiled tensor compression: N-D arrays streamed, tiled and zstd-compressed into Zarr v3.

* :class:`~warpdata.tiles.writer.TileWriter` – the streaming writer (the
  design's non-blocking ``write(buf) -> int``), sharded or unsharded, with
  optional multiscale pyramids (``pyramid.py``); beside it its layout defaults
  (``layout.py``), the hash chain (``digests.py``), the first-slab canary
  (``canary.py``), its result and group metadata (``result.py``) and the
  swap of a finished local output into place (``replace.py``);
* :func:`write_array` – one call for an in-memory array;
* ``etl.run`` – the ``warp etl`` pipeline for ``[source] format = "raw" | "npy"``,
  its resumable range-parallel build in ``build.py``;
* ``inspect`` / ``preview`` / ``checks`` – ``warp inspect``, ``warp inspect --preview`` and
  ``warp doctor`` hooks (named in ``warpdata.artifacts.kinds``).

Tiling math lives in ``warpdata.formats.tiling``, the Zarr layout in
``warpdata.formats.zarr_v3``, the compression backends in ``warpdata.kernels``.
"""

from __future__ import annotations

from typing import Any


def write_array(url, array, tile, **kwargs: Any):
    """Write an in-memory array as Zarr v3 at ``url``; returns the WriteResult."""
    from warpdata.tiles.writer import TileWriter

    with TileWriter(url, array.shape, array.dtype, tile, **kwargs) as w:
        w.write_array(array)
    return w.result


__all__ = ["write_array"]
