"""The header pass: read, hash and probe every image, check boxes against it.

For each :class:`~warpdata.warehouse.labels.LabelRecord` this reads the
image bytes once (SHA-256 for the version key), probes the header (size,
EXIF orientation, JPEG end marker) and checks the boxes in the *oriented*
frame: YOLO boxes are converted from normalized cxcywh to pixels; a box
outside the image by more than ``box_tolerance`` pixels is
``box-out-of-bounds``, one within it is clipped; a box that is then narrower
or lower than ``min_box_size`` is ``box-degenerate``; label sizes that differ
from the oriented image are ``bad-size``; more than ``max_boxes`` boxes is
``too-many-boxes`` with ``overflow = "reject"`` (else the first ``max_boxes``
are kept and counted). Missing files are ``missing-file``, unreadable ones
(and anything but a regular file) ``unreadable``; a file that leaves the
dataset root through a symlink is ``path-outside-root`` and one over
``[limits] max_image_mb`` is ``too-large``, both refused before a byte is
read and never listed among the sources; a header declaring more than
``[limits] max_pixels`` pixels is ``too-many-pixels`` and one declaring more
than its bytes hold ``impossible-header``, before any decode. Files are read by a thread pool (reads and hashing release
the GIL); results keep the label order.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from warpdata.etl.quarantine import register_reason
from warpdata.formats.imageinfo import DEFAULT_MAX_PIXELS, IMAGE_LIMIT_REASONS
from warpdata.warehouse.config import Limits
from warpdata.warehouse.images import ImageProbe, ProbeError, probe
from warpdata.warehouse.labels import LabelRecord, UnsafeFile, open_confined

for _reason in IMAGE_LIMIT_REASONS:
    register_reason(*_reason)


@dataclass
class ValidSample:
    key: str
    image: str  # absolute path
    run: str
    source: str
    boxes: np.ndarray  # (N, 4) float64 xyxy, oriented source pixels, clipped
    classes: np.ndarray  # (N,) int32
    frame_id: int
    run_id: str
    probe: ImageProbe
    sha256: str
    nbytes: int
    stat_key: tuple[int, int, int] = (0, 0, 0)  # (size, mtime_ns, inode) when hashed
    # a source on object storage (docs/formats/receipts.md, "Sources on object storage"): the
    # object's URL and the spooled copy of the bytes the header pass read, which the build reads
    url: str | None = None
    local: str | None = None
    ann_ids: list[str] | None = None  # per stored box: its annotation in the label file (labels.LabelRecord)

    @property
    def empty(self) -> bool:
        return len(self.boxes) == 0


# A list of samples as columns, for the trip to a worker (warp/warehouse/shards.py, ShardTask):
# one list per field and each sample's boxes and classes cut from two joined arrays. Pickled one
# by one, a shard of 64 samples is 128 small arrays and 64 objects; a Dask client hands every
# array to its own out-of-band buffer and the scheduler's loop takes them apart again, which
# cost the driver about 0.7 CPU-s per 10,000 samples (BENCHMARKS.md, "ETL scaling: where Dask's time goes").
_COLUMNS = tuple(f.name for f in fields(ValidSample) if f.name not in ("boxes", "classes", "probe"))
_PROBE = tuple(f.name for f in fields(ImageProbe))


def pack_samples(samples: list[ValidSample]) -> tuple[Any, ...] | None:
    """``samples`` as columns (:func:`unpack_samples` gives them back equal), or None when their
    boxes or classes do not share one dtype and shape (then they travel one by one)."""
    if not samples:
        return None
    b0, c0 = samples[0].boxes, samples[0].classes
    for s in samples:
        b, c = s.boxes, s.classes
        if not (isinstance(b, np.ndarray) and isinstance(c, np.ndarray) and b.dtype == b0.dtype
                and c.dtype == c0.dtype and b.ndim == 2 and b.shape[1:] == b0.shape[1:] and c.ndim == 1
                and type(s) is ValidSample and type(s.probe) is ImageProbe):
            return None
    counts = [len(s.boxes) for s in samples]
    ccounts = [len(s.classes) for s in samples]
    return (_COLUMNS, [[getattr(s, n) for s in samples] for n in _COLUMNS],
            [tuple(getattr(s.probe, n) for n in _PROBE) for s in samples],
            np.concatenate([s.boxes for s in samples]), counts,
            np.concatenate([s.classes for s in samples]), ccounts)


def unpack_samples(packed: tuple[Any, ...]) -> list[ValidSample]:
    """The samples :func:`pack_samples` took apart; each one's arrays are views of the joined ones."""
    names, columns, probes, boxes, counts, classes, ccounts = packed
    out = []
    ob = oc = 0
    for i, (nb, nc) in enumerate(zip(counts, ccounts, strict=True)):
        kw = {n: col[i] for n, col in zip(names, columns, strict=True)}
        out.append(ValidSample(boxes=boxes[ob:ob + nb], classes=classes[oc:oc + nc],
                               probe=ImageProbe(*probes[i]), **kw))
        ob += nb
        oc += nc
    return out


