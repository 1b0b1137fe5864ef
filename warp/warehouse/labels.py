"""Label loaders: COCO JSON, YOLO txt and per-image JSONL into one record type.

Each loader returns a :class:`LabelSet`: one :class:`LabelRecord` per image
(sample key = image path relative to the dataset root, POSIX), the class
table (ids and names kept as the source has them), the label files read,
and the label-level rejections ``(run, sample_id, source, reason, message)``
for the quarantine. A label *file* that cannot be parsed at all raises
:class:`~warpdata.core.errors.DataError` naming it; a bad *record* only rejects
its sample. Checks done here (no image needed): schema, finite numbers,
degenerate boxes, unknown classes, duplicates, orphans. Checks that need the
image size (bounds, YOLO's normalized boxes) happen after probing
(:mod:`warpdata.warehouse.validate`).

Hostile input (limits from ``[limits]``, :class:`~warpdata.warehouse.config.Limits`):
an image path that is absolute or climbs out with ``..`` is quarantined
``path-outside-root`` here; one that leaves the root through a symlink is
caught when it is opened (:func:`open_confined`, used by the header pass),
so a label file can never pull a file from elsewhere into the warehouse.
Label files must be regular files no larger than ``max_label_mb``; class
ids above ``max_class_id`` are ``unknown-class`` and samples with more than
``max_label_boxes`` boxes ``too-many-boxes``, so no declared number sizes an
allocation. COCO files without a ``categories`` list are refused: their
class ids could not be named.

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
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from warpdata.core.errors import DataError, MissingInputError, Rejected
from warpdata.warehouse.config import Limits

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")



UnsafeFile = Rejected  # the one "rejected with a reason" class (warpdata.core.errors)


def inside(root_real: str, real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip("/") + "/")


def open_confined(path: str | os.PathLike, *, max_bytes: int, root_real: str | None = None) -> tuple[bytes, os.stat_result]:
    """Read a regular file of at most ``max_bytes``, inside ``root_real`` after symlinks.

    The check is made on the opened descriptor (``/proc/self/fd``), so a
    symlink swapped in between check and open cannot redirect it; FIFOs and
    devices are opened non-blocking and refused. Raises :class:`UnsafeFile`
    (``path-outside-root``, ``too-large``, ``unreadable``) or ``OSError``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        if root_real is not None:
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # no procfs: resolve the name (after the open, same answer unless raced)
                real = os.path.realpath(path)
            if not inside(root_real, real):
                raise UnsafeFile("path-outside-root", f"resolves to {real}, outside the dataset root {root_real}")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile("unreadable", "is not a regular file (a device, FIFO or socket is never read)")
        if st.st_size > max_bytes:
            raise UnsafeFile("too-large", f"is {st.st_size} bytes, over the {max_bytes / 1e6:g} MB limit "
                             "(raise it in [limits] of the config)", st.st_size)
        # read(n) allocates n bytes up front: ask for what the stat promised, plus one to see growth
        data = f.read(st.st_size + 1)
        if len(data) > st.st_size:  # grew since the stat (or a size-0 pseudo file): the rest, still bounded
            data += f.read(max_bytes - len(data) + 1)
        if len(data) > max_bytes:
            raise UnsafeFile("too-large", f"is over the {max_bytes / 1e6:g} MB limit "
                             "(raise it in [limits] of the config)", len(data))
    return data, st


def escapes(images_dir: str, name: str) -> bool:
    """Whether a label's file name leaves the dataset root without following any link."""
    if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        return True
    norm = posixpath.normpath(posixpath.join(images_dir or ".", name))
    return norm == ".." or norm.startswith("../") or norm.startswith("/")


@dataclass(slots=True)
class LabelRecord:
    """One image's labels. Kept small (slots, no per-record path object, empty box lists shared):
    a listing of a million images is a million of these."""

    key: str
    root: str  # the dataset root as given; the image is root/key
    run: str
    boxes: list[list[float]]  # xyxy pixels in the oriented frame, or YOLO cxcywh normalized
    classes: list[int]
    source: str  # the label file (for quarantine records)
    normalized: bool = False
    width: int | None = None
    height: int | None = None
    frame_id: int = -1
    run_id: str = ""
    root_real: str | None = None  # the dataset root after symlinks: images must stay inside it
    # per box, where it came from in the label file: the COCO annotation id, YOLO "line N", JSONL
    # "line N box K" (samples.parquet annotation_ids; `warp why`, docs/lineage.md)
    ann_ids: list[str] | None = None

    @property
    def image(self) -> str:
        return os.path.join(self.root, self.key)


