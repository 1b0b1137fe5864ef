"""The shard task of ``warp etl`` for detection labels: what runs on a worker, and its receipt.

The valid samples are cut, in label order, into lists of at most ``samples_per_shard``
(:func:`plan`, :class:`ShardCutter`); each list is one :class:`ShardTask`, a pure, picklable unit
(:func:`build_shard`: same task → same bytes) that a thread or process pool, or Dask/Ray, runs
independently. A worker owns its whole shard: it decodes into the shard's preallocated arrays and
streams the file with its SHA-256 (no megabyte arrays shipped between processes). Each finished
shard is receipted (:func:`record_receipt`); a rerun reuses every receipt whose shard still
verifies (:func:`reuse_receipt`; docs/formats/receipts.md). The pipeline that plans, drives and
commits the tasks is :mod:`warpdata.warehouse.etl`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from warpdata.core import envvars
from warpdata.core.atomic import temp_prefix
from warpdata.core.canonical import identity
from warpdata.core.directio import BLOCK, AlignedFile
from warpdata.core.errors import DataError
from warpdata.etl import cutter
from warpdata.etl.objectstore import put_create_only
from warpdata.formats import twh1
from warpdata.storage.locations import filesystem, parse_location
from warpdata.warehouse import config as wconfig
from warpdata.warehouse.remote import read_source
from warpdata.warehouse.transform import DecodeError, Transformer, TransformSpec, transform_boxes
from warpdata.warehouse.validate import ValidSample, pack_samples, unpack_samples


@dataclass
class ShardTask:
    """One output shard from a fixed list of inputs: a pure, independently schedulable unit."""

    index: int
    shard_id: str
    path: str
    spec: TransformSpec
    max_boxes: int
    capacity: int
    samples: list[ValidSample]
    # an output on object storage: the worker uploads the finished shard here, create-only, and
    # drops its local copy (docs/formats/receipts.md, "Object storage")
    upload: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # to a process or a cluster worker, the samples go as columns (warp/warehouse/validate.py)
        packed = pack_samples(self.samples)
        if packed is None:
            return (ShardTask, (self.index, self.shard_id, self.path, self.spec, self.max_boxes, self.capacity,
                                self.samples, self.upload))
        return (_unpack_task, (self.index, self.shard_id, self.path, self.spec, self.max_boxes, self.capacity,
                               packed, self.upload))


def _unpack_task(index: int, shard_id: str, path: str, spec: TransformSpec, max_boxes: int, capacity: int,
                 packed: tuple[Any, ...], upload: str | None) -> ShardTask:
    return ShardTask(index, shard_id, path, spec, max_boxes, capacity, unpack_samples(packed), upload)


@dataclass
class ShardResult:
    index: int
    shard_id: str
    file_name: str
    samples: int
    sha256: str | None
    size_bytes: int
    failures: list[list[str]] = field(default_factory=list)  # [run, key, source, reason, message]
    timings: dict[str, float] = field(default_factory=dict)
    reused: bool = False
    direct_bytes: int = 0  # bytes that reached the file with O_DIRECT (the rest through the page cache)


_local = threading.local()


# pixels are handed to the disk in pieces of about this size while the shard fills up
FLUSH_BYTES = 16 << 20
# shards smaller than this are written through the page cache: each O_DIRECT write waits for the
# device, which costs more than the copy it saves on a small file (measured on a 60-image demo
# warehouse of 16 small shards: 361-366 img/s with O_DIRECT, 394-443 without)
DIRECT_MIN_SHARD_BYTES = 8 << 20


def _worker_state(task: ShardTask) -> tuple[twh1.ShardBuilder, Transformer, ThreadPoolExecutor]:
    """Per-thread (or per-process) builder, transformer and I/O thread, reused across shards."""
    key = (task.spec, task.capacity, task.max_boxes)
    st = getattr(_local, "state", None)
    if st is None or st[0] != key:
        spec = task.spec
        b = twh1.ShardBuilder(capacity=task.capacity, width=spec.width, height=spec.height,
                              max_boxes=task.max_boxes, dtype=spec.dtype)
        io = st[3] if st is not None else ThreadPoolExecutor(1, thread_name_prefix="warp-etl-io")
        st = (key, b, Transformer(spec), io)
        _local.state = st
    return st[1], st[2], st[3]


# what an own Dask LocalCluster's workers import before they fork (warp/etl/daskrunner.py)
WORKER_PRELOAD = ("numpy", "cv2", "warpdata.warehouse.shards")


def init_process_worker() -> None:
    """A process worker decodes one shard at a time: OpenCV's own threads would only contend."""
    import cv2  # heavy (OpenCV): imported on the worker, never on the driver's start-up path

    cv2.setNumThreads(1)