@dataclass(slots=True)
class ProbeOutcome:
    sample: ValidSample | None
    reject: tuple[str, str, str, str, str] | None  # (run, sample_id, source, reason, message)
    source_hash: tuple[str, str, int] | None  # (key, sha256 or "missing", size)
    truncated_boxes: int = 0


def _check(rec: LabelRecord, *, tolerance: float, min_box: float, max_boxes: int, overflow: str,
           limits: Limits = Limits()) -> ProbeOutcome:
    key = rec.key
    try:
        data, st = open_confined(rec.image, max_bytes=limits.max_image_bytes, root_real=rec.root_real)
    except UnsafeFile as e:
        return ProbeOutcome(None, (rec.run, key, rec.source, e.reason, f"{key}: {e.message}"), None)
    except FileNotFoundError:
        return ProbeOutcome(None, (rec.run, key, rec.source, "missing-file", f"{key}: image file does not exist"),
                            (key, "missing", 0))
    except OSError as e:
        return ProbeOutcome(None, (rec.run, key, rec.source, "unreadable", f"{key}: cannot read: {e}"),
                            (key, "unreadable", 0))
    return check_bytes(rec, data, (st.st_size, st.st_mtime_ns, st.st_ino), tolerance=tolerance, min_box=min_box,
                       max_boxes=max_boxes, overflow=overflow, max_pixels=limits.max_pixels)


def check_bytes(rec: LabelRecord, data: bytes, stat_key: tuple[int, int, int], *, tolerance: float, min_box: float,
                max_boxes: int, overflow: str, url: str | None = None, local: str | None = None,
                max_pixels: int = DEFAULT_MAX_PIXELS) -> ProbeOutcome:
    """Hash, probe and check the boxes of one image whose bytes were read already."""
    digest = hashlib.sha256(data).hexdigest()
    try:
        pr: ImageProbe | ProbeError = probe(data, max_pixels)
    except ProbeError as e:
        pr = e
    return check_probed(rec, digest, len(data), pr, stat_key, tolerance=tolerance, min_box=min_box,
                        max_boxes=max_boxes, overflow=overflow, url=url, local=local)


def check_probed(rec: LabelRecord, digest: str, nbytes: int, pr: ImageProbe | ProbeError,
                 stat_key: tuple[int, int, int], *, tolerance: float, min_box: float, max_boxes: int,
                 overflow: str, url: str | None = None, local: str | None = None) -> ProbeOutcome:
    """Check the boxes of one image against what its bytes gave: their SHA-256, size and header
    probe (or the probe's error). The bytes themselves are not needed: an unchanged object's
    recorded facts give the same outcome (docs/formats/receipts.md, "Sources on object storage")."""
    key = rec.key
    src_hash = (key, digest, nbytes)

    def bad(reason: str, msg: str) -> ProbeOutcome:
        return ProbeOutcome(None, (rec.run, key, rec.source, reason, f"{key}: {msg}"), src_hash)

    if isinstance(pr, ProbeError):
        return bad(pr.reason, pr.message)
    W, H = pr.oriented_size
    if (rec.width is not None and rec.width != W) or (rec.height is not None and rec.height != H):
        return bad("bad-size", f"labels say {rec.width}x{rec.height} but the image is {W}x{H}"
                   + (f" after EXIF orientation {pr.orientation}" if pr.orientation != 1 else ""))
    boxes = np.asarray(rec.boxes, np.float64).reshape(-1, 4)
    if rec.normalized and len(boxes):
        if (boxes < -tolerance / max(W, H)).any() or (boxes[:, :2] > 1 + tolerance / max(W, H)).any():
            return bad("box-out-of-bounds", "YOLO box values are outside [0, 1]")
        cx, cy, bw, bh = boxes[:, 0] * W, boxes[:, 1] * H, boxes[:, 2] * W, boxes[:, 3] * H
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
    if len(boxes):
        if (boxes[:, 0] < -tolerance).any() or (boxes[:, 1] < -tolerance).any() or \
                (boxes[:, 2] > W + tolerance).any() or (boxes[:, 3] > H + tolerance).any():
            i = int(np.flatnonzero((boxes[:, 0] < -tolerance) | (boxes[:, 1] < -tolerance) |
                                   (boxes[:, 2] > W + tolerance) | (boxes[:, 3] > H + tolerance))[0])
            return bad("box-out-of-bounds", f"box {i} {boxes[i].round(2).tolist()} lies outside the "
                       f"{W}x{H} image by more than {tolerance} px")
        np.clip(boxes[:, 0::2], 0, W, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, H, out=boxes[:, 1::2])
        small = (boxes[:, 2] - boxes[:, 0] <= min_box) | (boxes[:, 3] - boxes[:, 1] <= min_box)
        if small.any():
            i = int(np.flatnonzero(small)[0])
            return bad("box-degenerate", f"box {i} {boxes[i].round(2).tolist()} has no area after clipping")
    classes = np.asarray(rec.classes, np.int32)
    truncated = 0
    if len(boxes) > max_boxes:
        if overflow == "reject":
            return bad("too-many-boxes", f"{len(boxes)} boxes > max_boxes = {max_boxes}")
        truncated = len(boxes) - max_boxes
        boxes, classes = boxes[:max_boxes], classes[:max_boxes]
    return ProbeOutcome(ValidSample(key, str(rec.image), rec.run, rec.source, boxes, classes, rec.frame_id,
                                    rec.run_id, pr, digest, nbytes, stat_key, url, local,
                                    rec.ann_ids[:len(boxes)] if rec.ann_ids is not None else None),
                        None, src_hash, truncated)


