"""Detection sample data: photo-like JPEGs with COCO, YOLO and JSONL labels.

``python -m warpdata.sampledata detection OUT --count N`` writes::

    OUT/images/img_00000.jpg ...     photo-like JPEGs; every box is drawn as a
                                     solid rectangle of its class colour, so
                                     tests can check pixels and boxes agree
    OUT/annotations.json             COCO
    OUT/labels.jsonl                 JSONL (image, boxes xyxy, classes, frame_id, run_id)
    OUT/labels/img_00000.txt ...     YOLO (class cx cy w h, normalized; ids 0..2)
    OUT/transform.toml               ready config, output root OUT/../warehouse
    OUT/transform-yolo.toml, OUT/transform-jsonl.toml

With ``count >= 12`` the labels include deliberately broken samples (listed
in the returned description): a missing image file, a truncated JPEG (no end
marker: caught by the header pass), a JPEG whose scan data is cut with an
end marker glued on (caught only by the full decode), a box far outside its
image, and a valid image stored rotated with EXIF orientation 6 whose boxes
are in the oriented frame. About one sample in eight has no boxes.
Same seed and count → byte-identical files.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from warpdata.sampledata.photos import synthetic_photo

# lazy third-party imports: PIL (heavy) is imported inside the functions that use it, so importing
# this module does not load it

CLASSES = [(1, "person", (230, 40, 40)), (2, "car", (40, 200, 60)), (3, "dog", (40, 80, 230))]

TOML = """# Tensor warehouse config written by `python -m warpdata.sampledata detection`.
# Paths are relative to this file. See examples/transform.toml for every key.
[source]
format = "{fmt}"
path = "."
{labels}
[transform]
target_size = 320        # small for the demo; 640 is the usual detector size
resize_mode = "letterbox"
dtype = "u8"
max_boxes = 16

[validation]
# the sample data contains broken samples on purpose: they are quarantined
max_invalid_fraction = {{ warn = 0.0, fail = 0.3 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.3 }}

