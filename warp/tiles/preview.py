"""``warp inspect ARRAY --preview``: the Zarr array's previewer, named in the artifact-kind table
(:mod:`warpdata.artifacts.kinds`).
"""

from __future__ import annotations

import math
import os

from warpdata.artifacts.manifests import MANIFEST_NAME
from warpdata.artifacts.preview import BACKGROUND, CAPTION_H, PAD, Preview, draw_caption, stretch
from warpdata.core.errors import DataError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import ZARR_ARRAY
from warpdata.tiles.inspect import _levels


def preview(path: str, n: int = 16, max_side: int = 384) -> Preview:
    """The middle 2-D slice of every level side by side and a histogram of level 0's (``n`` is unused)."""
    import numpy as np  # numpy, zarr and Pillow are imported only when a picture is drawn
    import zarr
    from PIL import Image, ImageDraw

    manifest = None
    mp = os.path.join(path, MANIFEST_NAME)
    if os.path.isfile(mp):
        with open(mp, "rb") as f:
            manifest = load_json(f.read(), mp)
    paths, _group = _levels(path, manifest)
    slices = []
    for p in paths:
        arr = zarr.open_array(os.path.join(path, p) if p else path, mode="r")
        if arr.ndim < 2:
            raise DataError(f"{path}/{p}: a {arr.ndim}-D array has no 2-D slice to draw",
                            hint="--preview draws arrays of 2 or more dimensions")
        step = max(1, math.ceil(max(arr.shape[-2:]) / max_side))
        idx = tuple(s // 2 for s in arr.shape[:-2]) + (slice(None, None, step), slice(None, None, step))
        slices.append((p or "0", arr.shape, np.asarray(arr[idx])))
    hist_h, hist_w = 120, 256
    width = PAD + sum(s.shape[1] + PAD for _, _, s in slices)
    height = PAD + max(s.shape[0] for _, _, s in slices) + CAPTION_H + PAD + hist_h + CAPTION_H + PAD
    canvas = Image.new("RGB", (max(width, hist_w + 2 * PAD), height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    x = PAD
    tiles = []
    for name, shape, s in slices:
        canvas.paste(Image.fromarray(stretch(s)).convert("RGB"), (x, PAD))
        draw_caption(draw, x, PAD + s.shape[0] + 1, f"level {name} {'x'.join(map(str, shape))}", max(s.shape[1], 60))
        tiles.append((x, PAD, 1))
        x += s.shape[1] + PAD
    base = slices[0][2].astype(np.float64)
    finite = base[np.isfinite(base)]
    counts, edges = np.histogram(finite, bins=64) if finite.size else (np.zeros(64), np.array([0, 1]))
    y0 = PAD + max(s.shape[0] for _, _, s in slices) + CAPTION_H + PAD
    top = max(1, int(counts.max()))
    bw = hist_w // 64
    for k, c in enumerate(counts):
        bh = round(hist_h * c / top)
        if bh:
            draw.rectangle([PAD + k * bw, y0 + hist_h - bh, PAD + (k + 1) * bw - 2, y0 + hist_h - 1], fill=(0, 130, 200))
    draw_caption(draw, PAD, y0 + hist_h + 1, f"level 0 histogram: {edges[0]:.4g} .. {edges[-1]:.4g}", hist_w + 200)
    return Preview(canvas, ZARR_ARRAY, tiles)
