"""Pictures of warp artifacts (``warp inspect ARTIFACT --preview out.png``), drawn with Pillow.

:func:`render` picks the picture from the artifact's kind:

* tensor warehouse: a grid of the first N samples as stored (letterboxed by
  the ETL), each box outlined in its class colour with the class name;
* ``.tbl`` file, or a published dataset with an image-bound column: a contact
  sheet of the first N images, each fitted into a square tile with its index
  or member name below;
* Zarr array or pyramid: the middle 2-D slice of every level side by side,
  contrast-stretched to the 1st-99th percentile, and a 64-bin histogram of
  level 0's slice;
* feature cache: the stored pixels of the first N records with their captions
  (records without pixels show their caption only);
* an ETL run's ``metrics.json``: horizontal bar charts of phase timings (and
  CPU seconds per stage) and of quarantine reasons.

The returned :class:`Preview` carries the image and where each tile was drawn
(``tiles``: ``(x, y, scale)`` of each sample's top-left pixel), so callers and
tests can map sample coordinates to picture coordinates.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from typing import Any

from warpdata.artifacts.inspect import find_target
from warpdata.artifacts.kinds import KINDS
from warpdata.core.errors import DataError, MissingInputError, UsageError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import DATASET
from warpdata.core.registry import load
from warpdata.formats.tbl import TblReader

__all__ = ["CAPTION_H", "PAD", "TILE", "Preview", "class_color", "contact_sheet", "default_font", "draw_caption",
           "grid", "metrics_chart", "origin", "published", "render", "stretch", "tbl", "to_png", "u8_chw"]

PAD = 4  # pixels between and around tiles
CAPTION_H = 14  # text line below a tile
BACKGROUND = (24, 24, 24)
TEXT = (235, 235, 235)
TILE = 160  # contact-sheet tile side
# class colours: distinct, saturated, none close to grey or to each other
PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


def class_color(cls: int) -> tuple[int, int, int]:
    return PALETTE[int(cls) % len(PALETTE)]


@dataclass
class Preview:
    image: Any  # PIL.Image.Image
    kind: str
    tiles: list[tuple[int, int, int]] = field(default_factory=list)  # (x, y, scale) per sample


def to_png(p: Preview) -> bytes:
    buf = io.BytesIO()
    p.image.save(buf, "PNG", optimize=False)
    return buf.getvalue()


def default_font():
    from PIL import ImageFont

    return ImageFont.load_default()


def grid(n: int, tile_w: int, tile_h: int, caption: bool = True) -> tuple[int, int, int, int]:
    """(columns, rows, canvas width, canvas height) for n tiles."""
    cols = max(1, math.ceil(math.sqrt(n)))
    rows = max(1, math.ceil(n / cols))
    cell_h = tile_h + (CAPTION_H if caption else 0)
    return cols, rows, PAD + cols * (tile_w + PAD), PAD + rows * (cell_h + PAD)


def origin(i: int, cols: int, tile_w: int, tile_h: int, caption: bool = True) -> tuple[int, int]:
    cell_h = tile_h + (CAPTION_H if caption else 0)
    return PAD + (i % cols) * (tile_w + PAD), PAD + (i // cols) * (cell_h + PAD)


def u8_chw(img) -> Any:
    """A (C, H, W) array of any stored dtype as HWC uint8 (float dtypes hold x/255)."""
    import numpy as np

    a = np.asarray(img)
    if a.dtype != np.uint8:
        a = np.clip(np.rint(a.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    a = np.moveaxis(a, 0, -1)
    return a[..., 0] if a.shape[-1] == 1 else a


def draw_caption(draw, x: int, y: int, text: str, width: int) -> None:
    font = default_font()
    while text and draw.textlength(text, font=font) > width:
        text = text[:-2] + "…" if len(text) > 2 else ""
    draw.text((x, y), text, fill=TEXT, font=font)


# -- contact sheets ---------------------------------------------------------------

def contact_sheet(images: list[tuple[str, bytes]], kind: str, tile: int = TILE) -> Preview:
    """Each image fitted (aspect kept) into a ``tile`` square, with its caption; undecodable ones are crossed out."""
    from PIL import Image, ImageDraw, UnidentifiedImageError

    if not images:
        raise DataError(f"{kind}: no image to draw", hint="the artifact holds no samples")
    cols, _rows, cw, ch = grid(len(images), tile, tile)
    canvas = Image.new("RGB", (cw, ch), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    tiles = []
    for i, (name, data) in enumerate(images):
        x0, y0 = origin(i, cols, tile, tile)
        try:
            with Image.open(io.BytesIO(data)) as im:
                im = im.convert("RGB")
                sc = min(tile / im.width, tile / im.height)
                im = im.resize((max(1, round(im.width * sc)), max(1, round(im.height * sc))), Image.BILINEAR)
                canvas.paste(im, (x0 + (tile - im.width) // 2, y0 + (tile - im.height) // 2))
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            draw.rectangle([x0, y0, x0 + tile - 1, y0 + tile - 1], outline=(200, 0, 0))
            draw.line([x0, y0, x0 + tile - 1, y0 + tile - 1], fill=(200, 0, 0))
        draw_caption(draw, x0, y0 + tile + 1, name, tile)
        tiles.append((x0, y0, 1))
    return Preview(canvas, kind, tiles)


def tbl(path: str, n: int = 16) -> Preview:
    r = TblReader(path)
    try:
        return contact_sheet([(str(i), bytes(r.read(i))) for i in range(min(n, len(r)))], "tbl")
    finally:
        if hasattr(r, "close"):
            r.close()


# -- Zarr -------------------------------------------------------------------------

def stretch(a) -> Any:
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return np.zeros(a.shape, np.uint8)
    lo, hi = np.percentile(finite, [1, 99])
    if hi <= lo:
        hi = lo + 1
    return (np.clip((np.nan_to_num(a, nan=lo) - lo) / (hi - lo), 0, 1) * 255).astype(np.uint8)


# -- ETL metrics -------------------------------------------------------------------

def metrics_chart(path: str) -> Preview:
    from PIL import Image, ImageDraw

    try:
        with open(path, "rb") as f:
            m = load_json(f.read(), path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable metrics.json: {e}", hint="give the metrics.json an ETL run wrote") from None
    if not isinstance(m, dict):
        raise DataError(f"{path}: metrics.json is not an object", hint="give the metrics.json an ETL run wrote")
    sections: list[tuple[str, dict[str, float], str]] = []
    for key, title, unit in (("phases_s", "phase timings", "s"), ("cpu_s", "CPU time per stage", "s"),
                             ("skip_reasons", "quarantine reasons", "samples")):
        v = m.get(key)
        if isinstance(v, dict):
            vals = {str(k): float(x) for k, x in v.items() if isinstance(x, (int, float)) and not isinstance(x, bool)}
            if vals or key == "skip_reasons":
                sections.append((title, vals, unit))
    if not sections:
        raise DataError(f"{path}: has none of phases_s, cpu_s, skip_reasons", hint="give the metrics.json an ETL run wrote")
    label_w, bar_w, row_h = 140, 320, 16
    height = PAD + sum(CAPTION_H + PAD + max(1, len(v)) * row_h + PAD for _, v, _ in sections)
    canvas = Image.new("RGB", (PAD * 3 + label_w + bar_w + 90, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    y = PAD
    tiles = []
    for title, vals, unit in sections:
        draw.text((PAD, y), title, fill=TEXT, font=default_font())
        y += CAPTION_H + PAD
        if not vals:
            draw.text((PAD, y), "none", fill=TEXT, font=default_font())
            y += row_h + PAD
            continue
        top = max(vals.values()) or 1.0
        for k, (name, v) in enumerate(sorted(vals.items(), key=lambda kv: -kv[1])):
            draw_caption(draw, PAD, y + 2, name, label_w)
            length = round(bar_w * max(v, 0) / top)
            x0 = PAD * 2 + label_w
            if length:
                draw.rectangle([x0, y + 2, x0 + length - 1, y + row_h - 3], fill=class_color(k))
            draw.text((x0 + length + 4, y + 2), f"{v:g} {unit}", fill=TEXT, font=default_font())
            tiles.append((x0, y + 2, length))
            y += row_h
        y += PAD
    return Preview(canvas, "etl-metrics", tiles)


# -- dispatch -----------------------------------------------------------------------

def published(name: str, n: int = 16, store: str | None = None, version: str | None = None) -> Preview:
    """The contact sheet of published dataset ``name``: the dataset kind's previewer, from the kind table."""
    return load(KINDS[DATASET].previewer, "previewer")(name, n, store=store, version=version)


def render(target: str, n: int = 16) -> Preview:
    """The picture for ``target`` (see the module docstring).

    Each kind's previewer is named in the artifact-kind table (:mod:`warpdata.artifacts.kinds`) and
    imported only here, on use: this module imports no system.
    """
    if os.path.isfile(target) and target.endswith(".json"):
        try:
            with open(target, "rb") as f:
                doc = load_json(f.read(), target)
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and ("phases_s" in doc or "skip_reasons" in doc):
            return metrics_chart(target)
    found = find_target(target)
    if found is None and not os.path.exists(target):
        raise MissingInputError(f"{target} does not exist", hint="give a warp artifact, a metrics.json or ws/name")
    if found is not None and found.previewer:
        return load(found.previewer, "previewer")(target, n)
    raise UsageError(f"{target}: --preview cannot draw a {found.name if found else 'file of this kind'}",
                     hint="--preview draws tensor warehouses, .tbl files, Zarr arrays, feature caches, "
                          "published image datasets and ETL metrics.json files")