PROBE_BATCH = 64


@dataclass
class LocalProbeBatch:
    """Records of a source on a shared filesystem to probe on one worker: a pure, picklable task
    (an external cluster's workers read and hash the images, not the driver)."""

    index: int
    records: list[LabelRecord]
    params: dict
    limits: Limits


def probe_local_batch(batch: LocalProbeBatch) -> tuple[int, list[ProbeOutcome]]:
    return batch.index, [_check(r, limits=batch.limits, **batch.params) for r in batch.records]


def probe_all(records: Iterable[LabelRecord], *, tolerance: float, min_box: float, max_boxes: int,
              overflow: str, workers: int, limits: Limits = Limits()) -> list[ProbeOutcome]:
    records = list(records)

    def one(rec: LabelRecord) -> ProbeOutcome:
        return _check(rec, tolerance=tolerance, min_box=min_box, max_boxes=max_boxes, overflow=overflow,
                      limits=limits)

    if workers <= 1 or len(records) < 16:
        return [one(r) for r in records]

    def many(rs: list[LabelRecord]) -> list[ProbeOutcome]:
        return [one(r) for r in rs]

    # runs of 64 records per task, not one: a future per record cost ~25 % of this phase in
    # executor overhead and GIL hand-offs (1,000 photos, 2 threads: 0.117 -> 0.088 ms each)
    out: list[ProbeOutcome] = []
    with ThreadPoolExecutor(max_workers=workers) as ex:
        for part in ex.map(many, [records[i:i + PROBE_BATCH] for i in range(0, len(records), PROBE_BATCH)]):
            out.extend(part)
    return out


class ProbeStream:
    """The header pass as a stream: outcomes in label order while later images are still being
    read, on ``workers`` threads, at most ``ahead`` batches of ``batch`` records read before the
    consumer asks for them (the pass keeps ahead of the build without running away from it;
    warp/warehouse/overlap.py). ``read`` counts the records probed so far."""

    def __init__(self, records: list[LabelRecord], *, tolerance: float, min_box: float, max_boxes: int,
                 overflow: str, workers: int, limits: Limits = Limits(), batch: int = PROBE_BATCH,
                 ahead: int = 0) -> None:
        self.records = records
        self.params = dict(tolerance=tolerance, min_box=min_box, max_boxes=max_boxes, overflow=overflow,
                           limits=limits)
        self.batch = max(1, batch)
        self.ahead = max(1, ahead or 2 * workers)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="warp-header")
        self.read = 0
        self._lock = threading.Lock()
        self._queue: list[Any] = []
        self._next = 0
        self._fill()

    def _many(self, rs: list[LabelRecord]) -> list[ProbeOutcome]:
        out = [_check(r, **self.params) for r in rs]
        with self._lock:
            self.read += len(rs)
        return out

    def _fill(self) -> None:
        while len(self._queue) < self.ahead and self._next < len(self.records):
            part = self.records[self._next:self._next + self.batch]
            self._next += len(part)
            self._queue.append(self.pool.submit(self._many, part))

    def __iter__(self) -> Any:
        try:
            while self._queue:
                fut = self._queue.pop(0)
                self._fill()
                yield from fut.result()
        finally:
            self.close()

    def close(self) -> None:
        for f in self._queue:
            f.cancel()
        self.pool.shutdown(wait=True)