[output]
root = "../warehouse"
shard_size_mb = 16
"""


def _jpeg(img: np.ndarray, quality: int, exif_orientation: int | None = None) -> bytes:
    from PIL import Image

    im = Image.fromarray(img)
    buf = io.BytesIO()
    if exif_orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        im.save(buf, format="JPEG", quality=quality, exif=exif.tobytes())
    else:
        im.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def generate(out: Path, count: int = 64, seed: int = 0, *, min_side: int = 160, max_side: int = 480,
             broken: bool = True) -> dict:
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "labels").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco_images, coco_anns, jsonl = [], [], []
    broken_kinds = ["missing", "truncated", "corrupt-scan", "out-of-bounds", "exif-rotated"] if broken and count >= 12 else []
    # broken samples sit at fixed, spread-out positions
    broken_at = {int((i + 1) * count / (len(broken_kinds) + 1)): k for i, k in enumerate(broken_kinds)}
    described: dict[str, str] = {}
    ann_id = 1
    for i in range(count):
        name = f"img_{i:05d}.jpg"
        w, h = int(rng.integers(min_side, max_side + 1)), int(rng.integers(min_side, max_side + 1))
        img = synthetic_photo(rng, w, h)
        nboxes = 0 if rng.random() < 0.125 else int(rng.integers(1, 6))
        boxes, classes = [], []
        for _ in range(nboxes):
            bw, bh = int(rng.integers(8, max(9, w // 3))), int(rng.integers(8, max(9, h // 3)))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            ci = int(rng.integers(0, len(CLASSES)))
            img[y:y + bh, x:x + bw] = CLASSES[ci][2]
            boxes.append([x, y, x + bw, y + bh])
            classes.append(ci)
        kind = broken_at.get(i)
        quality = int(rng.integers(85, 96))
        if kind == "exif-rotated":
            # stored pixels are the oriented image rotated back; orientation 6 = rotate 90° clockwise to view
            data = _jpeg(np.ascontiguousarray(np.rot90(img, k=1)), quality, exif_orientation=6)
        else:
            data = _jpeg(img, quality)
        if kind == "truncated":
            data = data[: len(data) * 6 // 10]
        elif kind == "corrupt-scan":
            data = data[: len(data) // 2] + b"\xff\xd9"
        elif kind == "out-of-bounds":
            boxes.append([w // 2, h // 2, w + 50, h + 40])
            classes.append(0)
        if kind:
            described[kind] = f"images/{name}"
        if kind != "missing":
            (out / "images" / name).write_bytes(data)
        coco_images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
        for b, c in zip(boxes, classes, strict=True):
            coco_anns.append({"id": ann_id, "image_id": i + 1, "category_id": CLASSES[c][0],
                              "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "area": (b[2] - b[0]) * (b[3] - b[1]),
                              "iscrowd": 0})
            ann_id += 1
        jsonl.append({"image": f"images/{name}", "boxes": boxes, "classes": [CLASSES[c][1] for c in classes],
                      "frame_id": i, "run_id": f"run{i % 2}", "width": w, "height": h})
        # YOLO: a missing image leaves an orphan label file behind
        lines = [f"{c} {(b[0] + b[2]) / 2 / w:.6f} {(b[1] + b[3]) / 2 / h:.6f} {(b[2] - b[0]) / w:.6f} "
                 f"{(b[3] - b[1]) / h:.6f}" for b, c in zip(boxes, classes, strict=True)]
        if kind == "out-of-bounds":
            lines[-1] = "0 0.9 0.9 0.5 0.5"
        if lines or kind == "missing":
            (out / "labels" / (Path(name).stem + ".txt")).write_text("\n".join(lines) + "\n")
    coco = {"info": {"description": "warp detection sample data", "version": "1"},
            "images": coco_images, "annotations": coco_anns,
            "categories": [{"id": cid, "name": n} for cid, n, _ in CLASSES]}
    (out / "annotations.json").write_text(json.dumps(coco, indent=1, sort_keys=True))
    (out / "labels.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in jsonl))
    names = ", ".join(f'"{n}"' for _, n, _ in CLASSES)
    (out / "transform.toml").write_text(TOML.format(fmt="coco", labels='labels = "annotations.json"\nimages = "images"\n'))
    (out / "transform-yolo.toml").write_text(TOML.format(fmt="yolo", labels=f'labels = "labels"\nimages = "images"\nclasses = [{names}]\n'))
    (out / "transform-jsonl.toml").write_text(TOML.format(fmt="jsonl", labels=f'labels = "labels.jsonl"\nclasses = [{names}]\n'))
    return {"kind": "detection", "out": str(out), "count": count, "seed": seed,
            "broken": described, "configs": ["transform.toml", "transform-yolo.toml", "transform-jsonl.toml"]}


def edit(out: Path, *, relabel: int = 0, replace: int = 0, append: int = 0, seed: int = 1) -> dict:
    """The next version of a COCO set written by :func:`generate`, edited as datasets are.

    ``relabel`` images get another class on their first box, ``replace`` images get new pixels
    (same file name, size and boxes), and ``append`` new images go at the end of
    ``annotations.json`` (the other label formats are left as they were). The edited images are
    distinct images with boxes and a file, drawn with ``seed``. Same files and arguments → same
    edit. Returns the file names relabelled, replaced and appended.
    """
    out = Path(out)
    doc = json.loads((out / "annotations.json").read_text())
    rng = np.random.default_rng(seed)
    anns: dict[int, list[dict]] = {}
    for a in doc["annotations"]:
        anns.setdefault(a["image_id"], []).append(a)
    colour = {cid: c for cid, _, c in CLASSES}
    usable = [im for im in doc["images"] if anns.get(im["id"]) and (out / "images" / im["file_name"]).is_file()]
    picked = [usable[int(i)] for i in rng.choice(len(usable), relabel + replace, replace=False)]
    for im in picked[:relabel]:
        a = anns[im["id"]][0]
        a["category_id"] = a["category_id"] % len(CLASSES) + 1
    for im in picked[relabel:]:
        img = synthetic_photo(rng, im["width"], im["height"])
        for a in anns[im["id"]]:
            x, y, bw, bh = (int(v) for v in a["bbox"])
            img[y:y + bh, x:x + bw] = colour[a["category_id"]]
        (out / "images" / im["file_name"]).write_bytes(_jpeg(img, 90))
    first = max(int(Path(im["file_name"]).stem.split("_")[-1]) for im in doc["images"]) + 1
    next_image = max(im["id"] for im in doc["images"]) + 1
    next_ann = max((a["id"] for a in doc["annotations"]), default=0) + 1
    added = []
    for i in range(append):
        name = f"img_{first + i:05d}.jpg"
        w, h = (int(v) for v in rng.integers(160, 481, size=2))
        img = synthetic_photo(rng, w, h)
        bw, bh = int(rng.integers(8, w // 3)), int(rng.integers(8, h // 3))
        x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        cid, _, c = CLASSES[int(rng.integers(0, len(CLASSES)))]
        img[y:y + bh, x:x + bw] = c
        (out / "images" / name).write_bytes(_jpeg(img, 90))
        doc["images"].append({"id": next_image + i, "file_name": name, "width": w, "height": h})
        doc["annotations"].append({"id": next_ann + i, "image_id": next_image + i, "category_id": cid,
                                   "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})
        added.append(f"images/{name}")
    (out / "annotations.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
    return {"relabelled": [f"images/{im['file_name']}" for im in picked[:relabel]],
            "replaced": [f"images/{im['file_name']}" for im in picked[relabel:]], "appended": added}
