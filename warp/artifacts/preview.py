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
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from warpdata.core.errors import DataError, MissingInputError, UsageError
from warpdata.core.names import FEATURE_CACHE, TENSOR_WAREHOUSE, ZARR_ARRAY

__all__ = ["PAD", "Preview", "class_color", "render", "to_png"]

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


def _font():
    from PIL import ImageFont

    return ImageFont.load_default()


def _grid(n: int, tile_w: int, tile_h: int, caption: bool = True) -> tuple[int, int, int, int]:
    """(columns, rows, canvas width, canvas height) for n tiles."""
    cols = max(1, math.ceil(math.sqrt(n)))
    rows = max(1, math.ceil(n / cols))
    cell_h = tile_h + (CAPTION_H if caption else 0)
    return cols, rows, PAD + cols * (tile_w + PAD), PAD + rows * (cell_h + PAD)


def _origin(i: int, cols: int, tile_w: int, tile_h: int, caption: bool = True) -> tuple[int, int]:
    cell_h = tile_h + (CAPTION_H if caption else 0)
    return PAD + (i % cols) * (tile_w + PAD), PAD + (i // cols) * (cell_h + PAD)


def _u8_chw(img) -> Any:
    """A (C, H, W) array of any stored dtype as HWC uint8 (float dtypes hold x/255)."""
    import numpy as np

    a = np.asarray(img)
    if a.dtype != np.uint8:
        a = np.clip(np.rint(a.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    a = np.moveaxis(a, 0, -1)
    return a[..., 0] if a.shape[-1] == 1 else a


def _caption(draw, x: int, y: int, text: str, width: int) -> None:
    font = _font()
    while text and draw.textlength(text, font=font) > width:
        text = text[:-2] + "…" if len(text) > 2 else ""
    draw.text((x, y), text, fill=TEXT, font=font)


# -- warehouse ------------------------------------------------------------------

def warehouse(path: str, n: int = 16) -> Preview:
    from PIL import Image, ImageDraw
    from warpdata.warehouse.reader import Warehouse

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
        cols, _rows, cw, ch = _grid(n, tw, th)
        canvas = Image.new("RGB", (cw, ch), BACKGROUND)
        draw = ImageDraw.Draw(canvas)
        tiles = []
        for i in range(n):
            s = wh[i]
            x0, y0 = _origin(i, cols, tw, th)
            im = Image.fromarray(_u8_chw(s.image)).convert("RGB")
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
                tw_ = round(draw.textlength(label, font=_font()))
                draw.rectangle([box[0], box[1], box[0] + tw_ + 4, box[1] + 12], fill=class_color(cls))
                draw.text((box[0] + 2, box[1] + 1), label, fill=(0, 0, 0), font=_font())
            _caption(draw, x0, y0 + th + 1, s.key, tw)
            tiles.append((x0, y0, scale))
        return Preview(canvas, TENSOR_WAREHOUSE, tiles)
    finally:
        wh.close()


# -- contact sheets ---------------------------------------------------------------

def contact_sheet(images: list[tuple[str, bytes]], kind: str, tile: int = TILE) -> Preview:
    """Each image fitted (aspect kept) into a ``tile`` square, with its caption; undecodable ones are crossed out."""
    from PIL import Image, ImageDraw, UnidentifiedImageError

    if not images:
        raise DataError(f"{kind}: no image to draw", hint="the artifact holds no samples")
    cols, _rows, cw, ch = _grid(len(images), tile, tile)
    canvas = Image.new("RGB", (cw, ch), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    tiles = []
    for i, (name, data) in enumerate(images):
        x0, y0 = _origin(i, cols, tile, tile)
        try:
            with Image.open(io.BytesIO(data)) as im:
                im = im.convert("RGB")
                sc = min(tile / im.width, tile / im.height)
                im = im.resize((max(1, round(im.width * sc)), max(1, round(im.height * sc))), Image.BILINEAR)
                canvas.paste(im, (x0 + (tile - im.width) // 2, y0 + (tile - im.height) // 2))
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            draw.rectangle([x0, y0, x0 + tile - 1, y0 + tile - 1], outline=(200, 0, 0))
            draw.line([x0, y0, x0 + tile - 1, y0 + tile - 1], fill=(200, 0, 0))
        _caption(draw, x0, y0 + tile + 1, name, tile)
        tiles.append((x0, y0, 1))
    return Preview(canvas, kind, tiles)


def tbl(path: str, n: int = 16) -> Preview:
    from warpdata.formats.tbl import TblReader

    r = TblReader(path)
    try:
        return contact_sheet([(str(i), bytes(r.read(i))) for i in range(min(n, len(r)))], "tbl")
    finally:
        if hasattr(r, "close"):
            r.close()


def published(name: str, n: int = 16, store: str | None = None, version: str | None = None) -> Preview:
    import warpdata

    ds = warpdata.dataset(name, store=store, version=version)
    for b in ds.manifest.bindings:
        if b.ref_type == "image":
            rows = ds.table(b.table).select([b.column]).head(n).column(b.column).to_pylist()
            art = ds.artifact(b.artifact)
            members = [m for m in rows if m]
            return contact_sheet(list(zip(members, art.read_many(members), strict=True)), "dataset")
    raise UsageError(f"{name} binds no column to an image artifact, so there is nothing to draw",
                     hint="--preview draws datasets with an image binding (e.g. from 'warp ingest imagefolder')")


# -- feature cache ----------------------------------------------------------------

def feature_cache(path: str, n: int = 16) -> Preview:
    from PIL import Image, ImageDraw
    from warpdata.features.reader import ShardCache, caption_text

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
                canvas.paste(Image.fromarray(_u8_chw(rec["pixels"])).convert("RGB"), (x0, y0))
            text = caption_text(rec["caption"], rec["caption_len"]) if "caption" in rec else ""
            font = _font()
            line, lines = "", []
            for word in text.split():
                if draw.textlength(f"{line} {word}".strip(), font=font) > w and line:
                    lines.append(line)
                    line = word
                else:
                    line = f"{line} {word}".strip()
            lines.append(line)
            for k, ln in enumerate(lines[:cap_lines]):
                _caption(draw, x0, y0 + h + 1 + k * CAPTION_H, ln, w)
            tiles.append((x0, y0, 1))
        return Preview(canvas, FEATURE_CACHE, tiles)
    finally:
        fc.close()


# -- Zarr -------------------------------------------------------------------------

def _stretch(a) -> Any:
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return np.zeros(a.shape, np.uint8)
    lo, hi = np.percentile(finite, [1, 99])
    if hi <= lo:
        hi = lo + 1
    return (np.clip((np.nan_to_num(a, nan=lo) - lo) / (hi - lo), 0, 1) * 255).astype(np.uint8)


def zarr_array(path: str, max_side: int = 384) -> Preview:
    import numpy as np
    import zarr
    from PIL import Image, ImageDraw
    from warpdata.artifacts.manifests import MANIFEST_NAME
    from warpdata.tiles.inspect import _levels

    manifest = None
    mp = os.path.join(path, MANIFEST_NAME)
    if os.path.isfile(mp):
        with open(mp, "rb") as f:
            manifest = json.loads(f.read())
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
        canvas.paste(Image.fromarray(_stretch(s)).convert("RGB"), (x, PAD))
        _caption(draw, x, PAD + s.shape[0] + 1, f"level {name} {'x'.join(map(str, shape))}", max(s.shape[1], 60))
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
    _caption(draw, PAD, y0 + hist_h + 1, f"level 0 histogram: {edges[0]:.4g} .. {edges[-1]:.4g}", hist_w + 200)
    return Preview(canvas, ZARR_ARRAY, tiles)


# -- ETL metrics -------------------------------------------------------------------

def metrics_chart(path: str) -> Preview:
    from PIL import Image, ImageDraw

    try:
        with open(path, "rb") as f:
            m = json.loads(f.read())
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
        draw.text((PAD, y), title, fill=TEXT, font=_font())
        y += CAPTION_H + PAD
        if not vals:
            draw.text((PAD, y), "none", fill=TEXT, font=_font())
            y += row_h + PAD
            continue
        top = max(vals.values()) or 1.0
        for k, (name, v) in enumerate(sorted(vals.items(), key=lambda kv: -kv[1])):
            _caption(draw, PAD, y + 2, name, label_w)
            length = round(bar_w * max(v, 0) / top)
            x0 = PAD * 2 + label_w
            if length:
                draw.rectangle([x0, y + 2, x0 + length - 1, y + row_h - 3], fill=class_color(k))
            draw.text((x0 + length + 4, y + 2), f"{v:g} {unit}", fill=TEXT, font=_font())
            tiles.append((x0, y + 2, length))
            y += row_h
        y += PAD
    return Preview(canvas, "etl-metrics", tiles)


# -- dispatch -----------------------------------------------------------------------

def render(target: str, n: int = 16) -> Preview:
    """The picture for ``target`` (see the module docstring)."""
    from warpdata.artifacts.inspect import find_inspector

    if os.path.isfile(target) and target.endswith(".json"):
        try:
            with open(target, "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and ("phases_s" in doc or "skip_reasons" in doc):
            return metrics_chart(target)
    mod = find_inspector(target)
    name = getattr(mod, "__name__", "")
    if name == "warpdata.warehouse.inspect":
        return warehouse(target, n)
    if name == "warpdata.tbl.inspect":
        return tbl(target, n)
    if name == "warpdata.tiles.inspect":
        return zarr_array(target)
    if name == "warpdata.features.inspect":
        return feature_cache(target, n)
    if name == "warpdata.artifacts.inspect_dataset":
        return published(target, n)
    if mod is None and not os.path.exists(target):
        raise MissingInputError(f"{target} does not exist", hint="give a warp artifact, a metrics.json or ws/name")
    raise UsageError(f"{target}: --preview cannot draw a {name.rsplit('.', 1)[-1] or 'file of this kind'}",
                     hint="--preview draws tensor warehouses, .tbl files, Zarr arrays, feature caches, "
                          "published image datasets and ETL metrics.json files")