@dataclass
class LabelSet:
    records: list[LabelRecord]
    classes: list[dict[str, Any]]  # [{"id": int, "name": str}]
    label_files: list[Path]
    rejects: list[tuple[str, str, str, str, str]] = field(default_factory=list)


_NONE: list = []  # the shared box/class list of a record without boxes; never appended to


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rel_path(root: Path, p: Path) -> str:
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return p.as_posix()


def _read_label_file(path: Path, limits: Limits) -> bytes:
    """A label file named by the config: a regular file within ``max_label_mb``, else a typed error."""
    try:
        return open_confined(path, max_bytes=limits.max_label_bytes)[0]
    except FileNotFoundError:
        raise MissingInputError(f"label file {path} does not exist",
                                hint="check [source] labels in the config") from None
    except UnsafeFile as e:
        raise DataError(f"label file {path} {e.message}", path=str(path),
                        hint="raise [limits] max_label_mb" if e.reason == "too-large"
                        else "point [source] labels at a regular file") from None
    except OSError as e:
        raise DataError(f"label file {path} cannot be read: {e.strerror or e}", path=str(path),
                        hint="check its permissions") from None


def _read_json(path: Path, limits: Limits) -> Any:
    raw = _read_label_file(path, limits)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DataError(f"{path}: not valid JSON: {e}", hint="fix or regenerate the label file",
                        path=str(path)) from None


def _check_box(b: Any, min_size: float) -> tuple[str, str] | None:
    if not isinstance(b, (list, tuple)) or len(b) != 4 or not all(_num(x) for x in b):
        return "bad-schema", f"box {b!r} is not 4 numbers"
    if not all(math.isfinite(x) for x in b):
        return "non-finite", f"box {b!r} has a NaN or infinite coordinate"
    return None


def _class_problem(cid: int | None, shown: str, names: list[str], limits: Limits,
                   where: str) -> tuple[str, str] | None:
    """Why class id ``cid`` (given as ``shown``) rejects its sample: not one of the [source] classes
    (when they are listed), or over ``[limits] max_class_id``."""
    if cid is None or cid < 0 or (names and cid >= len(names)):
        return "unknown-class", f"{where}: class {shown} is not in [source] classes"
    if cid > limits.max_class_id:
        return "unknown-class", (f"{where}: class {cid} is over [limits] max_class_id = {limits.max_class_id} "
                                 "(list the classes in [source] classes, or raise the limit)")
    return None


def load_coco(root: Path, label_files: list[Path], images_dir: str, min_box: float,
              limits: Limits = Limits()) -> LabelSet:
    root_real = os.path.realpath(root)
    records: list[LabelRecord] = []
    rejects: list[tuple[str, str, str, str, str]] = []
    classes: dict[int, str] = {}
    seen_keys: set[str] = set()
    for lf in label_files:
        doc = _read_json(lf, limits)
        src = rel_path(root, lf)
        _coco_check(lf, doc)
        run = lf.stem
        _coco_categories(lf, doc, classes, limits)
        by_id, bad_ids = _coco_images(doc, str(root), root_real, run, src, images_dir, seen_keys, rejects)
        rejected = _coco_annotations(doc, by_id, bad_ids, classes, run, src, min_box, limits, rejects)
        records.extend(r for iid, r in by_id.items() if iid not in rejected)
    return LabelSet(records, [{"id": k, "name": v} for k, v in sorted(classes.items())], list(label_files), rejects)