def build_shard(task: ShardTask) -> ShardResult:
    """Decode, transform and write one shard; same task → same bytes, on any machine or worker."""
    builder, tr, io = _worker_state(task)
    builder.reset()
    tr.decode_s = tr.resize_s = 0.0
    read_s = 0.0
    failures: list[list[str]] = []
    spec = task.spec
    name = os.path.basename(task.path)
    sha, size = None, 0
    builder.last_write_s = {"hash": 0.0, "write": 0.0}
    # the shard is written to a temporary sibling while it fills up (whole pages of pixels go to
    # the disk from a background thread, O_DIRECT where the filesystem allows: no page-cache copy)
    # and renamed into place once complete; no fsync here: a background thread syncs each
    # finished shard while the workers go on, and finalize waits for all of them; a torn shard
    # left by a crash fails its checksum when a rerun considers reusing it
    out_dir = os.path.dirname(task.path) if task.upload is None else upload_staging(os.path.dirname(task.path))
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix="-" + name, dir=out_dir)
    os.close(fd)
    flushed = direct_bytes = 0
    try:
        big = task.capacity * builder.image_nbytes >= DIRECT_MIN_SHARD_BYTES
        with AlignedFile(tmp, io=io, direct=None if big else False) as dst:
            for s in task.samples:
                t0 = time.perf_counter()
                try:
                    if s.url is not None and not (s.local and os.path.exists(s.local)):
                        # a worker without the header pass's spool: one more GET, checked against its hash
                        data = read_source(s.url, s.sha256)
                        st = None
                    else:
                        with open(s.local or s.image, "rb") as f:
                            st = os.fstat(f.fileno())
                            data = f.read()
                except OSError as e:
                    raise DataError(f"{s.key}: could not be read during the build: {e}",
                                    hint="the source changed while the ETL ran; rerun 'warp etl'",
                                    path=s.image) from None
                # the header pass hashed this file; re-hash only if it was touched since (size, mtime, inode)
                if st is not None and (st.st_size, st.st_mtime_ns, st.st_ino) != s.stat_key and \
                        hashlib.sha256(data).hexdigest() != s.sha256:
                    raise DataError(f"{s.key}: changed while the ETL ran (content hash differs from the header pass)",
                                    hint="rerun 'warp etl' once the dataset is no longer being written",
                                    path=s.image)
                read_s += time.perf_counter() - t0
                slot = builder.image_slot()
                try:
                    g = tr(data, s.probe, slot)
                except DecodeError as e:
                    failures.append([s.run, s.key, s.source, e.reason, f"{s.key}: {e.message}"])
                    continue
                builder.commit(key=s.key, boxes=transform_boxes(s.boxes, g, spec), classes=s.classes,
                               frame_id=s.frame_id, run_id=s.run_id, orig_size=s.probe.oriented_size,
                               affine=(g.sx, g.sy, float(g.px), float(g.py)))
                done = builder.count * builder.image_nbytes
                if done - flushed >= FLUSH_BYTES:
                    # committed slots are final: their whole pages can be written now
                    end = done - done % BLOCK
                    dst.submit(twh1.IMAGE_ALIGN + flushed, builder.image_bytes()[flushed:end])
                    flushed = end
            if builder.count:
                # waits for the pieces still in flight itself, after hashing
                sha = builder.write_direct(dst, written=flushed)
            direct_bytes = dst.direct_bytes
        if builder.count:
            os.chmod(tmp, 0o644)
            if task.upload is not None:
                size = os.path.getsize(tmp)
                put_create_only(tmp, task.upload)
                os.unlink(tmp)
            else:
                os.replace(tmp, task.path)
                size = os.path.getsize(task.path)
        else:
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    res = ShardResult(task.index, task.shard_id, name, builder.count, sha, size, failures,
                      {"read": read_s, "decode": tr.decode_s, "resize": tr.resize_s,
                       "hash": builder.last_write_s["hash"], "write": builder.last_write_s["write"]},
                      direct_bytes=min(direct_bytes, size))
    return res


def upload_staging(build_dir: str) -> str:
    """Where a worker writes a shard bound for object storage before its upload: the driver's build
    folder when that is under this process's own cache (this process's threads, a process pool, a
    LocalCluster the driver started), else this process's own cache folder: a worker started by
    hand (``dask://``) has its own ``WARP_CACHE_DIR`` (or none: the user's cache), and never writes
    under the driver's, on its machine or another. The file is removed once uploaded or failed."""
    own = os.path.realpath(envvars.default_cache_dir())
    if os.path.realpath(build_dir).startswith(own + os.sep) and os.path.isdir(build_dir):
        return build_dir
    try:
        os.makedirs(own, exist_ok=True)
    except OSError:  # no cache can be made here: the machine's temporary folder
        return tempfile.gettempdir()
    return own


def task_sha256(task: ShardTask) -> str:
    """What a receipt binds to: the shard id, its transform and every input's content hash."""
    return identity([task.shard_id, task.capacity, task.max_boxes, asdict(task.spec),
                     [[s.key, s.sha256] for s in task.samples]])


