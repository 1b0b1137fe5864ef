"""``warp inspect CACHE --preview``: the feature cache's previewer, named in the artifact-kind table
(:mod:`warpdata.artifacts.kinds`).
"""

from __future__ import annotations

import math

from warpdata.artifacts.preview import (
    BACKGROUND,
    CAPTION_H,
    PAD,
    TILE,
    Preview,
    default_font,
    draw_caption,
    u8_chw,
)
from warpdata.core.errors import DataError
from warpdata.core.names import FEATURE_CACHE
from warpdata.features.reader import ShardCache, caption_text


def preview(path: str, n: int = 16) -> Preview:
    """The stored pixels of the first ``n`` records with their captions (records without pixels: the caption)."""
    from PIL import Image, ImageDraw  # Pillow is imported only when a picture is drawn

    fc = ShardCache(path)
    try:
        n = min(n, len(fc))
        if n == 0:
            raise DataError(f"{path}: the feature cache has no records", hint="rebuild it with 'warp etl'")
        has_pixels = "pixels" in fc.field_names()
        if has_pixels:
            _, h, w = fc[0]["pixels"].shape
        else:
            h, w = CAPTION_H * 4, TILE
        cap_lines = 3
        cols = max(1, math.ceil(math.sqrt(n)))
        cell_h = h + cap_lines * CAPTION_H
        canvas = Image.new("RGB", (PAD + cols * (w + PAD), PAD + math.ceil(n / cols) * (cell_h + PAD)), BACKGROUND)
        draw = ImageDraw.Draw(canvas)
        tiles = []
        for i in range(n):
            rec = fc[i]
            x0, y0 = PAD + (i % cols) * (w + PAD), PAD + (i // cols) * (cell_h + PAD)
            if has_pixels:
                canvas.paste(Image.fromarray(u8_chw(rec["pixels"])).convert("RGB"), (x0, y0))
            text = caption_text(rec["caption"], rec["caption_len"]) if "caption" in rec else ""
            font = default_font()
            line, lines = "", []
            for word in text.split():
                if draw.textlength(f"{line} {word}".strip(), font=font) > w and line:
                    lines.append(line)
                    line = word
                else:
                    line = f"{line} {word}".strip()
            lines.append(line)
            for k, ln in enumerate(lines[:cap_lines]):
                draw_caption(draw, x0, y0 + h + 1 + k * CAPTION_H, ln, w)
            tiles.append((x0, y0, 1))
        return Preview(canvas, FEATURE_CACHE, tiles)
    finally:
        fc.close()