def _coco_check(lf: Path, doc: Any) -> None:
    """The shape of a COCO annotation file: an error naming the file when it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise DataError(f"{lf}: not a COCO annotation file (no 'images' list)",
                        hint="[source] format = \"coco\" expects COCO JSON", path=str(lf))
    if not isinstance(doc.get("categories", []), list):
        raise DataError(f"{lf}: 'categories' is not a list", hint="fix the COCO file", path=str(lf))
    if doc.get("annotations") and not doc.get("categories"):
        raise DataError(f"{lf}: has annotations but no 'categories' list, so their category ids name no class",
                        hint="add \"categories\": [{\"id\": 1, \"name\": \"...\"}, ...] to the COCO file",
                        path=str(lf))
    if not isinstance(doc.get("annotations", []), list):
        raise DataError(f"{lf}: 'annotations' is not a list", hint="fix the COCO file", path=str(lf))


def _coco_categories(lf: Path, doc: dict[str, Any], classes: dict[int, str], limits: Limits) -> None:
    """Add the file's categories to ``classes`` (id -> name), one name per id across files."""
    for c in doc.get("categories", []):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or isinstance(c.get("id"), bool) \
                or not isinstance(c.get("name"), str):
            raise DataError(f"{lf}: category {c!r:.200} needs an integer 'id' and a string 'name'",
                            hint="fix the categories list", path=str(lf))
        if not 0 <= c["id"] <= limits.max_class_id:
            raise DataError(f"{lf}: category id {c['id']} is outside 0..{limits.max_class_id} "
                            "([limits] max_class_id)", path=str(lf),
                            hint="renumber the categories, or raise [limits] max_class_id in the config")
        if classes.get(c["id"], c["name"]) != c["name"]:
            raise DataError(f"{lf}: category id {c['id']} is named both {classes[c['id']]!r} and {c['name']!r}",
                            hint="use one name per category id across label files", path=str(lf))
        classes[c["id"]] = c["name"]


def _coco_images(doc: dict[str, Any], root_s: str, root_real: str, run: str, src: str, images_dir: str,
                 seen_keys: set[str], rejects: list[tuple[str, str, str, str, str]],
                 ) -> tuple[dict[int, LabelRecord], set[int]]:
    """A record per valid ``images`` entry by image id, and the ids of entries rejected (their
    annotations are then not orphans); the list is freed as it is read."""
    by_id: dict[int, LabelRecord] = {}
    bad_ids: set[int] = set()
    images = doc.pop("images")
    for i in range(len(images)):
        im, images[i] = images[i], None  # each parsed entry is freed as its record is made
        if not isinstance(im, dict) or not isinstance(im.get("id"), int) or not isinstance(im.get("file_name"), str) \
                or not im["file_name"] or "\x00" in im["file_name"]:
            sid = im.get("file_name") if isinstance(im, dict) and isinstance(im.get("file_name"), str) else f"{src}#images[{i}]"
            rejects.append((run, sid.replace("\x00", "\\0"), src, "bad-schema",
                            f"images[{i}] needs an integer 'id' and a 'file_name'"))
            continue
        if escapes(images_dir, im["file_name"]):
            rejects.append((run, im["file_name"], src, "path-outside-root",
                            f"images[{i}] file_name {im['file_name']!r} leaves the dataset root"))
            bad_ids.add(im["id"])
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
        rec = LabelRecord(key=key, root=root_s, run=run, boxes=_NONE, classes=_NONE, source=src,
                          width=w, height=h, root_real=root_real)
        by_id[im["id"]] = rec
    return by_id, bad_ids


def _coco_annotations(doc: dict[str, Any], by_id: dict[int, LabelRecord], bad_ids: set[int],
                      classes: dict[int, str], run: str, src: str, min_box: float, limits: Limits,
                      rejects: list[tuple[str, str, str, str, str]]) -> set[int]:
    """Attach each annotation's box to its image's record; returns the ids of images rejected for a
    bad annotation."""
    rejected: set[int] = set()
    for j, ann in enumerate(doc.get("annotations") or []):
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
        elif not isinstance(cat, int) or cat not in classes:
            problem = ("unknown-class", f"annotation {ann.get('id', j)}: category_id {cat!r} is not in categories")
        else:
            x, y, bw, bh = (float(v) for v in bbox)
            if bw <= min_box or bh <= min_box:
                problem = ("box-degenerate", f"annotation {ann.get('id', j)}: bbox {bbox} has width/height <= {min_box}")
            elif len(rec.boxes) >= limits.max_label_boxes:
                problem = ("too-many-boxes", f"more than {limits.max_label_boxes} boxes "
                           "([limits] max_label_boxes; raise it in the config)")
        if problem:
            rejects.append((run, rec.key, src, problem[0], problem[1]))
            rejected.add(ann["image_id"])
            rec.boxes, rec.classes = _NONE, _NONE  # free them now: the sample is out
            continue
        if rec.boxes is _NONE:
            rec.boxes, rec.classes, rec.ann_ids = [], [], []
        rec.boxes.append([x, y, x + bw, y + bh])
        rec.classes.append(cat)
        rec.ann_ids.append(str(ann.get("id", f"annotations[{j}]")))
    return rejected


