"""``warp inspect WAREHOUSE --preview``: the tensor warehouse's previewer, named in the artifact-kind
table (:mod:`warpdata.artifacts.kinds`).
"""

from __future__ import annotations

from warpdata.artifacts.preview import (
    BACKGROUND,
    Preview,
    class_color,
    default_font,
    draw_caption,
    grid,
    origin,
    u8_chw,
)
from warpdata.core.errors import DataError
from warpdata.core.names import TENSOR_WAREHOUSE
from warpdata.warehouse.reader import Warehouse


def preview(path: str, n: int = 16) -> Preview:
    """A grid of the first ``n`` samples as stored, each box outlined in its class colour with the class name."""
    from PIL import Image, ImageDraw  # Pillow is imported only when a picture is drawn

    wh = Warehouse(path, allow_invalid=True)
    try:
        n = min(n, len(wh))
        if n == 0:
            raise DataError(f"{path}: the warehouse has no samples to draw", hint="rebuild it with 'warp etl'")
        names = {}
        for c in wh.manifest.get("classes", []) if hasattr(wh, "manifest") else []:
            if isinstance(c, dict):
                names[int(c.get("id", len(names)))] = str(c.get("name", c.get("id")))
        first = wh[0]
        _, h, w = first.image.shape
        scale = max(1, 256 // max(h, w))
        tw, th = w * scale, h * scale
        cols, _rows, cw, ch = grid(n, tw, th)
        canvas = Image.new("RGB", (cw, ch), BACKGROUND)
        draw = ImageDraw.Draw(canvas)
        tiles = []
        for i in range(n):
            s = wh[i]
            x0, y0 = origin(i, cols, tw, th)
            im = Image.fromarray(u8_chw(s.image)).convert("RGB")
            if scale != 1:
                im = im.resize((tw, th), Image.NEAREST)
            canvas.paste(im, (x0, y0))
            for b in range(s.boxes.shape[0]):
                if not s.mask[b]:
                    continue
                cls = int(s.classes[b])
                x1, y1, x2, y2 = (float(v) * scale for v in s.boxes[b])
                box = [x0 + round(x1), y0 + round(y1), x0 + max(round(x1), round(x2) - 1),
                       y0 + max(round(y1), round(y2) - 1)]
                draw.rectangle(box, outline=class_color(cls), width=2)
                label = names.get(cls, str(cls))  # on a tab of the class colour, readable on any image
                tw_ = round(draw.textlength(label, font=default_font()))
                draw.rectangle([box[0], box[1], box[0] + tw_ + 4, box[1] + 12], fill=class_color(cls))
                draw.text((box[0] + 2, box[1] + 1), label, fill=(0, 0, 0), font=default_font())
            draw_caption(draw, x0, y0 + th + 1, s.key, tw)
            tiles.append((x0, y0, scale))
        return Preview(canvas, TENSOR_WAREHOUSE, tiles)
    finally:
        wh.close()
