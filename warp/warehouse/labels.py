"""Label loaders: COCO JSON, YOLO txt and per-image JSONL into one record type.

Each loader returns a :class:`LabelSet`: one :class:`LabelRecord` per image
(sample key = image path relative to the dataset root, POSIX), the class
table (ids and names kept as the source has them), the label files read,
and the label-level rejections ``(run, sample_id, source, reason, message)``
for the quarantine. A label *file* that cannot be parsed at all raises
:class:`~warpdata.errors.DataError` naming it; a bad *record* only rejects
its sample. Checks done here (no image needed): schema, finite numbers,
degenerate boxes, unknown classes, duplicates, orphans. Checks that need the
image size (bounds, YOLO's normalized boxes) happen after probing
(:mod:`warpdata.warehouse.validate`).

Formats:

* COCO: ``{"images": [{id, file_name, width?, height?}], "annotations":
  [{image_id, category_id, bbox: [x, y, w, h]}], "categories": [{id, name}]}``;
  images are looked up under ``[source] images``; run = label file stem.
* YOLO: images under ``images/``, one ``labels/<same path>.txt`` per image
  with lines ``class cx cy w h`` normalized to [0, 1]; an image without a
  label file is an empty sample, a label file without an image an orphan;
  run = the image's sub-directory (e.g. ``train``) or ``default``.
* JSONL: one object per line ``{"image", "boxes": [[x1, y1, x2, y2]...],
  "classes": [id or name...], "frame_id"?, "run_id"?, "width"?, "height"?}``;
  run = ``run_id`` or the file stem.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from warpdata.errors import DataError, MissingInputError

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


@dataclass
class LabelRecord:
    key: str
    image: Path
    run: str
    boxes: list[list[float]]  # xyxy pixels in the oriented frame, or YOLO cxcywh normalized
    classes: list[int]
    source: str  # the label file (for quarantine records)
    normalized: bool = False
    width: int | None = None
    height: int | None = None
    frame_id: int = -1
    run_id: str = ""


@dataclass
class LabelSet:
    records: list[LabelRecord]
    classes: list[dict[str, Any]]  # [{"id": int, "name": str}]
    label_files: list[Path]
    rejects: list[tuple[str, str, str, str, str]] = field(default_factory=list)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rel_path(root: Path, p: Path) -> str:
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return p.as_posix()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise MissingInputError(f"label file {path} does not exist",
                                hint="check [source] labels in the config") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not valid JSON: {e}", hint="fix or regenerate the label file",
                        path=str(path)) from None


def _check_box(b: Any, min_size: float) -> tuple[str, str] | None:
    if not isinstance(b, (list, tuple)) or len(b) != 4 or not all(_num(x) for x in b):
        return "bad-schema", f"box {b!r} is not 4 numbers"
    if not all(math.isfinite(x) for x in b):
        return "non-finite", f"box {b!r} has a NaN or infinite coordinate"
    return None


def load_coco(root: Path, label_files: list[Path], images_dir: str, min_box: float) -> LabelSet:
    records: list[LabelRecord] = []
    rejects: list[tuple[str, str, str, str, str]] = []
    classes: dict[int, str] = {}
    seen_keys: set[str] = set()
    for lf in label_files:
        doc = _read_json(lf)
        src = rel_path(root, lf)
        if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
            raise DataError(f"{lf}: not a COCO annotation file (no 'images' list)",
                            hint="[source] format = \"coco\" expects COCO JSON", path=str(lf))
        run = lf.stem
        for c in doc.get("categories", []):
            if not isinstance(c, dict) or not isinstance(c.get("id"), int) or not isinstance(c.get("name"), str):
                raise DataError(f"{lf}: category {c!r} needs an integer 'id' and a string 'name'",
                                hint="fix the categories list", path=str(lf))
            if classes.get(c["id"], c["name"]) != c["name"]:
                raise DataError(f"{lf}: category id {c['id']} is named both {classes[c['id']]!r} and {c['name']!r}",
                                hint="use one name per category id across label files", path=str(lf))
            classes[c["id"]] = c["name"]
        by_id: dict[int, LabelRecord] = {}
        bad_ids: set[int] = set()
        for i, im in enumerate(doc["images"]):
            if not isinstance(im, dict) or not isinstance(im.get("id"), int) or not isinstance(im.get("file_name"), str) \
                    or not im["file_name"]:
                sid = im.get("file_name") if isinstance(im, dict) and isinstance(im.get("file_name"), str) else f"{src}#images[{i}]"
                rejects.append((run, sid, src, "bad-schema", f"images[{i}] needs an integer 'id' and a 'file_name'"))
                continue
            key = str(PurePosixPath(images_dir) / im["file_name"]) if images_dir else im["file_name"]
            w, h = im.get("width"), im.get("height")
            if (w is not None and not (isinstance(w, int) and w > 0)) or (h is not None and not (isinstance(h, int) and h > 0)):
                rejects.append((run, key, src, "bad-schema", f"images[{i}] width/height {w!r}x{h!r} are not positive integers"))
                bad_ids.add(im["id"])
                continue
            if im["id"] in by_id or key in seen_keys:
                rejects.append((run, f"{key}#dup{i}", src, "duplicate",
                                f"images[{i}] repeats image id {im['id']} / file {im['file_name']}"))
                continue
            seen_keys.add(key)
            rec = LabelRecord(key=key, image=root / key, run=run, boxes=[], classes=[], source=src, width=w, height=h)
            by_id[im["id"]] = rec
        rejected: set[int] = set()
        for j, ann in enumerate(doc.get("annotations", [])):
            if not isinstance(ann, dict) or not isinstance(ann.get("image_id"), int):
                rejects.append((run, f"{src}#annotations[{j}]", src, "bad-schema",
                                f"annotations[{j}] has no integer image_id"))
                continue
            rec = by_id.get(ann["image_id"])
            if rec is None:
                if ann["image_id"] in bad_ids:
                    continue
                rejects.append((run, f"{src}#annotation:{ann.get('id', j)}", src, "orphan-label",
                                f"annotation {ann.get('id', j)} refers to image_id {ann['image_id']}, which is not in 'images'"))
                continue
            if ann["image_id"] in rejected:
                continue
            problem = None
            bbox = ann.get("bbox")
            cat = ann.get("category_id")
            p = _check_box(bbox, min_box)
            if p:
                problem = p
            elif not isinstance(cat, int) or (classes and cat not in classes):
                problem = ("unknown-class", f"annotation {ann.get('id', j)}: category_id {cat!r} is not in categories")
            else:
                x, y, bw, bh = (float(v) for v in bbox)
                if bw <= min_box or bh <= min_box:
                    problem = ("box-degenerate", f"annotation {ann.get('id', j)}: bbox {bbox} has width/height <= {min_box}")
            if problem:
                rejects.append((run, rec.key, src, problem[0], problem[1]))
                rejected.add(ann["image_id"])
                continue
            rec.boxes.append([x, y, x + bw, y + bh])
            rec.classes.append(cat)
        records.extend(r for iid, r in by_id.items() if iid not in rejected)
    return LabelSet(records, [{"id": k, "name": v} for k, v in sorted(classes.items())], list(label_files), rejects)


def load_yolo(root: Path, labels_dir: Path, images_dir: str, class_names: list[str], min_box: float) -> LabelSet:
    img_root = root / images_dir
    if not img_root.is_dir():
        raise MissingInputError(f"image directory {img_root} does not exist", hint="check [source] images")
    if not labels_dir.is_dir():
        raise MissingInputError(f"label directory {labels_dir} does not exist", hint="check [source] labels")
    images = sorted(p for p in img_root.rglob("*") if p.suffix.lower() in IMAGE_EXTS and p.is_file())
    label_paths = sorted(labels_dir.rglob("*.txt"))
    by_stem = {p.relative_to(img_root).with_suffix("").as_posix(): p for p in images}
    records: list[LabelRecord] = []
    rejects: list[tuple[str, str, str, str, str]] = []
    used_ids: set[int] = set()
    for lp in label_paths:
        stem = lp.relative_to(labels_dir).with_suffix("").as_posix()
        if stem not in by_stem:
            rejects.append((_yolo_run(stem), rel_path(root, lp), rel_path(root, lp), "orphan-label",
                            f"{rel_path(root, lp)} has no image {images_dir}/{stem}.*"))
    seen: set[str] = set()
    for img in images:
        rel_img = img.relative_to(img_root)
        stem = rel_img.with_suffix("").as_posix()
        key = rel_path(root, img)
        run = _yolo_run(stem)
        if stem in seen:
            rejects.append((run, key, key, "duplicate", f"{key}: another image has the same name stem {stem}"))
            continue
        seen.add(stem)
        lp = labels_dir / (stem + ".txt")
        src = rel_path(root, lp)
        rec = LabelRecord(key=key, image=img, run=run, boxes=[], classes=[], source=src, normalized=True)
        problem = None
        if lp.is_file():
            try:
                text = lp.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                rejects.append((run, key, src, "bad-schema", f"{src}: unreadable: {e}"))
                continue
            for ln, line in enumerate(text.splitlines(), 1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) != 5:
                    problem = ("bad-schema", f"{src}:{ln}: expected 'class cx cy w h', got {line.strip()!r}")
                    break
                try:
                    cls = int(parts[0])
                    vals = [float(v) for v in parts[1:]]
                except ValueError:
                    problem = ("bad-schema", f"{src}:{ln}: not numbers: {line.strip()!r}")
                    break
                if not all(math.isfinite(v) for v in vals):
                    problem = ("non-finite", f"{src}:{ln}: NaN or infinite value")
                    break
                if cls < 0 or (class_names and cls >= len(class_names)):
                    problem = ("unknown-class", f"{src}:{ln}: class {cls} is not in [source] classes")
                    break
                if vals[2] <= 0 or vals[3] <= 0:
                    problem = ("box-degenerate", f"{src}:{ln}: width/height {vals[2]}x{vals[3]} <= 0")
                    break
                rec.boxes.append(vals)
                rec.classes.append(cls)
                used_ids.add(cls)
        if problem:
            rejects.append((run, key, src, problem[0], problem[1]))
            continue
        records.append(rec)
    if class_names:
        names = list(class_names)
    else:
        names = [str(i) for i in range(max(used_ids) + 1)] if used_ids else []
    return LabelSet(records, [{"id": i, "name": n} for i, n in enumerate(names)], label_paths, rejects)


def _yolo_run(stem: str) -> str:
    parts = PurePosixPath(stem).parts
    return parts[0] if len(parts) > 1 else "default"


def load_jsonl(root: Path, label_files: list[Path], images_dir: str, class_names: list[str],
               min_box: float) -> LabelSet:
    raw: list[tuple[str, int, dict]] = []
    for lf in label_files:
        try:
            text = lf.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise MissingInputError(f"label file {lf} does not exist", hint="check [source] labels") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{lf}: not UTF-8 text: {e}", hint="JSONL labels must be UTF-8", path=str(lf)) from None
        src = rel_path(root, lf)
        for ln, line in enumerate(text.splitlines(), 1):
            if line.strip():
                raw.append((src, ln, line))
    names = list(class_names)
    if not names:
        # class names used as strings without a list: sorted, so ids are stable
        found: set[str] = set()
        for _src, _ln, line in raw:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("classes"), list):
                found.update(c for c in obj["classes"] if isinstance(c, str))
        names = sorted(found)
    name_to_id = {n: i for i, n in enumerate(names)}
    records: list[LabelRecord] = []
    rejects: list[tuple[str, str, str, str, str]] = []
    seen: set[str] = set()
    used: set[int] = set()
    for src, ln, line in raw:
        stem_run = PurePosixPath(src).stem
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            rejects.append((stem_run, f"{src}:{ln}", src, "bad-schema", f"{src}:{ln}: not JSON: {e}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("image"), str) or not obj["image"]:
            rejects.append((stem_run, f"{src}:{ln}", src, "bad-schema", f"{src}:{ln}: needs a string 'image'"))
            continue
        run_id = obj.get("run_id", "")
        frame_id = obj.get("frame_id", -1)
        key = str(PurePosixPath(images_dir) / obj["image"]) if images_dir else obj["image"]
        run = run_id if isinstance(run_id, str) and run_id else stem_run
        boxes, classes = obj.get("boxes", []), obj.get("classes", obj.get("labels", []))
        problem = None
        if not isinstance(run_id, str) or not isinstance(frame_id, int) or isinstance(frame_id, bool):
            problem = ("bad-schema", f"{src}:{ln}: run_id must be a string and frame_id an integer")
        elif not isinstance(boxes, list) or not isinstance(classes, list) or len(boxes) != len(classes):
            problem = ("bad-schema", f"{src}:{ln}: 'boxes' and 'classes' must be lists of equal length")
        elif key in seen:
            problem = ("duplicate", f"{src}:{ln}: image {key} is listed again")
        else:
            for b in boxes:
                problem = _check_box(b, min_box)
                if problem:
                    problem = (problem[0], f"{src}:{ln}: {problem[1]}")
                    break
                if b[2] - b[0] <= min_box or b[3] - b[1] <= min_box:
                    problem = ("box-degenerate", f"{src}:{ln}: box {b} has width/height <= {min_box}")
                    break
        ids: list[int] = []
        if problem is None:
            for c in classes:
                cid = name_to_id.get(c) if isinstance(c, str) else (c if isinstance(c, int) and not isinstance(c, bool) else None)
                if cid is None or cid < 0 or (names and cid >= len(names)):
                    problem = ("unknown-class", f"{src}:{ln}: class {c!r} is not in [source] classes")
                    break
                ids.append(cid)
        w, h = obj.get("width"), obj.get("height")
        if problem is None and ((w is not None and not (isinstance(w, int) and w > 0)) or
                                (h is not None and not (isinstance(h, int) and h > 0))):
            problem = ("bad-schema", f"{src}:{ln}: width/height must be positive integers")
        if problem:
            sid = f"{key}#dup{ln}" if problem[0] == "duplicate" else key
            rejects.append((run, sid, src, problem[0], problem[1]))
            continue
        seen.add(key)
        used.update(ids)
        records.append(LabelRecord(key=key, image=root / key, run=run,
                                   boxes=[[float(v) for v in b] for b in boxes], classes=ids, source=src,
                                   width=w, height=h, frame_id=frame_id, run_id=run_id))
    if not names and used:
        names = [str(i) for i in range(max(used) + 1)]
    return LabelSet(records, [{"id": i, "name": n} for i, n in enumerate(names)], list(label_files), rejects)


def load(fmt: str, root: Path, labels: tuple[str, ...], images_dir: str, class_names: tuple[str, ...],
         min_box: float) -> LabelSet:
    if not root.is_dir():
        raise MissingInputError(f"dataset root {root} does not exist or is not a directory",
                                hint="check [source] path (relative to the config file) or --input")
    files = [root / lf for lf in labels]
    if fmt == "coco":
        return load_coco(root, files, images_dir, min_box)
    if fmt == "yolo":
        return load_yolo(root, files[0], images_dir, list(class_names), min_box)
    return load_jsonl(root, files, images_dir, list(class_names), min_box)