def load_yolo(root: Path, labels_dir: Path, images_dir: str, class_names: list[str], min_box: float,
              limits: Limits = Limits()) -> LabelSet:
    root_real = os.path.realpath(root)
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
        rec = LabelRecord(key=key, root=str(root), run=run, boxes=[], classes=[], source=src, normalized=True,
                          root_real=root_real, ann_ids=[])
        problem = None
        if os.path.lexists(lp) and not lp.is_dir():
            try:
                text = open_confined(lp, max_bytes=limits.max_label_bytes, root_real=root_real)[0].decode("utf-8")
            except UnsafeFile as e:
                rejects.append((run, key, src, e.reason, f"{src} {e.message}"))
                continue
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
                problem = _class_problem(cls, str(cls), class_names, limits, f"{src}:{ln}")
                if problem:
                    break
                if len(rec.boxes) >= limits.max_label_boxes:
                    problem = ("too-many-boxes", f"{src}: more than {limits.max_label_boxes} boxes "
                               "([limits] max_label_boxes; raise it in the config)")
                    break
                if vals[2] <= 0 or vals[3] <= 0:
                    problem = ("box-degenerate", f"{src}:{ln}: width/height {vals[2]}x{vals[3]} <= 0")
                    break
                rec.boxes.append(vals)
                rec.classes.append(cls)
                rec.ann_ids.append(f"line {ln}")
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
               min_box: float, limits: Limits = Limits()) -> LabelSet:
    root_real = os.path.realpath(root)
    raw: list[tuple[str, int, dict]] = []
    for lf in label_files:
        try:
            text = _read_label_file(lf, limits).decode("utf-8")
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
            except (json.JSONDecodeError, RecursionError):
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
        except (json.JSONDecodeError, RecursionError) as e:
            rejects.append((stem_run, f"{src}:{ln}", src, "bad-schema", f"{src}:{ln}: not JSON: {e}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("image"), str) or not obj["image"] \
                or "\x00" in obj["image"]:
            rejects.append((stem_run, f"{src}:{ln}", src, "bad-schema", f"{src}:{ln}: needs a string 'image'"))
            continue
        if escapes(images_dir, obj["image"]):
            rejects.append((stem_run, obj["image"], src, "path-outside-root",
                            f"{src}:{ln}: image {obj['image']!r} leaves the dataset root"))
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
        elif len(boxes) > limits.max_label_boxes:
            problem = ("too-many-boxes", f"{src}:{ln}: {len(boxes)} boxes, over [limits] max_label_boxes = "
                       f"{limits.max_label_boxes} (raise it in the config)")
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
                problem = _class_problem(cid, f"{c!r:.60}", names, limits, f"{src}:{ln}")
                if problem:
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
        records.append(LabelRecord(key=key, root=str(root), run=run, root_real=root_real,
                                   boxes=[[float(v) for v in b] for b in boxes], classes=ids, source=src,
                                   width=w, height=h, frame_id=frame_id, run_id=run_id,
                                   ann_ids=[f"line {ln} box {k}" for k in range(len(boxes))]))
    if not names and used:
        names = [str(i) for i in range(max(used) + 1)]
    return LabelSet(records, [{"id": i, "name": n} for i, n in enumerate(names)], list(label_files), rejects)


def load(fmt: str, root: Path, labels: tuple[str, ...], images_dir: str, class_names: tuple[str, ...],
         min_box: float, limits: Limits = Limits()) -> LabelSet:
    if not root.is_dir():
        raise MissingInputError(f"dataset root {root} does not exist or is not a directory",
                                hint="check [source] path (relative to the config file) or --input")
    files = [root / lf for lf in labels]
    if fmt == "coco":
        ls = load_coco(root, files, images_dir, min_box, limits)
    elif fmt == "yolo":
        ls = load_yolo(root, files[0], images_dir, list(class_names), min_box, limits)
    else:
        ls = load_jsonl(root, files, images_dir, list(class_names), min_box, limits)
    if images_dir and ls.records and not (root / images_dir).is_dir():
        # every sample would be "missing": say what is missing instead
        raise MissingInputError(f"image folder {root / images_dir} does not exist "
                                f"({len(ls.records)} labelled images are listed under it)",
                                hint="check [source] images (relative to [source] path)", path=str(root / images_dir))
    return ls