def record_receipt(journal: Any, task: ShardTask, res: ShardResult) -> None:
    """Receipt a finished shard (``journal``: a :class:`Journal` or its :class:`ReceiptWriter`)."""
    d = asdict(res)
    d.pop("timings")
    d.pop("reused")
    (journal.add if hasattr(journal, "add") else journal.record)(task.shard_id, task_sha256(task), res.sha256,
                                                                   res.size_bytes, d)


def reuse_receipt(task: ShardTask, receipt: dict[str, Any],
                   store_sizes: dict[str, int] | None = None) -> ShardResult | None:
    """The receipted result of ``task`` if its receipt names this task and its shard verifies
    (the driver deletes a receipt that does not, with the shard: warp/etl/driver.py).

    A shard on object storage verifies by its listed size (its SHA-256 is in
    the manifest, checked by ``warp inspect --verify``): reading every shard
    back would cost what building it did.
    """
    try:
        if receipt["task_sha256"] != task_sha256(task):
            return None
        res = ShardResult(**receipt["result"])
        if (res.shard_id, res.file_name) != (task.shard_id, os.path.basename(task.path)):
            return None  # the manifest would name another shard's file for this one
        if res.samples + len(res.failures) != len(task.samples) or \
                not {f[1] for f in res.failures} <= {s.key for s in task.samples}:
            return None  # the counts and quarantine would be another task's
        if task.upload is not None:
            if res.samples and (store_sizes or {}).get(res.file_name) != res.size_bytes:
                return None
        elif res.samples:
            with twh1.TWH1Shard(task.path) as sh:
                sh.verify(res.sha256)
    except DataError:
        return None
    res.reused = True
    res.timings = {}
    return res


def drop_shard(task: ShardTask) -> None:
    """Delete the shard of a receipt that did not verify, locally and in the store: its upload is
    create-only, so an object left there would be kept in place of the rebuilt bytes."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(task.path)
    if task.upload is not None:
        loc = parse_location(task.upload)
        with contextlib.suppress(FileNotFoundError):
            filesystem(loc).rm_file(loc.path)


def samples_per_shard(cfg: wconfig.WarehouseConfig, n: int) -> int:
    """From the size target, capped so ``n`` samples make at least ``min_shards`` shards.

    Depends only on the config and the input count, never on the worker count,
    so shard boundaries (and bytes) are the same however the build runs. The
    ``min_shards`` cap is rounded down to a power of two, so it moves only when
    ``n`` crosses ``min_shards``·2^k: the next version of a dataset, with a few
    samples relabelled, replaced or appended, cuts its shards at the same
    samples and its unchanged shards keep their bytes (docs/formats/twh1.md,
    "Layout across versions").
    """
    if cfg.shard_samples:
        return cfg.shard_samples
    one = twh1.Layout.compute(dtype=cfg.dtype, width=cfg.width, height=cfg.height, channels=3,
                              max_boxes=cfg.max_boxes, samples=1, key_bytes=64, run_bytes=8).size
    by_size = max(1, int(cfg.shard_size_mb * 1e6 // max(one - twh1.IMAGE_ALIGN, 1)))
    cap = max(1, -(-n // cfg.min_shards))
    return max(1, min(by_size, 1 << (cap.bit_length() - 1)))


# how the auto layout cuts shards (in the version recipe: a build cut another way is another version)
SHARD_CUT = cutter.RULE


class ShardCutter(cutter.KeyCutter):
    """:class:`warpdata.etl.cutter.KeyCutter` over the samples' keys: the warehouse's shard cut
    (docs/formats/twh1.md, "Layout across versions"). :func:`plan` and the overlapped pass
    (warp/warehouse/overlap.py) push the same samples in the same order, hence cut the same runs."""

    def __init__(self, per_shard: int, fixed: bool) -> None:
        super().__init__(per_shard, fixed, key=lambda s: s.key)


def expected_shards(n: int, per_shard: int, fixed: bool) -> int:
    """About how many shards ``n`` samples make (:class:`ShardCutter`): a runner sizes batches by it."""
    return cutter.expected_runs(n, per_shard, fixed)


def cut_runs(samples: list[ValidSample], per_shard: int, fixed: bool) -> list[list[ValidSample]]:
    """``samples`` in order, cut as :class:`ShardCutter` cuts them."""
    return cutter.cut_by_keys(samples, per_shard, fixed, key=lambda s: s.key)


def plan(samples: list[ValidSample], per_shard: int, spec: TransformSpec, max_boxes: int,
         build_dir: Path, upload: str | None = None, *, fixed: bool = True) -> list[ShardTask]:
    """The shard tasks: ``samples`` cut in order into lists of at most ``per_shard``
    (:class:`ShardCutter`), each written into ``build_dir`` (and, given ``upload``, an object-store
    version directory, uploaded there)."""
    tasks = []
    for i, run in enumerate(cut_runs(samples, per_shard, fixed)):
        sid = f"shard-{i:05d}"
        tasks.append(ShardTask(i, sid, str(build_dir / f"{sid}.twh1"), spec, max_boxes, per_shard, run,
                               None if upload is None else f"{upload}/{sid}.twh1"))
    return tasks

