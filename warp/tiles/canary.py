"""The first slab's canary: two chunks decoded on the CPU and compared with their input.

A cheap check (two chunks per writer, ~1 ms) against a backend that compresses the wrong bytes —
a GPU kernel or nvCOMP build never seen before, say: it fails the write before anything is
committed, instead of leaving an array that reads back wrong (docs/formats/zarr-tiles.md).
"""

from __future__ import annotations

import numpy as np
from warpdata.core.errors import InternalError
from warpdata.formats import bounded, zarr_v3
from warpdata.formats.tiling import SlabPlan, gather_tile


def check_first_chunks(plan: SlabPlan, data: np.ndarray, frames: list, *, checksum: bool, url: str,
                       backend: str) -> None:
    """Decode the first and last chunk of the slab ``data`` from ``frames``; InternalError if either differs."""
    g, counts, n = plan.geometry, plan.slab_counts, plan.tiles_per_slab
    buf = np.empty(g.tile, g.dtype)
    for t in sorted({0, n - 1}):
        idx = tuple(int(i) for i in np.unravel_index(t, counts)) if counts else ()
        expect = gather_tile(data, idx, g.tile, plan.fill, buf).tobytes()
        frame = bytes(frames[t])
        if checksum:
            frame, stored = frame[:-zarr_v3.CRC_SIZE], frame[-zarr_v3.CRC_SIZE:]
            if len(stored) != zarr_v3.CRC_SIZE or zarr_v3.chunk_crc(frame) != stored:
                frame = None
        try:  # bounded: a frame declaring more than the chunk is refused unallocated (formats/bounded.py)
            got = "a chunk whose CRC-32C does not match" if frame is None else \
                bounded.zstd(frame, len(expect), where=f"chunk {idx}")
        except bounded.FrameError as e:
            got = f"an undecodable zstd frame ({e.message})"
        if got != expect:
            what = got if isinstance(got, str) else f"{len(got)} bytes that differ from its input"
            raise InternalError(f"{url}: backend {backend} compressed chunk {idx} of the first "
                                f"slab into {what}; nothing was committed",
                                hint="write with the cpu backend ([tiles] backend = \"cpu\", WARP_BACKEND=cpu or backend=\"cpu\") "
                                     "and report this with `warp doctor --json`")
