"""The ``.tbl`` loader's order hook (the ``tbl`` entry of the single-file kinds,
:data:`warpdata.artifacts.kinds.FILE_KINDS`): ``TblLoader``'s own epoch order
(docs/partitioning.md), read from the file's index only, never a sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from warpdata.read.order import OrderMaker
from warpdata.tbl.loader import TblLoader


def epoch_source(target: str, *, published: bool = False, version: str | None = None,
                 store: str | None = None) -> OrderMaker:
    """The epoch order of the ``.tbl`` file at ``target`` (a local file; a .tbl is not published alone)."""
    path = Path(target)

    def make(seed: int, epoch: int, shuffle: bool) -> tuple[str, np.ndarray]:
        loader = TblLoader(path, 1, shuffle=shuffle, seed=seed, rank=0, world_size=1, verify="off")
        try:
            return loader.content, loader.order(epoch).copy()
        finally:
            loader.reader.close()
    return make
